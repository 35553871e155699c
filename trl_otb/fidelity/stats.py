"""How well a proxy stands in for the exact norms: rank statistics and the baselines they lead to.

Metrics per proxy (:class:`ProxyFidelity`), over the masked tokens of the batch:
``token_spearman``/``token_pearson`` (w_t vs ||s_t||^2), ``energy_spearman`` (W_t from the proxy
vs from the exact norms), ``sequence_spearman`` (total energy W_L per sequence) and
``baseline_rel_diff = ||B_proxy - B_exact||_2 / ||B_exact||_2`` with ``B = otb_terms(...).baseline``, the group's
energy-weighted baseline over all its members (Li et al.'s: ``leave_one_out=False, tail="zero"``)
(for ``length``: OPO's baseline, from :func:`trl_otb.core.opo_advantages`). A constant proxy has no token
ranking: its token correlations are NaN.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..core import opo_advantages, otb_terms

__all__ = ["ProxyFidelity", "fidelity_metrics", "pearson", "spearman"]


def _average_ranks(x: torch.Tensor) -> torch.Tensor:
    """0-based ranks of a 1-D tensor, ties sharing their average rank (as scipy's ``rankdata``)."""
    sorted_x, order = torch.sort(x)
    _, inverse, counts = torch.unique_consecutive(sorted_x, return_inverse=True, return_counts=True)
    ends = torch.cumsum(counts, 0).double()
    average = ends - (counts.double() + 1) / 2
    ranks = torch.empty(x.numel(), dtype=torch.float64)
    ranks[order] = average[inverse]
    return ranks


def pearson(x: torch.Tensor, y: torch.Tensor) -> float:
    """Pearson correlation of two 1-D tensors in fp64; NaN when either is constant or has < 2 values."""
    x, y = x.double().flatten(), y.double().flatten()
    if x.numel() < 2:
        return float("nan")
    x, y = x - x.mean(), y - y.mean()
    denom = x.norm() * y.norm()
    return float((x @ y) / denom) if denom > 0 else float("nan")


def spearman(x: torch.Tensor, y: torch.Tensor) -> float:
    """Spearman rank correlation (Pearson of average ranks); NaN when either input is constant."""
    x, y = x.flatten(), y.flatten()
    if x.numel() < 2:
        return float("nan")
    return pearson(_average_ranks(x), _average_ranks(y))


@dataclass
class ProxyFidelity:
    """How well one proxy stands in for the exact ``||s_t||^2`` (see the module docstring)."""

    token_spearman: float
    token_pearson: float
    energy_spearman: float
    sequence_spearman: float
    baseline_rel_diff: float


def _energy(name: str, w: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``[B, T]`` energy: W_t = cumsum of w over masked tokens; for ``length``, L_i on every token."""
    wm = w * mask
    if name == "length":
        return wm.sum(dim=1, keepdim=True).expand_as(wm) * mask
    return torch.cumsum(wm, dim=1) * mask


def _baseline(name: str, w: torch.Tensor, mask: torch.Tensor, rewards: torch.Tensor, group_ids: torch.Tensor):
    """``[B, T]`` the baseline the estimator builds from ``w``: OTB's B_t, or for ``length`` OPO's ``R - A``."""
    if name == "length":
        advantages = opo_advantages(rewards, w, mask, group_ids)
        valid = torch.isfinite(rewards)[:, None] & mask
        return torch.where(valid, rewards[:, None] - advantages, torch.zeros_like(advantages))
    return otb_terms(rewards, w, mask, group_ids, tail="zero", leave_one_out=False).baseline


def _rel_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    num, den = float((a.double() - b.double()).norm()), float(b.double().norm())
    if den == 0:
        return 0.0 if num == 0 else float("inf")
    return num / den


def fidelity_metrics(
    exact: torch.Tensor,
    proxies: dict[str, torch.Tensor],
    mask: torch.Tensor,
    rewards: torch.Tensor,
    group_ids: torch.Tensor,
) -> dict[str, ProxyFidelity]:
    """Compare each proxy ``[B, T]`` with the exact norms ``[B, T]`` over ``mask`` (see :class:`ProxyFidelity`).

    ``rewards [B]`` and ``group_ids [B]`` build the OTB baselines that ``baseline_rel_diff`` compares
    (``otb_terms`` with default options, from the proxy and from the exact norms).
    """
    m = mask.bool()
    rows = m.any(dim=1)
    exact = exact.float()
    e_energy = _energy("exact", exact, m)
    e_baseline = _baseline("exact", exact, m, rewards, group_ids)
    out = {}
    for name, w in proxies.items():
        w = w.float()
        energy = _energy(name, w, m)
        out[name] = ProxyFidelity(
            token_spearman=spearman(w[m], exact[m]),
            token_pearson=pearson(w[m], exact[m]),
            energy_spearman=spearman(energy[m], e_energy[m]),
            sequence_spearman=spearman((w * m).sum(1)[rows], (exact * m).sum(1)[rows]),
            baseline_rel_diff=_rel_diff(_baseline(name, w, m, rewards, group_ids), e_baseline),
        )
    return out
