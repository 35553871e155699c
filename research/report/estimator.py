"""The estimator study's pre-screen table (``prescreen-yardstick``): per cell and policy point, each arm's ``cos``
and ``eps_star`` at N = 4, B = 4, and ``eps_star`` minus unscaled GRPO's on the same resamples, from
research/estimator_study/prescreen/summary.json."""

from __future__ import annotations

import json

from research.report.tables import ROOT, Context, markdown_table

SUMMARY = "research/estimator_study/prescreen/summary.json"
ARMS = {
    "grpo_N4": "TRL's GRPO",
    "grpo_unscaled_N4": "unscaled GRPO",
    "otb_default": "OTB, self-inclusive (0.2.0 default)",
    "otb_loo_mean": "OTB, leave-one-out",
    "otb_loo_ess": "OTB, leave-one-out, ESS",
    "ogb_N4": "OGB",
}
CELLS = {"ramble": "toy ramble", "study-long_right": "toy long_right", "study-copy": "toy copy",
         "math64": "SmolLM2 math, 64 tokens", "math256": "SmolLM2 math, 256 tokens",
         "count_pool": "SmolLM2 count pool, 256 tokens"}  # fmt: skip


def _entry(row: dict) -> str:
    text = f"{row['cos']:.3f} · {row['eps_star']:.3f}"
    diff = row.get("eps_star_minus_unscaled_grpo")
    if diff:
        lo, hi = diff["diff_ci"]
        text += f" ({diff['diff']:+.3f} [{lo:+.3f}, {hi:+.3f}])"
    return text


def prescreen_yardstick(ctx: Context) -> str:
    data = json.loads((ROOT / SUMMARY).read_text())
    header = ["cell", "policy"] + list(ARMS.values())
    rows = [
        [CELLS.get(cell, cell), point] + [_entry(entry[point][arm]) for arm in ARMS]
        for cell, entry in data["cells"].items()
        for point in ("init", "trained")
        if point in entry
    ]
    link = f"[summary.json]({ctx.to_root}{SUMMARY})"
    return "\n".join(markdown_table(header, ["---", "---"] + ["---:"] * len(ARMS), rows)) + f"\n\n({link})"
