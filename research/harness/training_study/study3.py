"""The third study: why did study 2's shift-invariant OTB candidates lose to TRL's GRPO in ``long``? Its
pre-registration (``STUDY3``), its runs and its summary.

    python -m research.harness.training_study --study 3 --quick        # tiny: seconds per run (the tests)
    python -m research.harness.training_study --study 3 --tune         # every arm at every rate on the tuning seeds
    python -m research.harness.training_study --study 3                # the study seeds at the tuned rates; the summary
    python -m research.harness.training_study --study 3 --summary      # the summary from the finished runs only

Every run is study 2's ``long`` run (the same task, budget, evaluation, target, reward and arm settings: study 2's
harness runs it) at another learning rate or seed: --out/training_study3/<cell>/<arm>-s<seed>.json, one per run,
never run twice; the summary (--out/training_study3.json) is rebuilt from the finished runs.
"""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.common import command, write_json
from research.harness.training_study.analysis import paired_bootstrap, print_cells
from research.harness.training_study.preregistration2 import QUICK2, STUDY2, STUDY2_FOLDER
from research.harness.training_study.runs import job_for, run_jobs, run_path
from research.harness.training_study.study2 import _warm_start_tasks, load_rates
from research.harness.training_study.summary2 import run_metrics2, summarise_cell2

STUDY3_FOLDER = "training_study3"

STUDY3 = {
    "committed": "before any study-3 run (tuning included); not changed after seeing results (if it ever must be, "
    "both analyses are kept and the reason written down)",
    "finding": "study 2 (training_study2.json): in long (ramble, where long answers are wrong), every shift-invariant "
    "OTB candidate had a lower mean auc than TRL's default GRPO, and two of them were worse by the paired interval "
    "(otb_zero_advantage -0.078 [-0.102, -0.050], otb_zero_advantage_scaled -0.118 [-0.166, -0.081]): that is what "
    "disqualified both under the decision rule (otb_sequence_baseline was disqualified in long_high_lr). Each arm's "
    "rate came from one pilot seed (100), where the grid's best rates were close: on ramble, otb_zero_advantage "
    "0.619 at 2e-4 against 0.608 at 5e-4 (chosen: 2e-4); grpo_N4 0.577 at 5e-4 against 0.562 at 2e-4 "
    "(training_study2_learning_rates.json). One seed's auc is a noisy guide: over study 2's 10 long seeds its SD "
    "was 0.09 for grpo_N4 and 0.085 for otb_zero_advantage, several times those gaps",
    "hypothesis": "H1, the mechanism tested: the candidates' loss in long comes from the single-seed rate choice, not "
    "from the estimator. Under H1, with every arm's rate chosen on several seeds, the candidates are no longer worse "
    "than TRL's GRPO in long",
    "arms": ["otb_zero_advantage", "otb_sequence_baseline", "otb_zero_advantage_scaled", "grpo_N4"],
    "arm_notes": "study 2's arms (STUDY2['arms']), unchanged: the three shift-invariant candidates and TRL's default "
    "GRPO (std-scaled), all at N=4",
    "cell": "long",
    "cell_notes": "study 2's long cell, unchanged (ramble, 120000 completion tokens, held-out evaluation every 12000 "
    "with 8 samples per pattern, target 0.75, no reward offset, the same warm starts); only the rate and the seeds "
    "are study 3's",
    "tuning": {
        "grid": [2e-4, 5e-4, 1e-3],
        "seeds": [101, 102, 103, 104],
        "rule": "per arm, the grid rate with the highest mean auc over the 4 tuning seeds (none a study seed, none "
        "the study-2 pilot's 100); a tie goes to the lower rate",
        "why_this_grid": "study 2's grid without 2e-3: in study 2's ramble pilot, each of these four arms scored "
        "0.35 or less at 2e-3 and 0.56 or more at its best rate",
    },
    "seeds": list(range(10)),
    "seeds_notes": "study 2's 10 study seeds: the runs pair with study 2's (the same warm start, patterns and order)",
    "analysis": "on the 10 study seeds, at each arm's tuned rate: each candidate minus grpo_N4 in auc, final and "
    "tokens to target (the mean paired difference, percentile bootstrap 95% interval, 10,000 resamples of the "
    "seeds, generator seed 0), 'worse' where the auc interval lies below 0 (study 2's rule); collapse rates with "
    "Wilson intervals; and each arm's tuned-rate run minus its study-2 run on the same seed (auc), where the rate "
    "changed",
    "reading": "H1 is supported for a candidate that study 2 found worse than grpo_N4 in long if, at the tuned rates, "
    "its auc interval against grpo_N4 does not lie below 0; H1 is refuted for a candidate still worse. Study 3 "
    "does not change the default by itself (study 2's rule decided it, on four cells); it says whether that rule "
    "saw the estimator or the rate pilot in long, and a supported H1 is a reason to re-run the decision cells with "
    "multi-seed tuning",
    "cost": "4 arms x 3 rates x 4 tuning seeds = 48 runs, then 4 arms x 10 seeds = 40 runs; study 2's long runs "
    "took a median of 38 CPU seconds plus their evaluations: about 1.2 CPU hours in all, at 2 jobs at nice 19",
}

