"""4-bit (QLoRA) models on CPU: loading one, and putting its layers into bitsandbytes' CPU inference layout."""

from __future__ import annotations

import torch


def load_qlora(path):
    """A 4-bit model from ``path`` on CPU; skips the calling test where bitsandbytes is missing or cannot load it."""
    import pytest

    pytest.importorskip("bitsandbytes")
    from trl_otb.models import load_model_and_tokenizer

    try:
        model, _ = load_model_and_tokenizer(path, quantization="4bit", dtype=torch.float32, device_map="cpu")
    except Exception as err:  # pragma: no cover - depends on the bitsandbytes build
        pytest.skip(f"bitsandbytes cannot load a 4-bit model on this CPU: {err}")
    return model


def arm_4bit_cpu_repack(model) -> int:
    """Arm bitsandbytes' CPU repack on every 4-bit layer, as loading on a CPU with AVX512-BF16 does; returns the count.

    bitsandbytes sets ``support_avx512bf16_for_cpu`` when a layer is built, to whether the CPU has AVX512-BF16; only
    then does the first eval-mode forward without gradients repack the layer (the trap
    :func:`trl_otb.bnb.guard_4bit_cpu_repack` stops). Elsewhere nothing is ever repacked, so a test that
    concludes "no layer was repacked" from a guarded run sets the flag first: the repack (bitsandbytes' own
    conversion) then happens on any CPU.
    """
    from trl_otb.bnb import linear4bit_modules

    layers = linear4bit_modules(model)
    for _, module in layers:
        module.support_avx512bf16_for_cpu = True
    return len(layers)


def repack_4bit_layers(model, ids, how: str) -> None:
    """Put ``model``'s 4-bit layers into bitsandbytes' CPU inference layout, as its eval-mode forward does.

    ``how="forward"``: the real trap, an eval-mode no-grad forward; bitsandbytes repacks only on CPUs with
    AVX512-BF16, so this branch is skipped elsewhere. ``how="simulated"``: the repack that forward would do, by
    bitsandbytes' own conversion (pure torch, any CPU), so the detection and restore paths are tested everywhere.
    """
    import pytest
    from bitsandbytes.functional import _convert_weight_packed_for_cpu, has_avx512bf16

    from trl_otb.bnb import linear4bit_modules

    if how == "forward":
        if not has_avx512bf16():
            pytest.skip("the CPU has no AVX512-BF16 (avx512_bf16 in /proc/cpuinfo): bitsandbytes never repacks here")
        model.eval()
        with torch.no_grad():
            model(input_ids=ids)  # the trap: eval mode, no grad, on CPU
        return
    for _, module in linear4bit_modules(model):
        weight = module.weight
        weight.data, weight.quant_state = _convert_weight_packed_for_cpu(weight.data, weight.quant_state)
