"""The real-model study's pre-registrations (research/harness/real_model_study.py), apart from the harness.

``PREREGISTRATION`` is the first design, ``far``: count targets n = 100 to 230, which no list reaches within the
256-token horizon. It was committed before the first run (dc69327) and is kept here word for word: its
learning-rate pilot ran two runs and showed that the cell carries no signal (``AMENDMENT_REACH`` says how).
``AMENDMENT_REACH`` is the second design, ``reach``: what it changes, why, and when it was committed (before any run
of it). ``DESIGNS`` maps each design's name to its whole pre-registration (the first, or the first with the
amendment applied)."""

from __future__ import annotations

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


AMENDMENT_REACH = {
    "committed": "after the first design's learning-rate pilot had finished two of its nine runs (otb_ref at 3e-6 and "
    "1e-5, seed 100; f34a9ab) and before any training run of this design. The first design's other seven pilot runs "
    "were stopped unfinished once those two had shown what is written under 'why' (a partial pilot summary, "
    "real_model_study_pilot.json, is the record). Before this commit and after the two runs, only the pretrained "
    "policy was sampled for this design (--variance-check --design reach and --group-signal --design reach, cited "
    "under 'precondition'); no policy was trained on it",
    "why": "the first design's cell carried no signal after its first step. In both finished pilot runs (otb_ref, "
    "3e-6 and 1e-5) 98% and 100% of the completions from step 2 on ran to the 256-token limit, 0.73 and 0.82 of the "
    "groups tied on average over the steps, and the gradient norm after step 1 was at most 0.0012 and 0.0003, "
    "against 0.028 at step 1: the one lesson of the cell, not to stop early, was learnt in one step, after which a policy that counts "
    "on without error until it is cut off gives every member of a group the same reward. The held-out score reached "
    "0.210 and 0.213 by the second evaluation and stayed there, with a sampling SE of 0.002 and 0: the ceiling of a "
    "task where no list reaches n (targets 100 to 235, about 68 numbers fit in 256 tokens), so the arms could not "
    "differ. The fix keeps the model, the prompt, the reward, the horizon, the arms, the budget and the analysis, "
    "and moves the targets to where a list reaches n inside the horizon, so that what is rewarded (stopping at n: "
    "reward 1, against 0.5 for counting on past it) stays to be learnt",
    "changes": {
        "task": {
            "name": "count, reachable n (benchmarks/variance.py's count task)",
            "train_targets": list(range(36, 66, 2)),
            "held_out_targets": list(range(37, 65, 2)),
            "reachable": "counting '4, 5, ..., n' takes 4n - 18 completion tokens with SmolLM2's tokenizer (4 per "
            "two-digit number; 126 tokens at n = 36, 238 at n = 64), so every list can reach n and stop inside the "
            "256-token horizon; counting on past n is cut off at 256 tokens and scores 0.5, stopping at n scores 1, "
            "an error or an early stop scores by how far the run got (halved)",
            "reward": "count_reward(COUNT_PREFIX + completion, n), as in the first design: the share of 1..n listed "
            "in order, halved unless the list ends at n. Here a list can end at n: the pretrained policy mostly "
            "counts on past n until it is cut off (0.5), and stops at n in 0.18 of its completions (1; see "
            "'precondition'), so what is learnt is to stop at n",
        },
        "learning_rates": {
            "grid": [1e-6, 3e-6, 1e-5],
            "why": "TRL's GRPOConfig default learning rate, 1e-6, and two steps above it: in the first design's "
            "pilot, 3e-6 and 1e-5 both made the policy's one change within the first step",
        },
        "precondition": "python -m benchmarks.real_model_study --design reach --variance-check (benchmarks.variance "
        "--task count --pool 12 --horizons 256 --temperature 0.7 --count-targets 36 38 ... 64 on the pretrained "
        "policy, pools in .cache/variance_reach; 13 targets sampled, 12 kept: n = 46's pool tied) wrote "
        "real_model_study_reach_variance.json and, with --fallbacks on the same pools, "
        "real_model_study_reach_variance_fallbacks.json. At N=4 in the LM head's space, OTB/GRPO (unscaled): the "
        "reference OTB 0.31 [0.13, 0.68], the default's tail (zero_advantage, no leave-one-out) 0.28 [0.12, 0.56]: "
        "both below 0.7, with the interval below 1; completions average 219.6 tokens (>= 128). --group-signal "
        "--design reach (real_model_study_reach_group_signal.json), groups of 4 drawn from the same pools: 0.30 of "
        "the groups tie, 0.18 of the completions stop at n (reward 1), the mean reward is 0.54 and the mean "
        "within-prompt reward std 0.18, so an evaluation of 2 samples on each of the 14 held-out targets has a "
        "sampling SE of about 0.18 / sqrt(28) = 0.034 (the collapse rule's 0.2 is about 6 of them)",
        "cost": {
            "measured": "no new step measurement: the first design's measured CPU seconds per step and per "
            "evaluation (real_model_study_steps.json), with this design's 219.6 tokens per completion (the "
            "variance check's mean), through the same arithmetic (real_model_analysis.cost_plan). The steps and "
            "evaluations were measured at 240.2 tokens per completion, so this errs long. Every run records its CPU "
            "seconds, which the summary reports",
            "arithmetic": "steps per run = ceil(28000 / (4 x 2 x 219.6)) = 16; evaluations per run = 1 at the "
            "start (cached per seed) + 4; CPU s per run = 16 x step + 4 x 65.0: otb_default 1229, otb_ref 1366, "
            "grpo_N4 1255, 3850 per seed; pilot = 3 rates x 3850 = 11550; study = 8 seeds x 3850 = 30801 "
            "(unrounded); fidelity = 2 checks x 256 tokens x 1.99 = 1017; initial evaluations = 9 seeds x 65.0 = "
            "585; total 43953 CPU s = 12.21 CPU hours = 6.1 hours of wall time at 2 jobs on two free cores",
            "plan": {
                "steps_per_run": 16,
                "evaluations_per_run": 5,
                "cpu_seconds_per_run": {"otb_default": 1229, "otb_ref": 1366, "grpo_N4": 1255},
                "pilot": {"runs": 9, "cpu_seconds": 11550},
                "study": {"runs": 24, "cpu_seconds": 30801},
                "fidelity_cpu_seconds": 1017,
                "initial_evaluations_cpu_seconds": 585,
                "cpu_hours": 12.21,
                "wall_hours_at_2_jobs": 6.1,
                "seconds_per_seed": 3850,
            },
            "wall_hours_allowed": 6.1,
            "left_out": "the variance check (about 12 CPU minutes, done before this commit) and the first "
            "design's two pilot runs (43 CPU minutes), which are spent; loading the model and building the trainer",
            "how": "nice -n 19 python -m benchmarks.real_model_study --pilot (--design reach and --jobs 2 --threads "
            "1 are the defaults), then --pilot --summary (the rates and the target), then the study; each run is "
            "its own JSON, committed as it finishes; the same command resumes",
            "cut_order": "if time runs out: study seeds from 7 down, never below 6 (the analysis uses the seeds "
            "where all three arms finished); 6 seeds would take 5.0 hours",
        },
        "evaluation": "as in the first design, on this design's held-out targets: the mean count_reward of 2 "
        "completions per held-out target (14 targets: 37, 39, ..., 63, none a training target; 28 samples) sampled "
        "at temperature 0.7 (top_k 0, top_p 1) to 256 tokens with a generator seeded by 30000 + seed; at the start "
        "(the same for every arm of a seed: cached), at the first step end past each multiple of eval_every_tokens "
        "and at the budget. Each evaluation records its sampling SE given the policy (targets as strata); its "
        "median over final scores is the noise floor",
        "fidelity": {
            "what": "as in the first design: OTBConfig's in-training check on the study run itself (it reads no "
            "random numbers and touches no gradient), at steps 0 and 8 (of 16), one rollout row's exact per-token "
            "squared gradient norms over every parameter against the logit proxy, logged per step as "
            "otb/fidelity/token_spearman, token_pearson, energy_spearman, baseline_rel_diff (trivial with one row) "
            "and seconds_per_token (wall)",
        },
        "collapse_min_last_length": 63,
        "collapse": "the first design's rule, with its length part changed: a run collapses if a logged loss or "
        "gradient norm is not finite, its final held-out score is more than 0.2 below its best or below half its "
        "initial one, or the mean completion length of its last step is below 63 tokens (half of the shortest right "
        "answer, 126 tokens at n = 36). The first design's length part (below half the first step's length) would "
        "call the learnt behaviour a collapse here: a first step counting on to 256 tokens and a last step stopping "
        "right at n = 36 (126 tokens) are a drop to 0.49",
    },
}


