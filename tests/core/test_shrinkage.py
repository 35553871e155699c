"""trl_otb/core/shrinkage.py: the others' sums without cancellation, which the ESS-shrunk baseline is built on."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from trl_otb.core.groups import group_index
from trl_otb.core.shrinkage import others_sum


@settings(deadline=None, max_examples=60, derandomize=True)
@given(
    group_ids=st.lists(st.integers(-3, 9), min_size=1, max_size=12),
    data=st.data(),
)
def test_others_sum_is_the_sum_over_the_other_rows_of_the_group(group_ids, data):
    B = len(group_ids)
    x = torch.tensor([[data.draw(st.floats(-1e3, 1e3)) for _ in range(3)] for _ in range(B)], dtype=torch.float64)
    gid, G = group_index(torch.tensor(group_ids))
    expected = torch.stack(
        [sum((x[j] for j in range(B) if group_ids[j] == group_ids[i] and j != i), torch.zeros(3)) for i in range(B)]
    ).double()
    torch.testing.assert_close(others_sum(x, gid, G), expected, atol=1e-9, rtol=1e-12)


def test_others_sum_keeps_small_others_beside_a_huge_own_value():
    """A group total minus the own value would give 0 here (1e16 + 1 - 1e16 rounds to 0 or 2 in fp64)."""
    x = torch.tensor([1e16, 1.0, 1.0], dtype=torch.float64)
    gid, G = group_index(torch.tensor([5, 5, 5]))
    assert others_sum(x, gid, G).tolist() == [2.0, 1e16 + 1.0, 1e16 + 1.0]


def test_others_sum_of_an_empty_batch_is_empty():
    gid, G = group_index(torch.tensor([], dtype=torch.long))
    assert others_sum(torch.zeros(0, 4), gid, G).shape == (0, 4)
