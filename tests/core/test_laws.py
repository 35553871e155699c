"""The laws users rely on, over every registered estimator and every option (hypothesis).

- shift invariance: A(R + c) = A(R);
- positive-scale equivariance, for the estimators that divide by no std: A(aR) = a A(R);
- permutation equivariance: permuting rows together with their group ids permutes the advantages;
- independence between groups: a group's advantages do not depend on the other groups' rows;
- ties: a group whose valid rewards are all equal gets advantages of exactly 0 (fp32 and bf16 inputs).

An option that breaks a law by design has a test asserting that it does, so the documentation stays true:
OTB's offset-dependent tails (``"zero"``, the reference, and ``"none"``) break shift invariance and ties; GRPO's std
scalings are not scale-equivariant (they are scale-invariant instead); ``scale="batch"`` couples the groups.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from trl_otb import ESTIMATORS, compute_advantages
from trl_otb.core import ALIGNS, GRPO_SCALES, OFFSET_DEPENDENT_TAILS, SHIFT_INVARIANT_TAILS, SHRINKAGES, TAILS

from .tensor_helpers import draw_mask_row

NAN = float("nan")
LAWS = settings(deadline=None, max_examples=25, derandomize=True)


def valid_options(options):
    """False for the combinations OTB refuses: ``shrinkage="ess"`` needs leave-one-out with ``tail="others_mean"``."""
    if options.get("shrinkage", "none") == "none":
        return True
    return options["leave_one_out"] and options["tail"] == "others_mean"


def configurations():
    """(estimator, options) for every registered estimator and every valid combination of its discrete options."""
    out = []
    for name, estimator in ESTIMATORS.items():
        choices = {
            "tail": TAILS,
            "leave_one_out": (False, True),
            "align": ALIGNS,
            "scale": GRPO_SCALES,
            "shrinkage": SHRINKAGES,
        }
        keys = [k for k in choices if k in estimator.options]
        for values in itertools.product(*(choices[k] for k in keys)):
            if valid_options(options := dict(zip(keys, values))):
                out.append((name, options))
    return out


CONFIGS = configurations()
CONFIG_IDS = [name + "".join(f"-{k}={v}" for k, v in options.items()) for name, options in CONFIGS]


def offset_dependent(name, options):
    return name == "otb" and options["tail"] in OFFSET_DEPENDENT_TAILS


def divides_by_std(name, options):
    return name == "grpo" and options["scale"] != "none"


def couples_groups(name, options):
    return name == "grpo" and options["scale"] == "batch"


def test_the_configurations_cover_every_estimator_and_option():
    assert {name for name, _ in CONFIGS} == set(ESTIMATORS)
    for name, estimator in ESTIMATORS.items():
        drawn = set().union(*(options for n, options in CONFIGS if n == name))
        # eps and is_weights are continuous inputs: the inputs below draw is_weights, eps keeps its default.
        assert drawn == set(estimator.options) - {"eps", "is_weights"}


@st.composite
def batches(draw, *, ties=False, dtype=torch.float64):
    """A batch of 1 to 4 groups (ids in any order), rows with NaN rewards, empty masks, holes, optional is_weights."""
    G = draw(st.integers(1, 4))
    sizes = [draw(st.integers(1, 4)) for _ in range(G)]
    T = draw(st.integers(1, 7))
    group_ids = [g * 7 - 3 for g, n in enumerate(sizes) for _ in range(n)]
    order = draw(st.permutations(range(len(group_ids))))
    group_ids = [group_ids[i] for i in order]
    B = len(group_ids)
    value = st.floats(-5, 5, allow_subnormal=False)
    tie = {g: draw(value) for g in set(group_ids)}
    rewards = [tie[g] if ties else draw(value) for g in group_ids]
    rewards = [NAN if draw(st.integers(0, 9)) == 0 else r for r in rewards]
    mask = [draw_mask_row(draw, T, ["contiguous", "contiguous", "holes", "empty"]) for _ in range(B)]
    proxy = [[draw(st.floats(0.05, 2.0)) for _ in range(T)] for _ in range(B)]
    batch = dict(
        rewards=torch.tensor(rewards, dtype=dtype),
        proxy=torch.tensor(proxy, dtype=dtype),
        mask=torch.tensor(mask, dtype=torch.bool),
        group_ids=torch.tensor(group_ids),
    )
    if draw(st.booleans()):
        batch["is_weights"] = torch.tensor([[draw(st.floats(0.5, 2.0))] for _ in range(B)], dtype=dtype)
    return batch


def advantages(name, options, batch, rewards=None):
    inputs = dict(batch, rewards=batch["rewards"] if rewards is None else rewards)
    is_weights = inputs.pop("is_weights", None)
    if is_weights is not None and "is_weights" in ESTIMATORS[name].options:
        options = dict(options, is_weights=is_weights)
    return compute_advantages(name, inputs["rewards"], inputs["proxy"], inputs["mask"], inputs["group_ids"], **options)


def scale_of(batch, c=0.0):
    finite = batch["rewards"][torch.isfinite(batch["rewards"])]
    return 1.0 + abs(c) + (float(finite.abs().max()) if finite.numel() else 0.0)


def close(actual, expected, atol):
    torch.testing.assert_close(actual, expected, atol=atol, rtol=1e-9)


# ----------------------------------------------------------------------------------------------
# The laws
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "options"), [c for c in CONFIGS if not offset_dependent(*c)], ids=str)
@LAWS
@given(batch=batches(), c=st.floats(-10, 10))
def test_shift_invariance(name, options, batch, c):
    adv = advantages(name, options, batch)
    shifted = advantages(name, options, batch, rewards=batch["rewards"] + c)
    # Only the rounding of R + c itself remains (fp64); the std scalings divide by std + 1e-4, so up to 1e4 x that.
    atol = 1e-11 * scale_of(batch, c) * (1e4 if divides_by_std(name, options) else 1.0)
    close(shifted, adv, atol=atol)


@pytest.mark.parametrize(("name", "options"), [c for c in CONFIGS if not divides_by_std(*c)], ids=str)
@LAWS
@given(batch=batches(), a=st.floats(0.01, 100))
def test_positive_scale_equivariance(name, options, batch, a):
    adv = advantages(name, options, batch)
    scaled = advantages(name, options, batch, rewards=batch["rewards"] * a)
    # eps in OTB's and OGB's denominators is not scaled with R: A(aR) = aA(R) holds exactly in R, not in eps.
    close(scaled, a * adv, atol=1e-9 * a * scale_of(batch))


@pytest.mark.parametrize(("name", "options"), CONFIGS, ids=CONFIG_IDS)
@LAWS
@given(batch=batches(), data=st.data())
def test_permutation_equivariance(name, options, batch, data):
    B = batch["rewards"].numel()
    perm = torch.tensor(data.draw(st.permutations(range(B))), dtype=torch.long)
    adv = advantages(name, options, batch)
    permuted = advantages(name, options, {k: v[perm] for k, v in batch.items()})
    close(permuted, adv[perm], atol=1e-10 * scale_of(batch))


@pytest.mark.parametrize(("name", "options"), [c for c in CONFIGS if not couples_groups(*c)], ids=str)
@LAWS
@given(batch=batches())
def test_groups_are_independent(name, options, batch):
    adv = advantages(name, options, batch)
    for g in batch["group_ids"].unique():
        rows = batch["group_ids"] == g
        alone = advantages(name, options, {k: v[rows] for k, v in batch.items()})
        close(alone, adv[rows], atol=1e-10 * scale_of(batch))


@pytest.mark.parametrize(("name", "options"), [c for c in CONFIGS if not offset_dependent(*c)], ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@LAWS
@given(data=st.data())
def test_tied_groups_get_exactly_zero(name, options, dtype, data):
    batch = data.draw(batches(ties=True, dtype=dtype))
    adv = advantages(name, options, batch)
    assert torch.isfinite(adv).all()
    assert (adv == 0).all(), f"max |A| = {adv.abs().max().item():.3g} on tied rewards"


# ----------------------------------------------------------------------------------------------
# The options that break a law by design, tested as breaking it
# ----------------------------------------------------------------------------------------------

# Group of 2: row 0 is strictly the longest (3 tokens against 1), so it is alone at t = 1, 2.
LONE_TAIL = dict(
    rewards=torch.tensor([1.0, 0.0], dtype=torch.float64),
    proxy=torch.ones(2, 3, dtype=torch.float64),
    mask=torch.tensor([[1, 1, 1], [1, 0, 0]], dtype=torch.bool),
    group_ids=torch.tensor([0, 0]),
)


@pytest.mark.parametrize("tail", OFFSET_DEPENDENT_TAILS)
@pytest.mark.parametrize("leave_one_out", [False, True])
def test_offset_dependent_tails_move_with_a_reward_offset(tail, leave_one_out):
    """Where the baseline is forced to 0, A = R: adding 0.5 to every reward adds 0.5 to those advantages."""
    options = dict(tail=tail, leave_one_out=leave_one_out)
    adv = compute_advantages("otb", **LONE_TAIL, **options)
    shifted = compute_advantages("otb", **dict(LONE_TAIL, rewards=LONE_TAIL["rewards"] + 0.5), **options)
    moved = shifted - adv
    if tail == "zero" or leave_one_out:  # the lone tail (t = 1, 2) of row 0 has baseline 0
        torch.testing.assert_close(moved[0, 1:], torch.full((2,), 0.5, dtype=torch.float64))
    # A group of one valid member gets baseline 0 under both: A = R.
    single = {k: v[:1] for k, v in LONE_TAIL.items()}
    alone = compute_advantages("otb", **single, **options)
    alone_shifted = compute_advantages("otb", **dict(single, rewards=single["rewards"] + 0.5), **options)
    torch.testing.assert_close(alone_shifted - alone, torch.full((1, 3), 0.5, dtype=torch.float64))


def test_reference_gives_a_lone_tail_its_reward_even_on_ties():
    """tail="zero" (the reference): a tied group still trains its strictly-longest member's tail, A = R there."""
    tied = dict(LONE_TAIL, rewards=torch.tensor([0.7, 0.7], dtype=torch.float64))
    adv = compute_advantages("otb", **tied, tail="zero")
    torch.testing.assert_close(adv[0, 1:], torch.full((2,), 0.7, dtype=torch.float64))
    for tail in SHIFT_INVARIANT_TAILS:
        assert (compute_advantages("otb", **tied, tail=tail) == 0).all()


