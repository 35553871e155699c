"""OTBConfig refuses every combination that would make OTB silently wrong; the TRL guard trips on change."""

from __future__ import annotations

import inspect

import pytest
from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer

from trl_otb import OTBConfig, OTBTrainer, compat
from trl_otb.card import TEMPLATE_FRAGMENTS
from trl_otb.compat import TRLCompatibilityError, check_trl_compatibility

CPU = dict(output_dir="unused", use_cpu=True, bf16=False, report_to="none", per_device_train_batch_size=4)


def test_defaults_are_otb_with_four_generations_and_raw_advantages():
    args = OTBConfig(**CPU)
    assert (args.advantage_estimator, args.otb_proxy, args.num_generations) == ("otb", "logit", 4)
    assert args.scale_rewards == "none" and args.otb_tail == "zero" and args.otb_epsilon == 1e-8


@pytest.mark.parametrize(
    "overrides,needle",
    [
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
        ({"advantage_estimator": "rloo", "otb_leave_one_out": True}, "otb_leave_one_out=True has no effect"),
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


def test_installed_trl_passes_the_guard():
    check_trl_compatibility()


def test_guard_fails_loudly_when_an_overridden_trl_method_changes(monkeypatch):
    original = inspect.getsource
    target = GRPOTrainer._compute_loss

    def altered(obj):
        source = original(obj)
        return (
            source.replace("if advantages.dim() == 1:", "advantages = advantages.mean(-1)")
            if obj is target
            else source
        )

    monkeypatch.setattr(compat.inspect, "getsource", altered)
    with pytest.raises(TRLCompatibilityError, match="_compute_loss"):
        check_trl_compatibility()


MIRRORED = [
    (name, fragment)
    for name, (_, fragments) in compat.REQUIRED.items()
    for fragment in fragments
    if name in ("_generate_and_score_completions", "_compute_loss", "__init__", "create_model_card")
]


@pytest.mark.parametrize("name,fragment", MIRRORED, ids=[f"{n}:{f[:40]}" for n, f in MIRRORED])
def test_guard_fails_when_a_fragment_we_rely_on_or_mirror_changes(monkeypatch, name, fragment):
    original = inspect.getsource
    target = getattr(GRPOTrainer, name)
    monkeypatch.setattr(
        compat.inspect,
        "getsource",
        lambda obj: original(obj).replace(fragment, "changed = True") if obj is target else original(obj),
    )
    with pytest.raises(TRLCompatibilityError, match=name):
        check_trl_compatibility()


@pytest.mark.parametrize("fragment", TEMPLATE_FRAGMENTS)
def test_guard_fails_when_trls_card_template_loses_a_line_the_card_edits(monkeypatch, tmp_path, fragment):
    from importlib import resources

    template = resources.files("trl").joinpath("templates", "lm_model_card.md").read_text()
    (tmp_path / "templates").mkdir()
    (tmp_path / "templates" / "lm_model_card.md").write_text(template.replace(fragment, "changed"))
    monkeypatch.setattr(compat.resources, "files", lambda package: tmp_path if package == "trl" else None)
    with pytest.raises(TRLCompatibilityError, match="card template lm_model_card.md"):
        check_trl_compatibility()


def test_guard_fails_when_the_rollout_pass_no_longer_comes_first(monkeypatch):
    (name, first, then), *_ = compat.REQUIRED_ORDER
    original = inspect.getsource
    target = getattr(GRPOTrainer, name)

    def swapped(obj):
        source = original(obj)
        if obj is not target:
            return source
        return source.replace(first, "<FIRST>").replace(then, first).replace("<FIRST>", then)

    monkeypatch.setattr(compat.inspect, "getsource", swapped)
    with pytest.raises(TRLCompatibilityError, match="before"):
        check_trl_compatibility()


def test_forward_keys_are_trl_log_prob_parameters():
    from trl_otb.trainer import _FORWARD_KEYS

    assert {"pixel_values", "image_grid_thw", "num_images", "token_type_ids"} <= set(_FORWARD_KEYS)
    assert not {"input_ids", "attention_mask", "logits_to_keep", "batch_size", "compute_entropy"} & set(_FORWARD_KEYS)


def test_guard_fails_when_a_relied_on_method_disappears(monkeypatch):
    monkeypatch.delattr(GRPOTrainer, "_calculate_rewards")
    with pytest.raises(TRLCompatibilityError, match="_calculate_rewards no longer exists"):
        check_trl_compatibility()


def test_guard_fails_on_another_trl_version(monkeypatch):
    import trl

    monkeypatch.setattr(trl, "__version__", "1.17.0")
    with pytest.raises(TRLCompatibilityError, match="1.17.0"):
        check_trl_compatibility()
