"""Held-out score against completion tokens consumed: OTB N=4, GRPO N=4 and GRPO N=16, over seeds.

    python -m benchmarks.sample_efficiency --quick                          # tiny random model, CPU, seconds
    python -m benchmarks.sample_efficiency --model embedded --task math     # embedded SmolLM2, math, accuracy
    python -m benchmarks.sample_efficiency --cpu-run                        # the CPU run of docs/benchmarks.md
    bash benchmarks/device_run.sh                                           # the GPU run (random-init, real shape)

Every arm trains on the same prompts per step (``--prompts-per-step``), so GRPO N=16 consumes four times the
completion tokens of an N=4 arm per step; the x-axis is what each arm actually generated (the sum of completion
lengths seen by the reward function). Every ``--eval-every`` steps, or each time another ``--eval-tokens``
tokens have been consumed, the policy is scored greedily on held-out prompts; ``--token-budget`` ends an arm once it
has consumed that many tokens, so that every arm gets the same budget. The held-out prompts are fixed by
``--data-seed`` and are the same for every arm and seed. The question is the paper's claim: does OTB at N=4 reach a
score with fewer tokens than GRPO at N=16? ``summary`` in the JSON answers it for ``--target``: for each run, the
tokens at which the held-out score first reaches the target (linear interpolation between evaluations), and per arm
the median and range over seeds.

Tasks: ``math`` is the generated math dataset with the accuracy reward (needs a model that can already do some
arithmetic: the embedded SmolLM2). ``digits`` is learnable from a random initialisation (a machine without the
Hub has no pretrained weights): the prompt names a digit, the reward is the share of the completion's first
``--digits-len`` characters equal to it, and the held-out score is that reward on unseen prompt wordings.

Models: ``tiny`` (the test suite's 2-layer Llama), ``embedded`` (SmolLM2-135M-Instruct), ``random-smollm2``
(SmolLM2-135M's shapes, random init, byte-level tokenizer: runs anywhere, meant for a GPU).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from pathlib import Path

import torch

from benchmarks.common import (
    CountingReward,
    build_random_model,
    command,
    pyplot,
    save_figure,
    tokens_to_target,
    write_json,
)

ARMS = {"otb_N4": ("otb", 4), "grpo_N4": ("grpo", 4), "grpo_N16": ("grpo", 16)}
DIGIT_TEMPLATES_TRAIN = ("Write the digit {d} many times.", "Repeat {d}.", "Say {d} again and again.")
DIGIT_TEMPLATES_TEST = ("Output {d} repeatedly.", "Only write {d}.")


def model_and_tokenizer(name: str, seed: int = 0):
    """(model, tokenizer) of ``--model``: the test suite's tiny Llama, the embedded SmolLM2, or its shapes at random."""
    if name == "embedded":
        from trl_otb.demo.models import load_model_and_tokenizer

        return load_model_and_tokenizer(dtype=torch.float32)
    from trl_otb.testing import build_tiny_model, build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer()
    if name == "tiny":
        model = build_tiny_model(len(tokenizer), tokenizer.eos_token_id)
    else:  # random-smollm2: SmolLM2-135M's architecture, random weights, the tokenizer's vocabulary
        model = build_random_model("smollm2-135m-layers", tokenizer, seed=seed, vocab_size=len(tokenizer))
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer


def build_task(task: str, num_train: int, num_test: int, seed: int, digits_len: int):
    """(train Dataset, test rows, reward function)."""
    from datasets import Dataset

    if task == "math":
        from trl_otb.demo.data import load_math_dataset
        from trl_otb.demo.rewards import accuracy_reward

        data = load_math_dataset(num_train=num_train, num_test=num_test, seed=seed)
        return data["train"], list(data["test"]), accuracy_reward
    rng = random.Random(seed)

    def rows(templates, n):
        out = []
        for _ in range(n):
            d = str(rng.randrange(10))
            out.append({"prompt": [{"role": "user", "content": rng.choice(templates).format(d=d)}], "answer": d})
        return out

    def digit_reward(completions, answer, **kwargs):
        texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
        return [sum(ch == a for ch in t[:digits_len]) / digits_len for t, a in zip(texts, answer)]

    return (
        Dataset.from_list(rows(DIGIT_TEMPLATES_TRAIN, num_train)),
        rows(DIGIT_TEMPLATES_TEST, num_test),
        digit_reward,
    )


