"""research/harness/real_model_study.py: its quick mode trains every arm and resumes, --measure-steps feeds the
plan, the analysis follows the pre-registration on synthetic runs, the pre-registration's cost is the plan's
arithmetic on the committed measurement, its precondition is the committed variance result, and the in-training
fidelity check leaves a run unchanged. No timing is asserted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from research.harness import real_model_analysis as analysis
from research.harness import real_model_study as study
from research.harness import real_model_task as task
from research.harness.real_model_preregistration import AMENDMENT_REACH

ROOT = Path(__file__).resolve().parents[2]


def committed(name: str) -> Path:
    """A committed result file, in the research folder of its study."""
    from research.report.tables import Context

    return Context().path(Path(name).stem)


PRE = study.PREREGISTRATION
REACH = study.DESIGNS["reach"]


def _run(*args: str, out: Path) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "research.harness.real_model_study", *args, "--out", str(out), "--jobs", "1"]
    return subprocess.run(command, check=True, cwd=ROOT, capture_output=True, text=True)


def test_quick_mode_trains_every_arm_records_its_configuration_and_resumes(tmp_path):
    first = _run("--quick", "--cache", str(tmp_path / "cache"), out=tmp_path)
    assert "3 runs to do" in first.stdout
    runs = {p.stem: json.loads(p.read_text()) for p in (tmp_path / study.FOLDER / "quick").glob("*.json")}
    assert sorted(runs) == sorted(f"{arm}-s0" for arm in PRE["arms"])
    for name, run in runs.items():
        assert run["weights_moved"] > 0, f"{name}: no parameter moved, so the run trained nothing"
        assert len(run["steps"]) == 2 and len(run["curve"]) == 2 and run["tokens"] > 0
        assert all(s["cpu_seconds"] > 0 for s in run["steps"])
        assert run["config"]["num_generations"] == 4 and run["otb_defaults"] == study.otb_defaults()
    assert {k: runs["otb_ref-s0"]["config"][k] for k in study.REFERENCE} == study.REFERENCE
    assert {k: runs["otb_default-s0"]["config"][k] for k in study.REFERENCE} == study.otb_defaults()
    assert runs["grpo_N4-s0"]["config"]["scale_rewards"] == "group"
    # every arm of a seed starts from the same evaluation (cached once)
    assert len({json.dumps(r["curve"][0]) for r in runs.values()}) == 1
    summary = json.loads((tmp_path / f"{study.FOLDER}_quick.json").read_text())
    assert summary["meta"]["command"].startswith("python -m research.harness.real_model_study --quick")
    assert set(summary["cells"]["quick"]["arms"]) == set(PRE["arms"])
    assert set(summary["cells"]["quick"]["paired"]) == {f"{a}-{b}" for a, b in analysis.PAIRS}
    assert summary["checks"]["runs_that_moved_no_weight"] == []
    assert (tmp_path / f"{study.FOLDER}_quick.png").stat().st_size > 0
    again = _run("--quick", "--cache", str(tmp_path / "cache"), out=tmp_path)
    assert "0 runs to do" in again.stdout  # every finished run is kept, none is run twice


def test_quick_measure_steps_feeds_the_plan(tmp_path):
    _run("--quick", "--measure-steps", out=tmp_path)
    data = json.loads((tmp_path / study.STEPS_FILE).read_text())
    assert data["meta"]["command"].startswith("python -m research.harness.real_model_study --quick --measure-steps")
    assert [len(r["steps"]) for r in data["runs"]] == [study.MEASURE["steps"]] * len(PRE["arms"])
    costs = data["costs"]
    assert set(costs["step_cpu_seconds"]) == set(PRE["arms"]) and costs["fidelity_wall_seconds_per_token"] > 0
    fidelity = [s for r in data["runs"] for s in r["steps"] if "otb/fidelity/seconds_per_token" in s]
    assert [s["step"] for s in fidelity] == [1]  # one check, in otb_default's first step only
    plan = json.loads(_run("--plan", out=tmp_path).stdout)
    assert plan == analysis.cost_plan(costs, REACH, jobs=1)  # --design reach is the default


def test_the_fidelity_check_leaves_the_run_unchanged(tmp_path):
    """The pre-registration runs the fidelity check inside a study run: it must change nothing of that run."""
    args = study.parse_args(["--quick"])
    args.workdir, args.cache = str(tmp_path), tmp_path / "cache"
    plain = study.run_one(study.make_job(args, "quick", "otb_default", 0, 1e-3))
    checked = study.run_one(
        study.make_job(args, "quick", "otb_default", 0, 1e-3, fidelity={"check_steps": 1, "rows": 1})
    )
    assert plain["weights_moved"] > 0
    assert sum("otb/fidelity/seconds_per_token" in s for s in checked["steps"]) == 2

    def scores(run):
        return [(p["step"], p["tokens"], p["score"], p["se"]) for p in run["curve"]]

    assert scores(checked) == scores(plain) and checked["weights_moved"] == plain["weights_moved"]
    keys = ("loss", "grad_norm", "reward", "completions/mean_length")
    assert [[s[k] for k in keys] for s in checked["steps"]] == [[s[k] for k in keys] for s in plain["steps"]]


# --- the analysis on synthetic runs -------------------------------------------------------------------------------


def _synthetic(arm: str, seed: int, scores, lengths=(200.0, 210.0), moved=1.0) -> dict:
    budget = 1000
    curve = [{"tokens": budget * i // (len(scores) - 1), "score": s, "se": 0.01} for i, s in enumerate(scores)]
    steps = [{"step": i + 1, "loss": 0.1, "grad_norm": 2.0, "completions/mean_length": x, "cpu_seconds": 3.0}
             for i, x in enumerate(lengths)]  # fmt: skip
    config = {"otb_tail": "zero_advantage", "otb_leave_one_out": False, "scale_rewards": "none"}
    return {"arm": arm, "seed": seed, "learning_rate": 1e-5, "curve": curve, "steps": steps, "tokens": budget,
            "cpu_seconds": 6.0, "weights_moved": moved, "config": config}  # fmt: skip


def test_analysis_pairs_the_seeds_and_gives_an_interval_from_six_seeds():
    def runs(seeds):
        out = []
        for s in seeds:
            base = 0.20 + 0.01 * s
            out += [
                _synthetic("grpo_N4", s, [base, base + 0.02, base + 0.04]),
                _synthetic("otb_ref", s, [base, base + 0.02, base + 0.04]),
                _synthetic("otb_default", s, [base, base + 0.03 + 0.001 * s, base + 0.05]),
            ]
        return out

    six = analysis.summarise_cell(runs(range(6)), list(PRE["arms"]), 1000, 0.25)
    auc = six["paired"]["otb_default-grpo_N4"]["auc"]
    # the middle evaluation is 0.01 + 0.001 s higher and the last 0.01: trapezoids give (0.01+0.001s)/2 + 0.01/4
    assert auc["mean"] == pytest.approx(sum((0.01 + 0.001 * s) / 2 + 0.01 / 4 for s in range(6)) / 6)
    assert auc["differ"] and auc["ci"][0] > 0 and auc["seeds"] == 6
    assert six["paired"]["otb_ref-grpo_N4"]["final"]["mean"] == pytest.approx(0.0)
    assert six["arms"]["otb_default"]["runs"] == 6 and six["arms"]["grpo_N4"]["collapsed"] == 0
    # each seed's own numbers: the paired differences are theirs
    assert list(six["seeds"]) == [str(s) for s in range(6)] and set(six["seeds"]["3"]) == set(PRE["arms"])
    diffs = [v["otb_default"]["auc"] - v["grpo_N4"]["auc"] for v in six["seeds"].values()]
    assert sum(diffs) / 6 == pytest.approx(auc["mean"]) and not six["seeds"]["0"]["grpo_N4"]["collapsed"]
    five = analysis.summarise_cell(runs(range(5)), list(PRE["arms"]), 1000, 0.25)
    assert "ci" not in five["paired"]["otb_default-grpo_N4"]["auc"]  # fewer than 6 paired seeds: the mean only


def test_analysis_collapse_target_and_checks():
    healthy = _synthetic("grpo_N4", 0, [0.2, 0.25, 0.3])
    assert not analysis.run_metrics(healthy, 1000, 0.25)["collapsed"]
    assert analysis.run_metrics(healthy, 1000, 0.25)["tokens_to_target"] == pytest.approx(500)
    censored = analysis.run_metrics(healthy, 1000, 0.5)
    assert censored["tokens_to_target"] == 1000 and not censored["reached"]
    assert analysis.run_metrics(_synthetic("grpo_N4", 0, [0.2, 0.15, 0.09]), 1000, 0.25)["collapsed"]  # < half
    shorter = _synthetic("grpo_N4", 0, [0.2, 0.25, 0.3], lengths=(200.0, 90.0))
    assert analysis.run_metrics(shorter, 1000, 0.25)["collapsed"]  # the completions halved: a length collapse
    # the reach design: a floor in tokens instead (its right answers are shorter than its first steps' overlong ones)
    learnt = _synthetic("grpo_N4", 0, [0.5, 0.7, 0.9], lengths=(256.0, 126.0))
    assert analysis.run_metrics(learnt, 1000, 0.6)["collapsed"]  # the first design's rule calls it a collapse
    assert not analysis.run_metrics(learnt, 1000, 0.6, REACH["collapse_min_last_length"])["collapsed"]
    stopped = _synthetic("grpo_N4", 0, [0.5, 0.7, 0.9], lengths=(256.0, 60.0))
    assert analysis.run_metrics(stopped, 1000, 0.6, REACH["collapse_min_last_length"])["collapsed"]
    nan = _synthetic("grpo_N4", 0, [0.2, 0.25, 0.3])
    nan["steps"][0]["grad_norm"] = float("nan")
    assert analysis.run_metrics(nan, 1000, 0.25)["collapsed"]
    runs = [_synthetic("otb_default", 0, [0.2, 0.3, 0.3]), _synthetic("grpo_N4", 0, [0.2, 0.3, 0.3], moved=0.0)]
    checks = analysis.checks(runs, study.REFERENCE)
    assert checks["runs_that_moved_no_weight"] == ["grpo_N4-s0"] and not checks["default_is_reference"]
    assert analysis.failed_checks(checks) == ["grpo_N4-s0: no parameter moved"]  # the lengths (200) pass
    runs[0]["config"] = dict(study.REFERENCE)
    assert analysis.checks(runs, study.REFERENCE)["default_is_reference"]
    runs[1]["weights_moved"] = 1.0
    assert len(analysis.failed_checks(analysis.checks(runs, study.REFERENCE))) == 1
    # a pilot runs the default at several rates: one configuration; a changed setting besides the rate is two
    pilot = [_synthetic("otb_default", 100, [0.2, 0.3, 0.3]) for _ in range(3)]
    base = dict(pilot[0]["config"])
    for run, lr in zip(pilot, (1e-6, 3e-6, 1e-5)):
        run["config"] = dict(base, learning_rate=lr)
    assert analysis.checks(pilot, study.REFERENCE)["default_configurations"] == 1
    assert analysis.failed_checks(analysis.checks(pilot, study.REFERENCE)) == []
    pilot[2]["config"]["otb_tail"] = "others_mean"
    assert analysis.checks(pilot, study.REFERENCE)["default_configurations"] == 2
    assert analysis.failed_checks(analysis.checks(pilot, study.REFERENCE))


def test_pilot_rule_takes_the_highest_auc_and_the_lower_rate_on_a_tie():
    cells = {
        "a": {"arms": {"grpo_N4": {"auc_mean": 0.2}, "otb_ref": {"auc_mean": 0.3}}},
        "b": {"arms": {"grpo_N4": {"auc_mean": 0.25}, "otb_ref": {"auc_mean": 0.3}}},
        "c": {"arms": {"grpo_N4": {"auc_mean": 0.1}}},
    }
    chosen = analysis.choose_rates(cells, ["grpo_N4", "otb_ref", "otb_default"], {1e-6: "a", 3e-6: "b", 1e-5: "c"})
    assert chosen == {"grpo_N4": 3e-6, "otb_ref": 1e-6}


def test_the_default_arm_names_its_options_and_ignores_a_change_of_otbconfigs_defaults(monkeypatch):
    """The chosen-default arm runs with the options every committed run recorded, not OTBConfig()'s live defaults."""
    from research import records
    from research.rebuild import ROOT

    runs = records.read(ROOT / "research" / "real_model" / "records.jsonl.gz")
    default_runs = [r for path, r in runs.items() if r.get("arm") == "otb_default" and "/reach_main/" in f"/{path}"]
    assert len(default_runs) == 8  # the precondition: the study's eight runs of the arm
    assert all({k: r["config"][k] for k in study.OTB_DEFAULT_ARM} == study.OTB_DEFAULT_ARM for r in default_runs)
    pre = study.DESIGNS["reach"]
    assert study._arm_options("otb_default", pre) == {"advantage_estimator": "otb", **study.OTB_DEFAULT_ARM}
    assert study._arm_options("otb_ref", pre) == pre["arms"]["otb_ref"]


