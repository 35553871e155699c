"""The second study's pre-registration (issue 26: which OTB should be the default?).

Everything that decides the answer is in STUDY2, committed before any study-2 run (the pilot included). The
two shift-invariant candidates are named in CANDIDATES, with the numbers that chose them; the learning rates
chosen by the pre-registered pilot rule are recorded in LEARNING_RATES_FILE, which the study reads (this module is
not edited after a run). Results: --out/training_study2/<cell>/<arm>-s<seed>.json, one per run, and
--out/training_study2.json (the summary, rebuilt from the finished runs).
"""

from __future__ import annotations

from research.harness.training_study.preregistration import PREREGISTRATION

STUDY2_FOLDER = "training_study2"
LEARNING_RATES_FILE = "training_study2_learning_rates.json"


CANDIDATES = {
    "status": "filled before any study-2 run (no pilot, no study run had started): the two shift-invariant OTB "
    "candidates with the lowest MSE against the reference gradient at N=4 on ramble, from benchmarks/variance.py "
    "--fallbacks (benchmarks/results/variance_fallbacks_ramble.json, 12 prompts, 100 groups each, 95% intervals "
    "resampling prompts then groups). The slots first held group_mean and last_baseline as placeholders (the "
    "pre-registration commit); the table ranked them 4th (group_mean, 19.90) and 3rd (last_baseline, 15.74) of the "
    "eight shift-invariant variants. Every leave-one-out variant had a higher MSE (22.9 to 31.8). Note: the two "
    "chosen are within each other's intervals (their MSEs differ by 0.08), and zero_advantage equals tail='none' on "
    "this cell (no group there has a single valid member or a tie). Added later the same day, before any run: "
    "the same table in the score-centred pool (variance.py's second reference, which removes the finite pool's "
    "nonzero mean score) ranks the same two first among the shift-invariant tails: zero_advantage MSE 10.9 "
    "(7.89 to 13.7), sequence_baseline 11.3 (8.13 to 14.2), reference OTB 11.6 (8.55 to 14.5).",
    "source": "benchmarks/results/variance_fallbacks_ramble.json: MSE against the reference gradient at N=4, "
    "ramble, every shift-invariant tail with and without leave-one-out; the two lowest",
    "arms": {
        "otb_zero_advantage": {
            "otb_tail": "zero_advantage",
            "otb_leave_one_out": False,
            "mse": 15.265,
            "mse_ci": [10.50, 20.55],
        },
        "otb_sequence_baseline": {
            "otb_tail": "sequence_baseline",
            "otb_leave_one_out": False,
            "mse": 15.346,
            "mse_ci": [10.60, 20.64],
        },
    },
    "best": "otb_zero_advantage",  # the lower MSE of the two: the one that also runs with the group std scaling
}


def _otb_arm(tail: str, leave_one_out: bool, harness_scale: str | None = None) -> dict:
    return {
        "advantage_estimator": "otb",
        "num_generations": 4,
        "scale_rewards": "none",
        "otb_tail": tail,
        "otb_leave_one_out": leave_one_out,
        "harness_scale": harness_scale,
    }


def _study2_arms(candidates: dict) -> dict:
    best = candidates["arms"][candidates["best"]]
    return {
        "otb_ref": _otb_arm("zero", False),
        **{name: _otb_arm(c["otb_tail"], c["otb_leave_one_out"]) for name, c in candidates["arms"].items()},
        f"{candidates['best']}_scaled": _otb_arm(best["otb_tail"], best["otb_leave_one_out"], "group"),
        "grpo_N4": {"advantage_estimator": "grpo", "num_generations": 4, "scale_rewards": "group"},
        "grpo_unscaled_N4": {"advantage_estimator": "grpo", "num_generations": 4, "scale_rewards": "none"},
        "ogb_N4": {"advantage_estimator": "ogb", "num_generations": 4, "scale_rewards": "none"},
        "rloo_N4": {"advantage_estimator": "rloo", "num_generations": 4, "scale_rewards": "none"},
        "grpo_N16": {"advantage_estimator": "grpo", "num_generations": 16, "scale_rewards": "group"},
    }


def offset_invariant(arm: dict) -> bool:
    """Whether adding a constant to every reward leaves the arm's advantages unchanged (the reference OTB tails
    'zero' and 'none' force or leave a baseline that does not move with the rewards; every other arm does)."""
    return not (arm["advantage_estimator"] == "otb" and arm.get("otb_tail", "zero") in ("zero", "none"))


_RAMBLE = {"task": "ramble", "token_budget": 120_000, "eval_every_tokens": 12_000, "target": 0.75}


