"""The Optimal Token Baseline (Li et al. 2026, arXiv 2602.07078): token-level, energy-weighted advantages.

With outcome rewards, G_t^(i) = R_i on every token, and per group of completions i of one prompt::

    W_t^(i) = sum_{j<=t} w_j^(i) m_j^(i)                       (realized energy)
    B_t     = sum_i R_i W_t^(i) m_t^(i) / (sum_i W_t^(i) m_t^(i) + eps)
    A_t^(i) = (R_i - B_t) m_t^(i)

Shapes: ``rewards [B]`` (NaN = unscorable), ``proxy [B, T]`` w_t (see :mod:`trl_otb.core.proxy`), ``mask [B, T]``,
``group_ids [B]``, optional ``is_weights [B, T]`` or ``[B, 1]``; the result is ``[B, T]``. A row is *valid* when
its reward is finite and its mask is not all 0; invalid rows leave their group and get advantage 0.

The specification is :func:`trl_otb.core.spec.reference_otb`: the same contract as plain loops over groups and
positions, the rules (singleton groups, the tail rule, leave-one-out) written out one by one. This module computes
it on whole tensors, one group reduction per sum, and is tested against that specification on random inputs.

One computation, two outputs: :func:`otb_terms` returns the advantages with the baseline and energy they came
from; :func:`otb_advantages` returns the advantages only.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .checks import check_inputs, check_reward_range, raise_overflow
from .groups import group_index, group_max, group_sum, left_compact, scatter_back, valid_rows
from .proxy import compute_dtype

__all__ = ["ALIGNS", "TAILS", "OTBTerms", "otb_advantages", "otb_terms", "token_weights"]

TAILS = ("zero", "none")
ALIGNS = ("position", "valid")


@dataclass
class OTBTerms:
    """Intermediate OTB tensors, all ``[B, T]`` in the original (unaligned) token positions.

    advantages: A_t = (R - B_t) m_t.  baseline: B_t (0 where m_t = 0).  energy: W_t (0 where m_t = 0).
    """

    advantages: torch.Tensor
    baseline: torch.Tensor
    energy: torch.Tensor


def otb_advantages(
    rewards: torch.Tensor,
    proxy: torch.Tensor,
    mask: torch.Tensor,
    group_ids: torch.Tensor,
    *,
    eps: float = 1e-8,
    tail: str = "zero",
    is_weights: torch.Tensor | None = None,
    align: str = "position",
    leave_one_out: bool = False,
) -> torch.Tensor:
    """Optimal Token Baseline advantages (the formula in this module's docstring).

    No division by a reward std (raw advantages, like Dr.GRPO).

    Args:
        rewards: ``[B]``; NaN rows are excluded from their group and get advantage 0.
        proxy: ``[B, T]`` w_t >= 0 (ignored where mask is 0).
        mask: ``[B, T]``; rows that are all 0 are excluded.
        group_ids: ``[B]`` integer ids, in any order.
        eps: added to the baseline's denominator.
        tail: ``"zero"``: when one valid member is strictly the longest of its group, its baseline
            is 0 past the second-longest length (lengths count masked tokens), where it would
            otherwise equal its own reward. ``"none"``: keep the baseline as computed.
        is_weights: ``[B, T]`` or ``[B, 1]`` clipped importance ratios rho_bar; then
            w_t <- w_t rho_bar_t^2 (off-policy OTB).
        align: ``"position"`` compares members at the same completion index; ``"valid"`` at their
            k-th masked-in token, so tool-output holes do not misalign turns.
        leave_one_out: member i's baseline uses the other members only,
            ``B_t^(-i) = sum_{j!=i} R_j W_t^(j) m_t^(j) / (sum_{j!=i} W_t^(j) m_t^(j) + eps)``;
            where no other member is active at t, the baseline is 0 (advantage R_i). ``tail`` has
            no effect then: a member alone past the others already gets baseline 0.

    A group with exactly one valid member gets baseline 0 (advantage R_i on its tokens).

    Returns:
        ``[B, T]`` advantages in fp32 (fp64 when ``proxy`` is fp64), finite for finite inputs.
    """
    p = _prepare(rewards, proxy, mask, group_ids, eps=eps, tail=tail, is_weights=is_weights, align=align)
    baseline = _baseline(p, eps, tail, leave_one_out)  # a new tensor, used once: the advantages may overwrite it
    return p.unalign(baseline.neg_().add_(p.rewards[:, None]).mul_(p.mask))


def otb_terms(
    rewards, proxy, mask, group_ids, *, eps=1e-8, tail="zero", is_weights=None, align="position", leave_one_out=False
) -> OTBTerms:
    """OTB advantages with the baseline and energy they came from. Arguments (and types) as :func:`otb_advantages`."""
    p = _prepare(rewards, proxy, mask, group_ids, eps=eps, tail=tail, is_weights=is_weights, align=align)
    baseline = _baseline(p, eps, tail, leave_one_out)
    return OTBTerms(
        advantages=p.unalign((p.rewards[:, None] - baseline) * p.mask),
        baseline=p.unalign(baseline * p.mask),
        energy=p.unalign(p.energy),
    )


@dataclass
class _Prepared:
    """One OTB call's validated inputs in the compute dtype, in aligned positions (compacted for align="valid")."""

    rewards: torch.Tensor  # [B] R_i, 0 on invalid rows
    valid: torch.Tensor  # [B] bool
    lengths: torch.Tensor  # [B] masked-in tokens, 0 on invalid rows
    mask: torch.Tensor  # [B, T] float m_t, 0 on invalid rows
    energy: torch.Tensor  # [B, T] W_t, 0 where m_t = 0
    index: torch.Tensor | None  # [B, T] the compaction index (align="valid"), else None
    gid: torch.Tensor  # [B] dense group ids
    num_groups: int

    def unalign(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` [B, T] back in the original token positions."""
        return x if self.index is None else scatter_back(x, self.index)


def _prepare(rewards, proxy, mask, group_ids, *, eps, tail, is_weights, align) -> _Prepared:
    if tail not in TAILS:
        raise ValueError(f"tail must be one of {TAILS}, got {tail!r}.")
    if align not in ALIGNS:
        raise ValueError(f"align must be one of {ALIGNS}, got {align!r}.")
    if eps < 0:
        raise ValueError(f"eps must be >= 0, got {eps}.")
    m = check_inputs(rewards, proxy, mask, group_ids, is_weights)
    dtype = compute_dtype(proxy)
    check_reward_range(rewards, dtype)
    valid = valid_rows(rewards, m)
    m = m & valid[:, None]
    w = token_weights(proxy, m, is_weights, dtype)  # w_t rho_t^2, 0 off the mask (selected, never multiplied)
    index = None
    if align == "valid":
        w, index = left_compact(w, m)
        m = torch.arange(w.shape[1], device=w.device)[None, :] < m.sum(dim=1, keepdim=True)
    energy = w.cumsum_(dim=1)
    # w is 0 off the mask, so the row totals (the last cumulative sums) are finite exactly when every w_t is.
    if energy.numel() and not bool(torch.isfinite(energy[:, -1]).all()):
        if is_weights is not None:
            raise_overflow()
        raise ValueError("the proxy's sum over a completion overflows; the proxy is a per-token weight (w_t <= 2).")
    mf = m.to(dtype)
    energy.mul_(mf)
    R = torch.where(valid, rewards.to(dtype), torch.zeros((), dtype=dtype, device=proxy.device))
    gid, G = group_index(group_ids)
    return _Prepared(R, valid, mf.sum(dim=1), mf, energy, index, gid, G)


def token_weights(proxy, m, is_weights, dtype) -> torch.Tensor:
    """w_t on masked-in tokens (times rho_bar_t^2 with importance weights), 0 elsewhere; ``m`` is the bool mask.

    Selects rather than multiplies, so values on masked-out tokens (inf, NaN) never reach the sums. The product
    w * rho^2 may overflow: the caller checks it (OTB through its cumulative sums).
    """
    zero = torch.zeros((), dtype=dtype, device=proxy.device)
    if is_weights is None:
        return torch.where(m, proxy.to(dtype), zero)
    w = is_weights.to(dtype).expand_as(proxy).square()  # a new tensor: the in-place op below touches only it
    w.mul_(proxy.to(dtype))
    return torch.where(m, w, zero)


def _safe_divide(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    """num / den, and 0 where den is 0 (then no member carries energy, so num is 0 too)."""
    return num / torch.where(den == 0, torch.ones_like(den), den)


def _baseline(p: _Prepared, eps: float, tail: str, leave_one_out: bool) -> torch.Tensor:
    """B_t per row, ``[B, T]`` aligned (not yet masked)."""
    if leave_one_out:
        return _leave_one_out_baseline(p, eps)
    baseline = _group_baseline(p, eps)
    if tail == "zero":
        _zero_lone_tails(p, baseline)
    return baseline


def _group_baseline(p: _Prepared, eps: float) -> torch.Tensor:
    """The group's B_t broadcast to its rows; a singleton group's is 0."""
    gid, G = p.gid, p.num_groups
    den = group_sum(p.energy, gid, G)
    num = group_sum(p.energy * p.rewards[:, None], gid, G)
    n_valid = group_sum(p.valid.to(den.dtype), gid, G)
    # Per group ([G, T]) before broadcasting to rows: a singleton group's baseline is 0.
    zero = torch.zeros((), dtype=den.dtype, device=den.device)
    return torch.where(n_valid[:, None] == 1, zero, _safe_divide(num, den + eps))[gid]


def _zero_lone_tails(p: _Prepared, baseline: torch.Tensor) -> None:
    """tail="zero", in place: a member strictly the longest of its group gets baseline 0 past the second-longest."""
    gid, G, lengths = p.gid, p.num_groups, p.lengths
    longest = group_max(lengths, gid, G)[gid]
    is_longest = p.valid & (lengths == longest)
    unique_longest = group_sum(is_longest.to(lengths.dtype), gid, G)[gid] == 1
    second = group_max(torch.where(is_longest, torch.zeros_like(lengths), lengths), gid, G)[gid]
    # At most one row per group is alone at its tail: edit those rows only.
    rows = torch.nonzero(is_longest & unique_longest).squeeze(1)
    if rows.numel():
        positions = torch.arange(baseline.shape[1], device=baseline.device, dtype=baseline.dtype)[None, :]
        zero = torch.zeros((), dtype=baseline.dtype, device=baseline.device)
        baseline[rows] = torch.where(positions >= second[rows, None], zero, baseline[rows])


def _leave_one_out_baseline(p: _Prepared, eps: float) -> torch.Tensor:
    """B_t^(-i) from the other members of i's group; 0 where no other member is active at t."""
    gid, G = p.gid, p.num_groups
    # Sums in fp64 so that subtracting a member's own share does not cancel catastrophically.
    weighted = (p.rewards[:, None] * p.energy).double()
    energy = p.energy.double()
    num = group_sum(weighted, gid, G)[gid] - weighted
    den = group_sum(energy, gid, G)[gid] - energy
    others = group_sum(p.mask, gid, G)[gid] - p.mask
    return torch.where(others > 0, _safe_divide(num, den + eps), torch.zeros_like(num)).to(p.energy.dtype)
