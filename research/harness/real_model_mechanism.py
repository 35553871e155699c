"""Why both OTB arms settled on counting on in the real-model pilot: a pre-registered study of the first step
(issue 27's finding, its mechanism tested).

    python -m research.harness.real_model_mechanism            # every (seed, arm) not yet done, then the summary
    python -m research.harness.real_model_mechanism --summary  # the summary from the finished runs only
    python -m research.harness.real_model_mechanism --quick    # the tiny model, 1 seed (the tests)

Run it at ``nice -n 19``. Each (seed, arm) trains the real-model study's trainer (``real_model_study.make_trainer``:
the reach design's task, prompts, group size and settings) for one step from the pretrained policy, records the
step's batch (its advantages by kind of token) and the change the step made to the probability of stopping, read
teacher-forced on the held-out targets, and writes ``real_model_mechanism/<arm>-s<seed>.json``; a run already there
is not run again. Everything that decides the answer is in ``PREREGISTRATION``, committed before the first run; its
additions (``AMENDMENT_PILOT_BATCH``, ``FOLLOW_UP``, ``SECOND_FOLLOW_UP``) were each committed before their own runs.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
from pathlib import Path

from benchmarks.common import command, train_measuring_movement, write_json
from benchmarks.variance.sampling import COUNT_PREFIX, count_reward
from research.harness.real_model_preregistration import DESIGNS
from research.harness.real_model_task import count_task_reward, load_policy, prompt_text

FOLDER = "real_model_mechanism"
SUMMARY = "real_model_mechanism.json"
QUICK_FOLDER, QUICK_SUMMARY = "real_model_mechanism_quick", "real_model_mechanism_quick.json"
"""--quick writes beside the study's results, never over them."""
WINDOW = 8

PREREGISTRATION = {
    "committed": "before any run of this study; after the reach pilot (d02f9a8) and five runs of the reach study "
    "(c59a63f), whose finding it explains",
    "finding": "in the reach pilot (seed 100), at the rate 1e-5 both OTB arms went from a held-out score of 0.581 to "
    "0.500 at the first evaluation and stayed there: every sampled list counted on past n and was cut off (0.5), "
    "although the pretrained policy stops at n in 0.18 of its completions. TRL's GRPO, from the same first batch at "
    "the same rate, reached 1.000. The gradient norm at step 1 was 0.020 (OTB) against 0.178 (GRPO)",
    "why_not_the_norm": "Adam's first update of a parameter is lr * g / (|g| + eps), about lr * sign(g): it does not "
    "depend on the gradient's scale, so OTB's smaller norm does not make its first step smaller. At step 1 the arms "
    "differ in the gradient's direction only",
    "hypothesis": "H: the token-level baseline takes from OTB the signal that teaches GRPO to stop at n. In a group "
    "where one member stops at n (reward 1) and the others count on past n (0.5 each), once the member that stopped "
    "has ended, the others are alike in reward at every later position, so OTB's baseline there equals their reward "
    "and their tokens past n get advantage 0 (and 0 too where one member is alone, under zero_advantage). GRPO gives "
    "every one of those tokens the sequence's negative advantage (0.5 less the group mean), a push against "
    "continuing that falls on every position past n and raises the stop token's probability there. Without it, "
    "what is left of OTB's step (the stop decisions themselves, and the tokens before n) does not raise the "
    "probability of stopping at n",
    "design": {
        "policy": "the reach design's pretrained SmolLM2-135M-Instruct, its task, prompts, group size (4), prompts "
        "per step (2), temperature, horizon and fixed settings (real_model_study.make_trainer); full fine-tuning",
        "seeds": [200, 201, 202, 203, 204, 205],
        "seeds_why": "neither study seeds (0-7) nor the pilot's (100). A seed fixes the step's prompts and TRL's "
        "sampling, so every arm of a seed trains on the same batch (asserted)",
        "learning_rate": 1e-5,
        "learning_rate_why": "the rate at which the pilot's OTB arms settled on counting on and GRPO reached 1; at "
        "step 1 Adam's step is lr * sign(g) for every arm, so one rate compares the directions",
        "steps": 1,
        "arms": {
            "otb_default": "the study's arm (OTBConfig's defaults)",
            "otb_ref": "the study's arm (otb_tail='zero')",
            "grpo_N4": "the study's arm (TRL's default GRPO)",
            "grpo_no_past_n": "the ablation: grpo_N4's advantages with every token past n set to 0 (the tokens "
            "after the token that completes n in the completion's run 1, 2, ..., n; a completion whose run never "
            "reaches n has none), its stop token kept",
        },
        "cut": "if time runs out, the analysis uses the seeds where all four arms finished, at least 4",
    },
    "measurements": {
        "stop_log_odds": "before and after the step, teacher-forced on each held-out target n (37, 39, ..., 63): the "
        "prompt, then the list ' 4, 5, ..., n+8'; after the last token of each number k in n-8 .. n+8, the "
        "log-odds of the stop tokens (the tokenizer's and the generation config's eos) as the next token. Per "
        "target: early = mean over k = n-8 .. n-1, at = k = n, past = mean over k = n+1 .. n+8; each the mean over "
        "the targets; the change is after less before",
        "advantages": "on the step's batch: the share of sum |A| over the completion tokens that falls on tokens past "
        "n, on stop tokens (a completion's last token where it is a stop token) and on the rest; the signed sum of A "
        "over stop tokens at n (reward 1) and elsewhere; the mean A over tokens past n",
    },
    "predictions": {
        "P1": "mean over seeds of the change in stop log-odds at n: grpo_N4's is above 0, and each OTB arm's is below "
        "grpo_N4's (the pilot's first step, replicated)",
        "P2": "mean over seeds of the share of sum |A| past n: grpo_N4's is at least 5 times each OTB arm's",
        "P3": "mean over seeds: grpo_no_past_n's change in stop log-odds at n is at most half of grpo_N4's (the "
        "ablation removes at least half of GRPO's push to stop at n)",
    },
    "reading": "H is supported if P1, P2 and P3 all hold. If P1 and P2 hold and P3 fails, the tokens past n are not "
    "where GRPO's first step gets its push to stop, and H is rejected. If P1 fails, the first step does not show the "
    "pilot's split, and the mechanism is to be looked for in later steps. Each seed's values are reported beside the "
    "means, with how many seeds agree in sign",
}

