"""trl_otb/core/estimators.py: the registry (each estimator declares its options once, and dispatch enforces the
declaration), infinite rewards, and the sequence-level baselines (GRPO, RLOO, OPO, OGB) against hand-computed numbers.

OTB itself, against its specification and its laws, is tested in tests/core/test_otb.py."""

from __future__ import annotations

import dataclasses
import inspect
import math
import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from trl_otb import (
    ESTIMATORS,
    InfiniteRewardWarning,
    compute_advantages,
    grpo_advantages,
    ogb_advantages,
    opo_advantages,
    otb_advantages,
    rloo_advantages,
)
from trl_otb.core import Estimator, register_estimator

from .tensor_helpers import assert_close, ids, t64

NAN = float("nan")
SETTINGS = settings(deadline=None, max_examples=80, derandomize=True)
LAW_SETTINGS = settings(deadline=None, max_examples=60, derandomize=True)

# A value each option accepts, that changes the result of the estimators that take it (on INPUTS below).
OPTION_VALUES = {
    "eps": 1e-3,
    "tail": "zero",  # differs from "zero_advantage" (OPTION_OTHER) at the lone tail of row 0
    "is_weights": torch.tensor([[1.5], [1.0], [0.5], [1.2]]),
    "align": "valid",
    "leave_one_out": True,
    "scale": "group",
    "shrinkage": "ess",
}
# The options an option needs beside it (OTB refuses shrinkage="ess" without them); the comparison keeps them.
OPTION_NEEDS = {"shrinkage": {"leave_one_out": True, "tail": "others_mean"}, "tail": {"leave_one_out": False}}
# Another value of each option, so that the comparison below holds whatever the default is.
OPTION_OTHER = {"tail": "zero_advantage", "leave_one_out": False, "shrinkage": "none"}
INPUTS = dict(
    rewards=torch.tensor([1.0, 0.0, 2.0, 0.5]),
    proxy=torch.tensor([[0.5, 1.0, 0.2], [1.0, 1.0, 1.0], [2.0, 0.1, 0.3], [0.7, 0.4, 1.1]]),
    mask=torch.tensor([[1, 1, 1], [1, 1, 0], [1, 0, 1], [1, 1, 0]]),
    group_ids=torch.tensor([0, 0, 0, 0]),
)


# ----------------------------------------------------------------------------------------------
# The registry, and compute_advantages dispatching by name
# ----------------------------------------------------------------------------------------------


def test_registered_names_are_the_keys_and_options_are_the_keyword_parameters():
    assert list(ESTIMATORS) == ["otb", "grpo", "rloo", "opo", "ogb"]
    for name, estimator in ESTIMATORS.items():
        assert isinstance(estimator, Estimator) and estimator.name == name
        assert isinstance(estimator.options, frozenset)
        params = inspect.signature(estimator.fn).parameters.values()
        assert estimator.options == {p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY}
    assert set(OPTION_VALUES) == set().union(*(e.options for e in ESTIMATORS.values()))


def test_declared_attributes():
    assert {n for n, e in ESTIMATORS.items() if e.uses_proxy} == {"otb", "ogb"}
    assert {n for n, e in ESTIMATORS.items() if e.token_level} == {"otb"}
    assert ESTIMATORS["otb"].options == {"eps", "tail", "is_weights", "align", "leave_one_out", "shrinkage"}
    assert ESTIMATORS["grpo"].options == {"scale"} and ESTIMATORS["ogb"].options == {"eps", "is_weights"}
    assert ESTIMATORS["rloo"].options == ESTIMATORS["opo"].options == frozenset()


def test_an_estimator_is_frozen_and_callable():
    with pytest.raises(dataclasses.FrozenInstanceError):
        ESTIMATORS["otb"].options = frozenset()
    got = ESTIMATORS["otb"](*INPUTS.values(), tail="none", leave_one_out=True)
    assert torch.equal(got, otb_advantages(**INPUTS, tail="none", leave_one_out=True))


