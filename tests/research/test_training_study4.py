"""The estimator study (research/harness/training_study/study4.py): its arms name their options, its tuning grid
extends past an edge, its stuck rule, gate and decision rule do what the pre-registration says, and its quick mode
tunes, runs every cell and summarises."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from research.harness.training_study import study4
from research.harness.training_study.preregistration2 import STUDY2
from research.harness.training_study.preregistration4 import ARMS4, FIRST_BATCHES, STUDY4

ROOT = Path(__file__).resolve().parents[2]


def test_an_otb_arm_runs_with_the_options_of_its_registration_whatever_otbconfigs_defaults():
    from research.harness.training_study.runs import REGISTERED_OTB_OPTIONS, arm_otb_options

    assert "otb_shrinkage" not in ARMS4["otb_loo_mean"]  # precondition: the arm leaves its shrinkage unnamed
    assert arm_otb_options("otb_loo_mean", ARMS4["otb_loo_mean"])["otb_shrinkage"] == "none"
    assert arm_otb_options("otb_loo_ess", ARMS4["otb_loo_ess"])["otb_shrinkage"] == "ess"
    assert arm_otb_options("otb_default", ARMS4["otb_default"]) == REGISTERED_OTB_OPTIONS | {
        "otb_tail": "zero_advantage"
    }
    assert arm_otb_options("ogb_N4", ARMS4["ogb_N4"]) == {}  # OGB takes OTBConfig's (unchanged) eps and proxy


def test_every_otb_arm_names_its_options_and_the_cells_are_study_2s():
    for name, arm in ARMS4.items():
        assert arm["num_generations"] == 4 and "scale_rewards" in arm
        if arm["advantage_estimator"] == "otb":
            assert {"otb_tail", "otb_leave_one_out"} <= set(arm), name
    assert ARMS4["otb_default"] == {**ARMS4["otb_default"], "otb_tail": "zero_advantage", "otb_leave_one_out": False}
    assert ARMS4["grpo_N4"]["scale_rewards"] == "group"  # TRL's default GRPO
    assert all(STUDY4["cells"][c] == STUDY2["cells"][c] for c in STUDY4["cells"])
    assert set(FIRST_BATCHES["arms"]) <= set(ARMS4)


def _tuning(task: str, aucs: dict[float, float], arm: str = "grpo_N4", seeds: int = 3) -> dict:
    return {
        study4.tune_cell(task, lr): {"seeds": seeds, "arms": {arm: {"runs": seeds, "auc_mean": auc}}}
        for lr, auc in aucs.items()
    }


def test_the_grid_extends_past_an_edge_that_holds_the_best_rate_and_stops_inside():
    base = STUDY4["tuning"]["grid"]
    assert study4.grid_for("ramble", "grpo_N4", {}, quick=False) == base  # nothing run: the pre-registered grid
    inside = _tuning("ramble", {2e-4: 0.5, 5e-4: 0.7, 1e-3: 0.6})
    assert study4.grid_for("ramble", "grpo_N4", inside, quick=False) == base
    top = _tuning("ramble", {2e-4: 0.5, 5e-4: 0.6, 1e-3: 0.7})
    assert study4.grid_for("ramble", "grpo_N4", top, quick=False) == [*base, 2e-3]  # not yet run: the plan grows
    top |= _tuning("ramble", {2e-3: 0.65})
    assert study4.grid_for("ramble", "grpo_N4", top, quick=False) == [*base, 2e-3]  # the best is inside now
    assert study4.best_rate("ramble", "grpo_N4", top, [*base, 2e-3]) == 1e-3
    low = _tuning("ramble", {2e-4: 0.8, 5e-4: 0.6, 1e-3: 0.5})
    assert study4.grid_for("ramble", "grpo_N4", low, quick=False) == [1e-4, *base]
    tie = _tuning("copy", {2e-4: 0.5, 5e-4: 0.7, 1e-3: 0.7})
    assert study4.best_rate("copy", "grpo_N4", tie, base) == 5e-4  # a tie goes to the lower rate
    partial = _tuning("ramble", {2e-4: 0.5, 5e-4: 0.7}) | _tuning("ramble", {1e-3: 0.9}, seeds=3)
    partial[study4.tune_cell("ramble", 1e-3)]["arms"]["grpo_N4"]["runs"] = 2
    assert study4.best_rate("ramble", "grpo_N4", partial, base) is None  # a rate still missing runs


def _run(ties: list[float]) -> dict:
    return {"steps": [{"frac_reward_zero_std": t} for t in ties]}


def test_a_run_is_stuck_only_when_its_last_quarter_of_steps_all_tied():
    assert study4.stuck(_run([0.2] * 8 + [1.0] * 4))  # the last max(3, 12 // 4) = 3 steps tied
    assert not study4.stuck(_run([1.0] * 10 + [0.75, 1.0]))
    assert not study4.stuck(_run([1.0, 1.0]))  # too short to tell
    assert study4.tie_share(_run([0.0, 0.5, 1.0])) == pytest.approx(0.5)


def test_the_gate_passes_the_unbiased_arms_by_construction_and_judges_the_others_by_cos():
    assert study4.gate(None) == {"otb_default": None, "otb_loo_mean": True, "otb_loo_ess": True, "ogb_N4": None}
    cells = {
        "ramble": {"init": {"otb_default": {"cos": 0.995}, "ogb_N4": {"cos": 0.999}},
                   "trained": {"otb_default": {"cos": 0.98}, "ogb_N4": {"cos": 0.995}}},
    }  # fmt: skip
    gates = study4.gate({"cells": cells})
    assert gates["otb_default"] is False and gates["ogb_N4"] is True


def _cell(aucs: dict[str, list[float]], stuck=None) -> dict:
    return {
        "arms": {
            arm: {
                "auc_mean": sum(v) / len(v),
                "runs": len(v),
                "stuck": (stuck or {}).get(arm, 0),
                "collapse_rate": 0.0,
                "per_seed_auc": {str(s): a for s, a in enumerate(v)},
            }
            for arm, v in aucs.items()
        }
    }


def test_the_decision_takes_the_best_gate_passing_candidate_unless_the_default_wins_two_cells():
    gates = {"otb_default": False, "otb_loo_mean": True, "otb_loo_ess": True, "ogb_N4": False}
    even = {"grpo_N4": [0.5] * 10, "otb_default": [0.5] * 10, "otb_loo_mean": [0.55] * 10, "otb_loo_ess": [0.6] * 10}
    cells = {c: _cell(even) for c in STUDY4["cells"]}
    decision = study4.decide(cells, gates)
    assert decision["arm"] == "otb_loo_ess" and decision["config"] == ARMS4["otb_loo_ess"]
    table = decision["table"]
    assert table["otb_loo_ess"]["mean_auc"] == pytest.approx(0.6) and table["otb_loo_ess"]["gate"] is True
    assert table["grpo_N4"]["gate"] is None and table["otb_default"]["cells_otb_default_beats_it"] is None
    assert table["otb_loo_mean"]["cells_otb_default_beats_it"] == 0 and table["grpo_N4"]["stuck_or_collapsed"] == 0
    stuck = {c: _cell(even, stuck={"otb_loo_ess": 1}) for c in STUDY4["cells"]}
    assert study4.decide(stuck, gates)["arm"] == "otb_loo_mean"  # more stuck runs than TRL's GRPO: out
    noisy = [0.9 + 0.01 * (s % 3) for s in range(10)]
    wins = {c: _cell(dict(even, otb_default=noisy)) for c in ("long", "long_right")}
    wins |= {c: _cell(even) for c in ("short", "long_high_lr")}
    falsified = study4.decide(wins, gates)
    assert falsified["arm"] == "otb_default" and falsified["bias_helps"]
    assert study4.decide({"long": cells["long"]}, gates)["arm"] is None  # unfinished


@pytest.mark.slow
def test_study4_quick_mode_tunes_every_task_runs_every_cell_and_resumes(tmp_path):
    arms = ["grpo_N4", "otb_default"]
    cmd = [sys.executable, "-m", "research.harness.training_study", "--study", "4", "--quick", "--jobs", "1"]
    cmd += ["--out", str(tmp_path), "--arms", *arms]
    tune = subprocess.run([*cmd, "--tune"], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert tune.returncode == 0, tune.stderr[-3000:]
    assert "12 runs to do" in tune.stdout  # 3 tasks x 2 rates x 2 arms x 1 seed
    runs = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert runs.returncode == 0, runs.stderr[-3000:]
    assert "8 runs to do" in runs.stdout  # 4 cells x 2 arms
    again = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert "0 runs to do" in again.stdout  # resumes: nothing runs twice
    summary = json.loads((tmp_path / "training_study4_quick.json").read_text())
    assert set(summary["cells"]) == set(STUDY4["cells"])
    for task in STUDY4["tuning"]["tasks"]:
        assert all(summary["rates"][task][arm] is not None for arm in arms)
    high = summary["cells"]["long_high_lr"]["arms"]["grpo_N4"]["learning_rate"]
    assert high == pytest.approx(3 * summary["rates"]["ramble"]["grpo_N4"])
    record = json.loads((tmp_path / "training_study4_quick" / "long" / "otb_default-s0.json").read_text())
    assert record["arm_spec"] == ARMS4["otb_default"]
    assert summary["meta"]["command"].startswith("python -m research.harness.training_study --study 4 --quick")
    for figure in ("training_study4_quick.png", "training_study4_quick_auc.png"):  # the curves and the differences
        assert (tmp_path / figure).stat().st_size > 10_000


def test_long_rights_target_is_the_one_study_2_recorded(tmp_path):
    rates = json.loads(study4.STUDY2_RATES.read_text())
    assert rates["targets"]["long_right"] is not None  # the precondition: study 2 recorded one
    assert study4.base_cell("long_right", False, tmp_path)["target"] == rates["targets"]["long_right"]
    assert study4.base_cell("long", False, tmp_path)["target"] == STUDY2["cells"]["long"]["target"]


def test_prediction_p1_compares_the_two_rankings_on_the_mean_over_cells():
    arms = ["grpo_N4", "grpo_unscaled_N4", "otb_default", "otb_loo_mean"]
    eps = dict(zip(arms, [0.8, 0.5, 0.6, 0.4]))
    mse = dict(zip(arms, [0.1, 0.9, 0.2, 0.8]))  # raw MSE ranks them the other way
    init = {a: {"eps_star": eps[a], "raw_mse": mse[a]} for a in arms}
    prescreen = {"cells": {c: {"init": init} for c in ("ramble", "study-long_right", "study-copy")}}

    def cells(auc):
        return {c: {"arms": {a: {"auc_mean": auc[a]} for a in arms}} for c in STUDY4["cells"]}

    by_eps = study4.prediction_p1(cells({a: 1 - eps[a] for a in arms}), prescreen)
    assert by_eps["held"] and by_eps["mean_eps_star"] == pytest.approx(1.0)
    assert by_eps["cells"]["long_high_lr"]["arms"] == arms  # ramble's pre-screen, as pre-registered
    by_mse = study4.prediction_p1(cells({a: 1 - mse[a] for a in arms}), prescreen)
    assert by_mse["held"] is False and by_mse["mean_raw_mse"] == pytest.approx(1.0)
    assert study4.prediction_p1({"long": {}}, prescreen)["held"] is None
