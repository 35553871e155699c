"""The training blocks: the earlier small run (``TRAINING``) and the pre-registered study (``STUDY``): its tables per
cell, its precondition, and the sentences of the docs' verdict and of the README."""

from __future__ import annotations

from research.report.tables import Context, markdown_table

# The earlier small training run (benchmarks/sample_efficiency.py --cpu-run), kept as a labelled footnote.
TRAINING = "sample_efficiency_embedded_math"
# The training result quoted by the verdict: the pre-registered study of research/harness/training_study/.
STUDY = "training_study"


def _reached(arm: dict) -> str:
    median = "" if arm["median_tokens"] is None else f" (median {arm['median_tokens']:.0f} tokens)"
    return f"{arm['reached']} seeds{median}"


def efficiency_table(data) -> str:
    target = data["meta"]["target"]
    seeds = sorted({r["seed"] for r in data["runs"]})
    header = [
        "arm",
        f"tokens to reach {target} per seed ({', '.join(map(str, seeds))})",
        "reached",
        "median tokens",
        "final score median (min-max)",
        "tokens used",
        "steps",
        "minutes per run",
    ]
    rows = []
    for arm, s in data["summary"].items():
        f = s["final_score"]
        rows.append(
            [
                arm,
                ", ".join("-" if t is None else f"{t:.0f}" for t in s["tokens_to_target"].values()),
                s["reached"],
                "not reached" if s["median_tokens"] is None else f"{s['median_tokens']:.0f}",
                f"{f['median']:.3f} ({f['min']:.3f}-{f['max']:.3f})",
                f"{s['tokens_consumed']:.0f}",
                f"{s['steps']:.0f}",
                f"{s['seconds'] / 60:.1f}",
            ]
        )
    align = ["---", "---", "---:", "---:", "---", "---:", "---:", "---:"]
    return "\n".join(markdown_table(header, align, rows))


ARM_LABELS = {
    "otb_N4": "OTB, N=4",
    "grpo_N4": "GRPO, N=4 (TRL's default, std-scaled)",
    "grpo_unscaled_N4": "GRPO, N=4, unscaled",
    "ogb_N4": "OGB, N=4",
    "grpo_N16": "GRPO, N=16 (std-scaled)",
}
METRIC_LABELS = {"tokens_to_target": "tokens to target", "auc": "mean score over the budget", "final": "final score"}
LOWER_IS_BETTER = {"tokens_to_target"}


def _better(metric: str, t: dict) -> str:
    """'better' / 'worse' for OTB when the paired interval excludes 0, else ''."""
    if not t["differ"]:
        return ""
    otb_lower = t["mean"] < 0
    return "better" if otb_lower == (metric in LOWER_IS_BETTER) else "worse"


def _diff(metric: str, t: dict) -> str:
    fmt = (lambda x: f"{x:+.0f}") if metric == "tokens_to_target" else (lambda x: f"{x:+.3f}")
    mark = _better(metric, t)
    return f"{fmt(t['mean'])} ({fmt(t['ci'][0])} to {fmt(t['ci'][1])}){f' **{mark}**' if mark else ''}"


def study_paired_table(data, cell: str) -> str:
    """OTB at N=4 minus each other arm, per metric: mean over seeds with the paired bootstrap 95% interval."""
    paired = data["cells"][cell]["paired"]
    header = ["OTB N=4 minus", "seeds", *METRIC_LABELS.values()]
    rows = [
        [
            ARM_LABELS[pair.split("-", 1)[1]],
            str(next(iter(m.values()))["seeds"]),
            *(_diff(k, m[k]) for k in METRIC_LABELS),
        ]
        for pair, m in paired.items()
    ]
    return "\n".join(markdown_table(header, ["---", "---:", "---:", "---:", "---:"], rows))