@SETTINGS
@given(
    name=st.sampled_from(sorted(ESTIMATORS)),
    chosen=st.sets(st.sampled_from([*sorted(OPTION_VALUES), "bogus"])),
)
def test_each_estimator_accepts_exactly_its_declared_options(name, chosen):
    estimator = ESTIMATORS[name]
    options = {k: OPTION_VALUES.get(k, 1) for k in chosen}
    if "shrinkage" in chosen:  # with the options it needs beside it (OPTION_NEEDS), so a refusal is only by name
        options |= OPTION_NEEDS["shrinkage"]
    foreign = set(options) - estimator.options
    if not foreign:
        got = compute_advantages(name, **INPUTS, **options)
        assert torch.equal(got, estimator.fn(**INPUTS, **options))
        return
    with pytest.raises(TypeError) as info:
        compute_advantages(name, **INPUTS, **options)
    message = str(info.value)
    assert repr(name) in message and repr(sorted(foreign)) in message
    assert (repr(sorted(estimator.options)) if estimator.options else "no options") in message


@pytest.mark.parametrize("name", sorted(ESTIMATORS))
def test_each_declared_option_reaches_the_estimator(name):
    """Every declared option changes the result: it is passed on, not dropped."""
    for option in ESTIMATORS[name].options:
        needs = OPTION_NEEDS.get(option, {})
        other = {option: OPTION_OTHER[option]} if option in OPTION_OTHER else {}
        plain = compute_advantages(name, **INPUTS, **(needs | other))
        changed = compute_advantages(name, **INPUTS, **(needs | {option: OPTION_VALUES[option]}))
        assert not torch.allclose(changed, plain), option


@SETTINGS
@given(name=st.sampled_from(sorted(ESTIMATORS)), data=st.data())
def test_uses_proxy_and_token_level_are_what_the_estimator_does(name, data):
    """uses_proxy=False: the proxy cannot change the advantages. token_level=False: one value per sequence."""
    B, T = 6, 5
    floats = st.floats(0.0, 2.0, allow_nan=False, width=32)
    proxy = torch.tensor(data.draw(st.lists(floats, min_size=B * T, max_size=B * T))).view(B, T)
    mask = torch.tensor(data.draw(st.lists(st.booleans(), min_size=B * T, max_size=B * T))).view(B, T)
    rewards = torch.tensor(data.draw(st.lists(st.sampled_from([0.0, 0.5, 1.0]), min_size=B, max_size=B)))
    group_ids = torch.tensor([0, 0, 0, 1, 1, 1])
    estimator = ESTIMATORS[name]
    adv = estimator(rewards, proxy, mask, group_ids)
    if not estimator.uses_proxy:
        assert torch.equal(adv, estimator(rewards, torch.ones(B, T), mask, group_ids))
    if not estimator.token_level:
        for row, m in zip(adv, mask):
            assert torch.all(row[m] == row[m][:1]) and torch.all(row[~m] == 0)


def test_registering_checks_the_declaration_and_unknown_names_list_the_choices():
    with pytest.raises(ValueError, match="already registered"):
        register_estimator("otb", uses_proxy=True, token_level=True)(otb_advantages)

    def halves(rewards, proxy, mask, group_ids, *, factor=0.5):
        return factor * rewards[:, None] * mask

    with pytest.raises(TypeError, match=r"\['factor'\]"):
        register_estimator("halves", options=("scale",), uses_proxy=False, token_level=False)(halves)
    assert "halves" not in ESTIMATORS
    try:
        assert register_estimator("halves", options=("factor",), uses_proxy=False, token_level=False)(halves) is halves
        got = compute_advantages("halves", **INPUTS, factor=2.0)
        assert torch.equal(got, 2.0 * INPUTS["rewards"][:, None] * INPUTS["mask"])
        with pytest.raises(TypeError, match="'halves'"):
            compute_advantages("halves", **INPUTS, scale="group")
    finally:
        ESTIMATORS.pop("halves", None)
    with pytest.raises(ValueError, match="choose one of") as info:
        compute_advantages("ppo", **INPUTS)
    assert all(repr(name) in str(info.value) for name in ESTIMATORS)


def test_unknown_option_is_an_error():
    with pytest.raises((TypeError, ValueError), match="bogus"):
        compute_advantages("otb", **INPUTS, bogus=1)


