"""sum_pi_squared and the logit-gradient proxy against direct softmax and autograd computations."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from trl_otb import logit_gradient_proxy, sum_pi_squared
from trl_otb.core import uniform_proxy

SETTINGS = settings(deadline=None, max_examples=60, derandomize=True)
TEMPERATURES = [0.7, 1.0]


def direct_sum_pi_sq(logits, temperature):
    pi = torch.softmax(logits.double() / temperature, dim=-1)
    return (pi * pi).sum(-1)


def direct_proxy(logits, labels, temperature):
    """||e_y - pi||^2 with pi = softmax(logits / T), in fp64."""
    pi = torch.softmax(logits.double() / temperature, dim=-1)
    onehot = torch.nn.functional.one_hot(labels, logits.shape[-1]).double()
    return ((onehot - pi) ** 2).sum(-1)


def proxy_from_logits(logits, labels, temperature):
    logps = torch.log_softmax(logits.double() / temperature, dim=-1).gather(-1, labels[..., None])[..., 0]
    return logit_gradient_proxy(logps, sum_pi_squared(logits.double(), temperature))


# ------------------------------------------------------------------------------------------------
# sum_pi_squared
# ------------------------------------------------------------------------------------------------


def random_and_extreme_logits(dtype):
    gen = torch.Generator().manual_seed(0)
    random = torch.randn(6, 50, generator=gen) * 4
    extreme = torch.randn(4, 50, generator=gen).sign() * 1e4  # +-1e4
    extreme[1] = -1e4
    extreme[1, 7] = 1e4  # one-hot-like: sum pi^2 = 1
    extreme[2] = 1e4  # all tied at +1e4: uniform -> 1/V
    return torch.cat([random, extreme]).to(dtype)


@pytest.mark.parametrize("temperature", TEMPERATURES)
def test_sum_pi_squared_matches_direct_softmax_fp64(temperature):
    logits = random_and_extreme_logits(torch.float64)
    got = sum_pi_squared(logits, temperature)
    assert got.shape == (10,) and got.dtype == torch.float64
    torch.testing.assert_close(got, direct_sum_pi_sq(logits, temperature), atol=1e-9, rtol=0)
    assert got[7].item() == pytest.approx(1.0, abs=1e-9)
    assert got[8].item() == pytest.approx(1 / 50, abs=1e-9)


@pytest.mark.parametrize("temperature", TEMPERATURES)
def test_sum_pi_squared_fp32_is_close_on_moderate_logits(temperature):
    logits = random_and_extreme_logits(torch.float32)[:6]
    got = sum_pi_squared(logits, temperature)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), direct_sum_pi_sq(logits, temperature), atol=1e-5, rtol=0)


@pytest.mark.parametrize("temperature", TEMPERATURES)
def test_sum_pi_squared_fp32_is_accurate_to_1e_6_on_random_and_extreme_logits(temperature):
    logits = random_and_extreme_logits(torch.float32)
    got = sum_pi_squared(logits, temperature)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got.double(), direct_sum_pi_sq(logits, temperature), atol=1e-6, rtol=0)


@pytest.mark.parametrize("temperature", TEMPERATURES)
def test_sum_pi_squared_fp32_stays_finite_and_in_range_on_extreme_logits(temperature):
    logits = random_and_extreme_logits(torch.float32)[6:]
    got = sum_pi_squared(logits, temperature)
    assert torch.isfinite(got).all()
    assert got[1].item() == pytest.approx(1.0, abs=1e-6)
    torch.testing.assert_close(got.double(), direct_sum_pi_sq(logits, temperature), atol=1e-3, rtol=0)


@pytest.mark.parametrize("temperature", TEMPERATURES)
@pytest.mark.parametrize("V", [1, 2, 7, 1000])
def test_sum_pi_squared_of_uniform_logits_is_one_over_v(temperature, V):
    got = sum_pi_squared(torch.full((2, V), 3.5), temperature)
    torch.testing.assert_close(got, torch.full((2,), 1.0 / V), atol=1e-6, rtol=0)


def test_sum_pi_squared_one_hot_like_is_one():
    logits = torch.zeros(1000)
    logits[3] = 60.0  # pi(3) = 1 - ~1e-23
    assert sum_pi_squared(logits, 1.0).item() == pytest.approx(1.0, abs=1e-6)


def test_sum_pi_squared_temperature_changes_the_distribution():
    # Two logits [0, ln 3]: at T=1 pi = [1/4, 3/4] -> sum pi^2 = 1/16 + 9/16 = 5/8.
    # At T=0.5 the logits double: pi = [1/10, 9/10] -> 1/100 + 81/100 = 0.82.
    logits = torch.tensor([0.0, math.log(3.0)], dtype=torch.float64)
    assert sum_pi_squared(logits, 1.0).item() == pytest.approx(5 / 8, abs=1e-12)
    assert sum_pi_squared(logits, 0.5).item() == pytest.approx(0.82, abs=1e-12)


@pytest.mark.parametrize(
    ("dtype", "out"),
    [
        (torch.float32, torch.float32),
        (torch.float64, torch.float64),
        (torch.bfloat16, torch.float32),
        (torch.float16, torch.float32),
    ],
)
def test_sum_pi_squared_dtype(dtype, out):
    logits = torch.randn(2, 3, 11).to(dtype)
    got = sum_pi_squared(logits, 0.7)
    assert got.dtype == out
    torch.testing.assert_close(got.double(), direct_sum_pi_sq(logits, 0.7), atol=1e-6, rtol=0)


@pytest.mark.parametrize("temperature", [0.0, -1.0])
def test_sum_pi_squared_rejects_non_positive_temperature(temperature):
    with pytest.raises(ValueError, match="temperature"):
        sum_pi_squared(torch.zeros(3), temperature)


@SETTINGS
@given(
    logits=st.lists(st.floats(-30, 30), min_size=1, max_size=40),
    temperature=st.sampled_from(TEMPERATURES),
)
def test_sum_pi_squared_property_matches_direct_and_lies_in_one_over_v_to_one(logits, temperature):
    z = torch.tensor(logits, dtype=torch.float64)
    got = sum_pi_squared(z, temperature)
    torch.testing.assert_close(got, direct_sum_pi_sq(z, temperature), atol=1e-9, rtol=0)
    got32 = sum_pi_squared(z.float(), temperature).double()
    torch.testing.assert_close(got32, direct_sum_pi_sq(z.float(), temperature), atol=2e-5, rtol=0)
    assert 1 / len(logits) - 1e-6 <= got.item() <= 1 + 1e-6


# ------------------------------------------------------------------------------------------------
# logit_gradient_proxy
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("temperature", TEMPERATURES)
def test_proxy_equals_squared_distance_to_the_sampled_one_hot(temperature):
    gen = torch.Generator().manual_seed(2)
    logits = torch.randn(4, 6, 30, generator=gen, dtype=torch.float64) * 3
    labels = torch.randint(0, 30, (4, 6), generator=gen)
    logps = torch.log_softmax(logits / temperature, dim=-1).gather(-1, labels[..., None])[..., 0]
    w = logit_gradient_proxy(logps, sum_pi_squared(logits, temperature))
    assert w.shape == (4, 6) and w.dtype == torch.float64
    torch.testing.assert_close(w, direct_proxy(logits, labels, temperature), atol=1e-9, rtol=0)
    assert (w >= 0).all() and (w <= 2).all()
    # the fp32 training path, within fp32 rounding
    w32 = logit_gradient_proxy(logps.float(), sum_pi_squared(logits.float(), temperature))
    assert w32.dtype == torch.float32
    torch.testing.assert_close(w32.double(), w, atol=1e-5, rtol=0)


def test_proxy_hand_computed():
    # pi = [1/4, 3/4], sum pi^2 = 5/8.  y = 0: 1 - 2/4 + 5/8 = 9/8;  y = 1: 1 - 6/4 + 5/8 = 1/8.
    # Directly: y=0: (1 - 1/4)^2 + (3/4)^2 = 9/16 + 9/16 = 9/8;  y=1: (1/4)^2 + (1/4)^2 = 1/8.
    logps = torch.log(torch.tensor([0.25, 0.75], dtype=torch.float64))
    w = logit_gradient_proxy(logps, torch.full((2,), 5 / 8, dtype=torch.float64))
    torch.testing.assert_close(w, torch.tensor([9 / 8, 1 / 8], dtype=torch.float64), atol=1e-12, rtol=0)


def test_proxy_is_zero_for_a_one_hot_distribution_on_the_sampled_token():
    assert logit_gradient_proxy(torch.zeros(3), torch.ones(3)).abs().max().item() == 0.0
    logits = torch.full((2, 100), -1e4)
    logits[:, 5] = 1e4
    for temperature in TEMPERATURES:
        w = proxy_from_logits(logits, torch.tensor([5, 5]), temperature)
        assert w.abs().max().item() < 1e-12


def test_proxy_approaches_two_for_a_confident_distribution_on_another_token():
    # pi(y) ~ 0 and sum pi^2 ~ 1: w = 1 - 0 + 1 = 2 (the supremum).
    logits = torch.full((1, 50), -1e4)
    logits[0, 0] = 1e4
    w = proxy_from_logits(logits, torch.tensor([3]), 1.0)
    assert w.item() == pytest.approx(2.0, abs=1e-6)
    assert w.item() <= 2.0


def test_proxy_of_uniform_distribution():
    # pi = 1/V: w = 1 - 2/V + 1/V = 1 - 1/V.
    V = 8
    w = proxy_from_logits(torch.zeros(1, V), torch.tensor([2]), 0.7)
    assert w.item() == pytest.approx(1 - 1 / V, abs=1e-12)


def test_proxy_dtype_and_shape_checks():
    assert logit_gradient_proxy(torch.zeros(2, 3), torch.ones(2, 3)).dtype == torch.float32
    assert logit_gradient_proxy(torch.zeros(2, 3, dtype=torch.float64), torch.ones(2, 3)).dtype == torch.float64
    assert logit_gradient_proxy(torch.zeros(2, 3, dtype=torch.bfloat16), torch.ones(2, 3)).dtype == torch.float32
    with pytest.raises(ValueError, match="shape"):
        logit_gradient_proxy(torch.zeros(2, 3), torch.ones(2, 4))


def test_uniform_proxy_is_one_everywhere():
    mask = torch.tensor([[1, 0], [0, 0]])
    w = uniform_proxy(mask)
    assert w.dtype == torch.float32 and w.shape == (2, 2)
    assert (w == 1).all()


@SETTINGS
@given(
    logits=st.lists(st.floats(-20, 20), min_size=2, max_size=30),
    data=st.data(),
    temperature=st.sampled_from(TEMPERATURES),
)
def test_proxy_property_matches_direct_and_lies_in_0_2(logits, data, temperature):
    z = torch.tensor(logits, dtype=torch.float32)
    y = data.draw(st.integers(0, len(logits) - 1))
    # fp32 path, as in training
    logps = torch.log_softmax(z / temperature, dim=-1)[y]
    w = logit_gradient_proxy(logps.reshape(1, 1), sum_pi_squared(z, temperature).reshape(1, 1))
    expected = direct_proxy(z, torch.tensor(y), temperature)
    assert w.item() == pytest.approx(expected.item(), abs=1e-5)
    assert 0.0 <= w.item() <= 2.0


@SETTINGS
@given(
    logits=st.lists(st.floats(-10, 10), min_size=2, max_size=30),
    data=st.data(),
    temperature=st.sampled_from(TEMPERATURES),
)
def test_lower_probability_sampled_tokens_weigh_more(logits, data, temperature):
    z = torch.tensor(logits, dtype=torch.float64)
    V = len(logits)
    a = data.draw(st.integers(0, V - 1))
    b = data.draw(st.integers(0, V - 1))
    logp = torch.log_softmax(z / temperature, dim=-1)
    if abs(logp[a].exp() - logp[b].exp()) < 1e-9:
        return  # equal probabilities: equal weights, checked below
    lo, hi = (a, b) if logp[a] < logp[b] else (b, a)
    S = sum_pi_squared(z, temperature)
    w = logit_gradient_proxy(torch.stack([logp[lo], logp[hi]]), torch.stack([S, S]))
    # w = 1 - 2 pi(y) + S: strictly decreasing in pi(y), by exactly 2 (pi_hi - pi_lo)
    gap = 2 * (logp[hi].exp() - logp[lo].exp())
    assert w[0] > w[1]
    assert (w[0] - w[1]).item() == pytest.approx(gap.item(), abs=1e-9)


@pytest.mark.parametrize("temperature", TEMPERATURES)
def test_proxy_is_the_squared_norm_of_the_autograd_logit_gradient(temperature):
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(5, 40, generator=gen, dtype=torch.float64) * 3
    labels = torch.randint(0, 40, (5,), generator=gen)
    logits[0] = torch.linspace(-1e3, 1e3, 40, dtype=torch.float64)  # peaked row
    scaled = (logits / temperature).detach().requires_grad_(True)  # z / T, the leaf
    raw = logits.detach().clone().requires_grad_(True)
    logp = torch.log_softmax(scaled, dim=-1).gather(-1, labels[:, None])[:, 0]
    (grad_scaled,) = torch.autograd.grad(logp.sum(), scaled)
    logp_raw = torch.log_softmax(raw / temperature, dim=-1).gather(-1, labels[:, None])[:, 0]
    (grad_raw,) = torch.autograd.grad(logp_raw.sum(), raw)
    w = logit_gradient_proxy(logp.detach(), sum_pi_squared(logits, temperature))
    torch.testing.assert_close(w, (grad_scaled**2).sum(-1), atol=1e-10, rtol=1e-10)
    # with respect to the raw logits the gradient carries a 1/T factor
    torch.testing.assert_close(w / temperature**2, (grad_raw**2).sum(-1), atol=1e-10, rtol=1e-10)


@SETTINGS
@given(
    logits=st.lists(st.floats(-15, 15), min_size=2, max_size=25),
    data=st.data(),
    temperature=st.sampled_from(TEMPERATURES),
)
def test_proxy_autograd_identity_property(logits, data, temperature):
    z = (torch.tensor(logits, dtype=torch.float64) / temperature).requires_grad_(True)
    y = data.draw(st.integers(0, len(logits) - 1))
    logp = torch.log_softmax(z, dim=-1)[y]
    (grad,) = torch.autograd.grad(logp, z)
    w = logit_gradient_proxy(logp.detach(), sum_pi_squared(torch.tensor(logits, dtype=torch.float64), temperature))
    assert w.item() == pytest.approx((grad**2).sum().item(), abs=1e-10)
