"""The prepared GPU run, ``benchmarks/device_run.sh``, in its CPU dry run: tiny shapes and sizes, the same scripts and
code paths as on the GPU. Every part must write its JSON, with the fields the documentation reads, before the next
part starts. No timing is asserted."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_device_run_dry_run_writes_every_part(tmp_path):
    env = {**os.environ, "PYTHON": sys.executable, "OMP_NUM_THREADS": "1"}
    env.pop("OUT", None)
    proc = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "device_run.sh"), "--dry-run", str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    # Every part ran to its end (none skipped, none failed or timed out).
    for n in range(1, 5):
        assert re.search(rf"== {n}\. .* done at", log), log[-4000:]
    assert "exit status" not in log and "skipped" not in log, log[-4000:]

    paths = {
        "overhead": tmp_path / "device_overhead.json",
        "speed": tmp_path / "device_advantages_speed.json",
        "fused": tmp_path / "device_fused_head.json",
        "efficiency": tmp_path / "sample_efficiency_tiny_digits.json",
    }
    for path in paths.values():
        assert path.exists(), f"{path.name} was not written"
    assert "device_run (cpu) finished" in (tmp_path / "device_run.log").read_text()
    # Written in order: each part's JSON exists before the next part starts.
    times = [paths[k].stat().st_mtime for k in ("overhead", "speed", "fused", "efficiency")]
    assert times == sorted(times)

    overhead = json.loads(paths["overhead"].read_text())
    assert overhead["meta"]["device"] == "cpu" and overhead["meta"]["shape"] == "tiny-qwen2"
    assert overhead["meta"]["lengths"] == [8, 16]
    runs = overhead["runs"]
    assert sorted((r["length"], r["trainer"]) for r in runs) == [(8, "grpo"), (8, "otb"), (16, "grpo"), (16, "otb")]
    for r in runs:
        assert len(r["per_step_wall_s"]) == r["steps"] == 1 and r["step_wall_s"] > 0
        assert "peak_cuda_mb" in r  # None on the CPU, MB on a GPU
    for length in ("8", "16"):
        s = overhead["summary"][length]
        assert s["pairs"] == 1 and len(s["step_wall_s"]["pair_ratios"]) == 1 and s["step_wall_s"]["median_ratio"] > 0

    speed = json.loads(paths["speed"].read_text())
    assert speed["meta"]["clock"] == "process CPU time" and speed["meta"]["device"] == "cpu"
    (row,) = speed["results"]
    assert row["tokens"] == 16 * 8 * 64
    assert {"floor", "otb", "grpo", "ogb"} <= set(row["median_s"]) and row["ratio_to_floor"]["otb"] > 0

    fused = json.loads(paths["fused"].read_text())
    assert fused["meta"]["variants"]["otb"][-1] == "log_sum_sq_probs"
    assert "log_sum_sq_probs" not in fused["meta"]["variants"]["grpo"]
    assert sorted((r["length"], r["mode"]) for r in fused["results"]) == [
        (8, "grad"),
        (8, "no_grad"),
        (16, "grad"),
        (16, "no_grad"),
    ]
    for r in fused["results"]:
        assert set(r["median_s"]) == {"grpo", "otb"} and len(r["pair_ratios"]) == fused["meta"]["repeats"]

    efficiency = json.loads(paths["efficiency"].read_text())
    (run,) = efficiency["runs"]
    assert run["arm"] == "otb_N4" and len(run["curve"]) >= 2
