"""otb_diagnostics (trl_otb/core/diagnostics.py) against a direct, row-by-row computation of every statistic it
documents. Which of them the trainer logs: tests/test_trainer.py."""

from __future__ import annotations

import math

import pytest
import torch

from trl_otb import otb_advantages, rloo_advantages
from trl_otb.core import otb_diagnostics
from trl_otb.core.diagnostics import ADVANTAGE_KEYS, BASELINE_TOLERANCE, PROXY_KEYS


def reference(rewards, adv, proxy, mask, group_ids, leave_one_out=False):
    rows = [i for i in range(len(rewards)) if math.isfinite(rewards[i]) and mask[i].any()]
    tokens = [(i, t) for i in rows for t in range(mask.shape[1]) if mask[i, t]]
    w = [float(proxy[i, t]) for i, t in tokens]
    a = [float(adv[i, t]) for i, t in tokens]
    energy = {i: sum(float(proxy[i, t]) for t in range(mask.shape[1]) if mask[i, t]) for i in rows}
    group_mean, tolerance = {}, {}
    for i in rows:
        members = [float(rewards[j]) for j in rows if group_ids[j] == group_ids[i]]
        group_mean[i] = sum(members) / len(members)
        spread = math.sqrt(sum((r - group_mean[i]) ** 2 for r in members) / len(members))
        tolerance[i] = BASELINE_TOLERANCE * spread + 1e-6 * (1 + abs(group_mean[i]))
    equal = dict(group_mean)  # the equal-weight baseline: the group's mean, or (leave-one-out) the others'
    if leave_one_out:
        for i in rows:
            others = [float(rewards[j]) for j in rows if group_ids[j] == group_ids[i] and j != i]
            equal[i] = sum(others) / len(others) if others else group_mean[i]
    distance = {(i, t): abs(float(rewards[i]) - float(adv[i, t]) - equal[i]) for i, t in tokens}
    differs = [distance[i, t] > tolerance[i] for i, t in tokens]
    spread = {i: (tolerance[i] - 1e-6 * (1 + abs(group_mean[i]))) / BASELINE_TOLERANCE for i in rows}
    shift = [distance[i, t] / spread[i] if spread[i] > 1e-9 else 0.0 for i, t in tokens]
    lone = [not any(mask[j, t] for j in rows if j != i and group_ids[j] == group_ids[i]) for i, t in tokens]
    mean = sum(a) / len(a)
    a_bar = {i: sum(float(adv[i, t]) for t in range(mask.shape[1]) if mask[i, t]) / int(mask[i].sum()) for i in rows}
    return {
        "proxy_mean": sum(w) / len(w),
        "proxy_max": max(w),
        "energy_last_mean": sum(energy.values()) / len(rows),
        "energy_last_max": max(energy.values()),
        "baseline_differs_frac": sum(differs) / len(tokens),
        "baseline_shift": sum(shift) / len(tokens),
        "lone_token_frac": sum(lone) / len(tokens),
        "advantage_mean": mean,
        "advantage_std": math.sqrt(sum((x - mean) ** 2 for x in a) / len(a)),
        "advantage_abs_max": max(abs(x) for x in a),
        "total_power": sum(a_bar[i] ** 2 * energy[i] for i in rows) / len(rows),
    }


@pytest.mark.parametrize("leave_one_out", [False, True])
@pytest.mark.parametrize("seed", range(4))
def test_diagnostics_match_a_direct_computation(seed, leave_one_out):
    g = torch.Generator().manual_seed(seed)
    B, T = 12, 7
    mask = (torch.rand(B, T, generator=g) < 0.75).long()
    mask[4] = 0  # an empty row
    rewards = torch.rand(B, generator=g)
    rewards[7] = float("nan")  # an unscorable row
    proxy = 2 * torch.rand(B, T, generator=g)
    proxy[mask == 0] = float("nan")  # values off the mask must not leak in
    group_ids = torch.arange(B) // 4
    adv = otb_advantages(rewards, proxy, mask, group_ids, tail="zero", leave_one_out=leave_one_out)
    got = otb_diagnostics(rewards, adv, proxy, mask, group_ids, leave_one_out=leave_one_out)
    want = reference(rewards, adv, proxy, mask, group_ids, leave_one_out)
    assert got.keys() == want.keys()
    for key in want:
        assert got[key] == pytest.approx(want[key], rel=1e-5, abs=1e-6), key


def test_diagnostics_of_an_empty_batch_are_zero():
    got = otb_diagnostics(
        torch.tensor([1.0]), torch.zeros(1, 3), torch.ones(1, 3), torch.zeros(1, 3), torch.tensor([0])
    )
    assert set(got.values()) == {0.0}


