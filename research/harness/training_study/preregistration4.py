"""The estimator study's pre-registration (study 4): which OTB is a good gradient estimator, judged by the direction
of its mean and its error after the best rescaling, and does the default change? Committed before any of its runs.

``STUDY4`` is the toy part (study 2's cells, multi-seed tuned rates); ``FIRST_BATCHES`` the real-model part
(SmolLM2-135M's first steps on batches with an improbable error). research/estimator_study/README.md tells it in
words; study4.py runs and summarises it.
"""

from __future__ import annotations

from research.harness.training_study.preregistration2 import STUDY2


def _otb(tail: str, leave_one_out: bool, **more) -> dict:
    arm = {"advantage_estimator": "otb", "num_generations": 4, "scale_rewards": "none", "otb_tail": tail}
    return arm | {"otb_leave_one_out": leave_one_out, **more}


ARMS4 = {
    "grpo_N4": {"advantage_estimator": "grpo", "num_generations": 4, "scale_rewards": "group"},
    "grpo_unscaled_N4": {"advantage_estimator": "grpo", "num_generations": 4, "scale_rewards": "none"},
    "otb_default": _otb("zero_advantage", False),
    "otb_loo_mean": _otb("others_mean", True),
    "otb_loo_ess": _otb("others_mean", True, otb_shrinkage="ess"),
    "ogb_N4": {"advantage_estimator": "ogb", "num_generations": 4, "scale_rewards": "none"},
}
CANDIDATES4 = ["otb_default", "otb_loo_mean", "otb_loo_ess", "ogb_N4"]
UNBIASED_BY_CONSTRUCTION = ["otb_loo_mean", "otb_loo_ess"]

STUDY4 = {
    "committed": "before any study-4 run (tuning and pre-screen included); not changed after seeing results (if it "
    "ever must be, both analyses are kept and the reason written down)",
    "question": "which OTB should be the default when estimators are judged by the direction of their mean gradient "
    "(cos with the true gradient) and by their error after the best rescaling (eps_star), not by raw MSE: today's "
    "self-inclusive default, leave-one-out OTB with the others' mean at lone tokens, or its ESS-shrunk variant",
    "finding": "study 2 chose otb_tail='zero_advantage' (self-inclusive) by a tie-break on raw gradient MSE (15.27 "
    "[10.50, 20.55] against 15.35 [10.60, 20.64]); raw MSE and the rescaled variance a^2 Var both reward bias. "
    "Self-inclusive OTB is exactly leave-one-out OTB times (1 - lambda), lambda the member's own energy share: a "
    "shrink that depends on the member's own tokens, so a bias in direction. Study 3 found study 2's loss in long "
    "came from one-seed rate choices",
    "arms": ARMS4,
    "arm_notes": "every arm at N=4 and names every option it sets, never OTBConfig's live default. grpo_N4: TRL's "
    "default GRPO (std-scaled); grpo_unscaled_N4: the unscaled group mean; otb_default: today's default "
    "(otb_tail='zero_advantage', self-inclusive); otb_loo_mean: leave-one-out OTB with the others' mean reward at "
    "positions where no other member is active (otb_tail='others_mean'), exactly unbiased by construction; "
    "otb_loo_ess: the same with the others' energy-weighted baseline shrunk toward their plain mean by its Kish "
    "effective sample size (otb_shrinkage='ess'), exactly unbiased by construction; ogb_N4: the energy-weighted "
    "sequence-level baseline (self-inclusive), a test of the gate. Every other setting is study 2's",
    "candidates": CANDIDATES4,
    "cells": {cell: STUDY2["cells"][cell] for cell in ("long", "long_right", "short", "long_high_lr")},
    "cell_notes": "study 2's four decision cells, unchanged (tasks, budgets, evaluation every tenth of the budget "
    "with 8 samples per held-out pattern, warm starts, reward quantum); long_right's target is the one study 2's "
    "rule recorded (training_study2_learning_rates.json, targets.long_right); long_high_lr runs each arm at 3 "
    "times its own tuned ramble rate",
    "seeds": list(range(10)),
    "seeds_notes": "study 2's 10 seeds: the same warm starts, patterns and order, so the runs pair across arms",
    "tuning": {
        "tasks": {"ramble": "long", "long_right": "long_right", "copy": "short"},
        "grid": [2e-4, 5e-4, 1e-3],
        "seeds": [101, 102, 103],
        "rule": "per arm and task, the grid rate with the highest mean auc over the 3 tuning seeds, on the task's "
        "main cell (long, long_right, short); a tie goes to the lower rate. If the best rate is the grid's lowest "
        "or highest, the grid is extended by the next rate of the 1-2-5 series beyond that edge (1e-4 below, 2e-3 "
        "above, and so on) for that arm and task, on the same seeds, until the best rate is inside the grid",
    },
    "outcomes": {
        "primary": "auc (the mean held-out score over the token budget), each arm minus grpo_N4, paired by seed: "
        "the mean difference with a percentile bootstrap 95% interval (10,000 resamples of the seeds, generator "
        "seed 0); 'lower'/'higher' where the interval excludes 0",
        "stuck": "a run is stuck when every group of each of its last max(3, a quarter of its) steps tied "
        "(frac_reward_zero_std = 1): the absorbing all-tied state. Reported per arm and cell, with the per-step "
        "tie share (mean frac_reward_zero_std) beside it",
        "collapse": "study 2's rule (the final held-out score 0.2 or more below the start), Wilson intervals",
        "secondary": "final score and tokens to target, paired as the primary; per-seed rows in the summary",
    },
    "prescreen": {
        "what": "the yardstick (cos with the reference gradient, scale, snr, eps_star, kappa) of every arm's "
        "estimator, from the variance tool (benchmarks.variance), on the six variance cells (ramble 256; count 256, "
        "512, 1024; math 64, 256) and on the three training tasks (study-ramble, study-long_right, study-copy), at "
        "the initial policy and at a partly trained checkpoint; written to research/estimator_study/prescreen/",
        "gate": "an OTB candidate passes if its cos is at least 0.99 at both points in every cell, or if it is "
        f"exactly unbiased by construction ({', '.join(UNBIASED_BY_CONSTRUCTION)}); cos is judged on its point "
        "estimate",
        "ranking": "the candidates that pass are ranked by eps_star at B = 4 (the groups one training step averages), "
        "the mean over cells at the initial policy",
        "prediction": "P1: over the 6 arms, in each of the 4 training cells, the Spearman correlation between "
        "-eps_star at the initial policy (the training task's pre-screen cell; long_high_lr uses ramble's) and the "
        "arm's mean auc is higher than that between -raw MSE and the mean auc, on the mean over the 4 cells. "
        "Reported whether it held, with both correlations per cell",
    },
    "decision": "the default becomes the gate-passing OTB candidate with the best auc averaged over the 4 cells, "
    "provided it has no more stuck or collapsed runs in all than grpo_N4. Falsification, named in advance: if "
    "today's self-inclusive default (otb_default) beats every gate-passing candidate beyond its paired auc interval "
    "in two or more cells, it stays the default, and the docs say that the bias helps at this scale. If no "
    "candidate qualifies, the default stays and the docs say why",
    "cost": "tuning: 6 arms x 3 tasks x 3 rates x 3 seeds = 162 runs (plus any grid extension); the study: 6 arms x 4 "
    "cells x 10 seeds = 240 runs; study 2's runs took about 50 CPU seconds each with their evaluations (long and "
    "long_right longer, short shorter): about 5.6 CPU hours, 2.8 hours of wall time at 2 jobs at nice 19",
}