@torch.no_grad()
def evaluate(model, tokenizer, rows, reward_fn, max_new_tokens, batch_size=32):
    """Mean reward of greedy completions on held-out rows."""
    model.eval()
    tokenizer.padding_side = "left"
    device = next(model.parameters()).device
    scores = []
    for start in range(0, len(rows), batch_size):
        batch = rows[start : start + batch_size]
        texts = [tokenizer.apply_chat_template(r["prompt"], tokenize=False, add_generation_prompt=True) for r in batch]
        enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(device)
        out = model.generate(
            **enc, do_sample=False, max_new_tokens=max_new_tokens, pad_token_id=tokenizer.pad_token_id
        )
        completions = tokenizer.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
        scores += [float(s or 0.0) for s in reward_fn(completions, answer=[r["answer"] for r in batch])]
    model.train()
    return sum(scores) / len(scores)


def summarize(runs: list[dict], target: float) -> dict:
    """Per arm: tokens to reach ``target`` per seed, their median and range, and the final scores."""
    out = {}
    for arm in dict.fromkeys(r["arm"] for r in runs):
        mine = sorted((r for r in runs if r["arm"] == arm), key=lambda r: r["seed"])
        reached = {r["seed"]: tokens_to_target(r["curve"], target) for r in mine}
        hits = sorted(t for t in reached.values() if t is not None)
        finals = [r["curve"][-1]["score"] for r in mine]
        out[arm] = {
            "tokens_to_target": reached,
            "reached": f"{len(hits)}/{len(mine)}",
            # the median counts a run that never reached the target as +inf (it is then None if most did not)
            "median_tokens": _median([t if t is not None else float("inf") for t in reached.values()]),
            "min_tokens": hits[0] if hits else None,
            "max_tokens": hits[-1] if hits else None,
            "final_score": {"median": _median(finals), "min": min(finals), "max": max(finals)},
            "tokens_consumed": _median([r["curve"][-1]["tokens"] for r in mine]),
            "steps": _median([r["curve"][-1]["step"] for r in mine]),
            "seconds": _median([r["seconds"] for r in mine]),
        }
    return out


def _median(values):
    """The median, None when it is infinite (most runs never reached the target)."""
    m = statistics.median(values)
    return None if m == float("inf") else m


def run_arm(arm: str, seed: int, args) -> dict:
    from transformers import TrainerCallback, set_seed

    from trl_otb import OTBConfig, OTBTrainer

    if args.threads:
        torch.set_num_threads(args.threads)
    estimator, N = ARMS[arm]
    set_seed(seed)
    model, tokenizer = model_and_tokenizer(args.model, seed)
    data_seed = seed if args.data_seed is None else args.data_seed
    train, test, reward_fn = build_task(args.task, args.num_train, args.num_test, data_seed, args.digits_len)
    counted = CountingReward(reward_fn)
    curve = []

    class Eval(TrainerCallback):
        def on_step_end(self, a, state, control, model=None, **k):
            done = bool(args.token_budget) and counted.tokens >= args.token_budget
            if args.eval_tokens:
                due = counted.tokens // args.eval_tokens > curve[-1]["tokens"] // args.eval_tokens
            else:
                due = state.global_step % args.eval_every == 0
            if due or done or state.global_step >= a.max_steps:
                score = evaluate(model, tokenizer, test, reward_fn, args.max_completion_length)
                curve.append({"step": state.global_step, "tokens": counted.tokens, "score": score})
                print(f"  {arm} seed {seed} step {state.global_step}: tokens {counted.tokens} score {score:.3f}")
            if done:
                control.should_training_stop = True

    config = OTBConfig(
        output_dir=str(Path(args.workdir) / f"{arm}-{seed}"),
        advantage_estimator=estimator,
        num_generations=N,
        per_device_train_batch_size=N * args.prompts_per_step,
        max_completion_length=args.max_completion_length,
        max_steps=args.steps,
        learning_rate=args.learning_rate,
        loss_type="dapo",
        scale_rewards="none",
        beta=0.0,
        temperature=1.0,
        use_cpu=not torch.cuda.is_available(),
        bf16=torch.cuda.is_available(),
        gradient_checkpointing=False,
        report_to="none",
        logging_steps=max(1, args.eval_every),
        save_strategy="no",
        seed=seed,
        disable_tqdm=True,
    )
    start_score = evaluate(model, tokenizer, test, reward_fn, args.max_completion_length)
    curve.append({"step": 0, "tokens": 0, "score": start_score})
    print(f"  {arm} seed {seed} step 0: score {start_score:.3f}", flush=True)
    trainer = OTBTrainer(model, reward_funcs=counted, args=config, train_dataset=train, processing_class=tokenizer)
    trainer.add_callback(Eval())
    start = time.perf_counter()
    trainer.train()
    return {"arm": arm, "seed": seed, "curve": curve, "seconds": time.perf_counter() - start}


def _run_job(job):
    arm, seed, args = job
    return run_arm(arm, seed, args)