def test_without_a_proxy_only_the_advantage_keys_are_reported():
    g = torch.Generator().manual_seed(5)
    mask = (torch.rand(8, 6, generator=g) < 0.8).long()
    rewards, proxy, group_ids = torch.rand(8, generator=g), 2 * torch.rand(8, 6, generator=g), torch.arange(8) // 4
    adv = rloo_advantages(rewards, proxy, mask, group_ids)
    with_proxy = otb_diagnostics(rewards, adv, proxy, mask, group_ids)
    without = otb_diagnostics(rewards, adv, None, mask, group_ids)
    assert set(with_proxy) == set(ADVANTAGE_KEYS) | set(PROXY_KEYS)
    assert list(without) == list(ADVANTAGE_KEYS)
    assert without == {k: with_proxy[k] for k in ADVANTAGE_KEYS}
    empty = otb_diagnostics(rewards, adv, None, torch.zeros_like(mask), group_ids)
    assert empty == dict.fromkeys(ADVANTAGE_KEYS, 0.0)


def test_lone_token_frac_counts_tokens_no_other_member_reaches():
    # Group 0: lengths 3 and 1 -> positions 1, 2 of row 0 are alone (2 of 4 tokens); group 1: one valid member
    # (row 3's reward is NaN) -> its 2 tokens are alone. 4 of 8 valid tokens.
    rewards = torch.tensor([1.0, 0.0, 0.5, float("nan")])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [1, 1, 0], [1, 1, 1]])
    adv = torch.zeros(4, 3)
    got = otb_diagnostics(rewards, adv, None, mask, torch.tensor([0, 0, 1, 1]))
    assert got["lone_token_frac"] == pytest.approx(4 / 6)
    # A hole in row 1: position 1 is row 0's alone; with align="valid" row 1's tokens are positions 0 and 1, so row
    # 0's last token is alone instead. Either way 1 of 5 tokens.
    mask = torch.tensor([[1, 1, 1], [1, 0, 1]])
    rewards = torch.tensor([1.0, 0.0])
    position = otb_diagnostics(rewards, torch.zeros(2, 3), None, mask, torch.tensor([0, 0]))
    valid = otb_diagnostics(rewards, torch.zeros(2, 3), None, mask, torch.tensor([0, 0]), align="valid")
    assert position["lone_token_frac"] == pytest.approx(1 / 5)
    assert valid["lone_token_frac"] == pytest.approx(1 / 5)
    # Row 1 starts one token late: by position tokens 0 and 2 are alone; by valid token, none is.
    shifted = torch.tensor([[1, 1, 0], [0, 1, 1]])
    assert otb_diagnostics(rewards, torch.zeros(2, 3), None, shifted, torch.tensor([0, 0]))[
        "lone_token_frac"
    ] == pytest.approx(2 / 4)
    assert otb_diagnostics(rewards, torch.zeros(2, 3), None, shifted, torch.tensor([0, 0]), align="valid")[
        "lone_token_frac"
    ] == pytest.approx(0.0)


def test_baseline_differs_frac_ignores_a_negligible_shift_and_counts_real_reweighting():
    """Without a tied group, OTB whose baseline is the group mean but for 1e-5 of the reward spread reads 0 (a 1e-6
    absolute tolerance read 1.0, any float difference counting); weights that move the baseline read above 0, and
    baseline_shift says by how much, in units of the reward spread."""
    g = torch.Generator().manual_seed(3)
    rewards = torch.tensor([0.1, 0.7, 1.3, 2.9, 5.0, 5.5, 9.0, 12.0])  # no ties
    mask, group_ids = torch.ones(8, 6), torch.arange(8) // 4
    nearly_uniform = 1 + 1e-4 * torch.rand(8, 6, generator=g)
    adv = otb_advantages(rewards, nearly_uniform, mask, group_ids, leave_one_out=False)
    assert (rewards[:, None] - adv - rewards.view(2, 4).mean(1).repeat_interleave(4)[:, None]).abs().min() > 1e-6
    got = otb_diagnostics(rewards, adv, nearly_uniform, mask, group_ids)
    assert got["baseline_differs_frac"] == 0.0 and got["baseline_shift"] < 1e-4
    proxy = 0.1 + 2 * torch.rand(8, 6, generator=g)
    adv = otb_advantages(rewards, proxy, mask, group_ids, leave_one_out=False)
    got = otb_diagnostics(rewards, adv, proxy, mask, group_ids)
    assert got["baseline_differs_frac"] > 0.5 and 0.01 < got["baseline_shift"] < 2
