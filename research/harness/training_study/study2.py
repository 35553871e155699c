"""The second study (issue 26): which OTB should be the default? Its runs: the plan by the pre-registered cell
rules, the learning rates each arm runs at, the jobs, the cost plan, and what ``--study 2`` does (its summary:
summary2.py; its pre-registration: preregistration2.py).

    python -m research.harness.training_study --study 2 --quick                     # tiny: seconds per run (the tests)
    python -m research.harness.training_study --study 2 --pilot --task ramble       # the learning-rate pilot of a task
    python -m research.harness.training_study --study 2 --record-rates              # pilots -> the rates file
    python -m research.harness.training_study --study 2 --plan                      # the runs and their estimated cost
    python -m research.harness.training_study --study 2                             # every run not yet done; summary
    python -m research.harness.training_study --study 2 --summary                   # the summary from finished runs
"""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.common import command
from research.harness.training_study.analysis import print_cells
from research.harness.training_study.preregistration import PREREGISTRATION
from research.harness.training_study.preregistration2 import (
    LEARNING_RATES_FILE,
    PILOT_CELL,
    QUICK2,
    STUDY2,
    STUDY2_FOLDER,
    offset_invariant,
)
from research.harness.training_study.runs import job_for, run_jobs, run_path, warm_up
from research.harness.training_study.summary2 import record_rates, summarise2


def study2_plan(cells: dict, arms: list[str], seeds: list[int], quick: bool = False) -> list[tuple[str, str, int]]:
    """(cell, arm, seed) of every run the study (or its quick mode) makes, by the pre-registered cell rules."""
    plan = []
    for seed in seeds:
        for cell, spec in cells.items():
            for arm in arms:
                if quick and arm not in QUICK2["cell_arms"].get(cell, arms):
                    continue
                if spec.get("reward_offset", 0.0) != 0.0 and offset_invariant(STUDY2["arms"][arm]):
                    invariant = QUICK2["invariant_arms_offset"] if quick else None
                    seeds_ok = seeds if quick else spec["invariant_seeds"]
                    if seed not in seeds_ok or (invariant is not None and arm not in invariant):
                        continue
                plan.append((cell, arm, seed))
    return plan


def load_rates(out: Path) -> dict:
    path = Path(out) / LEARNING_RATES_FILE
    return json.loads(path.read_text()) if path.exists() else {"rates": {}, "targets": {}}


def cell_spec2(cell: str, spec: dict, arm: str, rates: dict, quick: bool = False) -> dict:
    """The cell as one arm runs it: its learning rate (the arm's tuned rate of the cell's task, times lr_factor),
    the target, the reward quantum and the evaluation samples."""
    resolved = dict(spec, reward_quantum=STUDY2["training_reward"]["quantum"])
    resolved["eval_samples"] = QUICK2["eval_samples"] if quick else STUDY2["eval_samples"]
    if quick:
        return dict(resolved, learning_rate=QUICK2["learning_rate"])
    if "learning_rate" in spec:  # a pilot cell: the rate is the cell's
        return resolved
    lr = rates["rates"].get(spec["task"], {}).get(arm)
    if lr is None:
        raise SystemExit(
            f"no tuned learning rate for {arm} on {spec['task']} in {LEARNING_RATES_FILE}: run "
            f"--study 2 --pilot --task {spec['task']} --arms {arm}, then --study 2 --record-rates"
        )
    resolved["learning_rate"] = lr * spec.get("lr_factor", 1.0)
    if resolved["target"] is None:
        resolved["target"] = rates["targets"].get(cell)
    return resolved


def pilot_cells2(task: str) -> dict:
    base = STUDY2["cells"][PILOT_CELL[task]]
    return {f"pilot_{task}_lr{lr:g}": dict(base, learning_rate=lr) for lr in STUDY2["learning_rates"]["grid"]}


def jobs_to_run2(args, cells: dict, rates: dict) -> list[dict]:
    """Every planned (cell, arm, seed) without a finished JSON, interleaved by seed."""
    from benchmarks import study_task

    jobs = []
    for cell, arm, seed in study2_plan(cells, args.arms, args.seeds, quick=args.quick):
        if run_path(args.out, cell, arm, seed, STUDY2_FOLDER).exists():
            continue
        spec = cell_spec2(cell, cells[cell], arm, rates, quick=args.quick)
        extra = {"arm_spec": STUDY2["arms"][arm], "warm_start_tasks": _warm_start_tasks(spec["task"], study_task)}
        jobs.append(job_for(args, cell, spec, arm, seed, study=2, folder=STUDY2_FOLDER, **extra))
    return jobs


