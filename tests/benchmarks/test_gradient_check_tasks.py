"""benchmarks/gradient_check_tasks.py's summary: each space's rows, the variance tool's for the same cell, and the
Spearman agreement of the spaces' eps_star rankings."""

from __future__ import annotations

import json

import pytest

from benchmarks import gradient_check_tasks as tasks
from trl_otb.gradcheck.analysis import estimators_for

ESTIMATORS = estimators_for()


def _report(eps: list[float]) -> dict:
    rows = {e: {"cos": 1.0, "cos_ci": [0.9, 1.1], "eps_star": x, "eps_star_ci": [x - 0.1, x + 0.1]}
            for e, x in zip(ESTIMATORS, eps)}  # fmt: skip
    meta = {"prompts": 4, "informative_prompts": 4, "pool_size": 8, "seconds": 1.0,
            "estimators": {e: {"estimator": est, "options": o} for e, (est, o) in ESTIMATORS.items()}}  # fmt: skip
    return {"meta": meta, "rows": rows, "reading": "r"}


@pytest.mark.parametrize(
    ("other", "rho"), [([0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7], 1.0), ([0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1], -1.0)]
)
def test_the_summary_pairs_spaces_and_reads_the_variance_tool(tmp_path, other, rho):
    (tmp_path / "math64-head.json").write_text(json.dumps(_report([0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7])))
    (tmp_path / "math64-last-block.json").write_text(json.dumps(_report(other)))
    result = tasks.summary(tmp_path, results=tmp_path / "summary.json")
    cell = result["cells"]["math64"]
    assert set(cell["spaces"]) == {"head", "last-block"} and "count256" not in result["cells"]
    assert cell["rank_agreement"]["head vs last-block"] == pytest.approx(rho)
    assert len(ESTIMATORS) == 7 and set(cell["variance_tool"]["rows"]) == set(ESTIMATORS)  # the pre-screen's math 64
    assert json.loads((tmp_path / "summary.json").read_text()) == result


def test_the_variance_tools_row_is_found_by_options_not_by_name():
    """The default's row is matched to the variance tool's estimator computing the same advantages: the self-inclusive
    one (the variance tool's otb_default) in a file measured under 0.2.0's default, the ESS-shrunk leave-one-out one
    under today's."""
    table = {f"N=4/{v}": {"cos": float(i), "eps_star": float(i)} for i, v in enumerate(
        ["grpo_std", "grpo", "rloo", "ogb", "otb_default", "otb", "otb_others_mean_loo", "otb_others_mean_loo_ess"])}  # fmt: skip
    old = {"meta": {"estimators": {"otb_default": {"estimator": "otb", "options": {
        "tail": "zero_advantage", "leave_one_out": False, "shrinkage": "none", "eps": 1e-8}}}}}  # fmt: skip
    assert tasks.variance_rows(old, table)["otb_default"]["cos"] == 4.0
    now = _report([0.1] * 7)
    rows = tasks.variance_rows(now, table)
    assert rows["otb_default"]["cos"] == 7.0 and rows["otb_self_inclusive"]["cos"] == 4.0