def study_arms_table(data, cell: str) -> str:
    """Per arm: what its seeds reached, its collapse rate, its gradient norms and its cost."""
    spec = data["preregistration"]["cells"][cell]
    header = [
        "arm",
        "runs",
        f"reached {spec['target']}",
        "tokens to target (median)",
        "mean score over the budget",
        "final score (mean)",
        "collapsed (95% interval)",
        "grad norm: median, CV",
        "CPU s per run",
    ]
    rows = []
    for arm, a in data["cells"][cell]["arms"].items():
        lo, hi = a["collapse_ci"]
        rows.append(
            [
                ARM_LABELS[arm],
                str(a["runs"]),
                str(a["reached"]),
                f"{a['tokens_to_target_median']:.0f}",
                f"{a['auc_mean']:.3f}",
                f"{a['final_mean']:.3f}",
                f"{round(a['collapse_rate'] * a['runs'])}/{a['runs']} ({lo:.2f}-{hi:.2f})",
                f"{a['grad_norm_median']:.3f}, {a['grad_norm_cv_median']:.2f}",
                f"{a['cpu_seconds_median']:.0f}",
            ]
        )
    return "\n".join(markdown_table(header, ["---", *["---:"] * (len(header) - 1)], rows))


def study_precondition_table(data) -> str:
    """The variance benchmark on each task at seed 0's warm-started policy, before training: OTB over GRPO and OGB at
    N=4."""
    header = ["task", "mean completion tokens", "OTB / GRPO (unscaled)", "OTB / OGB"]
    rows = []
    for task, v in data["variance_check"].items():
        cells = []
        for key in ("N=4/otb-grpo", "N=4/otb-ogb"):
            t = v[key]
            cells.append(f"{t['ratio']:.3f} ({t['ratio_ci'][0]:.3f}-{t['ratio_ci'][1]:.3f})")
        rows.append([task, f"{v['mean_completion_tokens']:.1f}", *cells])
    return "\n".join(markdown_table(header, ["---", "---:", "---:", "---:"], rows))


def real_model_steps(ctx: Context, stem: str) -> str:
    """The real-model study's measured step costs and the plan its pre-registration sized from them."""
    from research.harness.real_model_analysis import cost_plan, steps_table
    from research.harness.real_model_preregistration import DESIGNS, PREREGISTRATION

    data, reach = ctx.load(stem), DESIGNS["reach"]
    tokens = ctx.load("real_model_study_reach_variance")["results"]["lm_head"]["256"]["mean_completion_tokens"]
    plan = cost_plan(dict(data["costs"], completion_tokens_per_completion=tokens), reach)
    amended = (
        f" The reach design's plan, from the same costs at its {tokens:.1f} tokens per completion: "
        f"{plan['steps_per_run']} steps per run, {plan['pilot']['runs']} pilot and {plan['study']['runs']} study "
        f"runs, {plan['cpu_hours']:.2f} CPU hours, {plan['wall_hours_at_2_jobs']:.2f} hours of wall time at 2 jobs."
    )
    return steps_table(data, PREREGISTRATION) + amended + f"\n\n({ctx.link(stem)})"


def real_model_signal(ctx: Context, stem: str) -> str:
    """How often a group of 4 carries no signal in the real-model cell, by horizon (from the cached count pools)."""
    data = ctx.load(stem)
    header = ["completion tokens", "groups of 4 whose rewards tie", "mean within-group reward std", "mean length"]
    rows = [
        [h, f"{v['tied_share']:.2f}", f"{v['reward_std_mean']:.3f}", f"{v['mean_length']:.0f}"]
        for h, v in data["horizons"].items()
    ]
    return "\n".join(markdown_table(header, ["---:"] * 4, rows)) + f"\n\n({ctx.link(stem)})"


