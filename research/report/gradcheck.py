"""The gradient check's blocks: the command's own output on the embedded model (``gradient-check-example``), and the
check on the variance study's math and count cells in each parameter space, beside the variance tool
(``gradient-check-tasks``)."""

from __future__ import annotations

from research.report.tables import Context, markdown_table
from trl_otb.gradcheck.cli import format_report

NAMES = {
    "grpo_std": "TRL's GRPO",
    "grpo": "unscaled GRPO",
    "rloo": "RLOO",
    "ogb": "OGB",
    "otb_default": "default OTB",
    "otb_self_inclusive": "OTB, self-inclusive (0.2.0 default)",
    "otb_others_mean_loo": "OTB, leave-one-out, others' mean",
    "otb_others_mean_loo_ess": "the same, ESS-shrunk",
}


def _names(rows: dict) -> dict:
    """The labels for a file's rows. A file without an ``otb_self_inclusive`` row was measured when the default OTB
    was the self-inclusive one (trl-otb 0.2.0), so its ``otb_default`` row is labelled as that."""
    if "otb_self_inclusive" in rows:
        return NAMES
    return {**NAMES, "otb_default": NAMES["otb_self_inclusive"]}


def gradient_check_example(ctx: Context, stem: str) -> str:
    """What ``trl-otb gradient-check`` printed (its table, calibration and reading), from its JSON."""
    report = ctx.load(stem)
    return f"```text\n$ {report['meta']['command']}\n{format_report(report)}\n```\n\n({ctx.link(stem)})"


def _ci(row: dict, key: str) -> str:
    lo, hi = row[f"{key}_ci"]
    return f"{row[key]:.3f} [{lo:.3f}, {hi:.3f}]"


def gradient_check_tasks(ctx: Context, stem: str) -> str:
    """Per cell, one row per estimator: eps_star and cos in each space measured, and the variance tool's."""
    data, lines = ctx.load(stem), []
    for cell, entry in data["cells"].items():
        spaces = list(entry["spaces"])
        header = ["estimator"] + [f"{s}: eps_star [95% CI]" for s in spaces] + [f"{s}: cos" for s in spaces]
        header += ["variance tool: eps_star", "variance tool: cos"]
        rows = []
        measured = entry["spaces"][spaces[0]]["rows"]
        for name, label in _names(measured).items():
            if name not in measured:
                continue
            tool = entry["variance_tool"]["rows"].get(name)
            rows.append(
                [label]
                + [_ci(entry["spaces"][s]["rows"][name], "eps_star") for s in spaces]
                + [f"{entry['spaces'][s]['rows'][name]['cos']:.3f}" for s in spaces]
                + ([f"{tool['eps_star']:.3f}", f"{tool['cos']:.3f}"] if tool else ["", ""])
            )
        agreement = ", ".join(f"{k} {v:+.2f}" for k, v in entry["rank_agreement"].items()) or "one space"
        prompts = entry["spaces"][spaces[0]]["meta"]
        lines += [f"**{cell}** ({prompts['informative_prompts']} of {prompts['prompts']} prompts with differing "
                  f"rewards, pools of {prompts['pool_size']}; Spearman of the eps_star ranking between spaces: "
                  f"{agreement})", ""]  # fmt: skip
        lines += markdown_table(header, ["---"] + ["---:"] * (len(header) - 1), rows) + [""]
    return "\n".join(lines) + f"\n({ctx.link(stem)})"
