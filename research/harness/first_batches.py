"""The estimator study's real-model part (``FIRST_BATCHES`` in training_study/preregistration4.py): on the pretrained
SmolLM2-135M, does each estimator's first step lower the log-odds of stopping at n on a batch whose only signal is an
improbable error?

    python -m research.harness.first_batches                # draw from seed 300 on until 20 batches qualify, run them
    python -m research.harness.first_batches --summary      # the summary from the finished batches only
    python -m research.harness.first_batches --quick        # the tiny model, short completions (the tests)

Run it at ``nice -n 19``. Each seed draws the reach design's first batch (``real_model_study.make_trainer``: N=4, 2
prompts per step, temperature 0.7, the count task; generation only, no step) and keeps it if it qualifies
(``qualifies``: no completion stops at n, at least one errs). A qualifying batch is then trained one step by each arm
of ``FIRST_BATCHES["arms"]`` from the same pretrained weights, with the mechanism study's one-step run
(``real_model_mechanism.run_one``). A seed fixes the step's prompts and TRL's sampling, so every arm replays the drawn
batch; each arm's completions are checked against the draw's. The stop log-odds at n (the mechanism study's measure,
teacher-forced) are read before and after the step on the batch's own targets.

Each seed writes ``<out>/first_batches/s<seed>.json`` when it is finished (the draw, why it qualified or not, and for
a qualifying batch every arm's step); a seed already there is never drawn or run again, so the same command resumes.
The summary, ``<out>/first_batches.json``, is rebuilt from the first ``--batches`` qualifying seeds.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.common import command, write_json
from research.harness import real_model_mechanism as mech
from research.harness.real_model_preregistration import DESIGNS
from research.harness.real_model_task import count_task_reward, load_policy
from research.harness.training_study.analysis import wilson
from research.harness.training_study.preregistration4 import FIRST_BATCHES

FOLDER, SUMMARY = "first_batches", "first_batches.json"
QUICK_FOLDER, QUICK_SUMMARY = "first_batches_quick", "first_batches_quick.json"
"""--quick writes beside the study's results, never over them."""
DEFAULT_OUT = Path(".cache/estimator_study")
SEED_START, BATCHES = 300, 20
DESIGN = "reach"

STOP_AT_N, COUNT_ON = 1.0, 0.5
"""The count task's rewards (count_reward): 1 for a list that stops at n, 0.5 for one that reaches n and goes on (or
is cut off); below 0.5 an error reward: the run 1, 2, ... never reaches n (a wrong or missing number, or a stop
before n), scored by how far it got, halved."""

OTB_OPTIONS = {"otb_proxy": "logit", "otb_epsilon": 1e-8, "otb_align": None, "otb_shrinkage": "none"}
"""The OTB options an OTB arm of FIRST_BATCHES leaves unnamed, named here at OTBConfig's values when the study was
registered, so that a later change of OTBConfig's defaults cannot redefine an arm."""
CONFIG_KEYS = ("advantage_estimator", "num_generations", "scale_rewards", "otb_tail", "otb_leave_one_out")
CONFIG_KEYS += ("otb_shrinkage", "otb_proxy", "otb_epsilon", "otb_align", "learning_rate")
CONFIG_KEYS += ("temperature", "max_completion_length", "loss_type", "beta", "max_grad_norm")
"""The trainer settings each arm's record carries, read from the trainer (``arm_config``)."""
CONFIG_ARM = {"grpo": "grpo_N4", "otb": "otb_default"}
"""The reach design's arm (real_model_study) an arm's options are laid over: every option it names replaces it."""

QUICK = {
    "model": "tiny",
    # seed 3's batch has a reward that differs (a list that reaches 4: 0.4 against 0.3); most of the tiny model's tie
    "seed_start": 3,
    "batches": 2,
    "max_draws": 4,
    # n = 5 lies past COUNT_PREFIX's 3, so the random tiny model errs (no 4) and stops at n almost never
    "train_targets": [5],
    "max_completion_length": 24,
    "temperature": 2.0,  # at 0.7 the tiny model almost never writes a digit, and every reward ties
    "learning_rate": 1e-3,
}


