"""The second training study's generated blocks (research/report/study2.py), on the committed pilot summary and on
a synthetic finished study."""

from __future__ import annotations

import json

from research.report import study2
from research.report.tables import Context


def _finished(tmp_path, decision):
    """A summary of the study's shape: every decision cell with the chosen arm, TRL's GRPO and the reference OTB."""
    ctx = Context()
    pilot = ctx.load("training_study2_pilot_long_right")
    cell = pilot["cells"]["pilot_long_right_lr0.0005"]
    auc = {"mean": -0.01, "ci": [-0.03, 0.02], "differ": False, "seeds": 10}
    cell = dict(cell, paired={"otb_zero_advantage-grpo_N4": {"auc": auc}})
    cells = {c: cell for c in pilot["preregistration"]["decision_cells"]}
    summary = {"preregistration": pilot["preregistration"], "cells": cells, "decision": decision}
    (tmp_path / f"{study2.STUDY2}.json").write_text(json.dumps(summary))
    return Context(results=tmp_path)


def test_study2_cell_table_has_a_row_per_arm_and_marks_no_single_seed_interval():
    data = Context().load("training_study2_pilot_long_right")
    table = study2.study2_cell_table(data, "pilot_long_right_lr0.0005").splitlines()
    assert len(table) == 2 + len(data["cells"]["pilot_long_right_lr0.0005"]["arms"])
    assert not any("**" in row for row in table), "one seed's interval is a point: nothing is marked"


def test_study2_readme_table_before_and_after_the_study(tmp_path):
    assert "has not finished" in study2.study2_readme_table(_finished(tmp_path, None))
    decision = {
        "arm": "otb_zero_advantage",
        "config": {"advantage_estimator": "otb", "otb_tail": "zero_advantage"},
        "reasons": ["chosen: otb_zero_advantage"],
        "statement": None,
    }
    ctx = _finished(tmp_path, decision)
    rows = study2.study2_readme_table(ctx).split("\n\n")[0].splitlines()[2:]
    assert [r.split(" | ")[0].strip("| ") for r in rows] == ["long", "long_right", "short", "long_high_lr"]
    assert all("-0.010 (-0.030 to +0.020) |" in r and "**" not in r for r in rows)


def test_study2_offset_table_counts_equal_runs_per_arm(tmp_path):
    checks = {
        "grpo_N4-s0": {"invariant": True, "equal": True},
        "grpo_N4-s1": {"invariant": True, "equal": True},
        "otb_ref-s0": {"invariant": False, "equal": False},
    }
    (tmp_path / f"{study2.STUDY2}.json").write_text(json.dumps({"offset_check": checks}))
    rows = study2.study2_offset(Context(results=tmp_path)).split("\n\n")[0].splitlines()[2:]
    assert rows == [
        "| OTB, reference tail (`zero`) | no | 0/1 |",
        "| GRPO (TRL's default, std-scaled) | yes | 2/2 |",
    ]


def test_study3_table_before_and_after_runs(tmp_path):
    ctx = Context(results=tmp_path)
    assert "no finished run" in study2.study3_table(ctx)
    arms = ["otb_zero_advantage", "grpo_N4"]
    stats = {"auc_mean": 0.6, "runs": 4, "collapse_rate": 0.0}
    auc = {"mean": 0.02, "ci": [0.01, 0.03], "seeds": 10}
    summary = {
        "preregistration": {"arms": arms},
        "tuning": {f"tune_lr{lr:g}": {"learning_rate": lr, "arms": {a: stats for a in arms}} for lr in (2e-4, 5e-4)},
        "rates": {"otb_zero_advantage": 5e-4, "grpo_N4": 5e-4},
        "cells": {
            "long": {
                "arms": {a: dict(stats, runs=10) for a in arms},
                "paired": {"otb_zero_advantage-grpo_N4": {"auc": auc}},
            }
        },
        "against_study2": {
            "otb_zero_advantage": {"study2_rate": 2e-4, "rate": 5e-4, "seeds": 10, "auc": auc},
            "grpo_N4": {"study2_rate": 5e-4, "rate": 5e-4, "seeds": 10, "same_curves": 10},
        },
    }
    (tmp_path / f"{study2.STUDY3}.json").write_text(json.dumps(summary))
    rows = study2.study3_table(ctx).split("\n\n")[0].splitlines()[2:]
    first = "| OTB, `zero_advantage` | 0.600 (4) | 0.600 (4) | 0.0002 | 0.0005 | 0.600 (10) | 0/10 |"
    assert rows[0].startswith(first)
    assert rows[0].count("+0.020 (+0.010 to +0.030) **higher**") == 2
    assert rows[1].endswith("| - | same rate: 10/10 curves identical |")