def test_preregistration_arms_seeds_and_task():
    arms = PRE["arms"]
    assert arms["otb_default"] == {"advantage_estimator": "otb"}  # OTBConfig's defaults, read at run time
    assert arms["otb_ref"] == {"advantage_estimator": "otb", **study.REFERENCE}
    assert arms["grpo_N4"] == {"advantage_estimator": "grpo", "scale_rewards": "group"}
    assert PRE["num_generations"] == 4 and len(PRE["seeds"]) >= 6
    assert PRE["learning_rates"]["pilot_seed"] not in PRE["seeds"] and study.MEASURE["seed"] not in PRE["seeds"]
    assert min(PRE["learning_rates"]["grid"]) <= study.MEASURE["learning_rate"] <= max(PRE["learning_rates"]["grid"])
    t = PRE["task"]
    assert not set(t["train_targets"]) & set(t["held_out_targets"])
    assert PRE["token_budget"] % PRE["eval_every_tokens"] == 0


def test_preregistration_precondition_is_the_committed_variance_cell():
    """The committed variance result is this cell's check: same task, prompts, temperature and horizon; it passes."""
    data = json.loads(committed("variance_count12.json").read_text())
    meta, t = data["meta"], PRE["task"]
    assert meta["task"] == "count" and meta["temperature"] == t["temperature"] and meta["seed"] == 0
    kept = [meta["count_targets"][p["prompt"]] for p in data["results"]["lm_head"]["256"]["prompts_kept"]]
    assert set(kept) <= set(t["train_targets"])
    cell = data["results"]["lm_head"][str(t["max_completion_length"])]
    ratio = cell["paired"]["N=4/otb-grpo"]
    assert ratio["ratio"] < 0.7 and ratio["ratio_ci"][1] < 1 and cell["mean_completion_tokens"] >= 128
    assert (
        f"{ratio['ratio']:.2f}" in PRE["precondition"]
        and f"{cell['mean_completion_tokens']:.1f}" in PRE["precondition"]
    )