def test_dispatch_forwards_each_estimators_own_options():
    x = dict(
        rewards=t64([1.0, 0.0, 2.0]),
        proxy=t64([[0.5, 1.0, 0.2], [1.0, 1.0, 1.0], [2.0, 0.1, 0.3]]),
        mask=torch.tensor([[1, 1, 1], [1, 1, 0], [1, 0, 1]]),
        group_ids=ids([0, 0, 0]),
    )
    isw = t64([[1.5], [1.0], [0.5]])
    got = compute_advantages("otb", **x, tail="none", align="valid", leave_one_out=True, eps=1e-3, is_weights=isw)
    want = otb_advantages(**x, tail="none", align="valid", leave_one_out=True, eps=1e-3, is_weights=isw)
    assert_close(got, want, atol=0, rtol=0)
    got = compute_advantages("grpo", **x, scale="group")
    assert_close(got, grpo_advantages(**x, scale="group"), atol=0, rtol=0)
    got = compute_advantages("ogb", **x, is_weights=isw, eps=1e-3)
    assert_close(got, ogb_advantages(**x, is_weights=isw, eps=1e-3), atol=0, rtol=0)
    # the options actually change the result
    assert not torch.allclose(compute_advantages("otb", **x), want)


@pytest.mark.parametrize(
    "estimator, option, takes",
    [
        ("grpo", "tail", "['scale']"),
        ("ogb", "scale", "['eps', 'is_weights']"),
        ("rloo", "leave_one_out", "no options"),
    ],
)
def test_an_option_the_estimator_does_not_take_is_an_error(estimator, option, takes):
    """Another estimator's option is rejected, naming the estimator, the option and what it does take."""
    with pytest.raises(TypeError) as info:
        compute_advantages(estimator, **INPUTS, **{option: "none" if option != "leave_one_out" else True})
    for part in (repr(estimator), repr(option), takes):
        assert part in str(info.value)


# ----------------------------------------------------------------------------------------------
# Infinite rewards: excluded like NaN, and warned
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(ESTIMATORS))
def test_infinite_rewards_are_excluded_like_nan_but_warned(name):
    rewards = torch.tensor([1.0, math.inf, 0.0, 2.0])
    with pytest.warns(InfiniteRewardWarning, match=r"1 of 4 rewards are infinite \(rows \[1\]\)"):
        got = compute_advantages(name, rewards, INPUTS["proxy"], INPUTS["mask"], INPUTS["group_ids"])
    assert (got[1] == 0).all()
    as_nan = compute_advantages(
        name, rewards.nan_to_num(posinf=math.nan), INPUTS["proxy"], INPUTS["mask"], INPUTS["group_ids"]
    )
    assert torch.equal(got, as_nan)


def test_finite_rewards_raise_no_infinite_reward_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error", InfiniteRewardWarning)
        otb_advantages(**INPUTS)


# ----------------------------------------------------------------------------------------------
# Sequence-level baselines: hand-computed
# ----------------------------------------------------------------------------------------------

# Group 0: R = [1, 2, 3] (mean 2, centred [-1, 0, 1], Bessel std 1);
# group 1: R = [0, 6] (mean 3, centred [-3, 3], Bessel std sqrt(18)).
# Batch: R = [1, 2, 3, 0, 6], mean 2.4; squares of (R - 2.4): 1.96 + .16 + .36 + 5.76 + 12.96 = 21.2,
# Bessel var 21.2 / 4 = 5.3.
SEQ_REWARDS = t64([1.0, 2.0, 3.0, 0.0, 6.0])
SEQ_GROUPS = ids([0, 0, 0, 1, 1])
SEQ_MASK = torch.tensor([[1, 1], [1, 0], [1, 1], [1, 1], [1, 0]])
SEQ_PROXY = torch.ones(5, 2, dtype=torch.float64)


def on_tokens(per_row, mask=SEQ_MASK):
    return torch.tensor(per_row, dtype=torch.float64)[:, None] * mask.double()


def test_grpo_unscaled_is_the_group_mean_baseline():
    adv = grpo_advantages(SEQ_REWARDS, SEQ_PROXY, SEQ_MASK, SEQ_GROUPS, scale="none")
    assert_close(adv, on_tokens([-1.0, 0.0, 1.0, -3.0, 3.0]), atol=1e-12)


def test_grpo_group_scale_divides_by_group_std_plus_1e_4():
    adv = grpo_advantages(SEQ_REWARDS, SEQ_PROXY, SEQ_MASK, SEQ_GROUPS, scale="group")
    s1 = math.sqrt(18.0) + 1e-4
    assert_close(adv, on_tokens([-1 / 1.0001, 0.0, 1 / 1.0001, -3 / s1, 3 / s1]), atol=1e-12)


