"""Every committed study summary is rebuilt from its compacted run records by its study's own code, and equals the
committed file in every value (research/rebuild.py); a planted change to one committed number is caught."""

from __future__ import annotations

import copy
import gzip
import json

import pytest

from research import records
from research.rebuild import ROOT, SUMMARIES, differences, rebuild_all


@pytest.fixture(scope="module")
def rebuilt(tmp_path_factory):
    return rebuild_all(tmp_path_factory.mktemp("rebuild"))


def test_every_study_summary_with_run_records_is_rebuilt():
    """Each study folder with records has its summaries in SUMMARIES (a new study cannot be left out)."""
    with_records = {p.parent.name for p in (ROOT / "research").glob("*/records.jsonl.gz")}
    assert with_records, "no compacted run records found under research/"
    assert with_records <= {s.folder for s in SUMMARIES}


@pytest.mark.parametrize("summary", SUMMARIES, ids=lambda s: s.stem)
def test_committed_summary_equals_its_rebuild(rebuilt, summary):
    committed = json.loads(summary.committed.read_text())
    assert differences(rebuilt[summary.stem], committed) == []


def test_a_planted_change_to_one_committed_number_is_caught(rebuilt):
    summary = next(s for s in SUMMARIES if s.stem == "training_study2")
    committed = json.loads(summary.committed.read_text())
    assert differences(rebuilt[summary.stem], committed) == []  # the precondition: equal before the change
    planted = copy.deepcopy(committed)
    auc = planted["cells"]["long"]["paired"]["otb_zero_advantage-grpo_N4"]["auc"]
    auc["mean"] += 1e-12
    found = differences(rebuilt[summary.stem], planted)
    assert found == [
        f"cells.long.paired.otb_zero_advantage-grpo_N4.auc.mean: rebuilt {auc['mean'] - 1e-12!r}, "
        f"committed {auc['mean']!r}"
    ]


def test_differences_sees_keys_lengths_and_types_but_not_the_command_line():
    assert differences({"meta": {"command": "a"}}, {"meta": {"command": "b"}}) == []
    assert differences({"a": 1}, {"a": 1, "b": 2}) == ["b: only in the committed summary"]
    assert differences({"a": [1, 2]}, {"a": [1]}) == ["a: 2 items rebuilt, 1 committed"]
    assert differences({"a": 1}, {"a": 1.0}) == ["a: rebuilt 1, committed 1.0"]
    assert differences({"a": True}, {"a": 1}) == ["a: rebuilt True, committed 1"]


def test_records_round_trip_and_refuse_paths_that_leave_the_folder(tmp_path):
    runs = tmp_path / "results" / "study" / "cell"
    runs.mkdir(parents=True)
    (runs / "arm-s0.json").write_text(json.dumps({"auc": 0.5, "curve": [0.1, 0.2]}))
    out = tmp_path / "records.jsonl.gz"
    assert records.compact(tmp_path / "results", "study", out) == 1
    first = out.read_bytes()
    records.compact(tmp_path / "results", "study", out)
    assert out.read_bytes() == first  # the same records, the same bytes
    written = records.expand(out, tmp_path / "again")
    assert [p.relative_to(tmp_path / "again").as_posix() for p in written] == ["study/cell/arm-s0.json"]
    assert json.loads(written[0].read_text()) == {"auc": 0.5, "curve": [0.1, 0.2]}
    other = tmp_path / "results" / "batches"
    other.mkdir()
    (other / "s1.json").write_text(json.dumps({"seed": 1}))
    both = tmp_path / "both.jsonl.gz"
    assert records.compact(tmp_path / "results", ["study", "batches"], both) == 2  # one file for a study's two parts
    assert set(records.read(both)) == {"study/cell/arm-s0.json", "batches/s1.json"}
    with pytest.raises(FileNotFoundError, match="nothing"):
        records.compact(tmp_path / "results", ["study", "nothing"], both)
    bad = tmp_path / "bad.jsonl.gz"
    with gzip.open(bad, "wt") as f:
        f.write(json.dumps({"path": "../escape.json", "record": {}}) + "\n")
    with pytest.raises(ValueError, match="leaves the destination folder"):
        records.expand(bad, tmp_path / "x")
