"""``trl-otb gradient-check`` with vLLM colocated generation, in a process of its own, for
tests/integration/test_vllm.py (run with the vLLM venv's Python).

    python tests/helpers/gradcheck_vllm_worker.py MODEL_DIR OUT_DIR

The pools come from TRL's vLLM generation through OTBTrainer (the CPU weight-sync adapter of trl_otb.testing.vllm_cpu
installed); the check's report goes to OUT_DIR/gradient_check.json, and the number of vLLM generate calls to
OUT_DIR/calls.json.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from trl_otb.testing import vllm_cpu

os.environ.update(vllm_cpu.CPU_ENV)


def main(model_dir: str, out: str) -> None:
    vllm_cpu.install()
    from trl_otb.gradcheck import gradient_check
    from trl_otb.testing import RecordingReward, make_args, prompts_dataset

    out = Path(out)
    args = make_args(out, use_vllm=True, vllm_mode="colocate")
    calls = []
    from vllm import LLM

    original = LLM.generate

    def counted(self, *a, **k):
        calls.append(1)
        return original(self, *a, **k)

    LLM.generate = counted
    gradient_check(model_dir, RecordingReward(distinct=True), prompts_dataset(), args, prompts=3, pool_size=8,
                   num_groups=16, bootstrap=50, kappa_dim=256, progress=False, out=out / "gc")  # fmt: skip
    (out / "calls.json").write_text(json.dumps({"generate_calls": len(calls)}))


if __name__ == "__main__":
    main(*sys.argv[1:3])