def test_grpo_batch_scale_divides_group_centred_rewards_by_batch_std():
    adv = grpo_advantages(SEQ_REWARDS, SEQ_PROXY, SEQ_MASK, SEQ_GROUPS, scale="batch")
    s = math.sqrt(5.3) + 1e-4
    assert_close(adv, on_tokens([-1 / s, 0.0, 1 / s, -3 / s, 3 / s]), atol=1e-12)


def test_grpo_excludes_nan_rewards_but_counts_empty_completions_like_trl():
    # group 0: R = [1, NaN, 3 (empty mask)] -> mean over finite = 2: A = [-1, 0, 0 (no tokens)]
    # group 1: R = [NaN, 5] -> single finite reward -> A = 5 - 5 = 0.
    rewards = t64([1.0, NAN, 3.0, NAN, 5.0])
    mask = torch.tensor([[1, 1], [1, 1], [0, 0], [1, 1], [1, 0]])
    adv = grpo_advantages(rewards, torch.ones(5, 2), mask, ids([0, 0, 0, 1, 1]), scale="none")
    assert_close(adv.double(), [[-1.0, -1.0], [0, 0], [0, 0], [0, 0], [0, 0]], atol=1e-6)
    for scale in ("group", "batch"):
        adv = grpo_advantages(rewards, torch.ones(5, 2), mask, ids([0, 0, 0, 1, 1]), scale=scale)
        assert torch.isfinite(adv).all()
        assert adv[1].abs().sum() == 0 and adv[3:].abs().sum() == 0


def test_grpo_rejects_unknown_scale():
    with pytest.raises(ValueError, match="scale"):
        grpo_advantages(SEQ_REWARDS, SEQ_PROXY, SEQ_MASK, SEQ_GROUPS, scale="std")


def test_rloo_hand_computed():
    # group 0: b = [(2+3)/2, (1+3)/2, (1+2)/2] = [2.5, 2, 1.5] -> A = [-1.5, 0, 1.5]
    # group 1: b = [6, 0] -> A = [-6, 6]
    adv = rloo_advantages(SEQ_REWARDS, SEQ_PROXY, SEQ_MASK, SEQ_GROUPS)
    assert_close(adv, on_tokens([-1.5, 0.0, 1.5, -6.0, 6.0]), atol=1e-12)


def test_rloo_excludes_invalid_rows_and_singletons_get_zero_advantage():
    # group 0: rows 0, 2 valid (row 1 NaN, row 3 empty) -> b0 = 4, b2 = 1 -> A = [-3, 0, 3, 0]
    # group 8: row 4 alone -> A = 0 (no other member to compare with; TRL's GRPO gives a singleton 0 too)
    rewards = t64([1.0, NAN, 4.0, 7.0, 5.0])
    mask = torch.tensor([[1, 1], [1, 1], [1, 0], [0, 0], [1, 1]])
    adv = rloo_advantages(rewards, torch.ones(5, 2), mask, ids([0, 0, 0, 0, 8]))
    assert_close(adv.double(), [[-3.0, -3.0], [0, 0], [3.0, 0], [0, 0], [0.0, 0.0]], atol=1e-6)


@LAW_SETTINGS
@given(sizes=st.lists(st.integers(2, 5), min_size=1, max_size=3), data=st.data())
def test_rloo_is_n_over_n_minus_one_times_unscaled_grpo(sizes, data):
    group_ids = [g * 3 + 1 for g, n in enumerate(sizes) for _ in range(n)]
    perm = data.draw(st.permutations(range(len(group_ids))))
    group_ids = [group_ids[p] for p in perm]
    B = len(group_ids)
    rewards = torch.tensor(data.draw(st.lists(st.floats(-5, 5), min_size=B, max_size=B)), dtype=torch.float64)
    T = 4
    lengths = data.draw(st.lists(st.integers(1, T), min_size=B, max_size=B))
    mask = torch.tensor([[1] * L + [0] * (T - L) for L in lengths])
    proxy = torch.rand(B, T, dtype=torch.float64)
    n = torch.tensor([group_ids.count(g) for g in group_ids], dtype=torch.float64)
    rloo = rloo_advantages(rewards, proxy, mask, ids(group_ids))
    grpo = grpo_advantages(rewards, proxy, mask, ids(group_ids), scale="none")
    assert_close(rloo, (n / (n - 1))[:, None] * grpo, atol=1e-10, rtol=1e-10)


