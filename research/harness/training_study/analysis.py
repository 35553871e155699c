"""What both studies compute from the run records (pure functions of them): the held-out score along the tokens
and its area, the collapse rule, a run's metrics, the paired bootstrap over seeds, Wilson intervals, a cell's
statistics per arm with OTB's paired differences, the figure, and the printed lines of a summary."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

from benchmarks.common import pyplot, save_figure, tokens_to_target
from research.harness.training_study.preregistration import PREREGISTRATION

BOOTSTRAP = 10_000


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


def by_arm(metrics: dict, arms: list[str]) -> dict[str, list[dict]]:
    """``metrics`` keyed by (arm, seed) -> each of ``arms`` that has runs: its metrics in seed order."""
    grouped = {arm: [m for (a, _), m in sorted(metrics.items()) if a == arm] for arm in arms}
    return {arm: mine for arm, mine in grouped.items() if mine}


def paired_seeds(metrics: dict, arm: str, ref: str) -> list[int]:
    """The seeds where both ``arm`` and ``ref`` finished (``metrics`` keyed by (arm, seed))."""
    return sorted(s for (a, s) in metrics if a == arm and (ref, s) in metrics)


def summarise_cell(runs: list[dict], cell: dict, arms: list[str]) -> dict:
    """Per arm: medians and means over seeds, collapse rate; per other arm: OTB's paired differences."""
    metrics = {(r["arm"], r["seed"]): run_metrics(r, cell) for r in runs}
    out = {"arms": {}, "paired": {}}
    for arm, mine in by_arm(metrics, arms).items():
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
        seeds = paired_seeds(metrics, "otb_N4", arm)
        if not seeds:
            continue
        out["paired"][f"otb_N4-{arm}"] = {
            name: paired_bootstrap([metrics[("otb_N4", s)][name] - metrics[(arm, s)][name] for s in seeds])
            for name in ("tokens_to_target", "auc", "final")
        }
    return out


def plot(runs: dict, cells: dict, path: Path, arms=None) -> None:
    """Per cell: each arm's median held-out score against completion tokens, with the band of its seeds."""
    shown = [c for c in cells if runs.get(c)]
    if not shown:
        return
    fig, axes = pyplot().subplots(1, len(shown), figsize=(5 * len(shown), 3.8), squeeze=False)
    colors = dict(zip(PREREGISTRATION["arms"], ["black", "tab:blue", "tab:cyan", "tab:green", "tab:orange"]))
    if arms is not None:
        colors = {arm: f"C{i % 10}" for i, arm in enumerate(arms)}
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
        if spec.get("target") is not None:
            ax.axhline(spec["target"], color="grey", lw=0.8, ls=":")
        lr = spec.get("learning_rate")
        ax.set(title=f"{cell} ({spec['task']}{'' if lr is None else f', lr {lr:g}'})", xlabel="completion tokens")
        ax.set_ylabel("held-out score (median, band: seeds' range)")
        ax.legend(fontsize=7)
    save_figure(fig, path)


STEP_PANELS = {
    "completions/mean_length": "mean completion length",
    "grad_norm": "gradient norm (before clipping)",
    "study/lone_token_frac": "share of tokens with a fallback baseline",
}


def plot_steps(runs: dict, cells: list[str], path: Path, arms: list[str]) -> None:
    """Per cell (rows) and per logged quantity (columns, ``STEP_PANELS``): each arm's median over its seeds at each
    training step (seeds' steps are cut to the shortest run of the arm)."""
    shown = [c for c in cells if runs.get(c)]
    if not shown:
        return
    fig, axes = pyplot().subplots(len(shown), len(STEP_PANELS), figsize=(15, 3.2 * len(shown)), squeeze=False)
    for row, cell in zip(axes, shown):
        for ax, (key, label) in zip(row, STEP_PANELS.items()):
            for i, arm in enumerate(arms):
                series = [[s.get(key) for s in r["steps"]] for r in runs[cell] if r["arm"] == arm]
                if not series:
                    continue
                steps = min(len(x) for x in series)
                values = [[x[t] for x in series if x[t] is not None] for t in range(steps)]
                ax.plot([statistics.median(v) if v else float("nan") for v in values], color=f"C{i % 10}", label=arm)
            ax.set(title=f"{cell}: {label}", xlabel="step")
        row[0].legend(fontsize=6)
    save_figure(fig, path)


def print_cells(summary: dict, width: int, arm_line, pair_line) -> None:
    """Print a summary cell by cell, each line led by the cell's name padded to ``width``: ``arm_line(arm, stats)``
    for each arm, then ``pair_line(pair, metrics)`` for each paired comparison (one whose line is None is left out)."""
    for cell, res in summary["cells"].items():
        for arm, a in res["arms"].items():
            print(f"{cell:{width}s} {arm_line(arm, a)}")
        for pair, metrics in res["paired"].items():
            line = pair_line(pair, metrics)
            if line is not None:
                print(f"{cell:{width}s} {line}")
