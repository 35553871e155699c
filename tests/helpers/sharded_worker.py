"""One rank of the sharded-engine tests (launched by tests/integration/test_sharded.py through torchrun, 2 processes,
gloo).

Usage: torchrun --nproc_per_node 2 tests/helpers/sharded_worker.py ENGINE MODE MODEL_DIR OUT_DIR

ENGINE: ``fsdp2`` (accelerate's FSDP2 path on CPU through the test-only switch of trl_otb.testing.sharded_cpu; the
environment carries what `accelerate launch` would export) or ``zero3`` (DeepSpeed ZeRO-3, DS_ACCELERATOR=cpu).

MODE:
- ``onpolicy`` / ``iter2``: OTBTrainer trains 2 generation batches (num_iterations 1 / 2) with
  per_device_train_batch_size 6 and groups of 4, so the middle group of each 12-completion batch is split
  across the ranks; rank 0 generates at most 5 tokens and rank 1 up to 12. ``onpolicy`` also runs the
  fidelity check at every step. ``nogather`` is one on-policy step of an OTB whose cross-process gather is
  disabled (the replay comparison must catch it). ``bf16``: one generation batch of two iterations (the proxy comes
  from TRL's rollout pass) in bf16 mixed precision, as examples/accelerate_configs/fsdp2.yaml trains on GPUs; it
  also saves the dtypes of a decoder layer's weight and output during the forwards. Each rank saves what it generated, its batch, advantages, rewards and
  otb/ metrics per generation batch, evidence that the engine engaged, and rank 0 the final full weights.
- ``lmhead``: TRL's fused head with lm_head wrapped as its own FSDP2 unit (plain ``fully_shard``): saves each
  rank's input rows and the gathered lm_head gradient after one backward.
- ``refuse``: OTBTrainer under accelerate's FSDP2 with a wrap policy over nn.Linear: saves the error it stops with,
  and the one a PEFT model with the fidelity check gets when the trainer is built.
"""

from __future__ import annotations

import dataclasses
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from trl_otb import OTBTrainer  # noqa: E402
from trl_otb.testing import MAX_NEW_TOKENS, split_group_dataset, split_group_reward  # noqa: E402
from trl_otb.testing.multiprocess import leave_without_teardown  # noqa: E402
from trl_otb.testing.sharded_cpu import (  # noqa: E402
    RecordingTrainer,
    engagement,
    install_from_environment,
    sharded_config,
)

ZERO3 = {
    "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
    "train_batch_size": "auto",
    "train_micro_batch_size_per_gpu": "auto",
    "gradient_accumulation_steps": "auto",
    "gradient_clipping": "auto",
    "zero_allow_untested_optimizer": True,  # the Trainer's torch SGD
}


class NoGatherTrainer(RecordingTrainer):
    """OTB with the cross-process gather disabled: each rank forms groups from its own rows (a broken OTB)."""

    def _otb_gather_padded(self, x, pad_value=0):
        return x

    def _otb_gather(self, batch, proxy, rewards):
        n = batch["completion_ids"].size(0)
        local = rewards[self.accelerator.process_index * n : (self.accelerator.process_index + 1) * n]
        return dataclasses.replace(super()._otb_gather(batch, proxy, local), rows=slice(0, n))


