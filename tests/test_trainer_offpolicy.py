"""Off-policy OTB: TRL's truncated/masked importance-sampling ratios reach the energy as rho^2.

TRL 1.16 computes ``importance_sampling_ratio`` (and multiplies its loss by it) exactly when
``use_vllm`` and ``vllm_importance_sampling_correction`` are both on; a ``rollout_func`` supplies
the behaviour log-probs either way, but without vLLM TRL neither computes the ratio nor corrects the
loss, and OTB then uses no ratio either. These tests run in the main venv, without vLLM: they switch
TRL's ``use_vllm`` attribute on after construction (with a no-op weight sync) and let a ``rollout_func``
play the inference engine: it samples from the model at temperature 1 and reports those log-probs,
while the trainer's policy is at temperature 0.7, a large, controlled policy mismatch. The same path
with a real vLLM engine is in ``tests/integration/test_vllm.py`` (``make test-vllm``).
"""

from __future__ import annotations

import math
import types

import pytest
import torch

from trl_otb import OTBTrainer, otb_advantages
from trl_otb.testing import (
    N,
    RecordingReward,
    generation_inputs,
    independent_ratio,
    independent_rollout_stats,
    make_args,
    prompts_dataset,
)

pytestmark = pytest.mark.filterwarnings("ignore:You are using 'rollout_func'")

BEHAVIOUR_TEMPERATURE = 1.0
CLIP = {"token": (0.5, 2.0), "sequence": (0.2, 5.0)}


