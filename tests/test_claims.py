"""The claims the docs and docstrings make about the estimators, each held by a test (issue 37's list).

Each test names the claim it holds; the text it holds is quoted in the docstring."""

from __future__ import annotations

import inspect

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from trl_otb import OTBConfig, compute_advantages, grpo_advantages, otb_advantages, otb_terms
from trl_otb.core import SHIFT_INVARIANT_TAILS, TAILS, ogb_advantages, opo_advantages, otb_diagnostics, rloo_advantages
from trl_otb.core.spec import reference_otb

from .core.tensor_helpers import draw_mask_row, t64

CPU = dict(output_dir="unused", use_cpu=True, bf16=False, report_to="none", per_device_train_batch_size=4)


# --- core/diagnostics.py: baseline_differs_frac -----------------------------------------------------------------------


def test_baseline_differs_frac_is_zero_for_unscaled_grpo_but_not_for_the_std_scaled_arm():
    """'It is 0 for unscaled GRPO (scale="none"). With std scaling, A is not R - mean, so the std-scaled grpo arm
    reads above 0.'"""
    rewards, proxy = t64([0.0, 1.0, 3.0, 0.5]), torch.ones(4, 3, dtype=torch.float64)
    mask, group_ids = torch.ones(4, 3), torch.tensor([0, 0, 1, 1])
    for scale, expected in (("none", 0.0), ("group", 1.0)):
        advantages = grpo_advantages(rewards, proxy, mask, group_ids, scale=scale)
        got = otb_diagnostics(rewards, advantages, None, mask, group_ids)["baseline_differs_frac"]
        assert got == pytest.approx(expected), scale


def test_a_leave_one_out_baseline_is_read_against_the_others_mean():
    """'the baselines are compared with the other members' mean reward (RLOO's) instead of the group's': RLOO, and
    leave-one-out OTB with equal energies, read 0; against the group's mean they would read 1."""
    rewards, proxy = t64([0.0, 1.0, 3.0, 0.5, 2.0, 2.5]), torch.ones(6, 3, dtype=torch.float64)
    mask, group_ids = torch.ones(6, 3), torch.tensor([0, 0, 0, 1, 1, 1])
    rloo = rloo_advantages(rewards, proxy, mask, group_ids)
    loo_otb = otb_advantages(rewards, proxy, mask, group_ids, tail="others_mean", leave_one_out=True, eps=0.0)
    for advantages in (rloo, loo_otb):
        assert otb_diagnostics(rewards, advantages, None, mask, group_ids)["baseline_differs_frac"] == 1.0
        read = otb_diagnostics(rewards, advantages, None, mask, group_ids, leave_one_out=True)
        assert read["baseline_differs_frac"] == 0.0 and read["baseline_shift"] == pytest.approx(0.0, abs=1e-6)


# --- core/estimators.py: which rows each baseline excludes -----------------------------------------------------------


def test_grpo_keeps_a_finite_reward_with_an_empty_mask_in_its_mean_and_the_others_exclude_it():
    """'otb, rloo, opo and ogb exclude them from every baseline. grpo follows TRL's GRPOTrainer: a finite reward
    whose mask is all 0 still counts in its group's mean.'"""
    rewards = t64([1.0, 0.0, 5.0])
    proxy = torch.ones(3, 2, dtype=torch.float64)
    mask = torch.tensor([[1, 1], [1, 1], [0, 0]])
    group_ids = torch.zeros(3, dtype=torch.long)
    # GRPO: mean over all three finite rewards (2.0), as TRL computes it; the empty row still gets no advantage.
    grpo = grpo_advantages(rewards, proxy, mask, group_ids)
    torch.testing.assert_close(grpo, t64([[-1.0, -1.0], [-2.0, -2.0], [0.0, 0.0]]))
    # The others: the empty row leaves the group, whose baseline is then the mean of 1 and 0.
    for fn in (rloo_advantages, opo_advantages, ogb_advantages):
        got = fn(rewards, proxy, mask, group_ids)
        assert got[2].abs().max() == 0 and torch.all(got[0] > 0) and torch.all(got[1] < 0), fn.__name__
    for tail in TAILS:
        got = otb_advantages(rewards, proxy, mask, group_ids, tail=tail, eps=0.0, leave_one_out=False)
        torch.testing.assert_close(got, t64([[0.5, 0.5], [-0.5, -0.5], [0.0, 0.0]]), msg=tail)


