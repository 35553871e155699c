"""Does OTB train better? A pre-registered, multi-seed training study with paired intervals.

    python benchmarks/training_study.py --quick              # tiny: 1 seed, 2 steps per arm, seconds (the tests)
    python benchmarks/training_study.py --variance-check     # the precondition: variance.py on each cell's task
    python benchmarks/training_study.py                      # every (cell, arm, seed) not yet run, then the summary
    python benchmarks/training_study.py --cells long --seeds 10 11 12   # extend a cell with more seeds
    python benchmarks/training_study.py --summary            # rebuild the summary from the finished runs only
    python benchmarks/training_study.py --pilot 1e-4 2e-4 5e-4 1e-3 2e-3                  # how the learning rates
    python benchmarks/training_study.py --pilot 2e-4 5e-4 1e-3 2e-3 --pilot-cell short    # were chosen

The question: at the same number of generated completion tokens, does training with OTB at N=4 reach a better
held-out policy than the GRPO a user runs today, unscaled GRPO, OGB, or GRPO at N=16 (the paper's "N=4 matches a
large group"), and does it avoid collapse? The policy is a small Llama made from scratch on CPU
(``study_task.py``: a seeded random initialisation and a seeded supervised warm start), because a machine without
the Hub has no pretrained weights and the embedded SmolLM2 costs too much per step for 10 seeds of 5 arms.

Everything that decides the answer is fixed in ``PREREGISTRATION`` below, committed before the first run: the
cells, the arms, the seeds, the budget, the target, the collapse rule and the analysis. It is not changed after
seeing results; if it ever must be, both analyses are kept and the reason written down.

Pairing. A seed fixes, for every arm: the initial weights (random init and warm start), the training patterns and
their order, the held-out patterns, TRL's sampling seed and the evaluation's sampling seed. Differences are taken
per seed (OTB minus the other arm), then averaged.

Cost and resumption. Each run is one process (``--jobs`` in parallel, one thread each) and writes its own JSON
under ``--out``/training_study/ when it finishes; a run already there is never run again, so the same command
resumes an interrupted study, and the summary is rebuilt from whatever has finished. The warm-started weights are
cached in ``--cache`` (default .cache/training_study). The cost of each cell (CPU seconds per run, by arm) is in
the summary.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # common.py and study_task.py beside this file, also when a test loads it by path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

PREREGISTRATION = {
    "committed": "before the first run of the study; not changed after seeing results",
    "seeds": list(range(10)),
    "prompts_per_step": 4,
    "arms": {
        "otb_N4": {"advantage_estimator": "otb", "num_generations": 4, "scale_rewards": "none"},
        "grpo_N4": {"advantage_estimator": "grpo", "num_generations": 4, "scale_rewards": "group"},
        "grpo_unscaled_N4": {"advantage_estimator": "grpo", "num_generations": 4, "scale_rewards": "none"},
        "ogb_N4": {"advantage_estimator": "ogb", "num_generations": 4, "scale_rewards": "none"},
        "grpo_N16": {"advantage_estimator": "grpo", "num_generations": 16, "scale_rewards": "group"},
    },
    "arm_notes": "grpo_N4 is TRL's default GRPO (scale_rewards='group'), what a user runs today; grpo_N16 too, with "
    "four times the completions per prompt. Every other setting is TRL's default (loss_type='dapo', beta=0, "
    "max_grad_norm=1, temperature 1, AdamW), except a constant learning rate (the arms take different numbers of "
    "steps for the same tokens, and a decay schedule would give them different learning rates at equal tokens) "
    "and the CPU settings (use_cpu, fp32, no gradient checkpointing).",
    "cells": {
        "long": {
            "task": "ramble",
            "learning_rate": 1e-3,
            "token_budget": 120_000,
            "eval_every_tokens": 12_000,
            "target": 0.75,
        },
        "short": {
            "task": "copy",
            "learning_rate": 5e-4,
            "token_budget": 24_000,
            "eval_every_tokens": 2_400,
            "target": 0.75,
        },
        "long_high_lr": {
            "task": "ramble",
            "learning_rate": 3e-3,
            "token_budget": 120_000,
            "eval_every_tokens": 12_000,
            "target": 0.75,
        },
    },
    "cell_notes": "long: the task where variance.py finds OTB's variance far below GRPO's (long, uneven, uncertain "
    "failures; short, confident successes). short: the control, short and alike completions. long_high_lr: the "
    "stability condition, the long cell at three times its learning rate. Learning rates: chosen on a pilot seed "
    "(100, not a study seed) for grpo_N4, TRL's default, as the one with the highest auc over the cell's budget "
    "(--pilot: long among 1e-4, 2e-4, 5e-4, 1e-3 and 2e-3; short among 2e-4, 5e-4, 1e-3 and 2e-3; the pilot's "
    "JSONs are training_study_pilot_long.json and training_study_pilot_short.json). Targets: about the score the "
    "tuned grpo_N4 reached at two thirds of the budget in the pilot.",
    "metrics": {
        "tokens_to_target": "completion tokens generated when the held-out score first reaches the cell's target, "
        "interpolated linearly between evaluations; a run that never reaches it counts as the token budget "
        "(censored; the number of runs that reached it is reported beside it)",
        "auc": "the area under the held-out score against completion tokens from 0 to the token budget "
        "(trapezoids; the curve is interpolated at the budget), divided by the budget: the mean held-out score "
        "over the budget",
        "final": "the held-out score of the last evaluation (the first step end at or past the budget)",
    },
    "evaluation": "the held-out score is study_task.held_out_score: mean reward of 4 completions sampled at "
    "temperature 1 per held-out pattern (20 patterns), with a generator seeded by the seed; at the start, every "
    "eval_every_tokens completion tokens (at the first step end past each multiple) and at the budget",
    "collapse": "a run collapses if a logged loss or gradient norm is not finite, or if its final held-out score is "
    "more than 0.2 below the best held-out score it reached, or below half its initial one",
    "analysis": "per cell and metric: for each other arm, the per-seed difference OTB N=4 minus that arm over the "
    "seeds where both finished; the mean difference with a paired percentile bootstrap 95% interval (10,000 "
    "resamples of the seeds, generator seed 0). 'Differ' means the interval excludes 0. For tokens_to_target lower "
    "is better; for auc and final higher is better. Collapse: the rate per arm with a Wilson 95% interval.",
    "mechanism": "per step, TRL's gradient norm before clipping (grad_norm), the reward's std, the completion "
    "lengths and OTB's advantage std; per run, the median gradient norm and its coefficient of variation over "
    "steps, summarised per arm beside the variance check's ratios",
    "precondition": "before training, variance.py on the long cell's task at the warm-started policy of seed 0 "
    "gives OTB/GRPO (unscaled) below 0.7 at N=4 (paired 95% interval below 1) on completions averaging at least "
    "128 tokens; the short cell is the control",
    "history": "a first version of the ramble task (40% exact answers in the warm start) failed the precondition's "
    "length at seed 0 (95.5 tokens on average) before any study run; the warm start's share of exact answers was "
    "lowered to 25% and the learning-rate pilot rerun, before any study run",
}

BOOTSTRAP = 10_000
QUICK = {
    "seeds": [0],
    "cells": {
        "short": {"task": "copy", "learning_rate": 1e-3, "token_budget": 0, "eval_every_tokens": 0, "target": 0.5}
    },
    "warm_start_steps": 3,
    "max_steps": 2,
}

PILOT = {"seeds": [100], "arms": ["grpo_N4"], "cell": "long"}


def pilot_cells(learning_rates, cell: str = PILOT["cell"]) -> dict:
    """The learning-rate pilot's cells: ``cell`` (the long one by default) at each learning rate."""
    base = PREREGISTRATION["cells"][cell]
    prefix = "pilot" if cell == PILOT["cell"] else f"pilot_{cell}"
    return {f"{prefix}_lr{lr:g}": dict(base, learning_rate=lr) for lr in learning_rates}