def _warm_start_tasks(task: str, study_task) -> tuple:
    return study_task.WARM_START_TASKS if task in study_task.WARM_START_TASKS else (task, "copy")


COST_ASSUMPTIONS = {
    "source": "benchmarks/results/training_study.json: the first study's median CPU seconds per run, by cell and arm",
    "like": {
        "otb_ref": "otb_N4",
        "candidates and the scaled arm": "otb_N4",
        "rloo_N4": "grpo_unscaled_N4",
        "long_right": "long (same budget, answers of similar length)",
        "long_offset": "long",
    },
    "eval_factor": 1.1,
    "eval_note": "8 evaluation samples per pattern instead of 4: an evaluation is about one batched generation "
    "(its cost is mostly the per-token overhead of generate, not the batch), about 11 per run against 50-200 "
    "training steps; 10% is allowed for it",
}


def cost_plan(first_study: dict, jobs: int = 2) -> dict:
    """Runs and estimated CPU seconds of the pilots and the study, per cell, and what each cut saves."""
    measured = first_study["cells"]
    like_arm = {"otb_ref": "otb_N4", "rloo_N4": "grpo_unscaled_N4"}
    like_cell = {"long_right": "long", "long_offset": "long"}

    def cpu(cell: str, arm: str) -> float:
        source = like_arm.get(arm, arm if arm in PREREGISTRATION["arms"] else "otb_N4")
        return (
            measured[like_cell.get(cell, cell)]["arms"][source]["cpu_seconds_median"] * COST_ASSUMPTIONS["eval_factor"]
        )

    arms = list(STUDY2["arms"])
    plan = study2_plan(STUDY2["cells"], arms, STUDY2["seeds"])
    cells = {}
    for cell, arm, _ in plan:
        entry = cells.setdefault(cell, {"runs": 0, "cpu_seconds": 0.0})
        entry["runs"] += 1
        entry["cpu_seconds"] += cpu(cell, arm)
    pilots = {}
    for task, cell in PILOT_CELL.items():
        n = len(STUDY2["learning_rates"]["grid"])
        pilots[task] = {"runs": n * len(arms), "cpu_seconds": n * sum(cpu(cell, a) for a in arms)}
    study_cpu = sum(c["cpu_seconds"] for c in cells.values())
    pilot_cpu = sum(p["cpu_seconds"] for p in pilots.values())

    def saved(keep) -> dict:
        """What a cut saves: its study runs, and the pilots of an arm on a task left with no run of that arm."""
        gone = [(c, a) for c, a, _ in plan if not keep(c, a)]
        pilots_gone = [
            (task, a)
            for task, cell in PILOT_CELL.items()
            for a in arms
            if not any(keep(c, a) for c, spec in STUDY2["cells"].items() if spec["task"] == task)
        ]
        n = len(STUDY2["learning_rates"]["grid"])
        seconds = sum(cpu(c, a) for c, a in gone) + sum(n * cpu(PILOT_CELL[t], a) for t, a in pilots_gone)
        return {"runs": len(gone) + n * len(pilots_gone), "cpu_seconds": round(seconds)}

    cuts = [
        ("1. rloo_N4 outside long", saved(lambda c, a: not (a == "rloo_N4" and c != "long"))),
        (
            "2. grpo_N16 outside long and long_high_lr",
            saved(lambda c, a: not (a == "grpo_N16" and c not in ("long", "long_high_lr"))),
        ),
        (
            "3. seeds of short (each seed)",
            {"runs": len(arms), "cpu_seconds": round(sum(cpu("short", a) for a in arms))},
        ),
    ]
    total = study_cpu + pilot_cpu
    return {
        "assumptions": COST_ASSUMPTIONS,
        "study": {c: {"runs": v["runs"], "cpu_seconds": round(v["cpu_seconds"])} for c, v in cells.items()},
        "pilots": {t: {"runs": v["runs"], "cpu_seconds": round(v["cpu_seconds"])} for t, v in pilots.items()},
        "runs": len(plan) + sum(p["runs"] for p in pilots.values()),
        "cpu_hours": round(total / 3600, 2),
        "wall_hours_at_2_jobs": round(total / 3600 / jobs, 2),
        "cut_order": dict(cuts),
    }


