"""Resuming from a checkpoint continues the same run: step count, optimizer state and parameters
match an uninterrupted run."""

from __future__ import annotations

import json

import torch
from transformers import AutoModelForCausalLM

from trl_otb import OTBTrainer
from trl_otb.testing import RecordingReward, make_args, prompts_dataset


def train(tiny_model_dir, output_dir, resume_from_checkpoint=None):
    args = make_args(output_dir, max_steps=2, learning_rate=1e-2, save_strategy="steps", save_steps=1)
    reward = RecordingReward(distinct=True)  # no group ties: both steps train
    trainer = OTBTrainer(tiny_model_dir, reward_funcs=reward, args=args, train_dataset=prompts_dataset())
    trainer.train(resume_from_checkpoint=resume_from_checkpoint)
    return trainer, reward


def test_resume_from_checkpoint_continues_with_same_optimizer_state_and_step(tiny_model_dir, tmp_path):
    full, full_reward = train(tiny_model_dir, tmp_path / "full")
    checkpoint = tmp_path / "full" / "out" / "checkpoint-1"
    assert json.loads((checkpoint / "trainer_state.json").read_text())["global_step"] == 1

    resumed, resumed_reward = train(tiny_model_dir, tmp_path / "resumed", resume_from_checkpoint=str(checkpoint))
    assert resumed.state.global_step == full.state.global_step == 2
    # The resumed run generated and scored only step 2's batch, and scored the same completions.
    assert len(full_reward.calls) == 2 and len(resumed_reward.calls) == 1
    assert resumed_reward.calls[0] == full_reward.calls[1]
    losses = [[e["loss"] for e in t.state.log_history if "loss" in e] for t in (full, resumed)]
    assert len(losses[0]) == len(losses[1]) == 2 and abs(losses[0][1] - losses[1][1]) < 1e-6

    # Precondition: step 2 moved the weights away from checkpoint-1's, so runs that end identical both trained it.
    at_checkpoint = dict(AutoModelForCausalLM.from_pretrained(checkpoint).named_parameters())
    step2_moved = max((p - at_checkpoint[n]).abs().max().item() for n, p in full.model.named_parameters())
    assert step2_moved > 1e-3, f"precondition failed: step 2 moved no weight (by {step2_moved:.3g})"
    # Checkpoint-1 restores the RNG state, so step 2 samples the same completions: the runs end identical.
    for (name, p_full), (_, p_resumed) in zip(full.model.named_parameters(), resumed.model.named_parameters()):
        assert torch.allclose(p_full, p_resumed, atol=1e-6), name
    state_full, state_resumed = full.optimizer.state_dict()["state"], resumed.optimizer.state_dict()["state"]
    assert state_full.keys() == state_resumed.keys() and state_full
    assert any(state_full[key]["exp_avg"].abs().max() > 0 for key in state_full)  # the moments hold something
    for key in state_full:
        assert int(state_full[key]["step"]) == int(state_resumed[key]["step"]) == 2
        for moment in ("exp_avg", "exp_avg_sq"):
            assert torch.allclose(state_full[key][moment], state_resumed[key][moment], atol=1e-7)
    assert full.lr_scheduler.get_last_lr() == resumed.lr_scheduler.get_last_lr()
