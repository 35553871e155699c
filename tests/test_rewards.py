"""trl_otb/rewards.py through OTBTrainer: every reward output GRPOTrainer reads gives the same rewards under both
trainers, checked where TRL reads them (``trainer.reward_funcs`` stays TRL's list, callable as TRL's own tests call
it); NaN rewards are warned and counted naming the function, a None is "not scored by this function", and a reward
too large for fp32 names its function."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer

from trl_otb import OTBTrainer
from trl_otb.rewards import NaNRewardWarning
from trl_otb.testing import N, make_args, prompts_dataset, tool_ready_model

B = 2 * N  # one generation batch of make_args
COMPLETIONS = [f"{i} apples" for i in range(B)]
SCORES = [float(i % 3) - 0.5 * (i % 2) for i in range(B)]  # varies within each group of N


def _batch():
    inputs = [{"prompt": f"count {i // N}:"} for i in range(B)]
    prompts = [row["prompt"] for row in inputs]
    return inputs, prompts, list(COMPLETIONS), [[3 + i] for i in range(B)]


def _rewards(trainer) -> torch.Tensor:
    """``[B, n_funcs]`` as the trainer reads them, on one fixed batch (TRL's ``_calculate_rewards``), in training."""
    trainer.model.train()
    return trainer._calculate_rewards(*_batch())


def _grpo_args(tmp_path):
    """GRPOTrainer's config with make_args' settings."""
    return GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, gradient_checkpointing=False,
                      per_device_train_batch_size=B, num_generations=N, max_completion_length=12, max_steps=1,
                      report_to="none", save_strategy="no", seed=0, temperature=0.7)  # fmt: skip


# Outputs GRPOTrainer reads correctly, as a reward model's logits or a NumPy pipeline gives them.
ACCEPTED = [
    ("list", lambda s: list(s)),
    ("column-tensor", lambda s: torch.tensor(s)[:, None]),  # a reward model's .logits: [B, 1]
    ("one-element-tensors", lambda s: [torch.tensor([x]) for x in s]),
    ("flat-tensor", lambda s: torch.tensor(s)),
    ("numpy-array", lambda s: np.array(s)),
    ("numpy-scalars", lambda s: [np.float32(x) for x in s]),
    ("generator", lambda s: (x for x in s)),
    ("with-none", lambda s: [None if i == 1 else x for i, x in enumerate(s)]),
]


@pytest.mark.parametrize("make", [a[1] for a in ACCEPTED], ids=[a[0] for a in ACCEPTED])
def test_every_output_grpo_trainer_reads_gives_the_same_rewards_under_otb_trainer(tiny_model_dir, tmp_path, make):
    def score(completions, **kwargs):
        return make([SCORES[COMPLETIONS.index(c)] for c in completions])

    dataset = prompts_dataset()
    grpo = GRPOTrainer(tiny_model_dir, reward_funcs=score, args=_grpo_args(tmp_path / "g"), train_dataset=dataset)
    otb = OTBTrainer(tiny_model_dir, reward_funcs=score, args=make_args(tmp_path / "o"), train_dataset=dataset)
    expected = _rewards(grpo)
    assert expected.shape == (B, 1) and not torch.isnan(expected).all()  # precondition: GRPOTrainer reads it
    torch.testing.assert_close(_rewards(otb), expected, equal_nan=True, rtol=0, atol=0)
    assert otb.reward_funcs == [score]  # the public list is TRL's, not a wrapper


def test_a_reward_models_column_output_trains_a_step(tiny_model_dir, tmp_path):
    def logits_reward(completions, **kwargs):
        return torch.tensor([[float(len(c) % 4)] for c in completions])  # [B, 1]

    trainer = OTBTrainer(
        tiny_model_dir, reward_funcs=logits_reward, args=make_args(tmp_path), train_dataset=prompts_dataset()
    )
    trainer.train()
    assert trainer.state.global_step == 1 and "rewards/logits_reward/mean" in trainer.state.log_history[0]


def test_a_chat_prompt_whose_only_message_is_empty_trains_as_under_grpo_trainer(tiny_model_dir, tmp_path):
    blank = Dataset.from_dict({"prompt": [[{"role": "user", "content": ""}]] * 4})  # the template still gives a prefix
    trainer = OTBTrainer(tiny_model_dir, reward_funcs=lambda completions, **k: [1.0] * len(completions),
                         args=make_args(tmp_path), train_dataset=blank)  # fmt: skip
    trainer.train()
    assert trainer.state.global_step == 1


class ScoredEnvironment:  # owns its reward
    def reset(self, **kwargs):
        return "say 1"

    def act(self, x: int) -> int:
        """Act.

        Args:
            x: A value.

        Returns:
            The value.
        """
        return x

    def get_reward(self) -> float:
        return 1.0


