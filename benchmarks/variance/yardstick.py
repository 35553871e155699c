"""The yardstick of each estimator (``trl_otb.core.yardstick``: ``cos``, ``scale``, ``snr``, ``eps_star``,
``kappa``), estimated from the groups the tool draws, with 95% intervals from its bootstrap.

The world. Groups are drawn from each prompt's pool, so the pool is the distribution and its policy gradient the
truth. The tool measures the yardstick in the score-centred pool (``gradients.position_centring``): there the
reference g~_ref is exact (it has no noise of its own in this world), RLOO and every baseline built from the other
members only are exactly unbiased, and unscaled GRPO is exactly (1 - 1/N) g~_ref; in the raw pool a finite sample of
scores makes baselines that are unbiased in truth look biased. Prompts are separate blocks: every inner product is
the sum over prompts of each prompt's own (cross-prompt products are not measured), as the tool's scale a already is.

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
sample's plug-in, so the resamples are shifted by (plug-in - corrected) before the ratios are taken, as
``statistics.squared_bias`` does.

``kappa`` needs coordinates: each group's gradient on a sample of parameter coordinates (``coordinate_sample``:
the LM head's rows of the pool's sampled tokens and the rest of the vocabulary as two strata, weighted by the
inverse of their inclusion rate; every coordinate when there are few). Per coordinate, m_k² is estimated as
mean² - s_k² / G and E[g_B,k²] as that plus s_k² / B, with s_k² the groups' unbiased variance.
"""

from __future__ import annotations

import torch

from trl_otb.core.yardstick import yardstick_from_products

YARDSTICK_KEYS = ("cos", "scale", "snr", "eps_star")
CONTROLS = ("grpo", "otb_default")
"""The estimators every other one is paired against (cos and eps_star, resample by resample)."""


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


def _formulas(prod, i, batch) -> dict:
    return yardstick_from_products(
        float(prod["m_dot_g"][i]), float(prod["m_sq"][i]), float(prod["g_sq"][i]), float(prod["trace_cov"][i]), batch
    )


def _interval(x: torch.Tensor) -> list:
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
    point = _formulas(full, 0, batch)
    rows = [_formulas(boot, i, batch) for i in range(len(ip))]
    draws = {key: torch.tensor([point[key]] + [r[key] for r in rows], dtype=torch.float64) for key in YARDSTICK_KEYS}
    out = {key: point[key] for key in YARDSTICK_KEYS}
    for key in YARDSTICK_KEYS:
        out[f"{key}_ci"] = _interval(draws[key][1:])
    out["cos_undefined_share"] = float((~torch.isfinite(draws["cos"][1:])).double().mean())
    out["m_sq"], out["m_sq_plugin"] = float(full["m_sq"][0]), float(full["m_sq_plugin"][0])
    out["g_sq"], out["trace_cov"] = float(full["g_sq"][0]), float(full["trace_cov"][0])
    if coords is not None:
        cells = [{"coords": c} for c in coords]
        k_full = kappa_resampled(cells, torch.arange(P)[None, :], torch.arange(G).expand(1, P, G), batch, False)
        k_boot = kappa_resampled(cells, ip, ig, batch)
        draws["kappa"] = torch.cat([k_full, k_boot])
        out["kappa"], out["kappa_ci"] = float(k_full[0]), _interval(k_boot)
    return out, draws


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
                    lo, hi = _interval(diff[1:])
                    entry[key] = {"diff": float(diff[0]), "diff_ci": [lo, hi], "significant": bool(lo > 0 or hi < 0)}
                paired[f"N={N}/{est}-{control}"] = entry
    return rows, paired


def coordinate_sample(ids, vocab_size, hidden, budget, generator):
    """Coordinates (rows [D], columns [D]) of the LM head's [V, H] weight and their weights [D] (inverse inclusion
    rates): all V·H when that is at most ``budget``; else half the budget uniform over the rows of the tokens in
    ``ids`` (where a pool's gradient concentrates) and half over the other rows."""
    if vocab_size * hidden <= budget:
        rows = torch.arange(vocab_size).repeat_interleave(hidden)
        return rows, torch.arange(hidden).repeat(vocab_size), torch.ones(vocab_size * hidden, dtype=torch.float64)
    seen = torch.unique(ids)
    rest = torch.ones(vocab_size, dtype=torch.bool)
    rest[seen] = False
    rest = rest.nonzero().squeeze(1)
    half = budget // 2
    r1 = seen[torch.randint(len(seen), (half,), generator=generator)]
    r2 = rest[torch.randint(len(rest), (budget - half,), generator=generator)]
    cols = torch.randint(hidden, (budget,), generator=generator)
    w = torch.cat(
        [
            torch.full((half,), len(seen) * hidden / half, dtype=torch.float64),
            torch.full((budget - half,), len(rest) * hidden / (budget - half), dtype=torch.float64),
        ]
    )
    return torch.cat([r1, r2]), cols, w


def head_coordinates(completions, head_weight, temperature, budget, generator):
    """F [n, D] (fp64) with F_ak the LM-head score of pool token a at sampled coordinate k,
    (1[y_a = v_k] - pi_a(v_k)) h_a[j_k], and the coordinates' weights [D]: a gradient with token coefficients c has
    coordinates c @ F (``gradients.token_gram``'s parametrisation)."""
    ids = torch.cat([c["ids"] for c in completions])
    h = torch.cat([c["h"] for c in completions]).double()
    log_z = torch.cat([c["log_z"] for c in completions]).double()
    V, H = head_weight.shape
    rows, cols, w = coordinate_sample(ids, V, H, budget, generator)
    pi = torch.exp(h @ head_weight[rows].double().T / temperature - log_z[:, None])  # [n, D]
    F = ((ids[:, None] == rows[None, :]).double() - pi) * h[:, cols]
    return F, w