AMENDMENT_PILOT_BATCH = {
    "committed": "after the runs of seeds 203 and 204 (5bef512) and before any run of seed 100 here; it adds to the "
    "pre-registration above and changes none of it",
    "why": "the finding above says the OTB arms settled 'at the first evaluation'. The pilot's per-step record "
    "(reach_pilot_lr1e-05, seed 100) shows when and on what: at step 1 no completion stopped at n (mean reward "
    "0.472, half the groups tied), so the step's only signal was a completion that stopped early scoring below "
    "those that counted on; from step 2 every OTB completion ran to the 256-token limit and every group tied, so "
    "no gradient followed, while 0.62 of GRPO's step-2 completions reached the limit. Seeds 200-205 draw batches "
    "in which completions do stop at n (3 in seed 203's, 2 in seed 204's), which tests H but not the pilot's "
    "situation. This amendment adds the pilot's own first batch",
    "seed": 100,
    "seed_why": "the pilot's seed: the trainer's seed fixes the step's prompts and sampling, so each arm's step is "
    "the pilot's step 1 at 1e-5; the summary shows the pilot's logged step-1 reward and gradient norm beside this "
    "run's, as the check that the batch is the same. Its runs are analysed apart from seeds 200-205",
    "predictions": {
        "P4": "each OTB arm's change in stop log-odds before n is below 0 and below grpo_N4's (the pilot's step 2: "
        "every OTB completion counted on to the limit, GRPO's did in 0.62)",
        "P5": "each OTB arm's change in stop log-odds at n is below grpo_N4's",
    },
    "reading": "if P4 holds, the settling is decided by the first step, on a batch whose one signal is an early "
    "stop: OTB's first step lowers stopping where GRPO's lowers it less or not at all. The allocation of the "
    "batch's advantages is read beside it, as description",
}
FOLLOW_UP = {
    "committed": "after the study and its amendment had run (b0772d5) and before any run of this follow-up; it adds to "
    "both and changes neither",
    "finding": "on the two batches in which no completion stopped at n (seeds 100 and 202), OTB's first step lowered "
    "the stop log-odds at n by 2.56 and 2.32 where GRPO's moved them by +0.51 and -0.55 (not pre-registered: read "
    "from the study's runs). Once stopping is cut that far every completion runs to the limit and every group ties",
    "candidates": {
        "C1_energy": "the energy weighting: an improbable (erroneous, low-reward) completion carries more energy and "
        "pulls the token baseline toward its reward, so where every member is active the advantages no longer sum "
        "to zero and the members' shared behaviour (counting on) gets a net push",
        "C2_adam": "Adam's first step (about lr * sign(g)) turns OTB's gradient, about 9 times smaller in norm and "
        "concentrated on a few tokens, into a step as large as GRPO's",
    },
    "design": {
        "seeds": [100, 202],
        "arms": {
            "otb_uniform": "otb_default with otb_proxy='uniform' (every token's energy 1: the baseline is the plain "
            "mean of the active members, zero-sum where all are active), Adam at 1e-5",
            "otb_sgd": "otb_default with optim='sgd' (no momentum) at learning rate 1.0",
            "grpo_sgd": "grpo_N4 with optim='sgd' at learning rate 1.0",
        },
        "sgd_why": "an SGD step is lr * g: it keeps the gradient's direction and norm, which Adam's first step does "
        "not; 1.0 makes it move the weights by an L1 of the order of Adam's at 1e-5. Clipping at max_grad_norm 1.0 "
        "does not bind (the norms are 0.02 to 0.2 here). The study's otb_default and grpo_N4 runs of these seeds "
        "are the Adam arms (same trainer, seed and batch)",
        "measurements": "as in the study: the change in stop log-odds before, at and past n, and the movement",
    },
    "predictions": {
        "F1": "C1 holds if otb_uniform's change at n is above otb_default's on both seeds and at least half-way to "
        "grpo_N4's on both (mean over the two seeds is also reported)",
        "F2": "C2 holds if otb_sgd's change at n is at least 0, or at least grpo_sgd's, on both seeds",
    },
    "reading": "each candidate is read alone; both may hold, or neither (then the mechanism is elsewhere)",
}
FOLLOW_UP_ARMS = {
    "otb_uniform": ("otb_default", {"otb_proxy": "uniform"}, 1e-5),
    "otb_sgd": ("otb_default", {"optim": "sgd"}, 1.0),
    "grpo_sgd": ("grpo_N4", {"optim": "sgd"}, 1.0),
}
"""Each follow-up arm: the study arm whose configuration it takes, what it changes, and its learning rate."""
SECOND_FOLLOW_UP = {
    "committed": "after the follow-up had run (128763a: C1, the energy weighting, held; C2, Adam, did not) and before "
    "any run of this one; it adds to the study and both its additions and changes none of them",
    "finding": "with every token's energy 1, OTB's first step on the two no-stop batches moved the stop log-odds at "
    "n as GRPO's did; with the energies it cut them by 2.56 and 2.32. Where every member is active OTB's advantages "
    "sum to zero under the energy weights, not unweighted (tests/core/test_otb.py)",
    "question": "which OTB options keep the effect, so that a user knows whether one avoids it",
    "candidates": {
        "D1_self": "the scored member's own reward and energy in its baseline: a high-energy member with a low "
        "reward pulls its own baseline toward its reward, so its step against the error is weak (in the hand example "
        "of tests/core/test_otb.py, -0.069 against GRPO's -0.225). Leave-one-out removes exactly that term",
        "D2_granularity": "the per-token baseline: OGB weights the group's rewards by each member's total energy, "
        "one baseline per member, and is not zero-sum either",
    },
    "design": {
        "seeds": [100, 202],
        "arms": {
            "otb_loo": "otb_default with otb_leave_one_out=True, Adam at 1e-5",
            "ogb": "otb_default with advantage_estimator='ogb' (scale_rewards follows it: 'none'), Adam at 1e-5",
        },
        "by_hand": "on the hand example (three members counting on at reward 0.5 and energy 0.1, one error at 0.2 "
        "and energy 1) leave-one-out gives the three +0.25 each and the error -0.30 (the default: +0.231 and -0.069; "
        "GRPO unscaled: +0.075 and -0.225); OGB on one token is the default. Neither is zero-sum, so the hand "
        "example does not decide the direction of the step",
        "measurements": "as in the follow-up: the change in stop log-odds at n (and before and past n) and the "
        "movement; the study's otb_default and grpo_N4 runs of these seeds are the comparison arms",
    },
    "predictions": {
        "G1": "D1 holds if otb_loo's change at n is above otb_default's on both seeds and at least half-way to "
        "grpo_N4's on both",
        "G2": "D2 (OGB keeps the effect) holds if ogb's change at n is below grpo_N4's on both seeds by at least half "
        "of otb_default's distance below grpo_N4's",
    },
    "reading": "G1 holding: leave-one-out is an option that avoids the effect; failing: the effect is the energy "
    "weighting with or without the member's own terms. G2 holding: OGB shares it; failing: it needs the per-token "
    "baseline. Each is read alone",
}
SECOND_FOLLOW_UP_ARMS = {
    "otb_loo": ("otb_default", {"otb_leave_one_out": True}, 1e-5),
    "ogb": ("otb_default", {"advantage_estimator": "ogb"}, 1e-5),
}
"""Each second follow-up arm: the study arm whose configuration it takes, what it changes, and its learning rate."""
PILOT_RUNS = "real_model_study/reach_pilot_lr1e-05"
"""The pilot runs at 1e-5, whose step 1 the amendment's seed repeats."""

