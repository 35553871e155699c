"""OTBConfig checks every OTB field's type and range at construction (trl_otb/config.py), for every field it declares,
one added later included; and it does not repeat transformers' deprecation warning for TRL's own default."""

from __future__ import annotations

import math
import warnings
from dataclasses import fields

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trl_otb import OTBConfig
from trl_otb.config import otb_field_names

CPU = dict(output_dir="unused", use_cpu=True, bf16=False, report_to="none", per_device_train_batch_size=4)


@pytest.mark.parametrize(
    "overrides,needle",
    [
        # A string is truthy: it turned leave-one-out on, and the card printed it.
        ({"otb_leave_one_out": "no"}, "otb_leave_one_out='no' (str) is not True or False"),
        ({"otb_leave_one_out": "false"}, "a string such as 'no' or 'false' is read as True"),
        ({"otb_leave_one_out": 0}, "otb_leave_one_out=0 (int) is not True or False"),
        # inf turned OTB into the unscaled group mean; True was read as 1.
        ({"otb_epsilon": float("inf")}, "otb_epsilon=inf (float) is not a finite number"),
        ({"otb_epsilon": float("nan")}, "otb_epsilon=nan (float) is not a finite number"),
        ({"otb_epsilon": True}, "otb_epsilon=True (bool) is not a finite number"),
        ({"otb_epsilon": -1e-9}, "set otb_epsilon >= 0.0"),
        # None passed, then TRL failed with "unsupported operand type(s) for %".
        ({"num_generations": None}, "num_generations=None (NoneType) is not an integer"),
        ({"num_generations": 4.0}, "num_generations=4.0 (float) is not an integer"),
        ({"num_generations": True}, "num_generations=True (bool) is not an integer"),
        ({"num_generations": 1}, "Set num_generations >= 2"),
        ({"otb_fidelity_rows": 0}, "set otb_fidelity_rows >= 1"),
        ({"otb_fidelity_check_steps": 1.5}, "otb_fidelity_check_steps=1.5 (float) is not an integer"),
        ({"otb_fidelity_min_energy_spearman": 1.5}, "in [-1.0, 1.0]"),
        ({"otb_align": 1}, "otb_align=1 (int) is not a string or None"),
        ({"advantage_estimator": None}, "advantage_estimator=None (NoneType) is not a string"),
        ({"otb_tail": "carry"}, "unknown otb_tail='carry'; choose one of"),
    ],
)
def test_a_wrong_type_or_range_fails_at_construction_saying_what_to_set(overrides, needle):
    with pytest.raises(ValueError, match="^OTBConfig: ") as info:
        OTBConfig(**CPU, **overrides)
    assert needle in str(info.value)


def test_valid_values_of_every_type_are_accepted():
    args = OTBConfig(**CPU, otb_epsilon=0, otb_leave_one_out=True, num_generations=2, otb_align="valid")
    assert (args.otb_epsilon, args.otb_leave_one_out, args.num_generations) == (0, True, 2)
    assert OTBConfig(**CPU, advantage_estimator="grpo", scale_rewards=True).scale_rewards == "group"  # TRL's bool


# What each annotated type takes; everything else is a wrong type. A field added to OTBConfig later is drawn too.
ANY_VALUE = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**6), 10**6),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
    st.binary(max_size=4),
    st.complex_numbers(max_magnitude=10),
    st.tuples(st.integers()),
)


def _takes(annotation: str, value) -> bool:
    """Whether ``value`` has the type the field's annotation text names (bool is not an int; floats are finite)."""
    kinds = {part.strip() for part in annotation.split("|")}
    if value is None:
        return "None" in kinds
    if isinstance(value, bool):
        return "bool" in kinds
    if isinstance(value, int):
        return bool(kinds & {"int", "float"})
    if isinstance(value, float):
        return "float" in kinds and math.isfinite(value)
    return isinstance(value, str) and "str" in kinds


ANNOTATIONS = {name: str(vars(OTBConfig)["__annotations__"][name]) for name in otb_field_names()}
ANNOTATIONS["num_generations"] = "int"  # None fails inside TRL: refused
ANNOTATIONS["scale_rewards"] = "str | bool | None"  # TRL reads True as "group"


def test_the_property_test_draws_every_otb_field():
    own = set(vars(OTBConfig)["__annotations__"])
    assert set(ANNOTATIONS) == own and {"otb_epsilon", "otb_leave_one_out", "num_generations"} <= own
    assert [f.name for f in fields(OTBConfig) if f.name in own] == otb_field_names()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(name=st.sampled_from(sorted(ANNOTATIONS)), value=ANY_VALUE)
def test_a_value_of_the_wrong_type_for_any_otb_field_is_refused_naming_the_field(name, value):
    if _takes(ANNOTATIONS[name], value):
        return  # a right type: its range and choices are the other tests'
    with pytest.raises(ValueError, match="^OTBConfig: ") as info:
        OTBConfig(**CPU, **{name: value})
    assert f"Set {name} to " in str(info.value)


def _future_warnings(**overrides) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        OTBConfig(**CPU, **overrides)
    return [str(w.message) for w in caught if issubclass(w.category, FutureWarning)]


def test_trls_checkpointing_field_is_not_warned_about_but_other_warnings_are(monkeypatch):
    filters_before = list(warnings.filters)
    assert not any("gradient_checkpointing" in m for m in _future_warnings())  # TRL's default
    assert not any(
        "gradient_checkpointing" in m for m in _future_warnings(gradient_checkpointing=False)
    )  # TRL's field
    assert warnings.filters == filters_before  # the silencing ends with the construction
    # Any other warning raised while TRL builds the config still shows.
    from transformers import TrainingArguments

    original = TrainingArguments.__post_init__

    def warns_too(self):
        warnings.warn("another deprecation", FutureWarning, stacklevel=2)
        original(self)

    monkeypatch.setattr(TrainingArguments, "__post_init__", warns_too)
    assert _future_warnings() == ["another deprecation"]


def test_a_default_run_prints_no_checkpointing_deprecation_but_a_users_own_call_still_warns(tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    from trl_otb import OTBTrainer
    from trl_otb.testing import RecordingReward, prompts_dataset

    args = OTBConfig(**{**CPU, "output_dir": str(tmp_path)}, num_generations=4, max_completion_length=6, max_steps=1)
    assert args.gradient_checkpointing is True  # precondition: TRL's default, which TRL's code toggles every step
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    with warnings.catch_warnings(record=True) as before:  # does this transformers deprecate the name? (5.18 does not)
        warnings.simplefilter("always")
        AutoModelForCausalLM.from_pretrained(tiny_model_dir).gradient_checkpointing_enable()
    deprecated = any("`gradient_checkpointing_enable` is deprecated" in str(w.message) for w in before)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        OTBTrainer(model, reward_funcs=RecordingReward(), args=args, train_dataset=prompts_dataset()).train()
        assert not [w for w in caught if "gradient_checkpointing" in str(w.message)]
        model.gradient_checkpointing_enable()  # the user's own call of the deprecated name
    # outside OTBTrainer's calls the warning is transformers' own: shown exactly where transformers gives it
    assert any("`gradient_checkpointing_enable` is deprecated" in str(w.message) for w in caught) == deprecated