# ----------------------------------------------------------------------------------------------------------------
# One run
# ----------------------------------------------------------------------------------------------------------------


def run_path(out: Path, cell: str, arm: str, seed: int) -> Path:
    return Path(out) / "training_study" / cell / f"{arm}-s{seed}.json"


def run_one(job: dict) -> dict:
    """Train one arm of one cell from one seed's warm-started policy; returns the run's record (see module doc)."""
    import torch

    torch.set_num_threads(job["threads"])
    import study_task
    from transformers import TrainerCallback
    from transformers.trainer_callback import PrinterCallback

    from trl_otb import OTBConfig, OTBTrainer

    cell, arm, seed = job["cell_spec"], PREREGISTRATION["arms"][job["arm"]], job["seed"]
    task = study_task.TASKS[cell["task"]]
    model, tok = study_task.warm_start(seed, job["cache"], job.get("warm_start_steps"))
    train_patterns, held_out = study_task.split_patterns(seed)
    reward = study_task.reward_function(task)
    tokens = {"n": 0}

    def counted(completions, completion_ids, **kwargs):
        tokens["n"] += sum(len(ids) for ids in completion_ids)
        return reward(completions, **kwargs)

    counted.__name__ = reward.__name__
    budget, every = cell["token_budget"], cell["eval_every_tokens"]
    max_steps = job.get("max_steps") or _step_bound(cell, arm)

    def evaluate(step: int) -> None:
        score = study_task.held_out_score(model, tok, task, held_out, seed)
        curve.append({"step": step, "tokens": tokens["n"], "score": score})

    curve: list[dict] = []
    evaluate(0)

    class Schedule(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            done = (budget and tokens["n"] >= budget) or state.global_step >= max_steps
            due = every and tokens["n"] // every > curve[-1]["tokens"] // every
            if due or done:
                evaluate(state.global_step)
            if done:
                control.should_training_stop = True

    N = arm["num_generations"]
    config = OTBConfig(
        output_dir=str(Path(job["workdir"]) / f"{job['cell']}-{job['arm']}-{seed}"),
        advantage_estimator=arm["advantage_estimator"],
        num_generations=N,
        scale_rewards=arm["scale_rewards"],
        per_device_train_batch_size=N * PREREGISTRATION["prompts_per_step"],
        max_completion_length=task.max_completion_length,
        learning_rate=cell["learning_rate"],
        lr_scheduler_type="constant",
        max_steps=max_steps,
        seed=seed,
        use_cpu=True,
        bf16=False,
        gradient_checkpointing=False,
        report_to="none",
        logging_steps=1,
        save_strategy="no",
        disable_tqdm=True,
    )
    trainer = OTBTrainer(
        model,
        reward_funcs=counted,
        args=config,
        train_dataset=study_task.dataset(task, train_patterns, seed),
        processing_class=tok,
        callbacks=[Schedule()],
    )
    trainer.remove_callback(PrinterCallback)
    before = [p.detach().clone() for p in model.parameters()]
    cpu, wall = time.process_time(), time.perf_counter()
    trainer.train()
    moved = sum(float((p.detach() - b).norm()) for p, b in zip(model.parameters(), before))
    steps = [
        {k: entry.get(k) for k in STEP_KEYS}
        for entry in trainer.state.log_history
        if "loss" in entry and "train_runtime" not in entry
    ]
    return {
        "cell": job["cell"],
        "arm": job["arm"],
        "seed": seed,
        "curve": curve,
        "steps": steps,
        "weights_moved": moved,
        "tokens": tokens["n"],
        "cpu_seconds": time.process_time() - cpu,
        "wall_seconds": time.perf_counter() - wall,
    }


STEP_KEYS = (
    "step",
    "loss",
    "grad_norm",
    "reward",
    "reward_std",
    "completions/mean_length",
    "completions/min_length",
    "completions/max_length",
    "frac_reward_zero_std",
    "otb/advantage_std",
)


def _step_bound(cell: dict, arm: dict) -> int:
    """A cap on the steps, reached after the token budget unless every completion is a single token: it only
    guards against a run that never ends."""
    per_step = arm["num_generations"] * PREREGISTRATION["prompts_per_step"]
    return max(1, math.ceil(cell["token_budget"] / per_step))


# ----------------------------------------------------------------------------------------------------------------
# Analysis (pure functions of the run records)
# ----------------------------------------------------------------------------------------------------------------


def score_at(curve: list[dict], tokens: float) -> float:
    """The held-out score at ``tokens``, interpolated linearly between evaluations (the last one beyond)."""
    for before, after in zip(curve, curve[1:]):
        if after["tokens"] >= tokens:
            span = after["tokens"] - before["tokens"]
            share = 0.0 if span == 0 else (tokens - before["tokens"]) / span
            return before["score"] + share * (after["score"] - before["score"])
    return curve[-1]["score"]


def auc(curve: list[dict], budget: float) -> float:
    """Mean held-out score over [0, budget] tokens: trapezoids, the curve interpolated at the budget."""
    points = [(p["tokens"], p["score"]) for p in curve if p["tokens"] < budget] + [(budget, score_at(curve, budget))]
    area = sum((t1 - t0) * (s0 + s1) / 2 for (t0, s0), (t1, s1) in zip(points, points[1:]))
    return area / budget


def collapsed(run: dict) -> bool:
    """The pre-registered collapse rule."""
    values = [s.get(k) for s in run["steps"] for k in ("loss", "grad_norm")]
    if any(v is None or not math.isfinite(v) for v in values):
        return True
    scores = [p["score"] for p in run["curve"]]
    return scores[-1] < max(scores) - 0.2 or scores[-1] < 0.5 * scores[0]


def run_metrics(run: dict, cell: dict) -> dict:
    from common import tokens_to_target

    reached = tokens_to_target(run["curve"], cell["target"])
    budget = cell["token_budget"] or run["tokens"]
    norms = [s["grad_norm"] for s in run["steps"] if s.get("grad_norm") is not None]
    finite = [g for g in norms if math.isfinite(g)]
    mean = statistics.fmean(finite) if finite else float("nan")
    return {
        "tokens_to_target": budget if reached is None else min(reached, budget),
        "reached": reached is not None and reached <= budget,
        "auc": auc(run["curve"], budget),
        "final": run["curve"][-1]["score"],
        "initial": run["curve"][0]["score"],
        "collapsed": collapsed(run),
        "grad_norm_median": statistics.median(finite) if finite else float("nan"),
        "grad_norm_cv": statistics.pstdev(finite) / mean if len(finite) > 1 and mean > 0 else float("nan"),
        "steps": len(run["steps"]),
        "cpu_seconds": run["cpu_seconds"],
    }


def paired_bootstrap(diffs: list[float], resamples: int = BOOTSTRAP, seed: int = 0) -> dict:
    """Mean of the per-seed differences, with a percentile bootstrap 95% interval over seeds."""
    import torch

    x = torch.tensor(diffs, dtype=torch.float64)
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(len(diffs), (resamples, len(diffs)), generator=g)
    means = x[idx].mean(dim=1)
    lo, hi = torch.quantile(means, torch.tensor([0.025, 0.975], dtype=torch.float64)).tolist()
    return {"mean": float(x.mean()), "ci": [lo, hi], "differ": lo > 0 or hi < 0, "seeds": len(diffs)}


def wilson(k: int, n: int, z: float = 1.96) -> list[float]:
    """Wilson 95% interval of a rate k/n."""
    if n == 0:
        return [0.0, 1.0]
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return [max(0.0, centre - half), min(1.0, centre + half)]


def summarise_cell(runs: list[dict], cell: dict, arms: list[str]) -> dict:
    """Per arm: medians and means over seeds, collapse rate; per other arm: OTB's paired differences."""
    metrics = {(r["arm"], r["seed"]): run_metrics(r, cell) for r in runs}
    out = {"arms": {}, "paired": {}}
    for arm in arms:
        mine = [m for (a, _), m in sorted(metrics.items()) if a == arm]
        if not mine:
            continue
        k = sum(m["collapsed"] for m in mine)
        out["arms"][arm] = {
            "runs": len(mine),
            "reached": sum(m["reached"] for m in mine),
            "tokens_to_target_median": statistics.median(m["tokens_to_target"] for m in mine),
            "auc_mean": statistics.fmean(m["auc"] for m in mine),
            "final_mean": statistics.fmean(m["final"] for m in mine),
            "initial_mean": statistics.fmean(m["initial"] for m in mine),
            "collapse_rate": k / len(mine),
            "collapse_ci": wilson(k, len(mine)),
            "grad_norm_median": statistics.median(m["grad_norm_median"] for m in mine),
            "grad_norm_cv_median": statistics.median(m["grad_norm_cv"] for m in mine),
            "steps_median": statistics.median(m["steps"] for m in mine),
            "cpu_seconds_median": statistics.median(m["cpu_seconds"] for m in mine),
            "cpu_seconds_total": sum(m["cpu_seconds"] for m in mine),
        }
    for arm in arms:
        if arm == "otb_N4":
            continue
        seeds = sorted(s for (a, s) in metrics if a == arm and ("otb_N4", s) in metrics)
        if not seeds:
            continue
        out["paired"][f"otb_N4-{arm}"] = {
            name: paired_bootstrap([metrics[("otb_N4", s)][name] - metrics[(arm, s)][name] for s in seeds])
            for name in ("tokens_to_target", "auc", "final")
        }
    return out


# ----------------------------------------------------------------------------------------------------------------
# Driving the runs
# ----------------------------------------------------------------------------------------------------------------


def load_runs(out: Path, cells: dict) -> dict[str, list[dict]]:
    runs = {}
    for cell in cells:
        folder = Path(out) / "training_study" / cell
        runs[cell] = [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))] if folder.exists() else []
    return runs


