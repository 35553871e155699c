"""bitsandbytes 4-bit specifics: the CPU inference repack that breaks QLoRA gradients.

Beside the trainer, as PEFT keeps its bitsandbytes path beside the generic one: ``OTBTrainer`` applies
:func:`guard_4bit_cpu_repack` at start-up, the model card reads :func:`is_4bit_model` (a QLoRA adapter's quick start
loads its base in NF4), and the fidelity check (:mod:`trl_otb.fidelity`) guards the models it measures.

The trap (bitsandbytes 0.48 to 0.50 at least, on CPUs with AVX512-BF16): ``Linear4bit.forward``
repacks its NF4/FP4 weight into a CPU inference layout the first time it runs with

    x.device.type == "cpu" and module.support_avx512bf16_for_cpu
    and not module.training and not x.requires_grad

i.e. on the first eval-mode forward without gradients (``model.eval()`` + ``torch.no_grad()``,
``generate``, evaluation). The repack is permanent: from then on ``matmul_4bit`` calls the
inference kernel ``bitsandbytes::gemv_4bit`` in train mode too. That op has no autograd formula,
so the gradient that flows *through* every frozen 4-bit layer into the layers below is lost
(PyTorch only warns "an autograd kernel was not registered"): LoRA gradients of all but the
last layers come out wrong, or None when nothing else connects them to the loss. The repack
also rounds the quantization scales (absmax) to bfloat16.

:func:`guard_4bit_cpu_repack` switches the repack off per layer (``support_avx512bf16_for_cpu =
False``, the flag ``forward`` reads), so 4-bit layers keep the differentiable
``MatMul4Bit`` path in every mode. Call it once after loading a 4-bit model and before its first
forward; it is idempotent and costs nothing on GPUs or on models without 4-bit layers.
"""

from __future__ import annotations

import torch

__all__ = ["guard_4bit_cpu_repack", "is_4bit_model", "linear4bit_modules", "packed_4bit_layers"]


def linear4bit_modules(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """``(name, module)`` for every bitsandbytes ``Linear4bit`` in ``model`` (empty without bitsandbytes)."""
    try:
        from bitsandbytes.nn import Linear4bit
    except ImportError:
        return []
    return [(name, module) for name, module in model.named_modules() if isinstance(module, Linear4bit)]


def is_4bit_model(model: torch.nn.Module) -> bool:
    """Whether ``model`` holds at least one bitsandbytes 4-bit linear layer."""
    return bool(linear4bit_modules(model))


def _is_packed(module: torch.nn.Module) -> bool:
    return bool(getattr(getattr(module.weight, "quant_state", None), "packing_format_for_cpu", False))


def packed_4bit_layers(model: torch.nn.Module) -> list[str]:
    """Names of the 4-bit layers already repacked into the CPU inference layout (see module doc)."""
    return [name for name, module in linear4bit_modules(model) if _is_packed(module)]


def guard_4bit_cpu_repack(model: torch.nn.Module, *, restore: bool = False) -> int:
    """Stop bitsandbytes from repacking 4-bit weights for CPU inference; return the layers guarded.

    Sets ``support_avx512bf16_for_cpu = False`` on every ``Linear4bit`` so that eval-mode, no-grad
    forwards (``generate``) keep the differentiable path. Idempotent; a no-op (returns 0) for a
    model without 4-bit layers.

    Layers that were repacked already (an eval/no-grad forward ran before the guard) cannot train
    correctly. With ``restore=False`` (default) this raises a ``RuntimeError`` naming them; with
    ``restore=True`` they are unpacked with bitsandbytes' own inverse conversion (the one its
    ``.cuda()`` and ``state_dict`` paths use). The unpacked weights keep the bfloat16-rounded
    scales, so they differ slightly from the weights as loaded; reload the model for bit-exact ones.
    """
    layers = linear4bit_modules(model)
    packed = []
    for name, module in layers:
        module.support_avx512bf16_for_cpu = False
        if _is_packed(module):
            packed.append((name, module))
    if packed and not restore:
        names = ", ".join(name for name, _ in packed[:3]) + (" ..." if len(packed) > 3 else "")
        raise RuntimeError(
            f"{len(packed)} 4-bit layer(s) ({names}) were already repacked by bitsandbytes for CPU inference "
            "(an eval-mode forward without gradients, e.g. `generate`, ran before the guard), and gradients "
            "through them are wrong from now on. Call `trl_otb.bnb.guard_4bit_cpu_repack(model)` "
            "right after loading the model, reload it, or pass `restore=True` to unpack them."
        )
    if packed:
        from bitsandbytes.functional import _convert_weight_packed_for_cpu_inverse

        for _, module in packed:
            weight = module.weight
            weight.data, weight.quant_state = _convert_weight_packed_for_cpu_inverse(weight.data, weight.quant_state)
            module.quant_state = weight.quant_state
    return len(layers)
