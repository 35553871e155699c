"""The estimator study (study 4): its runs and its summary; the pre-registration is ``preregistration4.py``.

    python -m research.harness.training_study --study 4 --quick --out DIR   # tiny: seconds per run (the tests)
    python -m research.harness.training_study --study 4 --tune --out DIR    # every arm at every rate, tuning seeds
    python -m research.harness.training_study --study 4 --out DIR           # the study seeds at the tuned rates
    python -m research.harness.training_study --study 4 --summary --out DIR # the summary from the finished runs

Each run is study 2's harness on one of study 2's cells: DIR/training_study4/<cell>/<arm>-s<seed>.json, never run
twice; the summary (DIR/training_study4.json) is rebuilt from the finished runs. Tuning cells are named
``tune_<task>_lr<rate>``. research/estimator_study/README.md says where the runs are kept between sessions.
"""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.common import command, pyplot, save_figure, write_json
from research.harness.training_study.analysis import paired_bootstrap, plot, print_cells
from research.harness.training_study.preregistration2 import LEARNING_RATES_FILE, QUICK2, STUDY2
from research.harness.training_study.preregistration4 import ARMS4, QUICK4, STUDY4, UNBIASED_BY_CONSTRUCTION
from research.harness.training_study.runs import job_for, run_jobs, run_path
from research.harness.training_study.study2 import _warm_start_tasks
from research.harness.training_study.summary2 import run_metrics2, summarise_cell2

STUDY4_FOLDER = "training_study4"
TASK_CELL = STUDY4["tuning"]["tasks"]  # task -> its main cell
STUDY2_RATES = Path(__file__).resolve().parents[2] / "training_study2" / "results" / LEARNING_RATES_FILE
SERIES = [1e-5, 2e-5, 5e-5, 1e-4, 2e-4, 5e-4, 1e-3, 2e-3, 5e-3, 1e-2]  # the 1-2-5 series the grid extends along


def _folder(quick: bool) -> str:
    return STUDY4_FOLDER + ("_quick" if quick else "")


def tune_cell(task: str, lr: float) -> str:
    return f"tune_{task}_lr{lr:g}"


def base_cell(cell: str, quick: bool, out: Path) -> dict:
    """Study 2's cell as study 4 runs it: the reward quantum, the evaluation samples, long_right's recorded target."""
    spec = dict((QUICK4 if quick else STUDY2)["cells"][cell], reward_quantum=STUDY2["training_reward"]["quantum"])
    spec["eval_samples"] = QUICK2["eval_samples"] if quick else STUDY2["eval_samples"]
    if spec.get("target", 0) is None:  # long_right: the target study 2's rule recorded, from --out or its folder
        found = [p for p in (Path(out) / LEARNING_RATES_FILE, STUDY2_RATES) if p.exists()]
        spec["target"] = json.loads(found[0].read_text())["targets"].get(spec["task"]) if found else None
    return spec


def _load_runs(out: Path, quick: bool, cell: str) -> list[dict]:
    path = Path(out) / _folder(quick) / cell
    return [json.loads(p.read_text()) for p in sorted(path.glob("*.json"))] if path.exists() else []


def grid_for(task: str, arm: str, tuning: dict, quick: bool) -> list[float]:
    """The arm's grid on ``task``: the pre-registered one, extended along ``SERIES`` past an edge that holds the best
    finished mean auc (the rule in STUDY4['tuning'])."""
    grid = list(QUICK4["grid"] if quick else STUDY4["tuning"]["grid"])
    while True:
        best = best_rate(task, arm, tuning, grid)
        if best is None or quick or best not in (grid[0], grid[-1]):
            return grid
        i = SERIES.index(best)
        step = SERIES[i - 1] if best == grid[0] else SERIES[i + 1] if i + 1 < len(SERIES) else None
        if step is None or step in grid:
            return grid
        grid = sorted([*grid, step])