# ----------------------------------------------------------------------------------------------------------------
# The arms and the draw
# ----------------------------------------------------------------------------------------------------------------


def arm_overrides(arm: str) -> dict:
    """The arm's options from FIRST_BATCHES, every one named (``OTB_OPTIONS`` added to the OTB arms), less the learning
    rate and the group size, which the design passes (the group size is checked to be the design's)."""
    options = dict(FIRST_BATCHES["arms"][arm])
    options.pop("learning_rate")
    assert options.pop("num_generations") == DESIGNS[DESIGN]["num_generations"], f"{arm}: not the design's N"
    if options["advantage_estimator"] == "otb":
        options = OTB_OPTIONS | options
    return options


def arm_job(common: dict, arm: str, seed: int, targets: list[int], quick: bool) -> dict:
    """The mechanism study's one-step job for ``arm`` on ``seed``'s batch, its stop log-odds read on ``targets``."""
    options = FIRST_BATCHES["arms"][arm]
    rate = QUICK["learning_rate"] if quick else options["learning_rate"]
    task = dict(common["task"], held_out_targets=targets)
    job = {**common, "task": task, "arm": arm, "seed": seed, "learning_rate": rate}
    return job | {"config_arm": CONFIG_ARM[options["advantage_estimator"]], "overrides": arm_overrides(arm)}


def arm_config(trainer) -> dict:
    """The settings the trainer runs with (``CONFIG_KEYS``)."""
    return {k: getattr(trainer.args, k) for k in CONFIG_KEYS}


def qualifies(rewards: list[float]) -> tuple[bool, str]:
    """FIRST_BATCHES's rule on a batch's rewards: no completion stops at n (reward 1) and at least one errs (reward
    below 0.5); the answer and why."""
    stops = sum(r == STOP_AT_N for r in rewards)
    errs = sum(r < COUNT_ON for r in rewards)
    if stops:
        return False, f"{stops} of {len(rewards)} completions stop at n"
    if not errs:
        return False, f"no completion errs: all {len(rewards)} reach n and go on"
    return True, f"no completion stops at n and {errs} of {len(rewards)} err"


class _Drawn(Exception):
    """Raised once the batch is generated and scored: the draw takes no step."""


def draw(job: dict) -> dict:
    """The seed's first batch, generated and scored as the arms' steps will be (the design's trainer with the seed),
    no step taken: its targets, completions, rewards, lengths and whether each ended with a stop token."""
    import torch

    from research.harness.real_model_study import make_trainer
    from trl_otb import OTBTrainer

    torch.set_num_threads(job["threads"])
    cpu, wall = time.process_time(), time.perf_counter()
    model, tok = load_policy(job["model"])
    stops = mech.stop_ids(model, tok)
    found = {}

    def decode(ids):
        return tok.decode(ids, skip_special_tokens=True)

    class Draw(OTBTrainer):
        def _generate_and_score_completions(self, inputs):
            batch = super()._generate_and_score_completions(inputs)
            ns = [int(x["n"]) for x in inputs]
            classes, rewards = mech.token_classes(batch, ns, stops, decode)
            mask = batch["completion_mask"].bool()
            found.update(
                ns=ns,
                completion_ids=batch["completion_ids"].tolist(),
                rewards=rewards,
                lengths=mask.sum(1).tolist(),
                stopped=classes["stop"].any(1).tolist(),
            )
            raise _Drawn

    trainer = make_trainer(job, model, tok, count_task_reward, max_steps=1, trainer_class=Draw)
    try:
        trainer.train()
    except _Drawn:
        pass
    assert found, "the trainer did not generate a batch"
    ok, reason = qualifies(found["rewards"])
    return {"seed": job["seed"], "qualified": ok, "reason": reason, **found} | {
        "cpu_seconds": time.process_time() - cpu,
        "wall_seconds": time.perf_counter() - wall,
    }