def test_preregistration_cost_is_the_plan_on_the_committed_measurement():
    measured = json.loads(committed(study.STEPS_FILE).read_text())
    assert measured["meta"]["command"].startswith("python -m benchmarks.real_model_study --measure-steps")
    assert measured["costs"] == analysis.measured_costs(measured, study.MEASURE["fidelity_rows"])
    assert all(r["weights_moved"] > 0 for r in measured["runs"])  # the measured steps trained
    plan = analysis.cost_plan(measured["costs"], PRE)
    assert PRE["cost"]["plan"] == plan
    assert plan["wall_hours_at_2_jobs"] <= PRE["cost"]["wall_hours_allowed"]


@pytest.mark.slow
def test_the_training_prompt_is_variance_pys_prompt(smollm2_dir):
    """TRL gets the text benchmarks.variance sampled its pools from: the chat template with the prefix continued."""
    from benchmarks.variance.sampling import setup

    targets = PRE["task"]["train_targets"]
    _, tok, prompts, reward = setup(False, len(targets), 0, "count", targets)
    for i, (n, prompt) in enumerate(zip(targets, prompts)):
        assert task.prompt_text(tok, n) == tok.apply_chat_template(
            prompt, tokenize=False, add_generation_prompt=False, continue_final_message=True
        )
        texts = [" 4, 5, 6", " 4, 5, 7, 8", ""]
        assert task.count_task_reward(texts, [n] * 3) == reward(None, texts, i)


