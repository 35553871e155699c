"""Advantage estimators: OTB and the sequence-level baselines it is compared with.

Pure tensor math, no TRL import. Every estimator takes the same inputs and returns token-level
advantages ``[B, T]`` (zero where ``mask`` is 0), so one flag switches between them:

- ``rewards``   ``[B]``    outcome reward R_i; NaN marks an unscorable completion.
- ``proxy``     ``[B, T]`` per-token weight w_t (see :mod:`trl_otb.proxy`), ignored where mask is 0.
- ``mask``      ``[B, T]`` 1 where the token carries gradient.
- ``group_ids`` ``[B]``    integer ids; equal ids = completions of the same prompt.

A row is *valid* when its reward is finite and its mask is not all 0. Invalid rows are excluded
from every baseline and get advantage 0 everywhere. Everything is vectorised: groups are
reduced with ``index_add_`` over ``torch.unique`` ids, never with a Python loop.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .proxy import compute_dtype

__all__ = [
    "ESTIMATORS",
    "OTBTerms",
    "compute_advantages",
    "grpo_advantages",
    "ogb_advantages",
    "opo_advantages",
    "otb_advantages",
    "otb_terms",
    "rloo_advantages",
]

TAILS = ("zero", "none")
ALIGNS = ("position", "valid")
GRPO_SCALES = ("none", "group", "batch")


@dataclass
class OTBTerms:
    """Intermediate OTB tensors, all ``[B, T]`` in the original (unaligned) token positions.

    advantages: A_t = (R - B_t) m_t.  baseline: B_t (0 where m_t = 0).  energy: W_t (0 where m_t = 0).
    """

    advantages: torch.Tensor
    baseline: torch.Tensor
    energy: torch.Tensor


def _check_inputs(rewards, proxy, mask, group_ids, is_weights=None, *, bool_mask: bool = True):
    """Validate the shared inputs.

    Returns the mask as bool (converted once, reused by the caller); with ``bool_mask=False``, whether proxy and
    is_weights are finite and >= 0 everywhere, masked or not (then no bool mask is made unless a check needs it).
    """
    if proxy.dim() != 2:
        raise ValueError(f"proxy must be [B, T], got shape {tuple(proxy.shape)}.")
    B, T = proxy.shape
    if tuple(mask.shape) != (B, T):
        raise ValueError(f"mask must have the proxy's shape {(B, T)}, got {tuple(mask.shape)}.")
    if tuple(rewards.shape) != (B,):
        raise ValueError(f"rewards must be [B] = ({B},), got {tuple(rewards.shape)}.")
    if tuple(group_ids.shape) != (B,):
        raise ValueError(f"group_ids must be [B] = ({B},), got {tuple(group_ids.shape)}.")
    if group_ids.dtype.is_floating_point or group_ids.dtype == torch.bool or group_ids.is_complex():
        raise ValueError(f"group_ids must be an integer tensor, got {group_ids.dtype}.")
    if not proxy.dtype.is_floating_point:
        raise ValueError(f"proxy must be a float tensor, got {proxy.dtype}.")
    if is_weights is not None and (
        is_weights.dim() != 2 or is_weights.shape[0] != B or is_weights.shape[1] not in (1, T)
    ):
        raise ValueError(f"is_weights must be [B, T] or [B, 1] with B={B}, T={T}; got {tuple(is_weights.shape)}.")
    proxy_clean = not (B and T) or _all_clean(proxy)
    weights_clean = is_weights is None or not (B and T) or _all_clean(is_weights)
    m = mask.bool() if bool_mask or not (proxy_clean and weights_clean) else None
    if not proxy_clean and _bad_on_mask(proxy, m):
        if (m & ~torch.isfinite(proxy)).any():
            raise ValueError("proxy has non-finite values on masked-in tokens; check the log-probs it was built from.")
        raise ValueError("proxy must be >= 0 on masked-in tokens (w_t is a squared norm).")
    if not weights_clean and _bad_on_mask(is_weights, m):
        raise ValueError("is_weights must be finite and >= 0 on masked-in tokens (clipped importance ratios).")
    return m if bool_mask else proxy_clean and weights_clean


def _float_mask(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """1.0 where ``mask`` is nonzero (as ``mask.bool()``), else 0.0: one new tensor, whatever the mask's dtype."""
    if mask.dtype == torch.bool:
        return mask.to(dtype)
    return mask.to(dtype, copy=True).ne_(0)


