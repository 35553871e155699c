"""The second study's summary from the finished runs: the offset check, each arm's statistics and its paired
differences against the references, the pre-registered decision rule, and the pilots' chosen learning rates (the
rates file)."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

from benchmarks.common import write_json
from research.harness.training_study.analysis import (
    paired_bootstrap,
    paired_seeds,
    plot,
    plot_steps,
    run_metrics,
    score_at,
    summarise_cell,
)
from research.harness.training_study.preregistration2 import (
    CANDIDATES,
    LEARNING_RATES_FILE,
    PILOT_CELL,
    STUDY2,
    STUDY2_FOLDER,
    offset_invariant,
)
from research.harness.training_study.runs import run_path


def offset_check(base: dict, shifted: dict, offset: float) -> dict:
    """Whether a run with every training reward + ``offset`` equals its run without (module doc, STUDY2's
    offset_check): {"equal": bool, "differences": the first few, as text}."""
    differences = []

    def same(a, b) -> bool:
        return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))

    for i, (a, b) in enumerate(zip(base["curve"], shifted["curve"])):
        for key in sorted(set(a) | set(b)):
            if not same(a.get(key), b.get(key)):
                differences.append(f"evaluation {i} {key}: {a.get(key)!r} vs {b.get(key)!r}")
    if len(base["curve"]) != len(shifted["curve"]):
        differences.append(f"evaluations: {len(base['curve'])} vs {len(shifted['curve'])}")
    for key in ("tokens", "weights_moved"):
        if not same(base[key], shifted[key]):
            differences.append(f"{key}: {base[key]!r} vs {shifted[key]!r}")
    if len(base["steps"]) != len(shifted["steps"]):
        differences.append(f"steps: {len(base['steps'])} vs {len(shifted['steps'])}")
    for i, (a, b) in enumerate(zip(base["steps"], shifted["steps"])):
        for key in sorted(set(a) | set(b)):
            expected = a.get(key)
            if key == "reward" and expected is not None:
                expected = expected + offset
            if not same(expected, b.get(key)):
                differences.append(f"step {i + 1} {key}: {expected!r} vs {b.get(key)!r}")
    return {"equal": not differences, "differences": differences[:8], "count": len(differences)}


def _with_target(cell: dict) -> dict:
    """The cell with a target: a cell whose target is not set yet (long_right's pilot: the target is chosen from
    it) never reaches one, so its tokens to target is the budget (censored)."""
    return dict(cell, target=cell["target"] if cell.get("target") is not None else math.inf)


def run_metrics2(run: dict, cell: dict) -> dict:
    """run_metrics, with the final score's sampling SE (the collapse rule's noise floor) and per-step medians."""
    out = run_metrics(run, _with_target(cell))
    out["final_se"] = run["curve"][-1].get("se", float("nan"))
    for key, name in (
        ("study/lone_token_frac", "lone_token_frac"),
        ("completions/mean_length", "mean_length"),
        ("reward_std", "reward_std"),
    ):
        values = [s[key] for s in run["steps"] if s.get(key) is not None]
        out[f"{name}_median"] = statistics.median(values) if values else float("nan")
    return out


def _median(values) -> float:
    values = [v for v in values if not math.isnan(v)]
    return statistics.median(values) if values else float("nan")


def summarise_cell2(runs: list[dict], cell: dict, arms: list[str], references: list[str]) -> dict:
    """Per arm: the first study's statistics, the learning rate, the noise floor and per-step medians; per arm and
    reference: the paired differences arm minus reference."""
    metrics = {(r["arm"], r["seed"]): run_metrics2(r, cell) for r in runs}
    lrs = {r["arm"]: r.get("learning_rate") for r in runs}
    base = summarise_cell(runs, _with_target(cell), arms)
    out = {"arms": base["arms"], "paired": {}}
    for arm, stats in out["arms"].items():
        mine = [m for (a, _), m in sorted(metrics.items()) if a == arm]
        stats.update(
            learning_rate=lrs.get(arm),
            final_se_median=_median(m["final_se"] for m in mine),
            lone_token_frac_median=_median(m["lone_token_frac_median"] for m in mine),
            mean_length_median=_median(m["mean_length_median"] for m in mine),
            reward_std_median=_median(m["reward_std_median"] for m in mine),
        )
    for ref in references:
        for arm in arms:
            seeds = paired_seeds(metrics, arm, ref)
            if arm == ref or not seeds:
                continue
            out["paired"][f"{arm}-{ref}"] = {
                name: paired_bootstrap([metrics[(arm, s)][name] - metrics[(ref, s)][name] for s in seeds])
                for name in ("tokens_to_target", "auc", "final")
            }
    return out


def shift_invariant_candidates(arms: dict = None) -> list[str]:
    """The arms the decision rule chooses among: OTB arms whose advantages no reward offset changes."""
    arms = STUDY2["arms"] if arms is None else arms
    return [a for a, spec in arms.items() if spec["advantage_estimator"] == "otb" and offset_invariant(spec)]


def decide_default(summary: dict, candidates: dict = CANDIDATES, arms: dict = None) -> dict:
    """The pre-registered decision rule (STUDY2["decision_rule"]) applied to a summary's cells.

    Returns {"arm", "config" (the OTBConfig fields the default takes), "qualified", "reasons", "statement"}."""
    arms = STUDY2["arms"] if arms is None else arms
    cells = summary["cells"]
    reasons, qualified = [], []
    for arm in shift_invariant_candidates(arms):
        worse, missing = [], []
        for cell in STUDY2["decision_cells"]:
            auc = cells.get(cell, {}).get("paired", {}).get(f"{arm}-grpo_N4", {}).get("auc")
            if auc is None:
                missing.append(cell)
            elif auc["ci"][1] < 0:
                worse.append(f"{cell} ({auc['mean']:+.3f} [{auc['ci'][0]:+.3f}, {auc['ci'][1]:+.3f}])")
        if missing:
            reasons.append(f"{arm}: no paired comparison with grpo_N4 in {', '.join(missing)}")
        elif worse:
            reasons.append(f"{arm}: worse on auc than TRL's default GRPO in {', '.join(worse)}")
        else:
            mean = statistics.fmean(cells[c]["arms"][arm]["auc_mean"] for c in ("long", "long_right"))
            qualified.append((mean, arm))
            reasons.append(
                f"{arm}: not worse than TRL's default GRPO in any cell; mean auc over long and long_right {mean:.3f}"
            )
    statement = None
    if qualified:
        best_auc, chosen = max(qualified)
        reasons.append(f"chosen: {chosen}, the highest mean auc over long and long_right ({best_auc:.3f})")
    else:
        known = {a: c["mse"] for a, c in candidates["arms"].items() if c.get("mse") is not None}
        chosen = min(known, key=known.get) if known else candidates["best"]
        reasons.append(
            f"no candidate qualifies; chosen: {chosen}, the lowest MSE at N=4 on ramble"
            + (f" ({known[chosen]:.4g})" if known else " (CANDIDATES' best: its numbers are not filled)")
        )
        statement = (
            "OTB did not match TRL's default GRPO in training: no shift-invariant OTB candidate was at "
            "least as good on auc in every cell; the default is the candidate with the lowest gradient MSE."
        )
    spec = arms[chosen]
    assert offset_invariant(spec), "the reference rule is never the default"
    config = {
        "advantage_estimator": "otb",
        "otb_tail": spec["otb_tail"],
        "otb_leave_one_out": spec["otb_leave_one_out"],
        "scale_rewards": spec["harness_scale"] or "none",
    }
    return {
        "arm": chosen,
        "config": config,
        "qualified": [a for _, a in sorted(qualified, reverse=True)],
        "reasons": reasons,
        "statement": statement,
    }


def summarise2(out: Path, cells: dict, meta: dict, rates: dict) -> dict:
    """The second study's summary (or a pilot's), from the finished runs only."""
    runs = {}
    for cell in cells:
        folder = Path(out) / STUDY2_FOLDER / cell
        runs[cell] = [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))] if folder.exists() else []
    arms = list(STUDY2["arms"])
    summary = {"meta": meta, "preregistration": STUDY2, "rates": rates, "cells": {}, "offset_check": {}}
    for cell, spec in cells.items():
        spec = dict(spec, target=spec["target"] if spec.get("target") is not None else rates["targets"].get(cell))
        shifted = spec.get("reward_offset", 0.0) != 0.0
        mine = runs[cell]
        if shifted:  # the offset-dependent arms' own runs; the invariant arms' long runs (equal by the law)
            mine = [r for r in runs[cell] if not offset_invariant(STUDY2["arms"][r["arm"]])]
            mine += [r for r in runs.get("long", []) if offset_invariant(STUDY2["arms"][r["arm"]])]
        summary["cells"][cell] = summarise_cell2(mine, spec, arms, STUDY2["references"])
        if shifted and "long" in cells:
            base = {(r["arm"], r["seed"]): r for r in runs["long"]}
            for r in runs[cell]:
                if (r["arm"], r["seed"]) in base:
                    check = offset_check(base[(r["arm"], r["seed"])], r, spec["reward_offset"])
                    check["invariant"] = offset_invariant(STUDY2["arms"][r["arm"]])
                    summary["offset_check"][f"{r['arm']}-s{r['seed']}"] = check
    pilot = meta.get("pilot")
    if pilot:
        summary["chosen"] = choose_rates(summary["cells"])
    else:
        summary["decision"] = decide_default(summary) if _has_decision_data(summary) else None
    stem = (
        "training_study2_quick" if meta.get("quick") else f"training_study2_pilot_{pilot}" if pilot else STUDY2_FOLDER
    )
    write_json(Path(out) / f"{stem}.json", summary)
    try:
        plot(runs, {c: dict(s, learning_rate=None) for c, s in cells.items()}, Path(out) / f"{stem}.png", arms)
        if not pilot:
            plot_steps(runs, list(cells), Path(out) / f"{stem}_steps.png", arms)
    except ImportError as error:
        print(error)
    return summary


def _has_decision_data(summary: dict) -> bool:
    return all(summary["cells"].get(c, {}).get("arms") for c in ("long", "long_right"))


def choose_rates(pilot_cells: dict) -> dict:
    """Per arm, the pilot rate with the highest auc (a tie: the lower rate), from a pilot's summarised cells."""
    by_arm = {}
    for cell, res in pilot_cells.items():
        lr = float(cell.rsplit("_lr", 1)[1])
        for arm, stats in res["arms"].items():
            by_arm.setdefault(arm, {})[lr] = stats["auc_mean"]
    return {arm: min(aucs, key=lambda lr: (-aucs[lr], lr)) for arm, aucs in by_arm.items()}