def test_group_signal_counts_tied_groups_at_each_horizon(tmp_path):
    """Two prompts' pools of byte-token completions: one whose members all count on correctly (every group ties at
    any horizon), one whose members err at different numbers (alike in their first 2 bytes, all different whole)."""
    import torch

    from research.harness.real_model_task import group_signal

    right = " 4, 5, 6, 7, 8, 9, 10"
    wrong = ["".join(f" {x}," for x in range(4, 5 + k)) + " 99" for k in range(4)]  # counted to 4, 5, 6 or 7
    for i, (n, texts) in enumerate([(10, [right] * 4), (10, wrong)]):
        records = [{"ids": torch.tensor(list(t.encode()))} for t in texts]
        prompt = [{"role": "user", "content": f"List the numbers from 1 to {n}, separated by commas."}]
        torch.save({"records": records, "prompt": prompt}, tmp_path / f"count-M12-h1024-T0.7-k64-s0-p{i:03d}.pt")
    out = group_signal(tmp_path, horizons=(2, 24), draws=5, decode=lambda ids: bytes(ids.tolist()).decode())
    assert out["2"]["tied_share"] == 1.0 and out["2"]["reward_std_mean"] == 0.0  # cut before any difference
    assert out["24"]["tied_share"] == 0.5 and out["24"]["reward_std_mean"] > 0  # the erring prompt's groups differ
    assert out["24"]["prompts"] == 2 and out["24"]["groups"] == 10
    # the right list stops at n = 10 (reward 1), the wrong ones do not: 4 of 8 completions
    assert out["24"]["complete_share"] == 0.5 and out["2"]["complete_share"] == 0.0
    assert out["24"]["reward_std_within_prompt"] > 0
    with pytest.raises(SystemExit, match="no count pools"):  # pools sampled to another horizon are not read
        group_signal(tmp_path, horizons=(2,), pool_horizon=256, decode=lambda ids: "")


