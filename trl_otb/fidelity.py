"""Proxy fidelity: does the OTB proxy w_t rank tokens like the true per-token gradient norm?

OTB's optimal baseline weighs tokens by the realized energy ``W_t = sum_{j<=t} ||s_j||^2`` of the
score ``s_t = grad_theta log pi(y_t | x, y_<t)``, taken over the parameters that train. The
trainer uses the logit-gradient proxy ``w_t = ||e_{y_t} - pi_t||^2`` instead (exact for the
gradient w.r.t. the logits). This module computes both on a small batch and compares them:

- exact: ``||s_t||^2`` over exactly the parameters with ``requires_grad=True`` (all of them for
  full fine-tuning, the adapters under LoRA/QLoRA), summed in fp32, at the sampling temperature T
  (``log pi = log_softmax(z / T)``). Per-token gradients come from batched backward passes
  (``torch.autograd.grad(..., is_grads_batched=True)`` over one-hot ``grad_outputs``), one
  sequence at a time so that a token's backward only runs through its own row.
- proxies, all ``[B, T]`` (see :data:`PROXIES`), from the same forward pass:

  ========  ===================================================================================
  logit     ``||e_y - pi||^2 = 1 - 2 pi(y) + sum_v pi(v)^2`` (the OTB proxy, :mod:`trl_otb.core.proxy`)
  uniform   ``1``: W_t is the token count (the paper's "uniform" ablation)
  length    ``1`` per token, but the energy of every token of sequence i is its length L_i:
            OPO's sequence-level length weighting; its baseline is ``opo``'s
  head      ``||e_y - pi||^2 ||h_t||^2 / T^2``, h_t the final hidden state fed to the LM head:
            exactly ``||d log pi(y_t) / d W_head||^2`` for an untied LM-head weight
  hidden    ``||W_head^T (e_y - pi)||^2 / T^2 = ||d log pi(y_t) / d h_t||^2``: the gradient norm at
            the LM head's input, the signal that every adapter below it is trained from
  ========  ===================================================================================

Metrics per proxy (:class:`ProxyFidelity`), over the masked tokens of the batch:
``token_spearman``/``token_pearson`` (w_t vs ||s_t||^2), ``energy_spearman`` (W_t from the proxy
vs from the exact norms), ``sequence_spearman`` (total energy W_L per sequence) and
``baseline_rel_diff = ||B_proxy - B_exact||_2 / ||B_exact||_2`` with ``B = otb_terms(...).baseline``
(for ``length``: OPO's baseline). A constant proxy has no token ranking: its token correlations
are NaN.

Cost of the exact norms, measured on SmolLM2-135M-Instruct (fp32, rows of ~50-60 tokens, 2 CPU
cores shared at load ~8; see ``docs/fidelity.md``): 11.5 s per token for full fine-tuning, 2.2 s
for LoRA r=8, 4.3 s for QLoRA r=8. It is about one single-row backward per token (batching
amortises overhead, ~2.5x, not the math), so check a few rows, rarely; full fine-tuning also
needs chunk x num_params x 4 bytes for the batched parameter gradients (``max_chunk_bytes``).

QLoRA on CPU: bitsandbytes repacks 4-bit weights on the first eval/no-grad forward and gradients
through them are wrong afterwards; every entry point here calls
:func:`trl_otb.fidelity_bnb.guard_4bit_cpu_repack` first (see that module).
"""

from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import asdict, dataclass, field

import torch

from .core import logit_gradient_proxy, opo_advantages, otb_terms, sum_pi_squared
from .fidelity_bnb import guard_4bit_cpu_repack, is_4bit_model

__all__ = [
    "PROXIES",
    "FidelityReport",
    "ProxyFidelity",
    "TokenStatistics",
    "add_subcommand",
    "fidelity_check",
    "fidelity_metrics",
    "hidden_gradient_proxy",
    "prepare_peft_model",
    "run_fidelity_check",
    "sample_completions",
    "spearman",
    "token_statistics",
]

PROXIES = ("logit", "uniform", "length", "head", "hidden")
PEFT_PATHS = ("none", "lora", "qlora")

DEFAULT_PROMPTS = (
    "What is 17 + 25? Answer with a number.",
    "Name three prime numbers greater than 10.",
    "Write one sentence about the sea.",
    "If a train travels 60 km in 1.5 hours, what is its average speed?",
    "Give a synonym for 'happy'.",
    "What is the capital of France, and why is it famous?",
    "Explain in one sentence what a gradient is.",
    "Count from 1 to 5 in words.",
)


