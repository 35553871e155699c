"""The candidate proxies the fidelity check compares with the exact ``||s_t||^2``.

Each is a per-token weight w_t computed from one forward pass (no per-token backward):

========  ===================================================================================
logit     ``||e_y - pi||^2 = 1 - 2 pi(y) + sum_v pi(v)^2``: the OTB proxy, computed by the package's own
          :func:`trl_otb.core.proxy.logit_gradient_proxy` and :func:`~trl_otb.core.proxy.sum_pi_squared`
uniform   ``1``: W_t is the token count (the paper's "uniform" ablation)
length    ``1`` per token, but the energy of every token of sequence i is its length L_i:
          OPO's sequence-level length weighting; its baseline is ``opo``'s
head      ``||e_y - pi||^2 ||h_t||^2 / T^2``, h_t the final hidden state fed to the LM head:
          exactly ``||d log pi(y_t) / d W_head||^2`` for an untied LM-head weight
hidden    ``||W_head^T (e_y - pi)||^2 / T^2 = ||d log pi(y_t) / d h_t||^2``: the gradient norm at
          the LM head's input, the signal that every adapter below it is trained from
========  ===================================================================================

Not to be confused with ``trl_otb.config.TRAINING_PROXIES``, the proxies training can use (``logit``, ``uniform``).
"""

from __future__ import annotations

import torch

from ..core import compute_dtype, logit_gradient_proxy, sum_pi_squared

__all__ = ["CANDIDATE_PROXIES", "candidate_proxies", "hidden_gradient_proxy"]

CANDIDATE_PROXIES = ("logit", "uniform", "length", "head", "hidden")


def hidden_gradient_proxy(
    logits: torch.Tensor,
    labels: torch.Tensor,
    lm_head_weight: torch.Tensor,
    temperature: float = 1.0,
) -> torch.Tensor:
    """``||d log pi(y_t) / d h_t||^2 = ||W[y_t] - sum_v pi_t(v) W[v]||^2 / T^2``, h_t the LM head's input.

    The squared gradient norm at the final hidden state: what every layer below the (frozen) LM head,
    LoRA adapters included, receives. It costs one ``[T, V] x [V, H]`` product on top of the logits.

    Args:
        logits: ``[..., V]`` raw logits z_t (pi = softmax(z / T)).
        labels: ``[...]`` sampled token ids y_t.
        lm_head_weight: ``[V, H]`` the LM head's weight W (no bias assumed).
        temperature: T > 0.

    Returns:
        ``[...]`` fp32 (fp64 for fp64 logits).
    """
    dtype = compute_dtype(logits)
    pi = torch.softmax(logits.to(dtype) / temperature, dim=-1)
    weight = lm_head_weight.to(dtype)
    grad_h = (weight[labels] - pi @ weight) / temperature
    return grad_h.pow(2).sum(dim=-1)


@torch.no_grad()
def candidate_proxies(
    logits: torch.Tensor,
    labels: torch.Tensor,
    logps: torch.Tensor,
    hidden: torch.Tensor,
    lm_head_weight: torch.Tensor | None,
    temperature: float,
) -> dict[str, torch.Tensor]:
    """Every proxy of :data:`CANDIDATE_PROXIES` for ``k`` tokens of one sequence, each ``[k]``.

    Args:
        logits: ``[k, V]`` the logits that predict the tokens; labels: ``[k]`` the sampled ids y_t;
        logps: ``[k]`` log pi(y_t) at temperature T; hidden: ``[k, H]`` the LM head's inputs h_t.
        lm_head_weight: ``[V, H]``, or None when the head has no float weight (then ``hidden`` is absent).
    """
    logit = logit_gradient_proxy(logps, sum_pi_squared(logits, temperature))
    ones = torch.ones_like(logit)
    out = {
        "logit": logit,
        "uniform": ones,
        "length": ones,
        "head": logit * hidden.float().pow(2).sum(-1) / temperature**2,
    }
    if lm_head_weight is not None:
        out["hidden"] = hidden_gradient_proxy(logits, labels, lm_head_weight, temperature)
    return out
