"""``trl-otb gradient-check`` on the embedded SmolLM2-135M's math and count cells of the variance study, in three
parameter spaces on the same pools: how the estimators' ranking depends on where the gradients are taken, and how
the check's numbers sit beside the variance tool's for the same cells.

    python -m benchmarks.gradient_check_tasks --cell math64 --out .cache/gradient_check      # pools + head
    python -m benchmarks.gradient_check_tasks --cell math64 --space last-block --out .cache/gradient_check
    python -m benchmarks.gradient_check_tasks --summary --out .cache/gradient_check          # the committed JSON

Cells (the variance study's settings): ``math64`` the generated math problems, 64 tokens, temperature 1, pools of
16; ``count256`` the reach design's count pool (count to 36, 38, ..., 64 within 256 tokens, temperature 0.7, pools
of 12). Every cell at N=4 and B=4 groups per step, as the pre-screen. Each run resumes from ``--out``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from benchmarks.common import command, write_json
from benchmarks.variance.estimators import yardstick_estimators
from benchmarks.variance.sampling import COUNT_PREFIX, count_reward
from trl_otb.core import resolve_shrinkage

CELLS = {
    "math64": {"max_completion_length": 64, "temperature": 1.0, "pool": 16, "prompts": 16},
    "count256": {"max_completion_length": 256, "temperature": 0.7, "pool": 12, "prompts": 15},
}
PRESCREEN = {  # the variance tool's run of the same cell (research/estimator_study/prescreen/)
    "math64": ("prescreen_math_init.json", "64"),
    "count256": ("prescreen_reach_init.json", "256"),
}
RESULTS = Path(__file__).resolve().parent / "results" / "gradient_check_tasks.json"


def _same(a: tuple[str, dict], b: tuple[str, dict]) -> bool:
    """Whether two (estimator, options) compute the same advantages: eps left out, OTB's shrinkage resolved. Both
    files record an OTB row's tail and leave_one_out; a missing shrinkage is None (resolved as the library does)."""

    def norm(estimator, options):
        options = {k: v for k, v in options.items() if k != "eps"}
        if estimator == "otb":
            tail, loo = options["tail"], options["leave_one_out"]
            options = {
                "tail": tail,
                "leave_one_out": loo,
                "shrinkage": resolve_shrinkage(options.get("shrinkage"), tail, loo),
            }
        return estimator, options

    return norm(*a) == norm(*b)


def variance_rows(report: dict, table: dict) -> dict:
    """Per row of a gradient-check report, the variance tool's cos and eps_star for the estimator computing the same
    advantages (matched by the options each file records, not by name: the default's row changes with the default)."""
    tool = yardstick_estimators()
    out = {}
    for name, spec in report["meta"]["estimators"].items():
        match = [v for v, (e, o) in tool.items() if _same((spec["estimator"], spec["options"]), (e, o))]
        if match and f"N=4/{match[0]}" in table:
            row = table[f"N=4/{match[0]}"]
            out[name] = {"cos": row["cos"], "eps_star": row["eps_star"]}
    return out


def cell_inputs(cell: str):
    """(dataset, reward functions) of a cell."""
    from datasets import Dataset

    if cell == "math64":
        from trl_otb.demo.data import load_math_dataset
        from trl_otb.demo.rewards import accuracy_reward

        def accuracy(completions, answer, **kwargs):
            return [float(r or 0.0) for r in accuracy_reward(completions, answer)]

        return load_math_dataset(split="train", num_train=64, seed=0), [accuracy]
    targets = list(range(36, 65, 2))
    rows = [
        {
            "prompt": [
                {"role": "user", "content": f"List the numbers from 1 to {n}, separated by commas."},
                {"role": "assistant", "content": COUNT_PREFIX},
            ],
            "target": n,
        }
        for n in targets
    ]

    def counted(completions, target, **kwargs):
        text = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [count_reward(COUNT_PREFIX + t, n) for t, n in zip(text, target)]

    return Dataset.from_list(rows), [counted]


