"""OTBTrainer end to end on the tiny random Llama: the advantages it trains on are the ones the
contract defines (leave-one-out too), computed from statistics we recompute independently here, and the otb/ metrics it
logs. Off-policy batches: tests/test_trainer_offpolicy.py; the in-training fidelity check and QLoRA:
tests/test_trainer_fidelity.py."""

from __future__ import annotations

import gc
import math
import warnings
import weakref

import pytest
import torch
from transformers import AutoModelForCausalLM

from trl_otb import InfiniteRewardWarning, NonFiniteGradientWarning, OTBTrainer, grpo_advantages, otb_advantages
from trl_otb.config import TOKEN_LEVEL_LOSSES
from trl_otb.core import SHIFT_INVARIANT_TAILS
from trl_otb.core.diagnostics import ADVANTAGE_KEYS, PROXY_KEYS
from trl_otb.testing import (
    N,
    RecordingReward,
    generation_inputs,
    independent_rollout_stats,
    make_args,
    prompts_dataset,
)


@pytest.mark.parametrize("temperature", [0.7, 1.0])
def test_sum_pi_sq_from_fused_head_equals_full_softmax(tiny_model_dir, tmp_path, temperature):
    trainer = OTBTrainer(
        tiny_model_dir,
        reward_funcs=RecordingReward(),
        args=make_args(tmp_path, temperature=temperature),
        train_dataset=prompts_dataset(),
    )
    batch = trainer._generate_and_score_completions(generation_inputs())
    with trainer._otb_capturing() as capture:  # one more no-grad pass through TRL's fused head, recorded
        rollout = trainer._otb_extra_pass(batch, capture)
    logps, log_sum_sq = rollout.logps, rollout.log_sum_sq_probs
    p_ref, sum_sq_ref, _ = independent_rollout_stats(trainer.model, batch, temperature)
    mask = batch["completion_mask"].bool()
    assert torch.allclose(torch.exp(log_sum_sq.double())[mask], sum_sq_ref[mask], atol=1e-5, rtol=0)
    assert torch.allclose(torch.exp(logps.double())[mask], p_ref[mask], atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    "source,overrides,fused_passes",
    [
        ("collected-while-sampling", {}, 0),
        # Truncation warpers run after the collector: it still sees the temperature-only distribution.
        ("collected-with-top-k", {"top_k": 3, "top_p": 0.9}, 0),
        # A repetition penalty changes the scores generate sees, so OTBTrainer runs its own pass instead.
        ("own-pass", {"repetition_penalty": 1.05}, 1),
        ("rides-along-trl-pass", {"steps_per_generation": 2}, 1),
    ],
)
def test_trainer_advantages_equal_contract_on_independent_inputs(
    tiny_model_dir, tmp_path, source, overrides, fused_passes
):
    off_policy = "steps_per_generation" in overrides
    reward = RecordingReward()
    trainer = OTBTrainer(
        tiny_model_dir, reward_funcs=reward, args=make_args(tmp_path, **overrides), train_dataset=prompts_dataset()
    )
    passes = []
    hook = trainer.model.register_forward_hook(
        lambda m, a, kw, out: passes.append(kw.get("fused_lm_head", False)), with_kwargs=True
    )
    batch = trainer._generate_and_score_completions(generation_inputs())
    hook.remove()
    assert passes, "precondition failed: the hook saw no forward of the trainer's model"
    # At most one fused (log-prob) pass over the batch: TRL's when it runs one, ours when nothing else can serve.
    assert sum(passes) == fused_passes
    assert ("old_per_token_logps" in batch) == off_policy

    _, _, proxy = independent_rollout_stats(trainer.model, batch, trainer.temperature)
    rewards = torch.tensor(reward.calls[-1], dtype=torch.float32)
    mask = batch["completion_mask"]
    group_ids = torch.arange(len(rewards)) // N
    expected = otb_advantages(rewards, proxy.float(), mask, group_ids, tail=trainer.args.otb_tail)
    assert batch["advantages"].shape == batch["completion_ids"].shape
    assert torch.allclose(batch["advantages"], expected, atol=1e-5)
    assert (batch["advantages"][mask == 0] == 0).all()