class PlainEnvironment:  # no get_reward: scored by reward_funcs
    def reset(self, **kwargs):
        return "say 2"

    def play(self, x: int) -> int:
        """Play.

        Args:
            x: A value.

        Returns:
            The value.
        """
        return x


def test_trls_environment_reward_stays_callable_as_trls_own_test_calls_it(tiny_model_dir, tmp_path):
    """TRL 1.16's test_environment_owned_reward_mixed_environments, on the tiny model (its Hub model is offline)."""

    def format_reward(completions, **kwargs):
        return [0.0 for _ in completions]

    model, tokenizer = tool_ready_model(tiny_model_dir)
    trainer = OTBTrainer(
        model,
        reward_funcs=format_reward,
        args=make_args(tmp_path, per_device_train_batch_size=3, num_generations=3),
        train_dataset=Dataset.from_dict({"environment": ["scored", "scored2", "plain"]}),
        processing_class=tokenizer,
        environment_factory={"scored": ScoredEnvironment, "scored2": ScoredEnvironment, "plain": PlainEnvironment},
    )
    assert trainer.reward_func_names == ["format_reward", "ScoredEnvironment"]
    assert trainer.reward_weights.tolist() == [1.0, 1.0]
    assert trainer.reward_funcs[-1](environments=[ScoredEnvironment(), PlainEnvironment()]) == [1.0, None]


# --- NaN, None, +-inf and overflow ---------------------------------------------------------------------------------


def _two_funcs_trainer(tiny_model_dir, tmp_path, second, **overrides):
    def steady(completions, **kwargs):
        return [1.0] * len(completions)

    return OTBTrainer(tiny_model_dir, reward_funcs=[steady, second], args=make_args(tmp_path, **overrides),
                      train_dataset=prompts_dataset())  # fmt: skip


def test_a_nan_from_one_function_is_warned_counted_and_makes_the_completion_unscorable(tiny_model_dir, tmp_path):
    def ratio(completions, **kwargs):
        return [float("nan") if i in (2, 5) else 0.5 for i in range(len(completions))]  # a 0/0 on two rows

    trainer = _two_funcs_trainer(tiny_model_dir, tmp_path, ratio)
    with pytest.warns(NaNRewardWarning, match=r"returned NaN \('ratio' on 2 of 8 completions\).*otb/nan_rewards"):
        rewards = _rewards(trainer)
    assert torch.isnan(rewards[[2, 5]]).all()  # the whole row, not the other function's value alone
    assert not torch.isnan(rewards[[0, 1, 3, 4, 6, 7]]).any()
    assert trainer._metrics["train"]["otb/nan_rewards"] == [2.0]
    assert trainer._metrics["train"]["otb/infinite_rewards"] == [0.0]


def test_a_none_is_not_scored_by_that_function_and_is_not_warned(tiny_model_dir, tmp_path):
    def partial(completions, **kwargs):
        return [None if i == 3 else 0.5 for i in range(len(completions))]

    trainer = _two_funcs_trainer(tiny_model_dir, tmp_path, partial)
    with warnings.catch_warnings():
        warnings.simplefilter("error", NaNRewardWarning)
        rewards = _rewards(trainer)
    assert rewards[3, 0] == 1.0 and torch.isnan(rewards[3, 1])  # the other function still scores row 3
    assert trainer._metrics["train"]["otb/nan_rewards"] == [0.0]


def test_an_infinite_reward_is_warned_and_counted_as_before(tiny_model_dir, tmp_path):
    def blowup(completions, **kwargs):
        return [float("inf") if i == 0 else 0.0 for i in range(len(completions))]

    trainer = _two_funcs_trainer(tiny_model_dir, tmp_path, blowup)
    with pytest.warns(UserWarning, match=r"\+inf or -inf \('blowup' on 1 of 8"):
        rewards = _rewards(trainer)
    assert torch.isnan(rewards[0]).all() and trainer._metrics["train"]["otb/infinite_rewards"] == [1.0]


def test_a_reward_too_large_for_fp32_advantages_names_its_function(tiny_model_dir, tmp_path):
    def huge(completions, **kwargs):
        return [1e33 if i == 4 else 0.0 for i in range(len(completions))]

    trainer = _two_funcs_trainer(tiny_model_dir, tmp_path, huge)
    with pytest.raises(ValueError, match=r"too large for OTB's fp32 advantages \('huge' on 1 of 8 .*up to 1e\+33"):
        _rewards(trainer)
    grpo = _two_funcs_trainer(tiny_model_dir, tmp_path, huge, advantage_estimator="grpo", scale_rewards="group")
    assert _rewards(grpo)[4, 1] == pytest.approx(1e33)  # the grpo arm reads them as GRPOTrainer does
