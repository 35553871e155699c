"""Run ``examples/math_otb.py`` as a user would, with the CPU weight-sync adapter of trl_otb.testing.vllm_cpu
installed.

    python tests/helpers/vllm_run_example.py SYNCS_JSON [math_otb.py arguments...]

The script runs unchanged as ``__main__``; afterwards SYNCS_JSON gets the weight syncs the adapter carried out.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
from pathlib import Path

from trl_otb.testing import vllm_cpu

ROOT = Path(__file__).resolve().parents[2]
os.environ.update(vllm_cpu.CPU_ENV)

if __name__ == "__main__":
    syncs_path = Path(sys.argv[1])
    vllm_cpu.install()
    script = str(ROOT / "examples" / "math_otb.py")
    sys.argv = [script, *sys.argv[2:]]
    try:
        runpy.run_path(script, run_name="__main__")
    finally:
        syncs_path.write_text(json.dumps(vllm_cpu.SYNCS))
