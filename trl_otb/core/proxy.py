"""Per-token weights w_t for the OTB energy, from forward probabilities only.

No TRL import: these functions are the math, usable from any training loop.

The logit-gradient proxy is the squared norm of the gradient of log pi(y_t) with respect to
the (temperature-scaled) logits z_t:

    w_t = || e_{y_t} - pi_t ||^2 = 1 - 2 pi(y_t) + sum_v pi_t(v)^2,    pi_t = softmax(z_t / T)

It lies in [0, 2). Low-probability sampled tokens weigh more.
"""

from __future__ import annotations

import torch

__all__ = ["compute_dtype", "logit_gradient_proxy", "sum_pi_squared", "uniform_proxy"]


def compute_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype the OTB numerics run in: float64 stays float64, everything else is fp32."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def sum_pi_squared(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Collision probability sum_v pi(v)^2 of softmax(logits / temperature), stable in fp32.

    Computed as ``sum exp(2 z') / (sum exp(z'))^2`` with ``z' = logits / T - max``, so extreme
    logits (e.g. +-1e4) neither overflow nor underflow.

    Args:
        logits: ``[..., V]`` raw logits (any float dtype; the math runs in fp32 or fp64).
        temperature: sampling temperature T > 0.

    Returns:
        ``[...]`` tensor in ``(0, 1]``, fp32 (fp64 for fp64 input).
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}.")
    z = logits.to(compute_dtype(logits)) / temperature
    # Shift by the max so that exp(z') <= 1 with one term equal to 1: s1, s2 >= 1, no over/underflow, and the
    # ratio s2 / s1^2 avoids the rounding of a difference of two large log-sum-exps.
    e = torch.exp(z - z.amax(dim=-1, keepdim=True))
    return (e * e).sum(dim=-1) / e.sum(dim=-1).square()


def logit_gradient_proxy(logps: torch.Tensor, sum_pi_sq: torch.Tensor) -> torch.Tensor:
    """The logit-gradient proxy ``w_t = 1 - 2 pi(y_t) + sum_v pi(v)^2``.

    Written as ``(1 - pi)^2 + (sum pi^2 - pi^2)``, both terms >= 0 mathematically; the result is
    clamped to ``[0, 2]`` against rounding.

    Args:
        logps: ``[B, T]`` log pi(y_t) of the sampled tokens, at the sampling temperature.
        sum_pi_sq: ``[B, T]`` sum_v pi_t(v)^2 of the same distributions (not its log).

    Returns:
        ``[B, T]`` proxy in fp32 (fp64 for fp64 input). Values at padding positions are
        meaningless and must be masked by the caller.
    """
    if logps.shape != sum_pi_sq.shape:
        raise ValueError(
            f"logps {tuple(logps.shape)} and sum_pi_sq {tuple(sum_pi_sq.shape)} must have the same shape."
        )
    dtype = compute_dtype(logps)
    logps = logps.to(dtype)
    p = torch.exp(logps)
    one_minus_p = -torch.expm1(logps)
    w = one_minus_p * one_minus_p + (sum_pi_sq.to(dtype) - p * p)
    return w.clamp(0.0, 2.0)


def uniform_proxy(mask: torch.Tensor) -> torch.Tensor:
    """``w_t = 1`` on every token: the paper's "uniform" ablation (W_t becomes the token count)."""
    return torch.ones(mask.shape, dtype=torch.float32, device=mask.device)
