"""Every benchmark script's ``--quick`` mode (what ``make bench`` runs) end to end: it writes its JSON and its plot. No
timing is asserted. The training study's quick mode: tests/benchmarks/test_training_study.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SCRIPTS = ["advantages_speed", "overhead", "variance", "sample_efficiency"]


@pytest.mark.slow
@pytest.mark.parametrize("script", SCRIPTS)
def test_quick_mode_writes_json_and_png(script, tmp_path):
    stem = f"{script}_quick"
    subprocess.run(
        [sys.executable, "-m", f"benchmarks.{script}", "--quick", "--out", str(tmp_path)],
        check=True,
        cwd=ROOT,
        capture_output=True,
    )
    data = json.loads((tmp_path / f"{stem}.json").read_text())
    assert data["meta"]["command"].startswith(f"python -m benchmarks.{script} --quick")
    assert (tmp_path / f"{stem}.png").stat().st_size > 0