QUICK = {
    "model": "tiny",
    "seeds": [2],  # a seed whose batch has a reward that differs (most of the tiny model's batches tie)
    "train_targets": [3],  # the prefix reaches 3: a completion scores 1 without a digit and 0.5 with one
    "held_out_targets": [12],
    "max_completion_length": 16,
    "learning_rate": 1e-3,
}
ARMS = {"otb_default": "otb_default", "otb_ref": "otb_ref", "grpo_N4": "grpo_N4", "grpo_no_past_n": "grpo_N4"}
"""Each arm's configuration in the real-model study's design."""


# ----------------------------------------------------------------------------------------------------------------
# Measurements
# ----------------------------------------------------------------------------------------------------------------


def stop_ids(model, tok) -> list[int]:
    """The tokens that end a completion: the tokenizer's eos and the generation config's."""
    ids = model.generation_config.eos_token_id
    ids = [] if ids is None else [ids] if isinstance(ids, int) else list(ids)
    return sorted({*ids, tok.eos_token_id})


def stop_log_odds(model, tok, targets: list[int], window: int = WINDOW) -> dict:
    """Per held-out target n, the log-odds of stopping right after each number k = n - window .. n + window of the
    correct list, teacher-forced: ``{n: {k: log(p / (1 - p))}}`` with p the summed probability of the stop tokens.
    Numbers below 4 are in the prefix and left out."""
    import torch

    stops = stop_ids(model, tok)
    out = {}
    was_training = model.training
    model.eval()
    for n in targets:
        ks = [k for k in range(n - window, n + window + 1) if k >= 4]
        prompt = prompt_text(tok, n)
        text, ends = prompt, []
        for k in range(4, ks[-1] + 1):
            text += f" {k}"
            ends.append((k, text))
            text += ","
        full = tok(ends[-1][1], add_special_tokens=False)["input_ids"]
        positions = {}
        for k, upto in ends:
            if k in ks:
                ids = tok(upto, add_special_tokens=False)["input_ids"]
                assert full[: len(ids)] == ids, f"the list's tokens after {k} are not a prefix of the whole list's"
                positions[k] = len(ids) - 1
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([full])).logits[0].float()
        logp = torch.log_softmax(logits, dim=-1)
        values = {}
        for k, pos in positions.items():
            p_stop = torch.logsumexp(logp[pos, stops], dim=0)
            values[k] = float(p_stop - torch.log1p(-p_stop.exp().clamp(max=1 - 1e-7)))
        out[n] = values
    model.train(was_training)
    return out


