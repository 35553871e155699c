"""Leave-one-out OTB (``otb_leave_one_out=True``): member i's baseline uses the other members only,
and is 0 wherever no other member is active at t."""

from __future__ import annotations

import torch

from trl_otb import OTBTrainer, otb_advantages
from trl_otb.testing import (
    N,
    RecordingReward,
    generation_inputs,
    independent_rollout_stats,
    make_args,
    prompts_dataset,
)


def test_leave_one_out_hand_computed_with_a_lone_member_getting_zero_baseline():
    # Uniform weights, lengths 3, 2, 1: W_t = t + 1 for every active member.
    rewards = torch.tensor([1.0, 0.0, 2.0])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 0, 0]])
    A = otb_advantages(rewards, torch.ones(3, 3), mask, torch.zeros(3, dtype=torch.long), leave_one_out=True)
    expected = torch.tensor(
        [
            [1 - (0 + 2) / 2, 1 - 0, 1.0],  # t=2: member 0 is alone, baseline 0, advantage R
            [0 - (1 + 2) / 2, 0 - 1, 0.0],
            [2 - (1 + 0) / 2, 0.0, 0.0],
        ]
    )
    assert torch.allclose(A, expected, atol=1e-6)


def test_leave_one_out_singleton_and_unscorable_members():
    # Group 0: only member 0 is scorable, so it is alone everywhere. Group 1: two members, energy-weighted.
    rewards = torch.tensor([3.0, float("nan"), 1.0, 2.0])
    proxy = torch.tensor([[0.5, 0.5], [1.0, 1.0], [1.0, 3.0], [2.0, 1.0]])
    mask = torch.ones(4, 2)
    A = otb_advantages(rewards, proxy, mask, torch.tensor([0, 0, 1, 1]), leave_one_out=True)
    assert torch.allclose(A[0], torch.tensor([3.0, 3.0])) and (A[1] == 0).all()
    # With two members the leave-one-out baseline is simply the other member's reward, whatever the weights.
    assert torch.allclose(A[2], torch.tensor([-1.0, -1.0])) and torch.allclose(A[3], torch.tensor([1.0, 1.0]))


def test_trainer_leave_one_out_equals_contract(tiny_model_dir, tmp_path):
    reward = RecordingReward()
    args = make_args(tmp_path, otb_leave_one_out=True)
    trainer = OTBTrainer(tiny_model_dir, reward_funcs=reward, args=args, train_dataset=prompts_dataset())
    batch = trainer._generate_and_score_completions(generation_inputs())
    _, _, proxy = independent_rollout_stats(trainer.model, batch, trainer.temperature)
    rewards = torch.tensor(reward.calls[-1], dtype=torch.float32)
    mask = batch["completion_mask"]
    group_ids = torch.arange(len(rewards)) // N
    expected = otb_advantages(rewards, proxy.float(), mask, group_ids, leave_one_out=True)
    assert torch.allclose(batch["advantages"], expected, atol=1e-5)
    assert not torch.allclose(expected, otb_advantages(rewards, proxy.float(), mask, group_ids), atol=1e-4)
    # Where a member is the only active one of its group, its advantage is its reward.
    active = mask.view(-1, N, mask.size(1)).sum(dim=1).repeat_interleave(N, dim=0)
    alone = (active == 1) & mask.bool()
    assert alone.any()
    assert torch.allclose(batch["advantages"][alone], rewards[:, None].expand_as(mask)[alone])
