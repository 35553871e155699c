"""The bootstrap over prompts and groups: means with their intervals, paired tests between estimators, the squared
bias and its calibration.

Reported per space, horizon, N and estimator (mean over prompts; 95% percentile bootstrap intervals, two schemes:
``*_ci`` resamples prompts, then groups within each resampled prompt; ``*_ci_groups`` keeps the prompts and
resamples groups; the scale a is re-estimated in every resample). Per N, paired tests of OTB against GRPO and OGB:
every estimator sees the same groups and the same resamples, and the interval of the per-resample difference of
rescaled variances says whether they differ at 95%:
- ``var``: E||g - E g||^2, the variance around the estimator's own mean;
- ``mse``: E||g - g_ref||^2 against the pool reference g_ref = (1/M) sum_j (R_j - mean_k R_k) S_j, the policy
  gradient of the pool's empirical distribution (RLOO on groups drawn from it is unbiased for it);
- ``var_scaled``: a^2 var, with a = <E g, g_ref> / ||E g||^2 (over all prompts) the scalar that best matches the
  reference: it puts estimators whose self-including baselines shrink the gradient (by ~(N-1)/N) on an equal
  footing. Estimators: grpo (unscaled), grpo_std, rloo, opo, ogb, otb, otb_loo.
- ``bias_sq``: ||E g - g_ref||^2, from each prompt's G groups. The plug-in ||g_bar - g_ref||^2 (``bias_sq_plugin``)
  is inflated by the variance of g_bar, Var(g) / G in expectation; ``bias_sq`` subtracts its unbiased estimate
  var / (G - 1) (``squared_bias``), so that mse = var G / (G - 1) + bias_sq exactly (checked at every row). The
  bias's interval is the resamples' spread around the corrected estimate (each resample's corrected value is
  unbiased for the plug-in of the full sample, its world's truth, so the resamples are shifted by plug-in minus
  corrected). On ramble at N=4 the plug-in overstated unscaled GRPO's squared bias by 61% of its exact value
  (0.405 over 0.668) and put RLOO's at 1.0 instead of 0 (``calibration`` in each JSON).
  The pool reference inflates it too: the pool's masked scores of one position do not average to 0, so a baseline
  built from the other members only, unbiased in truth, looks biased against g_ref (``position_centring``). With
  ``--fallbacks`` every number is also given in the score-centred pool (``centred`` in each horizon's entry: each
  token's score less its position's pool mean), where such baselines are exactly unbiased; on ramble at N=4 it
  brings reference OTB's squared bias from 6.11 to 0.299.
"""

from __future__ import annotations

import math

import torch

from benchmarks.variance.estimators import PAIRS, SHARE_BINS, VARIANCE_ESTIMATORS


def _cell_arrays(per_prompt, key):
    """Per prompt, stacked: A [P, G] = ||g||^2 - 2 <g, g_bar>, Mse [P, G] = ||g||^2 - 2 <g, g_ref>, and the
    per-prompt constants ||g_bar||^2, <g_bar, g_ref>, ||g_ref||^2 [P]: var_p = mean_g A + ||g_bar||^2."""
    cells = [pp[key] for pp in per_prompt]
    sizes = {len(c["sq"]) for c in cells}
    if len(sizes) != 1:
        raise ValueError(f"every prompt needs the same number of groups per N, got {sorted(sizes)}")
    A = torch.stack([c["sq"] - 2 * c["dot_bar"] for c in cells]).double()
    Mse = torch.stack([c["sq"] - 2 * c["dot_ref"] for c in cells]).double()
    const = {k: torch.tensor([c[k] for c in cells], dtype=torch.float64) for k in ("bar_sq", "bar_ref", "ref_sq")}
    return A, Mse, const


def _resampled(A, Mse, const, ip, ig):
    """var, mse, scale and rescaled variance for every resample: prompts ip [B, P], groups ig [B, P, G]."""
    var = (A[ip[..., None], ig].mean(-1) + const["bar_sq"][ip]).mean(-1)
    mse = (Mse[ip[..., None], ig].mean(-1) + const["ref_sq"][ip]).mean(-1)
    scale = const["bar_ref"][ip].sum(-1) / const["bar_sq"][ip].sum(-1)
    return {"var": var, "mse": mse, "scale": scale, "var_scaled": scale**2 * var}


