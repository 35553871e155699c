"""The README's table of studies: one row per training study, OTB's paired auc difference from TRL's default GRPO
(``advantage_estimator="grpo"``, ``scale_rewards="group"``, N=4) in each of its cells, counted by reading."""

from __future__ import annotations

from research.report.tables import Context, markdown_table

# (study folder, summary stem, the row's name, the OTB arm with its options, the paired key, cells or None for all)
STUDIES = [
    (
        "training_study1",
        "training_study",
        "toy, study 1",
        '`otb_tail="zero"`',
        "otb_N4-grpo_N4",
        None,
    ),
    (
        "training_study2",
        "training_study2",
        "toy, study 2",
        '`otb_tail="zero_advantage"`',
        "otb_zero_advantage-grpo_N4",
        ("long", "long_right", "short", "long_high_lr"),
    ),
    (
        "training_study3",
        "training_study3",
        "toy, study 3",
        '`otb_tail="zero_advantage"`',
        "otb_zero_advantage-grpo_N4",
        None,
    ),
    (
        "estimator_study",
        "training_study4",
        "toy, study 4",
        "`otb_leave_one_out=True`, ESS",
        "otb_loo_ess-grpo_N4",
        None,
    ),
    (
        "real_model",
        "real_model_study_reach",
        "SmolLM2-135M",
        '`otb_tail="zero_advantage"`, lr `1e-6`',
        "otb_default-grpo_N4",
        None,
    ),
    (
        "real_model",
        "real_model_study_reach_rate",
        "SmolLM2, follow-up",
        '`otb_tail="zero_advantage"`, lr `3e-6`',
        "otb_default_lr3e-06-grpo_N4",
        None,
    ),
]


def reading(auc: dict) -> str:
    """'lower', 'higher' or 'level': where the paired 95% interval of OTB minus GRPO lies."""
    lo, hi = auc["ci"]
    return "higher" if lo > 0 else "lower" if hi < 0 else "level"


def studies_table(ctx: Context) -> str:
    """Per study (named by its model, linked to its README): OTB's arm, seeds, the cells where OTB's auc was
    lower / level / higher than TRL's GRPO's (paired 95% interval), and the range of the mean differences."""
    header = ["study", "OTB arm", "seeds", "cells lower/level/higher", "auc minus GRPO's"]
    rows = []
    for folder, stem, name, arm, key, cells in STUDIES:
        data = ctx.load(stem)
        aucs = [res["paired"][key]["auc"] for cell, res in data["cells"].items() if cells is None or cell in cells]
        counts = [sum(reading(a) == r for a in aucs) for r in ("lower", "level", "higher")]
        means = [a["mean"] for a in aucs]
        spread = f"{min(means):+.3f}" if len(means) == 1 else f"{min(means):+.3f} to {max(means):+.3f}"
        seeds = "/".join(sorted({str(a["seeds"]) for a in aucs}))
        link = f"[{name}]({ctx.to_root}research/{folder}/README.md)"
        rows.append([link, arm, seeds, "/".join(map(str, counts)), spread])
    return "\n".join(markdown_table(header, ["---", "---", "---:", "---:", "---:"], rows))
