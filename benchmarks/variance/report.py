"""What a run shows: the figure (each space's rescaled variance against N at every horizon, and at N=4 against the
horizon) and the summary printed as each horizon finishes."""

from __future__ import annotations

import math

from benchmarks.common import pyplot, save_figure
from benchmarks.variance.estimators import VARIANCE_ESTIMATORS

SPACE_LABELS = {"lm_head": "LM head", "lora": "LoRA adapter"}
PLOTTED = (*VARIANCE_ESTIMATORS, "otb_group_mean", "otb_sequence_baseline", "otb_last_baseline", "otb_zero_advantage")
"""The estimators the figure draws, where a run measured them."""


def plot(results, Ns, horizons, path):
    """One row per parameter space: rescaled variance against N at each horizon, and at N=4 against horizon."""
    import matplotlib.ticker

    spaces = list(results)
    cols = len(horizons) + 1
    fig, grid = pyplot().subplots(len(spaces), cols, figsize=(4.2 * cols, 3.8 * len(spaces)), squeeze=False)
    for axes, space in zip(grid, spaces):
        label = f"rescaled variance ({SPACE_LABELS.get(space, space)})"
        for ax, h in zip(axes, horizons):
            table = results[space].get(str(h), {}).get("table")
            if not table:
                ax.set_title(f"horizon {h}: not measured in this space")
                ax.axis("off")
                continue
            for est in [e for e in dict.fromkeys(r["estimator"] for r in table.values()) if e in PLOTTED]:
                y = [table[f"N={N}/{est}"]["var_scaled"] for N in Ns]
                lo = [table[f"N={N}/{est}"]["var_scaled_ci"][0] for N in Ns]
                hi = [table[f"N={N}/{est}"]["var_scaled_ci"][1] for N in Ns]
                style = dict(lw=2.5, color="black") if est == "otb" else {}
                line = ax.plot(Ns, y, marker="o", label=est, **style)[0]
                ax.fill_between(Ns, lo, hi, color=line.get_color(), alpha=0.12)
            ax.set(xscale="log", yscale="log", xlabel="group size N", title=f"horizon {h}")
            ax.set_xticks(Ns, [str(n) for n in Ns])
            ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
            ax.set_ylabel(label)
        ax = axes[-1]
        N4 = 4 if 4 in Ns else Ns[0]
        for est in PLOTTED:
            ys = [
                results[space]
                .get(str(h), {})
                .get("table", {})
                .get(f"N={N4}/{est}", {})
                .get("var_scaled", float("nan"))
                for h in horizons
            ]
            if all(math.isnan(y) for y in ys):
                continue
            ax.plot(horizons, ys, marker="o", label=est, **(dict(lw=2.5, color="black") if est == "otb" else {}))
        ax.set(xscale="log", xlabel="horizon (max completion tokens)", title=f"N={N4}")
        ax.set_xticks(horizons, [str(h) for h in horizons])
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_ylabel(label)
        ax.legend(fontsize=7)
    save_figure(fig, path)


def print_summary(space, h, res: dict, prompts: int) -> None:
    print(f"{space}, horizon {h}: {prompts} prompts, mean length {res['mean_completion_tokens']:.1f}")
    for k, row in res["table"].items():
        print(
            f"  {k:16s} var {row['var']:.4g}  mse {row['mse']:.4g}  scale {row['scale']:.3f}  "
            f"var_scaled {row['var_scaled']:.4g} [{row['var_scaled_ci'][0]:.4g}, {row['var_scaled_ci'][1]:.4g}]"
        )
    for k, t in res["paired"].items():
        print(
            f"  {k:16s} diff {t['diff']:.4g} [{t['diff_ci'][0]:.4g}, {t['diff_ci'][1]:.4g}] ratio "
            f"{t['ratio']:.3f} [{t['ratio_ci'][0]:.3f}, {t['ratio_ci'][1]:.3f}]"
            f"{'  significant' if t['significant'] else ''}"
        )
    print(f"  GRPO N matching OTB at N=4 (rescaled variance): {res['grpo_N_matching_otb_N4']}")
    if res.get("yardstick"):
        print(f"  yardstick (score-centred pool, B={res['yardstick']['batch_groups']}):")
        for k, row in res["yardstick"]["table"].items():
            print(
                f"  {k:28s} cos {row['cos']:.3f} [{row['cos_ci'][0]:.3f}, {row['cos_ci'][1]:.3f}]  "
                f"scale {row['scale']:.3f}  snr {row['snr']:.3g}  eps_star {row['eps_star']:.4f} "
                f"[{row['eps_star_ci'][0]:.4f}, {row['eps_star_ci'][1]:.4f}]  kappa {row.get('kappa', float('nan')):.3f}"
            )
