"""The yardstick of each estimator (:mod:`trl_otb.core.yardstick`: ``cos``, ``scale``, ``snr``, ``eps_star``,
``kappa``), estimated from groups drawn from pools, with 95% bootstrap intervals.

The world. Groups are drawn from each prompt's pool, so the pool is the distribution and its policy gradient the
truth. The yardstick is measured in the score-centred pool (``gram.position_centring``): there the reference g~_ref
is exact (it has no noise of its own in this world), RLOO and every baseline built from the other members only are
exactly unbiased, and unscaled GRPO is exactly (1 - 1/N) g~_ref; in the raw pool a finite sample of scores makes
baselines that are unbiased in truth look biased. Prompts are separate blocks: every inner product is the sum over
prompts of each prompt's own (cross-prompt products are not measured).

The estimates, per prompt p with G i.i.d. groups g_1..g_G (Gram Q_kl = <g_k, g_l>) and reference g_p, summed over p:

- ``<m, g>``: mean_k <g_k, g_p>, unbiased (g_p is exact in this world);
- ``tr Σ``: (mean_k ||g_k||² - ||g_bar||²) G / (G - 1), unbiased;
- ``||m||²``: ||g_bar||² - tr Σ / G, unbiased; the plug-in ||g_bar||² is too large by tr Σ / G in expectation, which
  would pull ``cos`` toward 0 and raise ``snr`` wherever one group's signal is small against its noise;
- ``||g||²``: exact.

``cos``, ``scale``, ``snr`` (at B groups per step) and ``eps_star`` follow from these by
``yardstick_from_products``; they are ratios of unbiased estimates, consistent but not exactly unbiased (the
calibration tests bound what is left). ``cos`` is NaN where the corrected ||m||² is not positive (no signal seen).
The bootstrap resamples prompts, then groups within each; a resample's corrected ||m||² is unbiased for the full
sample's plug-in, so the resamples are shifted by (plug-in - corrected) before the ratios are taken.

``kappa`` needs coordinates: each group's gradient on a sample of parameter coordinates (``gram.coordinate_sample``,
weighted by the inverse of their inclusion rate). Per coordinate, m_k² is estimated as mean² - s_k² / G and
E[g_B,k²] as that plus s_k² / B, with s_k² the groups' unbiased variance.
"""

from __future__ import annotations

import torch

from ..core.yardstick import yardstick_from_products

__all__ = ["YARDSTICK_KEYS", "estimate", "interval", "kappa_resampled", "paired_differences", "products"]

YARDSTICK_KEYS = ("cos", "scale", "snr", "eps_star")


def counts_of(ig: torch.Tensor, G: int) -> torch.Tensor:
    """Multiplicities [B, P, G] of each group in each resampled prompt slot, from group indices ig [B, P, G]."""
    return torch.zeros(*ig.shape[:-1], G, dtype=torch.float64).scatter_add_(
        -1, ig, torch.ones(ig.shape, dtype=torch.float64)
    )


def products(Q, dot_ref, ref_sq, ip, ig) -> dict:
    """The summed products <m, g>, ||m||² (corrected and plug-in), ||g||² and tr Σ [B] of every resample: prompts
    ip [B, P], groups ig [B, P, G], from per-prompt group Grams Q [P, G, G], <g_k, g_p> [P, G] and ||g_p||² [P]."""
    G = Q.shape[1]
    counts = counts_of(ig, G)
    quad = torch.zeros(ip.shape, dtype=torch.float64)
    for p in range(Q.shape[0]):  # c^T Q c prompt by prompt (Q[ip] would be [B, P, G, G])
        sel = ip == p
        if sel.any():
            c = counts[sel]
            quad[sel] = ((c @ Q[p].double()) * c).sum(1)
    sq = torch.diagonal(Q, dim1=1, dim2=2).double()
    bar_sq = quad / G**2
    mean_sq = (counts * sq[ip]).sum(-1) / G
    trace = (mean_sq - bar_sq) * G / (G - 1)
    return {
        "m_dot_g": ((counts * dot_ref.double()[ip]).sum(-1) / G).sum(-1),
        "m_sq": (bar_sq - trace / G).sum(-1),
        "m_sq_plugin": bar_sq.sum(-1),
        "g_sq": ref_sq.double()[ip].sum(-1),
        "trace_cov": trace.sum(-1),
    }


def kappa_terms(X, g, w, counts, batch, resampled=False):
    """Numerator sum_k w_k g_k m_k / rms_k and denominator sum_k w_k |g_k| of one prompt, for every row of ``counts``
    [R, G] (group multiplicities): X [G, D] the groups' gradients on D sampled coordinates, g [D] the reference's,
    w [D] their weights. ``resampled``: the rows are bootstrap resamples, whose m_k² is shifted by the full sample's
    s_k² / G (as ``estimate`` shifts ||m||²)."""
    G = X.shape[0]
    X = X.double()
    mean = counts @ X / G
    second = counts @ X**2 / G
    s2 = (second - mean**2).clamp(min=0) * G / (G - 1)
    shift = X.var(0, unbiased=True) / G if resampled else 0.0
    m_sq = (mean**2 - s2 / G - shift).clamp(min=0)
    rms = (m_sq + s2 / batch).sqrt()
    ratio = torch.where(rms > 0, mean / rms, torch.zeros_like(mean))
    return (ratio * (w * g).double()).sum(-1), float((w * g.abs()).double().sum())


