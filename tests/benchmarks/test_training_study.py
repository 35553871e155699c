"""benchmarks/training_study.py: its curve metrics, collapse rule and paired statistics follow their definitions, the
preregistration covers every cell and arm, and its quick mode trains every arm and resumes. No timing is asserted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from trl_otb.testing import load_script

ROOT = Path(__file__).resolve().parents[2]
training_study = load_script(ROOT / "benchmarks" / "training_study.py")
study_task = load_script(ROOT / "benchmarks" / "study_task.py")


def test_study_curve_metrics_follow_their_definitions():
    curve = [{"tokens": 0, "score": 0.2}, {"tokens": 100, "score": 0.6}, {"tokens": 220, "score": 1.0}]
    assert training_study.score_at(curve, 50) == pytest.approx(0.4)
    assert training_study.score_at(curve, 200) == pytest.approx(0.6 + 0.4 * 100 / 120)
    # mean score over [0, 200]: trapezoids 0-100 (area 40) and 100-200 (score 0.6 -> 0.9333, area 76.67)
    assert training_study.auc(curve, 200) == pytest.approx((40 + (0.6 + 0.6 + 0.4 * 100 / 120) / 2 * 100) / 200)
    cell = {"target": 0.8, "token_budget": 200}
    run = {"curve": curve, "steps": [{"loss": 0.1, "grad_norm": 1.0}], "tokens": 220, "cpu_seconds": 1.0}
    metrics = training_study.run_metrics(run, cell)
    assert metrics["tokens_to_target"] == pytest.approx(160.0) and metrics["reached"]
    never = dict(run, curve=[{"tokens": 0, "score": 0.2}, {"tokens": 220, "score": 0.5}])
    assert training_study.run_metrics(never, cell)["tokens_to_target"] == 200  # censored at the budget
    assert not training_study.run_metrics(never, cell)["reached"]


def test_study_collapse_rule():
    def run(scores, loss=0.1):
        return {
            "curve": [{"tokens": i, "score": s} for i, s in enumerate(scores)],
            "steps": [{"loss": loss, "grad_norm": 1.0}],
        }

    assert not training_study.collapsed(run([0.4, 0.3, 0.21]))
    assert training_study.collapsed(run([0.4, 0.3, 0.19]))  # below half its initial score
    assert not training_study.collapsed(run([0.4, 0.8, 0.61]))
    assert training_study.collapsed(run([0.4, 0.8, 0.59]))  # more than 0.2 below its best
    assert training_study.collapsed(run([0.4, 0.5, 0.9], loss=float("nan")))


def test_study_paired_bootstrap_and_wilson():
    shifted = training_study.paired_bootstrap([0.1 + 0.01 * (i % 3) for i in range(10)])
    assert shifted["differ"] and shifted["ci"][0] > 0 and shifted["seeds"] == 10
    assert shifted["mean"] == pytest.approx(0.109)
    symmetric = training_study.paired_bootstrap([(-1) ** i * 0.1 for i in range(10)])
    assert not symmetric["differ"] and symmetric["ci"][0] < 0 < symmetric["ci"][1]
    lo, hi = training_study.wilson(0, 10)
    assert lo == 0.0 and 0.25 < hi < 0.35
    assert training_study.wilson(5, 10)[0] < 0.5 < training_study.wilson(5, 10)[1]


def test_study_preregistration_covers_every_cell_and_arm():
    prereg = training_study.PREREGISTRATION
    assert prereg["seeds"] == list(range(10))
    assert set(prereg["arms"]) == {"otb_N4", "grpo_N4", "grpo_unscaled_N4", "ogb_N4", "grpo_N16"}
    assert (
        prereg["arms"]["grpo_N4"]["scale_rewards"] == "group" and prereg["arms"]["grpo_N16"]["num_generations"] == 16
    )
    long, high = prereg["cells"]["long"], prereg["cells"]["long_high_lr"]
    assert high["task"] == long["task"] == "ramble" and high["learning_rate"] >= 3 * long["learning_rate"]
    assert {c["task"] for c in prereg["cells"].values()} == set(study_task.TASKS)


def test_study_arms_set_their_reward_scaling_so_the_config_default_never_reaches_them():
    """Each arm passes scale_rewards itself, so OTBConfig's default (None: follow the estimator) leaves every arm the
    configuration of the committed results, grpo_unscaled_N4 unscaled included."""
    from trl_otb import OTBConfig

    committed = json.loads((ROOT / "benchmarks" / "results" / "training_study.json").read_text())
    arms = committed["preregistration"]["arms"]
    assert training_study.PREREGISTRATION["arms"] == arms  # precondition: the script runs the committed arms
    assert arms["grpo_unscaled_N4"] == {"advantage_estimator": "grpo", "num_generations": 4, "scale_rewards": "none"}
    for name, arm in arms.items():
        cpu = dict(output_dir="unused", use_cpu=True, bf16=False, per_device_train_batch_size=arm["num_generations"])
        assert OTBConfig(**cpu, **arm).scale_rewards == arm["scale_rewards"], name


@pytest.mark.slow
def test_study_quick_mode_trains_every_arm_and_resumes(tmp_path):
    command = [
        sys.executable,
        str(ROOT / "benchmarks" / "training_study.py"),
        "--quick",
        "--out",
        str(tmp_path),
        "--cache",
        str(tmp_path / "cache"),
        "--jobs",
        "1",
    ]
    first = subprocess.run(command, check=True, cwd=ROOT, capture_output=True, text=True)
    assert "5 runs to do" in first.stdout
    runs = sorted((tmp_path / "training_study" / "short").glob("*.json"))
    assert [p.name for p in runs] == [f"{arm}-s0.json" for arm in sorted(training_study.PREREGISTRATION["arms"])]
    for path in runs:
        run = json.loads(path.read_text())
        assert run["weights_moved"] > 0, f"{path.name}: no parameter moved, so the run trained nothing"
        assert len(run["steps"]) == 2 and len(run["curve"]) == 2 and run["tokens"] > 0
    summary = json.loads((tmp_path / "training_study_quick.json").read_text())
    cell = summary["cells"]["short"]
    assert set(cell["arms"]) == set(training_study.PREREGISTRATION["arms"])
    assert set(cell["paired"]) == {f"otb_N4-{a}" for a in training_study.PREREGISTRATION["arms"] if a != "otb_N4"}
    assert summary["meta"]["command"].startswith("python benchmarks/training_study.py --quick")
    assert (tmp_path / "training_study_quick.png").stat().st_size > 0
    again = subprocess.run(command, check=True, cwd=ROOT, capture_output=True, text=True)
    assert "0 runs to do" in again.stdout  # every finished run is kept, none is run twice
