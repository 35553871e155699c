"""The estimators a gradient check compares, each prompt's cells, and the report.

Each prompt's pool is the world: groups of N completions are drawn from it i.i.d. (with replacement), each estimator
turns a group into token advantages A_t^(i) with :func:`trl_otb.compute_advantages` and a gradient
g = (1/N) sum_i sum_t A_t^(i) s_t^(i), and the truth is the pool's policy gradient (the pool's rewards less their
mean, times each completion's score), all in the score-centred pool (``gram.position_centring``: there every
baseline built from the other members only is exactly unbiased and unscaled GRPO is exactly (1 - 1/N) times the
truth, which calibrates the check on every run). ``stats.estimate`` turns the cells into the yardstick.
"""

from __future__ import annotations

import dataclasses

import torch

from ..config import OTBConfig
from ..core import compute_advantages, resolve_shrinkage
from . import gram
from .stats import estimate, paired_differences

__all__ = ["CONTROLS", "estimators_for", "prompt_cells", "reading", "summarise"]

CONTROLS = {"grpo": "unscaled GRPO", "grpo_std": "TRL's GRPO"}
"""The estimators every other one is paired against, with the words the reading uses for them."""


def _default_otb() -> dict:
    """``OTBConfig()``'s estimator options (its field defaults, resolved: no config is built)."""
    defaults = {f.name: f.default for f in dataclasses.fields(OTBConfig)}
    tail, leave_one_out = defaults["otb_tail"], defaults["otb_leave_one_out"]
    return {
        "tail": tail,
        "leave_one_out": leave_one_out,
        "shrinkage": resolve_shrinkage(defaults["otb_shrinkage"], tail, leave_one_out),
        "eps": defaults["otb_epsilon"],
    }


def _without_eps(options: dict) -> dict:
    return {k: v for k, v in options.items() if k != "eps"}


def estimators_for(args: OTBConfig | None = None) -> dict:
    """Name -> (estimator, options): the default OTB (``OTBConfig()``'s), TRL's GRPO (std-scaled), unscaled GRPO,
    RLOO, OGB, Li et al.'s self-inclusive OTB (with the shift-invariant ``"zero_advantage"`` tail, trl-otb 0.2.0's
    default) and the exactly unbiased OTB options (leave-one-out with the others' mean at lone tokens, and the same
    ESS-shrunk), named as the variance tool names them (it calls the self-inclusive one ``otb_default``, its
    default in the 0.2.0 measurements); a named option equal to the default is left out (the default's row is it).
    Plus ``yours``, ``args``'s estimator, when it is none of these."""
    default = _default_otb()
    named = {
        "grpo_std": ("grpo", {"scale": "group"}),
        "grpo": ("grpo", {"scale": "none"}),
        "rloo": ("rloo", {}),
        "ogb": ("ogb", {}),
        "otb_self_inclusive": ("otb", {"tail": "zero_advantage", "leave_one_out": False, "shrinkage": "none"}),
        "otb_others_mean_loo": ("otb", {"tail": "others_mean", "leave_one_out": True, "shrinkage": "none"}),
        "otb_others_mean_loo_ess": ("otb", {"tail": "others_mean", "leave_one_out": True, "shrinkage": "ess"}),
    }
    out = {"otb_default": ("otb", default)}
    out.update({k: v for k, v in named.items() if v != ("otb", _without_eps(default))})
    if args is not None:
        yours = (args.advantage_estimator, {k: v for k, v in args.estimator_options().items() if k != "align"})
        if args.advantage_estimator == "grpo":
            yours = ("grpo", {"scale": "none" if args.scale_rewards in ("none", False) else "group"})
        known = [(e, _without_eps(o)) for e, o in out.values()]
        if (yours[0], _without_eps(yours[1])) not in known:
            out["yours"] = yours
    return out