def _all_clean(x: torch.Tensor) -> bool:
    """Whether every value of ``x`` (masked or not) is finite and >= 0: one fused min/max, no new tensor."""
    if not x.numel():
        return True
    lo, hi = torch.aminmax(x)
    return bool((lo >= 0) & (hi < float("inf")))


def _bad_on_mask(x: torch.Tensor, m: torch.Tensor) -> bool:
    """Whether any masked-in value of ``x`` is negative, NaN or infinite.

    Two passes (a select and a fused min/max, which propagates NaN) rather than boolean indexing
    (``x[m]`` costs a nonzero and a gather): this runs on every training step.
    """
    lo, hi = torch.aminmax(torch.where(m, x, torch.zeros((), dtype=x.dtype, device=x.device)))
    return not bool((lo >= 0) & (hi < float("inf")))


def _safe_divide(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    """num / den, and 0 where den is 0 (then no member carries energy, so num is 0 too)."""
    return num / torch.where(den == 0, torch.ones_like(den), den)


def _check_reward_range(rewards: torch.Tensor, dtype: torch.dtype) -> None:
    # R * W must stay finite in the compute dtype: W <= 2T, summed over a group.
    limit = 1e32 if dtype == torch.float32 else 1e300
    finite = rewards[torch.isfinite(rewards)]
    if finite.numel() and finite.abs().max() > limit:
        raise ValueError(
            f"rewards reach {finite.abs().max().item():.3g}, beyond what {dtype} advantages can hold ({limit:g}); "
            "rescale the rewards."
        )


def _token_weights(proxy, m, is_weights, dtype, check=True) -> torch.Tensor:
    """w_t on masked-in tokens (times rho_bar_t^2 with importance weights), 0 elsewhere.

    Selects rather than multiplies, so values on masked-out tokens (inf, NaN) never reach the sums.
    ``check=False`` leaves the overflow check of w * rho^2 to the caller (OTB checks its cumulative sums).
    """
    zero = torch.zeros((), dtype=dtype, device=proxy.device)
    if is_weights is None:
        return torch.where(m, proxy.to(dtype), zero)
    w = is_weights.to(dtype).expand_as(proxy).square()  # a new tensor: the in-place ops below touch only it
    w.mul_(proxy.to(dtype))
    w = torch.where(m, w, zero)
    if check and w.numel() and _bad_on_mask(w, m):
        _raise_overflow()
    return w


def _raise_overflow() -> None:
    raise ValueError("proxy * is_weights**2 overflows; clip the importance ratios (e.g. to <= 10).")


def _valid_rows(rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.isfinite(rewards) & mask.bool().any(dim=1)


def _group_index(group_ids: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Dense ids 0..G-1 for arbitrary (unsorted, non-contiguous) integer group ids."""
    uniq, inverse = torch.unique(group_ids, return_inverse=True)
    return inverse, uniq.numel()


def _group_sum(values: torch.Tensor, gid: torch.Tensor, num_groups: int) -> torch.Tensor:
    """Sum rows of ``values`` ([B] or [B, T]) per group: [G] or [G, T]."""
    out = values.new_zeros((num_groups, *values.shape[1:]))
    return out.index_add_(0, gid, values)


def _group_max(values: torch.Tensor, gid: torch.Tensor, num_groups: int) -> torch.Tensor:
    out = values.new_zeros(num_groups)
    return out.scatter_reduce_(0, gid, values, reduce="amax", include_self=True)


def _left_compact(x: torch.Tensor, m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Move each row's masked-in entries to the front, in order (the k-th valid token -> column k).

    Returns the compacted ``[B, T]`` tensor and the scatter index (T for masked-out positions), which
    :func:`_scatter_back` uses to undo it.
    """
    T = x.shape[1]
    rank = torch.cumsum(m.long(), dim=1) - 1
    index = torch.where(m, rank, torch.full_like(rank, T))
    out = x.new_zeros((x.shape[0], T + 1)).scatter_(1, index, torch.where(m, x, torch.zeros_like(x)))
    return out[:, :T], index


def _scatter_back(x_compact: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    padded = torch.cat([x_compact, x_compact.new_zeros((x_compact.shape[0], 1))], dim=1)
    return padded.gather(1, index)


def otb_terms(
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
) -> OTBTerms:
    """OTB advantages with the baseline and energy they came from. See :func:`otb_advantages`."""
    return _otb(
        rewards,
        proxy,
        mask,
        group_ids,
        eps=eps,
        tail=tail,
        is_weights=is_weights,
        align=align,
        leave_one_out=leave_one_out,
        return_terms=True,
    )


def _otb(
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
    return_terms: bool = True,
) -> OTBTerms | torch.Tensor:
    """OTB's computation; with ``return_terms=False`` only the advantages (fewer passes, no extra tensors).

    Speed notes (this runs on every step, over up to millions of tokens): on CPU a fresh ``[B, T]`` tensor costs
    about as much as the arithmetic on it, and a select (``torch.where``) or a multiply by a *bool* mask several
    times a multiply by a float mask. So the mask is made float once, the inputs are checked with one global
    min/max (the exact masked check runs only when that finds something), and the rest works in place on the
    tensors this function created.
    """
    if tail not in TAILS:
        raise ValueError(f"tail must be one of {TAILS}, got {tail!r}.")
    if align not in ALIGNS:
        raise ValueError(f"align must be one of {ALIGNS}, got {align!r}.")
    if eps < 0:
        raise ValueError(f"eps must be >= 0, got {eps}.")
    fast = _check_inputs(rewards, proxy, mask, group_ids, is_weights, bool_mask=False)
    dtype = compute_dtype(proxy)
    _check_reward_range(rewards, dtype)
    B, T = proxy.shape
    zero = torch.zeros((), dtype=dtype, device=proxy.device)
    mf = _float_mask(mask, dtype)
    lengths = mf.sum(dim=1)
    valid = torch.isfinite(rewards) & (lengths > 0)
    if not bool(valid.all()):
        mf.mul_(valid[:, None].to(dtype))
        lengths = lengths * valid.to(dtype)
    R = torch.where(valid, rewards.to(dtype), zero)

    def cumulative_weights(fast: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(W [B, T], the compaction index with align="valid", else None)."""
        if fast:  # every value finite and >= 0, masked or not: multiplying by the float mask is the select
            w = proxy.to(dtype) * mf
            if is_weights is not None:
                rho = is_weights.to(dtype).expand_as(proxy)
                w.mul_(rho).mul_(rho)
        else:  # inf/NaN on masked-out tokens: they must not reach the sums
            w = _token_weights(proxy, mf.bool(), is_weights, dtype, check=False)
        index = None
        if align == "valid":
            w, index = _left_compact(w, mf.bool())
        return w.cumsum_(dim=1), index

    energy, index = cumulative_weights(fast)
    # w is 0 off the mask, so the row totals (the last cumulative sums) are finite exactly when every w_t is:
    # one check on B numbers instead of a pass over [B, T].
    if B and T and not bool(torch.isfinite(energy[:, -1]).all()) and fast:
        energy, index = cumulative_weights(False)  # a huge masked-out value may have overflowed: use the selects
    if B and T and not bool(torch.isfinite(energy[:, -1]).all()):
        if is_weights is not None:
            _raise_overflow()
        raise ValueError("the proxy's sum over a completion overflows; the proxy is a per-token weight (w_t <= 2).")
    if align == "valid":
        mf = (torch.arange(T, device=proxy.device)[None, :] < lengths[:, None]).to(dtype)
    energy.mul_(mf)  # finite now, so the multiply is the select

    gid, G = _group_index(group_ids)
    if leave_one_out:
        # Sums in fp64 so that subtracting a member's own share does not cancel catastrophically.
        num = _group_sum((R[:, None] * energy).double(), gid, G)[gid] - (R[:, None] * energy).double()
        den = _group_sum(energy.double(), gid, G)[gid] - energy.double()
        others = _group_sum(mf, gid, G)[gid] - mf
        baseline = torch.where(others > 0, _safe_divide(num, den + eps), torch.zeros_like(num)).to(dtype)
    else:
        den = _group_sum(energy, gid, G)
        # R W: in place when the energy is not returned.
        num = _group_sum(energy * R[:, None] if return_terms else energy.mul_(R[:, None]), gid, G)
        n_valid = _group_sum(valid.to(dtype), gid, G)
        # Per group ([G, T]) before broadcasting to rows: a singleton group's baseline is 0.
        group_baseline = torch.where(n_valid[:, None] == 1, zero, _safe_divide(num, den + eps))
        # Without the terms, the energy's buffer is free now: the baseline (then the advantages) reuse it.
        baseline = torch.index_select(group_baseline, 0, gid, out=None if return_terms else energy)
        if tail == "zero":
            longest = _group_max(lengths, gid, G)[gid]
            is_longest = valid & (lengths == longest)
            unique_longest = _group_sum(is_longest.to(dtype), gid, G)[gid] == 1
            second = _group_max(torch.where(is_longest, torch.zeros_like(lengths), lengths), gid, G)[gid]
            # At most one row per group is alone at its tail: edit those rows only.
            rows = torch.nonzero(is_longest & unique_longest).squeeze(1)
            if rows.numel():
                positions = torch.arange(T, device=proxy.device, dtype=dtype)[None, :]
                baseline[rows] = torch.where(positions >= second[rows, None], zero, baseline[rows])

    # The baseline is finite (the reward range is checked; den >= eps, or the quotient is 0): masks multiply.
    if not return_terms:
        advantages = baseline.neg_().add_(R[:, None]).mul_(mf)
        return _scatter_back(advantages, index) if align == "valid" else advantages
    advantages = torch.sub(R[:, None], baseline).mul_(mf)
    baseline.mul_(mf)
    if align == "valid":
        advantages, baseline, energy = (_scatter_back(x, index) for x in (advantages, baseline, energy))
    return OTBTerms(advantages=advantages, baseline=baseline, energy=energy)


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
    """Optimal Token Baseline advantages (Li et al. 2026, arXiv 2602.07078).

    With outcome rewards, G_t^(i) = R_i on every token, and per group::

        W_t^(i) = sum_{j<=t} w_j^(i) m_j^(i)                       (realized energy)
        B_t     = sum_i R_i W_t^(i) m_t^(i) / (sum_i W_t^(i) m_t^(i) + eps)
        A_t^(i) = (R_i - B_t) m_t^(i)

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
    return _otb(
        rewards,
        proxy,
        mask,
        group_ids,
        eps=eps,
        tail=tail,
        is_weights=is_weights,
        align=align,
        leave_one_out=leave_one_out,
        return_terms=False,
    )


def _sequence_advantages(rewards, baseline, mask, valid, dtype):
    """Broadcast per-sequence advantages R_i - b_i onto the masked tokens; 0 for invalid rows."""
    adv = torch.where(valid, rewards.to(dtype) - baseline, torch.zeros_like(baseline))
    return adv[:, None] * mask.to(dtype)


def _weighted_group_baseline(rewards, weights, group_ids, valid, dtype, eps=0.0):
    """b_i = sum_j R_j u_j / (sum_j u_j + eps) over the valid members of i's group; 0 for singletons."""
    R = torch.where(valid, rewards.to(dtype), torch.zeros((), dtype=dtype, device=rewards.device))
    u = torch.where(valid, weights.to(dtype), torch.zeros((), dtype=dtype, device=rewards.device))
    gid, G = _group_index(group_ids)
    num = _group_sum(R * u, gid, G)[gid]
    den = _group_sum(u, gid, G)[gid]
    n_valid = _group_sum(valid.to(dtype), gid, G)[gid]
    safe = torch.where(den + eps > 0, den + eps, torch.ones_like(den))
    return torch.where((n_valid > 1) & (den + eps > 0), num / safe, torch.zeros_like(num))


def grpo_advantages(
    rewards: torch.Tensor,
    proxy: torch.Tensor,
    mask: torch.Tensor,
    group_ids: torch.Tensor,
    *,
    scale: str = "none",
) -> torch.Tensor:
    """GRPO's group-mean baseline, broadcast to tokens: ``A_i = (R_i - mean_g R) / (std + 1e-4)``.

    Mirrors TRL's ``GRPOTrainer``: the mean runs over the group's finite rewards (a row with an
    empty mask still counts, as in TRL), ``std`` is the Bessel-corrected std over the group
    (``scale="group"``) or the whole batch (``scale="batch"``), or no scaling (``"none"``,
    Dr.GRPO). A group (or batch) with a single finite reward gets advantage 0. ``proxy`` is unused.
    """
    if scale not in GRPO_SCALES:
        raise ValueError(f"scale must be one of {GRPO_SCALES}, got {scale!r}.")
    mask = _check_inputs(rewards, proxy, mask, group_ids)
    dtype = compute_dtype(proxy)
    finite = torch.isfinite(rewards)
    R = torch.where(finite, rewards.to(dtype), torch.zeros((), dtype=dtype, device=rewards.device))
    f = finite.to(dtype)
    gid, G = _group_index(group_ids)
    count = _group_sum(f, gid, G)
    mean = (_group_sum(R, gid, G) / count.clamp(min=1))[gid]
    adv = (R - mean) * f
    if scale == "group":
        var = _group_sum(adv * adv, gid, G) / (count - 1).clamp(min=1)
        std = torch.sqrt(var)[gid]
        adv = torch.where(count[gid] > 1, adv / (std + 1e-4), torch.zeros_like(adv))
    elif scale == "batch":
        n = f.sum()
        batch_mean = (R * f).sum() / n.clamp(min=1)
        std = torch.sqrt((((R - batch_mean) * f) ** 2).sum() / (n - 1).clamp(min=1))
        adv = adv / (std + 1e-4) if n > 1 else torch.zeros_like(adv)
    return adv[:, None] * mask.to(dtype)


def rloo_advantages(rewards, proxy, mask, group_ids) -> torch.Tensor:
    """Leave-one-out baseline: ``b_i`` = mean of the other valid members' rewards (0 if there are none).

    Equals ``N / (N - 1)`` times unscaled GRPO on a group of N valid members. ``proxy`` is unused.
    """
    mask = _check_inputs(rewards, proxy, mask, group_ids)
    dtype = compute_dtype(proxy)
    valid = _valid_rows(rewards, mask)
    R = torch.where(valid, rewards.to(dtype), torch.zeros((), dtype=dtype, device=rewards.device))
    gid, G = _group_index(group_ids)
    others = _group_sum(valid.to(dtype), gid, G)[gid] - valid.to(dtype)
    total = _group_sum(R, gid, G)[gid] - R
    baseline = torch.where(others > 0, total / others.clamp(min=1), torch.zeros_like(total))
    return _sequence_advantages(rewards, baseline, mask, valid, dtype)


def opo_advantages(rewards, proxy, mask, group_ids) -> torch.Tensor:
    """Length-weighted baseline ``b = sum_i L_i R_i / sum_i L_i`` (Hao et al. 2025), L_i = masked tokens.

    One value per group; a group with one valid member gets baseline 0. ``proxy`` is unused.
    """
    mask = _check_inputs(rewards, proxy, mask, group_ids)
    dtype = compute_dtype(proxy)
    valid = _valid_rows(rewards, mask)
    lengths = mask.bool().sum(dim=1)
    baseline = _weighted_group_baseline(rewards, lengths, group_ids, valid, dtype)
    return _sequence_advantages(rewards, baseline, mask, valid, dtype)


def ogb_advantages(rewards, proxy, mask, group_ids, *, eps: float = 1e-8, is_weights=None) -> torch.Tensor:
    """Optimal global (sequence-level) baseline ``b = sum_i R_i W_i / (sum_i W_i + eps)``, W_i = sum_t w_t m_t.

    With ``is_weights``, ``w_t <- w_t rho_bar_t^2`` as in OTB. A group with one valid member gets baseline 0.
    """
    mask = _check_inputs(rewards, proxy, mask, group_ids, is_weights)
    dtype = compute_dtype(proxy)
    valid = _valid_rows(rewards, mask)
    w = _token_weights(proxy, mask.bool(), is_weights, dtype)
    baseline = _weighted_group_baseline(rewards, w.sum(dim=1), group_ids, valid, dtype, eps=eps)
    return _sequence_advantages(rewards, baseline, mask, valid, dtype)


_OPTIONS = {
    "otb": {"eps", "tail", "is_weights", "align", "leave_one_out"},
    "grpo": {"scale"},
    "rloo": set(),
    "opo": set(),
    "ogb": {"eps", "is_weights"},
}

ESTIMATORS = {
    "otb": otb_advantages,
    "grpo": grpo_advantages,
    "rloo": rloo_advantages,
    "opo": opo_advantages,
    "ogb": ogb_advantages,
}


def compute_advantages(estimator: str, rewards, proxy, mask, group_ids, **options) -> torch.Tensor:
    """Dispatch to an estimator by name (``otb``, ``grpo``, ``rloo``, ``opo``, ``ogb``).

    ``options`` may hold any of ``eps, tail, is_weights, align, leave_one_out, scale``; each
    estimator receives the ones it uses (``_OPTIONS``). An unknown option is an error.
    """
    if estimator not in ESTIMATORS:
        raise ValueError(f"Unknown advantage estimator {estimator!r}; choose one of {sorted(ESTIMATORS)}.")
    unknown = set(options) - set().union(*_OPTIONS.values())
    if unknown:
        raise TypeError(f"Unknown advantage option(s) {sorted(unknown)}.")
    used = {k: v for k, v in options.items() if k in _OPTIONS[estimator]}
    return ESTIMATORS[estimator](rewards, proxy, mask, group_ids, **used)