def plot(runs, path, target=None):
    fig, ax = pyplot().subplots(figsize=(6, 4))
    colors = {"otb_N4": "black", "grpo_N4": "tab:blue", "grpo_N16": "tab:orange"}
    for r in runs:
        xs = [p["tokens"] for p in r["curve"]]
        ys = [p["score"] for p in r["curve"]]
        ax.plot(xs, ys, marker=".", color=colors[r["arm"]], alpha=0.7, label=f"{r['arm']} seed {r['seed']}")
    if target is not None:
        ax.axhline(target, color="grey", lw=0.8, ls=":")
    ax.set(xlabel="completion tokens consumed", ylabel="held-out score")
    ax.legend(fontsize=6)
    save_figure(fig, path)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny model, digits task, 1 seed, 2 steps (CI)")
    parser.add_argument(
        "--cpu-run",
        action="store_true",
        help="the CPU run of docs/benchmarks.md: embedded SmolLM2, math (add1), 2 prompts per step, 32 tokens, "
        "a budget of 3000 completion tokens per arm, evaluation every 500 tokens, 2 jobs of 1 thread",
    )
    parser.add_argument("--model", default="embedded", choices=["tiny", "embedded", "random-smollm2"])
    parser.add_argument("--task", default="math", choices=["math", "digits"])
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=200, help="most optimizer steps per arm")
    parser.add_argument("--token-budget", type=int, default=0, help="end an arm after this many completion tokens")
    parser.add_argument("--prompts-per-step", type=int, default=16)
    parser.add_argument("--max-completion-length", type=int, default=64)
    parser.add_argument("--digits-len", type=int, default=8)
    parser.add_argument("--learning-rate", type=float, default=1e-5)
    parser.add_argument("--eval-every", type=int, default=20, help="evaluate every this many steps")
    parser.add_argument("--eval-tokens", type=int, default=0, help="evaluate every this many tokens instead")
    parser.add_argument("--target", type=float, default=0.8, help="held-out score whose token cost is reported")
    parser.add_argument("--num-train", type=int, default=2000)
    parser.add_argument("--num-test", type=int, default=100)
    parser.add_argument("--data-seed", type=int, default=0, help="fixes train/held-out data for every run")
    parser.add_argument("--threads", type=int, default=None, help="torch threads per job")
    parser.add_argument("--jobs", type=int, default=1, help="runs in parallel (processes)")
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument("--workdir", default=None)
    args = parser.parse_args()
    if args.quick:
        args.model, args.task, args.seeds, args.steps, args.eval_every = "tiny", "digits", [0], 2, 2
        args.prompts_per_step, args.max_completion_length, args.num_train, args.num_test = 2, 12, 64, 4
        args.learning_rate = 1e-3
    if args.cpu_run:
        args.model, args.task, args.steps, args.token_budget, args.eval_tokens = "embedded", "math", 400, 3000, 500
        args.prompts_per_step, args.max_completion_length, args.learning_rate = 2, 32, 2e-5
        args.num_train, args.num_test, args.target, args.jobs, args.threads = 1000, 64, 0.9, 2, 1
    if args.jobs < 1:
        raise SystemExit("--jobs must be at least 1")
    import tempfile

    tmp = tempfile.TemporaryDirectory() if args.workdir is None else None
    args.workdir = args.workdir or tmp.name
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = "sample_efficiency_quick" if args.quick else f"sample_efficiency_{args.model}_{args.task}"
    meta = {
        "command": command("sample_efficiency.py"),
        "device": "cuda" if torch.cuda.is_available() else "cpu",
        **{k: v for k, v in vars(args).items() if k not in ("workdir", "out")},
    }
    # interleaved by seed, so that a slow phase of the machine hits every arm
    jobs = [(arm, seed, args) for seed in args.seeds for arm in args.arms]
    runs = []
    start = time.perf_counter()

    def save():
        order = {(a, s): i for i, (a, s, _) in enumerate(jobs)}
        runs.sort(key=lambda r: order[(r["arm"], r["seed"])])
        meta["wall_seconds"] = time.perf_counter() - start
        summary = summarize(runs, args.target)
        write_json(out / f"{stem}.json", {"meta": meta, "summary": summary, "runs": runs})
        return summary

    if args.jobs == 1:
        for job in jobs:
            runs.append(_run_job(job))
            save()
    else:
        import multiprocessing as mp

        with mp.get_context("spawn").Pool(args.jobs, maxtasksperchild=1) as pool:
            for run in pool.imap_unordered(_run_job, jobs):
                runs.append(run)
                save()
    summary = save()
    plot(runs, out / f"{stem}.png", args.target)
    for arm, s in summary.items():
        print(
            f"{arm}: reached {args.target} in {s['reached']} runs, median tokens {s['median_tokens']}, "
            f"final score median {s['final_score']['median']:.3f}"
        )
    print(f"wrote {out / stem}.json and .png")
    if tmp is not None:
        tmp.cleanup()


if __name__ == "__main__":
    main()
