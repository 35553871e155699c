"""The small tensor helpers the core tests share (a helpers module: no test module imports another)."""

from __future__ import annotations

import torch
from hypothesis import strategies as st


def t64(x):
    return torch.tensor(x, dtype=torch.float64)


def ids(x):
    return torch.tensor(x, dtype=torch.long)


def assert_close(actual, expected, atol=1e-6, rtol=1e-6):
    expected = torch.as_tensor(expected, dtype=actual.dtype)
    torch.testing.assert_close(actual, expected, atol=atol, rtol=rtol)


def draw_mask_row(draw, T, kinds):
    """One mask row of length T (a hypothesis ``draw``): ``"contiguous"`` (1 to T leading ones), ``"holes"`` (any
    pattern) or ``"empty"`` (all 0), the kind drawn from ``kinds`` (repeat a kind to draw it more often)."""
    kind = draw(st.sampled_from(kinds))
    if kind == "contiguous":
        L = draw(st.integers(1, T))
        return [1] * L + [0] * (T - L)
    if kind == "holes":
        return [int(b) for b in draw(st.lists(st.booleans(), min_size=T, max_size=T))]
    return [0] * T
