"""Group reductions and row alignment, vectorised: no Python loop over groups or rows.

- ``group_ids [B]``: integer ids, in any order; equal ids = completions of the same prompt.
- :func:`group_index` maps them to dense ids ``gid [B]`` in ``0..G-1``; :func:`group_sum` and :func:`group_max`
  reduce rows per group with ``index_add_`` / ``scatter_reduce_`` (``[B]`` -> ``[G]``, ``[B, T]`` -> ``[G, T]``).
  Index the result with ``gid`` to broadcast a group value back to its rows.
- :func:`left_compact` moves each row's masked-in entries of a ``[B, T]`` tensor to the front (the k-th valid
  token -> column k); :func:`scatter_back` undoes it. OTB uses the pair for ``align="valid"``.
"""

from __future__ import annotations

import torch

__all__ = ["above_group_min", "group_index", "group_max", "group_sum", "left_compact", "scatter_back", "valid_rows"]


def valid_rows(rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``[B]`` bool: the reward is finite and the mask is not all 0 (the rows every baseline uses)."""
    return torch.isfinite(rewards) & mask.bool().any(dim=1)


def group_index(group_ids: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Dense ids 0..G-1 for arbitrary (unsorted, non-contiguous) integer group ids, and G."""
    uniq, inverse = torch.unique(group_ids, return_inverse=True)
    return inverse, uniq.numel()


def group_sum(values: torch.Tensor, gid: torch.Tensor, num_groups: int) -> torch.Tensor:
    """Sum rows of ``values`` ([B] or [B, T]) per group: [G] or [G, T]."""
    out = values.new_zeros((num_groups, *values.shape[1:]))
    return out.index_add_(0, gid, values)


def group_max(values: torch.Tensor, gid: torch.Tensor, num_groups: int) -> torch.Tensor:
    """Max of ``values`` [B] per group, and at least 0: [G]."""
    out = values.new_zeros(num_groups)
    return out.scatter_reduce_(0, gid, values, reduce="amax", include_self=True)


def above_group_min(values: torch.Tensor, rows: torch.Tensor, gid: torch.Tensor, num_groups: int) -> torch.Tensor:
    """``values [B]`` minus the minimum over the ``rows [B]`` (bool) of its group; 0 outside ``rows``.

    Every baseline that is a weighted mean of its group's rewards is formed on these differences: they are exactly
    0 when a group's rewards tie (a mean of equal floats need not equal them), and carry no common offset into the
    rounding, so adding a constant to every reward changes nothing beyond the rounding of the subtraction itself.
    """
    top = torch.finfo(values.dtype).max
    low = values.new_full((num_groups,), top).scatter_reduce_(
        0, gid, torch.where(rows, values, torch.full_like(values, top)), reduce="amin", include_self=True
    )
    return torch.where(rows, values - low[gid], torch.zeros_like(values))


def left_compact(x: torch.Tensor, m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Move each row's masked-in entries to the front, in order (the k-th valid token -> column k).

    Returns the compacted ``[B, T]`` tensor (0 past each row's count) and the scatter index ``[B, T]`` (T for
    masked-out positions), which :func:`scatter_back` uses to undo it.
    """
    T = x.shape[1]
    rank = torch.cumsum(m.long(), dim=1) - 1
    index = torch.where(m, rank, torch.full_like(rank, T))
    out = x.new_zeros((x.shape[0], T + 1)).scatter_(1, index, torch.where(m, x, torch.zeros_like(x)))
    return out[:, :T], index


def scatter_back(x_compact: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Undo :func:`left_compact`: ``[B, T]`` in the original positions, 0 where the mask was 0."""
    padded = torch.cat([x_compact, x_compact.new_zeros((x_compact.shape[0], 1))], dim=1)
    return padded.gather(1, index)
