"""The specification of OTB: the contract of :func:`trl_otb.otb_advantages` as plain Python loops.

Slow and obvious on purpose: it loops over groups and aligned positions exactly as the contract reads
(docs/method.md, and ``otb.py``'s docstring), with no vectorisation, no buffer reuse and no fast path. The tensor
implementation in :mod:`trl_otb.core.otb` is tested against it on random inputs (``tests/core/test_otb.py``);
read this file first to know what that code computes.

For a group of completions i of one prompt, at an aligned position c (the absolute position with
``align="position"``, the c-th masked-in token with ``align="valid"``)::

    W_c^(i) = sum_{c' <= c} w_{c'}^(i) rho_{c'}^(i)^2          (energy; rho = 1 without importance weights)
    B_c     = sum_{j active at c} R_j W_c^(j) / (sum_{j active at c} W_c^(j) + eps)
    A^(i)   = R_i - B_c   at member i's token of coordinate c, 0 elsewhere

With ``tail="zero"`` or ``"none"`` (offset-dependent), three rules set B to 0 instead: a group with one valid
member; ``tail="zero"``, for the one member that is strictly the longest, from the second-longest length on;
``leave_one_out=True``, where no other member is active (B then sums over the other active members only).

With a shift-invariant tail (``zero_advantage``, ``others_mean``), each group's rewards are centred first,
``R~_i = (R_i - min R) - mean_j (R_j - min R)`` over its valid members, and R~
replaces R everywhere above. Where member i is alone at c (no other member active: the pooled sum would hold i alone,
the leave-one-out sum nothing), its baseline is the fallback:

- ``zero_advantage``: R~_i, so A = 0;
- ``others_mean``: the mean of the other valid members' R~ (with or without leave-one-out); 0 if there is none.

With ``shrinkage="ess"`` (leave-one-out and ``others_mean`` only), where another member is active the baseline is
``(ESS B + Rbar) / (ESS + 1)``: B the others' energy-weighted baseline above, Rbar the others' mean R~, and
``ESS = (sum_j W^(j))^2 / sum_j W^(j)^2`` over the other active members j (0 when that sum of squares is 0).

A row is valid when its reward is finite and its mask is not all 0; an invalid row gets advantage 0 and leaves its
group. A ratio whose denominator is 0 is 0 (then no member carries energy, and its numerator is 0 too).
"""

from __future__ import annotations

import math

__all__ = ["aligned_positions", "reference_otb"]


def aligned_positions(mask_row, align):
    """{aligned coordinate c: absolute position t} for the masked-in tokens of one row."""
    active = [t for t, m in enumerate(mask_row) if m]
    if align == "position":
        return {t: t for t in active}
    return dict(enumerate(active))


def reference_otb(
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
):
    """OTB advantages by loops. Arguments as :func:`trl_otb.otb_advantages`, as nested Python lists (``rewards`` [B],
    ``proxy`` and ``mask`` [B][T], ``group_ids`` [B], ``is_weights`` [B][T] or [B][1] or None).

    Returns ``(advantages, forced)``, both [B][T] lists: ``forced[i][t]`` is True where a rule replaced the estimated
    baseline (with ``zero``/``none``: set it to 0, for a group of one valid member, the tail rule, no other active
    member for leave-one-out; with a shift-invariant tail: the fallback, wherever member i is alone)."""
    if tail not in ("zero", "none", "zero_advantage", "others_mean"):
        raise ValueError(f"reference_otb has no tail {tail!r}")
    if shrinkage is None:  # as the library resolves it
        shrinkage = "ess" if leave_one_out and tail == "others_mean" else "none"
    B = len(rewards)
    T = len(mask[0]) if B else 0
    valid = [math.isfinite(rewards[i]) and any(mask[i]) for i in range(B)]
    pos = [aligned_positions(mask[i], align) for i in range(B)]
    energy = []
    for i in range(B):
        total, W = 0.0, {}
        for c in sorted(pos[i]):
            t = pos[i][c]
            rho = 1.0
            if is_weights is not None:
                rho = is_weights[i][t] if len(is_weights[i]) > 1 else is_weights[i][0]
            total += proxy[i][t] * rho * rho
            W[c] = total
        energy.append(W)
    adv = [[0.0] * T for _ in range(B)]
    forced = [[False] * T for _ in range(B)]
    if tail in ("zero_advantage", "others_mean"):
        _fallback_otb(rewards, group_ids, valid, pos, energy, eps, tail, leave_one_out, shrinkage, adv, forced)
        return adv, forced
    for g in set(group_ids):
        members = [i for i in range(B) if group_ids[i] == g and valid[i]]
        lengths = {i: len(pos[i]) for i in members}
        longest = max(lengths.values(), default=0)
        top = [i for i in members if lengths[i] == longest]
        unique_longest = top[0] if len(top) == 1 else None
        second = max((lengths[i] for i in members if i != unique_longest), default=0)
        for c in range(T):
            active = [i for i in members if c in pos[i]]
            for i in active:
                if leave_one_out:
                    pool = [j for j in active if j != i]
                    zero = not pool
                else:
                    pool = active
                    zero = len(members) == 1 or (tail == "zero" and i == unique_longest and c >= second)
                if zero:
                    b = 0.0
                else:
                    num = sum(rewards[j] * energy[j][c] for j in pool)
                    den = sum(energy[j][c] for j in pool)
                    b = num / (den + eps)
                adv[i][pos[i][c]] = rewards[i] - b
                forced[i][pos[i][c]] = zero
    return adv, forced


def _ratio(num, den):
    return num / den if den != 0 else 0.0


def _fallback_otb(rewards, group_ids, valid, pos, energy, eps, tail, leave_one_out, shrinkage, adv, forced):
    """The shift-invariant tails (module docstring), writing into ``adv`` and ``forced``."""
    for g in set(group_ids):
        members = [i for i in range(len(rewards)) if group_ids[i] == g and valid[i]]
        if not members:
            continue
        low = min(rewards[i] for i in members)
        shifted = {i: rewards[i] - low for i in members}
        mean = sum(shifted.values()) / len(members)
        R = {i: shifted[i] - mean for i in members}
        for i in members:
            others = [j for j in members if j != i]
            others_mean = sum(R[j] for j in others) / len(others) if others else 0.0
            for c in sorted(pos[i]):
                active = [j for j in members if c in pos[j]]
                pool = [j for j in active if j != i] if leave_one_out else active
                alone = len(active) == 1
                if not alone:
                    b = _ratio(sum(R[j] * energy[j][c] for j in pool), sum(energy[j][c] for j in pool) + eps)
                    if shrinkage == "ess":
                        ess = _ratio(sum(energy[j][c] for j in pool) ** 2, sum(energy[j][c] ** 2 for j in pool))
                        b = (ess * b + others_mean) / (ess + 1)
                elif tail == "others_mean":
                    b = others_mean
                else:  # zero_advantage
                    b = R[i]
                adv[i][pos[i][c]] = R[i] - b
                forced[i][pos[i][c]] = alone