# --- README and docs/options.md: a singleton group under the default and under the reference -------------------------


def test_with_the_default_config_a_singleton_group_gets_advantage_zero_and_with_tail_zero_its_reward():
    """num_generations_eval=1 makes every evaluation completion its own group: A = 0 under the default config,
    A = R under the reference tail ("zero")."""
    rewards, proxy = t64([3.0]), t64([[0.3, 1.7, 0.1]])
    mask, group_ids = torch.tensor([[1, 1, 0]]), torch.zeros(1, dtype=torch.long)
    default = OTBConfig(**CPU)
    got = compute_advantages(
        default.advantage_estimator, rewards, proxy, mask, group_ids, **default.estimator_options()
    )
    torch.testing.assert_close(got, t64([[0.0, 0.0, 0.0]]), atol=0, rtol=0)
    reference = OTBConfig(**CPU, otb_tail="zero")
    got = compute_advantages("otb", rewards, proxy, mask, group_ids, **reference.estimator_options())
    torch.testing.assert_close(got, t64([[3.0, 3.0, 0.0]]), atol=0, rtol=0)


# --- otb_advantages' defaults are OTBConfig's --------------------------------------------------------------------------


@pytest.mark.parametrize("fn", [otb_advantages, otb_terms, reference_otb, ogb_advantages], ids=lambda f: f.__name__)
def test_the_functions_defaults_equal_otbconfigs_defaults(fn):
    """A user calling the function gets the estimator the trainer trains with."""
    config = OTBConfig(**CPU)
    defaults = {name: p.default for name, p in inspect.signature(fn).parameters.items() if p.kind is p.KEYWORD_ONLY}
    wanted = {"eps": config.otb_epsilon, "tail": config.otb_tail, "leave_one_out": config.otb_leave_one_out}
    wanted["shrinkage"] = config.otb_shrinkage
    wanted["align"] = config.otb_align or "position"  # None resolves to "position" without a tool mask
    shared = set(defaults) & set(wanted)
    assert shared >= {"eps"}
    assert {k: defaults[k] for k in shared} == {k: wanted[k] for k in shared}


def test_estimator_options_are_the_functions_keyword_arguments_by_name():
    config = OTBConfig(**CPU, otb_tail="others_mean", otb_epsilon=1e-6, otb_leave_one_out=True)
    assert config.estimator_options() == {
        "eps": 1e-6,
        "tail": "others_mean",
        "align": "position",
        "leave_one_out": True,
        "shrinkage": "ess",  # None resolved: leave-one-out with "others_mean" takes the ESS shrinkage
    }
    assert config.estimator_options(align="valid")["align"] == "valid"
    assert OTBConfig(**CPU, advantage_estimator="ogb").estimator_options() == {"eps": 1e-8}
    assert OTBConfig(**CPU, advantage_estimator="rloo").estimator_options() == {}
    assert OTBConfig(**CPU, advantage_estimator="grpo").estimator_options() == {}


# --- docs/faq.md and core/otb.py: self-inclusion is a per-member, per-token shrink ---------------------------------