class BehaviourPolicy:
    """A ``rollout_func`` that samples at ``BEHAVIOUR_TEMPERATURE`` and reports its own log-probs."""

    def __init__(self, max_new_tokens=12):
        self.max_new_tokens = max_new_tokens
        self.logprobs = None

    def __call__(self, prompts, trainer):
        tokenizer = trainer.processing_class
        prompt_ids = [
            tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=True, return_dict=False)
            for p in prompts
        ]
        assert len({len(ids) for ids in prompt_ids}) == 1, "equal-length prompts: sampled as one unpadded batch"
        sequences = torch.tensor(prompt_ids)
        sampled, logps = [], []
        with torch.no_grad():
            for _ in range(self.max_new_tokens):
                logits = trainer.model(input_ids=sequences).logits[:, -1].double()
                log_probs = torch.log_softmax(logits / BEHAVIOUR_TEMPERATURE, dim=-1)
                tokens = torch.multinomial(log_probs.exp(), 1)
                sequences = torch.cat([sequences, tokens], dim=1)
                sampled.append(tokens[:, 0])
                logps.append(log_probs.gather(1, tokens)[:, 0])
        completion_ids, self.logprobs = [], []
        for row, lp in zip(torch.stack(sampled, 1).tolist(), torch.stack(logps, 1).tolist()):
            end = row.index(tokenizer.eos_token_id) + 1 if tokenizer.eos_token_id in row else len(row)
            completion_ids.append(row[:end])
            self.logprobs.append(lp[:end])
        return {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": self.logprobs}


def enable_trl_importance_sampling(trainer):
    """Turn on TRL's own IS-correction path (gated on ``use_vllm``) without a vLLM engine."""
    trainer.use_vllm = True
    trainer.vllm_importance_sampling_correction = True
    trainer.vllm_generation = types.SimpleNamespace(sync_weights=lambda: None)
    trainer._last_loaded_step = -1


def offpolicy_trainer(tiny_model_dir, tmp_path, mode, reward, **overrides):
    clip_min, clip_max = CLIP[mode.split("_")[0]]
    args = make_args(
        tmp_path,
        vllm_importance_sampling_mode=mode,
        vllm_importance_sampling_clip_min=clip_min,
        vllm_importance_sampling_clip_max=clip_max,
        **overrides,
    )
    behaviour = BehaviourPolicy()
    trainer = OTBTrainer(
        tiny_model_dir, reward_funcs=reward, args=args, train_dataset=prompts_dataset(), rollout_func=behaviour
    )
    enable_trl_importance_sampling(trainer)
    return trainer, behaviour


@pytest.mark.parametrize("mode", ["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"])
def test_importance_ratios_weight_the_energy_as_rho_squared(tiny_model_dir, tmp_path, mode):
    reward = RecordingReward(distinct=True)  # no group ties: rho changes the advantages
    trainer, behaviour = offpolicy_trainer(tiny_model_dir, tmp_path, mode, reward)
    batch = trainer._generate_and_score_completions(generation_inputs())

    p_token, _, proxy = independent_rollout_stats(trainer.model, batch, trainer.temperature)
    mask = batch["completion_mask"]
    sampling = torch.zeros(mask.shape, dtype=torch.float64)
    for i, row in enumerate(behaviour.logprobs):
        sampling[i, : len(row)] = torch.tensor(row, dtype=torch.float64)
    clip_min, clip_max = CLIP[mode.split("_")[0]]
    ratio = independent_ratio(torch.log(p_token), sampling, mask, mode, clip_min, clip_max).float()
    assert torch.allclose(batch["importance_sampling_ratio"], ratio, rtol=1e-4, atol=1e-5)
    # The batch is genuinely off-policy: some ratios are clipped (truncated, or masked to 0), some are kept.
    on_tokens = ratio.expand_as(mask)[mask.bool()]
    inside = (on_tokens > clip_min) & (on_tokens < clip_max)
    assert inside.any() and not inside.all()
    if mode.endswith("mask"):
        assert ((on_tokens == 0) | inside).all()

    rewards = torch.tensor(reward.calls[-1], dtype=torch.float32)
    group_ids = torch.arange(len(rewards)) // N
    active = mask * (ratio > 0).to(mask.dtype)  # masked tokens or sequences drop out of their groups
    expected = otb_advantages(rewards, proxy.float(), active, group_ids, is_weights=ratio, tail=trainer.args.otb_tail)
    on_policy = otb_advantages(rewards, proxy.float(), active, group_ids, tail=trainer.args.otb_tail)
    assert torch.allclose(batch["advantages"], expected, atol=1e-5)
    assert (batch["advantages"] - on_policy).abs().max() > 1e-4
    assert (batch["advantages"][active == 0] == 0).all()


def test_off_policy_training_step_uses_trl_corrected_loss(tiny_model_dir, tmp_path):
    trainer, _ = offpolicy_trainer(tiny_model_dir, tmp_path, "token_truncate", RecordingReward(), learning_rate=1e-2)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    logged = trainer.state.log_history[0]
    assert math.isfinite(logged["loss"])
    assert 0.5 <= logged["sampling/importance_sampling_ratio/min"] <= logged["sampling/importance_sampling_ratio/max"]
    assert logged["sampling/importance_sampling_ratio/max"] <= 2.0
    assert any(not torch.equal(before[n], p.detach()) for n, p in trainer.model.named_parameters())


def test_without_trl_correction_a_rollout_func_gives_no_ratio_and_on_policy_otb(tiny_model_dir, tmp_path):
    reward, behaviour = RecordingReward(distinct=True), BehaviourPolicy()  # no group ties: the ratio matters
    args = make_args(tmp_path)
    trainer = OTBTrainer(
        tiny_model_dir,
        reward_funcs=reward,
        args=args,
        train_dataset=prompts_dataset(),
        rollout_func=behaviour,
    )
    batch = trainer._generate_and_score_completions(generation_inputs())
    p_token, _, proxy = independent_rollout_stats(trainer.model, batch, trainer.temperature)
    mask = batch["completion_mask"]
    rewards = torch.tensor(reward.calls[-1], dtype=torch.float32)
    group_ids = torch.arange(len(rewards)) // N
    expected = otb_advantages(rewards, proxy.float(), mask, group_ids, tail=trainer.args.otb_tail)
    # Precondition: the batch is off-policy enough that OTB with the ratio TRL would have formed gives other
    # advantages, so that matching the on-policy ones shows no ratio was used.
    sampling = torch.zeros(mask.shape, dtype=torch.float64)
    for i, row in enumerate(behaviour.logprobs):
        sampling[i, : len(row)] = torch.tensor(row, dtype=torch.float64)
    ratio = independent_ratio(torch.log(p_token), sampling, mask, "token_truncate", *CLIP["token"]).float()
    with_ratio = otb_advantages(rewards, proxy.float(), mask, group_ids, is_weights=ratio, tail=trainer.args.otb_tail)
    gap = (with_ratio - expected).abs().max().item()
    assert gap > 1e-4, f"precondition failed: a ratio would change the advantages by only {gap:.3g}"
    assert "sampling_per_token_logps" in batch and "importance_sampling_ratio" not in batch
    assert torch.allclose(batch["advantages"], expected, atol=1e-5)