QUICK3 = {"grid": [QUICK2["learning_rate"], 2 * QUICK2["learning_rate"]], "tuning_seeds": [1], "seeds": [0]}


def tune_cell(lr: float) -> str:
    return f"tune_lr{lr:g}"


def cells3(quick: bool = False) -> dict:
    """The cell specs: one tuning cell per grid rate, and the study cell (whose rate is each arm's tuned one)."""
    base = dict((QUICK2 if quick else STUDY2)["cells"]["long"], reward_quantum=STUDY2["training_reward"]["quantum"])
    base["eval_samples"] = QUICK2["eval_samples"] if quick else STUDY2["eval_samples"]
    grid = QUICK3["grid"] if quick else STUDY3["tuning"]["grid"]
    return {**{tune_cell(lr): dict(base, learning_rate=lr) for lr in grid}, "long": base}


def _load_runs(out: Path, folder: str, cell: str) -> list[dict]:
    path = Path(out) / folder / cell
    return [json.loads(p.read_text()) for p in sorted(path.glob("*.json"))] if path.exists() else []


def tuned_rates(tuning: dict, arms: list[str]) -> dict:
    """Per arm, the grid rate with the highest mean auc over the tuning seeds (a tie: the lower rate); an arm
    missing a rate's runs gets no rate."""
    chosen = {}
    for arm in arms:
        aucs = {c["learning_rate"]: c["arms"][arm]["auc_mean"] for c in tuning.values() if arm in c["arms"]}
        complete = all(arm in c["arms"] and c["arms"][arm]["runs"] == c["seeds"] for c in tuning.values())
        if aucs and complete:
            chosen[arm] = min(aucs, key=lambda lr: (-aucs[lr], lr))
    return chosen


def summarise3(out: Path, quick: bool, meta: dict) -> dict:
    """Tuning: each arm's mean auc per rate and the tuned rates; the study: study 2's cell statistics with paired
    differences against grpo_N4, and each arm against its own study-2 run."""
    arms, cells = STUDY3["arms"], cells3(quick)
    tuning_seeds = QUICK3["tuning_seeds"] if quick else STUDY3["tuning"]["seeds"]
    tuning = {}
    for cell, spec in cells.items():
        if cell == "long":
            continue
        res = summarise_cell2(_load_runs(out, _folder(quick), cell), spec, arms, [])
        tuning[cell] = {"learning_rate": spec["learning_rate"], "seeds": len(tuning_seeds), "arms": res["arms"]}
    summary = {"meta": meta, "preregistration": STUDY3, "tuning": tuning, "rates": tuned_rates(tuning, arms)}
    runs = _load_runs(out, _folder(quick), "long")
    spec = cells["long"]
    summary["cells"] = {"long": summarise_cell2(runs, spec, arms, ["grpo_N4"])} if runs else {}
    summary["against_study2"] = {} if quick else _against_study2(out, runs, spec)
    name = "training_study3_quick.json" if quick else "training_study3.json"
    write_json(Path(out) / name, summary)
    return summary


def _against_study2(out: Path, runs: list[dict], spec: dict) -> dict:
    """Per arm: where its tuned rate differs from its study-2 rate, its run minus its study-2 long run (auc, seed by
    seed); where it is the same, how many of its runs repeat their study-2 run's curve exactly (all should)."""
    before = {(r["arm"], r["seed"]): r for r in _load_runs(out, STUDY2_FOLDER, "long")}
    rates2 = load_rates(out)["rates"].get("ramble", {})
    out_ = {}
    for arm in STUDY3["arms"]:
        mine = {r["seed"]: r for r in runs if r["arm"] == arm}
        seeds = sorted(s for s in mine if (arm, s) in before)
        if not seeds:
            continue
        lr = mine[seeds[0]]["learning_rate"]
        entry = {"study2_rate": rates2.get(arm), "rate": lr, "seeds": len(seeds)}
        if lr == rates2.get(arm):  # the same run as study 2's, so the same curve, bit for bit
            entry["same_curves"] = sum(mine[s]["curve"] == before[(arm, s)]["curve"] for s in seeds)
        else:
            diffs = [run_metrics2(mine[s], spec)["auc"] - run_metrics2(before[(arm, s)], spec)["auc"] for s in seeds]
            entry["auc"] = paired_bootstrap(diffs)
        out_[arm] = entry
    return out_


