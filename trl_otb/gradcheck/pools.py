"""The pools: M completions per prompt, drawn by ``OTBTrainer``'s own generation, scoring and rollout pass.

:func:`check_trainer` builds an ``OTBTrainer`` from the user's model, reward functions, dataset and config, changed
only where the check needs it (``num_generations`` = the pool size, one prompt per generation batch, no logging or
saving); every other setting, the refusals included, is the trainer's. :func:`draw_pool` runs the trainer's
``_generate_and_score_completions`` on one prompt repeated M times and keeps what OTB reads from it: the weighted
rewards (NaN = unscorable), the per-token proxy w_t of the rollout pass and the loss mask. Each pool is then turned
into what its parameter space needs (``space_data``) and cached in ``out/pools/`` per prompt, so that a check can be
resumed or extended with more prompts.
"""

from __future__ import annotations

import contextlib
import dataclasses

import torch

from ..config import OTBConfig
from . import gram

__all__ = ["SPACES", "check_trainer", "draw_pool", "measured_layers", "space_data"]

SPACES = ("head", "adapter", "last-block")
"""Where the per-token gradients live: the LM head's weight, the PEFT adapter's weights, or every ``nn.Linear``
weight of the last decoder block."""


def check_trainer(model, reward_funcs, dataset, args: OTBConfig, pool_size: int, output_dir: str, **trainer_kwargs):
    """An ``OTBTrainer`` that draws one prompt's pool of ``pool_size`` completions per generation batch, with
    ``args``'s settings otherwise (its estimator made OTB's so that the rollout pass records w_t), writing nothing but
    TRL's scratch files, into ``output_dir``."""
    from ..trainer import OTBTrainer

    if not isinstance(args, OTBConfig):  # refused by the trainer, with its message
        OTBTrainer(model, reward_funcs, args=args, train_dataset=dataset, **trainer_kwargs)
    fields = {f.name: getattr(args, f.name) for f in dataclasses.fields(args) if f.init}
    fields.update(
        output_dir=output_dir,
        advantage_estimator="otb",
        otb_proxy="logit",
        num_generations=pool_size,
        num_generations_eval=None,
        per_device_train_batch_size=pool_size,
        gradient_accumulation_steps=1,
        steps_per_generation=None,
        generation_batch_size=None,
        report_to="none",
        logging_steps=1,
        save_strategy="no",
        push_to_hub=False,
        log_completions=False,
        otb_fidelity_check_steps=0,
    )
    return OTBTrainer(model, reward_funcs, args=OTBConfig(**fields), train_dataset=dataset, **trainer_kwargs)


@contextlib.contextmanager
def _recording_groups(trainer):
    """The ``GatheredGroups`` OTBTrainer forms for each batch (its rewards, proxy and mask), appended to a list."""
    sink, original = [], trainer._otb_gather

    def record(batch, proxy, rewards):
        groups = original(batch, proxy, rewards)
        sink.append(groups)
        return groups

    trainer._otb_gather = record
    try:
        yield sink
    finally:
        del trainer._otb_gather  # the class's method again


def draw_pool(trainer, row: dict, pool_size: int, seed: int) -> dict:
    """One prompt's pool through the trainer: ``prompt_ids`` [Lp] (unpadded), ``completion_ids`` [M, T],
    ``rewards`` [M] (the weighted sum; NaN = unscorable), ``proxy`` [M, T] (w_t) and ``mask`` [M, T] (the loss mask,
    a prefix of each completion)."""
    from transformers import set_seed

    set_seed(seed)
    trainer.model.train()  # the training settings (num_generations), as in a training step
    with _recording_groups(trainer) as sink, torch.no_grad():
        batch = trainer._generate_and_score_completions([dict(row) for _ in range(pool_size)])
    groups = sink[-1]
    mask = groups.mask[:, : groups.width].cpu() > 0
    lengths = mask.sum(1)
    if not torch.equal(mask, torch.arange(mask.shape[1])[None, :] < lengths[:, None]):
        raise ValueError(
            "gradient-check measures completions whose loss mask is a prefix (plain generation); this batch masks "
            "tokens inside completions (tool output or importance-sampling masks). Measure without tools."
        )
    prompt = batch["prompt_ids"][0][batch["prompt_mask"][0].bool()].cpu()
    return {
        "prompt_ids": prompt,
        "completion_ids": batch["completion_ids"].cpu(),
        "rewards": groups.rewards.cpu().double(),
        "proxy": groups.proxy[:, : groups.width].cpu().float(),
        "mask": mask,
    }