@pytest.mark.parametrize("scale", [s for s in GRPO_SCALES if s != "none"])
def test_grpo_std_scalings_are_scale_invariant_not_equivariant(scale):
    batch = dict(LONE_TAIL, rewards=torch.tensor([1.0, 0.0, 3.0, 2.0], dtype=torch.float64))
    batch.update(
        proxy=torch.ones(4, 3, dtype=torch.float64), mask=torch.ones(4, 3, dtype=torch.bool), group_ids=torch.zeros(4)
    )
    batch["group_ids"] = batch["group_ids"].long()
    adv = compute_advantages("grpo", **batch, scale=scale)
    doubled = compute_advantages("grpo", **dict(batch, rewards=batch["rewards"] * 2), scale=scale)
    assert not torch.allclose(doubled, 2 * adv)
    torch.testing.assert_close(doubled, adv, atol=1e-4, rtol=1e-4)  # (2 std + 1e-4) vs 2 (std + 1e-4)


def test_grpo_batch_scale_couples_the_groups():
    rewards = torch.tensor([1.0, 0.0, 10.0, 0.0], dtype=torch.float64)
    batch = dict(
        rewards=rewards,
        proxy=torch.ones(4, 2, dtype=torch.float64),
        mask=torch.ones(4, 2, dtype=torch.bool),
        group_ids=torch.tensor([0, 0, 1, 1]),
    )
    adv = compute_advantages("grpo", **batch, scale="batch")
    first = compute_advantages("grpo", **{k: v[:2] for k, v in batch.items()}, scale="batch")
    assert not torch.allclose(adv[:2], first)


def test_huge_rewards_within_range_stay_finite_and_tied_huge_rewards_give_zero():
    """Rewards near the range check's limit: the centred tails form no R * W product of the raw reward."""
    batch = dict(LONE_TAIL, rewards=torch.tensor([1e30, 1e30], dtype=torch.float32))
    batch["proxy"] = batch["proxy"].float()
    for tail in SHIFT_INVARIANT_TAILS:
        adv = compute_advantages("otb", **batch, tail=tail)
        assert (adv == 0).all()
    assert math.isfinite(float(compute_advantages("otb", **batch, tail="zero").abs().max()))
