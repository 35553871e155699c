"""The second training study's blocks (``STUDY2``: research/harness/training_study/, ``--study 2``): the README's short
table, each cell's table of arms with their paired comparisons, and the decision rule's outcome."""

from __future__ import annotations

from research.report.tables import Context, auc_difference, markdown_table

STUDY2 = "training_study2"
ARM_LABELS2 = {
    "otb_ref": "OTB, reference tail (`zero`)",
    "otb_zero_advantage": "OTB, `zero_advantage`",
    "otb_sequence_baseline": "OTB, `sequence_baseline`",
    "otb_zero_advantage_scaled": "OTB, `zero_advantage`, std-scaled",
    "grpo_N4": "GRPO (TRL's default, std-scaled)",
    "grpo_unscaled_N4": "GRPO, unscaled",
    "ogb_N4": "OGB",
    "rloo_N4": "RLOO",
    "grpo_N16": "GRPO, N=16 (std-scaled)",
}
REFERENCES = {"grpo_N4": "TRL's GRPO", "grpo_unscaled_N4": "unscaled GRPO", "otb_ref": "reference OTB"}


def _collapses(a: dict) -> str:
    return f"{round(a['collapse_rate'] * a['runs'])}/{a['runs']}"


def study2_cell_table(data, cell: str) -> str:
    """Per arm of a cell: its learning rate, seeds, mean auc and final score, collapses (Wilson 95% interval), the
    final score's sampling SE (the collapse rule's noise floor), per-step medians, and its paired auc difference
    against each reference."""
    res = data["cells"][cell]
    header = [
        "arm",
        "lr",
        "runs",
        "mean score over the budget",
        "final (SE)",
        "collapsed (95% interval)",
        "lone-token share",
        "mean length",
        *(f"auc minus {label}" for label in REFERENCES.values()),
    ]
    rows = []
    for arm, a in res["arms"].items():
        lo, hi = a["collapse_ci"]
        paired = [auc_difference(res["paired"].get(f"{arm}-{ref}", {}).get("auc")) for ref in REFERENCES]
        rows.append(
            [
                ARM_LABELS2[arm],
                f"{a['learning_rate']:.2g}" if a.get("learning_rate") else "-",
                str(a["runs"]),
                f"{a['auc_mean']:.3f}",
                f"{a['final_mean']:.3f} ({a['final_se_median']:.3f})",
                f"{_collapses(a)} ({lo:.2f}-{hi:.2f})",
                f"{a['lone_token_frac_median']:.3f}",
                f"{a['mean_length_median']:.0f}",
                *paired,
            ]
        )
    return "\n".join(markdown_table(header, ["---", *["---:"] * (len(header) - 1)], rows))


def study2_readme_table(ctx: Context) -> str:
    """The README's summary of the second study: per cell, the chosen default OTB's mean-score (auc) difference
    from TRL's default GRPO with its paired interval, and the collapses of the default, TRL's GRPO and the
    reference OTB."""
    data = ctx.load(STUDY2)
    decision = data.get("decision")
    if not decision:
        return f"The second training study has not finished. ({ctx.link(STUDY2)})"
    chosen = decision["arm"]
    header = ["cell", "seeds", f"{ARM_LABELS2[chosen]}: auc minus TRL's GRPO", "collapses: default / GRPO / ref. OTB"]
    rows = []
    for cell in data["preregistration"]["decision_cells"]:
        res = data["cells"][cell]
        auc = res["paired"].get(f"{chosen}-grpo_N4", {}).get("auc")
        arms = res["arms"]
        collapses = " / ".join(_collapses(arms[a]) if a in arms else "-" for a in (chosen, "grpo_N4", "otb_ref"))
        rows.append([cell, str(auc["seeds"]) if auc else "0", auc_difference(auc), collapses])
    return "\n".join(markdown_table(header, ["---", "---:", "---:", "---:"], rows)) + f"\n\n({ctx.link(STUDY2)})"


def study2_offset(ctx: Context) -> str:
    """The law checked end to end in training: per arm, its long_offset runs (every training reward minus 0.5) that
    equal its long runs bit for bit (held-out curve, tokens, every logged step value but the reward, parameter
    movement), out of those run."""
    data = ctx.load(STUDY2)
    per_arm: dict[str, list[dict]] = {}
    for key, check in data["offset_check"].items():
        per_arm.setdefault(key.rsplit("-s", 1)[0], []).append(check)
    header = ["arm", "offset-invariant by design", "long_offset runs equal to their long run"]
    rows = [
        [
            ARM_LABELS2[arm],
            "yes" if checks[0]["invariant"] else "no",
            f"{sum(c['equal'] for c in checks)}/{len(checks)}",
        ]
        for arm, checks in sorted(per_arm.items(), key=lambda kv: list(ARM_LABELS2).index(kv[0]))
    ]
    return "\n".join(markdown_table(header, ["---", "---", "---:"], rows)) + f"\n\n({ctx.link(STUDY2)})"


STUDY3 = "training_study3"


def study3_table(ctx: Context) -> str:
    """The third study (why the candidates lost in long): per arm, its mean auc at each tuning rate (mean over the
    tuning seeds), the rate study 2's one-seed pilot chose and the re-tuned one, then on study 2's seeds at the
    re-tuned rate: mean auc, collapses, the paired auc difference against TRL's GRPO and against its own study-2
    run (where the rate changed; where it did not, how many runs repeated their study-2 curve exactly)."""
    if not ctx.has(STUDY3):
        return "The third study has no finished run yet."
    data = ctx.load(STUDY3)
    tuning = sorted(data["tuning"].values(), key=lambda c: c["learning_rate"])
    res = data["cells"].get("long", {"arms": {}, "paired": {}})
    header = ["arm", *(f"tuning auc at {c['learning_rate']:.2g}" for c in tuning), "study 2's rate", "re-tuned rate"]
    header += ["auc", "collapsed", "auc minus TRL's GRPO", "auc minus its study-2 run"]
    rows = []
    for arm in data["preregistration"]["arms"]:
        tuned = [
            f"{c['arms'][arm]['auc_mean']:.3f} ({c['arms'][arm]['runs']})" if arm in c["arms"] else "-" for c in tuning
        ]
        against = data["against_study2"].get(arm, {})
        a = res["arms"].get(arm)
        if "auc" in against:
            own = auc_difference(against["auc"])
        elif "same_curves" in against:
            own = f"same rate: {against['same_curves']}/{against['seeds']} curves identical"
        else:
            own = "-"
        rows.append(
            [
                ARM_LABELS2[arm],
                *tuned,
                f"{against['study2_rate']:.2g}" if against.get("study2_rate") else "-",
                f"{data['rates'][arm]:.2g}" if arm in data["rates"] else "-",
                f"{a['auc_mean']:.3f} ({a['runs']})" if a else "-",
                _collapses(a) if a else "-",
                auc_difference(res["paired"].get(f"{arm}-grpo_N4", {}).get("auc")),
                own,
            ]
        )
    align = ["---", *["---:"] * (len(header) - 1)]
    return "\n".join(markdown_table(header, align, rows)) + f"\n\n({ctx.link(STUDY3)})"