def measured_layers(model, space: str) -> list[torch.nn.Linear]:
    """The ``nn.Linear`` modules whose weights ``space`` measures (``adapter`` or ``last-block``), or a clear error
    when there are none or their gradient cannot be taken."""
    from accelerate.utils import is_peft_model

    if space == "adapter":
        if not is_peft_model(model):
            raise ValueError("--params adapter needs a PEFT adapter: pass peft_config (--use-peft) or a PEFT model.")
        layers = [m for m in model.modules() if isinstance(m, torch.nn.Linear) and m.weight.requires_grad]
    else:
        base = model.get_base_model() if is_peft_model(model) else model
        blocks = getattr(base.get_decoder(), "layers", None)
        if not blocks:
            raise ValueError("--params last-block needs a decoder with a `layers` list; use --params head.")
        layers = [m for m in blocks[-1].modules() if type(m) is torch.nn.Linear]
    if not layers:
        raise ValueError(f"--params {space}: the model has no plain nn.Linear weights there (quantized?); "
                         "use --params head, or the adapter of a QLoRA model.")  # fmt: skip
    return layers


def space_data(model, pool: dict, space: str, temperature: float, *, kappa_dim: int, sketch_dim: int, seed: int):
    """What the analysis needs of one pool in ``space``: the token Gram K [n, n] (fp64, tokens in (completion,
    position) order) and, for ``kappa``, F [n, D] (each token's gradient on D sampled coordinates) with the
    coordinates' weights [D]. The LM head's K is exact up to ``tail_bound``."""
    mask, ids = pool["mask"], pool["completion_ids"]
    lengths = mask.sum(1)
    generator = torch.Generator().manual_seed(seed)
    if space == "head":
        head = model.get_output_embeddings()
        if head is None or getattr(head, "weight", None) is None:
            raise ValueError("--params head needs a model with an output embedding (get_output_embeddings()).")
        prompt = pool["prompt_ids"].expand(len(ids), -1)
        input_ids = torch.cat([prompt, ids], 1).to(head.weight.device)
        attention = torch.cat([torch.ones_like(prompt, dtype=torch.bool), mask], 1).long().to(input_ids.device)
        h, log_z, logp_y, sum_sq, top = gram.head_statistics(
            model, input_ids, attention, input_ids[:, -ids.shape[1] :], temperature
        )
        # On the model's device: with a large vocabulary the Gram matrix is the check's biggest product.
        fields = {"ids": ids.to(h.device), "h": h, "log_z": log_z, "top": top}
        records = [{name: x[i, :k] for name, x in fields.items()} for i, k in enumerate(lengths.tolist())]
        weight = head.weight.detach().float()
        K, bound, _ = gram.token_gram(records, weight, temperature)
        F, w = gram.head_coordinates(records, weight, temperature, kappa_dim, generator)
        return {"K": K.cpu(), "F": F.cpu(), "w": w.cpu(), "tail_bound": bound}
    layers = measured_layers(model, space)
    device = layers[0].weight.device
    completions = [ids[i, :k].to(device) for i, k in enumerate(lengths.tolist())]
    S, X, w = gram.linear_token_gradients(
        model,
        layers,
        pool["prompt_ids"].to(device),
        completions,
        sketch_dim,
        temperature,
        seed=seed,
        kappa_dim=kappa_dim,
    )
    S = torch.cat(S).double()
    return {"K": S @ S.T, "F": torch.cat(X).double(), "w": w, "tail_bound": 0.0}
