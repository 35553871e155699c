"""Independent recomputations the trainer tests compare OTBTrainer against: the rollout statistics from full
logits in fp64, and TRL's importance ratios."""

from __future__ import annotations

import torch


def independent_rollout_stats(model, batch, temperature):
    """pi(y_t), sum_v pi(v)^2 and ||e_y - pi||^2 from a plain forward with full logits (no fused head), in fp64."""
    input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    attention_mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
    T = batch["completion_ids"].size(1)
    with torch.no_grad():
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, -T - 1 : -1].double()
    probs = torch.softmax(logits / temperature, dim=-1)
    p_token = probs.gather(-1, batch["completion_ids"].unsqueeze(-1)).squeeze(-1)
    one_hot = torch.nn.functional.one_hot(batch["completion_ids"], probs.size(-1)).double()
    proxy = ((one_hot - probs) ** 2).sum(-1)  # ||e_y - pi||^2, computed directly
    return p_token, (probs**2).sum(-1), proxy


def independent_ratio(old_logps, sampling_logps, mask, mode, clip_min, clip_max):
    """rho = pi_train / pi_behaviour, per token or per sequence, truncated or masked to [clip_min, clip_max]."""
    diff = (old_logps - sampling_logps) * mask
    ratio = torch.exp(diff.sum(dim=1, keepdim=True) if mode.startswith("sequence") else diff)
    if mode.endswith("truncate"):
        return ratio.clamp(clip_min, clip_max)
    return torch.where((ratio < clip_min) | (ratio > clip_max), torch.zeros_like(ratio), ratio)