def _amended(base: dict, amendment: dict) -> dict:
    """``base`` with the amendment's changes: a dict entry of both is updated key by key (so a change names every
    key of that entry it replaces), any other entry replaced; the amendment itself (but its changes) is kept under
    ``amendment``."""
    out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in base.items()}
    for key, value in amendment["changes"].items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = {**out[key], **value}
        else:
            out[key] = value
    out["amendment"] = {k: v for k, v in amendment.items() if k != "changes"}
    return out


DESIGNS = {"far": PREREGISTRATION, "reach": _amended(PREREGISTRATION, AMENDMENT_REACH)}
"""Each design's whole pre-registration, by name (the harness's --design)."""


RATE_FOLLOW_UP = {
    "committed": "after the reach study's 24 runs (8 seeds x 3 arms) and their summary (real_model_study_reach.json), "
    "before any run of this follow-up. Nothing of it has run: no policy has been trained with the default OTB at "
    "3e-6 on a study seed",
    "finding": "in the reach study the chosen default OTB (otb_tail='zero_advantage', at its pilot rate 1e-6) had a "
    "lower auc than the reference OTB (otb_tail='zero', at its pilot rate 3e-6) on every one of the 8 seeds: paired "
    "auc -0.101 [-0.118, -0.083], final -0.106 [-0.147, -0.061]",
    "hypothesis": "the gap is the learning rate, not the tail rule. The two arms differ in both. The one-seed pilot "
    "(seed 100) chose the default's 1e-6 over 3e-6 by an auc margin of 0.003 (0.585 against 0.582) and the "
    "reference's 3e-6 over 1e-6 by less than 0.001 (0.578 and 0.578 shown), while one evaluation's sampling SE "
    "there is about 0.04: both choices sit below the pilot's noise. At the same rate the two tails were within "
    "0.007 auc of each other in the pilot (0.585 / 0.578 at 1e-6, 0.582 / 0.578 at 3e-6). The training studies on "
    "the small model found the same of a one-seed pilot (the third study: re-tuned on four seeds, the candidates' "
    "loss in 'long' went away)",
    "arm": {"name": "otb_default_lr3e-06", "config_arm": "otb_default", "learning_rate": 3e-6},
    "arm_notes": "the reach study's otb_default (OTBConfig()'s defaults, recorded per run) at the reference's chosen "
    "rate, 3e-6, in its own cell reach_rate; everything else is the reach design's: model, task, prompts and their "
    "order per seed, TRL's sampling seed, the evaluation and its seed (30000 + seed), budget, evaluation schedule, "
    "collapse rule. A seed fixes the same randomness for every arm (the cell names only the output folder), so each "
    "run pairs with the reach study's runs of the same seed. No fidelity check (it touches no gradient; the study "
    "has one)",
    "cell": "reach_rate",
    "seeds": list(range(8)),
    "cut_order": "if time runs out: seeds from 7 down, never below 6 for the intervals (the analysis uses the seeds "
    "where this arm finished; with fewer than 6, the means only and no verdict)",
    "comparisons": {
        "primary": ["otb_default_lr3e-06", "otb_ref"],
        "secondary": ["otb_default_lr3e-06", "otb_default"],
        "against_grpo": ["otb_default_lr3e-06", "grpo_N4"],
    },
    "analysis": "the reach study's: per seed the difference in auc, final and tokens_to_target, its mean with a "
    "paired percentile bootstrap 95% interval (10,000 resamples of the seeds, generator seed 0) from 6 paired seeds; "
    "collapse counts with Wilson intervals. The other arms' runs are the reach study's (reach_main), unchanged",
    "decision": "on auc. 'the rate': the primary interval contains 0 and the secondary interval lies above 0 (at the "
    "reference's rate the default trains as the reference does, and better than at its own pilot rate). 'the tail': "
    "the primary interval lies below 0 (at the same rate the default's tail still trains worse). Otherwise "
    "'undecided', with the intervals reported. The against-GRPO comparison is reported, not decided on: it answers "
    "whether the default at a better rate trains differently from TRL's GRPO",
    "cost": "the reach study's otb_default and otb_ref runs took 1,430 to 2,970 CPU s each (median about 1,650); 8 "
    "runs about 13,200 CPU s, 1.8 hours of wall time at 2 jobs on two free cores (6 seeds: 1.4 hours)",
    "how": "nice -n 19 python -m benchmarks.real_model_study --rate-follow-up (--jobs 2 --threads 1, the defaults); "
    "each run its own JSON under real_model_study/reach_rate/, committed as it finishes; the same command resumes; "
    "--rate-follow-up --summary writes real_model_study_reach_rate.json and .png from what has finished",
}
"""A follow-up of the reach study, its mechanism tested: is the default's loss to the reference its learning rate?"""