def summarise(out: Path, cells: dict, meta: dict) -> dict:
    from common import write_json

    runs = load_runs(out, cells)
    summary = {
        "meta": meta,
        "preregistration": PREREGISTRATION,
        "cells": {c: summarise_cell(runs[c], spec, list(PREREGISTRATION["arms"])) for c, spec in cells.items()},
        "variance_check": _variance_check(out),
    }
    pilot = meta.get("pilot")
    stem = (
        "training_study_quick" if meta.get("quick") else f"training_study_pilot_{pilot}" if pilot else "training_study"
    )
    write_json(Path(out) / f"{stem}.json", summary)
    try:
        plot(runs, cells, Path(out) / f"{stem}.png")
    except ImportError as error:  # the JSON is written first; the figure needs the plots extra
        print(error)
    return summary


def _variance_check(out: Path) -> dict:
    """OTB's paired variance ratios at N=4 from variance.py's JSON of each task, where it has been run."""
    found = {}
    for task in ("ramble", "copy"):
        path = Path(out) / f"variance_study_{task}.json"
        if not path.exists():
            continue
        data = json.loads(path.read_text())
        for h, res in data["results"]["lm_head"].items():
            found[task] = {
                "horizon": int(h),
                "mean_completion_tokens": res["mean_completion_tokens"],
                **{
                    key: {"ratio": t["ratio"], "ratio_ci": t["ratio_ci"], "significant": t["significant"]}
                    for key, t in res["paired"].items()
                    if key.startswith("N=4/")
                },
                "command": data["meta"]["command"],
            }
    return found