def windows(log_odds: dict) -> dict:
    """early (k < n), at (k = n) and past (k > n): each the mean over the targets of its per-target mean."""
    parts = {"early": [], "at": [], "past": []}
    for n, values in log_odds.items():
        n = int(n)
        parts["early"].append(statistics.fmean(v for k, v in values.items() if int(k) < n))
        parts["at"].append(values[n] if n in values else values[str(n)])
        parts["past"].append(statistics.fmean(v for k, v in values.items() if int(k) > n))
    return {name: statistics.fmean(v) for name, v in parts.items()}


def past_n_start(ids: list[int], n: int, decode) -> int | None:
    """The index of the completion token that completes n in the run 1, 2, ..., n (COUNT_PREFIX holds 1 to 3), or
    None where the run never reaches n. The run reaches n exactly where count_reward is at least 0.5: below n it is
    (run / n) halved, or not halved only for a run that reaches n."""
    for t in range(len(ids)):
        if count_reward(COUNT_PREFIX + decode(ids[: t + 1]), n) >= 0.5:
            return t
    return None


def token_classes(batch: dict, ns: list[int], stops: list[int], decode):
    """Boolean ``[B, T]`` masks of the batch's completion tokens: ``stop`` (a completion's last token where it is a
    stop token), ``past`` (after the token that completes n, the stop token excepted) and ``rest``; and each row's
    reward."""
    import torch

    ids, mask = batch["completion_ids"], batch["completion_mask"].bool()
    stop, past = torch.zeros_like(mask), torch.zeros_like(mask)
    rewards = []
    for i, n in enumerate(ns):
        row = ids[i][mask[i]].tolist()
        length = len(row)
        if length and row[-1] in stops:
            stop[i, length - 1] = True
        text_ids = [t for t in row if t not in stops]
        start = past_n_start(text_ids, n, decode)
        if start is not None:
            past[i, start + 1 : length] = True
        rewards.append(count_task_reward([decode(text_ids)], [n])[0])
    past &= ~stop & mask
    return {"stop": stop, "past": past, "rest": mask & ~stop & ~past}, rewards