def parse_study2(args, parser):
    """--study 2's arguments: its arms, cells, seeds and modes."""
    from benchmarks import study_task

    args.arms = args.arms or list(STUDY2["arms"])
    unknown = set(args.arms) - set(STUDY2["arms"])
    if unknown:
        parser.error(f"unknown study-2 arms {sorted(unknown)}; choose among {list(STUDY2['arms'])}")
    if args.pilot is not None:
        if args.pilot or args.task is None:
            parser.error("study 2's --pilot takes no rates (the grid is pre-registered) and needs --task")
        cells = pilot_cells2(args.task)
    else:
        cells = QUICK2["cells"] if args.quick else STUDY2["cells"]
    unknown = set(args.cells or ()) - set(cells)
    if unknown:
        parser.error(f"unknown cells {sorted(unknown)}; choose among {sorted(cells)}")
    args.all_cells = cells
    args.cell_specs = {c: cells[c] for c in (args.cells or cells)}
    default_seeds = [STUDY2["learning_rates"]["pilot_seed"]] if args.pilot is not None else STUDY2["seeds"]
    args.seeds = args.seeds if args.seeds is not None else QUICK2["seeds"] if args.quick else default_seeds
    args.warm_start_steps = QUICK2["warm_start_steps"] if args.quick else study_task.WARM_START["steps"]
    args.max_steps = QUICK2["max_steps"] if args.quick else None
    args.warm_start_task_sets = sorted({_warm_start_tasks(c["task"], study_task) for c in args.cell_specs.values()})
    return args


def main2(args) -> dict | None:
    """--study 2: the plan, the rates file, or the runs not yet done and the summary."""
    meta = {
        "command": command("research.harness.training_study"),
        "study": 2,
        "quick": args.quick,
        "pilot": args.task if args.pilot is not None else None,
    }
    if args.plan:
        first = json.loads((Path(args.out) / "training_study.json").read_text())
        return print(json.dumps(cost_plan(first), indent=1))
    if args.record_rates:
        return print(json.dumps(record_rates(args.out), indent=1))
    if args.warm_start_only:
        return warm_up(args)
    rates = load_rates(args.out)
    if not args.summary:
        run_jobs(args, lambda: jobs_to_run2(args, args.cell_specs, rates))
    cells = args.cell_specs if args.pilot is not None else args.all_cells
    summary = summarise2(args.out, cells, meta, rates)
    print_summary2(summary)
    failed = [k for k, v in summary["offset_check"].items() if v["invariant"] and not v["equal"]]
    if failed:
        raise SystemExit(f"offset check FAILED: {failed} differ from their long runs (summary's offset_check)")
    return summary


def print_summary2(summary: dict) -> None:
    def arm_line(arm, a):
        return (
            f"{arm:24s} runs {a['runs']:2d} lr {a['learning_rate'] or 0:.2g} auc {a['auc_mean']:.3f} "
            f"final {a['final_mean']:.3f} (SE {a['final_se_median']:.3f}) collapse {a['collapse_rate']:.2f} "
            f"lone {a['lone_token_frac_median']:.3f}"
        )

    def pair_line(pair, metrics):  # the auc against TRL's default GRPO
        if pair.endswith("-grpo_N4"):
            v = metrics["auc"]
            return f"{pair:33s} auc {v['mean']:+.3f} [{v['ci'][0]:+.3f}, {v['ci'][1]:+.3f}]"
        return None

    print_cells(summary, 16, arm_line, pair_line)
    for key, check in summary["offset_check"].items():
        verdict = "equal" if check["equal"] else f"differs ({check['count']} values)"
        print(f"offset check {key}: {verdict}{'' if check['invariant'] else ' (offset-dependent arm)'}")
    if summary.get("chosen"):
        print(f"pilot: chosen rates {summary['chosen']}")
    if summary.get("decision"):
        print("decision:", summary["decision"]["arm"], summary["decision"]["config"])
        for reason in summary["decision"]["reasons"]:
            print("  ", reason)