def test_opo_is_the_length_weighted_mean_counting_masked_tokens():
    # lengths: row 0 mask [1,0,1] -> 2 (holes do not count), row 1 -> 3, row 2 -> 1; R = [1, 0, 2]
    # b = (2*1 + 3*0 + 1*2) / 6 = 2/3 -> A = [1/3, -2/3, 4/3];  group 4: row 3 alone -> A = 0
    rewards = t64([1.0, 0.0, 2.0, 9.0])
    mask = torch.tensor([[1, 0, 1], [1, 1, 1], [1, 0, 0], [1, 1, 0]])
    adv = opo_advantages(rewards, torch.ones(4, 3), mask, ids([0, 0, 0, 4]))
    assert_close(adv.double(), on_tokens([1 / 3, -2 / 3, 4 / 3, 0.0], mask), atol=1e-6)


def test_opo_excludes_nan_rows():
    # row 1 NaN: b = (1*1 + 3*0) / 4 = 1/4 -> A = [3/4, 0, -1/4]
    rewards = t64([1.0, NAN, 0.0])
    mask = torch.tensor([[1, 0, 0], [1, 1, 1], [1, 1, 1]])
    adv = opo_advantages(rewards, torch.ones(3, 3), mask, ids([0, 0, 0]))
    assert_close(adv.double(), on_tokens([0.75, 0.0, -0.25], mask), atol=1e-6)


def test_ogb_is_the_energy_weighted_sequence_mean():
    # W0 = .5 + .5 = 1 (t=2 masked out), W1 = 1 + 2 + .5 = 3.5; R = [1, 0]
    # b = 1 / 4.5 = 2/9 -> A = [7/9, -2/9];  group 2: row 2 alone -> A = 0
    rewards = t64([1.0, 0.0, -3.0])
    proxy = t64([[0.5, 0.5, 9.0], [1.0, 2.0, 0.5], [1.0, 1.0, 1.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0]])
    adv = ogb_advantages(rewards, proxy, mask, ids([0, 0, 2]))
    assert_close(adv, on_tokens([7 / 9, -2 / 9, 0.0], mask), atol=1e-7)
    # is_weights [2, 1, 1] on row 0: W0 = .5*4 + .5 = 2.5 -> b = 2.5/6 = 5/12 -> A = [7/12, -5/12]
    isw = t64([[2.0, 1.0, 1.0], [1.0, 1.0, 1.0], [1.0, 1.0, 1.0]])
    adv = ogb_advantages(rewards, proxy, mask, ids([0, 0, 2]), is_weights=isw)
    assert_close(adv, on_tokens([7 / 12, -5 / 12, 0.0], mask), atol=1e-7)


@pytest.mark.parametrize("estimator", ["grpo", "rloo", "opo", "ogb"])
def test_sequence_estimators_are_constant_on_tokens_and_zero_off_mask(estimator):
    mask = torch.tensor([[1, 0, 1, 1], [1, 1, 0, 0], [1, 1, 1, 1]])
    adv = compute_advantages(
        estimator, t64([1.0, 0.0, 0.5]), torch.rand(3, 4, dtype=torch.float64), mask, ids([0, 0, 0])
    )
    assert (adv[mask == 0] == 0).all()
    for i in range(3):
        on = adv[i][mask[i].bool()]
        assert torch.allclose(on, on[0].expand_as(on))
    assert adv.abs().sum() > 0


def test_otb_uniform_proxy_equals_opo_on_a_single_token_each():
    # T = 1: W = 1 for every member, lengths 1: OTB (self-inclusive), OPO, OGB(w=1) and GRPO all give R - mean.
    rewards = t64([3.0, 1.0, 2.0])
    mask = torch.ones(3, 1)
    proxy = torch.ones(3, 1, dtype=torch.float64)
    for estimator, options in (("otb", {"leave_one_out": False}), ("grpo", {}), ("opo", {}), ("ogb", {})):
        adv = compute_advantages(estimator, rewards, proxy, mask, ids([0, 0, 0]), **options)
        assert_close(adv.double(), [[1.0], [-1.0], [0.0]], atol=1e-7)