def prompt_cells(space: dict, pool: dict, N: int, num_groups: int, generator, estimators: dict) -> dict | None:
    """Per estimator, one prompt's centred cell: the groups' Gram [G, G], <g_k, g_ref> [G], ||g_ref||², and the
    groups' and the reference's gradients on the kappa coordinates. None when the pool's scorable rewards tie (no
    estimator has signal there) or fewer than 2 completions are scorable."""
    keep = torch.isfinite(pool["rewards"])
    rewards, proxy, mask = pool["rewards"][keep], pool["proxy"][keep], pool["mask"][keep]
    if keep.sum() < 2 or rewards.max() == rewards.min():
        return None
    K, F = space["K"], space["F"]
    if not keep.all():  # drop the unscorable completions' tokens from the pool's token order
        token_keep = torch.cat([keep[i].expand(int(L)) for i, L in enumerate(pool["mask"].sum(1).tolist())])
        K, F = K[token_keep][:, token_keep], F[token_keep]
    lengths = mask.sum(1)
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)[:-1]])
    n = int(lengths.sum())
    _, EK, centre = gram.position_centring(mask, K)
    c_ref = gram.reference_coefficients(rewards, mask, offsets, n)
    c_ref_c, d_ref = centre(c_ref[None])
    c_ref_c, K_ref_c = c_ref_c[0], K @ c_ref - (d_ref @ EK)[0]
    ref_sq = float(c_ref_c @ K_ref_c)
    groups = gram.draw_groups(len(rewards), N, num_groups, generator)
    flat, group_ids = groups.flatten(), torch.arange(num_groups).repeat_interleave(N)
    cells = {}
    for name, (estimator, options) in estimators.items():
        adv = compute_advantages(estimator, rewards[flat].float(), proxy[flat], mask[flat], group_ids, **options)
        C_c, D = centre(gram.group_coefficients(adv, groups, mask, offsets, n))
        KC = C_c @ K
        cells[name] = {
            "gram": KC @ C_c.T,
            "dot_ref": KC @ c_ref_c,
            "ref_sq": ref_sq,
            "coords": ((C_c @ F).float(), c_ref_c @ F, space["w"]),
        }
    return cells


def summarise(per_prompt: list[dict], estimators, batch: int, boot: int, seed: int, kappa_boot: int = 200):
    """Per estimator the yardstick with 95% intervals (every estimator on the same resamples of prompts and groups)
    and ``signal_kept`` = 1 - eps_star; per estimator and control, the paired differences of ``cos`` and
    ``eps_star`` and the ratio of ``eps_star``. Returns (rows, paired)."""
    generator = torch.Generator().manual_seed(seed)
    P, G = len(per_prompt), per_prompt[0][next(iter(estimators))]["gram"].shape[0]
    ip = torch.randint(P, (boot, P), generator=generator)
    ig = torch.randint(G, (boot, P, G), generator=generator)
    rows, draws = {}, {}
    for name in estimators:
        cells = [cell[name] for cell in per_prompt]
        Q = torch.stack([c["gram"] for c in cells]).double()
        dot = torch.stack([c["dot_ref"] for c in cells]).double()
        ref = torch.tensor([c["ref_sq"] for c in cells], dtype=torch.float64)
        row, draws[name] = estimate(Q, dot, ref, batch, ip, ig)
        k_row, _ = estimate(Q, dot, ref, batch, ip[:kappa_boot], ig[:kappa_boot], [c["coords"] for c in cells])
        row["kappa"], row["kappa_ci"] = k_row["kappa"], k_row["kappa_ci"]
        row["signal_kept"] = 1.0 - row["eps_star"]
        row["signal_kept_ci"] = [1.0 - row["eps_star_ci"][1], 1.0 - row["eps_star_ci"][0]]
        rows[name] = row
    paired = {
        f"{name}-{control}": {"a": name, "b": control, **paired_differences(draws[name], draws[control])}
        for control in CONTROLS
        if control in draws
        for name in estimators
        if name != control
    }
    return rows, paired


def reading(paired: dict, name: str = "otb_default") -> str:
    """One line: ``name``'s error after the best rescaling (eps_star) as a multiple of unscaled GRPO's and TRL's
    GRPO's, with 95% intervals; lower / no different / higher by whether the interval of the ratio excludes 1."""

    def part(control):
        ratio = paired[f"{name}-{control}"]["eps_star"]
        lo, hi = ratio["ratio_ci"]
        verdict = "lower" if hi < 1 else "higher" if lo > 1 else "no different"
        return f"{ratio['ratio']:.2f}x {CONTROLS[control]}'s [{lo:.2f}, {hi:.2f}]: {verdict}"

    grpo, std = part("grpo"), part("grpo_std")
    return f"On this setup, the default OTB's gradient error (eps_star) is {grpo}; and {std}."