def plot(runs: dict, cells: dict, path: Path) -> None:
    """Per cell: each arm's median held-out score against completion tokens, with the band of its seeds."""
    from common import pyplot, save_figure

    shown = [c for c in cells if runs.get(c)]
    if not shown:
        return
    fig, axes = pyplot().subplots(1, len(shown), figsize=(5 * len(shown), 3.8), squeeze=False)
    colors = dict(zip(PREREGISTRATION["arms"], ["black", "tab:blue", "tab:cyan", "tab:green", "tab:orange"]))
    for ax, cell in zip(axes[0], shown):
        spec = cells[cell]
        budget = spec["token_budget"] or max(r["tokens"] for r in runs[cell])
        grid = [budget * i / 40 for i in range(41)]
        for arm, color in colors.items():
            mine = [r for r in runs[cell] if r["arm"] == arm]
            if not mine:
                continue
            values = [[score_at(r["curve"], t) for r in mine] for t in grid]
            ax.plot(grid, [statistics.median(v) for v in values], color=color, lw=2, label=f"{arm} ({len(mine)})")
            ax.fill_between(grid, [min(v) for v in values], [max(v) for v in values], color=color, alpha=0.12)
        ax.axhline(spec["target"], color="grey", lw=0.8, ls=":")
        ax.set(title=f"{cell} ({spec['task']}, lr {spec['learning_rate']:g})", xlabel="completion tokens")
        ax.set_ylabel("held-out score (median, band: seeds' range)")
        ax.legend(fontsize=7)
    save_figure(fig, path)