# --- the reach design (the amendment) -------------------------------------------------------------------------------


def test_the_reach_design_changes_only_what_its_amendment_names():
    changes = AMENDMENT_REACH["changes"]
    for key, value in PRE.items():
        if key not in changes:
            assert REACH[key] == value, key
        elif isinstance(value, dict):  # an entry changed key by key: the other keys are the first design's
            assert {k: v for k, v in REACH[key].items() if k not in changes[key]} == {
                k: v for k, v in value.items() if k not in changes[key]
            }
    assert set(REACH) - set(PRE) == {"collapse_min_last_length", "amendment"}
    assert REACH["arms"] == PRE["arms"] and REACH["seeds"] == PRE["seeds"] and REACH["token_budget"] == 28_000
    t = REACH["task"]
    assert not set(t["train_targets"]) & set(t["held_out_targets"]) and len(t["held_out_targets"]) == 14
    assert study.MEASURE["seed"] not in REACH["seeds"] and REACH["learning_rates"]["pilot_seed"] == 100
    # the files: the first design's keep their names, the second's carry its name
    assert study.pilot_cell(1e-6, "reach") == "reach_pilot_lr1e-06" and study.pilot_cell(3e-6) == "pilot_lr3e-06"
    assert study.stem_of("reach") == "real_model_study_reach" and study.stem_of("far") == "real_model_study"
    assert study.parse_args([]).design == "reach"