def run_arm(job: dict, drawn: dict) -> dict:
    """One arm's step on the drawn batch (the mechanism study's run), with the settings it ran with; refused if the
    step's batch is not the draw's."""
    seen = {}
    cpu, wall = time.process_time(), time.perf_counter()
    run = mech.run_one(job, on_trainer=lambda trainer: seen.update(arm_config(trainer)))
    same = run.pop("completion_ids") == drawn["completion_ids"]
    assert same, f"seed {job['seed']}, {job['arm']}: the step's batch is not the drawn one"
    return run | {"config": seen, "cpu_seconds": time.process_time() - cpu, "wall_seconds": time.perf_counter() - wall}


def run_seed(common: dict, seed: int, quick: bool) -> dict:
    """The seed's record: its draw, and for a qualifying batch each arm's step (``arms``)."""
    drawn = draw({**common, "arm": "draw", "config_arm": "grpo_N4", "seed": seed, "learning_rate": 0.0})
    gc.collect()
    record = {k: v for k, v in drawn.items() if k != "completion_ids"}
    if not drawn["qualified"]:
        return record
    targets = sorted(set(drawn["ns"]))
    arms = {}
    for arm in FIRST_BATCHES["arms"]:
        arms[arm] = run_arm(arm_job(common, arm, seed, targets, quick), drawn)
        gc.collect()  # each run holds a model, a trainer and Adam's state: free them before the next
        print(f"  seed {seed} {arm}: change at n {arms[arm]['change']['at']:+.3f}", flush=True)
    return record | {"targets": targets, "completion_ids": drawn["completion_ids"], "arms": arms}


# ----------------------------------------------------------------------------------------------------------------
# The summary
# ----------------------------------------------------------------------------------------------------------------


def qualifying(records: list[dict], batches: int) -> list[dict]:
    """The first ``batches`` qualifying records, by seed."""
    return [r for r in sorted(records, key=lambda r: r["seed"]) if r["qualified"]][:batches]


def summarize(records: list[dict], batches: int) -> dict:
    """FIRST_BATCHES's outcome over the first ``batches`` qualifying seeds: per arm, the share of batches whose step
    lowered the stop log-odds at n (a change below 0) with its Wilson 95% interval, and the mean change (at n, and
    before and past it, as description); and the draws (how many, how many qualified, why the rest did not)."""
    used = qualifying(records, batches)
    drawn = sorted(records, key=lambda r: r["seed"])
    last = used[-1]["seed"] if len(used) == batches else None
    considered = [r for r in drawn if last is None or r["seed"] <= last]
    # Seeds run side by side (--seed-start) can leave one undrawn below a used one: the batches used are then not
    # the first qualifying ones, and the summary is not complete until it is drawn.
    seeds = {r["seed"] for r in considered}
    undrawn = sorted(set(range(min(seeds), max(seeds) + 1)) - seeds) if seeds else []
    arms = {}
    for arm in FIRST_BATCHES["arms"]:
        runs = [r["arms"][arm] for r in used]
        at = [run["change"]["at"] for run in runs]
        lowered = sum(c < 0 for c in at)
        arms[arm] = {
            "batches": len(runs),
            "lowered": lowered,
            "share_lowered": lowered / len(runs) if runs else None,
            "wilson95": wilson(lowered, len(runs)),
            "mean_change": {
                k: statistics.fmean(run["change"][k] for run in runs) if runs else None
                for k in ("early", "at", "past")
            },
            "change_at_n_per_batch": at,
            "grad_norm_median": statistics.median(run["grad_norm"] for run in runs) if runs else None,
            "all_moved": all(run["weights_moved"] > 0 for run in runs),
            "config": runs[0]["config"] if runs else None,
        }
    return {
        "batches": len(used),
        "complete": len(used) == batches and not undrawn,
        "seeds": [r["seed"] for r in used],
        "draws": {
            "drawn": len(considered),
            "qualified": sum(r["qualified"] for r in considered),
            "first_seed": drawn[0]["seed"] if drawn else None,
            "last_seed": considered[-1]["seed"] if considered else None,
            "why_not": {str(r["seed"]): r["reason"] for r in considered if not r["qualified"]},
            "undrawn": undrawn,
        },
        "arms": arms,
    }