def real_model_far_pilot(ctx: Context, stem: str) -> str:
    """The first real-model design's pilot record: each finished run's held-out score, tied groups and gradient norm."""
    data = ctx.load(stem)
    header = ["learning rate", "arm", "held-out score: start", "final (SE)", "tied groups (mean over steps)"]
    header.append("median grad norm")
    rows = [
        [
            f"{a['learning_rate']:g}",
            arm,
            f"{a['initial_mean']:.3f}",
            f"{a['final_mean']:.3f} ({a['final_se_median']:.3f})",
        ]
        + [f"{a['tied_groups_mean']:.2f}", f"{a['grad_norm_median']:.1e}"]
        for cell in data["cells"].values()
        for arm, a in cell["arms"].items()
    ]
    return "\n".join(markdown_table(header, ["---:", "---", "---:", "---:", "---:", "---:"], rows)) + (
        f"\n\n({ctx.link(stem)})"
    )


def real_model_reach(ctx: Context, stem: str) -> str:
    """The reach design's checks on the pretrained policy, before any run: the variance ratio of both OTB arms, the
    completions' length, and the group signal (``stem`` is the design's file stem)."""
    ref = ctx.load(f"{stem}_variance")["results"]["lm_head"]["256"]
    tails = ctx.load(f"{stem}_variance_fallbacks")["results"]["lm_head"]["256"]["paired"]
    signal = ctx.load(f"{stem}_group_signal")["horizons"]["256"]

    def ratio(found):
        return f"{found['ratio']:.2f} [{found['ratio_ci'][0]:.2f}, {found['ratio_ci'][1]:.2f}]"

    rows = [
        ["OTB/GRPO gradient variance at N=4, reference OTB", ratio(ref["paired"]["N=4/otb-grpo"])],
        ["the same, the default's tail (zero_advantage)", ratio(tails["N=4/otb_zero_advantage-grpo"])],
        ["mean completion tokens", f"{ref['mean_completion_tokens']:.1f}"],
        ["groups of 4 whose rewards tie", f"{signal['tied_share']:.2f}"],
        ["completions that stop at n (reward 1)", f"{signal['complete_share']:.2f}"],
        ["mean reward", f"{signal['reward_mean']:.2f}"],
        ["mean within-prompt reward std", f"{signal['reward_std_within_prompt']:.2f}"],
    ]
    links = ", ".join(ctx.link(f"{stem}{s}") for s in ("_variance", "_variance_fallbacks", "_group_signal"))
    return "\n".join(markdown_table(["on the pretrained policy", "value"], ["---", "---:"], rows)) + f"\n\n({links})"


def _paired_cell(value: dict, digits: int) -> str:
    mean = f"{value['mean']:+.{digits}f}"
    if "ci" not in value:
        return f"{mean} (mean of {value['seeds']} seeds, no interval)"
    lo, hi = value["ci"]
    mark = " **differ**" if value["differ"] else ""
    return f"{mean} [{lo:+.{digits}f}, {hi:+.{digits}f}]{mark}"