@pytest.mark.slow
def test_the_reach_targets_are_reached_inside_the_horizon(smollm2_dir):
    """Counting on from the prefix to n, with the end of the turn, takes 4n - 18 tokens: 126 at n = 36, 238 at 64."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    t = REACH["task"]
    for n in t["train_targets"] + t["held_out_targets"]:
        tokens = len(tok(" " + ", ".join(map(str, range(4, n + 1))), add_special_tokens=False)["input_ids"]) + 1
        assert tokens == 4 * n - 18 <= t["max_completion_length"]
        assert task.count_task_reward([" " + ", ".join(map(str, range(4, n + 1)))], [n]) == [1.0]
    assert REACH["collapse_min_last_length"] == (4 * min(t["train_targets"] + t["held_out_targets"]) - 18) // 2


def test_the_reach_precondition_is_its_committed_variance_check():
    data = json.loads(committed("real_model_study_reach_variance.json").read_text())
    fallbacks = json.loads(committed("real_model_study_reach_variance_fallbacks.json").read_text())
    t, text = REACH["task"], REACH["precondition"]
    for d in (data, fallbacks):
        meta = d["meta"]
        assert meta["command"].startswith("python -m benchmarks.variance --task count --pool 12 --horizons 256")
        assert meta["count_targets"] == t["train_targets"] and meta["temperature"] == t["temperature"]
        assert meta["cache_key"] == fallbacks["meta"]["cache_key"]  # the same pools
    cell = data["results"]["lm_head"][str(t["max_completion_length"])]
    assert cell["mean_completion_tokens"] >= 128 and f"{cell['mean_completion_tokens']:.1f}" in text
    ref = cell["paired"]["N=4/otb-grpo"]
    default = fallbacks["results"]["lm_head"]["256"]["paired"]["N=4/otb_zero_advantage-grpo"]
    for found in (ref, default):  # the reference's and the default's tail: both arms that run
        assert found["ratio"] < 0.7 and found["ratio_ci"][1] < 1
        assert f"{found['ratio']:.2f} [{found['ratio_ci'][0]:.2f}, {found['ratio_ci'][1]:.2f}]" in text
    assert study.otb_defaults()["otb_tail"] == "zero_advantage" and not study.otb_defaults()["otb_leave_one_out"]
    signal = json.loads(committed("real_model_study_reach_group_signal.json").read_text())["horizons"]["256"]
    assert f"{signal['tied_share']:.2f} of the groups tie" in text
    assert f"{signal['complete_share']:.2f} of the completions stop at n" in text
    assert f"within-prompt reward std {signal['reward_std_within_prompt']:.2f}" in text


def test_the_reach_cost_is_the_plan_on_the_first_measurement_at_its_length():
    measured = json.loads(committed(study.STEPS_FILE).read_text())["costs"]
    tokens = json.loads(committed("real_model_study_reach_variance.json").read_text())["results"]["lm_head"]["256"]
    plan = analysis.cost_plan(dict(measured, completion_tokens_per_completion=tokens["mean_completion_tokens"]), REACH)
    assert REACH["cost"]["plan"] == plan and plan["wall_hours_at_2_jobs"] <= REACH["cost"]["wall_hours_allowed"]
    fewer = analysis.cost_plan(
        dict(measured, completion_tokens_per_completion=tokens["mean_completion_tokens"]), dict(REACH, seeds=[0] * 6)
    )
    assert f"6 seeds would take {fewer['wall_hours_at_2_jobs']:.1f} hours" in REACH["cost"]["cut_order"]


def test_the_results_block_shows_every_arm_and_pair_with_its_interval(tmp_path):
    """docs/benchmarks.md's block for a real-model summary: the arms table and the paired differences, an interval
    only from 6 paired seeds, **differ** only where it excludes 0."""
    from research.report.tables import Context
    from research.report.training import real_model_cells

    runs = []
    for s in range(6):
        base = 0.5 + 0.01 * s
        runs += [
            _synthetic("grpo_N4", s, [base, base + 0.1, base + 0.2]),
            _synthetic("otb_ref", s, [base, base + 0.1 + 0.001 * s, base + 0.2]),
            _synthetic("otb_default", s, [base, base + 0.15 + 0.001 * s, base + 0.25]),
        ]
    cells = {"reach_main": analysis.summarise_cell(runs, list(REACH["arms"]), 1000, 0.6, 63)}
    (tmp_path / "summary.json").write_text(json.dumps({"cells": cells, "target": 0.6}))
    text = real_model_cells(Context(results=tmp_path, to_root=""), "summary")
    assert text.count("| reach_main |") == 3 + len(analysis.PAIRS)
    assert "Target: 0.600." in text and "[summary.json](summary.json)" in text
    default_row = next(line for line in text.splitlines() if "| otb_default-grpo_N4 |" in line)
    assert default_row.count("**differ**") >= 1 and "[" in default_row  # auc: +0.03 to +0.035 on every seed
    assert "| 0/6 (0.00-0.39) |" in text  # no collapse, with its Wilson interval
    per_seed = next(line for line in text.splitlines() if line.startswith("| 5 |"))  # each seed's own runs
    assert per_seed.count(" / ") == 3 and per_seed.count("target at") == 3  # every run passes 0.6 by its end
    assert "proxy fidelity" not in text  # no run checked the proxy: no table
    check = {"arm": "otb_default", "seed": 0, "step": 9, "token_spearman": 0.75, "token_pearson": 0.96}
    (tmp_path / "checked.json").write_text(
        json.dumps({"cells": cells, "target": 0.6, "fidelity": [check | {"energy_spearman": 1.0}]})
    )
    text = real_model_cells(Context(results=tmp_path, to_root=""), "checked")
    assert "| otb_default, seed 0, step 9 | 0.750 | 0.960 | 1.000 |" in text
    five = {"reach_main": analysis.summarise_cell([r for r in runs if r["seed"] < 5], list(REACH["arms"]), 1000, 0.6)}
    (tmp_path / "five.json").write_text(json.dumps({"cells": five, "target": None}))
    text = real_model_cells(Context(results=tmp_path, to_root=""), "five")
    assert "mean of 5 seeds, no interval" in text and "**differ**" not in text and "none (a pilot)" in text
    # a pilot's summary: the chosen rates, no paired table and no "reached" (its target comes from its own runs)
    (tmp_path / "pilot.json").write_text(json.dumps({"cells": five, "target": 0.6, "chosen": {"grpo_N4": 1e-5}}))
    text = real_model_cells(Context(results=tmp_path, to_root=""), "pilot")
    assert "Chosen rates (the highest auc per arm): grpo_N4 1e-05." in text and "arm minus reference" not in text
    assert "auc / final" not in text  # a pilot's runs choose rates: no per-seed comparison
    assert text.count("| reach_main |") == 3 and "| - |" in text


def test_the_rate_follow_up_runs_the_default_at_the_references_chosen_rate_in_its_own_cell(tmp_path):
    from research.harness.training_study import run_path

    fu = study.RATE_FOLLOW_UP
    pilot = json.loads(committed("real_model_study_reach_pilot.json").read_text())
    assert fu["arm"]["learning_rate"] == pilot["chosen"]["otb_ref"] != pilot["chosen"]["otb_default"]
    assert fu["arm"]["config_arm"] == "otb_default" and fu["seeds"] == REACH["seeds"]
    assert all(arm in [fu["arm"]["name"], *REACH["arms"]] for pair in fu["comparisons"].values() for arm in pair)
    args = study.parse_args(["--rate-follow-up", "--out", str(tmp_path)])
    args.workdir = str(tmp_path)
    jobs = study.rate_follow_up_jobs(args)
    assert [j["seed"] for j in jobs] == fu["seeds"] and all("fidelity" not in j for j in jobs)
    assert {(j["cell"], j["arm"], j["config_arm"], j["learning_rate"], j["design"]) for j in jobs} == {
        ("reach_rate", "otb_default_lr3e-06", "otb_default", 3e-6, "reach")
    }
    assert jobs[0]["token_budget"] == REACH["token_budget"] and jobs[0]["task"]["train_targets"] == list(
        range(36, 66, 2)
    )
    done = run_path(tmp_path, "reach_rate", "otb_default_lr3e-06", 0, study.FOLDER)
    done.parent.mkdir(parents=True)
    done.write_text("{}")
    assert [j["seed"] for j in study.rate_follow_up_jobs(args)] == fu["seeds"][1:]  # a finished run is not rerun
    with pytest.raises(SystemExit, match="follows the reach study"):
        study.main(["--rate-follow-up", "--design", "far", "--out", str(tmp_path)])


def test_the_rate_follow_up_pairs_with_the_reach_runs_and_applies_its_decision(tmp_path):
    """Synthetic runs: the follow-up's arm beside the reach study's three; its verdict by the pre-registered rule."""
    from research.harness.training_study import run_path

    fu = study.RATE_FOLLOW_UP
    name = fu["arm"]["name"]
    (tmp_path / "real_model_study_reach_pilot.json").write_text(json.dumps({"target": 0.9}))

    def write(arm, seed, scores, cell="reach_main", config=None):
        run = _synthetic(arm, seed, scores, lengths=(200.0, 150.0))
        run["config"] = config or run["config"]
        path = run_path(tmp_path, cell, arm, seed, study.FOLDER)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(run))

    def summary(follow_up_gap: float, seeds=(0, 1, 2, 3, 4, 5)):
        for s in seeds:
            base = 0.5 + 0.01 * s
            write("grpo_N4", s, [base, base + 0.1, base + 0.3])
            write("otb_ref", s, [base, base + 0.2, base + 0.3])
            write("otb_default", s, [base, base + 0.05, base + 0.15])  # its own rate: lower
            wobble = 0.002 * (-1) ** s
            write(name, s, [base, base + 0.2 + follow_up_gap + wobble, base + 0.3], cell=fu["cell"])
        return study.rate_follow_up_summary(tmp_path, {"command": "test"})

    rate = summary(0.0)
    assert rate["verdict"] == "the rate" and rate["checks"]["same_default_configuration"]
    paired = rate["cells"]["reach_rate"]["paired"]
    assert set(paired) == {f"{name}-otb_ref", f"{name}-otb_default", f"{name}-grpo_N4"}
    assert paired[f"{name}-otb_ref"]["auc"]["seeds"] == 6 and paired[f"{name}-otb_default"]["auc"]["ci"][0] > 0
    assert (
        rate["cells"]["reach_rate"]["arms"][name]["runs"] == 6
        and (tmp_path / "real_model_study_reach_rate.json").exists()
    )
    from research.report.tables import Context
    from research.report.training import real_model_cells

    block = real_model_cells(Context(results=tmp_path, to_root=""), "real_model_study_reach_rate")
    assert "Pre-registered verdict: the rate." in block and f"| reach_rate | {name}-otb_ref |" in block
    assert block.count("| reach_rate |") == 4 + 3  # four arms, three comparisons
    assert summary(-0.05)["verdict"] == "the tail"  # at the same rate, still below the reference on every seed
    assert summary(+0.05)["verdict"] == "undecided"  # above the reference: neither reading
    write(name, 0, [0.5, 0.6, 0.7], cell=fu["cell"], config={"otb_tail": "zero", "scale_rewards": "none"})
    assert not study.rate_follow_up_summary(tmp_path, {})["checks"]["same_default_configuration"]


def test_the_rate_verdict_waits_for_six_paired_seeds():
    comparisons = study.RATE_FOLLOW_UP["comparisons"]
    five = {"-".join(comparisons[k]): {"auc": {"mean": 0.1, "seeds": 5}} for k in ("primary", "secondary")}
    assert analysis.rate_verdict(five, comparisons) == "none (fewer than 6 paired seeds)"
    assert analysis.rate_verdict({}, comparisons).startswith("none")