@st.composite
def groups_with_energy(draw):
    """One group of 2 to 5 valid members (finite rewards, non-empty masks, holes allowed) with positive proxies."""
    N, T = draw(st.integers(2, 5)), draw(st.integers(1, 6))
    masks = []
    for _ in range(N):
        row = draw_mask_row(draw, T, ("contiguous", "contiguous", "holes"))
        masks.append(row if any(row) else [1] + [0] * (T - 1))
    rewards = draw(st.lists(st.floats(-3, 3, allow_nan=False), min_size=N, max_size=N))
    proxy = draw(st.lists(st.floats(0.01, 2.0), min_size=N * T, max_size=N * T))
    return t64(rewards), t64(proxy).view(N, T), torch.tensor(masks), torch.zeros(N, dtype=torch.long)


@settings(deadline=None, max_examples=60, derandomize=True)
@given(group=groups_with_energy(), tail=st.sampled_from(("none", *SHIFT_INVARIANT_TAILS)))
def test_self_inclusive_otb_is_leave_one_out_otb_shrunk_by_the_members_own_energy_share(group, tail):
    """Wherever another member is active (eps = 0): A_t^(i) = (1 - lambda_t^(i)) (R_i - B_t^(-i)), with lambda_t^(i) =
    W_t^(i) / sum_j W_t^(j) m_t^(j). GRPO's lambda is 1/N for all; OTB's depends on the member's own tokens.

    verl's ``"zero"`` is left out: it sets B = 0 by length (past the second-longest member's token count), which with
    holes in the mask can fall where another member is still active (the next test)."""
    rewards, proxy, mask, group_ids = group
    selfincl = otb_advantages(rewards, proxy, mask, group_ids, eps=0.0, tail=tail, leave_one_out=False)
    loo = otb_advantages(rewards, proxy, mask, group_ids, eps=0.0, tail=tail, leave_one_out=True, shrinkage="none")
    m = mask.to(torch.float64)
    energy = torch.cumsum(proxy * m, dim=1) * m
    share = energy / energy.sum(dim=0, keepdim=True).clamp(min=1e-300)
    others_active = (mask.sum(dim=0, keepdim=True) - mask > 0) & mask.bool()
    torch.testing.assert_close(selfincl[others_active], ((1 - share) * loo)[others_active], atol=1e-9, rtol=1e-9)
    # The shrink is not one number: with unequal energies the members' shares differ (GRPO's are all 1/N).
    if others_active.all() and energy[:, -1].unique().numel() > 1:
        assert share[:, -1].unique().numel() > 1


def _shrink_gap(rewards, mask) -> float:
    """The identity's largest miss under verl's ``"zero"`` where another member is active (w = 1, eps = 0)."""
    proxy = torch.ones(mask.shape, dtype=torch.float64)
    gid = torch.zeros(len(rewards), dtype=torch.long)
    selfincl = otb_advantages(rewards, proxy, mask, gid, eps=0.0, tail="zero", leave_one_out=False)
    loo = otb_advantages(rewards, proxy, mask, gid, eps=0.0, tail="zero", leave_one_out=True)
    energy = torch.cumsum(proxy * mask, dim=1) * mask
    share = energy / energy.sum(dim=0, keepdim=True).clamp(min=1e-300)
    others_active = (mask.sum(dim=0, keepdim=True) - mask > 0) & mask.bool()
    return float((selfincl - (1 - share) * loo)[others_active].abs().max())


def test_verls_zero_tail_keeps_the_identity_on_completions_and_breaks_it_across_holes():
    rewards = torch.tensor([0.0, 1.0, 0.0], dtype=torch.float64)
    prefix = torch.tensor([[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 0], [1, 1, 0, 0, 0, 0]], dtype=torch.float64)
    assert _shrink_gap(rewards, prefix) < 1e-12  # past the second-longest length no other member is active
    holes = torch.tensor([[0, 0, 0, 0, 0, 1], [0, 0, 0, 0, 1, 1], [1, 0, 0, 0, 0, 0]], dtype=torch.float64)
    assert holes.sum(dim=0)[5] == 2  # precondition: members 0 and 1 share the last position
    assert _shrink_gap(rewards, holes) > 0.5  # member 1 (2 tokens) gets B = 0 there by its length
