"""Input validation shared by the advantage estimators.

Every estimator takes ``rewards [B]``, ``proxy [B, T]``, ``mask [B, T]``, ``group_ids [B]`` and optionally
``is_weights [B, T]`` or ``[B, 1]``. :func:`check_inputs` checks shapes and dtypes always, and values only where they
matter: ``proxy`` and ``is_weights`` must be finite and >= 0 on masked-in tokens; anything goes where the mask is 0
(padding, tool output). It returns the mask as bool, for the estimator to select with. Infinite rewards are
excluded like NaN ones by every estimator, with an :class:`InfiniteRewardWarning`.

The value checks start with one fused min/max over the whole tensor; the exact masked check runs only when that
finds a negative or non-finite value somewhere.
"""

from __future__ import annotations

import warnings

import torch

__all__ = [
    "InfiniteRewardWarning",
    "all_clean",
    "bad_on_mask",
    "check_inputs",
    "check_reward_range",
    "raise_overflow",
]


class NonFiniteGradientWarning(UserWarning):
    """An optimizer step whose gradient norm was not finite: gradient clipping turned it into no update. With
    finite rewards this comes from advantages too large for the gradient's dtype (rewards of 1e30, say)."""


class NaNRewardWarning(UserWarning):
    """A reward function returned NaN: the completion is treated as unscorable. NaN is almost always a bug in the
    reward function (a 0/0); return None for a completion the function cannot score."""


class InfiniteRewardWarning(UserWarning):
    """A reward of +inf or -inf: the completion is treated as unscorable (like NaN), which is almost always a bug in
    the reward function."""


def check_inputs(rewards, proxy, mask, group_ids, is_weights=None) -> torch.Tensor:
    """Validate the shared inputs; return ``mask`` as bool (converted once, for the caller to reuse)."""
    _check_shapes(rewards, proxy, mask, group_ids, is_weights)
    _warn_infinite_rewards(rewards)
    proxy_clean, weights_clean = _clean(proxy), _clean(is_weights)
    m = mask.bool()
    _check_masked_values(proxy, is_weights, m, proxy_clean, weights_clean)
    return m


def _check_shapes(rewards, proxy, mask, group_ids, is_weights) -> None:
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


def _warn_infinite_rewards(rewards: torch.Tensor) -> None:
    """Infinite rewards are excluded like NaN ones (the estimators' rule), but never silently."""
    infinite = torch.isinf(rewards)
    if bool(infinite.any()):
        rows = infinite.nonzero().squeeze(1).tolist()
        warnings.warn(
            f"{len(rows)} of {rewards.numel()} rewards are infinite (rows {rows[:8]}{' ...' if len(rows) > 8 else ''}); "
            "they are treated like NaN: excluded from their group's baseline, advantage 0. An infinite reward is "
            "almost always a bug in the reward function.",
            InfiniteRewardWarning,
            stacklevel=4,
        )


def _clean(x: torch.Tensor | None) -> bool:
    return x is None or all_clean(x)


def _check_masked_values(proxy, is_weights, m, proxy_clean: bool, weights_clean: bool) -> None:
    """The exact checks on masked-in tokens, for the tensors the global min/max did not clear."""
    if not proxy_clean and bad_on_mask(proxy, m):
        if (m & ~torch.isfinite(proxy)).any():
            raise ValueError("proxy has non-finite values on masked-in tokens; check the log-probs it was built from.")
        raise ValueError("proxy must be >= 0 on masked-in tokens (w_t is a squared norm).")
    if not weights_clean and bad_on_mask(is_weights, m):
        raise ValueError("is_weights must be finite and >= 0 on masked-in tokens (clipped importance ratios).")


def all_clean(x: torch.Tensor) -> bool:
    """Whether every value of ``x`` (masked or not) is finite and >= 0: one fused min/max, no new tensor."""
    if not x.numel():
        return True
    lo, hi = torch.aminmax(x)
    return bool((lo >= 0) & (hi < float("inf")))


def bad_on_mask(x: torch.Tensor, m: torch.Tensor) -> bool:
    """Whether any masked-in value of ``x`` is negative, NaN or infinite.

    Two passes (a select and a fused min/max, which propagates NaN) rather than boolean indexing
    (``x[m]`` costs a nonzero and a gather): this runs on every training step.
    """
    selected = torch.where(m, x, torch.zeros((), dtype=x.dtype, device=x.device))
    if not selected.numel():
        return False
    lo, hi = torch.aminmax(selected)
    return not bool((lo >= 0) & (hi < float("inf")))


def check_reward_range(rewards: torch.Tensor, dtype: torch.dtype) -> None:
    """R * W must stay finite in the compute dtype: W <= 2T, summed over a group."""
    limit = 1e32 if dtype == torch.float32 else 1e300
    finite = rewards[torch.isfinite(rewards)]
    if finite.numel() and finite.abs().max() > limit:
        raise ValueError(
            f"rewards reach {finite.abs().max().item():.3g}, beyond what {dtype} advantages can hold ({limit:g}); "
            "rescale the rewards."
        )


def raise_overflow() -> None:
    raise ValueError("proxy * is_weights**2 overflows; clip the importance ratios (e.g. to <= 10).")
