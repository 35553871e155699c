"""Tests whose groups are split across 2 processes (torchrun, FSDP2, ZeRO-3, vLLM server): their prompts, reward,
per-rank lengths, a free port, and padding to compare ranks' tensors."""

from __future__ import annotations

import os
import socket
import sys

import torch

# Three groups of N: with 6 completions per rank, the middle group is split across 2 ranks.
SPLIT_PROMPTS = ["what is 1 + 1?", "unscorable: what is 2 + 2?", "what is 3 + 3?"]
MAX_NEW_TOKENS = {0: 5, 1: 12}  # per rank, so that the ranks' completion tensors have different widths


def split_group_dataset():
    from datasets import Dataset

    return Dataset.from_list([{"prompt": [{"role": "user", "content": p}]} for p in SPLIT_PROMPTS])


def split_group_reward(prompts, completion_ids, **kwargs):
    """Deterministic in the completion, so the test can recompute it; None for the unscorable prompt."""
    return [
        None if "unscorable" in str(prompt) else float(len(ids) % 3) + 0.25 * (ids[0] % 2)
        for prompt, ids in zip(prompts, completion_ids)
    ]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pad_to(x: torch.Tensor, width: int) -> torch.Tensor:
    """Right-pad the last dimension of a 2-D tensor with zeros to ``width``."""
    return torch.nn.functional.pad(x, (0, width - x.size(1)))


def leave_without_teardown() -> None:
    """End a test's rank process once its results are on disk: meet the other ranks (where a process group is still
    up), flush, and exit 0 without the interpreter's teardown. On CPU a rank can abort in that teardown (SIGABRT,
    "terminate called without an active exception", exit -6) from a gloo or DeepSpeed thread that outlives Python,
    after training and saving; CI saw it once under ZeRO-3 and once under DDP. The tests judge the saved results, not
    the teardown; a failure before this call still exits non-zero."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.barrier()  # no rank leaves while another is still in a collective
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