def _bias_arrays(per_prompt, key):
    """Per prompt, stacked: the groups' Gram matrices Q [P, G, G], ||g||^2 and <g, g_ref> [P, G], ||g_ref||^2 [P];
    None when the cells carry no Gram matrix (cells made before it was recorded)."""
    cells = [pp[key] for pp in per_prompt]
    if not all("gram" in c for c in cells):
        return None
    return (
        torch.stack([c["gram"] for c in cells]).double(),
        torch.stack([c["sq"] for c in cells]).double(),
        torch.stack([c["dot_ref"] for c in cells]).double(),
        torch.tensor([c["ref_sq"] for c in cells], dtype=torch.float64),
    )


def squared_bias(Q, sq, dot_ref, ref_sq, ip, ig):
    """(bias_sq, plug-in) for every resample: prompts ip [B, P], groups ig [B, P, G]; means over the resampled
    prompts.

    Per prompt, with g_bar the mean of its G resampled groups, the plug-in ||g_bar - g_ref||^2 estimates
    ||E g - g_ref||^2 + Var(g) / G: the mean of G draws still varies. The corrected estimate subtracts the unbiased
    estimate of Var(g) / G, that is (mean_k ||g_k||^2 - ||g_bar||^2) / (G - 1) (the groups are i.i.d. draws from the
    pool), so its expectation is the squared bias itself, and mse = var * G / (G - 1) + bias_sq exactly, where
    var = mean_k ||g_k - g_bar||^2 is the variance reported beside it."""
    boot, P = ip.shape
    G = sq.shape[1]
    counts = torch.zeros(boot, P, G, dtype=torch.float64).scatter_add_(
        2, ig, torch.ones(ig.shape, dtype=torch.float64)
    )
    quad = torch.zeros(boot, P, dtype=torch.float64)
    for p in range(Q.shape[0]):  # ||sum_k g_k||^2 = c^T Q c, prompt by prompt (Q[ip] would be [B, P, G, G])
        sel = ip == p
        if sel.any():
            c = counts[sel]
            quad[sel] = ((c @ Q[p]) * c).sum(1)
    bar_sq = quad / G**2
    mean_sq = sq[ip[..., None], ig].mean(-1)
    plugin = bar_sq - 2 * dot_ref[ip[..., None], ig].mean(-1) + ref_sq[ip]
    bias = plugin - (mean_sq - bar_sq) / (G - 1)
    return bias.mean(-1), plugin.mean(-1)


def _ci(x):
    return torch.quantile(x, torch.tensor([0.025, 0.975], dtype=x.dtype)).tolist()


def bootstrap_indices(P, G, boot, generator, over_prompts=True):
    """Resampling indices: prompts [boot, P] (with replacement, or every prompt once) and groups within each
    resampled prompt [boot, P, G] (with replacement)."""
    if over_prompts:
        ip = torch.randint(P, (boot, P), generator=generator)
    else:
        ip = torch.arange(P).expand(boot, P)
    return ip, torch.randint(G, (boot, P, G), generator=generator)


def paired_test(a, b, ratio=True):
    """Rescaled variance (or another statistic: the first entry is the full sample's, the rest its resamples) of
    estimator a minus b, resample by resample (the same prompts and groups for both): the difference, its 95%
    percentile interval, the ratio a / b with its interval (unless ``ratio`` is False: a squared bias near 0 has
    no useful ratio), and whether the difference's interval excludes 0."""
    d = a - b
    lo, hi = _ci(d[1:])
    out = {"diff": float(d[0]), "diff_ci": [lo, hi]}
    if ratio:
        r = a / b
        out.update(ratio=float(r[0]), ratio_ci=_ci(r[1:]))
    return {
        **out,
        "significant": bool(lo > 0 or hi < 0),
        "p_boot": float(min(1.0, 2 * min((d[1:] <= 0).double().mean(), (d[1:] >= 0).double().mean()))),
    }


