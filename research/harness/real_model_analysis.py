"""The real-model study's analysis (research/harness/real_model_study.py): pure functions of its run records, its plot,
and its cost arithmetic. Each takes what it needs from the pre-registration as arguments, so that the tests can
feed it synthetic runs."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

from benchmarks.common import pyplot, save_figure, tokens_to_target
from research.harness.training_study import auc, collapsed, paired_bootstrap, score_at, wilson
from research.harness.training_study.analysis import by_arm, paired_seeds


def length_collapsed(run: dict, min_last_length: float | None = None) -> bool:
    """The collapse rule's length part: the last step's mean completion length below half the first step's, or,
    where a design fixes ``min_last_length`` (the reach design, whose right answers are shorter than its first
    steps' overlong ones), below that many tokens."""
    lengths = [s.get("completions/mean_length") for s in run["steps"]]
    lengths = [x for x in lengths if x is not None]
    if min_last_length is not None:
        return bool(lengths) and lengths[-1] < min_last_length
    return len(lengths) > 1 and lengths[-1] < 0.5 * lengths[0]


def run_metrics(run: dict, budget: float, target: float | None, min_last_length: float | None = None) -> dict:
    reached = tokens_to_target(run["curve"], math.inf if target is None else target)
    budget = budget or run["tokens"]

    def per_step(key):
        values = [s[key] for s in run["steps"] if s.get(key) is not None and math.isfinite(s[key])]
        return statistics.median(values) if values else float("nan")

    return {
        "auc": auc(run["curve"], budget),
        "final": run["curve"][-1]["score"],
        "initial": run["curve"][0]["score"],
        "final_se": run["curve"][-1].get("se", float("nan")),
        "tokens_to_target": budget if reached is None else min(reached, budget),
        "reached": reached is not None and reached <= budget,
        "collapsed": collapsed(run) or length_collapsed(run, min_last_length),
        "grad_norm_median": per_step("grad_norm"),
        "mean_length_median": per_step("completions/mean_length"),
        "step_cpu_median": per_step("cpu_seconds"),
        # the share of groups whose rewards tie (TRL's frac_reward_zero_std), over the run's steps: they give no arm
        # a gradient, so a cell where most groups tie cannot tell the arms apart
        "tied_groups_mean": _mean(s["frac_reward_zero_std"] for s in run["steps"] if "frac_reward_zero_std" in s),
        "steps": len(run["steps"]),
        "cpu_seconds": run["cpu_seconds"],
    }


def _mean(values) -> float:
    values = [v for v in values if not math.isnan(v)]
    return statistics.fmean(values) if values else float("nan")


def _median(values) -> float:
    values = [v for v in values if not math.isnan(v)]
    return statistics.median(values) if values else float("nan")


PAIRS = (("otb_default", "grpo_N4"), ("otb_ref", "grpo_N4"), ("otb_default", "otb_ref"))
"""(arm, reference) pairs of the analysis: arm minus reference, per seed."""
MIN_SEEDS_FOR_INTERVAL = 6
"""Paired seeds below which only the mean difference is given (no bootstrap interval)."""


def summarise_cell(
    runs: list[dict],
    arms: list[str],
    budget: float,
    target: float | None,
    min_last_length: float | None = None,
    pairs=PAIRS,
) -> dict:
    """Per arm: means, medians and collapse rate over seeds; per pair: the paired differences (module doc); per
    seed: each arm's auc, final score, tokens to target, whether it reached the target and whether it collapsed."""
    metrics = {(r["arm"], r["seed"]): run_metrics(r, budget, target, min_last_length) for r in runs}
    out = {"arms": {}, "paired": {}}
    for arm, mine in by_arm(metrics, arms).items():
        k = sum(m["collapsed"] for m in mine)
        out["arms"][arm] = {
            "runs": len(mine),
            "learning_rate": next(r["learning_rate"] for r in runs if r["arm"] == arm),
            "auc_mean": _mean(m["auc"] for m in mine),
            "final_mean": _mean(m["final"] for m in mine),
            "initial_mean": _mean(m["initial"] for m in mine),
            "final_se_median": _median(m["final_se"] for m in mine),
            "reached": sum(m["reached"] for m in mine),
            "tokens_to_target_median": _median(m["tokens_to_target"] for m in mine),
            "collapsed": k,
            "collapse_ci": wilson(k, len(mine)),
            "grad_norm_median": _median(m["grad_norm_median"] for m in mine),
            "mean_length_median": _median(m["mean_length_median"] for m in mine),
            "step_cpu_median": _median(m["step_cpu_median"] for m in mine),
            "tied_groups_mean": _mean(m["tied_groups_mean"] for m in mine),
            "cpu_seconds_total": sum(m["cpu_seconds"] for m in mine),
        }
    # each seed's own numbers beside the means: a mean over few seeds hides a bimodal arm (half its seeds solve the
    # task, half settle), and the paired intervals are read against them
    out["seeds"] = {
        str(seed): {
            arm: {k: metrics[(arm, seed)][k] for k in ("auc", "final", "tokens_to_target", "reached", "collapsed")}
            for arm in arms
            if (arm, seed) in metrics
        }
        for seed in sorted({s for _, s in metrics})
    }
    for arm, ref in pairs:
        seeds = paired_seeds(metrics, arm, ref)
        if not seeds:
            continue
        out["paired"][f"{arm}-{ref}"] = {}
        for name in ("auc", "final", "tokens_to_target"):
            diffs = [metrics[(arm, s)][name] - metrics[(ref, s)][name] for s in seeds]
            enough = len(seeds) >= MIN_SEEDS_FOR_INTERVAL
            value = paired_bootstrap(diffs) if enough else {"mean": statistics.fmean(diffs), "seeds": len(seeds)}
            out["paired"][f"{arm}-{ref}"][name] = value
    return out


def rate_verdict(paired: dict, comparisons: dict) -> str:
    """The rate follow-up's pre-registered decision on auc (RATE_FOLLOW_UP["decision"]): 'the rate' when the primary
    difference (the default at the reference's rate minus the reference) has an interval containing 0 and the
    secondary (the same minus the default at its own rate) one above 0; 'the tail' when the primary's lies below 0;
    else 'undecided'; no verdict before both have an interval (6 paired seeds)."""
    primary, secondary = (paired.get("-".join(comparisons[k]), {}).get("auc", {}) for k in ("primary", "secondary"))
    if "ci" not in primary or "ci" not in secondary:
        return "none (fewer than 6 paired seeds)"
    (p_lo, p_hi), (s_lo, _) = primary["ci"], secondary["ci"]
    if p_lo <= 0 <= p_hi and s_lo > 0:
        return "the rate"
    return "the tail" if p_hi < 0 else "undecided"


def checks(runs: list[dict], reference: dict) -> dict:
    """The preconditions the conclusions rest on: every run trained, the default arm is one configuration (its
    learning rate aside: a pilot runs several) and not the reference, and the completions are long."""
    defaults = {
        json.dumps({k: v for k, v in r["config"].items() if k != "learning_rate"}, sort_keys=True)
        for r in runs
        if r["arm"] == "otb_default"
    }
    ref = {k: r["config"][k] for r in runs if r["arm"] == "otb_default" for k in reference}
    first_lengths = [r["steps"][0].get("completions/mean_length") for r in runs if r["steps"]]
    first_lengths = [x for x in first_lengths if x is not None]
    return {
        "runs_that_moved_no_weight": [f"{r['arm']}-s{r['seed']}" for r in runs if not r["weights_moved"] > 0],
        "default_configurations": len(defaults),
        "default_is_reference": bool(ref) and ref == reference,
        "first_step_mean_length": _mean(first_lengths),
    }


def failed_checks(found: dict, min_length: float = 128) -> list[str]:
    """What in ``checks``' result forbids a conclusion (empty: nothing)."""
    problems = [f"{name}: no parameter moved" for name in found["runs_that_moved_no_weight"]]
    if found["default_is_reference"] or found["default_configurations"] > 1:
        problems.append("otb_default ran the reference's settings, or more than one configuration")
    if found["first_step_mean_length"] < min_length:
        problems.append(f"completions averaged {found['first_step_mean_length']:.1f} tokens at the first step")
    return problems


def fidelity_of(runs: list[dict]) -> list[dict]:
    """The in-training fidelity checks (the steps that logged otb/fidelity/*), of every run that has them."""
    found = []
    for r in runs:
        for s in r["steps"]:
            values = {k.split("/")[-1]: v for k, v in s.items() if k.startswith("otb/fidelity/")}
            if values:
                found.append({"arm": r["arm"], "seed": r["seed"], "step": s.get("step"), **values})
    return found


def choose_rates(cells: dict, arms: list[str], cell_of_rate: dict[float, str]) -> dict:
    """Per arm, the rate whose pilot cell (``cell_of_rate``) has the highest auc in the summary ``cells``; a tie goes
    to the lower rate."""
    chosen = {}
    for arm in arms:
        aucs = [(cells[c]["arms"][arm]["auc_mean"], -lr) for lr, c in cell_of_rate.items() if arm in cells[c]["arms"]]
        if aucs:
            chosen[arm] = -max(aucs)[1]
    return chosen


def plot(runs: dict, cells: dict, arms: list[str], path: Path) -> None:
    """Per cell: held-out score against tokens (median over seeds, band: range); per step the mean length, the grad
    norm and the share of groups whose rewards tie (no signal: a run whose every group ties has stopped learning)."""
    shown = [c for c in cells if runs.get(c)]
    if not shown:
        return
    fig, axes = pyplot().subplots(len(shown), 4, figsize=(18, 3.6 * len(shown)), squeeze=False)
    for row, cell in zip(axes, shown):
        budget = cells[cell] or max(r["tokens"] for r in runs[cell])
        grid = [budget * i / 40 for i in range(41)]
        for i, arm in enumerate(arms):
            mine = [r for r in runs[cell] if r["arm"] == arm]
            if not mine:
                continue
            color = f"C{i}"
            values = [[score_at(r["curve"], t) for r in mine] for t in grid]
            row[0].plot(grid, [statistics.median(v) for v in values], color=color, lw=2, label=f"{arm} ({len(mine)})")
            row[0].fill_between(grid, [min(v) for v in values], [max(v) for v in values], color=color, alpha=0.12)
            for ax, key in (
                (row[1], "completions/mean_length"),
                (row[2], "grad_norm"),
                (row[3], "frac_reward_zero_std"),
            ):
                for r in mine:
                    xs = [s["step"] for s in r["steps"] if s.get(key) is not None]
                    ax.plot(xs, [s[key] for s in r["steps"] if s.get(key) is not None], color=color, alpha=0.5)
        row[0].set(title=cell, xlabel="completion tokens", ylabel="held-out score (median, band: seeds)")
        row[1].set(title="mean completion length", xlabel="step")
        row[2].set(title="gradient norm before clipping", xlabel="step", yscale="log")
        row[3].set(title="groups whose rewards tie", xlabel="step", ylim=(-0.05, 1.05))
        row[0].legend(fontsize=7)
    save_figure(fig, path)


# ----------------------------------------------------------------------------------------------------------------
# Cost: the measured steps, and the plan sized from them
# ----------------------------------------------------------------------------------------------------------------


def measured_costs(data: dict, fidelity_rows: int = 1) -> dict:
    """From --measure-steps' JSON: per arm the median CPU s of a step after the first (the first holds the warm-up,
    and on otb_default the fidelity check), the median CPU s of an evaluation (start and end of every arm), the mean
    completion length, and the fidelity check's CPU s per checked token: its step's CPU s less the arm's median
    step, over ``fidelity_rows`` x that step's mean completion length (the check's own logged seconds per token are
    wall seconds, beside it)."""
    runs = data["runs"]
    steps = {r["arm"]: _median(s["cpu_seconds"] for s in r["steps"][1:]) for r in runs}
    checked = [(r["arm"], s) for r in runs for s in r["steps"] if "otb/fidelity/seconds_per_token" in s]
    return {
        "step_cpu_seconds": steps,
        "eval_cpu_seconds": _median(p["eval_cpu_seconds"] for r in runs for p in r["curve"]),
        "completion_tokens_per_completion": _mean(s["completions/mean_length"] for r in runs for s in r["steps"]),
        "fidelity_cpu_seconds_per_token": _median(
            (s["cpu_seconds"] - steps[arm]) / (fidelity_rows * s["completions/mean_length"]) for arm, s in checked
        ),
        "fidelity_wall_seconds_per_token": _median(s["otb/fidelity/seconds_per_token"] for _, s in checked),
    }


def cost_plan(measured: dict, prereg: dict, jobs: int = 2) -> dict:
    """Runs and CPU seconds of the pilot and the study from the measured costs (the arithmetic of the cost entry)."""
    task, arms = prereg["task"], list(prereg["arms"])
    per_step = prereg["num_generations"] * prereg["prompts_per_step"] * measured["completion_tokens_per_completion"]
    steps = math.ceil(prereg["token_budget"] / per_step)
    evals = math.ceil(prereg["token_budget"] / prereg["eval_every_tokens"])  # after the start (cached per seed)
    run = {a: steps * measured["step_cpu_seconds"][a] + evals * measured["eval_cpu_seconds"] for a in arms}
    grid, seeds = prereg["learning_rates"]["grid"], prereg["seeds"]
    fid = prereg["fidelity"]
    checks_ = len(range(0, steps, fid["otb_fidelity_check_steps"]))
    fidelity = (
        checks_ * fid["otb_fidelity_rows"] * task["max_completion_length"] * measured["fidelity_cpu_seconds_per_token"]
    )
    initial = (len(seeds) + 1) * measured["eval_cpu_seconds"]
    pilot = len(grid) * sum(run.values())
    study = len(seeds) * sum(run.values())
    total = pilot + study + fidelity + initial
    return {
        "steps_per_run": steps,
        "evaluations_per_run": evals + 1,
        "cpu_seconds_per_run": {a: round(v) for a, v in run.items()},
        "pilot": {"runs": len(grid) * len(arms), "cpu_seconds": round(pilot)},
        "study": {"runs": len(seeds) * len(arms), "cpu_seconds": round(study)},
        "fidelity_cpu_seconds": round(fidelity),
        "initial_evaluations_cpu_seconds": round(initial),
        "cpu_hours": round(total / 3600, 2),
        "wall_hours_at_2_jobs": round(total / 3600 / jobs, 2),
        "seconds_per_seed": round(sum(run.values())),
    }


def steps_table(data: dict, prereg: dict) -> str:
    """docs/benchmarks.md's block: the measured cost per arm (--measure-steps' JSON) and the plan sized from it."""
    costs, plan = data["costs"], cost_plan(data["costs"], prereg)
    rows = [
        f"| {r['arm']} | {len(r['steps'])} | {costs['step_cpu_seconds'][r['arm']]:.1f} | "
        f"{_median(s['wall_seconds'] for s in r['steps'][1:]):.1f} | "
        f"{_mean(s['completions/mean_length'] for s in r['steps']):.1f} |"
        for r in data["runs"]
    ]
    return "\n".join(
        [
            "| arm | steps timed | CPU s per step (median after the first) | wall s per step | mean completion tokens |",
            "|---|---:|---:|---:|---:|",
            *rows,
            "",
            f"One held-out evaluation ({len(prereg['task']['held_out_targets']) * prereg['eval_samples']} "
            f"completions): {costs['eval_cpu_seconds']:.1f} CPU s (median of "
            f"{sum(len(r['curve']) for r in data['runs'])}). The fidelity check: "
            f"{costs['fidelity_cpu_seconds_per_token']:.2f} CPU s per checked token. The plan from these: "
            f"{plan['steps_per_run']} steps and {plan['evaluations_per_run']} evaluations per run, "
            f"{plan['pilot']['runs']} pilot and {plan['study']['runs']} study runs, {plan['cpu_hours']:.2f} CPU hours, "
            f"{plan['wall_hours_at_2_jobs']:.2f} hours of wall time at 2 jobs on two free cores.",
        ]
    )
