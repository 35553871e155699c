"""``--yardstick``: the yardstick of each estimator (``cos``, ``scale``, ``snr``, ``eps_star``, ``kappa``), estimated
from the groups the tool draws, with 95% intervals from its bootstrap, in the score-centred pool. The estimates and
the world they assume are the library's (``trl_otb.gradcheck.stats``, which ``trl-otb gradient-check`` uses too);
this module pairs every estimator against ``CONTROLS`` on the same resamples.
"""

from __future__ import annotations

import torch

from trl_otb.gradcheck.gram import coordinate_sample, head_coordinates
from trl_otb.gradcheck.stats import counts_of, estimate, interval, kappa_resampled, products

__all__ = ["coordinate_sample", "counts_of", "estimate", "head_coordinates", "kappa_resampled", "products"]

CONTROLS = ("grpo", "otb_default")
"""The estimators every other one is paired against (cos and eps_star, resample by resample)."""


def cell_inputs(per_prompt, key):
    """(Q [P, G, G], <g_k, g_ref> [P, G], ||g_ref||² [P], coords or None) of one (N, estimator) cell over prompts,
    from ``analyse_prompt``'s cells."""
    cells = [pp[key] for pp in per_prompt]
    Q = torch.stack([c["gram"] for c in cells]).double()
    dot = torch.stack([c["dot_ref"] for c in cells]).double()
    ref = torch.tensor([c["ref_sq"] for c in cells], dtype=torch.float64)
    coords = [c["coords"] for c in cells] if all("coords" in c for c in cells) else None
    return Q, dot, ref, coords


def summarise_yardstick(per_prompt, Ns, estimators, batch, boot, generator, kappa_boot=200) -> tuple[dict, dict]:
    """Per N and estimator, the yardstick (``estimate``) of the cells ``per_prompt[p][(N, est)]``, every estimator
    on the same resamples; and per N the paired differences (a - control) of ``cos`` and ``eps_star`` against each
    of ``CONTROLS``, with 95% intervals. ``kappa``'s interval uses the first ``kappa_boot`` resamples (it costs a
    pass over the sampled coordinates per resample). Returns (rows by ``N={N}/{est}``, paired)."""
    P = len(per_prompt)
    rows, paired = {}, {}
    for N in Ns:
        G = per_prompt[0][(N, estimators[0])]["gram"].shape[0]
        ip = torch.randint(P, (boot, P), generator=generator)
        ig = torch.randint(G, (boot, P, G), generator=generator)
        draws = {}
        for est in estimators:
            Q, dot, ref, coords = cell_inputs(per_prompt, (N, est))
            row, d = estimate(Q, dot, ref, batch, ip, ig)
            if coords is not None:
                k_row, _ = estimate(Q, dot, ref, batch, ip[:kappa_boot], ig[:kappa_boot], coords)
                row["kappa"], row["kappa_ci"] = k_row["kappa"], k_row["kappa_ci"]
            rows[f"N={N}/{est}"], draws[est] = row, d
        for control in CONTROLS:
            if control not in draws:
                continue
            for est in estimators:
                if est == control:
                    continue
                entry = {"N": N, "a": est, "b": control}
                for key in ("cos", "eps_star"):
                    diff = draws[est][key] - draws[control][key]
                    lo, hi = interval(diff[1:])
                    entry[key] = {"diff": float(diff[0]), "diff_ci": [lo, hi], "significant": bool(lo > 0 or hi < 0)}
                paired[f"N={N}/{est}-{control}"] = entry
    return rows, paired