def jobs_to_run(args, cells: dict) -> list[dict]:
    """Every (cell, arm, seed) without a finished JSON, interleaved by seed so that partial results stay paired."""
    jobs = []
    for seed in args.seeds:
        for cell, spec in cells.items():
            for arm in args.arms:
                if not run_path(args.out, cell, arm, seed).exists():
                    jobs.append(
                        {
                            "cell": cell,
                            "cell_spec": spec,
                            "arm": arm,
                            "seed": seed,
                            "threads": args.threads,
                            "cache": str(args.cache),
                            "workdir": args.workdir,
                            "warm_start_steps": args.warm_start_steps,
                            "max_steps": args.max_steps,
                        }
                    )
    return jobs


def _run_and_store(job: dict) -> dict:
    from common import write_json

    run = run_one(job)
    write_json(run_path(job["out"], job["cell"], job["arm"], job["seed"]), run)
    return run


def warm_up(args) -> None:
    """Make (or load) every seed's warm-started policy, ``--jobs`` at a time, before the runs use them."""
    import multiprocessing as mp

    import study_task

    todo = [s for s in args.seeds if not (Path(args.cache) / f"warm_start-s{s}-{args.warm_start_steps}.pt").exists()]
    specs = [(s, str(args.cache), args.warm_start_steps, args.threads) for s in todo]
    if len(specs) <= 1 or args.jobs == 1:
        for spec in specs:
            _warm(spec)
        return
    with mp.get_context("spawn").Pool(args.jobs, maxtasksperchild=1) as pool:
        for seed in pool.imap_unordered(_warm, specs):
            print(f"warm start of seed {seed} ready", flush=True)
    assert study_task  # imported here so that a spawned worker finds it