FIRST_BATCHES = {
    "committed": "before any of its runs, with STUDY4",
    "question": "on the pretrained model, does the first step of each estimator lower the log-odds of stopping at n "
    "on batches whose only signal is an improbable error (no completion stops at n, at least one errs)",
    "design": "the reach design of the real-model study (SmolLM2-135M-Instruct from the embedded GGUF, fp32, every "
    "parameter trained, counting to n within 256 tokens, temperature 0.7, N=4, 2 prompts per step); first batches "
    "are drawn with seeds 300, 301, ... until 20 qualify (no completion stops at n and at least one has an "
    "error reward); each qualifying batch is trained one step by each arm from the same weights, and the stop "
    "log-odds at n (the mechanism study's measure) is read before and after on that batch's prompts",
    "arms": {
        "grpo_N4": ARMS4["grpo_N4"] | {"learning_rate": 1e-5},
        "otb_default": ARMS4["otb_default"] | {"learning_rate": 3e-6},
        "otb_loo_mean": ARMS4["otb_loo_mean"] | {"learning_rate": 3e-6},
        "otb_loo_ess": ARMS4["otb_loo_ess"] | {"learning_rate": 3e-6},
    },
    "arm_notes": "the rates of the real-model study: TRL's GRPO at its chosen 1e-5, the OTB arms at 3e-6 (the rate "
    "follow-up's); a first Adam step moves every parameter by about its rate in the sign of its gradient, so the "
    "direction of the change is the estimator's",
    "outcome": "per arm, the share of the 20 batches whose first step lowers the stop log-odds at n, with a Wilson "
    "95% interval, and the mean change",
    "optional": "if CPU time allows, the toy study's chosen candidate on the reach study's 8 seeds at a rate tuned "
    "on 3 seeds, paired with the reach study's GRPO runs; pre-registered separately before it runs",
}

_QUICK_CELL = {"token_budget": 0, "eval_every_tokens": 0, "target": 0.5, "reward_offset": 0.0}
QUICK4 = {
    "grid": [1e-3, 2e-3],
    "tuning_seeds": [1],
    "seeds": [0],
    "cells": {
        "long": dict(_QUICK_CELL, task="ramble"),
        "long_right": dict(_QUICK_CELL, task="long_right"),
        "short": dict(_QUICK_CELL, task="copy"),
        "long_high_lr": dict(_QUICK_CELL, task="ramble", lr_factor=3.0),
    },
}
