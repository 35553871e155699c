"""benchmarks/gradient_check_tasks.py's summary: each space's rows, the variance tool's for the same cell, and the
Spearman agreement of the spaces' eps_star rankings."""

from __future__ import annotations

import json

import pytest

from benchmarks import gradient_check_tasks as tasks


def _report(eps: list[float]) -> dict:
    rows = {e: {"cos": 1.0, "cos_ci": [0.9, 1.1], "eps_star": x, "eps_star_ci": [x - 0.1, x + 0.1]}
            for e, x in zip(tasks.ESTIMATORS, eps)}  # fmt: skip
    meta = {"prompts": 4, "informative_prompts": 4, "pool_size": 8, "seconds": 1.0}
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
    assert set(cell["variance_tool"]["rows"]) == set(tasks.ESTIMATORS)  # the committed pre-screen run of math 64
    assert json.loads((tmp_path / "summary.json").read_text()) == result
