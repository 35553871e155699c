"""What OTBTrainer needs to know about sharded engines (FSDP2, DeepSpeed ZeRO-3).

- :func:`full_replica`: an unsharded copy of a sharded model, for the in-training fidelity check.
  Its exact per-token gradient norms are over every trained parameter, and under sharding each
  rank holds a slice of each (FSDP2: a DTensor shard; ZeRO-3: 0 elements outside a gather). The
  parameters are gathered inside the engine's own context (``DTensor.full_tensor()``;
  ``deepspeed.zero.GatheredParameters``), the way TRL's fused LM head gathers its weight, and
  copied into a plain module of the same class, on which the check runs as in one process.
- :func:`lm_head_own_fsdp2_unit`: whether an FSDP2 wrap made the LM head its own unit, which TRL
  1.16's fused head does not support (see :data:`LM_HEAD_UNIT_MESSAGE`). accelerate's own FSDP2
  preparation puts the head in one unit with the final norm, which is fine.
"""

from __future__ import annotations

import torch
from transformers import TrainerCallback

LM_HEAD_UNIT_MESSAGE = (
    "The LM head is its own FSDP2 unit (the auto-wrap policy wraps nn.Linear, or is size-based with a small "
    "min_num_params), so its weight is still sharded when TRL's fused LM head reads it. TRL 1.16's fused LM head then gathers lm_head.weight with DTensor.full_tensor() without "
    "averaging its gradient across processes, so each process updates its shard of the head from its own completions "
    "only (GRPOTrainer is affected too). Wrap only the decoder layers: in the accelerate config use "
    "`fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP` with `fsdp_transformer_layer_cls_to_wrap` set to the decoder "
    "layer class alone (e.g. LlamaDecoderLayer, Qwen2DecoderLayer), as in "
    "examples/accelerate_configs/fsdp2.yaml; accelerate then puts the head in one unit with the final norm, which "
    "FSDP2 unshards before the head is read and whose gradient it averages. See docs/training.md."
)


class RefuseLMHeadUnit(TrainerCallback):
    """Stops before the first step when FSDP2 made the LM head its own unit (:data:`LM_HEAD_UNIT_MESSAGE`)."""

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if model is not None and lm_head_own_fsdp2_unit(model):
            raise ValueError(LM_HEAD_UNIT_MESSAGE)


def check_fidelity_check_supported(engine_name: str | None, peft: bool) -> None:
    """The in-training fidelity check copies a sharded model into a plain one: FSDP2 and ZeRO-3, full fine-tuning."""
    if engine_name == "fsdp1":
        raise ValueError(
            "otb_fidelity_check_steps > 0 runs under FSDP2 and DeepSpeed ZeRO-3, not FSDP1 (it gathers the "
            "sharded parameters into a full copy). Set fsdp_version: 2 in the accelerate config, or "
            "otb_fidelity_check_steps=0."
        )
    if engine_name is not None and peft:
        raise ValueError(
            f"otb_fidelity_check_steps > 0 with a PEFT model is not supported under {engine_name} "
            "(the check copies the sharded model into a plain one, which is implemented for full fine-tuning "
            "only). Set otb_fidelity_check_steps=0, or run the check without sharding (`trl-otb fidelity`)."
        )


def engine(accelerator) -> str | None:
    """``"fsdp2"``, ``"fsdp1"``, ``"zero3"`` or None (parameters not sharded) for an accelerate Accelerator."""
    from accelerate.utils import DistributedType

    state = accelerator.state
    if state.distributed_type == DistributedType.FSDP:
        return "fsdp2" if getattr(state.fsdp_plugin, "fsdp_version", 1) == 2 else "fsdp1"
    if state.distributed_type == DistributedType.DEEPSPEED:
        plugin = state.deepspeed_plugin
        return "zero3" if plugin is not None and plugin.zero_stage == 3 else None
    return None


def lm_head_own_fsdp2_unit(model: torch.nn.Module) -> bool:
    """True when FSDP2 left the LM head's weight sharded at the point where TRL's fused head reads it.

    TRL's fused head never calls ``lm_head.forward``, so the head's weight is unsharded then only if it belongs
    to a unit that another module (run inside the backbone) unshards and that stays unsharded after its
    forward: the root unit, or accelerate's ``[final_norm, lm_head]`` tail unit (``reshard_after_forward=False``).
    A unit holding the head alone (e.g. a wrap policy over every nn.Linear), or one that reshards after its
    forward, leaves a DTensor there.
    """
    from torch.distributed.fsdp import FSDPModule

    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if not isinstance(head, FSDPModule):
        return False  # inside an enclosing unit (the root): unsharded during the whole forward
    try:  # torch internals (2.6-2.13): the unit's parameter group, its modules, and whether it reshards after forward
        group = head._get_fsdp_state()._fsdp_param_group
        if group is None:
            return False
        others = [m for m in group.modules if m is not head]
        return not others or group.post_forward_mesh_info is not None
    except AttributeError as err:
        raise RuntimeError(
            f"Cannot tell which FSDP2 unit holds the LM head with this torch ({torch.__version__}): {err}. "
            "trl-otb reads FSDPModule._get_fsdp_state()._fsdp_param_group; report this torch version."
        ) from err


def _full_parameters(model: torch.nn.Module, kind: str) -> dict[str, torch.Tensor]:
    """Every parameter of ``model``, whole, on every rank (a collective: all ranks call it together)."""
    if kind == "fsdp2":
        from torch.distributed.tensor import DTensor

        return {
            name: (p.full_tensor() if isinstance(p, DTensor) else p).detach().clone()
            for name, p in model.named_parameters()
        }
    if kind == "zero3":
        import deepspeed

        params = dict(model.named_parameters())
        with deepspeed.zero.GatheredParameters(list(params.values()), modifier_rank=None):
            return {name: p.data.detach().clone() for name, p in params.items()}
    raise ValueError(f"no full replica for engine {kind!r}")


def full_replica(model: torch.nn.Module, kind: str) -> torch.nn.Module:
    """A plain copy of a sharded ``PreTrainedModel`` with its current weights and ``requires_grad`` flags.

    Collective (all ranks call it at the same point). Costs one full copy of the model per rank while it lives.
    """
    from transformers.initialization import no_init_weights

    full = _full_parameters(model, kind)
    device = next(iter(full.values())).device
    with torch.random.fork_rng(devices=[]), no_init_weights():
        replica = type(model)(model.config)
    replica.to(device=device, dtype=next(iter(full.values())).dtype)
    missing, unexpected = replica.load_state_dict(full, strict=False)
    params = dict(replica.named_parameters(remove_duplicate=False))
    buffers = {name for name, _ in replica.named_buffers()}
    loaded = {params[name].data_ptr() for name in full}
    untied = [name for name in missing if name not in buffers and params[name].data_ptr() not in loaded]
    if unexpected or untied:
        raise RuntimeError(
            f"replica of the sharded model does not match it: missing {untied}, unexpected {unexpected}"
        )
    for name, buffer in model.named_buffers():
        replica.get_buffer(name).copy_(buffer)
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    for name, p in replica.named_parameters():
        p.requires_grad_(name in trainable)
    return replica
