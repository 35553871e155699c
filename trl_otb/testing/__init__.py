"""Tiny models and shared helpers for the test suite and the benchmarks (the role of TRL's ``testing_utils``).

One module per purpose; every name is re-exported here, so ``from trl_otb.testing import make_args`` works:

- :mod:`.tiny`: the tiny random Llama and its tokenizer: :func:`build_tiny_tokenizer`, :func:`build_tiny_model`,
  :func:`tiny_model_and_tokenizer`, :func:`save_tiny_checkpoint`, and :func:`tool_ready_model` (a chat template TRL
  parses tool calls from).
- :mod:`.trainer_setup`: one-process trainer tests: :data:`N`, :func:`make_args`, :func:`prompts_dataset`,
  :func:`generation_inputs`, :class:`RecordingReward`.
- :mod:`.reference`: the independent recomputations :func:`independent_rollout_stats` and :func:`independent_ratio`.
- :mod:`.multiprocess`: groups split across 2 processes: :data:`SPLIT_PROMPTS`, :func:`split_group_dataset`,
  :func:`split_group_reward`, :data:`MAX_NEW_TOKENS`, :func:`free_port`, :func:`pad_to`.
- :mod:`.qlora`: 4-bit models on CPU: :func:`load_qlora`, :func:`arm_4bit_cpu_repack`, :func:`repack_4bit_layers`.
- :mod:`.cards`: :func:`check_model_card`, :func:`fake_tracker_run` and :data:`TRACKER_URLS`.
- Test-only switches, imported on their own (not re-exported): :mod:`trl_otb.testing.sharded_cpu` (accelerate's
  FSDP2 and DeepSpeed ZeRO-3 paths on CPU processes) and :mod:`trl_otb.testing.vllm_cpu` (TRL's vLLM weight sync on a
  CPU build of vLLM).

Only torch is imported here; transformers, TRL, datasets, peft and pytest are imported by the helpers that use them.

**Not in the wheel.** ``setup.cfg`` excludes this package (``[options.packages.find] exclude``), the two switches
with it: ``pip install trl-otb`` brings no monkey-patches of accelerate or vLLM, and nothing that needs pytest, which a
user never calls. The library never imports it (``tests/test_package.py``), and its users, tests/ and benchmarks/, run
from a checkout, where it is imported from the source tree (``pip install -e .``, which ``make setup`` does, or the
repository root on ``sys.path``). It stays here, not in tests/helpers/, because the benchmarks use it too (the tiny
model; ``benchmarks/overhead.py`` the vLLM switch), and a benchmark that imported from tests/ would point the wrong
way. ``tests/test_package.py`` builds the wheel and checks what ships.
"""

from __future__ import annotations

from .cards import TRACKER_URLS, check_model_card, fake_tracker_run
from .multiprocess import MAX_NEW_TOKENS, SPLIT_PROMPTS, free_port, pad_to, split_group_dataset, split_group_reward
from .qlora import arm_4bit_cpu_repack, load_qlora, repack_4bit_layers
from .reference import independent_ratio, independent_rollout_stats
from .tiny import (
    CHATML_TEMPLATE,
    TINY_SPECIAL_TOKENS,
    build_tiny_model,
    build_tiny_tokenizer,
    save_tiny_checkpoint,
    tiny_model_and_tokenizer,
    tool_ready_model,
)
from .trainer_setup import N, RecordingReward, generation_inputs, make_args, prompts_dataset

__all__ = [
    "CHATML_TEMPLATE",
    "MAX_NEW_TOKENS",
    "N",
    "SPLIT_PROMPTS",
    "TINY_SPECIAL_TOKENS",
    "TRACKER_URLS",
    "RecordingReward",
    "arm_4bit_cpu_repack",
    "build_tiny_model",
    "build_tiny_tokenizer",
    "check_model_card",
    "fake_tracker_run",
    "free_port",
    "generation_inputs",
    "independent_ratio",
    "independent_rollout_stats",
    "load_qlora",
    "make_args",
    "pad_to",
    "prompts_dataset",
    "repack_4bit_layers",
    "save_tiny_checkpoint",
    "split_group_dataset",
    "split_group_reward",
    "tiny_model_and_tokenizer",
    "tool_ready_model",
]
