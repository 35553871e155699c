"""Test-only: run accelerate's FSDP2 and DeepSpeed ZeRO-3 paths on CPU processes (gloo), and what the sharded tests
(tests/integration/test_sharded.py, tests/helpers/sharded_worker.py, tests/helpers/sharded_launch.py) share: their
configuration, a trainer that records every generation batch, and the evidence that the engine sharded the model.

FSDP2: accelerate never turns FSDP on for a CPU run. With ``use_cpu`` it selects ``MULTI_CPU`` and
wraps the model in DDP (the FSDP plugin is ignored); without it and without a GPU each process
trains alone. torch's ``fully_shard`` itself trains fine on CPU with gloo, so
:func:`force_fsdp_on_cpu` switches the distributed type to ``FSDP`` after accelerate picked
``MULTI_CPU``, in both ``AcceleratorState`` and ``PartialState`` (``set_seed`` builds a fresh
``AcceleratorState`` view from ``PartialState``). With mixed precision (``bf16=True``) it then sets the FSDP
plugin's mixed-precision policy, as accelerate's GPU branch does (``fsdp_plugin.set_mixed_precision``).
This is a switch for these tests, not a way to train: it only makes accelerate's own FSDP2 code path run on a
CPU so that it can be tested here. Every test that uses it asserts that the model really was sharded.

DeepSpeed ZeRO-3: ``DS_ACCELERATOR=cpu`` makes DeepSpeed itself run on CPU over gloo, but accelerate
finds no distributed backend without a GPU (``_prepare_backend`` returns none), so every process runs
alone. :func:`force_deepspeed_on_cpu` makes it return gloo in that case; accelerate then lets DeepSpeed
initialise the process group and selects ``DEEPSPEED`` as it does on GPUs; it also sets ZeRO-3's
``stage3_param_persistence_threshold`` to 0, so that the tiny test model's small parameters are partitioned
too. Same caveat: a test switch,
and the tests assert that ZeRO-3 partitioned the model.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

from trl_otb import OTBTrainer
from trl_otb.testing import make_args

FSDP2_ENV = {
    # What `accelerate launch` exports for examples/accelerate_configs/fsdp2.yaml (decoder layers wrapped).
    "ACCELERATE_USE_FSDP": "true",
    "FSDP_VERSION": "2",
    "FSDP_AUTO_WRAP_POLICY": "TRANSFORMER_BASED_WRAP",
    "FSDP_TRANSFORMER_CLS_TO_WRAP": "LlamaDecoderLayer",
    "FSDP_RESHARD_AFTER_FORWARD": "true",
    "FSDP_STATE_DICT_TYPE": "FULL_STATE_DICT",
    "FSDP_CPU_RAM_EFFICIENT_LOADING": "false",
    "FSDP_OFFLOAD_PARAMS": "false",
    "FSDP_ACTIVATION_CHECKPOINTING": "false",
    "ACCELERATE_USE_CPU": "1",
    "TRL_OTB_TEST_FSDP_ON_CPU": "1",
}
# A wrap policy that makes lm_head (an nn.Linear) its own FSDP2 unit.
FSDP2_LINEAR_WRAP_ENV = {**FSDP2_ENV, "FSDP_TRANSFORMER_CLS_TO_WRAP": "LlamaDecoderLayer,Linear"}
ZERO3_ENV = {"DS_ACCELERATOR": "cpu", "ACCELERATE_USE_CPU": "0", "TRL_OTB_TEST_DEEPSPEED_ON_CPU": "1"}


def force_fsdp_on_cpu() -> None:
    """Make the next AcceleratorState use FSDP on a CPU run (see the module docstring). Idempotent."""
    from accelerate.state import AcceleratorState, PartialState
    from accelerate.utils import DistributedType

    if getattr(AcceleratorState.__init__, "_fsdp_on_cpu", False):
        return
    original = AcceleratorState.__init__

    @functools.wraps(original)
    def __init__(self, *args, fsdp_plugin=None, **kwargs):
        original(self, *args, fsdp_plugin=fsdp_plugin, **kwargs)
        if self.distributed_type == DistributedType.MULTI_CPU and fsdp_plugin is not None:
            self.distributed_type = DistributedType.FSDP
            if self._mixed_precision != "no":
                fsdp_plugin.set_mixed_precision(self._mixed_precision)
            self.fsdp_plugin = fsdp_plugin
            PartialState._shared_state["distributed_type"] = DistributedType.FSDP

    __init__._fsdp_on_cpu = True
    AcceleratorState.__init__ = __init__


def force_deepspeed_on_cpu() -> None:
    """Let accelerate start a DeepSpeed run on CPU processes over gloo (see the module docstring). Idempotent."""
    from accelerate.state import PartialState
    from accelerate.utils import DistributedType

    if getattr(PartialState._prepare_backend, "_deepspeed_on_cpu", False):
        return
    original = PartialState._prepare_backend

    @functools.wraps(original)
    def _prepare_backend(self, cpu=False, sagemaker_dp=False, backend=None):
        backend_, distributed_type = original(self, cpu, sagemaker_dp, backend)
        launched = int(os.environ.get("LOCAL_RANK", -1)) != -1
        deepspeed = os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true"
        if backend_ is None and distributed_type == DistributedType.NO and launched and deepspeed and not cpu:
            return "gloo", DistributedType.MULTI_CPU
        return backend_, distributed_type

    _prepare_backend._deepspeed_on_cpu = True
    PartialState._prepare_backend = _prepare_backend

    # DeepSpeed keeps parameters under `stage3_param_persistence_threshold` elements (default 1e5) whole on every
    # rank; all of the tiny test model's are. Partition every one, as ZeRO-3 does to a real model's weights.
    from accelerate.utils import DeepSpeedPlugin

    post_init = DeepSpeedPlugin.__post_init__

    @functools.wraps(post_init)
    def __post_init__(self):
        post_init(self)
        zero = self.deepspeed_config.get("zero_optimization", {})
        if zero.get("stage") == 3:
            zero["stage3_param_persistence_threshold"] = 0

    DeepSpeedPlugin.__post_init__ = __post_init__


def install_from_environment() -> None:
    """Install the switches named by the environment (tests/helpers/sharded_launch.py and sharded_worker.py)."""
    if os.environ.get("TRL_OTB_TEST_FSDP_ON_CPU") == "1":
        force_fsdp_on_cpu()
    if os.environ.get("TRL_OTB_TEST_DEEPSPEED_ON_CPU") == "1":
        force_deepspeed_on_cpu()


def sharded_config(output_dir: str, mode: str, **overrides):
    """The sharded runs' ``OTBConfig`` for MODE (tests/helpers/sharded_worker.py).

    The single-process replay uses it with per_device_train_batch_size=12. ``bf16``: one generation batch of two
    iterations (so TRL runs its rollout pass, the proxy's source) in bf16 mixed precision.
    """
    values = dict(
        output_dir=output_dir,
        gradient_checkpointing=True,
        per_device_train_batch_size=6,
        steps_per_generation=1,
        num_iterations=2 if mode in ("iter2", "bf16") else 1,
        max_steps=4 if mode == "iter2" else 2,
        bf16=mode == "bf16",
        # SGD: the final weights then compare the gradients. Adam divides each coordinate by its own gradient scale,
        # so coordinates whose gradient is ~0 move by ~lr on float rounding alone (measured: weights 8e-3 apart
        # after 4 Adam steps at lr 1e-2 with num_iterations=2, 6e-8 with SGD).
        optim="sgd",
        learning_rate=0.1,
        otb_fidelity_check_steps=1 if mode == "onpolicy" else 0,
    )
    return make_args(Path(output_dir), **{**values, **overrides})


class RecordingTrainer(OTBTrainer):
    """Records every generation batch: the completions `generate` produced, and what OTB made of them."""

    def _generate_single_turn(self, prompt_ids, *args, **kwargs):
        completion_ids, logprobs = super()._generate_single_turn(prompt_ids, *args, **kwargs)
        self._record = {"prompt_id_lists": [list(p) for p in prompt_ids], "completion_id_lists": completion_ids}
        return completion_ids, logprobs

    def _otb_local_proxy(self, batch, capture):
        proxy = super()._otb_local_proxy(batch, capture)
        stats = capture.rollout_pass(batch.get("old_per_token_logps"))
        self._proxy = {"proxy": proxy.detach().cpu(), "from_rollout_pass": stats is not None}
        if stats is not None:  # what the proxy was formed from, and what TRL received from the same pass
            self._proxy["input_dtypes"] = (stats.logps.dtype, stats.log_sum_sq_probs.dtype)
            self._proxy["trl_logps"] = batch["old_per_token_logps"].detach().cpu()
        return proxy

    def _otb_gather(self, batch, proxy, rewards):
        groups = super()._otb_gather(batch, proxy, rewards)
        self._rewards = groups.rewards[groups.rows].cpu()
        return groups

    def _generate_and_score_completions(self, inputs):
        batch = super()._generate_and_score_completions(inputs)
        record = self._record
        keys = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "advantages")
        record.update({k: batch[k].detach().cpu() for k in keys})
        record["prompts"] = [str(x["prompt"]) for x in inputs]
        record["rewards"] = self._rewards
        record.update(self._proxy)
        record["metrics"] = {k: v[-1] for k, v in self._metrics["train"].items() if k.startswith("otb/")}
        self.records.append(record)
        return batch


def engagement(trainer) -> dict:
    """Evidence, read outside any forward, that the engine sharded the model."""
    from accelerate.utils import DistributedType

    head = trainer.model.get_output_embeddings().weight
    out = {
        "distributed_type": str(trainer.accelerator.distributed_type),
        "world_size": trainer.accelerator.num_processes,
    }
    if trainer.accelerator.distributed_type == DistributedType.FSDP:
        from torch.distributed.tensor import DTensor

        out["head_is_dtensor"] = isinstance(head, DTensor)
        out["head_local_rows"] = head.to_local().shape[0] if isinstance(head, DTensor) else head.shape[0]
        out["head_rows"] = head.shape[0]
        policy = trainer.accelerator.state.fsdp_plugin.mixed_precision_policy
        out["param_dtype"] = getattr(policy, "param_dtype", None)
        out["output_dtype"] = getattr(policy, "output_dtype", None)
    if trainer.accelerator.distributed_type == DistributedType.DEEPSPEED:
        from deepspeed import DeepSpeedEngine

        out["head_local_numel"] = head.numel()
        out["head_ds_numel"] = getattr(head, "ds_numel", None)
        out["engine"] = type(trainer.model_wrapped).__name__
        out["is_ds_engine"] = isinstance(trainer.model_wrapped, DeepSpeedEngine)
        out["zero_stage"] = trainer.model_wrapped.zero_optimization_stage()
    return out
