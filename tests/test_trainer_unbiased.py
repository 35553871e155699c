"""The exactly unbiased OTB options through OTBTrainer, end to end on the tiny model: leave-one-out with the others'
mean at lone tokens (``otb_tail="others_mean"``), with and without the ESS shrinkage (``otb_shrinkage="ess"``).
They train, a reward offset changes no advantage, and tied rewards move no parameter."""

from __future__ import annotations

import math

import pytest
import torch

from trl_otb import OTBTrainer
from trl_otb.testing import make_args, prompts_dataset

from .test_trainer import OffsetReward, _advantages_under_offsets, _has_lone_tail, constant_reward

UNBIASED_OPTIONS = [
    {"otb_leave_one_out": True, "otb_tail": "others_mean"},
    {"otb_leave_one_out": True, "otb_tail": "others_mean", "otb_shrinkage": "ess"},
]
IDS = ["others_mean", "others_mean_ess"]


@pytest.mark.parametrize("options", UNBIASED_OPTIONS, ids=IDS)
def test_unbiased_otb_trains_and_a_reward_offset_changes_no_advantage(tiny_model_dir, tmp_path, options):
    reward = OffsetReward()
    trainer = OTBTrainer(
        tiny_model_dir,
        reward_funcs=reward,
        args=make_args(tmp_path, max_steps=2, learning_rate=1e-3, **options),
        train_dataset=prompts_dataset(),
    )
    assert trainer.args.estimator_options()["tail"] == "others_mean"
    (ids, mask, base), *shifted = _advantages_under_offsets(trainer, reward, [0.0, 0.5, -1000.0])
    assert base.abs().max() > 0, "precondition failed: the batch has no signal"
    assert _has_lone_tail(mask), "precondition failed: no group has a member alone at its tail"
    for ids_c, mask_c, adv in shifted:
        assert torch.equal(ids_c, ids) and torch.equal(mask_c, mask), "precondition failed: another batch"
        assert torch.equal(adv, base)

    reward.offset = 0.0
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    assert trainer.state.global_step == 2
    assert all(math.isfinite(entry["loss"]) for entry in trainer.state.log_history if "loss" in entry)
    assert any(not torch.equal(before[n], p) for n, p in trainer.model.named_parameters()), "nothing trained"


@pytest.mark.parametrize("options", UNBIASED_OPTIONS, ids=IDS)
def test_unbiased_otb_tied_rewards_move_no_parameter(tiny_model_dir, tmp_path, options):
    trainer = OTBTrainer(
        tiny_model_dir,
        reward_funcs=constant_reward,
        args=make_args(tmp_path, learning_rate=1e-3, **options),
        train_dataset=prompts_dataset(),
    )
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    assert trainer.state.log_history[0]["otb/advantage_abs_max"] == 0.0
    moved = [n for n, p in trainer.model.named_parameters() if not torch.equal(before[n], p)]
    assert not moved, f"tied rewards moved {moved}"


def test_the_shrinkage_is_refused_without_leave_one_out_and_others_mean(tmp_path):
    for options in ({"otb_shrinkage": "ess"}, {"otb_shrinkage": "ess", "otb_leave_one_out": True}):
        with pytest.raises(ValueError, match="otb_leave_one_out=True and otb_tail='others_mean'"):
            make_args(tmp_path, **options)
    with pytest.raises(ValueError, match="unknown otb_shrinkage"):
        make_args(tmp_path, otb_shrinkage="kish")
