"""The yardstick (trl_otb/core/yardstick.py), calibrated on an exactly solvable policy (trl_otb/testing/toy.py):
GRPO and RLOO are unbiased up to their known scales, a planted orthogonal bias is caught by cos, and the two criteria
the yardstick replaces (raw MSE, the rescaled variance a²·Var) reward bias."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from trl_otb.core import compute_advantages
from trl_otb.core.yardstick import yardstick, yardstick_from_products
from trl_otb.testing.toy import count_reward, toy_policy

N = 4


def estimator(name, **options):
    return lambda r, p, m, gid: compute_advantages(name, r.float(), p.float(), m.float(), gid, **options)


@pytest.fixture(scope="module")
def toy():
    policy = toy_policy(length=3, vocab=3, seed=1)
    return policy, policy.true_gradient()


@pytest.fixture(scope="module")
def rloo_moments(toy):
    return toy[0].exact_moments(estimator("rloo"), N)


def test_the_toy_enumerates_a_distribution_and_its_proxy_is_the_exact_score_norm(toy):
    policy, g = toy
    assert len(policy.sequences) == 15 and math.isclose(float(policy.prob.sum()), 1.0, rel_tol=1e-12)
    assert torch.allclose(policy.proxy, (policy.scores**2).sum(-1))  # w_t = ‖s_t‖² where the score lives
    assert float(g.norm()) > 0.01  # precondition: the rewards are not flat, so g has a direction
    assert count_reward([1, 0]) == 1.0 and count_reward([1, 1, 0]) == 0.5 and count_reward([0]) == 0.0
    assert count_reward([2, 0]) == 0.2 and count_reward([1, 1, 1]) == 0.5


def test_the_exact_mean_matches_sampled_groups(toy, rloo_moments):
    policy, _ = toy
    mean, cov = rloo_moments
    groups = policy.sample_groups(60_000, N, torch.Generator().manual_seed(0))
    grads = policy.group_gradients(groups, estimator("rloo"))
    se = (cov.diagonal() / len(groups)).sqrt()
    assert ((grads.mean(0) - mean).abs() <= 5 * se + 1e-9).all()


def test_rloo_is_unbiased_and_unscaled_grpo_is_rloo_times_one_minus_one_over_n(toy, rloo_moments):
    policy, g = toy
    y = yardstick(*rloo_moments, g, batch=8)
    assert y["cos"] == pytest.approx(1.0, abs=1e-9) and y["scale"] == pytest.approx(1.0, abs=1e-9)
    mean, cov = policy.exact_moments(estimator("grpo", scale="none"), N)
    assert torch.allclose(mean, (1 - 1 / N) * rloo_moments[0], atol=1e-7)
    y_grpo = yardstick(mean, cov, g, batch=8)
    assert y_grpo["cos"] == pytest.approx(1.0, abs=1e-6) and y_grpo["scale"] == pytest.approx(0.75, abs=1e-6)
    # a constant rescale changes neither the direction, nor the signal, nor the error after the best rescaling
    for key in ("snr", "eps_star", "kappa"):
        assert y_grpo[key] == pytest.approx(y[key], rel=1e-5)


def test_a_planted_orthogonal_bias_is_caught_by_cos_and_rewarded_by_the_rescaled_variance(toy, rloo_moments):
    _, g = toy
    mean, cov = rloo_moments
    u = torch.randn(len(g), generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    u -= (u @ g) / (g @ g) * g  # orthogonal to the true gradient
    biased = mean + u / u.norm() * mean.norm()  # as long as the mean itself: 45 degrees off
    clean, off = yardstick(mean, cov, g, batch=8), yardstick(biased, cov, g, batch=8)
    assert clean["cos"] == pytest.approx(1.0, abs=1e-9)
    assert off["cos"] == pytest.approx(math.cos(math.pi / 4), abs=1e-9)  # caught
    assert off["scale"] == pytest.approx(clean["scale"], abs=1e-9)  # its component along g is unchanged
    assert off["eps_star"] > clean["eps_star"]

    def rescaled_variance(m):  # a²·tr Σ with a = <m, g>/‖m‖²: the criterion the yardstick replaces
        a = float(m @ g) / float(m @ m)
        return a**2 * float(cov.trace())

    assert rescaled_variance(biased) < rescaled_variance(mean)  # it rewards the bias


def test_raw_mse_rewards_shrinkage_and_the_yardstick_does_not(toy, rloo_moments):
    _, g = toy
    mean, cov = rloo_moments

    def raw_mse(m, c, batch):  # E‖ĝ_B - g‖²
        return float(((m - g) ** 2).sum() + c.trace() / batch)

    shrunk = (0.3 * mean, 0.09 * cov)  # 0.3 ĝ: a scale Adam undoes
    assert raw_mse(*shrunk, 1) < raw_mse(mean, cov, 1)  # raw MSE prefers it
    full, small = yardstick(mean, cov, g, batch=1), yardstick(*shrunk, g, batch=1)
    for key in ("cos", "snr", "eps_star", "kappa"):
        assert small[key] == pytest.approx(full[key], rel=1e-9)


@settings(max_examples=50, deadline=None)
@given(
    cos=st.floats(-1, 1),
    m_norm=st.floats(0.01, 10),
    g_norm=st.floats(0.01, 10),
    trace=st.floats(1e-3, 100),
    batch=st.integers(1, 64),
)
def test_eps_star_is_the_minimum_over_rescalings_and_equals_its_closed_form(cos, m_norm, g_norm, trace, batch):
    y = yardstick_from_products(cos * m_norm * g_norm, m_norm**2, g_norm**2, trace, batch)
    assert y["eps_star"] == pytest.approx(1 - y["cos"] ** 2 * y["snr"] / (1 + y["snr"]), abs=1e-9)

    def error(a):  # E‖a ĝ_B - g‖² / ‖g‖²
        return (a**2 * (m_norm**2 + trace / batch) - 2 * a * cos * m_norm * g_norm + g_norm**2) / g_norm**2

    best = cos * m_norm * g_norm / (m_norm**2 + trace / batch)
    assert error(best) == pytest.approx(y["eps_star"], abs=1e-9)
    assert all(error(best + d) >= y["eps_star"] - 1e-12 for d in (-0.1, 0.1))
    assert 0 <= y["eps_star"] <= 1


def test_bad_moments_are_refused():
    with pytest.raises(ValueError, match="‖g‖² > 0"):
        yardstick_from_products(0.0, 1.0, 0.0, 1.0, 4)
