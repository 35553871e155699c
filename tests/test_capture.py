"""The capture object: OTBTrainer's only state across TRL's methods, opened for one generation batch and dropped."""

from __future__ import annotations

import pytest
import torch
from datasets import Dataset
from trl import GRPOTrainer

from trl_otb import OTBConfig, OTBTrainer
from trl_otb.capture import BatchCapture

CPU = dict(
    output_dir="unused",
    use_cpu=True,
    bf16=False,
    gradient_checkpointing=False,
    report_to="none",
    per_device_train_batch_size=4,
    max_completion_length=6,
)
PROMPTS = [{"prompt": [{"role": "user", "content": "what is 1 + 1?"}]}] * 4


def reward(completions, **kwargs):
    return [float(len(c)) for c in completions]


def test_rewards_are_required_not_reused():
    capture = BatchCapture(wants_sum_pi_sq=True)
    with pytest.raises(RuntimeError, match="without calling _calculate_rewards"):
        capture.rewards()


def fused_output(log_probs, log_sum_sq_probs):
    """What the fused head's forward returns, as far as the capture reads it."""
    return type("Out", (), {"log_probs": log_probs, "log_sum_sq_probs": log_sum_sq_probs})()


def test_rollout_pass_is_the_first_pass_and_must_be_trls():
    capture = BatchCapture(wants_sum_pi_sq=True)
    assert capture.rollout_pass(torch.zeros(2, 3)) is None  # no pass recorded
    for logps in (torch.zeros(2, 3), torch.ones(2, 3)):
        capture.begin_pass()
        capture.record_forward(fused_output(torch.zeros(2, 5), torch.zeros(2, 5)))
        capture.end_pass(logps, logits_to_keep=3)
    first, second = capture.passes
    assert first.log_sum_sq_probs.shape == first.logps.shape == (2, 3)
    assert capture.rollout_pass(first.returned) is first
    assert capture.rollout_pass(None) is None  # TRL ran no rollout pass
    with pytest.raises(RuntimeError, match="not TRL's rollout pass"):
        capture.rollout_pass(second.returned)


def test_a_pass_keeps_the_fused_heads_pair_when_trl_received_a_cast_copy():
    """accelerate <= 1.15's FSDP2 casts a bf16 run's outputs to bf16 after the forward: TRL then receives bf16
    log-probs, while the fused head computed them, and sum pi^2, in fp32. The proxy's inputs are the fp32 pair."""
    log_probs = -torch.rand(4, 6, dtype=torch.float32) * 5
    log_sum_sq = -torch.rand(4, 6, dtype=torch.float32)
    capture = BatchCapture(wants_sum_pi_sq=True)
    capture.begin_pass()
    for rows in (slice(0, 2), slice(2, 4)):  # TRL forwards in chunks of rows
        capture.record_forward(fused_output(log_probs[rows], log_sum_sq[rows]))
    received = log_probs[:, -4:].to(torch.bfloat16)
    capture.end_pass(received, logits_to_keep=4)
    (recorded,) = capture.passes
    assert recorded.returned is received and (recorded.logps != received.float()).any()  # bf16 lost digits
    assert recorded.logps.dtype == recorded.log_sum_sq_probs.dtype == torch.float32
    assert torch.equal(recorded.logps, log_probs[:, -4:]) and torch.equal(
        recorded.log_sum_sq_probs, log_sum_sq[:, -4:]
    )


def test_a_pass_whose_forwards_do_not_match_what_trl_returned_fails():
    capture = BatchCapture(wants_sum_pi_sq=True)
    capture.begin_pass()
    capture.record_forward(fused_output(torch.zeros(2, 5), torch.zeros(2, 5)))
    with pytest.raises(RuntimeError, match="TRL internals changed"):
        capture.end_pass(torch.zeros(3, 3), logits_to_keep=3)


def test_a_pass_that_raised_is_not_recorded():
    capture = BatchCapture(wants_sum_pi_sq=True)
    capture.begin_pass()
    capture.record_forward(fused_output(torch.zeros(2, 5), torch.zeros(2, 5)))
    capture.end_pass(None, logits_to_keep=3)
    assert capture.passes == []
    capture.record_forward(fused_output(None, None))  # disarmed: ignored, no error


def test_the_capture_is_open_only_while_a_batch_is_scored(tiny_model_dir, monkeypatch):
    trainer = OTBTrainer(
        tiny_model_dir, reward_funcs=reward, args=OTBConfig(**CPU), train_dataset=Dataset.from_list(PROMPTS)
    )
    seen = []
    original = GRPOTrainer._calculate_rewards

    def spy(self, *args):
        seen.append(self._otb_capture)
        return original(self, *args)

    monkeypatch.setattr(GRPOTrainer, "_calculate_rewards", spy)
    assert trainer._otb_capture is None
    batch = trainer._generate_and_score_completions(PROMPTS)
    assert isinstance(seen[0], BatchCapture) and seen[0].rewards_per_func is not None
    assert seen[0].sampling_stats is not None  # single-turn HF generate: the statistics were read while sampling
    assert trainer._otb_capture is None  # forgotten afterwards
    assert batch["advantages"].shape == batch["completion_ids"].shape
    with trainer._otb_capturing():
        with pytest.raises(RuntimeError, match="one at a time"), trainer._otb_capturing():
            pass


def test_a_batch_scored_without_rewards_fails_instead_of_reusing_the_last(tiny_model_dir, monkeypatch):
    trainer = OTBTrainer(
        tiny_model_dir, reward_funcs=reward, args=OTBConfig(**CPU), train_dataset=Dataset.from_list(PROMPTS)
    )
    trainer._generate_and_score_completions(PROMPTS)  # a first batch, with rewards
    # As if TRL scored the batch by another route than the method OTBTrainer overrides.
    monkeypatch.setattr(trainer, "_calculate_rewards", lambda *args: GRPOTrainer._calculate_rewards(trainer, *args))
    with pytest.raises(RuntimeError, match="without calling _calculate_rewards"):
        trainer._generate_and_score_completions(PROMPTS)
    assert trainer._otb_capture is None