def best_rate(task: str, arm: str, tuning: dict, grid: list[float]) -> float | None:
    """The grid rate with the highest mean auc over the tuning seeds (a tie: the lower rate); None until every grid
    rate has its runs."""
    aucs = {}
    for lr in grid:
        entry = tuning.get(tune_cell(task, lr), {}).get("arms", {}).get(arm)
        if entry is None or entry["runs"] < tuning[tune_cell(task, lr)]["seeds"]:
            return None
        aucs[lr] = entry["auc_mean"]
    return min(aucs, key=lambda lr: (-aucs[lr], lr))


def summarise_tuning(out: Path, quick: bool) -> tuple[dict, dict]:
    """Each tuning cell's per-arm statistics, and per task and arm the tuned rate (None until it is decided)."""
    seeds = QUICK4["tuning_seeds"] if quick else STUDY4["tuning"]["seeds"]
    tuning = {}
    for task, cell in TASK_CELL.items():
        spec = base_cell(cell, quick, out)
        for path in sorted((Path(out) / _folder(quick)).glob(f"{tune_cell(task, 0)[:-1]}*")):
            runs = _load_runs(out, quick, path.name)
            lr = runs[0]["learning_rate"] if runs else None
            res = summarise_cell2(runs, dict(spec, learning_rate=lr), list(ARMS4), [])
            tuning[path.name] = {"task": task, "learning_rate": lr, "seeds": len(seeds), "arms": res["arms"]}
    rates = {}
    for task in TASK_CELL:
        rates[task] = {}
        for arm in ARMS4:
            grid = grid_for(task, arm, tuning, quick)
            rates[task][arm] = best_rate(task, arm, tuning, grid)
    return tuning, rates


def cell_rate(cell: str, arm: str, rates: dict, quick: bool, out: Path) -> float | None:
    spec = base_cell(cell, quick, out)
    lr = rates[spec["task"]].get(arm)
    return None if lr is None else lr * spec.get("lr_factor", 1.0)