@pytest.mark.parametrize("scale_rewards", [None, "none"])
def test_grpo_estimator_reproduces_trl_advantages(tiny_model_dir, tmp_path, scale_rewards):
    """'grpo' is TRL's GRPO: std-scaled per group when scale_rewards is left alone (GRPOConfig's default), unscaled
    when asked."""
    reward = RecordingReward(distinct=True)
    overrides = {} if scale_rewards is None else {"scale_rewards": scale_rewards}
    args = make_args(tmp_path, advantage_estimator="grpo", **overrides)
    trainer = OTBTrainer(tiny_model_dir, reward_funcs=reward, args=args, train_dataset=prompts_dataset())
    scale = scale_rewards or "group"
    assert trainer.scale_rewards == scale  # what TRL's own advantage code reads
    batch = trainer._generate_and_score_completions(generation_inputs())
    rewards = torch.tensor(reward.calls[-1], dtype=torch.float32)
    mask, group_ids = batch["completion_mask"], torch.arange(len(rewards)) // N
    ours = {s: grpo_advantages(rewards, torch.ones(mask.shape), mask, group_ids, scale=s) for s in ("group", "none")}
    assert not torch.allclose(ours["group"], ours["none"], atol=1e-3)  # precondition: the two scalings differ here
    assert torch.allclose(batch["advantages"], ours[scale], atol=1e-5)


def test_all_unscorable_rewards_give_zero_advantages_and_finite_loss(tiny_model_dir, tmp_path):
    reward = RecordingReward(none_rows=range(100))
    trainer = OTBTrainer(
        tiny_model_dir, reward_funcs=reward, args=make_args(tmp_path), train_dataset=prompts_dataset()
    )
    batch = trainer._generate_and_score_completions(generation_inputs())
    assert (batch["advantages"] == 0).all()
    trainer.train()
    assert all(math.isfinite(entry.get("loss", 0.0)) for entry in trainer.state.log_history)


def test_unscorable_rows_are_excluded_from_their_group(tiny_model_dir, tmp_path):
    reward = RecordingReward(none_rows={0, 5})
    trainer = OTBTrainer(
        tiny_model_dir, reward_funcs=reward, args=make_args(tmp_path), train_dataset=prompts_dataset()
    )
    batch = trainer._generate_and_score_completions(generation_inputs())
    assert (batch["advantages"][0] == 0).all() and (batch["advantages"][5] == 0).all()
    _, _, proxy = independent_rollout_stats(trainer.model, batch, trainer.temperature)
    rewards = torch.tensor([math.nan if r is None else r for r in reward.calls[-1]])
    expected = otb_advantages(
        rewards, proxy.float(), batch["completion_mask"], torch.arange(8) // N, tail=trainer.args.otb_tail
    )
    assert torch.allclose(batch["advantages"], expected, atol=1e-5)


class InfiniteOnRows(RecordingReward):
    """RecordingReward, except +inf on row 1 and -inf on row 6 of every batch (a buggy reward function)."""

    __name__ = "buggy_reward"

    def __call__(self, completions, completion_ids, **kwargs):
        out = super().__call__(completions, completion_ids, **kwargs)
        out[1], out[6] = math.inf, -math.inf
        return out


