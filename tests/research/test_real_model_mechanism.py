"""research/harness/real_model_mechanism.py: the quick mode trains its four arms one step on one batch, resumes and renders
its report block; the ablation removes the advantages past n; the token classes, the allocation, the stop windows and
the pre-registered predictions on hand-made inputs. No timing is asserted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from research.harness import real_model_mechanism as mech
from research.report.tables import Context
from research.report.training import real_model_mechanism

ROOT = Path(__file__).resolve().parents[2]


def test_quick_mode_trains_every_arm_one_step_on_one_batch_and_resumes(tmp_path):
    command = [sys.executable, "-m", "research.harness.real_model_mechanism", "--quick", "--out", str(tmp_path)]
    first = subprocess.run(command, check=True, cwd=ROOT, capture_output=True, text=True)
    assert "9 runs to do" in first.stdout  # the study's four arms, the follow-up's three and the second's two
    runs = {p.stem: json.loads(p.read_text()) for p in (tmp_path / mech.QUICK_FOLDER).glob("*.json")}
    arms = [*mech.ARMS, *mech.FOLLOW_UP_ARMS, *mech.SECOND_FOLLOW_UP_ARMS]
    assert sorted(runs) == sorted(f"{arm}-s{mech.QUICK['seeds'][0]}" for arm in arms)
    assert runs["otb_loo-s2"]["overrides"] == {"otb_leave_one_out": True}
    assert runs["ogb-s2"]["overrides"] == {"advantage_estimator": "ogb"}
    assert (
        runs["otb_sgd-s2"]["overrides"] == {"optim": "sgd"} and runs["otb_uniform-s2"]["config_arm"] == "otb_default"
    )
    grpo, ablated = runs["grpo_N4-s2"], runs["grpo_no_past_n-s2"]
    assert len(set(grpo["rewards"])) > 1, "precondition failed: the batch's rewards tie, so no arm has a gradient"
    for name, run in runs.items():
        assert run["weights_moved"] > 0, f"{name}: the step moved no parameter"
        assert run["completion_ids"] == grpo["completion_ids"], f"{name}: another batch"
    assert grpo["allocation"]["share_past"] > 0 and grpo["allocation"]["tokens"]["past"] > 0
    assert ablated["allocation"]["share_past"] == 0.0, "the ablation left advantages past n"
    assert ablated["change"] != grpo["change"], "the ablation changed nothing the step did"
    summary = json.loads((tmp_path / mech.QUICK_SUMMARY).read_text())
    assert summary["seeds"] == [2] and set(summary["predictions"]) == {"P1", "P2", "P3", "reading"}
    assert summary["preregistration"] == json.loads(json.dumps(mech.PREREGISTRATION))
    assert summary["arms"]["grpo_N4"]["weights_moved_median"] > 0 and set(summary["before"]) == {"early", "at", "past"}
    block = real_model_mechanism(Context(results=tmp_path), mech.QUICK_SUMMARY.removesuffix(".json"))
    assert all(f"| {arm} | 1 |" in block for arm in mech.ARMS) and "Reading: " in block
    again = subprocess.run(command, check=True, cwd=ROOT, capture_output=True, text=True)
    assert "0 runs to do" in again.stdout


CHARS = {i: c for i, c in enumerate(" 0123456789,X")}  # a token per character; 12 (X) is the stop token


def _ids(text: str) -> list[int]:
    inverse = {c: i for i, c in CHARS.items()}
    return [inverse[c] for c in text]


def _decode(ids):
    return "".join(CHARS[i] for i in ids if i != 12)


def test_past_n_starts_at_the_token_that_completes_n():
    assert mech.past_n_start(_ids(" 4, 5, 6"), 6, _decode) == 7  # COUNT_PREFIX holds 1, 2, 3
    assert mech.past_n_start(_ids(" 4, 5, 6, 7, 8"), 6, _decode) == 7
    assert mech.past_n_start(_ids(" 4, 5"), 6, _decode) is None  # stopped early
    assert mech.past_n_start(_ids(" 4, 5, 7, 8"), 6, _decode) is None  # an error before n
    assert mech.past_n_start(_ids(" 4, 5, 6, 7, 8, 9, 10, 11, 12"), 12, _decode) == 28  # "12" ends at its "2"


def test_token_classes_and_the_allocation_by_hand():
    rows = [" 4, 5, 6X", " 4, 5, 6, 7", " 4, 5X"]
    ids = [_ids(r) for r in rows]
    T = max(map(len, ids))
    batch = {
        "completion_ids": torch.tensor([r + [0] * (T - len(r)) for r in ids]),
        "completion_mask": torch.tensor([[1] * len(r) + [0] * (T - len(r)) for r in ids]),
    }
    classes, rewards = mech.token_classes(batch, [6, 6, 6], [12], _decode)
    assert rewards == pytest.approx([1.0, 0.5, 5 / 12])  # stopped at n; counted on past n; stopped early at 5 of 6
    assert classes["stop"].nonzero().tolist() == [[0, 8], [2, 5]]
    assert classes["past"].nonzero().tolist() == [[1, 8], [1, 9], [1, 10]]  # ", 7" after the "6" of row 1
    valid = batch["completion_mask"].bool()
    assert torch.equal(classes["stop"] | classes["past"] | classes["rest"], valid)
    assert not (classes["stop"] & classes["past"]).any()

    advantages = torch.zeros(3, T)
    advantages[0, 8] = 0.5  # the stop at n
    advantages[2, 5] = -0.25  # the early stop
    advantages[1, 8:11] = -0.25  # counting on past n
    advantages[1, 0] = 1.0  # a token before n
    got = mech.advantage_allocation(advantages, classes, rewards)
    total = 0.5 + 0.25 + 0.75 + 1.0
    assert got["abs_sum"] == pytest.approx(total)
    assert got["share_stop"] == pytest.approx(0.75 / total)
    assert got["share_past"] == pytest.approx(0.75 / total)
    assert got["share_rest"] == pytest.approx(1.0 / total)
    assert got["stop_at_n_sum"] == pytest.approx(0.5) and got["stop_elsewhere_sum"] == pytest.approx(-0.25)
    assert got["past_mean"] == pytest.approx(-0.25)


def test_windows_average_each_target_before_the_targets():
    log_odds = {"10": {"8": 0.0, "9": 2.0, "10": 3.0, "11": 4.0}, "20": {"19": 6.0, "20": 1.0, "21": 2.0, "22": 4.0}}
    assert mech.windows(log_odds) == {"early": 3.5, "at": 2.0, "past": 3.5}


def _arms(at: dict, share: dict) -> dict:
    return {a: {"change": {"at": at[a]}, "share_past": share[a]} for a in mech.ARMS}


def test_the_predictions_and_their_reading():
    share = {"otb_default": 0.01, "otb_ref": 0.02, "grpo_N4": 0.5, "grpo_no_past_n": 0.0}
    at = {"otb_default": -1.0, "otb_ref": -0.5, "grpo_N4": 2.0, "grpo_no_past_n": 0.3}
    assert mech.predictions(_arms(at, share)) == {"P1": True, "P2": True, "P3": True, "reading": "H supported"}
    got = mech.predictions(_arms({**at, "grpo_no_past_n": 1.5}, share))
    assert (got["P3"], got["reading"].startswith("H rejected")) == (False, True)
    got = mech.predictions(_arms({**at, "grpo_N4": -0.1}, share))
    assert got["P1"] is False and "later steps" in got["reading"]
    got = mech.predictions(_arms(at, {**share, "otb_ref": 0.2}))
    assert got["P2"] is False and got["reading"].startswith("not decided")


def _run(arm: str, seed: int, change: dict, ids=((1, 2),)) -> dict:
    allocation = {"share_past": 0.1, "share_stop": 0.01}
    run = dict(arm=arm, seed=seed, change=change, allocation=allocation, grad_norm=0.5, rewards=[0.5, 0.25])
    before = {"40": {"39": -5.0, "40": -1.5, "41": -5.0}}
    return run | {"completion_ids": [list(r) for r in ids], "weights_moved": 1.0, "before": before}


def test_the_amendment_reads_seed_100_apart_with_the_pilots_first_step_beside_it(tmp_path):
    """seed 100's runs are the amendment's (P4, P5), not part of the design's seeds; the pilot's logged step 1 is
    shown beside each arm; a batch that differs between arms is refused."""
    pilot = tmp_path / mech.PILOT_RUNS
    pilot.mkdir(parents=True)
    for arm in ("otb_default", "otb_ref", "grpo_N4"):
        (pilot / f"{arm}-s100.json").write_text(json.dumps({"steps": [{"grad_norm": 0.02, "reward": 0.472}]}))
    down = {"early": -1.0, "at": -0.5, "past": -1.0}
    runs = [_run(a, 100, down if a.startswith("otb") else {"early": 0.2, "at": 0.3, "past": 0.1}) for a in mech.ARMS]
    assert mech.summarize(runs)["seeds"] == []  # seed 100 is not one of the design's seeds
    got = mech.pilot_batch(runs, tmp_path)
    assert got["predictions"] == {"P4": True, "P5": True, "reading": "the settling is decided by the first step"}
    assert got["arms"]["grpo_no_past_n"]["pilot_grad_norm"] == 0.02  # the ablation shows grpo_N4's pilot step
    assert got["arms"]["otb_ref"]["reward_mean"] == 0.375
    assert mech.pilot_batch(runs[:3], tmp_path) is None  # not all four arms yet
    runs[0]["completion_ids"] = [[9]]
    with pytest.raises(AssertionError, match="other batches"):
        mech.pilot_batch(runs, tmp_path)


def test_the_follow_up_reads_its_two_seeds_with_the_studys_adam_arms(tmp_path):
    """F1 (energy weighting) and F2 (Adam's sign step) on the follow-up's seeds, with the study's otb_default and
    grpo_N4 runs of those seeds as the Adam arms; None until every arm ran on both seeds."""
    at = {"otb_default": -2.0, "otb_ref": -2.0, "grpo_N4": 0.5, "grpo_no_past_n": 0.3}
    at |= {"otb_uniform": 0.0, "otb_sgd": 0.1, "grpo_sgd": 0.2}
    runs = [_run(a, s, {"early": 0.0, "at": x, "past": 0.0}) for s in (100, 202) for a, x in at.items()]
    got = mech.follow_up(runs)
    assert got["seeds"] == [100, 202] and got["F1"] is True and got["F2"] is True
    assert got["change_at_n"]["otb_uniform"] == [0.0, 0.0]
    (tmp_path / "follow.json").write_text(json.dumps(mech.summarize(runs, [202]) | {"follow_up": got}))
    block = real_model_mechanism(Context(results=tmp_path), "follow")
    assert "| otb_uniform | +0.00 | +0.00 | 1 | 1 |" in block and "F1: held. F2: held." in block
    runs = [r | {"change": {"at": -1.9}} if r["arm"] == "otb_uniform" else r for r in runs]  # less than half-way
    assert mech.follow_up(runs)["F1"] is False
    runs = [r | {"change": {"at": -0.5}} if r["arm"] == "otb_sgd" else r for r in runs]  # below 0 and below GRPO's
    assert mech.follow_up(runs)["F2"] is False
    assert mech.follow_up([r for r in runs if r["seed"] == 100]) is None
    assert mech.summarize(runs, [202])["seeds"] == [202]  # the follow-up's arms leave the study's analysis alone


def test_the_second_follow_up_reads_leave_one_out_and_ogb_against_the_studys_arms(tmp_path):
    """G1 (leave-one-out avoids the effect: half-way from otb_default to grpo_N4 on both seeds) and G2 (OGB keeps it:
    below grpo_N4 by at least half of otb_default's distance on both), None until every arm ran on both seeds."""
    at = {"otb_default": -2.0, "otb_ref": -2.0, "grpo_N4": 0.5, "grpo_no_past_n": 0.3}
    at |= {"otb_loo": -0.7, "ogb": -0.8}  # -0.7 is more than half-way up from -2.0 to 0.5; -0.8 is not
    runs = [_run(a, s, {"early": 0.0, "at": x, "past": 0.0}) for s in (100, 202) for a, x in at.items()]
    got = mech.second_follow_up(runs)
    assert got["seeds"] == [100, 202] and got["G1"] is True and got["G2"] is True
    assert got["change_at_n"]["otb_loo"] == [-0.7, -0.7] and mech.follow_up(runs) is None  # not the first's arms
    (tmp_path / "second.json").write_text(json.dumps(mech.summarize(runs, [202]) | {"second_follow_up": got}))
    block = real_model_mechanism(Context(results=tmp_path), "second")
    assert "| otb_loo | -0.70 | -0.70 | 1 | 1 |" in block and "G1: held. G2: held." in block
    assert "arm (follow-up)" not in block  # the first follow-up did not run
    runs = [r | {"change": {"at": -0.76}} if r["arm"] == "otb_loo" and r["seed"] == 202 else r for r in runs]
    assert mech.second_follow_up(runs)["G1"] is False  # one seed short of half-way
    runs = [r | {"change": {"at": -0.74}} if r["arm"] == "ogb" else r for r in runs]
    assert mech.second_follow_up(runs)["G2"] is False  # above the half-way mark on both
    assert mech.second_follow_up([r for r in runs if r["arm"] != "ogb"]) is None