def real_model_cells(ctx: Context, stem: str) -> str:
    """A real-model summary (a pilot's or the study's): per cell and arm, the rate, runs, held-out scores, target,
    collapses, tied groups, length and gradient norm; then, for the study (a pilot's single runs choose rates and
    are not compared), each pair's difference in auc, final score and tokens to target (95% bootstrap interval from
    6 paired seeds; **differ**: it excludes 0) and each seed's auc and final score per arm; a follow-up's verdict."""
    data = ctx.load(stem)
    header = ["cell", "arm", "rate", "runs", "held-out: start", "auc", "final (SE)", "reached target"]
    header += ["collapsed (95% interval)", "tied groups", "median length", "median grad norm"]
    pilot = bool(data.get("chosen") is not None or data.get("meta", {}).get("pilot"))

    def reached(a: dict) -> str:  # a pilot's target comes from its own runs, after them
        return "-" if pilot else f"{a['reached']}/{a['runs']}"

    rows, pairs = [], []
    for cell, found in data["cells"].items():
        for arm, a in found["arms"].items():
            lo, hi = a["collapse_ci"]
            rows.append(
                [
                    cell,
                    arm,
                    f"{a['learning_rate']:g}",
                    str(a["runs"]),
                    f"{a['initial_mean']:.3f}",
                    f"{a['auc_mean']:.3f}",
                ]
                + [f"{a['final_mean']:.3f} ({a['final_se_median']:.3f})", reached(a)]
                + [f"{a['collapsed']}/{a['runs']} ({lo:.2f}-{hi:.2f})", f"{a['tied_groups_mean']:.2f}"]
                + [f"{a['mean_length_median']:.0f}", f"{a['grad_norm_median']:.3f}"]
            )
        for pair, m in [] if pilot else found["paired"].items():  # a pilot's arms run at several rates, once
            pairs.append([cell, pair, _paired_cell(m["auc"], 3), _paired_cell(m["final"], 3)])
            pairs[-1].append(_paired_cell(m["tokens_to_target"], 0))
    lines = markdown_table(header, ["---", "---", "---:", "---:", *["---:"] * 8], rows)
    target = data.get("target")
    lines += ["", f"Target: {'none (a pilot)' if target is None else f'{target:.3f}'}."]
    if data.get("chosen"):
        chosen = ", ".join(f"{arm} {lr:g}" for arm, lr in data["chosen"].items())
        lines[-1] += f" Chosen rates (the highest auc per arm): {chosen}."
    if pairs:
        pair_header = ["cell", "arm minus reference", "auc", "final", "tokens to target"]
        lines += ["", *markdown_table(pair_header, ["---", "---", "---:", "---:", "---:"], pairs)]
    if data.get("verdict"):  # a follow-up's pre-registered decision
        lines += ["", f"Pre-registered verdict: {data['verdict']}."]
    seeds = {} if pilot else next(iter(data["cells"].values())).get("seeds", {})
    if seeds:  # each seed's own runs: a mean hides an arm whose seeds split
        arms = list(next(iter(data["cells"].values()))["arms"])

        def run(m: dict | None) -> str:
            if m is None:
                return "-"
            mark = f", target at {m['tokens_to_target']:.0f}" if m["reached"] else ""
            return f"{m['auc']:.3f} / {m['final']:.3f}{mark}" + (" collapsed" if m["collapsed"] else "")

        s_rows = [[seed] + [run(found.get(arm)) for arm in arms] for seed, found in seeds.items()]
        s_header = ["seed", *[f"{arm}: auc / final" for arm in arms]]
        lines += ["", *markdown_table(s_header, ["---:", *["---:"] * len(arms)], s_rows)]
    if data.get("fidelity"):  # OTBConfig's in-training check, on the one run the pre-registration names
        f_header = ["proxy fidelity: arm, seed, step", "token Spearman", "token Pearson", "energy Spearman"]
        f_rows = [
            [f"{f['arm']}, seed {f['seed']}, step {f['step']}"]
            + [f"{f[k]:.3f}" for k in ("token_spearman", "token_pearson", "energy_spearman")]
            for f in data["fidelity"]
        ]
        lines += ["", *markdown_table(f_header, ["---", "---:", "---:", "---:"], f_rows)]
    return "\n".join(lines) + f"\n\n({ctx.link(stem)})"


REAL_MODEL = "real_model_study_reach"


REAL_MODEL_RATE = f"{REAL_MODEL}_rate"  # the rate follow-up's summary (real_model_study --rate-follow-up)
RATE_VERDICTS = {
    "the rate": "its learning rate, not its tail rule",
    "the tail": "its tail rule, not its learning rate",
    "undecided": "undecided",
}


def _follow_up_table(title: str, found: dict, arms, predictions) -> list[str]:
    """A follow-up's table (per arm, the change in stop log-odds at n and the L1 movement on each of its seeds) and
    whether each of its predictions held."""
    seeds = found["seeds"]
    header = [title, *(f"change at n, seed {s}" for s in seeds), *(f"L1 movement, seed {s}" for s in seeds)]
    rows = [
        [arm, *(f"{x:+.2f}" for x in found["change_at_n"][arm]), *(f"{x:.0f}" for x in found["weights_moved"][arm])]
        for arm in arms
    ]
    held = " ".join(f"{k}: {'held' if found[k] else 'failed'}." for k in predictions)
    return [*markdown_table(header, ["---", *["---:"] * (2 * len(seeds))], rows), "", held]