def advantage_allocation(advantages, classes: dict, rewards: list[float]) -> dict:
    """Where the batch's advantages lie: each class's share of sum |A|, the signed sums over stop tokens at n (reward
    1) and elsewhere, and the mean A over tokens past n."""
    import torch

    a = advantages.float()
    total = sum(float(a[m].abs().sum()) for m in classes.values())
    correct = torch.tensor([r == 1.0 for r in rewards])[:, None] & classes["stop"]
    past = classes["past"]
    return {
        **{f"share_{name}": (float(a[m].abs().sum()) / total if total else 0.0) for name, m in classes.items()},
        "stop_at_n_sum": float(a[correct].sum()),
        "stop_elsewhere_sum": float(a[classes["stop"] & ~correct].sum()),
        "past_mean": float(a[past].mean()) if past.any() else 0.0,
        "tokens": {name: int(m.sum()) for name, m in classes.items()},
        "abs_sum": total,
    }


# ----------------------------------------------------------------------------------------------------------------
# One run
# ----------------------------------------------------------------------------------------------------------------


def run_one(job: dict, on_trainer=lambda trainer: None) -> dict:
    """One step of one arm from the pretrained policy: the batch's advantages by class and the stop log-odds before
    and after; ``on_trainer`` is called with the trainer before it trains (first_batches.py reads its settings)."""
    import torch

    from research.harness.real_model_study import make_trainer
    from trl_otb import OTBTrainer

    torch.set_num_threads(job["threads"])
    model, tok = load_policy(job["model"])
    stops = stop_ids(model, tok)

    def decode(ids):
        return tok.decode(ids, skip_special_tokens=True)

    before = stop_log_odds(model, tok, job["task"]["held_out_targets"])
    record = {}

    class StepOne(OTBTrainer):
        def _generate_and_score_completions(self, inputs):
            batch = super()._generate_and_score_completions(inputs)
            ns = [int(x["n"]) for x in inputs]
            classes, rewards = token_classes(batch, ns, stops, decode)
            if job["arm"] == "grpo_no_past_n":
                batch["advantages"] = batch["advantages"] * (~classes["past"]).to(batch["advantages"].dtype)
            record.update(
                completion_ids=batch["completion_ids"].tolist(),
                rewards=rewards,
                lengths=batch["completion_mask"].sum(1).tolist(),
                allocation=advantage_allocation(batch["advantages"], classes, rewards),
            )
            return batch

    trainer = make_trainer(job, model, tok, count_task_reward, max_steps=1, trainer_class=StepOne)
    on_trainer(trainer)
    moved = train_measuring_movement(trainer, model, order=1)  # Adam's first step is about lr per parameter
    after = stop_log_odds(model, tok, job["task"]["held_out_targets"])
    w_before, w_after = windows(before), windows(after)
    logs = [e for e in trainer.state.log_history if "grad_norm" in e]
    return {
        **{k: job[k] for k in ("arm", "seed", "learning_rate")},
        "config_arm": job["config_arm"],
        "overrides": job.get("overrides", {}),
        "weights_moved": moved,
        "grad_norm": logs[0]["grad_norm"] if logs else None,
        "before": before,
        "after": after,
        "change": {k: w_after[k] - w_before[k] for k in ("early", "at", "past")},
        **record,
    }


