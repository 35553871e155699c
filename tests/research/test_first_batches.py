"""research/harness/first_batches.py: the qualification rule on hand-made rewards and on the mechanism study's committed
first batches; the summary (shares, Wilson intervals, the draws) on hand-made records; every arm's options named; the
quick mode end to end (slow), which resumes. No timing is asserted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from research.harness import first_batches as fb
from research.harness.training_study.preregistration4 import FIRST_BATCHES
from research.records import read

ROOT = Path(__file__).resolve().parents[2]


def test_a_batch_qualifies_when_no_completion_stops_at_n_and_one_errs():
    assert fb.qualifies([0.5, 0.5, 0.5, 0.28, 0.5, 0.5, 0.5, 0.5]) == (
        True,
        "no completion stops at n and 1 of 8 err",
    )
    ok, why = fb.qualifies([0.5, 0.5, 1.0, 0.1])  # a stop at n, although one errs
    assert (ok, why) == (False, "1 of 4 completions stop at n")
    ok, why = fb.qualifies([0.5] * 4)  # every list counts on past n: no error
    assert (ok, why) == (False, "no completion errs: all 4 reach n and go on")
    assert fb.qualifies([0.49, 0.5])[0] and not fb.qualifies([0.5, 0.5])[0]  # below 0.5 is an error
    assert fb.qualifies([0.3] * 8)[0]  # every completion errs


def test_the_rule_on_the_mechanism_studys_first_batches():
    """The mechanism study's seeds 100 and 202 are its two batches where no completion stopped at n (its follow-up
    says so); both have errors, so they are the two that qualify."""
    rewards = {}
    for record in read(ROOT / "research" / "first_step" / "records.jsonl.gz").values():
        if "rewards" in record:
            rewards.setdefault(record["seed"], record["rewards"])
    assert sorted(rewards) == [100, 200, 201, 202, 203, 204, 205]
    assert [s for s, r in sorted(rewards.items()) if fb.qualifies(r)[0]] == [100, 202]


def test_every_arm_names_its_options():
    for arm, options in FIRST_BATCHES["arms"].items():
        named = fb.arm_overrides(arm)
        assert "learning_rate" not in named and "num_generations" not in named  # the design passes both
        assert {k: v for k, v in options.items() if k not in ("learning_rate", "num_generations")}.items() <= (
            named.items()
        )
        if options["advantage_estimator"] == "otb":
            assert set(fb.OTB_OPTIONS) | {"otb_tail", "otb_leave_one_out", "scale_rewards"} <= set(named)
    assert fb.arm_overrides("otb_loo_ess")["otb_shrinkage"] == "ess"
    assert fb.arm_overrides("otb_loo_mean")["otb_shrinkage"] == "none"
    job = fb.arm_job({"task": {"train_targets": [40]}}, "otb_loo_mean", 301, [40, 52], quick=False)
    assert job["learning_rate"] == 3e-6 and job["task"]["held_out_targets"] == [40, 52]
    assert job["config_arm"] == "otb_default" and fb.arm_job(job, "grpo_N4", 301, [40], False)["learning_rate"] == 1e-5


def _record(seed: int, qualified: bool, at: dict | None = None) -> dict:
    record = {"seed": seed, "qualified": qualified, "reason": "qualifies" if qualified else "1 of 8 stop at n"}
    if qualified:
        record["arms"] = {
            arm: {
                "change": {"early": 0.0, "at": at[arm], "past": 1.0},
                "grad_norm": 0.1,
                "weights_moved": 1.0,
                "config": {"arm": arm},
            }
            for arm in FIRST_BATCHES["arms"]
        }
    return record


def test_the_summary_shares_wilson_intervals_and_draws():
    arms = list(FIRST_BATCHES["arms"])
    changes = [-1.0, 0.5, -0.25, -2.0]  # per batch: grpo_N4 lowers 3 of 4; the OTB arms as said below
    records = [_record(300, False), _record(305, False)]  # the draws that did not qualify
    for i, c in enumerate(changes):
        at = {arm: c for arm in arms} | {"otb_default": -1.0, "otb_loo_mean": 0.0 if i else 1.0}
        records.append(_record(301 + i, True, at))
    records.append(_record(310, True, {arm: -5.0 for arm in arms}))  # past the 4 wanted: left out
    got = fb.summarize(records, batches=4)
    assert got["seeds"] == [301, 302, 303, 304] and got["complete"]
    assert got["draws"] == {
        "drawn": 5,
        "qualified": 4,
        "first_seed": 300,
        "last_seed": 304,
        "why_not": {"300": "1 of 8 stop at n"},
        "undrawn": [],
    }
    grpo = got["arms"]["grpo_N4"]
    assert (grpo["batches"], grpo["lowered"], grpo["share_lowered"]) == (4, 3, 0.75)
    assert grpo["wilson95"] == pytest.approx([0.3006, 0.9544], abs=1e-4)
    assert grpo["mean_change"] == {"early": 0.0, "at": pytest.approx(-2.75 / 4), "past": 1.0}
    assert grpo["change_at_n_per_batch"] == changes
    assert got["arms"]["otb_default"]["share_lowered"] == 1.0
    assert got["arms"]["otb_default"]["wilson95"] == pytest.approx([0.5101, 1.0], abs=1e-4)
    flat = got["arms"]["otb_loo_mean"]  # a change of exactly 0 does not lower
    assert flat["lowered"] == 0 and flat["wilson95"] == pytest.approx([0.0, 0.4899], abs=1e-4)
    assert all(a["all_moved"] and a["config"] == {"arm": name} for name, a in got["arms"].items())

    # Two workers: seed 303 not drawn yet, so 310 would stand in for it; the summary says so and is not complete.
    gap = fb.summarize([r for r in records if r["seed"] != 303], batches=4)
    assert gap["seeds"] == [301, 302, 304, 310] and gap["draws"]["undrawn"] == [303, 306, 307, 308, 309]
    assert not gap["complete"]

    short = fb.summarize(records[:3], batches=4)  # one qualifying batch so far
    assert short["batches"] == 1 and not short["complete"] and short["draws"]["drawn"] == 3
    empty = fb.summarize([_record(300, False)], batches=4)
    assert empty["arms"]["grpo_N4"]["share_lowered"] is None and empty["arms"]["grpo_N4"]["wilson95"] == [0.0, 1.0]


@pytest.mark.slow
def test_quick_mode_draws_runs_every_arm_on_the_drawn_batch_and_resumes(tmp_path):
    command = [sys.executable, "-m", "research.harness.first_batches", "--quick", "--out", str(tmp_path)]
    first = subprocess.run(command, check=True, cwd=ROOT, capture_output=True, text=True)
    assert "2 seeds drawn" in first.stdout
    records = {p.stem: json.loads(p.read_text()) for p in (tmp_path / fb.QUICK_FOLDER).glob("*.json")}
    assert sorted(records) == ["s3", "s4"]
    batch = records["s3"]
    assert batch["qualified"] and len(batch["rewards"]) == 8 and len(set(batch["rewards"])) > 1
    assert batch["targets"] == fb.QUICK["train_targets"] and set(batch["arms"]) == set(FIRST_BATCHES["arms"])
    for arm, run in batch["arms"].items():
        assert run["weights_moved"] > 0, f"{arm}: the step moved no parameter"
        assert run["rewards"] == batch["rewards"]  # the drawn batch, replayed (its completions are checked too)
        expected = fb.arm_overrides(arm) | {"learning_rate": fb.QUICK["learning_rate"], "num_generations": 4}
        assert {k: run["config"][k] for k in expected} == expected, f"{arm}: not its options"
        assert set(run["change"]) == {"early", "at", "past"}
    summary = json.loads((tmp_path / fb.QUICK_SUMMARY).read_text())
    assert summary["seeds"] == [3, 4] and summary["complete"] and summary["meta"]["quick"]
    assert summary["preregistration"] == json.loads(json.dumps(FIRST_BATCHES))
    assert summary["meta"]["command"].startswith("python -m research.harness.first_batches --quick")
    assert summary["arms"]["grpo_N4"]["change_at_n_per_batch"][0] == batch["arms"]["grpo_N4"]["change"]["at"]
    again = subprocess.run(command, check=True, cwd=ROOT, capture_output=True, text=True)
    assert "0 seeds drawn" in again.stdout
    assert json.loads((tmp_path / fb.QUICK_SUMMARY).read_text())["arms"] == summary["arms"]