STUDY2 = {
    "committed": "before any study-2 run, the learning-rate pilot included; not changed after seeing results (if "
    "it ever must be, both analyses are kept and the reason written down). Two parts are filled later by rules "
    "fixed here: CANDIDATES (from the variance table) and the learning rates (from the pilot, in "
    f"benchmarks/results/{LEARNING_RATES_FILE})",
    "question": "which OTB should be the default: among the shift-invariant OTB candidates, with and without TRL's "
    "group std scaling, each arm at its own tuned learning rate, against TRL's default GRPO, unscaled GRPO, OGB, "
    "RLOO, GRPO at N=16 and the reference OTB (verl's tail rule)",
    "seeds": list(range(10)),
    "prompts_per_step": 4,
    "candidates": CANDIDATES,
    "arms": _study2_arms(CANDIDATES),
    "arm_notes": "otb_ref is verl's rule (otb_tail='zero'), the first study's otb_N4. The two candidates are "
    "CANDIDATES' arms; <best>_scaled is the lower-MSE one with its advantages divided by the group's reward std + "
    "1e-4 as TRL's scale_rewards='group' (done in the harness, study_task.study_trainer: the library refuses "
    "scale_rewards with OTB). grpo_N4 is TRL's default GRPO (scale_rewards='group'); every arm passes "
    "scale_rewards explicitly. Every other setting is TRL's default (loss_type='dapo', beta=0, max_grad_norm=1, "
    "temperature 1, AdamW) with a constant learning rate, on CPU in fp32, as in the first study.",
    "cells": {
        "long": dict(_RAMBLE, reward_offset=0.0),
        "long_offset": dict(_RAMBLE, reward_offset=-0.5, invariant_seeds=[0, 1]),
        "long_right": {
            "task": "long_right",
            "token_budget": 120_000,
            "eval_every_tokens": 12_000,
            "target": None,  # the pilot rule below (learning_rates["target_rule"]), recorded in the rates file
            "reward_offset": 0.0,
        },
        "short": {
            "task": "copy",
            "token_budget": 24_000,
            "eval_every_tokens": 2_400,
            "target": 0.75,
            "reward_offset": 0.0,
        },
        "long_high_lr": dict(_RAMBLE, reward_offset=0.0, lr_factor=3.0),
    },
    "cell_notes": "long: ramble, as in the first study (long means wrong there). long_offset: ramble with every "
    "training reward minus 0.5 (failures below 0; the held-out score unchanged): every seed for the arms that are "
    "not offset-invariant (otb_ref), seeds 0 and 1 for every invariant arm, whose whole run must equal its long "
    "run (offset_check). long_right: study_task's long_right, where correct answers are long (150-240 "
    "characters) and failures mostly stop early, so that a length incentive helps. short: copy, the control. "
    "long_high_lr: ramble at three times each arm's tuned ramble rate. Budgets and evaluation spacing as in the "
    "first study. Warm starts: ramble and copy cells start from the first study's (ramble + copy); long_right "
    "from one on long_right + copy, same recipe and seeds.",
    "training_reward": {
        "quantum": 2.0**-16,
        "rule": "every cell's training reward is the task's score rounded to a multiple of 2**-16, plus the cell's "
        "reward_offset: then R and R - 0.5 are both exact in fp32, and every shift-invariant estimator gives "
        "bit-identical advantages (unrounded, fp32(s - 0.5) != fp32(s) - 0.5 for about a fifth of ramble's "
        "scores k/L, L > 32). The held-out score is the unrounded score, without offset",
    },
    "learning_rates": {
        "grid": [2e-4, 5e-4, 1e-3, 2e-3],
        "pilot_seed": 100,
        "rule": "per arm and per task (ramble, long_right, copy): the rate of the grid with the highest auc on the "
        "pilot seed (100, not a study seed) over the task's main cell (long, long_right, short: budget, "
        "evaluation and reward as there); a tie goes to the lower rate. long and long_offset use the arm's ramble "
        "rate, long_high_lr three times it",
        "file": f"benchmarks/results/{LEARNING_RATES_FILE} (written by --record-rates from the pilots' JSONs "
        "training_study2_pilot_<task>.json; the pilot runs are committed under training_study2/pilot_*)",
        "target_rule": "long_right's target: the held-out score the tuned grpo_N4 reached at two thirds of the "
        "budget in its pilot run, rounded down to a multiple of 0.05 (the first study's rule for its targets); "
        "long, long_offset, long_high_lr and short keep the first study's 0.75",
    },
    "eval_samples": 8,
    "evaluation": "the held-out score is the mean reward of 8 completions sampled at temperature 1 per held-out "
    "pattern (20 patterns: 160 samples), generator seeded by the seed; at the start, every eval_every_tokens "
    "completion tokens (at the first step end past each multiple) and at the budget. Each evaluation also records "
    "its sampling SE given the policy (study_task.sampling_se: the patterns as strata); the collapse rule's noise "
    "floor is the SE of the final score, per run and its median per cell",
    "metrics": PREREGISTRATION["metrics"],
    "collapse": PREREGISTRATION["collapse"],
    "references": ["grpo_N4", "grpo_unscaled_N4", "otb_ref"],
    "analysis": "per cell, 10 paired seeds per arm; per metric (tokens_to_target, auc, final) and for every arm "
    "against each reference (TRL's default GRPO grpo_N4, unscaled GRPO, otb_ref): the per-seed difference arm "
    "minus reference over the seeds where both finished, its mean with a paired percentile bootstrap 95% interval "
    "(10,000 resamples of the seeds, generator seed 0); 'worse' on auc means the interval lies below 0. Collapse: "
    "the rate per arm with a Wilson 95% interval. long_offset: the offset-dependent arms' runs there are compared "
    "with the invariant arms' long runs, which equal theirs under the offset by the law (checked on 2 seeds)",
    "per_step": "grad_norm (before clipping), the reward's std, completion lengths (mean, min, max, mean of "
    "terminated ones), OTB's advantage std, and study/lone_token_frac: the share of valid completion tokens at "
    "positions where no other member of the group is active (where a fallback baseline applies), computed in the "
    "harness from the gathered batch for every arm",
    "offset_check": "for each offset-invariant arm and each of long_offset's invariant_seeds, the whole run equals "
    "its long run: the held-out curve (tokens, score, SE), the tokens, every logged step value except the reward "
    "(which is the long run's + the offset, exactly) and the parameters' movement, bit for bit. A failure stops "
    "the study's command with an error; for otb_ref the difference is reported",
    "decision_cells": ["long", "long_right", "short", "long_high_lr"],
    "decision_rule": "the default becomes the shift-invariant OTB candidate (CANDIDATES' two and the scaled one) "
    "with the highest mean auc over long and long_right, provided that in no decision cell (long, long_right, "
    "short, long_high_lr: long_offset's invariant runs equal long's) it is worse on auc than TRL's default GRPO "
    "(paired 95% interval below 0), and that it has the paired comparison in each. A scaled candidate may win; the "
    "default's scale_rewards then follows it. If no candidate qualifies, the default is the candidate with the "
    "lowest MSE (CANDIDATES' numbers), and the docs say plainly that OTB did not match GRPO in training. The "
    "reference rule (otb_ref) is never the default: it breaks shift invariance; it stays an option, its measured "
    "behaviour documented (decide_default)",
}
STUDY2["cost"] = {
    "estimate": "cost_plan(): the first study's median CPU seconds per run (benchmarks/results/training_study.json; "
    "long runs 50-105 CPU s by arm, short 8-14 s), an OTB candidate like otb_N4, rloo_N4 like grpo_unscaled_N4, "
    "long_right and long_offset like long, +10% for 8 evaluation samples instead of 4; a test keeps these numbers "
    "equal to cost_plan's",
    "study_runs": {"long": 90, "long_offset": 26, "long_right": 90, "short": 90, "long_high_lr": 90},
    "pilot_runs": {"ramble": 36, "long_right": 36, "copy": 36},
    "runs": 494,
    "cpu_hours": 10.05,
    "wall_hours_at_2_jobs": 5.02,
    "how": "2 runs in parallel (--jobs 2, the default) at nice -n 19, one thread each (--threads 1); each run "
    "cached as its own JSON and committed as it finishes; the same command resumes; --summary rebuilds the "
    "summary from what has finished",
    "cut_order": [
        "1. rloo_N4 outside long: 40 runs (pilots included), 2398 CPU s",
        "2. grpo_N16 outside long and long_high_lr: 30 runs, 993 CPU s",
        "3. seeds of short, from seed 9 down: 9 runs, 123 CPU s per seed",
    ],
    "budget": "about 6 hours of wall time in all, spread over sessions: the plan fits at 5.0 h on two free cores; "
    "on a shared machine, cut in the order above (cuts 1 and 2 bring it to 4.6 h)",
}


QUICK2 = {
    "seeds": [0],
    "cells": {
        "long": dict(_RAMBLE, token_budget=0, eval_every_tokens=0, target=0.5, reward_offset=0.0),
        "long_offset": dict(_RAMBLE, token_budget=0, eval_every_tokens=0, target=0.5, reward_offset=-0.5),
        "long_right": dict(
            _RAMBLE, task="long_right", token_budget=0, eval_every_tokens=0, target=0.5, reward_offset=0.0
        ),
    },
    "cell_arms": {"long_right": ["grpo_N4", f"{CANDIDATES['best']}_scaled"]},
    "invariant_arms_offset": ["grpo_N4", f"{CANDIDATES['best']}_scaled"],
    "learning_rate": 1e-3,
    "eval_samples": 2,
    "warm_start_steps": 3,
    "max_steps": 2,
}
PILOT_CELL = {"ramble": "long", "long_right": "long_right", "copy": "short"}