def train(engine: str, mode: str, model_dir: str, out_dir: str) -> None:
    extra = {"deepspeed": ZERO3} if engine == "zero3" else {}
    if mode == "nogather":
        extra.update(max_steps=1, otb_fidelity_check_steps=0)
    args = sharded_config(os.path.join(out_dir, "run"), mode, use_cpu=engine == "fsdp2", **extra)
    trainer = (NoGatherTrainer if mode == "nogather" else RecordingTrainer)(
        model_dir, reward_funcs=split_group_reward, args=args, train_dataset=split_group_dataset()
    )
    trainer.records = []
    rank = trainer.accelerator.process_index
    trainer.generation_config.max_new_tokens = MAX_NEW_TOKENS[rank]
    compute_dtypes = set()
    trainer.model.model.layers[0].self_attn.q_proj.register_forward_hook(
        lambda module, args, output: compute_dtypes.add((str(module.weight.dtype), str(output.dtype)))
    )
    trainer.train()
    from trl_otb import sharding

    weights = sharding._full_parameters(trainer.model, sharding.engine(trainer.accelerator))
    result = {"records": trainer.records, "engagement": engagement(trainer), "log_history": trainer.state.log_history}
    result["compute_dtypes"] = sorted(compute_dtypes)
    if rank == 0:
        result["weights"] = {k: v.cpu() for k, v in weights.items()}
    torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))
    # Leave the process group before the interpreter exits: a rank torn down while gloo's threads still run can abort
    # ("terminate called without an active exception") after its results are written, failing the launch.
    import torch.distributed as dist

    trainer.accelerator.wait_for_everyone()
    if dist.is_initialized():
        dist.destroy_process_group()


def lm_head_unit(model_dir: str, out_dir: str) -> None:
    """TRL's fused head with lm_head as its own FSDP2 unit: the gradient each rank gets for the head."""
    import torch.distributed as dist
    from torch.distributed.fsdp import FSDPModule, fully_shard
    from torch.distributed.tensor import DTensor
    from transformers import AutoModelForCausalLM
    from trl.trainer.utils import add_fused_lm_head

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    add_fused_lm_head(model, temperature=0.7)
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model.lm_head)  # what a wrap policy over every nn.Linear does to the head
    fully_shard(model)
    generator = torch.Generator().manual_seed(100 + rank)
    input_ids = torch.randint(3, model.config.vocab_size, (2, 7), generator=generator)
    out = model(input_ids=input_ids, labels=input_ids, fused_lm_head=True)
    out.log_probs.sum().backward()
    grad = model.lm_head.weight.grad
    result = {
        "input_ids": input_ids,
        "head_is_unit": isinstance(model.lm_head, FSDPModule),
        "grad": (grad.full_tensor() if isinstance(grad, DTensor) else grad).detach().clone(),
    }
    torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.destroy_process_group()


def refuses_lm_head_unit(model_dir: str, out_dir: str) -> None:
    """OTBTrainer under accelerate's FSDP2 with a wrap policy that includes nn.Linear: stops before the first step."""
    from peft import LoraConfig

    # First: the fidelity check with a PEFT model under FSDP2 is refused when the trainer is built.
    args = sharded_config(os.path.join(out_dir, "peft"), "onpolicy", use_cpu=True)
    lora = LoraConfig(r=4, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    try:
        OTBTrainer(
            model_dir,
            reward_funcs=split_group_reward,
            args=args,
            train_dataset=split_group_dataset(),
            peft_config=lora,
        )
        peft_message = None
    except ValueError as error:
        peft_message = str(error)
    args = sharded_config(os.path.join(out_dir, "run"), "onpolicy", use_cpu=True, otb_fidelity_check_steps=0)
    trainer = OTBTrainer(model_dir, reward_funcs=split_group_reward, args=args, train_dataset=split_group_dataset())
    rank = trainer.accelerator.process_index
    try:
        trainer.train()
        message = None
    except ValueError as error:
        message = str(error)
    result = {"message": message, "step": trainer.state.global_step, "peft_message": peft_message}
    torch.save(result, os.path.join(out_dir, f"refuse{rank}.pt"))


if __name__ == "__main__":
    engine, mode, model_dir, out_dir = sys.argv[1:5]
    install_from_environment()
    if mode == "lmhead":
        lm_head_unit(model_dir, out_dir)
    elif mode == "refuse":
        refuses_lm_head_unit(model_dir, out_dir)
    else:
        train(engine, mode, model_dir, out_dir)
    leave_without_teardown()  # every result is on disk and the ranks have met
