"""The Optimal Token Baseline (Li et al. 2026, arXiv 2602.07078): token-level, energy-weighted advantages.

With outcome rewards, G_t^(i) = R_i on every token, and per group of completions i of one prompt::

    W_t^(i) = sum_{j<=t} w_j^(i) m_j^(i)                       (realized energy)
    B_t     = sum_i R_i W_t^(i) m_t^(i) / (sum_i W_t^(i) m_t^(i) + eps)
    A_t^(i) = (R_i - B_t) m_t^(i)

With eps = 0, at a position where every member is active, sum_i W_t^(i) A_t^(i) = 0: the advantages are zero-sum
under the energy weights, not unweighted as GRPO's are. A low-reward member with high energy pulls B_t below the
group's mean, so the members that share a behaviour get a net push (docs/benchmarks.md, the first-step studies).

Self-inclusion, an exact identity: with eps = 0 and lambda_t^(i) = W_t^(i) / sum_j W_t^(j) m_t^(j) (member i's
own share of the group's energy at t), wherever another member is active::

    A_t^(i) = R_i - B_t = (1 - lambda_t^(i)) (R_i - B_t^(-i))

with B_t^(-i) the leave-one-out baseline (``leave_one_out=True``), for every tail (``"zero"`` only on masks without
holes: it forces B = 0 by length). GRPO is the same formula with lambda = 1/N, an exact rescale; here lambda
depends on the member's own tokens, so the shrink biases the gradient's direction.

Shapes: ``rewards [B]`` (NaN = unscorable), ``proxy [B, T]`` w_t (see :mod:`trl_otb.core.proxy`), ``mask [B, T]``,
``group_ids [B]``, optional ``is_weights [B, T]`` or ``[B, 1]``; the result is ``[B, T]``. A row is *valid* when
its reward is finite and its mask is not all 0; invalid rows leave their group and get advantage 0.

Where a group cannot estimate B_t (a position where one member alone is active: a member's tail past every other
member's end, a whole group of one valid member, or under leave-one-out a position where no other member is
active), ``tail`` chooses the baseline:

- offset-dependent, kept bit for bit: ``"zero"`` (the reference, verl's rule: B_t = 0, so A = R there, whatever the
  reward's zero means; also a group of one valid member and leave-one-out's lone positions get B = 0) and ``"none"``
  (the tail keeps the computed B_t ~ R_i, so A ~ 0; a group of one valid member and leave-one-out still get B = 0);
- shift-invariant (:data:`SHIFT_INVARIANT_TAILS`): the rewards are first centred in their group,
  ``R~_i = (R_i - min_g R) - mean_g(R - min_g R)`` (exact zeros when a group's rewards tie), the baseline is formed
  from R~, and a lone position gets ``"zero_advantage"`` (A = 0) or ``"others_mean"`` (the plain mean reward of the
  *other* valid members, RLOO's baseline, with or without leave-one-out). A group of one valid member gets A = 0 in
  each. Then A(R + c) = A(R), A(aR) = a A(R) for a > 0, up to rounding, and a tie gives A = 0 exactly.
  The shift-invariant fallbacks that no measurement supported were removed after 0.2.0 (:data:`REMOVED_TAILS`).

The defaults (``OTBConfig``'s) are leave-one-out with ``"others_mean"`` and ``"ess"`` shrinkage: exactly unbiased
and shift-invariant. ``leave_one_out=False, tail="zero"`` is verl's reference.

Exactly unbiased: ``leave_one_out=True`` with any tail but ``"zero_advantage"`` forms member i's baseline from the
other members only (whether a position is lone is decided by the others' activity), so E[s_t b_t] = 0.
``"zero_advantage"`` is not: its lone baseline is the member's own R_i, at positions set by its own length.

``shrinkage="ess"`` (leave-one-out with ``"others_mean"`` only) shrinks the others' energy-weighted baseline toward
their plain mean by its Kish effective sample size, still a function of the others only (:mod:`.shrinkage`).

The specification is :func:`trl_otb.core.spec.reference_otb`: the same contract as plain loops over groups and
positions, the rules (singleton groups, the tail rule, leave-one-out, the fallbacks) written out one by one. This module computes
it on whole tensors, one group reduction per sum, and is tested against that specification on random inputs.

One computation, two outputs: :func:`otb_terms` returns the advantages with the baseline and energy they came
from; :func:`otb_advantages` returns the advantages only.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .checks import check_inputs, check_reward_range, raise_overflow
from .groups import above_group_min, group_index, group_max, group_sum, left_compact, scatter_back, valid_rows
from .proxy import compute_dtype
from .shrinkage import ess_shrunk_baseline

__all__ = [
    "ALIGNS",
    "OFFSET_DEPENDENT_TAILS",
    "REMOVED_TAILS",
    "SHIFT_INVARIANT_TAILS",
    "SHRINKAGES",
    "TAILS",
    "OTBTerms",
    "check_tail",
    "otb_advantages",
    "otb_terms",
    "resolve_shrinkage",
    "token_weights",
]

OFFSET_DEPENDENT_TAILS = ("zero", "none")
"""The reference rule (``"zero"``, verl's) and the tail rule off (``"none"``), both kept bit for bit: a forced
baseline of 0 makes A = R at those positions, so adding a constant to every reward changes the advantages there."""
SHIFT_INVARIANT_TAILS = ("zero_advantage", "others_mean")
"""Fallbacks that are themselves shift-equivariant: with them OTB's advantages do not move when a constant is added
to every reward (see this module's docstring)."""
TAILS = OFFSET_DEPENDENT_TAILS + SHIFT_INVARIANT_TAILS
REMOVED_TAILS = {
    "group_mean": "with leave-one-out it gave the same advantages as 'others_mean', and no study trained it without",
    "sequence_baseline": "study 2's rule disqualified it (auc below TRL's GRPO's at the high learning rate), and no "
    "later study carried it",
    "last_baseline": "no training study ran it",
}
"""Tails that 0.2.0 had and later versions removed, each with why (the studies are in research/): asking for one
raises a ValueError that says what to use instead."""
ALIGNS = ("position", "valid")
SHRINKAGES = ("none", "ess")
"""``leave_one_out``'s baseline as formed (``"none"``), or shrunk toward the others' mean by its ESS (``"ess"``)."""


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
    tail: str = "others_mean",
    is_weights: torch.Tensor | None = None,
    align: str = "position",
    leave_one_out: bool = True,
    shrinkage: str | None = None,
) -> torch.Tensor:
    """Optimal Token Baseline advantages (the formula in this module's docstring).

    No division by a reward std (raw advantages, like Dr.GRPO).

    Args:
        rewards: ``[B]``; NaN rows are excluded from their group and get advantage 0.
        proxy: ``[B, T]`` w_t >= 0 (ignored where mask is 0).
        mask: ``[B, T]``; rows that are all 0 are excluded.
        group_ids: ``[B]`` integer ids, in any order.
        eps: added to the baseline's denominator.
        tail: the baseline where a group cannot estimate one (one member alone at a position). The default,
            ``"others_mean"`` (``OTBConfig``'s): the other valid members' plain mean (RLOO's baseline);
            ``"zero_advantage"`` gives advantage 0 there; both work on group-centred rewards (this module's
            docstring), and a group with one valid member gets advantage 0 under each.
            ``"zero"`` is verl's reference rule, kept bit for bit: when one valid member is strictly the longest of
            its group, its baseline is 0 past the second-longest length (lengths count masked tokens).
            ``"none"``: keep the baseline as computed. Both are offset-dependent (A = R where B is forced to 0).
        is_weights: ``[B, T]`` or ``[B, 1]`` clipped importance ratios rho_bar; then
            w_t <- w_t rho_bar_t^2 (off-policy OTB).
        align: ``"position"`` compares members at the same completion index; ``"valid"`` at their
            k-th masked-in token, so tool-output holes do not misalign turns.
        leave_one_out: (default ``True``, ``OTBConfig``'s) member i's baseline uses the other members only,
            ``B_t^(-i) = sum_{j!=i} R_j W_t^(j) m_t^(j) / (sum_{j!=i} W_t^(j) m_t^(j) + eps)``;
            where no other member is active at t, the baseline is 0 (advantage R_i) with ``"zero"`` or ``"none"``
            (which then act alike), and the ``tail`` fallback (over the other members) with the others.
        shrinkage: ``"ess"`` shrinks the leave-one-out baseline toward the others' plain mean by its effective
            sample size (this module's docstring); needs ``leave_one_out=True`` and ``tail="others_mean"``.
            ``None`` (the default) is ``"ess"`` where it applies and ``"none"`` elsewhere
            (:func:`resolve_shrinkage`), so ``leave_one_out=False`` alone gives Li et al.'s self-inclusive OTB.

    With ``"zero"`` or ``"none"`` a group with exactly one valid member gets baseline 0 (advantage R_i on its
    tokens); with the shift-invariant tails it gets advantage 0.

    Returns:
        ``[B, T]`` advantages in fp32 (fp64 when ``proxy`` is fp64), finite for finite inputs.
    """
    shrinkage = resolve_shrinkage(shrinkage, tail, leave_one_out)
    p = _prepare(rewards, proxy, mask, group_ids, eps=eps, tail=tail, is_weights=is_weights, align=align)
    baseline = _baseline(
        p, eps, tail, leave_one_out, shrinkage
    )  # a new tensor, used once: the advantages may overwrite it
    return p.unalign(baseline.neg_().add_(p.rewards[:, None]).mul_(p.mask))


def otb_terms(
    rewards,
    proxy,
    mask,
    group_ids,
    *,
    eps=1e-8,
    tail="others_mean",
    is_weights=None,
    align="position",
    leave_one_out=True,
    shrinkage=None,
) -> OTBTerms:
    """OTB advantages with the baseline and energy they came from. Arguments (and types) as :func:`otb_advantages`."""
    shrinkage = resolve_shrinkage(shrinkage, tail, leave_one_out)
    p = _prepare(rewards, proxy, mask, group_ids, eps=eps, tail=tail, is_weights=is_weights, align=align)
    baseline = _baseline(p, eps, tail, leave_one_out, shrinkage)
    return OTBTerms(
        advantages=p.unalign((p.rewards[:, None] - baseline) * p.mask),
        baseline=p.unalign((baseline + p.center[:, None]) * p.mask),
        energy=p.unalign(p.energy),
    )


@dataclass
class _Prepared:
    """One OTB call's validated inputs in the compute dtype, in aligned positions (compacted for align="valid")."""

    rewards: torch.Tensor  # [B] R_i (group-centred R~_i with a shift-invariant tail), 0 on invalid rows
    center: torch.Tensor  # [B] what was subtracted from R_i (0 unless the tail is shift-invariant)
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


def resolve_shrinkage(shrinkage: str | None, tail: str, leave_one_out: bool) -> str:
    """``shrinkage`` checked against ``tail`` and ``leave_one_out``; ``None`` is ``"ess"`` where it applies
    (``leave_one_out=True`` with ``tail="others_mean"``) and ``"none"`` elsewhere."""
    if shrinkage is None:
        return "ess" if leave_one_out and tail == "others_mean" else "none"
    if shrinkage not in SHRINKAGES:
        raise ValueError(f"shrinkage must be one of {SHRINKAGES}, got {shrinkage!r}.")
    if shrinkage != "none" and not (leave_one_out and tail == "others_mean"):
        raise ValueError(
            f"shrinkage={shrinkage!r} shrinks the leave-one-out baseline toward the other members' mean: it needs "
            f"leave_one_out=True and tail='others_mean' (got leave_one_out={leave_one_out}, tail={tail!r}). Set "
            "both, or shrinkage='none'."
        )
    return shrinkage


def check_tail(tail: str, name: str = "tail") -> None:
    """Raise a ValueError for a tail OTB does not have, naming the removed ones' replacement."""
    if tail in REMOVED_TAILS:
        raise ValueError(
            f"{name}={tail!r} was removed after trl-otb 0.2.0: {REMOVED_TAILS[tail]}. Choose one of {TAILS} "
            "(docs/options.md#otb_tail), or pin trl-otb==0.2.0 to keep it."
        )
    if tail not in TAILS:
        raise ValueError(f"unknown {name}={tail!r}; choose one of {list(TAILS)}.")


def _prepare(rewards, proxy, mask, group_ids, *, eps, tail, is_weights, align) -> _Prepared:
    check_tail(tail)
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
    center = torch.zeros_like(R)
    if tail in SHIFT_INVARIANT_TAILS:
        R, center = _centre(R, valid, gid, G)
    return _Prepared(R, center, valid, mf.sum(dim=1), mf, energy, index, gid, G)


def _centre(R: torch.Tensor, valid: torch.Tensor, gid: torch.Tensor, G: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``R~ = (R - min_g R) - mean_g(R - min_g R)`` over each group's valid rows, and ``R - R~``; 0 on invalid rows.

    Subtracting a member's own value first makes a tie exactly 0 (a plain mean of equal floats need not equal
    them), and the centred rewards no longer carry the reward's offset into any later rounding."""
    d = above_group_min(R, valid, gid, G)
    n_valid = group_sum(valid.to(R.dtype), gid, G)
    mean = group_sum(d, gid, G) / n_valid.clamp(min=1)
    centred = torch.where(valid, d - mean[gid], torch.zeros_like(R))
    return centred, torch.where(valid, R - centred, torch.zeros_like(R))


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


def _baseline(p: _Prepared, eps: float, tail: str, leave_one_out: bool, shrinkage: str) -> torch.Tensor:
    """B_t per row, ``[B, T]`` aligned (not yet masked); in centred coordinates with a shift-invariant tail."""
    if tail in SHIFT_INVARIANT_TAILS:
        return _fallback_baseline(p, eps, tail, leave_one_out, shrinkage)
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
    baseline, shared = _weighted_mean(p, eps, leave_one_out=True)
    return torch.where(shared, baseline, torch.zeros_like(baseline))


def _weighted_mean(p: _Prepared, eps: float, leave_one_out: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The energy-weighted mean reward at each aligned position, ``[B, T]`` per row (over the whole group, or over
    the other members with ``leave_one_out``), and ``shared`` ``[B, T]`` bool: another member is active there.

    Leave-one-out sums in fp64, so that subtracting a member's own share does not cancel catastrophically."""
    gid, G = p.gid, p.num_groups
    weighted, energy = p.rewards[:, None] * p.energy, p.energy
    if leave_one_out:
        weighted, energy = weighted.double(), energy.double()
        num = group_sum(weighted, gid, G)[gid] - weighted
        den = group_sum(energy, gid, G)[gid] - energy
    else:
        num = group_sum(weighted, gid, G)[gid]
        den = group_sum(energy, gid, G)[gid]
    shared = (group_sum(p.mask, gid, G)[gid] - p.mask) > 0
    return _safe_divide(num, den + eps).to(p.energy.dtype), shared


def _fallback_baseline(p: _Prepared, eps: float, tail: str, leave_one_out: bool, shrinkage: str) -> torch.Tensor:
    """B~_t on centred rewards, with the ``tail`` fallback wherever no other member is active (``[B, T]``).

    ``others`` counts, at each aligned position of row i, the group's other active members: the pooled baseline
    needs one (then two members share the position), leave-one-out's needs one too (its sums exclude row i)."""
    gid, G, R = p.gid, p.num_groups, p.rewards
    baseline, shared = _weighted_mean(p, eps, leave_one_out)
    if tail == "zero_advantage":
        lone = R[:, None].expand_as(baseline)
    else:  # others_mean; a group of one valid member has no other (R~ = 0 there: A = 0)
        n_others = group_sum(p.valid.to(R.dtype), gid, G)[gid] - p.valid.to(R.dtype)
        others_mean = (group_sum(R, gid, G)[gid] - R) / n_others.clamp(min=1)
        lone = others_mean[:, None].expand_as(baseline)
        if shrinkage == "ess":
            baseline = ess_shrunk_baseline(baseline, lone, p.energy, gid, G)
    return torch.where(shared, baseline, lone)
