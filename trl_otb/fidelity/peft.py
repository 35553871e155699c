"""The training paths the check measures: full fine-tuning, LoRA, and QLoRA (LoRA on a 4-bit base)."""

from __future__ import annotations

import torch

from ..bnb import guard_4bit_cpu_repack, is_4bit_model

__all__ = ["PEFT_PATHS", "prepare_peft_model", "training_path"]

PEFT_PATHS = ("none", "lora", "qlora")


def training_path(model: torch.nn.Module) -> str:
    """``"qlora"`` (4-bit layers), ``"lora"`` (a PEFT model) or ``"full"``: the label of a report."""
    if is_4bit_model(model):
        return "qlora"
    return "lora" if hasattr(model, "peft_config") else "full"


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
    :func:`~trl_otb.bnb.guard_4bit_cpu_repack`; the model must already be 4-bit (load it
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