def summarise(per_prompt, Ns, boot, generator, estimators=None, pairs=PAIRS):
    """Means over prompts with 95% bootstrap intervals, and paired tests between estimators.

    Two resampling schemes, each of ``boot`` resamples: ``ci`` resamples prompts, then groups within each resampled
    prompt (two levels: the prompts are a sample too); ``ci_groups`` keeps the prompts and resamples only the groups
    (the interval of these prompts' mean). The scale a is re-estimated in every resample. Within one N every
    estimator sees the same groups (drawn once per prompt and N) and the same resampling indices, so a paired test
    is the distribution of the per-resample difference. Returns (table, paired)."""
    estimators = list(estimators or VARIANCE_ESTIMATORS)
    P = len(per_prompt)
    table, paired = {}, {}
    for N in Ns:
        G = len(per_prompt[0][(N, estimators[0])]["sq"])
        schemes = {
            "": bootstrap_indices(P, G, boot, generator, over_prompts=True),
            "_groups": bootstrap_indices(P, G, boot, generator, over_prompts=False),
        }
        draws = {}
        for est in estimators:
            A, Mse, const = _cell_arrays(per_prompt, (N, est))
            bias_arrays = _bias_arrays(per_prompt, (N, est))
            full_ip, full_ig = torch.arange(P)[None, :], torch.arange(G).expand(1, P, G)
            full = _resampled(A, Mse, const, full_ip, full_ig)
            if bias_arrays is not None:
                full["bias_sq"], full["bias_sq_plugin"] = squared_bias(*bias_arrays, full_ip, full_ig)
            row = {"N": N, "estimator": est, "prompts": P, "groups_per_prompt": G}
            for name in ("var", "mse", "scale", "var_scaled", "bias_sq", "bias_sq_plugin"):
                if name in full:
                    row[name] = float(full[name][0])
            for suffix, (ip, ig) in schemes.items():
                res = _resampled(A, Mse, const, ip, ig)
                if bias_arrays is not None:
                    # A resample's corrected estimate is unbiased for the resampled world's squared bias, which is
                    # the full sample's plug-in: shifted by (plug-in - corrected), the resamples spread around the
                    # corrected estimate as it spreads around the true squared bias (else the interval would keep
                    # the var / (G - 1) inflation that the correction removed).
                    res["bias_sq"], _ = squared_bias(*bias_arrays, ip, ig)
                    res["bias_sq"] -= full["bias_sq_plugin"][0] - full["bias_sq"][0]
                for name in ("var", "mse", "var_scaled", "bias_sq"):
                    if name in res:
                        draws[(est, suffix, name)] = torch.cat([full[name][:1], res[name]])
                        row[f"{name}_ci{suffix}"] = _ci(res[name])
            row["ref_sq_norm"] = float(const["ref_sq"].mean())
            if bias_arrays is not None:
                # mse = var G / (G - 1) + bias_sq, exactly (squared_bias): a check of the algebra, not of the data.
                row["var_unbiased"] = row["var"] * G / (G - 1)
                gap = row["mse"] - row["var_unbiased"] - row["bias_sq"]
                if abs(gap) > 1e-6 * max(abs(row["mse"]), 1e-12):
                    raise AssertionError(f"N={N}/{est}: mse - var G/(G-1) - bias_sq = {gap:.3g}, not 0")
            table[f"N={N}/{est}"] = row
        for a, b in pairs:
            if a in estimators and b in estimators:
                test = paired_test(draws[(a, "", "var_scaled")], draws[(b, "", "var_scaled")])
                test["groups_only"] = paired_test(
                    draws[(a, "_groups", "var_scaled")], draws[(b, "_groups", "var_scaled")]
                )
                if (a, "", "bias_sq") in draws and (b, "", "bias_sq") in draws:
                    test["metrics"] = {
                        name: {
                            **paired_test(draws[(a, "", name)], draws[(b, "", name)], ratio=name != "bias_sq"),
                            "groups_only": paired_test(
                                draws[(a, "_groups", name)], draws[(b, "_groups", name)], ratio=name != "bias_sq"
                            ),
                        }
                        for name in ("var", "bias_sq", "mse")
                    }
                paired[f"N={N}/{a}-{b}"] = {"N": N, "a": a, "b": b, **test}
    return table, paired


