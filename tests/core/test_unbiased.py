"""Unbiasedness as a test: on the exactly solvable toy (trl_otb/testing/toy.py), every option docs/options.md calls
unbiased has a mean gradient along the true one (cos >= 0.999) at its known scale (to rounding: the moments are
exact sums over all S**N groups), and the options it calls biased are measured as biased on the same toy.

The toy: length 3, vocabulary 3 (EOS, a, b), logits N(0, 2²) from seed 5, the counting reward, groups of N = 4
(15 completions, 50,625 groups). Its numbers are the ones docs/options.md states."""

from __future__ import annotations

import pytest

from trl_otb.core import OFFSET_DEPENDENT_TAILS, compute_advantages
from trl_otb.core.yardstick import yardstick
from trl_otb.testing.toy import toy_policy

N = 4
TOY = dict(length=3, vocab=3, seed=5, scale=2.0)

LOO = dict(leave_one_out=True)
# name: (estimator, options, the scale of its mean gradient along g). Unbiased up to a known constant: RLOO and
# leave-one-out OTB with every tail whose lone baseline comes from the other members (only "zero_advantage"'s does
# not), unscaled GRPO at 1 - 1/N.
UNBIASED = {
    "rloo": ("rloo", {}, 1.0),
    "grpo_unscaled": ("grpo", {"scale": "none"}, 1 - 1 / N),
    "otb_loo_others_mean": ("otb", dict(LOO, tail="others_mean", shrinkage="none"), 1.0),
    "otb_loo_others_mean_ess": ("otb", dict(LOO, tail="others_mean", shrinkage="ess"), 1.0),
    **{f"otb_loo_{tail}": ("otb", dict(LOO, tail=tail), 1.0) for tail in OFFSET_DEPENDENT_TAILS},
}
# name: (estimator, options, its cos on the toy to 4 decimals, as docs/options.md states it).
BIASED = {
    "otb_default": ("otb", {"tail": "zero_advantage", "leave_one_out": False}, 0.9864),
    "otb_loo_zero_advantage": ("otb", dict(LOO, tail="zero_advantage"), 0.9874),
    "otb_reference_zero": ("otb", {"tail": "zero", "leave_one_out": False}, 0.9106),
    "otb_others_mean_self_inclusive": ("otb", {"tail": "others_mean", "leave_one_out": False}, 0.9106),
    "ogb": ("ogb", {}, 0.9873),
}


def estimator(name, options):
    return lambda r, p, m, gid: compute_advantages(name, r, p, m, gid, **options)  # fp64: the toy's own dtype


@pytest.fixture(scope="module")
def toy():
    policy = toy_policy(**TOY)
    return policy, policy.true_gradient()


@pytest.fixture(scope="module")
def measured(toy):
    """The yardstick at B = 4 and B = 8 of every estimator above, from its exact moments."""
    policy, g = toy
    out = {}
    for key, (name, options, *_) in {**UNBIASED, **BIASED}.items():
        mean, cov = policy.exact_moments(estimator(name, options), N)
        out[key] = {batch: yardstick(mean, cov, g, batch) for batch in (4, 8)}
    return out


@pytest.mark.parametrize("key", UNBIASED)
def test_an_unbiased_option_points_along_the_true_gradient_at_its_scale(measured, key):
    y = measured[key][4]
    assert y["cos"] >= 0.999
    assert y["cos"] == pytest.approx(1.0, abs=1e-9)
    assert y["scale"] == pytest.approx(UNBIASED[key][2], abs=1e-6)


@pytest.mark.parametrize("key", BIASED)
def test_a_biased_option_points_off_the_true_gradient(measured, key):
    y = measured[key][4]
    assert y["cos"] < 0.995
    assert y["cos"] == pytest.approx(BIASED[key][2], abs=5e-5)  # the value docs/options.md states


@pytest.mark.parametrize("batch", [4, 8])
def test_ess_shrinkage_has_less_error_than_plain_leave_one_out(measured, batch):
    """The candidate's claim on this toy: less noise than leave-one-out OTB with the others' mean at lone tokens, at
    the same (unbiased) mean. It does not beat RLOO here (0.6528 against 0.6509 at B = 4): that is stated, not
    tested as a win."""
    shrunk, plain = measured["otb_loo_others_mean_ess"][batch], measured["otb_loo_others_mean"][batch]
    assert shrunk["eps_star"] < plain["eps_star"]
    assert shrunk["snr"] > plain["snr"]


@pytest.mark.parametrize("toy_args", [dict(length=3, vocab=3, seed=1, scale=1.0), dict(length=4, vocab=3, seed=3)])
def test_ess_shrinkage_has_less_error_than_plain_leave_one_out_on_other_toys(toy_args):
    policy = toy_policy(**toy_args)
    g = policy.true_gradient()
    n = 3 if toy_args["length"] == 4 else N
    eps = {}
    for shrinkage in ("none", "ess"):
        mean, cov = policy.exact_moments(estimator("otb", dict(LOO, tail="others_mean", shrinkage=shrinkage)), n)
        eps[shrinkage] = yardstick(mean, cov, g, 4)["eps_star"]
    assert eps["ess"] < eps["none"]
