"""The 4-bit CPU guard (trl_otb/bnb.py): on CPUs with AVX512-BF16, bitsandbytes repacks a 4-bit layer on its first
eval-mode forward without gradients, and the gradient through it is lost from then on. The guard keeps QLoRA adapter
gradients unchanged; an unguarded repack is detected and can be restored. The trainer applying the guard:
tests/test_trainer_fidelity.py."""

import warnings

import pytest
import torch

from trl_otb.bnb import guard_4bit_cpu_repack, linear4bit_modules, packed_4bit_layers
from trl_otb.testing import arm_4bit_cpu_repack, repack_4bit_layers
from trl_otb.testing import load_qlora as _load_qlora


def _lora(model, **kwargs):
    from peft import LoraConfig, get_peft_model

    # init_lora_weights=False: B != 0, so that lora_A has a gradient too.
    config = LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", lora_dropout=0.0, init_lora_weights=False)
    return get_peft_model(model, config, **kwargs)


def _adapter_grads(model, ids):
    model.train()
    model.zero_grad()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "autograd kernel was not registered" when the trap has sprung
        model(input_ids=ids).logits.float().logsumexp(-1).sum().backward()
    return {n: p.grad for n, p in model.named_parameters() if p.requires_grad}


def test_guard_keeps_qlora_gradients_after_eval_and_generate(tiny_4bit_dir):
    ids = torch.randint(3, 200, (2, 12))
    # Precondition: the trap is armed (as on a CPU with AVX512-BF16), so an unguarded eval forward does repack.
    unguarded = _load_qlora(tiny_4bit_dir)
    arm_4bit_cpu_repack(unguarded)
    unguarded.eval()
    with torch.no_grad():
        unguarded(input_ids=ids)
    assert packed_4bit_layers(unguarded), "precondition failed: an armed, unguarded eval forward repacked nothing"
    model = _load_qlora(tiny_4bit_dir)
    assert arm_4bit_cpu_repack(model) == guard_4bit_cpu_repack(model) > 0
    model = _lora(model)
    before = _adapter_grads(model, ids)
    model.eval()
    with torch.no_grad():
        model(input_ids=ids)
        model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=4, do_sample=True)
    assert packed_4bit_layers(model) == []
    after = _adapter_grads(model, ids)
    assert all(g is not None and g.abs().sum() > 0 for g in after.values())
    for name, grad in after.items():
        torch.testing.assert_close(grad, before[name], rtol=1e-5, atol=1e-7, msg=name)


@pytest.mark.parametrize("how", ["forward", "simulated"])
def test_unguarded_repack_is_detected_and_can_be_restored(tiny_4bit_dir, how):
    model = _lora(_load_qlora(tiny_4bit_dir))
    ids = torch.randint(3, 200, (2, 12))
    expected = _adapter_grads(model, ids)
    repack_4bit_layers(model, ids, how)
    assert packed_4bit_layers(model) == [name for name, _ in linear4bit_modules(model)]
    with pytest.raises(RuntimeError, match="guard_4bit_cpu_repack"):
        guard_4bit_cpu_repack(model)
    guard_4bit_cpu_repack(model, restore=True)
    assert packed_4bit_layers(model) == []
    grads = _adapter_grads(model, ids)
    assert all(g is not None and g.abs().sum() > 0 for g in grads.values())
    for name, grad in grads.items():  # unpacked weights keep bfloat16-rounded scales: close, not bit-exact
        torch.testing.assert_close(grad, expected[name], rtol=0.05, atol=1e-4, msg=name)