# --------------------------------------------------------------------------- cheap proxies


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
    dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
    pi = torch.softmax(logits.to(dtype) / temperature, dim=-1)
    weight = lm_head_weight.to(dtype)
    grad_h = (weight[labels] - pi @ weight) / temperature
    return grad_h.pow(2).sum(dim=-1)


# --------------------------------------------------------------------------- exact norms


@dataclass
class TokenStatistics:
    """Per-token exact squared score norms and proxies, all ``[B, T]`` over the completion tokens.

    exact: ``||grad_theta log pi(y_t)||^2`` over the trainable parameters (0 where mask is 0).
    proxies: ``{name: [B, T]}`` for the names in :data:`PROXIES` (``hidden`` is absent when the LM
    head's weight is not a float tensor). mask: ``[B, T]`` bool. seconds_exact: time spent in the
    per-token backward passes.
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
    """Exact per-token squared score norms ``||s_t||^2`` and the proxies of :data:`PROXIES`.

    The layout is TRL's: ``input_ids = cat(prompt_ids, completion_ids)`` ``[B, S]`` with the
    completion in the last ``C = completion_mask.shape[1]`` positions (``logits_to_keep = C``);
    ``attention_mask [B, S]``; ``completion_mask [B, C]`` marks the tokens that carry gradient.
    Padding (``attention_mask == 0``) is dropped, each row runs on its own (RoPE models are
    invariant to the position offset that left padding adds).

    The model runs in eval mode (no dropout) with gradients on; its mode is restored afterwards and
    no ``.grad`` is touched. 4-bit bitsandbytes models are guarded first
    (:func:`~trl_otb.fidelity_bnb.guard_4bit_cpu_repack`).

    Cost: about one single-row backward per masked token. ``chunk_size`` tokens share one batched
    backward (default: as many as fit ``max_chunk_bytes`` of fp32 parameter gradients, at most 16).
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}.")
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
    if is_4bit_model(model):
        guard_4bit_cpu_repack(model)
    params = _trainable_parameters(model)
    num_params = sum(p.numel() for p in params)
    chunk = _chunk_size(num_params, chunk_size, max_chunk_bytes)
    head = model.get_output_embeddings()
    head_weight = getattr(head, "weight", None)
    has_hidden = isinstance(head_weight, torch.Tensor) and head_weight.dtype.is_floating_point

    device = params[0].device
    input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
    C = completion_mask.shape[1]
    mask = completion_mask.to(device).bool() & attention_mask[:, S - C :].bool()
    exact = torch.zeros(B, C, dtype=torch.float32, device=device)
    proxies = {name: torch.zeros_like(exact) for name in PROXIES if name != "hidden" or has_hidden}
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
                k = logps.numel()
                eye = torch.eye(k, dtype=logps.dtype, device=device)
                for s in range(0, k, chunk):
                    grads = torch.autograd.grad(
                        logps, params, grad_outputs=eye[s : s + chunk], retain_graph=True,
                        is_grads_batched=True, allow_unused=True,
                    )  # fmt: skip
                    sq = sum(g.float().pow(2).flatten(1).sum(1) for g in grads if g is not None)
                    exact[b, cols[s : s + chunk]] = sq.detach() if torch.is_tensor(sq) else 0.0
                    del grads
                seconds_exact += time.perf_counter() - start

                with torch.no_grad():
                    logit = logit_gradient_proxy(logps.detach(), sum_pi_squared(logits.detach(), temperature))
                    proxies["logit"][b, cols] = logit
                    proxies["uniform"][b, cols] = 1.0
                    proxies["length"][b, cols] = 1.0
                    proxies["head"][b, cols] = logit * hidden.float().pow(2).sum(-1) / temperature**2
                    if has_hidden:
                        proxies["hidden"][b, cols] = hidden_gradient_proxy(
                            logits.detach(), labels, head_weight.detach(), temperature
                        )
                del out, logits, hidden, logps
    finally:
        hook.remove()
        model.train(was_training)
    proxies = {name: w.cpu() for name, w in proxies.items()}
    return TokenStatistics(exact.cpu(), proxies, mask.cpu(), num_params, seconds_exact)


# --------------------------------------------------------------------------- metrics