def kappa_resampled(cells, ip, ig, batch, resampled=True):
    """kappa [B] over resamples (prompts ip [B, P], groups ig [B, P, G]) from each prompt's ``coords`` cell entry:
    (X [G, D], g [D], w [D])."""
    G = ig.shape[-1]
    counts = counts_of(ig, G)
    num = torch.zeros(ip.shape, dtype=torch.float64)
    den = torch.zeros(ip.shape, dtype=torch.float64)
    for p, cell in enumerate(cells):
        sel = ip == p
        if sel.any():
            X, g, w = cell["coords"]
            num[sel], den[sel] = kappa_terms(X, g, w, counts[sel], batch, resampled)
    return num.sum(-1) / den.sum(-1)


def formulas(prod, i, batch) -> dict:
    return yardstick_from_products(
        float(prod["m_dot_g"][i]), float(prod["m_sq"][i]), float(prod["g_sq"][i]), float(prod["trace_cov"][i]), batch
    )


def interval(x: torch.Tensor) -> list:
    x = x[torch.isfinite(x)]
    if len(x) < 2:
        return [float("nan"), float("nan")]
    return torch.quantile(x, torch.tensor([0.025, 0.975], dtype=x.dtype)).tolist()


def estimate(Q, dot_ref, ref_sq, batch, ip, ig, coords=None) -> tuple[dict, dict]:
    """The yardstick of one estimator from per-prompt group Grams Q [P, G, G], <g_k, g_ref> [P, G] and ||g_ref||²
    [P] (the module's docstring), at ``batch`` groups per step; ``ip`` [R, P] and ``ig`` [R, P, G] the resamples.
    ``coords``, one (X [G, D], g [D], w [D]) per prompt, adds ``kappa``. Returns (row, draws): the point estimates
    with their ``*_ci`` intervals and ``m_sq_plugin``, and per key the tensor [1 + R] of the full sample followed by
    its resamples (for paired comparisons on the same resamples)."""
    P, G = dot_ref.shape
    full = products(Q, dot_ref, ref_sq, torch.arange(P)[None, :], torch.arange(G).expand(1, P, G))
    boot = products(Q, dot_ref, ref_sq, ip, ig)
    boot["m_sq"] = boot["m_sq"] - (full["m_sq_plugin"][0] - full["m_sq"][0])
    boot["trace_cov"] = boot["trace_cov"] + full["trace_cov"][0] / G  # E* of a resample's is tr Σ_hat (G - 1) / G
    point = formulas(full, 0, batch)
    rows = [formulas(boot, i, batch) for i in range(len(ip))]
    draws = {key: torch.tensor([point[key]] + [r[key] for r in rows], dtype=torch.float64) for key in YARDSTICK_KEYS}
    out = {key: point[key] for key in YARDSTICK_KEYS}
    for key in YARDSTICK_KEYS:
        out[f"{key}_ci"] = interval(draws[key][1:])
    out["cos_undefined_share"] = float((~torch.isfinite(draws["cos"][1:])).double().mean())
    out["m_sq"], out["m_sq_plugin"] = float(full["m_sq"][0]), float(full["m_sq_plugin"][0])
    out["g_sq"], out["trace_cov"] = float(full["g_sq"][0]), float(full["trace_cov"][0])
    if coords is not None:
        cells = [{"coords": c} for c in coords]
        k_full = kappa_resampled(cells, torch.arange(P)[None, :], torch.arange(G).expand(1, P, G), batch, False)
        k_boot = kappa_resampled(cells, ip, ig, batch)
        draws["kappa"] = torch.cat([k_full, k_boot])
        out["kappa"], out["kappa_ci"] = float(k_full[0]), interval(k_boot)
    return out, draws


def paired_differences(draws_a: dict, draws_b: dict, keys=("cos", "eps_star")) -> dict:
    """Per key, a - b on the same resamples (``estimate``'s draws: the full sample, then the resamples): the
    difference, its 95% interval, whether the interval excludes 0, and for ``eps_star`` the ratio a / b with its."""
    out = {}
    for key in keys:
        diff = draws_a[key] - draws_b[key]
        lo, hi = interval(diff[1:])
        entry = {"diff": float(diff[0]), "diff_ci": [lo, hi], "significant": bool(lo > 0 or hi < 0)}
        if key == "eps_star":
            ratio = draws_a[key] / draws_b[key]
            entry["ratio"], entry["ratio_ci"] = float(ratio[0]), interval(ratio[1:])
        out[key] = entry
    return out