def run(cell: str, space: str, out: Path) -> dict:
    from trl_otb import OTBConfig
    from trl_otb.gradcheck import gradient_check
    from trl_otb.models import load_model_and_tokenizer

    spec = CELLS[cell]
    model, tokenizer = load_model_and_tokenizer(dtype=torch.float32)
    args = OTBConfig(
        output_dir=str(out / "trainer"), use_cpu=True, bf16=False, gradient_checkpointing=False, num_generations=4,
        per_device_train_batch_size=16, max_completion_length=spec["max_completion_length"],
        temperature=spec["temperature"], report_to="none", seed=0,
    )  # fmt: skip
    dataset, rewards = cell_inputs(cell)
    if cell == "math64":  # the math set is shuffled by the check; keep the first `prompts`
        dataset = dataset.select(range(64))
    peft = None
    if space == "adapter":  # the variance tool's adapter: r=16, alpha=32 on every linear layer, at its initialisation
        from peft import LoraConfig

        peft = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules="all-linear", task_type="CAUSAL_LM")
    report = gradient_check(
        model, rewards, dataset, args, processing_class=tokenizer, peft_config=peft, params=space, prompts=spec["prompts"],
        pool_size=spec["pool"], num_groups=64, batch_groups=4, bootstrap=1000, seed=0, out=out / cell,
        kappa_dim=4096, sketch_dim=2**14,
    )  # fmt: skip
    write_json(out / f"{cell}-{space}.json", report)
    return report


def _spearman(a: list[float], b: list[float]) -> float:
    ra, rb = torch.tensor(a).argsort().argsort().double(), torch.tensor(b).argsort().argsort().double()
    ra, rb = ra - ra.mean(), rb - rb.mean()
    return float((ra @ rb) / (ra.norm() * rb.norm()))


def summary(out: Path, results: Path = RESULTS) -> dict:
    """Per cell and space: cos and eps_star per estimator; the variance tool's for the same cell; the Spearman
    correlation of the estimators' eps_star ranking between spaces."""
    prescreen = Path(__file__).resolve().parents[1] / "research" / "estimator_study" / "prescreen"
    result = {"meta": {"command": command("gradient_check_tasks")}, "cells": {}}
    for cell in CELLS:
        runs = {p.stem.split("-", 1)[1]: json.loads(p.read_text()) for p in sorted(out.glob(f"{cell}-*.json"))}
        if not runs:
            continue
        entry = {"spaces": {}, "variance_tool": {}, "rank_agreement": {}}
        for space, report in runs.items():
            entry["spaces"][space] = {
                "meta": {k: report["meta"][k] for k in ("prompts", "informative_prompts", "pool_size", "seconds")},
                "rows": {e: {k: row[k] for k in ("cos", "cos_ci", "eps_star", "eps_star_ci")} for e, row in report["rows"].items()},
                "reading": report["reading"],
            }  # fmt: skip
        name, horizon = PRESCREEN[cell]
        tool = json.loads((prescreen / name).read_text())["results"]["lm_head"][horizon]["yardstick"]
        first = next(iter(runs.values()))
        entry["variance_tool"] = {
            "file": f"research/estimator_study/prescreen/{name}",
            "rows": variance_rows(first, tool["table"]),
        }
        spaces = list(entry["spaces"])
        for i, a in enumerate(spaces):
            for b in spaces[i + 1 :]:
                names = [e for e in entry["spaces"][a]["rows"] if e in entry["spaces"][b]["rows"]]
                ea = [entry["spaces"][a]["rows"][e]["eps_star"] for e in names]
                eb = [entry["spaces"][b]["rows"][e]["eps_star"] for e in names]
                entry["rank_agreement"][f"{a} vs {b}"] = _spearman(ea, eb)
        result["cells"][cell] = entry
    write_json(results, result)
    return result


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cell", choices=list(CELLS))
    parser.add_argument("--space", default="head", choices=("head", "last-block", "adapter"))
    parser.add_argument("--out", type=Path, default=Path(".cache/gradient_check"))
    parser.add_argument("--summary", action="store_true")
    args = parser.parse_args(argv)
    if args.summary:
        print(json.dumps(summary(args.out)["cells"], indent=1)[:4000])
        return
    report = run(args.cell, args.space, args.out)
    print(report["reading"])


if __name__ == "__main__":
    main()
