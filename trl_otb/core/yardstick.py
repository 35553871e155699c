"""How good a policy-gradient estimator is: the direction of its mean and its error after the best rescaling.

An estimator's one-group gradient ĝ has mean m = E ĝ and covariance Σ; a training step averages B groups,
ĝ_B = (1/B) Σ_b ĝ_b. Against the true gradient g:

- ``cos``      = <m, g> / (‖m‖ ‖g‖): the direction of its mean; 1 for an unbiased estimator, or one biased only
  in scale (GRPO's (1 - 1/N)).
- ``scale``    = <m, g> / ‖g‖²: how long its mean is along g (RLOO 1, unscaled GRPO 1 - 1/N).
- ``snr``      = B ‖m‖² / tr Σ: the signal of a step's mean against its noise.
- ``eps_star`` = min_a E‖a ĝ_B - g‖² / ‖g‖² = 1 - cos² · snr / (1 + snr): the error left after the best
  rescaling, which Adam's normalisation makes the relevant one. 0 is perfect, 1 is no better than a zero step.
- ``kappa``    = Σ_k g_k m_k / sqrt(E[ĝ_B,k²]) / ‖g‖₁: Adam's first-order alignment, each coordinate of the
  mean divided by its root mean square as Adam's update does (needs Σ's diagonal).

Raw MSE E‖ĝ_B - g‖² and a rescaled variance a²·tr Σ with a = <m, g>/‖m‖² are not used to rank estimators: both
reward shrinkage and bias (a smaller ĝ has a smaller MSE; a mean off g's direction has a smaller a). The optimal
step size is Adam's to find; the direction and the noise are the estimator's.
"""

from __future__ import annotations

import math

import torch

__all__ = ["yardstick", "yardstick_from_products"]


def yardstick_from_products(m_dot_g: float, m_sq: float, g_sq: float, trace_cov: float, batch: int) -> dict:
    """``cos``, ``scale``, ``snr`` and ``eps_star`` from the inner products <m, g>, ‖m‖², ‖g‖² and tr Σ, at
    ``batch`` groups per step (see the module's docstring). ``cos`` is NaN when m or g is 0."""
    if g_sq <= 0 or batch < 1 or trace_cov < 0:
        raise ValueError(f"need ‖g‖² > 0, tr Σ >= 0 and batch >= 1 (got {g_sq}, {trace_cov}, {batch})")
    cos = m_dot_g / math.sqrt(m_sq * g_sq) if m_sq > 0 else float("nan")
    snr = batch * m_sq / trace_cov if trace_cov > 0 else float("inf")
    # 1 - <m,g>²/(‖g‖²(‖m‖² + tr Σ/B)), which equals 1 - cos² snr/(1 + snr) and stays finite when m = 0.
    eps_star = 1.0 - m_dot_g**2 / (g_sq * (m_sq + trace_cov / batch)) if m_sq + trace_cov > 0 else 1.0
    return {"cos": cos, "scale": m_dot_g / g_sq, "snr": snr, "eps_star": eps_star}


def yardstick(mean: torch.Tensor, cov: torch.Tensor, true: torch.Tensor, batch: int) -> dict:
    """The yardstick of an estimator whose one-group gradient has mean ``mean`` ``[D]`` and covariance ``cov``
    ``[D, D]`` (or its diagonal ``[D]``: tr Σ and ``kappa`` need no more), against the true gradient ``true``
    ``[D]``, at ``batch`` groups per step: ``cos``, ``scale``, ``snr``, ``eps_star`` and ``kappa``."""
    m, g = mean.double(), true.double()
    var = (cov.diagonal() if cov.dim() == 2 else cov).double().clamp_min(0)
    out = yardstick_from_products(float(m @ g), float(m @ m), float(g @ g), float(var.sum()), batch)
    rms = (m**2 + var / batch).sqrt()
    ratio = torch.where(rms > 0, m / rms, torch.zeros_like(m))
    out["kappa"] = float((g * ratio).sum() / g.abs().sum())
    return out