# ----------------------------------------------------------------------------------------------------------------
# The analysis
# ----------------------------------------------------------------------------------------------------------------


def _by_seed(runs: list[dict]) -> dict[int, dict[str, dict]]:
    """seed -> arm -> run."""
    out = {}
    for run in runs:
        out.setdefault(run["seed"], {})[run["arm"]] = run
    return out


def _assert_one_batch(arms_of_seed: dict[str, dict], arms, seed: int) -> None:
    """Every one of ``arms`` trained on the same batch (a seed fixes it); arms on other batches cannot be compared."""
    first = arms_of_seed[next(iter(arms))]["completion_ids"]
    same = all(arms_of_seed[a]["completion_ids"] == first for a in arms)
    assert same, f"seed {seed}: the arms trained on other batches, so they cannot be compared"


def summarize(runs: list[dict], seeds_of_design=None) -> dict:
    """The pre-registered analysis over the seeds of the design (default: PREREGISTRATION's) where every arm
    finished."""
    seeds_of_design = PREREGISTRATION["design"]["seeds"] if seeds_of_design is None else seeds_of_design
    by_seed = _by_seed(runs)
    seeds = sorted(s for s, arms in by_seed.items() if set(ARMS) <= set(arms) and s in seeds_of_design)
    for s in seeds:
        _assert_one_batch(by_seed[s], ARMS, s)
    arms = {}
    for arm in ARMS:
        rows = [by_seed[s][arm] for s in seeds]
        arms[arm] = {
            "change": {k: statistics.fmean(r["change"][k] for r in rows) for k in ("early", "at", "past")}
            if rows
            else {},
            "change_per_seed": {k: [r["change"][k] for r in rows] for k in ("early", "at", "past")},
            "share_past": statistics.fmean(r["allocation"]["share_past"] for r in rows) if rows else None,
            "share_stop": statistics.fmean(r["allocation"]["share_stop"] for r in rows) if rows else None,
            "grad_norm_median": statistics.median(r["grad_norm"] for r in rows) if rows else None,
            "weights_moved_median": statistics.median(r["weights_moved"] for r in rows) if rows else None,
            "moved": all(r["weights_moved"] > 0 for r in rows),
        }
    pretrained = [windows(by_seed[s]["grpo_N4"]["before"]) for s in seeds]
    before = {k: statistics.fmean(w[k] for w in pretrained) for k in ("early", "at", "past")} if seeds else {}
    return {"seeds": seeds, "before": before, "arms": arms, "predictions": predictions(arms) if seeds else {}}