# ----------------------------------------------------------------------------------------------------------------
# The command
# ----------------------------------------------------------------------------------------------------------------


def read_records(folder: Path) -> dict[int, dict]:
    """The finished seeds' records, by seed."""
    return {r["seed"]: r for r in (json.loads(p.read_text()) for p in sorted(folder.glob("s*.json")))}


def common_job(args, workdir: str) -> dict:
    """What every draw and step of the command shares: the reach design's task (quick: shorter), model and threads."""
    task = dict(DESIGNS[DESIGN]["task"])
    if args.quick:
        task.update({k: QUICK[k] for k in ("train_targets", "max_completion_length", "temperature")})
    model = QUICK["model"] if args.quick else "embedded"
    return dict(design=DESIGN, cell="first_batches", task=task, model=model, threads=args.threads, workdir=workdir)


def run(args) -> int:
    """Draw and run seeds from ``args.seed_start`` on until ``args.batches`` qualify (or ``args.max_draws`` seeds are
    drawn); returns how many seeds were drawn here."""
    folder = args.out / args.folder
    done = read_records(folder)
    qualified = sum(r["qualified"] for r in done.values() if r["seed"] >= args.seed_start)
    new, seed = 0, args.seed_start
    with tempfile.TemporaryDirectory() as workdir:
        common = common_job(args, workdir)
        while qualified < args.batches and (not args.max_draws or seed < args.seed_start + args.max_draws):
            if seed not in done:
                record = run_seed(common, seed, args.quick)
                write_json(folder / f"s{seed}.json", record)
                qualified += record["qualified"]
                new += 1
                print(f"seed {seed}: {record['reason']} ({qualified} of {args.batches} qualified)", flush=True)
            seed += 1
    return new


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(
        prog="python -m research.harness.first_batches", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--quick", action="store_true", help="the tiny model, short completions (the tests)")
    parser.add_argument("--summary", action="store_true", help="only the summary from the finished seeds")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--batches", type=int, default=None, help=f"qualifying batches wanted (default {BATCHES})")
    parser.add_argument("--seed-start", type=int, default=None, help=f"the first seed drawn (default {SEED_START})")
    parser.add_argument("--max-draws", type=int, default=None, help="stop after this many seeds (default: no limit)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    args = parser.parse_args(argv)
    args.folder = QUICK_FOLDER if args.quick else FOLDER
    default = (QUICK["batches"], QUICK["seed_start"], QUICK["max_draws"]) if args.quick else (BATCHES, SEED_START, 0)
    args.batches = default[0] if args.batches is None else args.batches
    args.seed_start = default[1] if args.seed_start is None else args.seed_start
    args.max_draws = default[2] if args.max_draws is None else args.max_draws
    new = 0 if args.summary else run(args)
    print(f"{new} seeds drawn", flush=True)
    records = [r for r in read_records(args.out / args.folder).values() if r["seed"] >= args.seed_start]
    summary = {
        "meta": {"command": command("research.harness.first_batches", argv), "quick": args.quick},
        "preregistration": FIRST_BATCHES,
        "arm_options": {arm: arm_overrides(arm) for arm in FIRST_BATCHES["arms"]},
        **summarize(records, args.batches),
    }
    write_json(args.out / (QUICK_SUMMARY if args.quick else SUMMARY), summary)
    for arm, s in summary["arms"].items():
        share = "-" if s["share_lowered"] is None else f"{s['share_lowered']:.2f}"
        print(f"{arm}: lowered {s['lowered']}/{s['batches']} = {share} {s['wilson95']}, mean {s['mean_change']['at']}")
    return summary


if __name__ == "__main__":
    main()
