"""benchmarks/sample_efficiency.py: tokens to reach a target score, and the summary over seeds."""

from __future__ import annotations

import pytest

from benchmarks import sample_efficiency


def test_tokens_to_target_interpolates_between_evaluations():
    curve = [{"tokens": 0, "score": 0.5}, {"tokens": 100, "score": 0.7}, {"tokens": 200, "score": 0.9}]
    assert sample_efficiency.tokens_to_target(curve, 0.8) == pytest.approx(150.0)
    assert sample_efficiency.tokens_to_target(curve, 0.9) == pytest.approx(200.0)
    assert sample_efficiency.tokens_to_target(curve, 0.5) == 0.0  # already there before training
    assert sample_efficiency.tokens_to_target(curve, 0.95) is None
    dip = [{"tokens": 0, "score": 0.5}, {"tokens": 100, "score": 0.9}, {"tokens": 200, "score": 0.6}]
    assert sample_efficiency.tokens_to_target(dip, 0.8) == pytest.approx(75.0)  # the first crossing counts


def test_summary_medians_count_unreached_runs_as_infinite():
    def run(arm, seed, scores):
        curve = [{"step": i, "tokens": 100 * i, "score": s} for i, s in enumerate(scores)]
        return {"arm": arm, "seed": seed, "curve": curve, "seconds": 60.0}

    runs = [
        run("otb_N4", 0, [0.5, 0.9]),
        run("otb_N4", 1, [0.5, 0.6, 0.9]),
        run("otb_N4", 2, [0.5, 0.6]),
        run("grpo_N16", 0, [0.5, 0.6]),
        run("grpo_N16", 1, [0.5, 0.6]),
        run("grpo_N16", 2, [0.5, 1.0]),
    ]
    summary = sample_efficiency.summarize(runs, 0.9)
    otb, grpo = summary["otb_N4"], summary["grpo_N16"]
    assert otb["tokens_to_target"] == {0: 100.0, 1: 200.0, 2: None}
    assert otb["reached"] == "2/3" and otb["median_tokens"] == 200.0
    assert (otb["min_tokens"], otb["max_tokens"]) == (100.0, 200.0)
    assert grpo["reached"] == "1/3" and grpo["median_tokens"] is None  # most runs never reached it
    assert grpo["final_score"] == {"median": 0.6, "min": 0.6, "max": 1.0}