def pilot_batch(runs: list[dict], results: Path) -> dict | None:
    """The amendment: seed 100's four arms (the pilot's first batch), each arm's change, allocation and gradient
    norm, the pilot's logged step 1 beside it, and P4 and P5; None before all four have run."""
    found = {r["arm"]: r for r in runs if r["seed"] == AMENDMENT_PILOT_BATCH["seed"] and r["arm"] in ARMS}
    if set(found) != set(ARMS):
        return None
    _assert_one_batch(found, ARMS, AMENDMENT_PILOT_BATCH["seed"])
    arms = {}
    for arm, r in found.items():
        pilot = results / PILOT_RUNS / f"{ARMS[arm]}-s{AMENDMENT_PILOT_BATCH['seed']}.json"
        step = json.loads(pilot.read_text())["steps"][0] if pilot.exists() else {}
        arms[arm] = {
            "change": r["change"],
            "share_past": r["allocation"]["share_past"],
            "share_stop": r["allocation"]["share_stop"],
            "grad_norm": r["grad_norm"],
            "reward_mean": statistics.fmean(r["rewards"]),
            "pilot_grad_norm": step.get("grad_norm"),
            "pilot_reward_mean": step.get("reward"),
        }
    early = {a: arms[a]["change"]["early"] for a in ARMS}
    at = {a: arms[a]["change"]["at"] for a in ARMS}
    otb = ("otb_default", "otb_ref")
    p4 = all(early[a] < 0 and early[a] < early["grpo_N4"] for a in otb)
    p5 = all(at[a] < at["grpo_N4"] for a in otb)
    reading = "the settling is decided by the first step" if p4 else "the first step does not lower OTB's stopping"
    return {
        "seed": AMENDMENT_PILOT_BATCH["seed"],
        "arms": arms,
        "predictions": {"P4": p4, "P5": p5, "reading": reading},
    }


def _changes_at_n(runs: list[dict], arms, seeds: list[int]) -> dict | None:
    """Per arm of ``arms`` plus the study's otb_default and grpo_N4 (the Adam arms of the same batches), the change at
    n and the movement on each of ``seeds`` (``{"seeds", "change_at_n", "weights_moved"}``); None until every one of
    them ran on every seed."""
    by_seed = _by_seed(runs)
    needed = sorted({*arms, "otb_default", "grpo_N4"})
    if any(not set(needed) <= set(by_seed.get(s, {})) for s in seeds):
        return None
    for s in seeds:
        _assert_one_batch(by_seed[s], needed, s)
    at = {a: [by_seed[s][a]["change"]["at"] for s in seeds] for a in needed}
    return {
        "seeds": seeds,
        "change_at_n": at,
        "weights_moved": {a: [by_seed[s][a]["weights_moved"] for s in seeds] for a in needed},
    }


def follow_up(runs: list[dict]) -> dict | None:
    """FOLLOW_UP's reading on its seeds where every follow-up arm and the study's otb_default and grpo_N4 ran: each
    arm's change at n per seed, and F1 and F2; None before then."""
    found = _changes_at_n(runs, FOLLOW_UP_ARMS, FOLLOW_UP["design"]["seeds"])
    if found is None:
        return None
    at = found["change_at_n"]
    f1 = all(u > d and u - d >= 0.5 * (g - d) for u, d, g in zip(at["otb_uniform"], at["otb_default"], at["grpo_N4"]))
    f2 = all(o >= 0 or o >= g for o, g in zip(at["otb_sgd"], at["grpo_sgd"]))
    return found | {"F1": f1, "F2": f2}


def second_follow_up(runs: list[dict]) -> dict | None:
    """SECOND_FOLLOW_UP's reading on its seeds where both its arms and the study's otb_default and grpo_N4 ran: each
    arm's change at n per seed, and G1 and G2; None before then."""
    found = _changes_at_n(runs, SECOND_FOLLOW_UP_ARMS, SECOND_FOLLOW_UP["design"]["seeds"])
    if found is None:
        return None
    at = found["change_at_n"]
    d, g = at["otb_default"], at["grpo_N4"]
    g1 = all(x > o and x - o >= 0.5 * (h - o) for x, o, h in zip(at["otb_loo"], d, g))
    g2 = all(x < h and h - x >= 0.5 * (h - o) for x, o, h in zip(at["ogb"], d, g))
    return found | {"G1": g1, "G2": g2}


def predictions(arms: dict) -> dict:
    """P1, P2, P3 as pre-registered, each held or not, and the reading."""
    at = {a: arms[a]["change"]["at"] for a in ARMS}
    share = {a: arms[a]["share_past"] for a in ARMS}
    p1 = at["grpo_N4"] > 0 and at["otb_default"] < at["grpo_N4"] and at["otb_ref"] < at["grpo_N4"]
    p2 = all(share["grpo_N4"] >= 5 * share[a] for a in ("otb_default", "otb_ref"))
    p3 = at["grpo_no_past_n"] <= 0.5 * at["grpo_N4"]
    if p1 and p2 and p3:
        reading = "H supported"
    elif not p1:
        reading = "the first step does not show the pilot's split: look in later steps"
    elif not p3:
        reading = "H rejected: the tokens past n are not where GRPO's first step gets its push to stop"
    else:
        reading = "not decided: P2 failed (OTB's advantages past n are not small against GRPO's)"
    return {"P1": p1, "P2": p2, "P3": p3, "reading": reading}


