"""The TRL guard (trl_otb/compat.py) passes on the installed TRL and trips on any change to what OTBTrainer relies on
or mirrors: a method's source, its order of passes, the model card template, the version. OTBConfig's own checks:
tests/test_config.py."""

from __future__ import annotations

import inspect

import pytest
from trl import GRPOTrainer

from trl_otb import compat
from trl_otb.card import TEMPLATE_FRAGMENTS
from trl_otb.compat import TRLCompatibilityError, check_trl_compatibility


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
    if name
    in (
        "_generate_and_score_completions",
        "_calculate_rewards",
        "_get_train_sampler",
        "_compute_loss",
        "__init__",
        "create_model_card",
    )
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


def test_guard_fails_when_the_sampler_would_keep_an_incomplete_batch(monkeypatch):
    from trl.trainer.utils import RepeatSampler

    original = inspect.getsource
    target = RepeatSampler.__iter__
    assert compat.WHOLE_BATCHES_ONLY in original(target)  # precondition: the installed TRL drops incomplete batches
    monkeypatch.setattr(
        compat.inspect,
        "getsource",
        lambda obj: original(obj).replace(compat.WHOLE_BATCHES_ONLY, "pass") if obj is target else original(obj),
    )
    with pytest.raises(TRLCompatibilityError, match="RepeatSampler"):
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
