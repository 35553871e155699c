"""OTBConfig (trl_otb/config.py) refuses every combination that would make OTB silently wrong, and documents every
field it adds. The guard against TRL changes: tests/test_compat.py."""

from __future__ import annotations

import pytest
from datasets import Dataset
from trl import GRPOConfig

from trl_otb import ESTIMATORS, OTBConfig, OTBTrainer

CPU = dict(output_dir="unused", use_cpu=True, bf16=False, report_to="none", per_device_train_batch_size=4)


def test_defaults_are_otb_with_four_generations_and_raw_advantages():
    args = OTBConfig(**CPU)
    assert (args.advantage_estimator, args.otb_proxy, args.num_generations) == ("otb", "logit", 4)
    assert args.scale_rewards == "none" and args.otb_epsilon == 1e-8
    # study 4's decision (research/estimator_study): exactly unbiased leave-one-out OTB, the ESS shrinkage
    assert (args.otb_tail, args.otb_leave_one_out, args.otb_shrinkage) == ("others_mean", True, None)
    assert args.estimator_options()["shrinkage"] == "ess"


@pytest.mark.parametrize(
    "overrides,needle",
    [
        ({"temperature": 0.0}, "Set temperature > 0"),
        ({"temperature": -0.5}, "greedy decoding"),
        ({"temperature": float("nan")}, "Set temperature > 0"),
        ({"num_generations": 1}, "num_generations >= 2"),
        ({"num_generations_eval": 0}, "num_generations_eval"),
        ({"advantage_estimator": "ppo"}, "unknown advantage_estimator"),
        ({"otb_proxy": "exact"}, "unknown otb_proxy"),
        ({"otb_tail": "carry"}, "unknown otb_tail"),
        ({"otb_align": "turn"}, "unknown otb_align"),
        ({"otb_epsilon": -1.0}, "otb_epsilon"),
        ({"scale_rewards": "group"}, "scale_rewards='none'"),
        ({"scale_rewards": True}, "scale_rewards='none'"),
        ({"multi_objective_aggregation": "normalize_then_sum"}, "sum_then_normalize"),
        ({"loss_type": "vespo"}, "token-level"),
        ({"loss_type": "a_future_loss"}, "token by token"),
        ({"off_policy_mask_threshold": 0.5}, "off_policy_mask_threshold"),
        # An option the chosen estimator does not take is refused, not silently dropped.
        ({"advantage_estimator": "rloo", "otb_leave_one_out": False}, "otb_leave_one_out=False has no effect"),
        ({"advantage_estimator": "ogb", "otb_tail": "none"}, "otb_tail='none' has no effect"),
        ({"advantage_estimator": "opo", "otb_align": "valid"}, "otb_align='valid' has no effect"),
        ({"advantage_estimator": "grpo", "otb_epsilon": 1e-6}, "otb_epsilon=1e-06 has no effect"),
        ({"advantage_estimator": "rloo", "otb_proxy": "uniform"}, "otb_proxy='uniform' has no effect"),
    ],
)
def test_invalid_combinations_fail_at_construction_saying_what_to_change(overrides, needle):
    with pytest.raises(ValueError, match="OTBConfig") as info:
        OTBConfig(**{**CPU, **overrides})
    assert needle in str(info.value)


def test_sequence_level_estimators_accept_what_otb_refuses():
    OTBConfig(**CPU, advantage_estimator="grpo", scale_rewards="group", loss_type="vespo")
    OTBConfig(**CPU, advantage_estimator="ogb", off_policy_mask_threshold=0.5)
    # ...and the options they do take.
    OTBConfig(**CPU, advantage_estimator="ogb", otb_epsilon=1e-6, otb_proxy="uniform")


def test_scale_rewards_is_read_as_trl_normalised_it():
    # TRL turns scale_rewards=False into "none" in its own __post_init__; OTBConfig validates after it.
    assert OTBConfig(**CPU, scale_rewards=False).scale_rewards == "none"
    assert OTBConfig(**CPU, advantage_estimator="grpo", scale_rewards=True).scale_rewards == "group"


def test_scale_rewards_follows_the_estimator_unless_set():
    """'grpo' asked for by name is TRL's GRPO, std-scaled per group like GRPOConfig's default; the other estimators
    stay raw; an explicit value is kept."""
    assert GRPOConfig(**CPU, num_generations=4).scale_rewards == "group"  # precondition: TRL's default
    assert OTBConfig(**CPU, advantage_estimator="grpo").scale_rewards == "group"
    assert OTBConfig(**CPU).scale_rewards == "none"
    assert {OTBConfig(**CPU, advantage_estimator=e).scale_rewards for e in ESTIMATORS if e != "grpo"} == {"none"}
    for value in ("none", "batch", "group"):
        assert OTBConfig(**CPU, advantage_estimator="grpo", scale_rewards=value).scale_rewards == value
    assert OTBConfig(**CPU, advantage_estimator="otb", scale_rewards="none").scale_rewards == "none"


def test_liger_fused_cross_entropy_is_refused_by_the_trainer(tiny_model_dir):
    # TRL's GRPOTrainer refuses it (it would drop the fused head and its sum pi^2); compat.REQUIRED checks that line.
    args = OTBConfig(**CPU, use_liger_kernel=True, liger_kernel_config={"fused_linear_cross_entropy": True})
    with pytest.raises(ValueError, match="fused_linear_cross_entropy"):
        OTBTrainer(
            tiny_model_dir,
            reward_funcs=lambda completions, **kw: [0.0] * len(completions),
            args=args,
            train_dataset=Dataset.from_list([{"prompt": "1 + 1 ="}] * 4),
        )


def test_trainer_rejects_a_plain_grpo_config(tiny_model_dir):
    with pytest.raises(TypeError, match="OTBConfig"):
        OTBTrainer(
            tiny_model_dir,
            reward_funcs=lambda completions, **kw: [0.0] * len(completions),
            args=GRPOConfig(**CPU, num_generations=4),
            train_dataset=[],
        )


def test_every_config_field_has_help_metadata():
    own = set(OTBConfig.__dataclass_fields__) - set(GRPOConfig.__dataclass_fields__)
    own |= {"num_generations", "scale_rewards"}
    for name in own:
        assert OTBConfig.__dataclass_fields__[name].metadata.get("help"), name
        assert name in OTBConfig.__doc__, f"{name} missing from the OTBConfig docstring"
