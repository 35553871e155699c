"""OTBTrainer on the embedded SmolLM2-135M-Instruct: real vocabulary (49k), real chat template."""

from __future__ import annotations

import math

import pytest
import torch

from trl_otb import OTBConfig, OTBTrainer, otb_advantages
from trl_otb.demo.data import load_math_dataset
from trl_otb.demo.rewards import accuracy_reward, format_reward

pytestmark = pytest.mark.slow


def test_otb_step_on_smollm2_matches_contract_and_trains(smollm2_dir, tmp_path):
    args = OTBConfig(
        output_dir=str(tmp_path),
        use_cpu=True,
        bf16=False,
        gradient_checkpointing=False,
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=16,
        max_steps=1,
        learning_rate=1e-4,
        report_to="none",
        save_strategy="no",
        logging_steps=1,
    )
    dataset = load_math_dataset(split="train", num_train=8)
    trainer = OTBTrainer(smollm2_dir, reward_funcs=[accuracy_reward, format_reward], args=args, train_dataset=dataset)

    batch = trainer._generate_and_score_completions([dataset[0]] * 4)
    # Independent proxy from full logits at the sampling temperature.
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
    attention = torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1)
    T = batch["completion_ids"].size(1)
    with torch.no_grad():
        logits = trainer.model(input_ids=ids, attention_mask=attention).logits[:, -T - 1 : -1].double()
    probs = torch.softmax(logits / args.temperature, -1)
    one_hot = torch.nn.functional.one_hot(batch["completion_ids"], probs.size(-1)).double()
    proxy = ((one_hot - probs) ** 2).sum(-1).float()
    # The rewards TRL computed for this batch: the last 4 entries of each function's column in its completions log.
    per_func = [list(trainer._logs["rewards"][name])[-4:] for name in trainer.reward_func_names]
    rewards = torch.tensor(per_func, dtype=torch.float32).nansum(0)
    group = torch.zeros(4, dtype=torch.long)
    expected = otb_advantages(rewards, proxy, batch["completion_mask"], group, tail=trainer.args.otb_tail)
    assert torch.allclose(batch["advantages"], expected, atol=1e-4)

    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    assert any(not torch.equal(before[n], p.detach()) for n, p in trainer.model.named_parameters())
    log = trainer.state.log_history[0]
    assert math.isfinite(log["loss"]) and 0.0 <= log["otb/proxy_mean"] < 2.0
