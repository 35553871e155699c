"""OTBTrainer as a drop-in for GRPOTrainer: the same signature, rewards owned by an environment
(``environment_factory``), TRL's own error without any reward source, ``trl.GRPOTrainer`` aliased to
OTBTrainer, and evaluation with one generation per prompt."""

from __future__ import annotations

import inspect
import itertools

import pytest
import torch
import trl
from trl.trainer.grpo_trainer import GRPOTrainer

import trl_otb.compat as compat
from trl_otb import OTBConfig, OTBTrainer, otb_advantages
from trl_otb.testing import N, RecordingReward, independent_rollout_stats, make_args, prompts_dataset, tool_ready_model


def test_signature_is_grpotrainers():
    ours, theirs = inspect.signature(OTBTrainer), inspect.signature(GRPOTrainer)
    assert list(ours.parameters) == list(theirs.parameters)
    for name, parameter in theirs.parameters.items():
        assert ours.parameters[name].default is parameter.default, name
    assert ours.parameters["reward_funcs"].default is None


class CountingEnv:
    """An environment that owns the reward: ``get_reward`` scores a rollout from the instance's own state."""

    _resets = itertools.count()
    rewards: list[float] = []

    def reset(self, **kwargs) -> None:
        self.reward = float(next(self._resets) % 3)  # varies within a group

    def add(self, a: int, b: int) -> str:
        """Add two integers.

        Args:
            a: The first integer.
            b: The second integer.

        Returns:
            The sum, as text.
        """
        return str(a + b)

    def get_reward(self) -> float:
        CountingEnv.rewards.append(self.reward)
        return self.reward


def test_environment_owned_rewards_train_with_otb_advantages(tiny_model_dir, tmp_path):
    model, tokenizer = tool_ready_model(tiny_model_dir)
    args = make_args(tmp_path, max_completion_length=8, max_tool_calling_iterations=1, learning_rate=1e-2)
    trainer = OTBTrainer(
        model, args=args, train_dataset=prompts_dataset(), processing_class=tokenizer, environment_factory=CountingEnv
    )
    assert trainer.reward_func_names == ["CountingEnv"]  # the environment is the only reward source

    CountingEnv.rewards.clear()
    inputs = [{"prompt": [{"role": "user", "content": "what is 2 + 3?"}]}] * N  # one group: tool prompts are long
    batch = trainer._generate_and_score_completions(inputs)
    rewards = torch.tensor(CountingEnv.rewards[-N:])
    assert rewards.unique().numel() > 1
    _, _, proxy = independent_rollout_stats(trainer.model, batch, trainer.temperature)
    mask = batch["completion_mask"] * batch.get("tool_mask", torch.ones_like(batch["completion_mask"]))
    expected = otb_advantages(
        rewards, proxy.float(), mask, torch.zeros(N, dtype=torch.long), align="valid", tail=trainer.args.otb_tail
    )
    torch.testing.assert_close(batch["advantages"], expected, atol=1e-5, rtol=1e-5)

    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    assert any(not torch.equal(before[n], p) for n, p in trainer.model.named_parameters())
    logged = trainer.state.log_history[0]
    assert "rewards/CountingEnv/mean" in logged and "otb/advantage_std" in logged


def test_no_reward_source_gets_trls_error(tiny_model_dir, tmp_path):
    with pytest.raises(ValueError, match="No reward source provided"):
        OTBTrainer(tiny_model_dir, args=make_args(tmp_path), train_dataset=prompts_dataset())


def test_works_when_trl_grpotrainer_is_aliased_to_otbtrainer(tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(trl, "GRPOTrainer", OTBTrainer)  # the most literal drop-in
    trainer = trl.GRPOTrainer(
        tiny_model_dir, reward_funcs=RecordingReward(), args=make_args(tmp_path), train_dataset=prompts_dataset()
    )
    trainer.train()
    assert "otb/advantage_std" in trainer.state.log_history[0]
    compat.check_trl_compatibility()  # checks TRL's class, not whatever `trl.GRPOTrainer` names now
    with pytest.raises(compat.TRLCompatibilityError):  # OTBTrainer's own overrides would not pass the check
        compat.check_trl_compatibility(OTBTrainer)


@pytest.mark.parametrize(
    "estimator,options",
    [
        ("otb", {}),
        ("otb", {"otb_tail": "zero"}),
        ("otb", {"otb_tail": "others_mean"}),
        ("rloo", {}),
        ("ogb", {}),
        ("opo", {}),
        ("grpo", {}),
    ],
)
def test_evaluation_with_one_generation_per_prompt(tiny_model_dir, tmp_path, estimator, options):
    args = make_args(
        tmp_path,
        advantage_estimator=estimator,
        **options,
        num_generations_eval=1,
        per_device_eval_batch_size=4,
        eval_strategy="steps",
        eval_steps=1,
    )
    reward, eval_prompts = RecordingReward(distinct=True), prompts_dataset(4)  # rows 1-3: rewards >= 0.1
    trainer = OTBTrainer(
        tiny_model_dir, reward_funcs=reward, args=args, train_dataset=prompts_dataset(), eval_dataset=eval_prompts
    )
    trainer.model.eval()
    batch = trainer._generate_and_score_completions(eval_prompts.to_list())
    assert batch["completion_ids"].size(0) == 4
    rewards = torch.tensor(reward.calls[-1])[:, None]
    mask = batch["completion_mask"].float()
    assert (rewards * mask).abs().sum() > 0, "precondition failed: no reward on any token, A = R = 0 says nothing"
    # Every completion is its own group. Under OTB's reference tail a singleton's baseline is 0 (otb_advantages'
    # docstring), so A = R on its tokens; every other estimator and tail (OTB's default among them) gives a singleton
    # advantage 0 ('grpo' is TRL's group mean, R itself for a singleton).
    reference = trainer.args.advantage_estimator == "otb" and trainer.args.otb_tail == "zero"
    assert reference == (options == {"otb_tail": "zero"})
    expected = rewards * mask if reference else torch.zeros_like(mask)
    torch.testing.assert_close(batch["advantages"], expected)
    metrics = trainer.evaluate()
    assert torch.isfinite(torch.tensor(metrics["eval_loss"]))


def test_num_generations_below_two_is_refused_for_training_only():
    cpu = dict(output_dir="unused", use_cpu=True, bf16=False, report_to="none", per_device_train_batch_size=4)
    with pytest.raises(ValueError, match="num_generations >= 2"):
        OTBConfig(num_generations=1, **cpu)
    assert OTBConfig(num_generations_eval=1, **cpu).num_generations_eval == 1
    with pytest.raises(ValueError, match="num_generations_eval"):
        OTBConfig(num_generations_eval=0, **cpu)
