"""Test-only launcher for `accelerate launch` on CPU: installs the switches of trl_otb.testing.sharded_cpu named
by the environment, runs a script as __main__, and after OTBTrainer.train() saves each rank's evidence that the engine
engaged (trl_otb.testing.sharded_cpu.engagement) to $TRL_OTB_TEST_EVIDENCE/engaged{rank}.pt, and the evaluation
rows each rank scored (examples/math_otb.py gathers them with accelerate's gather_object) to eval_rows{rank}.pt.

Usage: accelerate launch --config_file CONFIG ... tests/helpers/sharded_launch.py SCRIPT [SCRIPT ARGS]
"""

from __future__ import annotations

import os
import runpy
import sys

import torch

from trl_otb import OTBTrainer
from trl_otb.testing.multiprocess import leave_without_teardown
from trl_otb.testing.sharded_cpu import engagement, install_from_environment

install_from_environment()

_train = OTBTrainer.train


def train(self, *args, **kwargs):
    output = _train(self, *args, **kwargs)
    evidence = engagement(self)
    torch.save(
        evidence, os.path.join(os.environ["TRL_OTB_TEST_EVIDENCE"], f"engaged{self.accelerator.process_index}.pt")
    )
    return output


OTBTrainer.train = train

import accelerate.utils  # noqa: E402

_gather_object = accelerate.utils.gather_object


def gather_object(results):
    """The example's evaluation gathers (row, text, reward) per process: record which rows this process scored."""
    rank = int(os.environ.get("RANK", 0))
    path = os.path.join(os.environ["TRL_OTB_TEST_EVIDENCE"], f"eval_rows{rank}.pt")
    calls = torch.load(path) if os.path.exists(path) else []
    torch.save(calls + [[row for row, *_ in results]], path)
    return _gather_object(results)


accelerate.utils.gather_object = gather_object

if __name__ == "__main__":
    script, sys.argv = sys.argv[1], sys.argv[1:]
    runpy.run_path(script, run_name="__main__")
    leave_without_teardown()  # the script has written what the test reads
