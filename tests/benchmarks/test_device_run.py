"""The prepared GPU run, ``benchmarks/device_run.sh``, in its CPU dry run: tiny shapes and sizes, the same scripts and
code paths as on the GPU. Every part must write its JSON, with the fields the documentation reads, before the next
part starts; the whole-step overhead gets at least 5 interleaved pairs per length, warm-up excluded, and the run ends
with a conclusion. No timing is asserted."""

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
        "conclusion": tmp_path / "device_conclusion.json",
    }
    for path in paths.values():
        assert path.exists(), f"{path.name} was not written"
    assert not list(tmp_path.glob("sample_efficiency*")), "the sample-efficiency job is no longer part of the run"
    assert "device_run (cpu) finished" in (tmp_path / "device_run.log").read_text()
    # Written in order: each part's JSON exists before the next part starts.
    times = [paths[k].stat().st_mtime for k in ("overhead", "speed", "fused", "conclusion")]
    assert times == sorted(times)

    overhead = json.loads(paths["overhead"].read_text())
    meta = overhead["meta"]
    assert meta["device"] == "cpu" and meta["shape"] == "tiny-qwen2" and meta["lengths"] == [8, 16]
    assert meta["warmup_steps"] >= 1 and meta["stopped"] is None
    # The warm-up steps are recorded apart and never in a pair.
    assert (
        all(len(steps) == meta["warmup_steps"] for steps in meta["warmup_s"].values()) and len(meta["warmup_s"]) == 4
    )
    runs = overhead["runs"]
    for length in (8, 16):
        rows = [r for r in runs if r["length"] == length]
        pairs = sorted({r["pair"] for r in rows})
        assert len(pairs) >= 5 and len(rows) == 2 * len(pairs)
        # ABBA: the order of the two trainers alternates from pair to pair.
        firsts = [next(r["trainer"] for r in rows if r["pair"] == p) for p in pairs]
        assert firsts[:2] == ["grpo", "otb"] and firsts[2:4] == ["grpo", "otb"]
        s = overhead["summary"][str(length)]
        assert s["pairs"] == len(pairs) >= 5 and len(s["step_wall_s"]["pair_ratios"]) == s["pairs"]
        assert s["step_wall_s"]["median_ratio"] > 0 and s["step_peak_extra_mb"] is s["peak_cuda_mb"] is None  # CPU
    assert all(r["step_wall_s"] > 0 and "step_peak_extra_mb" in r for r in runs)

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

    conclusion = json.loads(paths["conclusion"].read_text())
    assert conclusion["device"] == "cpu"
    assert re.match(r"OTB's whole step costs x[0-9.]+ GRPO's at 16 tokens \(\d+ pairs, range", conclusion["verdict"])
    kinds = (
        "whole step, 8 tokens",
        "whole step, 16 tokens",
        "rollout pass (no grad)",
        "loss step",
        "advantages (otb)",
    )
    assert all(any(line.startswith(k) for line in conclusion["lines"]) for k in kinds), conclusion["lines"]
    assert "== conclusion: OTB's whole step costs" in log


def test_the_conclusion_says_when_there_are_too_few_pairs(tmp_path):
    from benchmarks.common import write_json
    from benchmarks.device_bench import conclude

    ratios = {"pair_ratios": [1.1, 0.9], "median_ratio": 1.0, "grpo": 1.0, "otb": 1.0}
    write_json(
        tmp_path / "device_overhead.json",
        {"meta": {"device": "cuda"}, "summary": {"256": {"pairs": 2, "step_wall_s": ratios}}},
    )
    assert conclude(tmp_path)["verdict"] == "no conclusion: the whole-step overhead has fewer than 5 pairs"
