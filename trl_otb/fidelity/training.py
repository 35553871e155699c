"""The fidelity check as ``OTBTrainer`` runs it every ``otb_fidelity_check_steps`` steps, on a TRL batch."""

from __future__ import annotations

import math

import torch

from .report import fidelity_check

__all__ = ["TRAINER_KEYS", "batch_fidelity", "low_fidelity_message"]

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
    """The warning the trainer gives when the logit proxy's energy ranks below ``threshold``."""
    return (
        f"OTB proxy fidelity: the energy W_t from the logit proxy has Spearman {energy_spearman:.3f} with the exact "
        f"one at step {step} (below otb_fidelity_min_energy_spearman={threshold}). The baseline may weigh completions "
        "poorly on this model/adapter: compare otb_proxy='uniform', or run `trl-otb fidelity` (docs/fidelity.md)."
    )
