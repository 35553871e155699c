"""One run of either study (an arm of a cell, trained from one seed's warm-started policy and evaluated on held-out
patterns along the way), and the job loop that makes the warm starts and runs every job not yet done.

Cost and resumption. Each run is one process (``--jobs`` in parallel, one thread each) and writes its own JSON
under ``--out``/training_study/ when it finishes; a run already there is never run again, so the same command
resumes an interrupted study, and the summary is rebuilt from whatever has finished. The warm-started weights are
cached in ``--cache`` (default .cache/training_study). The cost of each cell (CPU seconds per run, by arm) is in
the summary.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

from benchmarks.common import CountingReward, run_outcome, train_measuring_movement, write_json
from research.harness.training_study.preregistration import PREREGISTRATION


def run_path(out: Path, cell: str, arm: str, seed: int, folder: str = "training_study") -> Path:
    return Path(out) / folder / cell / f"{arm}-s{seed}.json"


# The first study's OTB arm passed no tail and ran with OTBConfig's default of its day, verl's reference tail (study 2
# calls it otb_ref); named here so that the arm stays what it was whatever OTBConfig's default is.
ARM_OPTIONS = {"otb_N4": {"otb_tail": "zero", "otb_leave_one_out": False}}
REGISTERED_OTB_OPTIONS = {
    "otb_proxy": "logit",
    "otb_epsilon": 1e-8,
    "otb_align": None,
    "otb_leave_one_out": False,
    "otb_shrinkage": "none",
}
"""OTBConfig's OTB options when studies 1-4 were registered: an OTB arm runs with each it leaves unnamed, so that a
later change of OTBConfig's defaults cannot redefine a pre-registered arm (study 4's otb_loo_mean names no
shrinkage: it is plain leave-one-out)."""


def arm_otb_options(name: str, arm: dict) -> dict:
    """The OTB fields an arm's OTBConfig gets: what it names (and ``ARM_OPTIONS``), over ``REGISTERED_OTB_OPTIONS``
    for an OTB arm; only what it names for the others (OTBConfig refuses a non-default option they do not take)."""
    named = {k: v for k, v in arm.items() if k.startswith("otb_")} | ARM_OPTIONS.get(name, {})
    return REGISTERED_OTB_OPTIONS | named if arm["advantage_estimator"] == "otb" else named


def run_one(job: dict) -> dict:
    """Train one arm of one cell from one seed's warm-started policy; returns the run's record (see module doc).

    A second-study job (``job["study"] == 2``) also carries its arm (``arm_spec``), its warm start's tasks, the
    cell's reward offset and quantum and its evaluation samples; it trains with ``study_task.study_trainer()``."""
    import torch

    torch.set_num_threads(job["threads"])
    from transformers import TrainerCallback
    from transformers.trainer_callback import PrinterCallback

    from benchmarks import study_task
    from trl_otb import OTBConfig, OTBTrainer

    cell, seed = job["cell_spec"], job["seed"]
    arm = job.get("arm_spec") or PREREGISTRATION["arms"][job["arm"]]
    second = job.get("study") == 2
    task = study_task.TASKS[cell["task"]]
    tasks = job.get("warm_start_tasks", study_task.WARM_START_TASKS)
    model, tok = study_task.warm_start(seed, job["cache"], job.get("warm_start_steps"), tasks)
    train_patterns, held_out = study_task.split_patterns(seed)
    reward = study_task.reward_function(task, cell.get("reward_offset", 0.0), cell.get("reward_quantum"))
    counted = CountingReward(reward)
    budget, every = cell["token_budget"], cell["eval_every_tokens"]
    max_steps = job.get("max_steps") or _step_bound(cell, arm)

    def evaluate(step: int) -> None:
        if "eval_samples" not in cell:  # the first study
            score = study_task.held_out_score(model, tok, task, held_out, seed)
            curve.append({"step": step, "tokens": counted.tokens, "score": score})
            return
        start = time.process_time()
        scores = study_task.held_out_samples(model, tok, task, held_out, seed, cell["eval_samples"])
        se = study_task.sampling_se(scores, cell["eval_samples"])
        eval_cpu["s"] += time.process_time() - start
        curve.append({"step": step, "tokens": counted.tokens, "score": sum(scores) / len(scores), "se": se})

    curve: list[dict] = []
    eval_cpu = {"s": 0.0}  # the second study's evaluations, to check the cost plan's allowance for them
    evaluate(0)

    class Schedule(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            done = (budget and counted.tokens >= budget) or state.global_step >= max_steps
            due = every and counted.tokens // every > curve[-1]["tokens"] // every
            if due or done:
                evaluate(state.global_step)
            if done:
                control.should_training_stop = True

    N = arm["num_generations"]
    otb_options = arm_otb_options(job["arm"], arm)
    config = OTBConfig(
        output_dir=str(Path(job["workdir"]) / f"{job['cell']}-{job['arm']}-{seed}"),
        advantage_estimator=arm["advantage_estimator"],
        num_generations=N,
        scale_rewards=arm["scale_rewards"],
        **otb_options,
        per_device_train_batch_size=N * PREREGISTRATION["prompts_per_step"],
        max_completion_length=task.max_completion_length,
        learning_rate=cell["learning_rate"],
        lr_scheduler_type="constant",
        max_steps=max_steps,
        seed=seed,
        use_cpu=True,
        bf16=False,
        gradient_checkpointing=False,
        report_to="none",
        logging_steps=1,
        save_strategy="no",
        disable_tqdm=True,
    )
    trainer_class, extra = OTBTrainer, {}
    if second:
        trainer_class, extra = study_task.study_trainer(), {"harness_scale": arm.get("harness_scale")}
    trainer = trainer_class(
        model,
        reward_funcs=counted,
        args=config,
        train_dataset=study_task.dataset(task, train_patterns, seed),
        processing_class=tok,
        callbacks=[Schedule()],
        **extra,
    )
    trainer.remove_callback(PrinterCallback)
    cpu, wall = time.process_time(), time.perf_counter()
    moved = train_measuring_movement(trainer, model)
    steps = [
        {k: entry.get(k) for k in (STEP_KEYS2 if second else STEP_KEYS)}
        for entry in trainer.state.log_history
        if "loss" in entry and "train_runtime" not in entry
    ]
    record = {
        "cell": job["cell"],
        "arm": job["arm"],
        "seed": seed,
        **run_outcome(curve, steps, moved, counted.tokens, cpu, wall),
    }
    if second:
        record.update(
            study=2,
            learning_rate=cell["learning_rate"],
            arm_spec=arm,
            reward_offset=cell["reward_offset"],
            eval_cpu_seconds=eval_cpu["s"],
        )
    return record


STEP_KEYS = (
    "step",
    "loss",
    "grad_norm",
    "reward",
    "reward_std",
    "completions/mean_length",
    "completions/min_length",
    "completions/max_length",
    "frac_reward_zero_std",
    "otb/advantage_std",
)
STEP_KEYS2 = (*STEP_KEYS, "completions/mean_terminated_length", "study/lone_token_frac")
"""The second study logs, per step, also the share of tokens where a fallback baseline applied."""


def _step_bound(cell: dict, arm: dict) -> int:
    """A cap on the steps, reached after the token budget unless every completion is a single token: it only
    guards against a run that never ends."""
    per_step = arm["num_generations"] * PREREGISTRATION["prompts_per_step"]
    return max(1, math.ceil(cell["token_budget"] / per_step))


def job_for(args, cell: str, spec: dict, arm: str, seed: int, **study) -> dict:
    """The job of one run (what ``run_one`` reads): the cell as the arm runs it, the arm, the seed, what the second
    study adds (``study``, ``folder``, ``arm_spec``, ``warm_start_tasks``) and the command line's settings."""
    settings = {"threads": args.threads, "cache": str(args.cache), "workdir": args.workdir}
    settings.update(warm_start_steps=args.warm_start_steps, max_steps=args.max_steps)
    return {"cell": cell, "cell_spec": spec, "arm": arm, "seed": seed, **study, **settings}


def run_jobs(args, make_jobs) -> None:
    """Warm up, then run every job ``make_jobs()`` lists (``--jobs`` in parallel), storing and reporting each run."""
    import tempfile

    with tempfile.TemporaryDirectory() as workdir:
        args.workdir = workdir
        warm_up(args)
        jobs = [dict(job, out=str(args.out)) for job in make_jobs()]
        print(f"{len(jobs)} runs to do", flush=True)
        if args.jobs == 1:
            for job in jobs:
                _report(_run_and_store(job), args)
        else:
            import multiprocessing as mp

            with mp.get_context("spawn").Pool(args.jobs, maxtasksperchild=1) as pool:
                for run in pool.imap_unordered(_run_and_store, jobs):
                    _report(run, args)


def _run_and_store(job: dict) -> dict:
    run = run_one(job)
    write_json(run_path(job["out"], job["cell"], job["arm"], job["seed"], job.get("folder", "training_study")), run)
    return run


def _report(run: dict, args) -> None:
    print(
        f"{run['cell']} {run['arm']} seed {run['seed']}: {len(run['steps'])} steps, {run['tokens']} tokens, "
        f"score {run['curve'][0]['score']:.3f} -> {run['curve'][-1]['score']:.3f}, {run['cpu_seconds']:.0f} CPU s",
        flush=True,
    )


def warm_up(args) -> None:
    """Make (or load) every seed's warm-started policy, ``--jobs`` at a time, before the runs use them."""
    import multiprocessing as mp

    from benchmarks import study_task

    task_sets = getattr(args, "warm_start_task_sets", [study_task.WARM_START_TASKS])
    specs = [
        (s, str(args.cache), args.warm_start_steps, args.threads, tuple(tasks))
        for tasks in task_sets
        for s in args.seeds
        if not study_task.warm_start_path(args.cache, s, args.warm_start_steps, tasks).exists()
    ]
    if len(specs) <= 1 or args.jobs == 1:
        for spec in specs:
            _warm(spec)
        return
    with mp.get_context("spawn").Pool(args.jobs, maxtasksperchild=1) as pool:
        for seed in pool.imap_unordered(_warm, specs):
            print(f"warm start of seed {seed} ready", flush=True)
    assert study_task  # imported here so that a spawned worker finds it


def _warm(spec) -> int:
    import torch

    seed, cache, steps, threads, tasks = spec
    torch.set_num_threads(threads)
    from benchmarks import study_task

    study_task.warm_start(seed, cache, steps, tasks)
    return seed
