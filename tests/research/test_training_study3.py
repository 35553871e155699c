"""The third training study (research/harness/training_study/study3.py): its pre-registration names study 2's arms and
cell, the tuning rule picks the best mean auc (a tie: the lower rate; an arm missing a run: no rate), the study
refuses to run before its tuning, and the quick mode tunes, runs every arm at its tuned rate and resumes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from research.harness.training_study.preregistration2 import STUDY2
from research.harness.training_study.study3 import QUICK3, STUDY3, cells3, tune_cell, tuned_rates

ROOT = Path(__file__).resolve().parents[2]


def test_study3_preregistration_reuses_study2s_arms_and_long_cell():
    assert set(STUDY3["arms"]) <= set(STUDY2["arms"]) and "grpo_N4" in STUDY3["arms"]
    assert not set(STUDY3["tuning"]["seeds"]) & set(STUDY3["seeds"]), "tuning seeds are not study seeds"
    assert STUDY2["learning_rates"]["pilot_seed"] not in STUDY3["tuning"]["seeds"]
    cells = cells3()
    assert set(cells) == {tune_cell(lr) for lr in STUDY3["tuning"]["grid"]} | {"long"}
    for spec in cells.values():  # study 2's long cell, but for the rate
        assert {k: v for k, v in spec.items() if k not in ("learning_rate",)} == dict(
            STUDY2["cells"]["long"],
            reward_quantum=STUDY2["training_reward"]["quantum"],
            eval_samples=STUDY2["eval_samples"],
        )


def test_tuned_rates_take_the_best_mean_auc_a_tie_the_lower_rate_and_need_every_run():
    def cell(lr, aucs, runs=None):
        arms = {a: {"auc_mean": v, "runs": (runs or {}).get(a, 4)} for a, v in aucs.items()}
        return {"learning_rate": lr, "seeds": 4, "arms": arms}

    tuning = {
        "a": cell(2e-4, {"x": 0.5, "y": 0.6, "z": 0.7}),
        "b": cell(5e-4, {"x": 0.6, "y": 0.6, "z": 0.9}, runs={"z": 3}),
    }
    assert tuned_rates(tuning, ["x", "y", "z", "w"]) == {"x": 5e-4, "y": 2e-4}


@pytest.mark.slow
def test_study3_quick_mode_tunes_then_runs_every_arm_at_its_tuned_rate_and_resumes(tmp_path):
    arms = ["otb_zero_advantage", "grpo_N4"]
    base = [sys.executable, "-m", "research.harness.training_study", "--study", "3", "--quick", "--out", str(tmp_path)]
    base += ["--cache", str(tmp_path / "cache"), "--jobs", "1", "--arms", *arms]
    early = subprocess.run(base, cwd=ROOT, capture_output=True, text=True)
    assert early.returncode != 0 and "run --study 3 --tune first" in early.stderr
    tune = subprocess.run([*base, "--tune"], cwd=ROOT, capture_output=True, text=True)
    assert tune.returncode == 0, tune.stderr[-3000:]
    folder = tmp_path / "training_study3_quick"
    tuned = {p.relative_to(folder).as_posix() for p in folder.rglob("*.json")}
    assert tuned == {
        f"{tune_cell(lr)}/{a}-s{s}.json" for lr in QUICK3["grid"] for a in arms for s in QUICK3["tuning_seeds"]
    }
    study = subprocess.run(base, cwd=ROOT, capture_output=True, text=True)
    assert study.returncode == 0, study.stderr[-3000:]
    summary = json.loads((tmp_path / "training_study3_quick.json").read_text())
    assert summary["meta"]["command"].startswith("python -m research.harness.training_study --study 3 --quick")
    rates = summary["rates"]
    assert set(rates) == set(arms) and rates == tuned_rates(summary["tuning"], arms)
    for arm in arms:
        for seed in QUICK3["seeds"]:
            run = json.loads((folder / "long" / f"{arm}-s{seed}.json").read_text())
            assert run["learning_rate"] == rates[arm] and run["weights_moved"] > 0
    assert set(summary["cells"]["long"]["paired"]) == {"otb_zero_advantage-grpo_N4"}
    again = subprocess.run(base, cwd=ROOT, capture_output=True, text=True)
    assert again.returncode == 0 and "0 runs to do" in again.stdout