def _folder(quick: bool) -> str:
    return STUDY3_FOLDER + ("_quick" if quick else "")


def jobs_to_run3(args, rates: dict) -> list[dict]:
    """Every tuning run (--tune) or study run without a finished JSON, interleaved by seed."""
    from benchmarks import study_task

    cells = cells3(args.quick)
    if args.tune:
        seeds = QUICK3["tuning_seeds"] if args.quick else STUDY3["tuning"]["seeds"]
        plan = [(c, a, s) for s in seeds for c in cells if c != "long" for a in args.arms]
    else:
        missing = [a for a in args.arms if a not in rates]
        if missing:
            raise SystemExit(f"no tuned rate for {missing}: run --study 3 --tune first (every arm, every rate)")
        plan = [("long", a, s) for s in args.seeds for a in args.arms]
    jobs = []
    for cell, arm, seed in plan:
        if run_path(args.out, cell, arm, seed, _folder(args.quick)).exists():
            continue
        spec = cells[cell] if cell != "long" else dict(cells[cell], learning_rate=rates[arm])
        extra = {"arm_spec": STUDY2["arms"][arm], "warm_start_tasks": _warm_start_tasks(spec["task"], study_task)}
        jobs.append(job_for(args, cell, spec, arm, seed, study=2, folder=_folder(args.quick), **extra))
    return jobs


def parse_study3(args, parser):
    from benchmarks import study_task

    args.arms = args.arms or list(STUDY3["arms"])
    unknown = set(args.arms) - set(STUDY3["arms"])
    if unknown:
        parser.error(f"unknown study-3 arms {sorted(unknown)}; choose among {STUDY3['arms']}")
    default_seeds = QUICK3["seeds"] if args.quick else STUDY3["seeds"]
    args.seeds = args.seeds if args.seeds is not None else default_seeds
    args.warm_start_steps = QUICK2["warm_start_steps"] if args.quick else study_task.WARM_START["steps"]
    args.max_steps = QUICK2["max_steps"] if args.quick else None
    args.warm_start_task_sets = [_warm_start_tasks("ramble", study_task)]
    return args


def main3(args) -> dict:
    """--study 3: the tuning runs (--tune) or the study runs not yet done, then the summary."""
    meta = {"command": command("research.harness.training_study"), "study": 3, "quick": args.quick}
    if not args.summary:
        if not args.tune:  # the rates come from the finished tuning runs
            rates = summarise3(args.out, args.quick, meta)["rates"]
        run_jobs(args, lambda: jobs_to_run3(args, {} if args.tune else rates))
    summary = summarise3(args.out, args.quick, meta)
    print_summary3(summary)
    return summary


def print_summary3(summary: dict) -> None:
    for cell, res in summary["tuning"].items():
        for arm, a in res["arms"].items():
            print(f"{cell:14s} {arm:26s} runs {a['runs']} auc {a['auc_mean']:.3f} collapse {a['collapse_rate']:.2f}")
    print("tuned rates:", summary["rates"])

    def arm_line(arm, a):
        return f"{arm:26s} runs {a['runs']:2d} lr {a['learning_rate'] or 0:.2g} auc {a['auc_mean']:.3f}"

    def pair_line(pair, metrics):
        v = metrics["auc"]
        return f"{pair:36s} auc {v['mean']:+.3f} [{v['ci'][0]:+.3f}, {v['ci'][1]:+.3f}]"

    print_cells(summary, 14, arm_line, pair_line)
    for arm, entry in summary["against_study2"].items():
        auc = entry.get("auc")
        same = f"the same rate: {entry.get('same_curves')}/{entry['seeds']} curves equal study 2's"
        diff = f"auc {auc['mean']:+.3f} [{auc['ci'][0]:+.3f}, {auc['ci'][1]:+.3f}]" if auc else same
        print(f"{arm:26s} {entry['study2_rate']:.2g} -> {entry['rate']:.2g}: {diff}")