def record_rates(out: Path) -> dict:
    """The rates file from every pilot summary present: the chosen rate per task and arm, each arm's auc over the
    grid, and long_right's target by STUDY2's target rule."""
    record = {"rule": STUDY2["learning_rates"]["rule"], "rates": {}, "auc": {}, "targets": {}, "pilots": []}
    for task in PILOT_CELL:
        path = Path(out) / f"training_study2_pilot_{task}.json"
        if not path.exists():
            continue
        pilot = json.loads(path.read_text())
        record["pilots"].append({"file": path.name, "command": pilot["meta"]["command"]})
        record["rates"][task] = pilot["chosen"]
        record["auc"][task] = {
            arm: {
                cell.rsplit("_lr", 1)[1]: res["arms"][arm]["auc_mean"]
                for cell, res in pilot["cells"].items()
                if arm in res["arms"]
            }
            for arm in pilot["chosen"]
        }
        if task == "long_right" and "grpo_N4" in pilot["chosen"]:
            lr = pilot["chosen"]["grpo_N4"]
            run = json.loads(run_path(out, f"pilot_long_right_lr{lr:g}", "grpo_N4", 100, STUDY2_FOLDER).read_text())
            budget = STUDY2["cells"]["long_right"]["token_budget"]
            record["targets"]["long_right"] = math.floor(score_at(run["curve"], budget * 2 / 3) / 0.05) * 0.05
    write_json(Path(out) / LEARNING_RATES_FILE, record)
    return record
