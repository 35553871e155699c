"""The fidelity check on already-sampled rows, its report, and the report as a table."""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field

import torch

from .exact import token_statistics
from .peft import training_path
from .stats import ProxyFidelity, fidelity_metrics

__all__ = ["FidelityReport", "fidelity_check", "format_table"]


def _logit_metric(name: str) -> property:
    """A read-only attribute of the report: the OTB (``logit``) proxy's ``name`` metric."""
    return property(lambda self: getattr(self.proxies["logit"], name), doc=f"The logit proxy's {name}.")


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

    token_spearman = _logit_metric("token_spearman")
    token_pearson = _logit_metric("token_pearson")
    energy_spearman = _logit_metric("energy_spearman")
    sequence_spearman = _logit_metric("sequence_spearman")
    baseline_rel_diff = _logit_metric("baseline_rel_diff")

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
        path=path or training_path(model),
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