def _average_ranks(x: torch.Tensor) -> torch.Tensor:
    """0-based ranks of a 1-D tensor, ties sharing their average rank (as scipy's ``rankdata``)."""
    sorted_x, order = torch.sort(x)
    _, inverse, counts = torch.unique_consecutive(sorted_x, return_inverse=True, return_counts=True)
    ends = torch.cumsum(counts, 0).double()
    average = ends - (counts.double() + 1) / 2
    ranks = torch.empty(x.numel(), dtype=torch.float64)
    ranks[order] = average[inverse]
    return ranks


def pearson(x: torch.Tensor, y: torch.Tensor) -> float:
    """Pearson correlation of two 1-D tensors in fp64; NaN when either is constant or has < 2 values."""
    x, y = x.double().flatten(), y.double().flatten()
    if x.numel() < 2:
        return float("nan")
    x, y = x - x.mean(), y - y.mean()
    denom = x.norm() * y.norm()
    return float((x @ y) / denom) if denom > 0 else float("nan")


def spearman(x: torch.Tensor, y: torch.Tensor) -> float:
    """Spearman rank correlation (Pearson of average ranks); NaN when either input is constant."""
    x, y = x.flatten(), y.flatten()
    if x.numel() < 2:
        return float("nan")
    return pearson(_average_ranks(x), _average_ranks(y))


@dataclass
class ProxyFidelity:
    """How well one proxy stands in for the exact ``||s_t||^2`` (see the module docstring)."""

    token_spearman: float
    token_pearson: float
    energy_spearman: float
    sequence_spearman: float
    baseline_rel_diff: float


