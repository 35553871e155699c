"""Per-step OTB diagnostics (logged under ``otb/``), computed from the tensors the baseline used.

No TRL import. All inputs are the *gathered* generation batch, so every process logs the same values:
``rewards [B]`` (NaN = unscorable), ``advantages [B, T]``, ``proxy [B, T]`` (or None), ``mask [B, T]``,
``group_ids [B]``. Statistics run over valid rows (finite reward, mask not all 0) and their masked-in tokens.
"""

from __future__ import annotations

import torch

from .groups import group_index, group_sum, valid_rows

__all__ = ["ADVANTAGE_KEYS", "BASELINE_TOLERANCE", "PROXY_KEYS", "otb_diagnostics"]

BASELINE_TOLERANCE = 0.01
"""``baseline_differs_frac`` counts a baseline as different from the group mean beyond this share of the group's
reward spread (its standard deviation): closer than that, the advantages are GRPO's up to a rounding."""

# Always present.
ADVANTAGE_KEYS = (
    "baseline_differs_frac",
    "baseline_shift",
    "lone_token_frac",
    "advantage_mean",
    "advantage_std",
    "advantage_abs_max",
)
# Present only when the estimator read a proxy (``proxy`` is not None).
PROXY_KEYS = ("proxy_mean", "proxy_max", "energy_last_mean", "energy_last_max", "total_power")
_ORDER = (*PROXY_KEYS[:4], *ADVANTAGE_KEYS, "total_power")  # the order they are logged in


def otb_diagnostics(
    rewards: torch.Tensor,
    advantages: torch.Tensor,
    proxy: torch.Tensor | None,
    mask: torch.Tensor,
    group_ids: torch.Tensor,
    align: str = "position",
    leave_one_out: bool = False,
) -> dict[str, float]:
    """Diagnostics of one generation batch.

    Args:
        rewards: ``[B]`` (NaN = unscorable). advantages, mask: ``[B, T]``. group_ids: ``[B]``.
        proxy: ``[B, T]`` the per-token weights the estimator used, or None when it used none (``grpo``, ``rloo``,
            ``opo``: see ``ESTIMATORS[name].uses_proxy``); then the proxy keys are left out rather than describing
            weights that played no part.
        align: how group members are compared (``"position"`` or ``"valid"``, as the estimator was called); it
            decides which tokens are alone.
        leave_one_out: whether the estimator's baseline leaves the member out (leave-one-out OTB, RLOO); then the
            baselines are compared with the other members' mean reward (RLOO's) instead of the group's.

    Returns a dict of floats. Always (:data:`ADVANTAGE_KEYS`):
        ``baseline_differs_frac``: share of valid tokens whose implied baseline ``B_t = R - A_t`` lies further from
        the equal-weight baseline (the group's mean reward; with ``leave_one_out``, the other valid members' mean)
        than :data:`BASELINE_TOLERANCE` times the group's reward standard deviation (plus 1e-6 relative, for
        rounding): where the energy weighting changed the advantages by more than rounding. It is 0 for unscaled
        GRPO (``scale="none"``), for RLOO (with ``leave_one_out``) and for a tied group. With std scaling, ``A`` is
        not ``R - mean``, so the std-scaled ``grpo`` arm reads above 0.
        ``baseline_shift``: mean over valid tokens of ``|B_t - equal-weight baseline| / group reward std`` (0 in a
        tied group): how far, in units of the reward spread, the weighting moved the baseline. 0 for unscaled GRPO
        and for RLOO (with ``leave_one_out``).
        ``lone_token_frac``: share of valid tokens at an aligned position that no other valid member of the group
        reaches: where OTB's ``tail`` rule sets the baseline (the group cannot estimate one there).
        ``advantage_mean``, ``advantage_std``, ``advantage_abs_max``: over valid tokens.
    With a proxy, also (:data:`PROXY_KEYS`):
        ``proxy_mean``, ``proxy_max``: w_t over valid tokens.
        ``energy_last_mean``, ``energy_last_max``: W at each valid sequence's last token (= sum_t w_t).
        ``total_power``: ``mean_i(Abar_i^2 W_i)`` with Abar_i the token mean of A and W_i = sum_t w_t,
        the reference's variance proxy, in logit-gradient units (the proxy's, not parameter space: it is not
        comparable with ``grad_norm``, so no noise estimate is formed from the two).
    A batch without a valid token gives 0.0 for every key.
    """
    keys = [k for k in _ORDER if proxy is not None or k in ADVANTAGE_KEYS]
    valid = valid_rows(rewards, mask)
    m = mask.bool() & valid[:, None]
    mf = m.to(torch.float32)
    R = torch.where(valid, rewards.float(), torch.zeros_like(rewards, dtype=torch.float32))
    A = advantages.float() * mf
    n_tokens = mf.sum()
    if n_tokens == 0:
        return dict.fromkeys(keys, 0.0)

    # Every statistic as a 0-d tensor, read back with one .tolist() (one sync instead of nine).
    vf = valid.to(torch.float32)
    n_valid = vf.sum()
    gid, G = group_index(group_ids)
    members = group_sum(vf, gid, G).clamp(min=1)
    group_mean = (group_sum(R, gid, G) / members)[gid]
    spread = (group_sum((R - group_mean).pow(2) * vf, gid, G) / members).sqrt()[gid]
    tolerance = BASELINE_TOLERANCE * spread + 1e-6 * (1 + group_mean.abs())
    equal = group_mean  # the baseline with equal weights: the group's mean, or the others' (leave-one-out)
    if leave_one_out:
        others = (members[gid] - vf).clamp(min=1)
        equal = torch.where(valid, (group_sum(R, gid, G)[gid] - R) / others, group_mean)
    baseline = R[:, None] - A
    distance = (baseline - equal[:, None]).abs()
    differs = (distance > tolerance[:, None]) & m
    relative = torch.where(
        spread[:, None] > 0, distance / spread.clamp(min=torch.finfo(spread.dtype).tiny)[:, None], 0.0
    )
    a_mean = A.sum() / n_tokens
    aligned = m
    if align == "valid":  # the k-th masked-in token of every member shares aligned position k
        aligned = torch.arange(m.shape[1], device=m.device)[None, :] < m.sum(dim=1, keepdim=True)
    active = group_sum(aligned.to(torch.float32), gid, G)[gid]
    stats = {
        "baseline_differs_frac": differs.sum() / n_tokens,
        "baseline_shift": (relative * mf).sum() / n_tokens,
        "lone_token_frac": (aligned & (active == 1)).sum() / n_tokens,
        "advantage_mean": a_mean,
        "advantage_std": (((A - a_mean) * mf).pow(2).sum() / n_tokens).sqrt(),
        "advantage_abs_max": A.abs().max(),
    }
    if proxy is not None:
        w = torch.where(m, proxy.float(), torch.zeros_like(A))
        energy_row = w.sum(dim=1)
        a_bar = A.sum(dim=1) / mf.sum(dim=1).clamp(min=1)
        neg_inf = torch.tensor(float("-inf"), device=A.device)
        stats["proxy_mean"] = w.sum() / n_tokens
        stats["proxy_max"] = torch.where(m, w, neg_inf).max()
        stats["energy_last_mean"] = (energy_row * vf).sum() / n_valid
        stats["energy_last_max"] = torch.where(valid, energy_row, neg_inf).max()
        stats["total_power"] = (a_bar.pow(2) * energy_row * vf).sum() / n_valid
    return dict(zip(keys, torch.stack([stats[k] for k in keys]).tolist()))
