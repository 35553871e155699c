"""Per-step OTB diagnostics (logged under ``otb/``), computed from the tensors the baseline used.

No TRL import. All inputs are the *gathered* generation batch, so every process logs the same values.
"""

from __future__ import annotations

import torch

from .baselines import _group_index, _group_sum

__all__ = ["otb_diagnostics"]


def otb_diagnostics(
    rewards: torch.Tensor,
    advantages: torch.Tensor,
    proxy: torch.Tensor,
    mask: torch.Tensor,
    group_ids: torch.Tensor,
) -> dict[str, float]:
    """Diagnostics of one generation batch.

    Args:
        rewards: ``[B]`` (NaN = unscorable). advantages, proxy, mask: ``[B, T]``. group_ids: ``[B]``.

    Returns a dict of floats:
        ``proxy_mean``, ``proxy_max``: w_t over valid tokens.
        ``energy_last_mean``, ``energy_last_max``: W at each valid sequence's last token (= sum_t w_t).
        ``baseline_differs_frac``: share of valid tokens whose baseline ``B_t = R - A_t`` differs from the
        group's mean reward by more than 1e-6 (0 for GRPO; how far OTB moves away from it).
        ``advantage_mean``, ``advantage_std``, ``advantage_abs_max``: over valid tokens.
        ``total_power``: ``mean_i(Abar_i^2 W_i)`` with Abar_i the token mean of A and W_i = sum_t w_t,
        the reference's variance proxy, in logit-gradient units (the proxy's, not parameter space: it is not
        comparable with ``grad_norm``, so no noise estimate is formed from the two).
    """
    valid = torch.isfinite(rewards) & mask.bool().any(dim=1)
    m = mask.bool() & valid[:, None]
    mf = m.to(torch.float32)
    R = torch.where(valid, rewards.float(), torch.zeros_like(rewards, dtype=torch.float32))
    A = advantages.float() * mf
    w = torch.where(m, proxy.float(), torch.zeros_like(A))
    n_tokens = mf.sum()
    if n_tokens == 0:
        keys = ("proxy_mean", "proxy_max", "energy_last_mean", "energy_last_max", "baseline_differs_frac")
        keys += ("advantage_mean", "advantage_std", "advantage_abs_max", "total_power")
        return dict.fromkeys(keys, 0.0)

    # Every statistic as a 0-d tensor, read back with one .tolist() (one sync instead of nine).
    vf = valid.to(torch.float32)
    n_valid = vf.sum()
    energy_row = w.sum(dim=1)
    gid, G = _group_index(group_ids)
    group_mean = (_group_sum(R, gid, G) / _group_sum(vf, gid, G).clamp(min=1))[gid]
    baseline = R[:, None] - A
    differs = ((baseline - group_mean[:, None]).abs() > 1e-6) & m
    a_mean = A.sum() / n_tokens
    a_bar = A.sum(dim=1) / mf.sum(dim=1).clamp(min=1)
    neg_inf = torch.tensor(float("-inf"), device=A.device)
    stats = torch.stack(
        [
            w.sum() / n_tokens,
            torch.where(m, w, neg_inf).max(),
            (energy_row * vf).sum() / n_valid,
            torch.where(valid, energy_row, neg_inf).max(),
            differs.sum() / n_tokens,
            a_mean,
            (((A - a_mean) * mf).pow(2).sum() / n_tokens).sqrt(),
            A.abs().max(),
            (a_bar.pow(2) * energy_row * vf).sum() / n_valid,
        ]
    )
    keys = ("proxy_mean", "proxy_max", "energy_last_mean", "energy_last_max", "baseline_differs_frac")
    keys += ("advantage_mean", "advantage_std", "advantage_abs_max", "total_power")
    return dict(zip(keys, stats.tolist()))