def stuck(run: dict) -> bool:
    """Whether every group of each of the run's last max(3, a quarter of its) steps tied (STUDY4's outcomes)."""
    ties = [s.get("frac_reward_zero_std") for s in run["steps"]]
    tail = ties[-max(3, len(ties) // 4) :]
    return len(ties) >= 3 and all(t is not None and t >= 1.0 for t in tail)


def tie_share(run: dict) -> float:
    ties = [s["frac_reward_zero_std"] for s in run["steps"] if s.get("frac_reward_zero_std") is not None]
    return sum(ties) / len(ties) if ties else float("nan")


def summarise_cell4(runs: list[dict], spec: dict) -> dict:
    """Study 2's cell statistics against grpo_N4, with each arm's stuck runs, tie share and per-seed auc."""
    res = summarise_cell2(runs, spec, list(ARMS4), ["grpo_N4"])
    for arm, stats in res["arms"].items():
        mine = sorted((r for r in runs if r["arm"] == arm), key=lambda r: r["seed"])
        stats["stuck"] = sum(stuck(r) for r in mine)
        stats["tie_share_mean"] = sum(tie_share(r) for r in mine) / len(mine) if mine else float("nan")
        stats["per_seed_auc"] = {str(r["seed"]): run_metrics2(r, spec)["auc"] for r in mine}
    return res


def gate(prescreen: dict | None) -> dict:
    """Per candidate: passes (True/False) or None while the pre-screen lacks it. ``prescreen``: {"cells": {cell:
    {"init": {arm: {"cos": ...}}, "trained": {...}}}, "meta": {"missing": [...]}} (prescreen/summary.json). One
    measured cos below 0.99 fails a candidate for good; it passes once every cell and point is measured at 0.99 or
    more."""
    out = {}
    missing = bool((prescreen or {}).get("meta", {}).get("missing"))
    for arm in STUDY4["candidates"]:
        if arm in UNBIASED_BY_CONSTRUCTION:
            out[arm] = True
            continue
        cosines = [
            point.get(arm, {}).get("cos")
            for cell in (prescreen or {}).get("cells", {}).values()
            for point in (cell.get("init", {}), cell.get("trained", {}))
        ]
        if any(c is not None and c < 0.99 for c in cosines):
            out[arm] = False
        else:
            out[arm] = None if missing or not cosines or None in cosines else True
    return out


def decide(cells: dict, gates: dict) -> dict:
    """The pre-registered decision rule (STUDY4['decision']) on the four cells' summaries."""
    if set(cells) != set(STUDY4["cells"]) or any("grpo_N4" not in c["arms"] for c in cells.values()):
        return {"arm": None, "reasons": ["the study has not finished every cell"]}
    passing = [a for a in STUDY4["candidates"] if gates.get(a) and all(a in c["arms"] for c in cells.values())]

    def bad(arm):
        return sum(c["arms"][arm]["stuck"] + round(c["arms"][arm]["collapse_rate"] * c["arms"][arm]["runs"])
                   for c in cells.values())  # fmt: skip

    mean_auc = {a: sum(c["arms"][a]["auc_mean"] for c in cells.values()) / len(cells) for a in passing}
    reasons = [f"gate passed: {passing}", f"mean auc over cells: {mean_auc}"]
    qualified = [a for a in passing if bad(a) <= bad("grpo_N4")]
    beaten = {}
    for arm in (a for a in passing if a != "otb_default"):
        wins = 0
        for c in cells.values():
            seeds = sorted(set(c["arms"]["otb_default"]["per_seed_auc"]) & set(c["arms"][arm]["per_seed_auc"]))
            diffs = [c["arms"]["otb_default"]["per_seed_auc"][s] - c["arms"][arm]["per_seed_auc"][s] for s in seeds]
            wins += bool(diffs) and paired_bootstrap(diffs)["ci"][0] > 0
        beaten[arm] = wins
    table = {
        arm: {
            "gate": gates.get(arm) if arm in STUDY4["candidates"] else None,
            "mean_auc": sum(c["arms"][arm]["auc_mean"] for c in cells.values()) / len(cells),
            "stuck_or_collapsed": bad(arm),
            "runs": sum(c["arms"][arm]["runs"] for c in cells.values()),
            "cells_otb_default_beats_it": beaten.get(arm),
        }
        for arm in ARMS4
        if all(arm in c["arms"] for c in cells.values())
    }  # every arm's side of the rule, for the report
    if beaten and all(w >= 2 for w in beaten.values()) and "otb_default" in cells["long"]["arms"]:
        reasons.append(f"falsification: otb_default beat every gate-passing candidate in >= 2 cells ({beaten})")
        return {"arm": "otb_default", "reasons": reasons, "bias_helps": True, "table": table}
    if not qualified:
        reasons.append("no gate-passing candidate has as few stuck/collapsed as grpo_N4")
        return {"arm": None, "reasons": reasons, "table": table}
    chosen = max(qualified, key=lambda a: (mean_auc[a], a))
    return {"arm": chosen, "config": ARMS4[chosen], "reasons": [*reasons, f"chosen: {chosen}"], "table": table}


PRESCREEN_CELL = {"long": "ramble", "long_right": "study-long_right", "short": "study-copy", "long_high_lr": "ramble"}
"""Each training cell's pre-screen cell (STUDY4['prescreen']['prediction']: long_high_lr uses ramble's)."""


def _spearman(a: list[float], b: list[float]) -> float:
    def ranks(x):
        order = sorted(range(len(x)), key=lambda i: x[i])
        out = [0.0] * len(x)
        i = 0
        while i < len(order):  # average ranks over ties
            j = i
            while j + 1 < len(order) and x[order[j + 1]] == x[order[i]]:
                j += 1
            for k in range(i, j + 1):
                out[order[k]] = (i + j) / 2
            i = j + 1
        return out

    ra, rb = ranks(a), ranks(b)
    ma, mb = sum(ra) / len(ra), sum(rb) / len(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    den = (sum((x - ma) ** 2 for x in ra) * sum((y - mb) ** 2 for y in rb)) ** 0.5
    return cov / den if den else float("nan")


def prediction_p1(cells: dict, prescreen: dict | None) -> dict:
    """P1 (STUDY4['prescreen']['prediction']): per training cell, the Spearman correlation over the arms between
    -eps_star at the initial policy (the cell's pre-screen cell) and the arm's mean auc, and that between -raw MSE
    and the mean auc; held if the first is higher on the mean over the cells. None until every cell is summarised."""
    if set(cells) != set(STUDY4["cells"]) or not prescreen:
        return {"held": None, "reason": "the study or the pre-screen has not finished every cell"}
    per_cell = {}
    for cell, summary in cells.items():
        init = prescreen.get("cells", {}).get(PRESCREEN_CELL[cell], {}).get("init", {})
        arms = [a for a in summary["arms"] if a in init and "raw_mse" in init[a]]
        auc = [summary["arms"][a]["auc_mean"] for a in arms]
        per_cell[cell] = {
            "arms": arms,
            "eps_star": _spearman([-init[a]["eps_star"] for a in arms], auc),
            "raw_mse": _spearman([-init[a]["raw_mse"] for a in arms], auc),
        }
    mean_eps = sum(c["eps_star"] for c in per_cell.values()) / len(per_cell)
    mean_mse = sum(c["raw_mse"] for c in per_cell.values()) / len(per_cell)
    return {"held": mean_eps > mean_mse, "mean_eps_star": mean_eps, "mean_raw_mse": mean_mse, "cells": per_cell}


def summarise4(out: Path, quick: bool, meta: dict, prescreen: dict | None = None) -> dict:
    tuning, rates = summarise_tuning(out, quick)
    summary = {"meta": meta, "preregistration": STUDY4, "tuning": tuning, "rates": rates, "cells": {}}
    runs, specs = {}, {}  # the finished cells' runs and specs, for the summary and the figures
    for cell in STUDY4["cells"]:
        if mine := _load_runs(out, quick, cell):
            runs[cell], specs[cell] = mine, dict(base_cell(cell, quick, out), learning_rate=None)
            summary["cells"][cell] = summarise_cell4(mine, specs[cell])
    summary["gate"] = gate(prescreen)
    summary["prediction_p1"] = None if quick else prediction_p1(summary["cells"], prescreen)
    summary["decision"] = None if quick else decide(summary["cells"], summary["gate"])
    write_json(Path(out) / f"{_folder(quick)}.json", summary)
    try:
        plot(runs, specs, Path(out) / f"{_folder(quick)}.png", list(ARMS4))
        plot_differences(summary, Path(out) / f"{_folder(quick)}_auc.png")
    except ImportError as error:  # matplotlib is in the dev extra
        print(error)
    return summary


def plot_differences(summary: dict, path: Path) -> None:
    """Per cell, each arm's auc minus grpo_N4's (paired by seed) with its 95% interval; stuck runs in the label."""
    cells = [c for c in summary["cells"] if summary["cells"][c]["paired"]]
    if not cells:
        return
    arms = [a for a in ARMS4 if a != "grpo_N4"]
    fig, axes = pyplot().subplots(1, len(cells), figsize=(4.2 * len(cells), 3.2), squeeze=False, sharey=True)
    for ax, cell in zip(axes[0], cells):
        res = summary["cells"][cell]
        for y, arm in enumerate(arms):
            auc = res["paired"].get(f"{arm}-grpo_N4", {}).get("auc")
            if auc is None:
                continue
            ax.errorbar(auc["mean"], y, xerr=[[auc["mean"] - auc["ci"][0]], [auc["ci"][1] - auc["mean"]]],
                        fmt="o", color=f"C{y}", capsize=3)  # fmt: skip
        ax.axvline(0, color="grey", lw=0.8)
        ax.locator_params(axis="x", nbins=4)
        ax.set_yticks(range(len(arms)), [f"{a} ({res['arms'].get(a, {}).get('stuck', '-')} stuck)" for a in arms])
        base = res["arms"]["grpo_N4"]
        ax.set(title=f"{cell} (grpo_N4: {base['stuck']} stuck)", xlabel="auc minus TRL's GRPO (95% interval)")
    save_figure(fig, path)


def jobs_to_run4(args, rates: dict, tuning: dict) -> list[dict]:
    """Every tuning run (--tune: the arm's current grid, extended past an edge as decided) or study run without a
    finished JSON, interleaved by seed."""
    from benchmarks import study_task

    plan = []
    if args.tune:
        seeds = QUICK4["tuning_seeds"] if args.quick else STUDY4["tuning"]["seeds"]
        for seed in seeds:
            for task, cell in TASK_CELL.items():
                for arm in args.arms:
                    for lr in grid_for(task, arm, tuning, args.quick):
                        spec = dict(base_cell(cell, args.quick, args.out), learning_rate=lr)
                        spec.pop("lr_factor", None)
                        plan.append((tune_cell(task, lr), spec, arm, seed))
    else:
        for seed in args.seeds:
            for cell in args.cells or STUDY4["cells"]:
                for arm in args.arms:
                    lr = cell_rate(cell, arm, rates, args.quick, args.out)
                    if lr is None:
                        raise SystemExit(f"no tuned rate for {arm} in {cell}: run --study 4 --tune until it is set")
                    plan.append((cell, dict(base_cell(cell, args.quick, args.out), learning_rate=lr), arm, seed))
    jobs = []
    for cell, spec, arm, seed in plan:
        if run_path(args.out, cell, arm, seed, _folder(args.quick)).exists():
            continue
        extra = {"arm_spec": ARMS4[arm], "warm_start_tasks": _warm_start_tasks(spec["task"], study_task)}
        jobs.append(job_for(args, cell, spec, arm, seed, study=2, folder=_folder(args.quick), **extra))
    return jobs


def parse_study4(args, parser):
    from benchmarks import study_task

    args.arms = args.arms or list(ARMS4)
    unknown = set(args.arms) - set(ARMS4)
    if unknown:
        parser.error(f"unknown study-4 arms {sorted(unknown)}; choose among {list(ARMS4)}")
    unknown = set(args.cells or ()) - set(STUDY4["cells"])
    if unknown:
        parser.error(f"unknown study-4 cells {sorted(unknown)}; choose among {list(STUDY4['cells'])}")
    args.seeds = args.seeds if args.seeds is not None else QUICK4["seeds"] if args.quick else STUDY4["seeds"]
    args.warm_start_steps = QUICK2["warm_start_steps"] if args.quick else study_task.WARM_START["steps"]
    args.max_steps = QUICK2["max_steps"] if args.quick else None
    tasks = {base_cell(c, args.quick, args.out)["task"] for c in STUDY4["cells"]}
    args.warm_start_task_sets = sorted({_warm_start_tasks(t, study_task) for t in tasks})
    return args


PRESCREEN_SUMMARY = Path(__file__).resolve().parents[2] / "estimator_study" / "prescreen" / "summary.json"


def _prescreen(out: Path) -> dict | None:
    """The pre-screen's summary: ``out``'s estimator_study_prescreen.json if there is one (the tests'), else the
    committed research/estimator_study/prescreen/summary.json (prescreen/summary.py)."""
    path = Path(out) / "estimator_study_prescreen.json"
    path = path if path.exists() else PRESCREEN_SUMMARY
    return json.loads(path.read_text()) if path.exists() else None


def main4(args) -> dict:
    """--study 4: the tuning runs (--tune) or the study runs not yet done, then the summary."""
    meta = {"command": command("research.harness.training_study"), "study": 4, "quick": args.quick}
    while not args.summary:  # --tune repeats while the grid extends past an edge
        planned = []

        def make_jobs(planned=planned):
            tuning, rates = summarise_tuning(args.out, args.quick)
            planned[:] = jobs_to_run4(args, rates, tuning)
            return planned

        run_jobs(args, make_jobs)
        if not args.tune or not planned:
            break
    summary = summarise4(args.out, args.quick, meta, _prescreen(args.out))
    print("tuned rates:", summary["rates"])

    def arm_line(arm, a):
        return f"{arm:18s} runs {a['runs']:2d} lr {a['learning_rate'] or 0:.2g} auc {a['auc_mean']:.3f} stuck {a['stuck']}"

    def pair_line(pair, metrics):
        v = metrics["auc"]
        return f"{pair:30s} auc {v['mean']:+.3f} [{v['ci'][0]:+.3f}, {v['ci'][1]:+.3f}]"

    print_cells(summary, 14, arm_line, pair_line)
    print("gate:", summary["gate"], "decision:", summary["decision"])
    return summary
