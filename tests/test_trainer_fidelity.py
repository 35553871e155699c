"""In training: the fidelity check at `otb_fidelity_check_steps`, and QLoRA kept trainable by the 4-bit guard."""

from __future__ import annotations

import math

import pytest
import torch
from peft import LoraConfig

from trl_otb import OTBTrainer
from trl_otb.bnb import linear4bit_modules, packed_4bit_layers
from trl_otb.testing import RecordingReward, arm_4bit_cpu_repack, make_args, prompts_dataset, repack_4bit_layers
from trl_otb.testing import load_qlora as _load_qlora


def test_fidelity_check_logs_metrics_at_the_configured_steps(tiny_model_dir, tmp_path):
    args = make_args(
        tmp_path,
        otb_fidelity_check_steps=2,
        otb_fidelity_min_energy_spearman=-1.0,
        max_steps=3,
        max_completion_length=6,
    )
    trainer = OTBTrainer(tiny_model_dir, reward_funcs=RecordingReward(), args=args, train_dataset=prompts_dataset())
    trainer.train()
    assert [entry["step"] for entry in trainer.state.log_history if "loss" in entry] == [1, 2, 3]  # 3 batches logged
    logged = [entry for entry in trainer.state.log_history if "otb/fidelity/energy_spearman" in entry]
    # Generation batches at global steps 0 and 2 run the check; step 1's does not.
    assert [entry["step"] for entry in logged] == [1, 3]
    for entry in logged:
        assert -1.0 <= entry["otb/fidelity/token_spearman"] <= 1.0
        assert math.isfinite(entry["otb/fidelity/baseline_rel_diff"]) and entry["otb/fidelity/seconds_per_token"] > 0


def test_fidelity_check_warns_below_the_threshold(tiny_model_dir, tmp_path):
    args = make_args(
        tmp_path, otb_fidelity_check_steps=1, otb_fidelity_min_energy_spearman=1.0, max_completion_length=6
    )
    trainer = OTBTrainer(tiny_model_dir, reward_funcs=RecordingReward(), args=args, train_dataset=prompts_dataset())
    with pytest.warns(UserWarning, match="otb_fidelity_min_energy_spearman=1.0"):
        trainer.train()


def test_qlora_adapters_train_after_generation_on_cpu(tiny_4bit_dir, tmp_path):  # noqa: F811
    model = _load_qlora(tiny_4bit_dir)
    assert arm_4bit_cpu_repack(model) > 0  # as on a CPU with AVX512-BF16: unguarded, an eval forward would repack
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    # TRL generates for training in train mode; the evaluation after step 1 (eval mode, no grad) is the trigger.
    args = make_args(
        tmp_path,
        max_steps=2,
        learning_rate=1e-2,
        max_completion_length=6,
        eval_strategy="steps",
        eval_steps=1,
        num_generations_eval=2,
        per_device_eval_batch_size=4,
    )
    reward = RecordingReward(distinct=True)  # no group ties: every step has a gradient to lose
    trainer = OTBTrainer(
        model,
        reward_funcs=reward,
        args=args,
        train_dataset=prompts_dataset(),
        eval_dataset=prompts_dataset(4),
        peft_config=lora,
    )
    adapters = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    assert adapters and all("lora_" in n for n in adapters)
    _, layer = linear4bit_modules(trainer.model)[0]
    triggers = []
    layer.register_forward_pre_hook(lambda m, a: triggers.append(not m.training and not torch.is_grad_enabled()))
    trainer.train()
    # Precondition: a forward that repacks an armed, unguarded layer ran (eval mode, no gradients) before step 2.
    assert any(triggers), "precondition failed: no eval-mode forward without gradients ran through the 4-bit layers"
    assert packed_4bit_layers(trainer.model) == []
    moved = [n for n, p in trainer.model.named_parameters() if p.requires_grad and not torch.equal(adapters[n], p)]
    assert moved, "no LoRA parameter moved: the adapters' gradients were lost"


@pytest.mark.parametrize("how", ["forward", "simulated"])
def test_trainer_refuses_a_4bit_model_already_repacked(tiny_4bit_dir, tmp_path, how):  # noqa: F811
    model = _load_qlora(tiny_4bit_dir)
    repack_4bit_layers(model, torch.tensor([[5, 6, 7, 8]]), how)  # before any guard
    assert packed_4bit_layers(model)
    lora = LoraConfig(r=4, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    with pytest.raises(RuntimeError, match="guard_4bit_cpu_repack"):
        OTBTrainer(
            model,
            reward_funcs=RecordingReward(),
            args=make_args(tmp_path),
            train_dataset=prompts_dataset(),
            peft_config=lora,
        )