def _warm(spec) -> int:
    import torch

    seed, cache, steps, threads = spec
    torch.set_num_threads(threads)
    import study_task

    study_task.warm_start(seed, cache, steps)
    return seed


def variance_check(args) -> None:
    """variance.py on each task at the warm-started policy of the first seed: the study's precondition."""
    import variance

    for task in ("ramble", "copy"):
        variance.main(
            [
                "--task",
                f"study-{task}",
                "--seed",
                str(args.seeds[0]),
                "--cache",
                str(Path(args.cache) / "variance"),
                "--out",
                str(args.out),
                "--stem",
                f"variance_study_{task}",
                "--threads",
                str(args.threads),
            ]
        )


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 seed, the short cell, 2 steps per arm (the tests)")
    parser.add_argument("--cells", nargs="+", default=None, help="cells to run (default: all)")
    parser.add_argument("--arms", nargs="+", default=list(PREREGISTRATION["arms"]), choices=PREREGISTRATION["arms"])
    parser.add_argument("--seeds", nargs="+", type=int, default=None, help="default: the pre-registered 10")
    parser.add_argument("--jobs", type=int, default=2, help="runs in parallel (processes)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per run")
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument("--cache", default=".cache/training_study", help="warm-started weights")
    parser.add_argument("--summary", action="store_true", help="only rebuild the summary from finished runs")
    parser.add_argument("--variance-check", action="store_true", help="run the precondition (variance.py) only")
    parser.add_argument("--warm-start-only", action="store_true", help="make the seeds' warm-started policies only")
    parser.add_argument(
        "--pilot",
        type=float,
        nargs="+",
        default=None,
        metavar="LR",
        help="the learning-rate pilot: --pilot-cell at each LR, for grpo_N4 on seed 100 (PREREGISTRATION's cell_notes)",
    )
    parser.add_argument("--pilot-cell", default=PILOT["cell"], help="the cell of --pilot (default: long)")
    args = parser.parse_args(argv)
    cells = (
        pilot_cells(args.pilot, args.pilot_cell)
        if args.pilot
        else QUICK["cells"]
        if args.quick
        else PREREGISTRATION["cells"]
    )
    if args.pilot:
        args.seeds = args.seeds or PILOT["seeds"]
        args.arms = PILOT["arms"] if args.arms == list(PREREGISTRATION["arms"]) else args.arms
    unknown = set(args.cells or ()) - set(cells)
    if unknown:
        parser.error(f"unknown cells {sorted(unknown)}; choose among {sorted(cells)}")
    args.cell_specs = {c: cells[c] for c in (args.cells or cells)}
    args.seeds = args.seeds if args.seeds is not None else (QUICK if args.quick else PREREGISTRATION)["seeds"]
    args.warm_start_steps = QUICK["warm_start_steps"] if args.quick else None
    args.max_steps = QUICK["max_steps"] if args.quick else None
    if args.warm_start_steps is None:
        import study_task

        args.warm_start_steps = study_task.WARM_START["steps"]
    args.out = Path(args.out)
    return args


