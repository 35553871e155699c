"""The estimator study's generated blocks (research/report/study4.py), on a synthetic finished study: a row per arm,
per seed and per tuned rate, the decision rule's table with its choice, and the first batches."""

from __future__ import annotations

import json

from research.harness.training_study import study4
from research.harness.training_study.preregistration4 import STUDY4
from research.report import study4 as report
from research.report.pages import BLOCKS, render
from research.report.tables import Context

AUCS = {"grpo_N4": [0.5, 0.6, 0.7], "otb_default": [0.5, 0.5, 0.5], "otb_loo_ess": [0.7, 0.8, 0.9]}


def _arm(aucs: list[float], stuck: int = 0) -> dict:
    return {
        "learning_rate": 5e-4,
        "runs": len(aucs),
        "auc_mean": sum(aucs) / len(aucs),
        "stuck": stuck,
        "tie_share_mean": 0.25,
        "collapse_rate": 0.0,
        "per_seed_auc": {str(s): a for s, a in enumerate(aucs)},
    }


def _summary() -> dict:
    cell = {
        "arms": {arm: _arm(v, stuck=int(arm == "otb_default")) for arm, v in AUCS.items()},
        "paired": {"otb_loo_ess-grpo_N4": {"auc": {"mean": 0.2, "ci": [0.2, 0.2], "seeds": 3}}},
    }
    cells = {c: cell for c in STUDY4["cells"]}
    gates = {"otb_default": False, "otb_loo_mean": True, "otb_loo_ess": True, "ogb_N4": False}
    tuning = {
        study4.tune_cell("ramble", lr): {
            "task": "ramble",
            "learning_rate": lr,
            "seeds": 3,
            "arms": {"grpo_N4": _arm(v)},
        }
        for lr, v in ((2e-4, [0.4] * 3), (5e-4, [0.6] * 3), (1e-3, [0.5] * 3))
    }
    return {
        "cells": cells,
        "tuning": tuning,
        "rates": {"ramble": {"grpo_N4": 5e-4}},
        "decision": study4.decide(cells, gates),
        "prediction_p1": {
            "cells": {c: {"eps_star": 0.5, "raw_mse": -0.1} for c in cells},
            "mean_eps_star": 0.5,
            "mean_raw_mse": -0.1,
        },  # fmt: skip
    }


def _first_batches() -> dict:
    arm = {"batches": 20, "lowered": 5, "share_lowered": 0.25, "wilson95": [0.11, 0.47],
           "mean_change": {"early": 0.01, "at": -0.2, "past": 0.0}, "config": {"learning_rate": 3e-6}}  # fmt: skip
    return {"batches": 20, "draws": {"drawn": 70, "first_seed": 300, "last_seed": 369}, "arms": {"grpo_N4": arm}}


def test_the_cell_and_seed_tables_have_a_row_per_arm_and_per_seed():
    data = _summary()
    cell = report.study4_cell_table(data, "long").splitlines()
    assert len(cell) == 2 + len(AUCS)
    assert "(reference)" in cell[2] and "1/3" in cell[3]  # TRL's GRPO; the 0.2 default's stuck run
    assert "+0.200 (+0.200 to +0.200) **higher**" in cell[4]
    seeds = report.study4_seed_table(data, "long").splitlines()
    assert len(seeds) == 2 + 3 and seeds[4].split(" | ")[-1].startswith("0.900")


def test_the_rates_table_marks_the_tuned_rate_and_the_decision_table_the_chosen_arm():
    data = _summary()
    rates = report.study4_rates_table(data)
    assert "**0.0005**: 0.600 (3)" in rates and rates.rstrip().endswith("| 0.0005 |")
    decision = report.study4_decision_table(data).splitlines()
    assert data["decision"]["arm"] == "otb_loo_ess"  # precondition: the rule chose an arm
    chosen = [row for row in decision if "**chosen**" in row]
    assert len(chosen) == 1 and "`ess`" in chosen[0] and "passes" in chosen[0]
    assert report.study4_decision_table({"decision": None}) == "The study has not finished every cell."
    assert report.study4_p1_table(data).splitlines()[-1] == "| mean | +0.50 | -0.10 |"


def test_the_blocks_render_from_the_studys_json_files(tmp_path):
    (tmp_path / "training_study4.json").write_text(json.dumps(_summary()))
    (tmp_path / "first_batches.json").write_text(json.dumps(_first_batches()))
    specs = ["study4-cell training_study4 long", "study4-seeds training_study4 long", "study4-rates training_study4",
             "study4-decision training_study4", "study4-p1 training_study4", "first-batches first_batches"]  # fmt: skip
    assert {spec.split()[0] for spec in specs} <= set(BLOCKS)
    page = "\n".join(f"<!-- report: {spec} -->\n<!-- /report -->" for spec in specs)
    text = render(page, Context(results=tmp_path))
    assert "5/20 = 0.25 | 0.11-0.47 | -0.200" in text and "| 20 | 70 | 300-369 |" in text
    assert text.count("(training_study4.json)") == 0 and text.count("[training_study4.json]") == 5
