"""The leave-one-out OTB baseline shrunk toward the other members' plain mean by its effective sample size.

For member i of a group, at an aligned position t where another member is active (``[B, T]`` per row)::

    B_t^(-i)  = sum_{j!=i} R_j W_t^(j) m_t^(j) / (sum_{j!=i} W_t^(j) m_t^(j) + eps)    (leave-one-out OTB)
    ESS_t     = (sum_{j!=i} W_t^(j) m_t^(j))^2 / sum_{j!=i} (W_t^(j) m_t^(j))^2        (Kish; 0 if that sum is 0)
    b_t^(-i)  = (ESS_t B_t^(-i) + Rbar^(-i)) / (ESS_t + 1),     Rbar^(-i) = mean_{j!=i valid} R_j

Where no other member is active ESS_t = 0 and b = Rbar^(-i). Every term is a function of the other members only,
so the estimator stays exactly unbiased, like RLOO; when the others' energies are even (ESS near their count), b
leans to the energy-weighted B^(-i); when one other member dominates them (ESS near 1), to the plain mean.

The others' sums are prefix and suffix sums over each group's members (:func:`others_sum`), never a group total
minus member i's own: with energies that differ by 1e6 (a confident member against an improbable one), the total
minus the own square would lose the others' squares to rounding.
"""

from __future__ import annotations

import torch

__all__ = ["ess_shrunk_baseline", "others_sum"]


def others_sum(x: torch.Tensor, gid: torch.Tensor, num_groups: int) -> torch.Tensor:
    """``[B, ...]``: for each row, the sum of ``x`` over the *other* rows of its group (dense ids ``gid`` ``[B]``).

    Rows are laid out per group, ``[G, n, ...]``, and the others' sum is the exclusive prefix plus the exclusive
    suffix sum over the members: only additions, so no cancellation against the row's own value."""
    B = x.shape[0]
    order = torch.argsort(gid, stable=True)
    sorted_gid = gid[order]
    counts = torch.bincount(gid, minlength=num_groups)
    rank = torch.arange(B, device=x.device) - (counts.cumsum(0) - counts)[sorted_gid]
    n = int(counts.max()) if B else 0
    dense = x.new_zeros((num_groups, n, *x.shape[1:]))
    dense[sorted_gid, rank] = x[order]
    zero = dense.new_zeros((num_groups, 1, *x.shape[1:]))
    before = torch.cat([zero, dense.cumsum(1)[:, :-1]], dim=1)
    after = torch.cat([zero, dense.flip(1).cumsum(1)[:, :-1]], dim=1).flip(1)
    out = torch.empty_like(x)
    out[order] = (before + after)[sorted_gid, rank]
    return out


def ess_shrunk_baseline(
    baseline: torch.Tensor, others_mean: torch.Tensor, energy: torch.Tensor, gid: torch.Tensor, num_groups: int
) -> torch.Tensor:
    """``(ESS_t B_t^(-i) + Rbar^(-i)) / (ESS_t + 1)`` ``[B, T]`` (this module's docstring), from the leave-one-out
    ``baseline`` ``[B, T]``, the others' plain mean ``others_mean`` ``[B, T]`` and ``energy`` W_t m_t ``[B, T]``."""
    W = energy.double()  # the squares of energies near 2 T stay far from fp32's range in fp64
    total, squares = others_sum(W, gid, num_groups), others_sum(W * W, gid, num_groups)
    ess = (total * total / torch.where(squares == 0, torch.ones_like(squares), squares)).to(baseline.dtype)
    return (ess * baseline + others_mean) / (ess + 1)
