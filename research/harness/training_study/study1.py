"""The first study: its cells (and its learning-rate pilot's), its jobs, its summary from the finished runs, and its
precondition, the variance benchmark on each task at the first seed's warm-started policy (``--variance-check``)."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.common import command, write_json
from research.harness.training_study.analysis import plot, print_cells, summarise_cell
from research.harness.training_study.preregistration import PILOT, PREREGISTRATION, QUICK
from research.harness.training_study.runs import job_for, run_jobs, run_path, warm_up


def pilot_cells(learning_rates, cell: str = PILOT["cell"]) -> dict:
    """The learning-rate pilot's cells: ``cell`` (the long one by default) at each learning rate."""
    base = PREREGISTRATION["cells"][cell]
    prefix = "pilot" if cell == PILOT["cell"] else f"pilot_{cell}"
    return {f"{prefix}_lr{lr:g}": dict(base, learning_rate=lr) for lr in learning_rates}


def parse_study1(args, parser):
    """--study 1's arguments: its arms, cells, seeds and modes (--pilot: the learning-rate pilot's)."""
    if args.pilot is not None and not args.pilot:
        parser.error("study 1's --pilot needs its learning rates")
    if args.arms is not None and set(args.arms) - set(PREREGISTRATION["arms"]):
        parser.error(f"unknown arms {sorted(set(args.arms) - set(PREREGISTRATION['arms']))}")
    cells = (
        pilot_cells(args.pilot, args.pilot_cell)
        if args.pilot
        else QUICK["cells"]
        if args.quick
        else PREREGISTRATION["cells"]
    )
    args.arms = args.arms or (PILOT["arms"] if args.pilot else list(PREREGISTRATION["arms"]))
    if args.pilot:
        args.seeds = args.seeds or PILOT["seeds"]
    unknown = set(args.cells or ()) - set(cells)
    if unknown:
        parser.error(f"unknown cells {sorted(unknown)}; choose among {sorted(cells)}")
    args.cell_specs = {c: cells[c] for c in (args.cells or cells)}
    args.seeds = args.seeds if args.seeds is not None else (QUICK if args.quick else PREREGISTRATION)["seeds"]
    args.warm_start_steps = QUICK["warm_start_steps"] if args.quick else None
    args.max_steps = QUICK["max_steps"] if args.quick else None
    if args.warm_start_steps is None:
        from benchmarks import study_task

        args.warm_start_steps = study_task.WARM_START["steps"]
    return args


def main1(args) -> None:
    """The first study: the precondition, the warm starts, or the runs not yet done and the summary."""
    meta = {
        "command": command("research.harness.training_study"),
        "quick": args.quick,
        "pilot": args.pilot_cell if args.pilot else None,
    }
    if args.variance_check:
        return variance_check(args)
    if args.warm_start_only:
        return warm_up(args)
    if not args.summary:
        run_jobs(args, lambda: jobs_to_run(args, args.cell_specs))
    summary = summarise(args.out, args.cell_specs if args.pilot else cells_of(args), meta)
    print_summary(summary)


def cells_of(args) -> dict:
    """Every cell of the study (or of the quick mode): the summary covers them all, whatever this command ran."""
    return QUICK["cells"] if args.quick else PREREGISTRATION["cells"]


def jobs_to_run(args, cells: dict) -> list[dict]:
    """Every (cell, arm, seed) without a finished JSON, interleaved by seed so that partial results stay paired."""
    jobs = []
    for seed in args.seeds:
        for cell, spec in cells.items():
            for arm in args.arms:
                if not run_path(args.out, cell, arm, seed).exists():
                    jobs.append(job_for(args, cell, spec, arm, seed))
    return jobs


def load_runs(out: Path, cells: dict) -> dict[str, list[dict]]:
    runs = {}
    for cell in cells:
        folder = Path(out) / "training_study" / cell
        runs[cell] = [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))] if folder.exists() else []
    return runs


def summarise(out: Path, cells: dict, meta: dict) -> dict:
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
    """OTB's paired variance ratios at N=4 from benchmarks.variance's JSON of each task, where it has been run
    (``--variance-check`` writes them: results/variance_study_ramble.json and variance_study_copy.json)."""
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


def variance_check(args) -> None:
    """benchmarks.variance on each task at the warm-started policy of the first seed: the study's precondition."""
    from benchmarks import variance

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


def print_summary(summary: dict) -> None:
    def arm_line(arm, a):
        tokens = a["tokens_to_target_median"]
        return (
            f"{arm:17s} runs {a['runs']:2d} reached {a['reached']:2d} tokens-to-target median {tokens:8.0f} "
            f"auc {a['auc_mean']:.3f} final {a['final_mean']:.3f} collapse {a['collapse_rate']:.2f}"
        )

    def pair_line(pair, metrics):
        cells_text = "  ".join(
            f"{m} {v['mean']:+.3g} [{v['ci'][0]:+.3g}, {v['ci'][1]:+.3g}]{'*' if v['differ'] else ''}"
            for m, v in metrics.items()
        )
        return f"{pair:26s} {cells_text}"

    print_cells(summary, 13, arm_line, pair_line)
