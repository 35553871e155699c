"""Exact per-token squared score norms ``||s_t||^2``, with the candidate proxies from the same forward pass.

``s_t = grad_theta log pi(y_t | x, y_<t)`` over exactly the parameters with ``requires_grad=True`` (all of
them for full fine-tuning, the adapters under LoRA/QLoRA), summed in fp32, at the sampling temperature T
(``log pi = log_softmax(z / T)``). Per-token gradients come from batched backward passes
(``torch.autograd.grad(..., is_grads_batched=True)`` over one-hot ``grad_outputs``), one sequence at a
time so that a token's backward only runs through its own row.

Cost, measured on SmolLM2-135M-Instruct (fp32, rows of ~50-60 tokens, 2 CPU cores shared at load ~8; see
``docs/fidelity.md``): 11.5 s per token for full fine-tuning, 2.2 s for LoRA r=8, 4.3 s for QLoRA r=8. It
is about one single-row backward per token (batching amortises overhead, ~2.5x, not the math), so check a
few rows, rarely; full fine-tuning also needs chunk x num_params x 4 bytes for the batched parameter
gradients (``max_chunk_bytes``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from ..bnb import guard_4bit_cpu_repack, is_4bit_model
from .proxies import CANDIDATE_PROXIES, candidate_proxies

__all__ = ["TokenStatistics", "token_statistics"]


@dataclass
class TokenStatistics:
    """Per-token exact squared score norms and proxies, all ``[B, T]`` over the completion tokens.

    exact: ``||grad_theta log pi(y_t)||^2`` over the trainable parameters (0 where mask is 0).
    proxies: ``{name: [B, T]}`` for the names in :data:`~trl_otb.fidelity.proxies.CANDIDATE_PROXIES`
    (``hidden`` is absent when the LM head's weight is not a float tensor). mask: ``[B, T]`` bool.
    seconds_exact: time spent in the per-token backward passes.
    """

    exact: torch.Tensor
    proxies: dict[str, torch.Tensor]
    mask: torch.Tensor
    num_trainable_params: int
    seconds_exact: float


def _trainable_parameters(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError(
            "The model has no parameter with requires_grad=True, so there is no score gradient to measure. "
            "Pass the model as it trains (e.g. the PEFT model, or a full model with gradients enabled)."
        )
    return params


def _chunk_size(num_params: int, chunk_size: int | None, max_chunk_bytes: int) -> int:
    if chunk_size is not None:
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {chunk_size}.")
        return chunk_size
    return max(1, min(16, max_chunk_bytes // (4 * num_params)))


def _check_layout(input_ids: torch.Tensor, attention_mask: torch.Tensor, completion_mask: torch.Tensor) -> None:
    if input_ids.dim() != 2 or attention_mask.shape != input_ids.shape:
        raise ValueError(
            f"input_ids and attention_mask must both be [B, S]; got {tuple(input_ids.shape)} and "
            f"{tuple(attention_mask.shape)}."
        )
    B, S = input_ids.shape
    if completion_mask.dim() != 2 or completion_mask.shape[0] != B or completion_mask.shape[1] > S - 1:
        raise ValueError(
            f"completion_mask must be [B, C] with B={B} and C < S={S} (the completion is the last C tokens of "
            f"input_ids, after at least one prompt token); got {tuple(completion_mask.shape)}."
        )


def _squared_score_norms(logps: torch.Tensor, params: list[torch.nn.Parameter], chunk: int) -> torch.Tensor:
    """``[k]`` ``||grad_params logps[j]||^2`` in fp32, ``chunk`` tokens per batched backward pass."""
    k = logps.numel()
    out = torch.zeros(k, dtype=torch.float32, device=logps.device)
    eye = torch.eye(k, dtype=logps.dtype, device=logps.device)
    for s in range(0, k, chunk):
        grads = torch.autograd.grad(
            logps, params, grad_outputs=eye[s : s + chunk], retain_graph=True, is_grads_batched=True, allow_unused=True
        )
        sq = sum(g.float().pow(2).flatten(1).sum(1) for g in grads if g is not None)
        out[s : s + chunk] = sq.detach() if torch.is_tensor(sq) else 0.0
        del grads
    return out


def token_statistics(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    completion_mask: torch.Tensor,
    temperature: float = 1.0,
    *,
    chunk_size: int | None = None,
    max_chunk_bytes: int = 1 << 30,
) -> TokenStatistics:
    """Exact per-token squared score norms ``||s_t||^2`` and the candidate proxies.

    The layout is TRL's: ``input_ids = cat(prompt_ids, completion_ids)`` ``[B, S]`` with the
    completion in the last ``C = completion_mask.shape[1]`` positions (``logits_to_keep = C``);
    ``attention_mask [B, S]``; ``completion_mask [B, C]`` marks the tokens that carry gradient.
    Padding (``attention_mask == 0``) is dropped, each row runs on its own (RoPE models are
    invariant to the position offset that left padding adds).

    The model runs in eval mode (no dropout) with gradients on; its mode is restored afterwards and
    no ``.grad`` is touched. 4-bit bitsandbytes models are guarded first
    (:func:`~trl_otb.bnb.guard_4bit_cpu_repack`).

    Cost: about one single-row backward per masked token. ``chunk_size`` tokens share one batched
    backward (default: as many as fit ``max_chunk_bytes`` of fp32 parameter gradients, at most 16).
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}.")
    _check_layout(input_ids, attention_mask, completion_mask)
    if is_4bit_model(model):
        guard_4bit_cpu_repack(model)
    params = _trainable_parameters(model)
    num_params = sum(p.numel() for p in params)
    chunk = _chunk_size(num_params, chunk_size, max_chunk_bytes)
    head = model.get_output_embeddings()
    head_weight = getattr(head, "weight", None)
    if not (isinstance(head_weight, torch.Tensor) and head_weight.dtype.is_floating_point):
        head_weight = None

    device = params[0].device
    input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
    (B, S), C = input_ids.shape, completion_mask.shape[1]
    mask = completion_mask.to(device).bool() & attention_mask[:, S - C :].bool()
    exact = torch.zeros(B, C, dtype=torch.float32, device=device)
    names = [name for name in CANDIDATE_PROXIES if name != "hidden" or head_weight is not None]
    proxies = {name: torch.zeros_like(exact) for name in names}
    captured = {}
    hook = head.register_forward_hook(lambda module, args, output: captured.__setitem__("h", args[0]))
    was_training = model.training
    seconds_exact = 0.0
    model.eval()
    try:
        with torch.enable_grad():
            for b in range(B):
                cols = mask[b].nonzero().squeeze(1)
                if cols.numel() == 0:
                    continue
                keep = attention_mask[b].bool()
                row = input_ids[b][keep][None]
                # Index, in the unpadded row, of the position whose logits predict completion token j.
                before = (torch.cumsum(keep.long(), 0) - 1)[S - C - 1 + cols]
                first = int(before.min())
                out = model(input_ids=row, use_cache=False, logits_to_keep=row.shape[1] - first)
                logits = out.logits[0, before - first].float()  # [k, V]
                hidden = captured.pop("h")[0, before - first]  # [k, H]
                labels = input_ids[b, S - C + cols]
                logps = torch.log_softmax(logits / temperature, dim=-1).gather(-1, labels[:, None]).squeeze(-1)

                start = time.perf_counter()
                exact[b, cols] = _squared_score_norms(logps, params, chunk)
                seconds_exact += time.perf_counter() - start

                for name, w in candidate_proxies(logits, labels, logps, hidden, head_weight, temperature).items():
                    proxies[name][b, cols] = w
                del out, logits, hidden, logps
    finally:
        hook.remove()
        model.train(was_training)
    proxies = {name: w.cpu() for name, w in proxies.items()}
    return TokenStatistics(exact.cpu(), proxies, mask.cpu(), num_params, seconds_exact)
