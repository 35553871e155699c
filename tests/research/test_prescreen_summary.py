"""The estimator study's pre-screen summary: rebuilt from the committed runs, and the gate study 4 reads from it."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PATH = ROOT / "research" / "estimator_study" / "prescreen" / "summary.py"


def _summary_module():
    spec = importlib.util.spec_from_file_location("prescreen_summary", PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_committed_summary_rebuilds_from_the_committed_runs():
    module = _summary_module()
    assert module.SUMMARY.exists()
    assert json.loads(module.SUMMARY.read_text()) == module.build()


def test_the_gate_passes_the_unbiased_options_and_fails_an_arm_below_cos_0_99():
    summary = _summary_module().build()
    assert len(summary["cells"]) >= 3  # precondition: there are measured cells
    cosines = [c[p]["otb_default"]["cos"] for c in summary["cells"].values() for p in ("init", "trained") if p in c]
    assert min(cosines) < 0.99 and summary["gate"]["otb_default"]["passes"] is False
    assert all(
        summary["gate"][a]["passes"] and summary["gate"][a]["by_construction"] for a in ("otb_loo_mean", "otb_loo_ess")
    )
    # unscaled GRPO, the calibration arm, is unbiased in every measured cell
    assert all(
        c[p]["grpo_unscaled_N4"]["cos"] >= 0.99
        for c in summary["cells"].values()
        for p in ("init", "trained")
        if p in c
    )


def test_study4_reads_the_same_gate():
    from research.harness.training_study.study4 import gate

    summary = _summary_module().build()
    assert gate(summary) == {arm: entry["passes"] for arm, entry in summary["gate"].items()}