def real_model_mechanism(ctx: Context, stem: str) -> str:
    """The first-step mechanism study: per arm, the change one step made to the stop log-odds (teacher-forced on the
    held-out targets) before n, at n and past n, how many seeds raised it at n, where the batch's advantages lie,
    the gradient norm and how far the weights moved; then the pretrained log-odds and the pre-registered
    predictions."""
    data = ctx.load(stem)
    header = ["arm", "seeds", "change before n", "change at n", "change past n", "seeds raising it at n"]
    header += ["share of sum abs(A) past n", "on stop tokens", "median grad norm", "median L1 movement"]
    rows = []
    for arm, a in data["arms"].items():
        at = a["change_per_seed"]["at"]
        rows.append(
            [arm, str(len(at))]
            + [f"{a['change'][k]:+.2f}" for k in ("early", "at", "past")]
            + [f"{sum(x > 0 for x in at)}/{len(at)}", f"{a['share_past']:.3f}", f"{a['share_stop']:.3f}"]
            + [f"{a['grad_norm_median']:.3f}", f"{a['weights_moved_median']:.0f}"]
        )
    lines = markdown_table(header, ["---", *["---:"] * 9], rows)
    b, p = data["before"], data["predictions"]
    lines += [
        "",
        f"Pretrained stop log-odds: before n {b['early']:.2f}, at n {b['at']:.2f}, past n {b['past']:.2f}. "
        + " ".join(f"{k}: {'held' if p[k] else 'failed'}." for k in ("P1", "P2", "P3"))
        + f" Reading: {p['reading']}.",
    ]
    batch = data.get("pilot_batch")
    if batch:  # the amendment: the pilot's own first batch (seed 100)
        header = ["arm (seed 100)", "change before n", "change at n", "change past n", "share past n"]
        header += ["on stop tokens", "grad norm (pilot's)", "mean reward (pilot's)"]
        rows = []
        for arm, a in batch["arms"].items():
            pilot_norm = "-" if a["pilot_grad_norm"] is None else f"{a['pilot_grad_norm']:.3f}"
            pilot_reward = "-" if a["pilot_reward_mean"] is None else f"{a['pilot_reward_mean']:.3f}"
            rows.append(
                [arm, *(f"{a['change'][k]:+.2f}" for k in ("early", "at", "past"))]
                + [f"{a['share_past']:.3f}", f"{a['share_stop']:.3f}"]
                + [f"{a['grad_norm']:.3f} ({pilot_norm})", f"{a['reward_mean']:.3f} ({pilot_reward})"]
            )
        q = batch["predictions"]
        lines += ["", *markdown_table(header, ["---", *["---:"] * 7], rows), ""]
        lines.append(
            " ".join(f"{k}: {'held' if q[k] else 'failed'}." for k in ("P4", "P5")) + f" Reading: {q['reading']}."
        )
    follow = data.get("follow_up")
    if follow:  # the follow-up on the batches where no completion stopped at n
        arms = ("otb_default", "otb_uniform", "otb_sgd", "grpo_N4", "grpo_sgd")
        lines += ["", *_follow_up_table("arm (follow-up)", follow, arms, ("F1", "F2"))]
    second = data.get("second_follow_up")
    if second:  # which OTB options keep the effect, on the same batches
        arms = ("otb_default", "otb_loo", "ogb", "grpo_N4")
        lines += ["", *_follow_up_table("arm (second follow-up)", second, arms, ("G1", "G2"))]
    return "\n".join(lines) + f"\n\n({ctx.link(stem)})"