# ----------------------------------------------------------------------------------------------------------------
# The command
# ----------------------------------------------------------------------------------------------------------------


def jobs(args) -> list[dict]:
    design = DESIGNS["reach"]
    task = dict(design["task"])
    lr = PREREGISTRATION["design"]["learning_rate"]
    if args.quick:
        task.update({k: QUICK[k] for k in ("train_targets", "held_out_targets", "max_completion_length")})
        lr = QUICK["learning_rate"]
    model = QUICK["model"] if args.quick else "embedded"
    common = dict(design="reach", cell="mechanism", learning_rate=lr, task=task, model=model, threads=args.threads)
    common["workdir"] = str(args.workdir)
    out = []
    for seed in args.seeds:
        for arm, config_arm in ARMS.items():
            if not (args.out / args.folder / f"{arm}-s{seed}.json").exists():
                out.append({**common, "arm": arm, "config_arm": config_arm, "seed": seed})
    for seed in args.follow_up_seeds:
        for arm, (config_arm, overrides, rate) in (FOLLOW_UP_ARMS | SECOND_FOLLOW_UP_ARMS).items():
            if not (args.out / args.folder / f"{arm}-s{seed}.json").exists():
                rate = QUICK["learning_rate"] if args.quick else rate
                job = {**common, "arm": arm, "config_arm": config_arm, "seed": seed, "learning_rate": rate}
                out.append(job | {"overrides": overrides})
    return out


def main(argv=None):
    import tempfile

    parser = argparse.ArgumentParser(
        prog="python -m research.harness.real_model_mechanism", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--quick", action="store_true", help="the tiny model, 1 seed (the tests)")
    parser.add_argument("--summary", action="store_true", help="only the summary from the finished runs")
    parser.add_argument("--seeds", nargs="+", type=int, default=None)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--follow-up", nargs="*", type=int, default=None, help="the follow-ups' seeds (default: their own)"
    )
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args(argv)
    args.folder = QUICK_FOLDER if args.quick else FOLDER
    design_seeds = PREREGISTRATION["design"]["seeds"] + [AMENDMENT_PILOT_BATCH["seed"]]
    args.seeds = args.seeds or (QUICK["seeds"] if args.quick else design_seeds)
    args.follow_up_seeds = args.follow_up if args.follow_up is not None else FOLLOW_UP["design"]["seeds"]
    args.follow_up_seeds = QUICK["seeds"] if args.quick else args.follow_up_seeds
    with tempfile.TemporaryDirectory() as workdir:
        args.workdir = workdir
        todo = [] if args.summary else jobs(args)
        print(f"{len(todo)} runs to do", flush=True)
        for job in todo:
            write_json(args.out / args.folder / f"{job['arm']}-s{job['seed']}.json", run_one(job))
            print(f"done {job['arm']} seed {job['seed']}", flush=True)
            gc.collect()  # each run holds a model, a trainer and Adam's state: free them before the next
    runs = [json.loads(p.read_text()) for p in sorted((args.out / args.folder).glob("*.json"))]
    summary = {
        "meta": {"command": command("research.harness.real_model_mechanism", argv), "quick": args.quick},
        "preregistration": PREREGISTRATION,
    }
    summary["amendment"] = AMENDMENT_PILOT_BATCH
    summary |= summarize(runs, QUICK["seeds"] if args.quick else None)
    summary["pilot_batch"] = pilot_batch(runs, args.out)
    summary["follow_up_preregistration"] = FOLLOW_UP
    summary["follow_up"] = follow_up(runs)
    summary["second_follow_up_preregistration"] = SECOND_FOLLOW_UP
    summary["second_follow_up"] = second_follow_up(runs)
    write_json(args.out / (QUICK_SUMMARY if args.quick else SUMMARY), summary)
    print(json.dumps({k: summary[k] for k in ("seeds", "predictions")}, indent=1))


if __name__ == "__main__":
    main()
