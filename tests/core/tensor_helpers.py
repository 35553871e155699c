"""The small tensor helpers the core tests share (a helpers module: no test module imports another)."""

from __future__ import annotations

import torch


def t64(x):
    return torch.tensor(x, dtype=torch.float64)


def ids(x):
    return torch.tensor(x, dtype=torch.long)


def assert_close(actual, expected, atol=1e-6, rtol=1e-6):
    expected = torch.as_tensor(expected, dtype=actual.dtype)
    torch.testing.assert_close(actual, expected, atol=atol, rtol=rtol)