@pytest.mark.parametrize("estimator", ["otb", "grpo"])
def test_infinite_rewards_are_unscorable_warned_and_counted(tiny_model_dir, tmp_path, estimator):
    reward = InfiniteOnRows()
    args = make_args(tmp_path, advantage_estimator=estimator, scale_rewards="none")
    trainer = OTBTrainer(
        tiny_model_dir, reward_funcs=[reward, RecordingReward()], args=args, train_dataset=prompts_dataset()
    )
    trainer.model.train()  # as during training: the metrics go to "train"
    with pytest.warns(InfiniteRewardWarning, match=r"'buggy_reward' on 2 of 8 completions") as caught:
        batch = trainer._generate_and_score_completions(generation_inputs())
    assert "recording_reward" not in str(caught[0].message)  # the finite function is not blamed
    assert trainer._metrics["train"]["otb/infinite_rewards"] == [2.0]
    advantages = batch["advantages"]
    assert torch.isfinite(advantages).all()
    assert (advantages[1] == 0).all() and (advantages[6] == 0).all()
    # The others are what the estimator gives with those two rows unscorable (NaN): they left their groups.
    rewards = torch.tensor([math.nan if i in (1, 6) else 2 * r for i, r in enumerate(reward.calls[-1])])
    mask = batch["completion_mask"]
    if estimator == "otb":
        _, _, proxy = independent_rollout_stats(trainer.model, batch, trainer.temperature)
        expected = otb_advantages(rewards, proxy.float(), mask, torch.arange(8) // N, tail=trainer.args.otb_tail)
    else:
        expected = grpo_advantages(rewards, torch.ones(mask.shape), mask, torch.arange(8) // N, scale="none")
    assert torch.allclose(advantages, expected, atol=1e-5)
    # A batch without infinite rewards logs a count of 0 and says nothing.
    trainer.reward_funcs = [RecordingReward(), RecordingReward()]
    with warnings.catch_warnings():
        warnings.simplefilter("error", InfiniteRewardWarning)
        trainer._generate_and_score_completions(generation_inputs())
    assert trainer._metrics["train"]["otb/infinite_rewards"] == [2.0, 0.0]


def test_two_trainers_on_one_model(tiny_model_dir, tmp_path):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    first = OTBTrainer(
        model, reward_funcs=RecordingReward(), args=make_args(tmp_path), train_dataset=prompts_dataset()
    )
    first.train()
    assert len(model._forward_hooks) == 1
    first_ref = weakref.ref(first)
    reward = RecordingReward()
    # A repetition penalty: generate's scores are not the sampling distribution, so the second trainer runs its
    # own log-prob pass, recorded by its forward hook.
    args = make_args(tmp_path / "second", repetition_penalty=1.05)
    second = OTBTrainer(model, reward_funcs=reward, args=args, train_dataset=prompts_dataset())
    del first
    gc.collect()
    assert first_ref() is None, "the first trainer is still referenced after a second one wrapped its model"
    assert len(model._forward_hooks) == 1
    # The second trainer's advantages are the contract's, from statistics recomputed independently.
    batch = second._generate_and_score_completions(generation_inputs())
    _, _, proxy = independent_rollout_stats(second.model, batch, second.temperature)
    rewards = torch.tensor(reward.calls[-1], dtype=torch.float32)
    expected = otb_advantages(
        rewards, proxy.float(), batch["completion_mask"], torch.arange(8) // N, tail=second.args.otb_tail
    )
    assert torch.allclose(batch["advantages"], expected, atol=1e-5)


def test_a_trainer_whose_model_a_newer_one_took_over_says_so(tiny_model_dir, tmp_path):
    """A notebook cell run twice: the second OTBTrainer on the same model object takes its recording hook and LM head
    over, and training the first again says what happened (not "recorded no log_sum_sq_probs")."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    args = make_args(tmp_path, num_iterations=2)  # TRL's own rollout pass: the statistic rides along in it
    first = OTBTrainer(model, reward_funcs=RecordingReward(), args=args, train_dataset=prompts_dataset())
    batch = first._generate_and_score_completions(generation_inputs())
    assert batch["advantages"].dim() == 2  # precondition: while it owns the model, the first trainer's OTB works
    second = OTBTrainer(model, reward_funcs=RecordingReward(), args=args, train_dataset=prompts_dataset())
    with pytest.raises(RuntimeError, match="taken over by a newer OTBTrainer built on the same model object") as info:
        first.train()
    assert "Train the newest trainer, or build a new OTBTrainer" in str(info.value)
    second.train()
    assert second.state.global_step == 1


def test_fully_masked_batch_trains_without_nan(tiny_model_dir, tmp_path):
    # max_completion_length=2 truncates everything; masking truncated completions leaves no token.
    args = make_args(tmp_path, max_completion_length=2, mask_truncated_completions=True, max_steps=2)
    trainer = OTBTrainer(tiny_model_dir, reward_funcs=RecordingReward(), args=args, train_dataset=prompts_dataset())
    trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert losses and all(math.isfinite(x) for x in losses)


@pytest.mark.parametrize("loss_type", TOKEN_LEVEL_LOSSES)
def test_train_changes_parameters_for_each_supported_loss(tiny_model_dir, tmp_path, loss_type):
    args = make_args(tmp_path, loss_type=loss_type, learning_rate=1e-2, max_steps=2)
    trainer = OTBTrainer(tiny_model_dir, reward_funcs=RecordingReward(), args=args, train_dataset=prompts_dataset())
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    changed = [n for n, p in trainer.model.named_parameters() if not torch.equal(before[n], p.detach())]
    assert changed, f"no parameter moved with loss_type={loss_type}"
    logged = trainer.state.log_history[0]
    assert "otb/advantage_std" in logged and "otb/proxy_mean" in logged


@pytest.mark.parametrize(
    "estimator,proxy", [("rloo", "logit"), ("opo", "logit"), ("ogb", "logit"), ("otb", "uniform")]
)
def test_other_estimators_and_proxies_train(tiny_model_dir, tmp_path, estimator, proxy):
    args = make_args(tmp_path, advantage_estimator=estimator, otb_proxy=proxy, learning_rate=1e-2)
    trainer = OTBTrainer(tiny_model_dir, reward_funcs=RecordingReward(), args=args, train_dataset=prompts_dataset())
    trainer.train()
    assert math.isfinite(trainer.state.log_history[0]["loss"])


def test_evaluate_uses_num_generations_eval(tiny_model_dir, tmp_path):
    args = make_args(
        tmp_path, num_generations_eval=2, per_device_eval_batch_size=4, eval_strategy="steps", eval_steps=1
    )
    trainer = OTBTrainer(
        tiny_model_dir,
        reward_funcs=RecordingReward(),
        args=args,
        train_dataset=prompts_dataset(),
        eval_dataset=prompts_dataset(4),
    )
    metrics = trainer.evaluate()
    assert "eval_otb/advantage_std" in metrics and math.isfinite(metrics["eval_loss"])


def test_model_card_and_checkpoint_carry_otb(tiny_model_dir, tmp_path, check_model_card):
    args = make_args(tmp_path, save_strategy="steps", save_steps=1)
    trainer = OTBTrainer(tiny_model_dir, reward_funcs=RecordingReward(), args=args, train_dataset=prompts_dataset())
    trainer.train()
    trainer.save_model()
    # The checkpoint save wrote OTBTrainer's card; a local base model has no Hub id to link.
    card = check_model_card(tmp_path / "out" / "README.md", base_model=None).text
    assert "2602.07078" in card and "| group size N (num_generations) | `4` |" in card
    assert (tmp_path / "out" / "checkpoint-1" / "trainer_state.json").exists()
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    assert reloaded.config.vocab_size == trainer.model.config.vocab_size


def test_extreme_logits_give_a_finite_proxy_and_loss(tiny_model_dir, tmp_path):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    with torch.no_grad():
        model.lm_head.weight.mul_(1e3)  # logits of order 1e3-1e4: near one-hot distributions
    trainer = OTBTrainer(
        model,
        reward_funcs=RecordingReward(),
        args=make_args(tmp_path, temperature=1.0),
        train_dataset=prompts_dataset(),
    )
    trainer.model.train()  # as during training: the metrics go to "train"
    batch = trainer._generate_and_score_completions(generation_inputs())
    assert torch.isfinite(batch["advantages"]).all()
    logged = trainer._metrics["train"]["otb/proxy_max"]
    assert logged and all(math.isfinite(v) for v in logged)


def test_trainer_leave_one_out_equals_contract(tiny_model_dir, tmp_path):
    reward = RecordingReward()
    args = make_args(tmp_path, otb_leave_one_out=True, otb_tail="zero")  # the reference: A = R where alone
    trainer = OTBTrainer(tiny_model_dir, reward_funcs=reward, args=args, train_dataset=prompts_dataset())
    batch = trainer._generate_and_score_completions(generation_inputs())
    _, _, proxy = independent_rollout_stats(trainer.model, batch, trainer.temperature)
    rewards = torch.tensor(reward.calls[-1], dtype=torch.float32)
    mask = batch["completion_mask"]
    group_ids = torch.arange(len(rewards)) // N
    expected = otb_advantages(rewards, proxy.float(), mask, group_ids, leave_one_out=True, tail=trainer.args.otb_tail)
    assert torch.allclose(batch["advantages"], expected, atol=1e-5)
    assert not torch.allclose(
        expected,
        otb_advantages(rewards, proxy.float(), mask, group_ids, tail=trainer.args.otb_tail, leave_one_out=False),
        atol=1e-4,
    )
    # Where a member is the only active one of its group, its advantage is its reward.
    active = mask.view(-1, N, mask.size(1)).sum(dim=1).repeat_interleave(N, dim=0)
    alone = (active == 1) & mask.bool()
    assert alone.any()
    assert torch.allclose(batch["advantages"][alone], rewards[:, None].expand_as(mask)[alone])


@pytest.mark.parametrize("estimator, has_proxy_keys", [("rloo", False), ("ogb", True)])
def test_trainer_logs_proxy_keys_only_for_an_estimator_that_uses_the_proxy(
    tiny_model_dir, tmp_path, estimator, has_proxy_keys
):
    args = make_args(tmp_path, advantage_estimator=estimator)
    trainer = OTBTrainer(tiny_model_dir, reward_funcs=RecordingReward(), args=args, train_dataset=prompts_dataset())
    trainer._generate_and_score_completions(generation_inputs())
    mode = "train" if trainer.model.training else "eval"
    logged = {k.removeprefix("otb/") for k, v in trainer._metrics[mode].items() if k.startswith("otb/") and v}
    assert set(ADVANTAGE_KEYS) <= logged
    assert (set(PROXY_KEYS) <= logged) == has_proxy_keys
    assert not (set(PROXY_KEYS) & logged) or has_proxy_keys


def constant_reward(completions, **kwargs):
    """0.7 for every completion: every group ties, so the batch carries no signal."""
    return [0.7] * len(completions)


@pytest.mark.parametrize(
    "estimator,options",
    [
        ("otb", {}),  # OTBConfig's default OTB options: a tie moves nothing with what a user gets without choosing
        ("grpo", {}),
        ("rloo", {}),
        ("ogb", {}),
        # Li et al.'s self-inclusive baseline on each shift-invariant tail; leave-one-out on zero_advantage
        *[("otb", {"otb_tail": tail, "otb_leave_one_out": False}) for tail in SHIFT_INVARIANT_TAILS],
        ("otb", {"otb_tail": "zero_advantage"}),
    ],
)
def test_tied_rewards_move_no_parameter(tiny_model_dir, tmp_path, estimator, options):
    """A batch whose groups all tie gets advantages of exactly 0, so Adam (lr 1e-3) moves no parameter at all.

    The control, the same trainer with rewards that vary, must move them first (the precondition)."""
    control = OTBTrainer(
        tiny_model_dir,
        reward_funcs=RecordingReward(),
        args=make_args(tmp_path / "control", advantage_estimator=estimator, learning_rate=1e-3, **options),
        train_dataset=prompts_dataset(),
    )
    before = {n: p.detach().clone() for n, p in control.model.named_parameters()}
    control.train()
    assert any(not torch.equal(before[n], p) for n, p in control.model.named_parameters()), "control did not move"

    trainer = OTBTrainer(
        tiny_model_dir,
        reward_funcs=constant_reward,
        args=make_args(tmp_path / "tied", advantage_estimator=estimator, learning_rate=1e-3, **options),
        train_dataset=prompts_dataset(),
    )
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    logged = trainer.state.log_history[0]
    assert logged["otb/advantage_abs_max"] == 0.0
    moved = [n for n, p in trainer.model.named_parameters() if not torch.equal(before[n], p)]
    assert not moved, f"tied rewards moved {moved}"


def huge_reward(completions, **kwargs):
    """1e30 or 0: finite rewards whose advantages overflow the fp32 gradient's norm."""
    return [1e30 * (i % 2) for i in range(len(completions))]


def test_a_non_finite_gradient_norm_is_warned_and_counted(tiny_model_dir, tmp_path):
    args = make_args(tmp_path, otb_tail="others_mean", max_steps=2, learning_rate=1e-3)
    trainer = OTBTrainer(tiny_model_dir, reward_funcs=huge_reward, args=args, train_dataset=prompts_dataset())
    with pytest.warns(NonFiniteGradientWarning, match="Rescale the reward"):
        trainer.train()
    logged = [entry for entry in trainer.state.log_history if "otb/nonfinite_grad_norm" in entry]
    assert logged and logged[0]["otb/advantage_abs_max"] >= 1e29  # the precondition: the advantages are huge
    assert all(entry["otb/nonfinite_grad_norm"] == 1.0 for entry in logged)
    assert not math.isfinite(logged[0]["grad_norm"])

    # With rewards of order 1 the count is 0, and no such warning is raised.
    fine = OTBTrainer(
        tiny_model_dir,
        reward_funcs=RecordingReward(),
        args=make_args(tmp_path / "fine"),
        train_dataset=prompts_dataset(),
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error", NonFiniteGradientWarning)
        fine.train()
    assert fine.state.log_history[0]["otb/nonfinite_grad_norm"] == 0.0


class OffsetReward:
    """A reward that varies within groups, in multiples of 1/8 (so ``R + offset`` is exact in fp32 for the offsets
    used here), plus a settable ``offset``; it remembers its last output."""

    __name__ = "offset_reward"

    def __init__(self):
        self.offset, self.last = 0.0, None

    def __call__(self, completions, completion_ids, **kwargs):
        self.last = [float(len(ids) % 3) + 0.125 * (i % N) + self.offset for i, ids in enumerate(completion_ids)]
        return self.last


def _has_lone_tail(mask) -> bool:
    """Whether some group has one member strictly the longest: past the second-longest, a fallback applies."""
    top2 = mask.sum(dim=1).view(-1, N).topk(2, dim=1).values
    return bool((top2[:, 0] > top2[:, 1]).any())


def _advantages_under_offsets(trainer, reward, offsets):
    """The trainer's advantages on one generation batch, regenerated under the same seed for each reward offset."""
    out = []
    for offset in offsets:
        reward.offset = offset
        torch.manual_seed(0)
        batch = trainer._generate_and_score_completions(generation_inputs())
        out.append((batch["completion_ids"], batch["completion_mask"], batch["advantages"]))
    return out


@pytest.mark.parametrize(
    "options",
    [
        {},  # OTBConfig's defaults: the law holds for what a user gets without choosing
        *[{"otb_tail": tail, "otb_leave_one_out": False} for tail in SHIFT_INVARIANT_TAILS],
        {"otb_tail": "zero_advantage"},  # leave-one-out (the default) with the zero_advantage tail
    ],
    ids=lambda options: ",".join(f"{k}={v}" for k, v in options.items()) or "defaults",
)
def test_a_reward_offset_changes_no_advantage(tiny_model_dir, tmp_path, options):
    """Through OTBTrainer: adding a constant to every reward leaves every token's advantage bit for bit unchanged."""
    reward = OffsetReward()
    trainer = OTBTrainer(
        tiny_model_dir, reward_funcs=reward, args=make_args(tmp_path, **options), train_dataset=prompts_dataset()
    )
    assert trainer.args.advantage_estimator == "otb", "precondition failed: not OTB"
    (ids, mask, base), *shifted = _advantages_under_offsets(trainer, reward, [0.0, 0.5, -1000.0])
    assert base.abs().max() > 0, "precondition failed: the batch has no signal"
    assert _has_lone_tail(mask), "precondition failed: no group has a member alone at its tail"
    for ids_c, mask_c, adv in shifted:
        assert torch.equal(ids_c, ids) and torch.equal(mask_c, mask), "precondition failed: another batch"
        assert torch.equal(adv, base)


def test_the_reference_tail_moves_with_a_reward_offset(tiny_model_dir, tmp_path):
    """The documented exception: otb_tail='zero' forces B = 0 where one member is alone, so A = R moves there."""
    reward = OffsetReward()
    trainer = OTBTrainer(
        tiny_model_dir,
        reward_funcs=reward,
        args=make_args(tmp_path, otb_tail="zero"),
        train_dataset=prompts_dataset(),
    )
    (ids, mask, base), (ids_c, _, shifted) = _advantages_under_offsets(trainer, reward, [0.0, 0.5])
    assert torch.equal(ids_c, ids), "precondition failed: another batch"
    assert _has_lone_tail(mask), "precondition failed: no group has a member alone at its tail"
    moved = (shifted - base).abs()
    assert torch.allclose(moved.max(), torch.tensor(0.5)), "A = R at a lone tail moves by the offset"


# The exactly unbiased OTB options end to end: leave-one-out with the others' mean at lone tokens
# (otb_tail="others_mean"), with and without the ESS shrinkage: they train, a reward offset changes no advantage,
# and tied rewards move no parameter.
UNBIASED_OPTIONS = [
    {"otb_leave_one_out": True, "otb_tail": "others_mean", "otb_shrinkage": "none"},
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
    for options in (
        {"otb_shrinkage": "ess", "otb_leave_one_out": False, "otb_tail": "others_mean"},
        {"otb_shrinkage": "ess", "otb_leave_one_out": True, "otb_tail": "zero_advantage"},
    ):
        with pytest.raises(ValueError, match="otb_leave_one_out=True and otb_tail='others_mean'"):
            make_args(tmp_path, **options)
    with pytest.raises(ValueError, match="unknown otb_shrinkage"):
        make_args(tmp_path, otb_shrinkage="kish")


@pytest.mark.parametrize(
    "estimator,options,differs",
    [
        ("rloo", {}, False),  # read against the others' mean, its own baseline
        ("grpo", {"scale_rewards": "none"}, False),
        ("otb", {"otb_leave_one_out": True, "otb_tail": "others_mean", "otb_proxy": "uniform"}, None),
    ],
)
def test_the_trainer_reads_a_leave_one_out_baseline_against_the_others_mean(
    tiny_model_dir, tmp_path, estimator, options, differs
):
    trainer = OTBTrainer(
        tiny_model_dir,
        reward_funcs=RecordingReward(),
        args=make_args(tmp_path, advantage_estimator=estimator, **options),
        train_dataset=prompts_dataset(),
    )
    trainer.train()
    logged = trainer.state.log_history[0]
    assert logged["otb/advantage_abs_max"] > 0  # precondition: the rewards differ within a group
    if differs is False:
        assert logged["otb/baseline_differs_frac"] == 0.0 and logged["otb/baseline_shift"] < 1e-6
    else:  # uniform weights: the baseline is the others' mean wherever they are all still active
        assert logged["otb/baseline_differs_frac"] < 1.0