def decomposition_summary(per_prompt, table, Ns, decompose):
    """Per N and estimator, mean over prompts of each SHARE_BINS bin's variance, raw and rescaled by the estimator's
    a^2 (from ``table``), with the bin's mean share of tokens; ``cross`` is the total minus the bins' sum (the
    covariance between bins)."""
    out = {}
    for N in Ns:
        for est in decompose:
            rows = [pp[("bins", N, est)] for pp in per_prompt]
            scale2 = table[f"N={N}/{est}"]["scale"] ** 2
            entry = {}
            for name in SHARE_BINS:
                var = sum(r[name]["var"] for r in rows) / len(rows)
                share = sum(r[name]["token_share"] for r in rows) / len(rows)
                entry[name] = {"var": var, "var_scaled": scale2 * var, "token_share": share}
            total = table[f"N={N}/{est}"]["var_scaled"]
            entry["total_var_scaled"] = total
            entry["cross_var_scaled"] = total - sum(entry[name]["var_scaled"] for name in SHARE_BINS)
            out[f"N={N}/{est}"] = entry
    return out


def matching_n(table, Ns, target_est="grpo", at_est="otb", at_n=4, key="var_scaled"):
    """The N (log-log interpolation) at which ``target_est`` has the ``key`` of ``at_est`` at N=``at_n``."""
    goal = table[f"N={at_n}/{at_est}"][key]
    pts = [(N, table[f"N={N}/{target_est}"][key]) for N in Ns]
    for (n0, v0), (n1, v1) in zip(pts, pts[1:]):
        if (v0 - goal) * (v1 - goal) <= 0 and v0 != v1 and v0 > 0 and v1 > 0 and goal > 0:
            t = (math.log(goal) - math.log(v0)) / (math.log(v1) - math.log(v0))
            return math.exp(math.log(n0) + t * (math.log(n1) - math.log(n0)))
    if pts and goal >= pts[0][1]:
        return f"<= {pts[0][0]}"
    return f"> {pts[-1][0]}"


def calibration(table, Ns) -> list[dict]:
    """Per N, the two checks the squared bias must pass before it says anything about the other estimators, on the
    groups-only interval (these prompts' pools are the distribution, g_ref their exact policy gradient):
    - RLOO is unbiased for g_ref: its interval covers 0;
    - unscaled GRPO is exactly the (1 - 1/N) rescaling, E g_grpo = (1 - 1/N) g_ref (E[(R_i - mean R) S_i] =
      (1 - 1/N) Cov(R, S) for i.i.d. members), so its squared bias is ||g_ref||^2 / N^2: its interval covers that,
      and its scale a = <E g, g_ref> / ||E g||^2 is near N / (N - 1);
    and how much the plug-in ||g_bar - g_ref||^2 was inflated (by var / (G - 1), ``squared_bias``)."""
    out = []
    for N in Ns:
        rloo, grpo = table.get(f"N={N}/rloo"), table.get(f"N={N}/grpo")
        if rloo is None or grpo is None or "bias_sq" not in rloo:
            continue
        expected = grpo["ref_sq_norm"] / N**2
        lo, hi = rloo["bias_sq_ci_groups"]
        glo, ghi = grpo["bias_sq_ci_groups"]
        out.append(
            {
                "N": N,
                "rloo_bias_sq": rloo["bias_sq"],
                "rloo_bias_sq_ci_groups": [lo, hi],
                "rloo_bias_sq_ci": rloo["bias_sq_ci"],
                "rloo_covers_0": bool(lo <= 0 <= hi),
                "rloo_bias_sq_plugin": rloo["bias_sq_plugin"],
                "rloo_mse": rloo["mse"],
                "grpo_bias_sq": grpo["bias_sq"],
                "grpo_bias_sq_expected": expected,
                "grpo_bias_sq_ci_groups": [glo, ghi],
                "grpo_bias_sq_ci": grpo["bias_sq_ci"],
                "grpo_covers_expected": bool(glo <= expected <= ghi),
                "grpo_bias_sq_plugin": grpo["bias_sq_plugin"],
                "grpo_scale": grpo["scale"],
                "grpo_scale_expected": N / (N - 1),
                "ref_sq_norm": grpo["ref_sq_norm"],
                "plugin_inflation": {
                    est: table[f"N={N}/{est}"]["bias_sq_plugin"] - table[f"N={N}/{est}"]["bias_sq"]
                    for est in ("rloo", "grpo", "otb")
                    if f"N={N}/{est}" in table
                },
            }
        )
    return out