def _energy(name: str, w: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``[B, T]`` energy: W_t = cumsum of w over masked tokens; for ``length``, L_i on every token."""
    wm = w * mask
    if name == "length":
        return wm.sum(dim=1, keepdim=True).expand_as(wm) * mask
    return torch.cumsum(wm, dim=1) * mask


def _baseline(name: str, w: torch.Tensor, mask: torch.Tensor, rewards: torch.Tensor, group_ids: torch.Tensor):
    if name == "length":
        advantages = opo_advantages(rewards, w, mask, group_ids)
        valid = torch.isfinite(rewards)[:, None] & mask
        return torch.where(valid, rewards[:, None] - advantages, torch.zeros_like(advantages))
    return otb_terms(rewards, w, mask, group_ids).baseline


def _rel_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    num, den = float((a.double() - b.double()).norm()), float(b.double().norm())
    if den == 0:
        return 0.0 if num == 0 else float("inf")
    return num / den


def fidelity_metrics(
    exact: torch.Tensor,
    proxies: dict[str, torch.Tensor],
    mask: torch.Tensor,
    rewards: torch.Tensor,
    group_ids: torch.Tensor,
) -> dict[str, ProxyFidelity]:
    """Compare each proxy ``[B, T]`` with the exact norms ``[B, T]`` over ``mask`` (see :class:`ProxyFidelity`).

    ``rewards [B]`` and ``group_ids [B]`` build the OTB baselines that ``baseline_rel_diff`` compares
    (``otb_terms`` with default options, from the proxy and from the exact norms).
    """
    m = mask.bool()
    rows = m.any(dim=1)
    exact = exact.float()
    e_energy = _energy("exact", exact, m)
    e_baseline = _baseline("exact", exact, m, rewards, group_ids)
    out = {}
    for name, w in proxies.items():
        w = w.float()
        energy = _energy(name, w, m)
        out[name] = ProxyFidelity(
            token_spearman=spearman(w[m], exact[m]),
            token_pearson=pearson(w[m], exact[m]),
            energy_spearman=spearman(energy[m], e_energy[m]),
            sequence_spearman=spearman((w * m).sum(1)[rows], (exact * m).sum(1)[rows]),
            baseline_rel_diff=_rel_diff(_baseline(name, w, m, rewards, group_ids), e_baseline),
        )
    return out


# --------------------------------------------------------------------------- reports


@dataclass
class FidelityReport:
    """Fidelity of every proxy on one model path; the OTB (``logit``) proxy's metrics are attributes.

    proxies: ``{name: ProxyFidelity}``. values: the masked tokens' ``exact`` norms and proxies as flat
    1-D tensors (for plots; not serialised). rewards: ``"given"`` or ``"random(seed=S)"``.
    seconds: the whole check; seconds_per_token: exact-norm time per masked token.
    """

    path: str
    num_tokens: int
    num_sequences: int
    num_trainable_params: int
    temperature: float
    rewards: str
    seconds: float
    seconds_per_token: float
    proxies: dict[str, ProxyFidelity]
    values: dict[str, torch.Tensor] = field(default_factory=dict, repr=False)

    @property
    def token_spearman(self) -> float:
        return self.proxies["logit"].token_spearman

    @property
    def token_pearson(self) -> float:
        return self.proxies["logit"].token_pearson

    @property
    def energy_spearman(self) -> float:
        return self.proxies["logit"].energy_spearman

    @property
    def sequence_spearman(self) -> float:
        return self.proxies["logit"].sequence_spearman

    @property
    def baseline_rel_diff(self) -> float:
        return self.proxies["logit"].baseline_rel_diff

    def to_dict(self) -> dict:
        """JSON-ready: the logit proxy's metrics at top level, every proxy under ``proxies``.

        Non-finite floats become None (NaN is not JSON).
        """

        def clean(x):
            return x if not isinstance(x, float) or math.isfinite(x) else None

        head = {k: clean(v) for k, v in asdict(self.proxies["logit"]).items()}
        rest = {k: clean(getattr(self, k)) for k in ("path", "num_tokens", "num_sequences", "num_trainable_params")}
        rest.update({k: clean(getattr(self, k)) for k in ("temperature", "rewards", "seconds", "seconds_per_token")})
        proxies = {name: {k: clean(v) for k, v in asdict(p).items()} for name, p in self.proxies.items()}
        return {**rest, **head, "proxies": proxies}


def fidelity_check(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    completion_mask: torch.Tensor,
    temperature: float = 1.0,
    rewards: torch.Tensor | None = None,
    group_ids: torch.Tensor | None = None,
    *,
    seed: int = 0,
    path: str | None = None,
    chunk_size: int | None = None,
) -> FidelityReport:
    """Proxy fidelity on already-sampled rows (what a trainer calls every few steps).

    Args:
        model: the model as it trains (full, PEFT LoRA, or PEFT on a 4-bit base), unwrapped from
            DDP/accelerate; its trainable parameters define the exact norm.
        input_ids: ``[B, S]`` prompt + completion ids (completion = last C positions).
        attention_mask: ``[B, S]``.
        completion_mask: ``[B, C]``, 1 on the tokens that carry gradient.
        temperature: the sampling temperature T.
        rewards: ``[B]`` outcome rewards; None draws random 0/1 rewards from ``seed`` (the baseline
            comparison then tests the weighting, not a particular reward signal).
        group_ids: ``[B]`` integer ids of the prompt each row answers; None puts all rows in one group.
        path: a label for the report (default: ``qlora``/``lora``/``full`` from the model).

    Keep B small: the cost is about one single-row backward per completion token.
    """
    start = time.perf_counter()
    stats = token_statistics(model, input_ids, attention_mask, completion_mask, temperature, chunk_size=chunk_size)
    B = input_ids.shape[0]
    if rewards is None:
        generator = torch.Generator().manual_seed(seed)
        rewards = torch.randint(0, 2, (B,), generator=generator).float()
        rewards_source = f"random(seed={seed})"
    else:
        rewards = rewards.detach().float().cpu()
        rewards_source = "given"
    group_ids = torch.zeros(B, dtype=torch.long) if group_ids is None else group_ids.cpu()
    mask = stats.mask.cpu()
    metrics = fidelity_metrics(stats.exact, stats.proxies, mask, rewards, group_ids)
    num_tokens = int(mask.sum())
    values = {"exact": stats.exact[mask], **{name: w[mask] for name, w in stats.proxies.items()}}
    return FidelityReport(
        path=path or _model_path(model),
        num_tokens=num_tokens,
        num_sequences=int(mask.any(1).sum()),
        num_trainable_params=stats.num_trainable_params,
        temperature=float(temperature),
        rewards=rewards_source,
        seconds=time.perf_counter() - start,
        seconds_per_token=stats.seconds_exact / max(num_tokens, 1),
        proxies=metrics,
        values=values,
    )


TRAINER_KEYS = ("token_spearman", "token_pearson", "energy_spearman", "baseline_rel_diff", "seconds_per_token")
"""The fidelity values OTBTrainer logs under ``otb/fidelity/`` every ``otb_fidelity_check_steps`` steps."""


def batch_fidelity(
    model: torch.nn.Module,
    batch: dict,
    loss_mask: torch.Tensor,
    rewards: torch.Tensor,
    rows: int,
    temperature: float,
    first_row: int = 0,
    num_generations: int | None = None,
) -> list[float]:
    """:func:`fidelity_check` on the first ``rows`` completions of a TRL generation batch.

    Args:
        batch: TRL's batch (``prompt_ids``, ``prompt_mask``, ``completion_ids``, ``completion_mask``).
        loss_mask: ``[B, C]`` tokens that carry gradient. rewards: ``[B]`` (NaN counts as 0).
        first_row, num_generations: the batch's first row in the gathered batch and the group size, so that
            rows are grouped by prompt; None puts them in one group.

    Returns the values of ``TRAINER_KEYS`` (NaN where undefined).
    """
    k = min(rows, batch["completion_ids"].size(0))
    group_ids = None if num_generations is None else (torch.arange(k) + first_row) // num_generations
    report = fidelity_check(
        model,
        torch.cat([batch["prompt_ids"][:k], batch["completion_ids"][:k]], dim=1),
        torch.cat([batch["prompt_mask"][:k], batch["completion_mask"][:k]], dim=1),
        loss_mask[:k],
        temperature=temperature,
        rewards=torch.nan_to_num(rewards[:k], nan=0.0),
        group_ids=group_ids,
    )
    values = report.to_dict()
    return [math.nan if values[key] is None else float(values[key]) for key in TRAINER_KEYS]


def low_fidelity_message(energy_spearman: float, step: int, threshold: float) -> str:
    return (
        f"OTB proxy fidelity: the energy W_t from the logit proxy has Spearman {energy_spearman:.3f} with the exact "
        f"one at step {step} (below otb_fidelity_min_energy_spearman={threshold}). The baseline may weigh completions "
        "poorly on this model/adapter: compare otb_proxy='uniform', or run `trl-otb fidelity` (docs/fidelity.md)."
    )


def _model_path(model: torch.nn.Module) -> str:
    if is_4bit_model(model):
        return "qlora"
    return "lora" if hasattr(model, "peft_config") else "full"


# --------------------------------------------------------------------------- sampling


def prepare_peft_model(
    model: torch.nn.Module,
    peft: str,
    *,
    lora_r: int = 8,
    lora_alpha: int = 16,
    target_modules: str | list[str] = "all-linear",
    **lora_kwargs,
):
    """Return the model to measure for a training path.

    ``"none"``: the model as given, trainable parameters as they are (all of them for a freshly loaded
    model: full fine-tuning). ``"lora"``: wrapped with a LoRA adapter (PEFT defaults, so B = 0: the
    state at the first training step; ``lora_kwargs`` go to ``LoraConfig``). ``"qlora"``: the same on a 4-bit model, after
    :func:`~trl_otb.fidelity_bnb.guard_4bit_cpu_repack`; the model must already be 4-bit (load it
    with ``trl_otb.models.load_model_and_tokenizer(..., quantization="4bit")``).
    """
    if peft not in PEFT_PATHS:
        raise ValueError(f"peft must be one of {PEFT_PATHS}, got {peft!r}.")
    quantized = is_4bit_model(model)
    if quantized:
        guard_4bit_cpu_repack(model)
    if peft == "none":
        return model
    if peft == "qlora" and not quantized:
        raise ValueError(
            "peft='qlora' needs a 4-bit model: load it with "
            "`trl_otb.models.load_model_and_tokenizer(name, quantization='4bit')`, or use peft='lora'."
        )
    if peft == "lora" and quantized:
        raise ValueError("The model is 4-bit quantized: use peft='qlora', or load it without quantization.")
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        r=lora_r, lora_alpha=lora_alpha, target_modules=target_modules, lora_dropout=0.0, **lora_kwargs
    )
    return get_peft_model(model, config)


def sample_completions(
    model: torch.nn.Module,
    tokenizer,
    prompts,
    *,
    num_samples: int = 4,
    max_new_tokens: int = 32,
    temperature: float = 1.0,
    seed: int = 0,
) -> dict[str, torch.Tensor]:
    """Sample ``num_samples`` completions per prompt from softmax(z / T) (no top-k/top-p).

    ``prompts``: strings (wrapped as one user message when the tokenizer has a chat template) or
    lists of chat messages. Returns ``input_ids [B, S]``, ``attention_mask [B, S]``,
    ``completion_mask [B, C]`` (up to and including the first EOS) and ``group_ids [B]``, with
    ``B = len(prompts) * num_samples``, in TRL's layout (left-padded prompt, then completion).
    """
    if is_4bit_model(model):
        guard_4bit_cpu_repack(model)
    texts = []
    for prompt in prompts:
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
        if tokenizer.chat_template is not None:
            texts.append(tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))
        else:
            texts.append(prompt if isinstance(prompt, str) else "\n".join(m["content"] for m in messages))
    previous_side = tokenizer.padding_side
    tokenizer.padding_side = "left"
    try:
        enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    finally:
        tokenizer.padding_side = previous_side
    device = next(model.parameters()).device
    prompt_ids, prompt_mask = enc["input_ids"].to(device), enc["attention_mask"].to(device)
    eos = tokenizer.eos_token_id
    was_training = model.training
    model.eval()
    try:
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            torch.manual_seed(seed)
            out = model.generate(
                input_ids=prompt_ids,
                attention_mask=prompt_mask,
                do_sample=True,
                temperature=temperature,
                top_k=0,
                top_p=1.0,
                min_p=None,
                repetition_penalty=1.0,
                max_new_tokens=max_new_tokens,
                num_return_sequences=num_samples,
                pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos,
                eos_token_id=eos,
            )
    finally:
        model.train(was_training)
    P = prompt_ids.shape[1]
    completion = out[:, P:]
    is_eos = completion == eos
    # 1 up to and including the first EOS.
    completion_mask = (torch.cumsum(is_eos.long(), 1) - is_eos.long()) == 0
    prompt_mask = prompt_mask.repeat_interleave(num_samples, 0)
    return {
        "input_ids": out.cpu(),
        "attention_mask": torch.cat([prompt_mask, completion_mask.long()], 1).cpu(),
        "completion_mask": completion_mask.long().cpu(),
        "group_ids": torch.arange(len(prompts)).repeat_interleave(num_samples),
    }


def run_fidelity_check(
    model: torch.nn.Module,
    tokenizer,
    prompts=None,
    *,
    num_samples: int = 4,
    max_new_tokens: int = 32,
    temperature: float = 1.0,
    peft: str = "none",
    seed: int = 0,
    rewards: torch.Tensor | None = None,
    **lora_options,
) -> FidelityReport:
    """Sample completions and measure proxy fidelity on one training path.

    ``model`` is wrapped according to ``peft`` by :func:`prepare_peft_model` (``lora_options``:
    ``lora_r``, ``lora_alpha``, ``target_modules``). ``prompts`` defaults to a few short
    instructions; each gets ``num_samples`` completions forming one group. ``rewards [B]`` default to
    random 0/1 from ``seed``.
    """
    model = prepare_peft_model(model, peft, **lora_options)
    prompts = list(DEFAULT_PROMPTS if prompts is None else prompts)
    batch = sample_completions(
        model,
        tokenizer,
        prompts,
        num_samples=num_samples,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        seed=seed,
    )
    path = _model_path(model) if peft == "none" else peft
    return fidelity_check(
        model,
        batch["input_ids"],
        batch["attention_mask"],
        batch["completion_mask"],
        temperature,
        rewards=rewards,
        group_ids=batch["group_ids"],
        seed=seed,
        path=path,
    )


# --------------------------------------------------------------------------- command line


def format_table(reports: dict[str, FidelityReport]) -> str:
    """A plain-text table: one line per (path, proxy)."""

    def num(x, fmt="{:.3f}"):
        return "-" if x is None or (isinstance(x, float) and not math.isfinite(x)) else fmt.format(x)

    header = f"{'path':6} {'tokens':>6} {'params':>8} {'s/token':>8}  {'proxy':8} {'tok_rho':>7} {'tok_r':>7} "
    header += f"{'W_rho':>7} {'seq_rho':>7} {'B_rel':>7}"
    lines = [header, "-" * len(header)]
    for path, report in reports.items():
        for i, (name, p) in enumerate(report.proxies.items()):
            left = (
                f"{path:6} {report.num_tokens:>6} {report.num_trainable_params / 1e6:>7.2f}M {report.seconds_per_token:>8.3f}"
                if i == 0
                else " " * 31
            )
            metrics = (p.token_spearman, p.token_pearson, p.energy_spearman, p.sequence_spearman, p.baseline_rel_diff)
            lines.append(f"{left}  {name:8} " + " ".join(f"{num(x):>7}" for x in metrics))
    return "\n".join(lines)


def plot_reports(reports: dict[str, FidelityReport], filename: str, proxies=("logit", "hidden")) -> None:
    """Scatter each proxy (rows) against the exact ``||s_t||^2`` per path (columns); write a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    proxies = [name for name in proxies if any(name in r.values for r in reports.values())]
    fig, axes = plt.subplots(
        len(proxies), len(reports), figsize=(3.2 * len(reports), 2.8 * len(proxies)), squeeze=False
    )
    for col, (path, report) in enumerate(reports.items()):
        exact = report.values["exact"].numpy()
        for row, name in enumerate(proxies):
            ax = axes[row][col]
            if name in report.values:
                ax.scatter(exact, report.values[name].numpy(), s=6, alpha=0.5)
                rho = report.proxies[name].token_spearman
                ax.set_title(f"{path}: {name} (rho={rho:.2f})", fontsize=9)
            ax.set_xscale("log")
            ax.set_yscale("log" if name != "logit" else "linear")
            ax.set_xlabel("exact ||s_t||^2", fontsize=8)
            ax.set_ylabel(f"proxy w_t ({name})", fontsize=8)
            ax.tick_params(labelsize=7)
    fig.tight_layout()
    fig.savefig(filename, dpi=80)
    plt.close(fig)


def add_subcommand(subparsers) -> None:
    """Register ``trl-otb fidelity`` on an ``argparse`` subparsers object."""
    parser = subparsers.add_parser(
        "fidelity",
        help="compare the OTB proxy with exact per-token gradient norms (full / LoRA / QLoRA)",
        description=__doc__.split("\n\n")[0]
        + " Samples completions, computes the exact ||grad log pi(y_t)||^2 over the trainable parameters, "
        "and compares every proxy with it. Rewards are random 0/1 (seeded).",
    )
    parser.add_argument("--model", default=None, help="local directory or Hub id (default: the embedded SmolLM2)")
    parser.add_argument("--peft", choices=(*PEFT_PATHS, "all"), default="all", help="training path(s) to measure")
    parser.add_argument("--num-prompts", type=int, default=2, help="prompts (groups) taken from the built-in list")
    parser.add_argument("--num-samples", type=int, default=4, help="completions per prompt (group size)")
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lora-r", type=int, default=8)
    parser.add_argument("--output-json", default=None, help="write the metrics of every path to this file")
    parser.add_argument("--plot", default=None, help="write proxy-vs-exact scatter plots to this PNG")
    parser.set_defaults(func=_fidelity_command)


def _fidelity_command(args) -> int:
    from .models import load_model_and_tokenizer

    if not 1 <= args.num_prompts <= len(DEFAULT_PROMPTS):
        raise SystemExit(f"--num-prompts must be between 1 and {len(DEFAULT_PROMPTS)}, got {args.num_prompts}.")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    reports = {}
    for peft in PEFT_PATHS if args.peft == "all" else (args.peft,):
        model, tokenizer = load_model_and_tokenizer(
            args.model,
            dtype=torch.float32,
            quantization="4bit" if peft == "qlora" else None,
            device_map=device,
        )
        report = run_fidelity_check(
            model,
            tokenizer,
            DEFAULT_PROMPTS[: args.num_prompts],
            num_samples=args.num_samples,
            max_new_tokens=args.max_new_tokens,
            temperature=args.temperature,
            peft=peft,
            seed=args.seed,
            lora_r=args.lora_r,
            lora_alpha=2 * args.lora_r,
        )
        reports[report.path] = report
        print(
            f"[fidelity] {report.path}: {report.num_tokens} tokens in {report.seconds:.0f} s, "
            f"token_spearman={report.token_spearman:.3f}",
            file=sys.stderr,
            flush=True,
        )
        del model
    print(format_table(reports))
    if args.output_json:
        settings = {k: getattr(args, k) for k in ("num_prompts", "num_samples", "max_new_tokens", "temperature")}
        settings.update(seed=args.seed, lora_r=args.lora_r, lora_alpha=2 * args.lora_r, device=device)
        payload = {
            "model": args.model or "embedded",
            "settings": settings,
            "paths": {path: report.to_dict() for path, report in reports.items()},
        }
        with open(args.output_json, "w") as f:
            json.dump(payload, f, indent=2)
            f.write("\n")
    if args.plot:
        plot_reports(reports, args.plot)
    return 0
