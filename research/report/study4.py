"""The estimator study's blocks (study 4: research/harness/training_study/study4.py and first_batches.py): each cell's
arms against TRL's GRPO with the stuck runs, the per-seed rows, the tuned rates, the decision rule's table, prediction
P1, and the real model's first batches. Each reads the study's summary JSON (``training_study4``,
``first_batches``), named in its block (pages.py)."""

from __future__ import annotations

from research.report.tables import auc_difference, markdown_table

ARM_LABELS4 = {
    "grpo_N4": "TRL's GRPO (std-scaled)",
    "grpo_unscaled_N4": "GRPO, unscaled",
    "otb_default": "OTB, 0.2 default (self-inclusive, `zero_advantage`)",
    "otb_loo_mean": "OTB, leave-one-out, `others_mean`",
    "otb_loo_ess": "OTB, leave-one-out, `others_mean`, `ess`",
    "ogb_N4": "OGB",
}


def _label(arm: str) -> str:
    return ARM_LABELS4.get(arm, arm)


def _count(k: int, n: int) -> str:
    return f"{k}/{n}"


def study4_cell_table(data: dict, cell: str) -> str:
    """Per arm of a cell: its rate, runs, mean auc, auc minus TRL's GRPO paired by seed (95% interval), the runs stuck
    in the all-tied state, the mean per-step tie share, and the collapses."""
    res = data["cells"][cell]
    header = ["arm", "lr", "runs", "auc", "auc minus TRL's GRPO", "stuck", "tie share", "collapsed"]
    rows = []
    for arm, a in res["arms"].items():
        paired = res["paired"].get(f"{arm}-grpo_N4", {}).get("auc")
        rows.append(
            [
                _label(arm),
                f"{a['learning_rate']:.2g}" if a.get("learning_rate") else "-",
                str(a["runs"]),
                f"{a['auc_mean']:.3f}",
                auc_difference(paired) if arm != "grpo_N4" else "(reference)",
                _count(a["stuck"], a["runs"]),
                f"{a['tie_share_mean']:.3f}",
                _count(round(a["collapse_rate"] * a["runs"]), a["runs"]),
            ]
        )
    return "\n".join(markdown_table(header, ["---", *["---:"] * (len(header) - 1)], rows))


def study4_seed_table(data: dict, cell: str) -> str:
    """A cell's auc per seed (rows) and arm (columns), so that a split a mean hides shows."""
    arms = list(data["cells"][cell]["arms"])
    per_seed = {arm: data["cells"][cell]["arms"][arm]["per_seed_auc"] for arm in arms}
    seeds = sorted({s for v in per_seed.values() for s in v}, key=int)
    rows = [[s, *(f"{per_seed[a][s]:.3f}" if s in per_seed[a] else "-" for a in arms)] for s in seeds]
    return "\n".join(markdown_table(["seed", *map(_label, arms)], ["---:"] * (len(arms) + 1), rows))


def study4_rates_table(data: dict) -> str:
    """Per tuning task and arm: the mean auc over the tuning seeds at each rate run, and the rate chosen (bold)."""
    rows = []
    for task, rates in data["rates"].items():
        for arm, chosen in rates.items():
            cells = sorted(
                (entry["learning_rate"], entry["arms"][arm])
                for entry in data["tuning"].values()
                if entry["task"] == task and arm in entry["arms"]
            )
            grid = [
                (f"**{lr:g}**" if lr == chosen else f"{lr:g}") + f": {a['auc_mean']:.3f} ({a['runs']})"
                for lr, a in cells
            ]
            rows.append([task, _label(arm), ", ".join(grid) or "-", "-" if chosen is None else f"{chosen:g}"])
    header = ["task", "arm", "rate: mean auc (runs)", "tuned rate"]
    return "\n".join(markdown_table(header, ["---", "---", "---", "---:"], rows))


def study4_decision_table(data: dict) -> str:
    """The decision rule's inputs per arm (the gate, the mean auc over the four cells, stuck or collapsed runs, the
    cells in which the 0.2 default beats it beyond its interval) and its outcome."""
    decision = data.get("decision") or {}
    table = decision.get("table")
    if not table:
        return "The study has not finished every cell."
    gate = {True: "passes", False: "fails", None: "-"}
    rows = [
        [
            _label(arm),
            gate[t["gate"]],
            f"{t['mean_auc']:.3f}",
            _count(t["stuck_or_collapsed"], t["runs"]),
            "-" if t["cells_otb_default_beats_it"] is None else str(t["cells_otb_default_beats_it"]),
            "**chosen**" if arm == decision.get("arm") else "",
        ]
        for arm, t in table.items()
    ]
    header = ["arm", "gate", "mean auc over cells", "stuck or collapsed", "cells the 0.2 default wins", "rule"]
    return "\n".join(markdown_table(header, ["---", "---", "---:", "---:", "---:", "---"], rows))


def study4_p1_table(data: dict) -> str:
    """Prediction P1 per cell: the Spearman correlation over the arms of the mean auc with -eps_star and with
    -raw MSE at the initial policy."""
    p1 = data.get("prediction_p1") or {}
    if not p1.get("cells"):
        return "P1 is judged once every cell has finished."
    rows = [[cell, f"{c['eps_star']:+.2f}", f"{c['raw_mse']:+.2f}"] for cell, c in p1["cells"].items()]
    rows.append(["mean", f"{p1['mean_eps_star']:+.2f}", f"{p1['mean_raw_mse']:+.2f}"])
    header = ["cell", "Spearman with -eps_star", "Spearman with -raw MSE"]
    return "\n".join(markdown_table(header, ["---", "---:", "---:"], rows))


def first_batches_table(data: dict) -> str:
    """Per arm: the share of the qualifying first batches whose step lowered the stop log-odds at n (Wilson 95%
    interval), and the mean change at n and before it."""
    rows = []
    for arm, a in data["arms"].items():
        lo, hi = a["wilson95"] if a["batches"] else (float("nan"), float("nan"))
        share = "-" if a["share_lowered"] is None else f"{a['lowered']}/{a['batches']} = {a['share_lowered']:.2f}"
        mean = a["mean_change"]
        rows.append(
            [
                _label(arm),
                f"{a['config']['learning_rate']:g}" if a.get("config") else "-",
                share,
                "-" if a["share_lowered"] is None else f"{lo:.2f}-{hi:.2f}",
                "-" if mean["at"] is None else f"{mean['at']:+.3f}",
                "-" if mean["early"] is None else f"{mean['early']:+.3f}",
            ]
        )
    header = ["arm", "lr", "lowered the stop at n", "95% interval", "mean change at n", "mean change before n"]
    draws = data["draws"]
    seeds = f"{draws['first_seed']}-{draws['last_seed']}"
    counts = markdown_table(["qualifying batches", "drawn", "seeds"], ["---:"] * 3,
                            [[str(data["batches"]), str(draws["drawn"]), seeds]])  # fmt: skip
    return "\n".join([*markdown_table(header, ["---", *["---:"] * 5], rows), "", *counts])