def main(argv=None):
    args = parse_args(argv)
    from common import command

    meta = {
        "command": command("training_study.py"),
        "quick": args.quick,
        "pilot": args.pilot_cell if args.pilot else None,
    }
    if args.variance_check:
        return variance_check(args)
    if args.warm_start_only:
        return warm_up(args)
    if not args.summary:
        import tempfile

        with tempfile.TemporaryDirectory() as workdir:
            args.workdir = workdir
            warm_up(args)
            jobs = [dict(job, out=str(args.out)) for job in jobs_to_run(args, args.cell_specs)]
            print(f"{len(jobs)} runs to do", flush=True)
            if args.jobs == 1:
                for job in jobs:
                    _report(_run_and_store(job), args)
            else:
                import multiprocessing as mp

                with mp.get_context("spawn").Pool(args.jobs, maxtasksperchild=1) as pool:
                    for run in pool.imap_unordered(_run_and_store, jobs):
                        _report(run, args)
    summary = summarise(args.out, args.cell_specs if args.pilot else cells_of(args), meta)
    print_summary(summary)


def cells_of(args) -> dict:
    """Every cell of the study (or of the quick mode): the summary covers them all, whatever this command ran."""
    return QUICK["cells"] if args.quick else PREREGISTRATION["cells"]


def _report(run: dict, args) -> None:
    print(
        f"{run['cell']} {run['arm']} seed {run['seed']}: {len(run['steps'])} steps, {run['tokens']} tokens, "
        f"score {run['curve'][0]['score']:.3f} -> {run['curve'][-1]['score']:.3f}, {run['cpu_seconds']:.0f} CPU s",
        flush=True,
    )


def print_summary(summary: dict) -> None:
    for cell, res in summary["cells"].items():
        for arm, a in res["arms"].items():
            print(
                f"{cell:13s} {arm:17s} runs {a['runs']:2d} reached {a['reached']:2d} tokens-to-target median "
                f"{a['tokens_to_target_median']:8.0f} auc {a['auc_mean']:.3f} final {a['final_mean']:.3f} "
                f"collapse {a['collapse_rate']:.2f}"
            )
        for pair, metrics in res["paired"].items():
            cells_text = "  ".join(
                f"{m} {v['mean']:+.3g} [{v['ci'][0]:+.3g}, {v['ci'][1]:+.3g}]{'*' if v['differ'] else ''}"
                for m, v in metrics.items()
            )
            print(f"{cell:13s} {pair:26s} {cells_text}")


if __name__ == "__main__":
    main()
