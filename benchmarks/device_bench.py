"""GPU benchmarks on a real-shaped, randomly initialised model: trainer overhead and the fused head's sum pi^2 cost.

    python -m benchmarks.device_bench overhead   --out DIR   # OTBTrainer vs GRPOTrainer, 1024 and 4096 tokens
    python -m benchmarks.device_bench fused-head --out DIR   # TRL's fused LM head with and without log_sum_sq_probs
    python -m benchmarks.device_bench overhead --dry-run     # CPU, tiny shape, tiny sizes: the same code path

Both are run by ``benchmarks/device_run.sh`` (the prepared GPU run). No download: the model is built from a config
with the shapes of Qwen2.5-0.5B (default; vocabulary 151936, so the LM head is a large share of the work) or
SmolLM2-360M (``common.SHAPES``), random weights, and the byte-level tokenizer of the test suite (ids the tokenizer
does not know decode to nothing; the reward, ``common.cheap_reward``, reads token ids, not text). A random model
almost never samples EOS, so every completion runs to the length limit: a step generates exactly ``length`` tokens per
completion.

``overhead``: one process, every run a fresh model (same seed) and a fresh trainer. A short untimed run of each
trainer first warms CUDA up; then for each pair and each length, GRPOTrainer and OTBTrainer run in alternating order
(ABBA), lengths interleaved (pair 0 at every length, then pair 1, ...), so a drift of the machine hits all alike.
Reported per run: the step time (wall, CUDA synchronised at step start and end) of each timed step, and the peak
CUDA memory (``torch.cuda.max_memory_allocated``, reset before the model is built). The JSON is rewritten after every
pair, and no new pair starts when ``--budget-s`` would be exceeded.

``fused-head``: one model patched twice with ``trl.trainer.utils.add_fused_lm_head``, once with GRPOTrainer's
outputs ``("log_probs", "entropy")`` and once with OTBTrainer's ``("log_probs", "entropy", "log_sum_sq_probs")``.
Each repeat runs both variants in a fresh random order, no-grad (the rollout log-prob pass) and forward + backward
(the training pass), on B x T tokens; medians and the median per-repeat ratio.
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import random
import statistics
import time
from pathlib import Path

from benchmarks.common import SHAPES, N, build_random_model, command, sync, timed_training, write_json


def environment(device: str) -> dict:
    import torch
    import transformers
    import trl

    env = {
        "device": device,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "trl": trl.__version__,
        "python": platform.python_version(),
    }
    if device.startswith("cuda"):
        env["gpu"] = torch.cuda.get_device_name(0)
    return env


# ----------------------------------------------------------------------------------------------------------------
# Trainer overhead
# ----------------------------------------------------------------------------------------------------------------


def train_once(trainer_name, shape, length, steps, warmup, prompts_per_step, device, dtype, tokenizer, workdir, seed):
    """One training run of ``warmup + steps`` optimizer steps; returns the per-step times and the peak memory."""
    import torch

    on_cuda = device.startswith("cuda")
    if on_cuda:
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    model = build_random_model(shape, tokenizer, device, dtype, seed)
    trainer, clock = timed_training(
        trainer_name,
        model,
        tokenizer,
        prompts_per_step=prompts_per_step,
        device=device,
        print_logs=False,
        output_dir=str(Path(workdir) / f"{trainer_name}-{length}"),
        use_cpu=not on_cuda,
        bf16=dtype == torch.bfloat16,
        max_completion_length=length,
        max_steps=warmup + steps,
        learning_rate=1e-6,
        seed=seed,
        data_seed=seed,
    )
    result = {
        "trainer": trainer_name,
        "length": length,
        "steps": steps,
        "per_step_wall_s": clock.wall[warmup:],
        "step_wall_s": statistics.median(clock.wall[warmup:]),
        "peak_cuda_mb": torch.cuda.max_memory_allocated() / 2**20 if on_cuda else None,
        "gradient_checkpointing": trainer.args.gradient_checkpointing,
    }
    del trainer, model
    gc.collect()
    if on_cuda:
        torch.cuda.empty_cache()
    return result


def summarise_overhead(runs: list[dict], lengths: list[int]) -> dict:
    out = {}
    for length in lengths:
        rows = [r for r in runs if r["length"] == length]
        pairs = {}
        for r in rows:
            pairs.setdefault(r["pair"], {})[r["trainer"]] = r
        pairs = [p for _, p in sorted(pairs.items()) if len(p) == 2]
        if not pairs:
            continue
        entry = {"pairs": len(pairs)}
        for key in ("step_wall_s", "peak_cuda_mb"):
            if any(p[t][key] is None for p in pairs for t in ("grpo", "otb")):
                entry[key] = None
                continue
            ratios = [p["otb"][key] / p["grpo"][key] for p in pairs]
            entry[key] = {
                "grpo": statistics.median(p["grpo"][key] for p in pairs),
                "otb": statistics.median(p["otb"][key] for p in pairs),
                "pair_ratios": ratios,
                "median_ratio": statistics.median(ratios),
            }
        out[str(length)] = entry
    return out


def run_overhead(args) -> Path:
    import tempfile

    import torch

    from trl_otb.testing import build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer()
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    path = Path(args.out) / "device_overhead.json"
    meta = {
        "command": command("device_bench.py"),
        **environment(args.device),
        "shape": args.shape,
        "config": SHAPES[args.shape],
        "dtype": args.dtype,
        "N": N,
        "prompts_per_step": args.prompts_per_step,
        "per_device_train_batch_size": N * args.prompts_per_step,
        "lengths": args.lengths,
        "steps": args.steps,
        "warmup": args.warmup,
        "budget_s": args.budget_s,
        "reward": "common.cheap_reward (reads token ids; costs nothing)",
    }
    start = time.perf_counter()
    runs = []
    with tempfile.TemporaryDirectory() as workdir:
        common = dict(
            shape=args.shape,
            steps=args.steps,
            warmup=args.warmup,
            prompts_per_step=args.prompts_per_step,
            device=args.device,
            dtype=dtype,
            tokenizer=tokenizer,
            workdir=workdir,
            seed=args.seed,
        )
        # Untimed: one short run of each trainer (CUDA context, kernels, allocator).
        for name in ("grpo", "otb"):
            train_once(name, length=min(32, min(args.lengths)), **{**common, "steps": 1, "warmup": 0})
        meta["warmup_s"] = time.perf_counter() - start
        pair_s = {}  # length -> seconds of its last pair
        stopped = None
        for pair in range(args.pairs):
            for length in args.lengths:
                elapsed = time.perf_counter() - start
                if runs and elapsed + pair_s.get(length, 0.0) > args.budget_s:
                    stopped = (
                        f"budget: {elapsed:.0f} s spent, the last {length}-token pair took {pair_s[length]:.0f} s"
                    )
                    break
                t0 = time.perf_counter()
                order = ("grpo", "otb") if pair % 2 == 0 else ("otb", "grpo")
                for name in order:
                    r = train_once(name, length=length, **common)
                    r["pair"] = pair
                    runs.append(r)
                    mem = f"{r['peak_cuda_mb']:.0f} MB" if r["peak_cuda_mb"] is not None else "n/a"
                    print(
                        f"overhead {length:5d} tokens pair {pair} {name:4s} step {r['step_wall_s']:.3f} s, "
                        f"peak CUDA {mem}",
                        flush=True,
                    )
                pair_s[length] = time.perf_counter() - t0
                meta["wall_s"] = time.perf_counter() - start
                write_json(path, {"meta": meta, "summary": summarise_overhead(runs, args.lengths), "runs": runs})
            if stopped:
                break
    meta["stopped"] = stopped
    meta["wall_s"] = time.perf_counter() - start
    summary = summarise_overhead(runs, args.lengths)
    write_json(path, {"meta": meta, "summary": summary, "runs": runs})
    for length, s in summary.items():
        mem = s["peak_cuda_mb"]
        print(
            f"== {length} tokens, {s['pairs']} pairs: OTB/GRPO step x{s['step_wall_s']['median_ratio']:.3f}"
            + (f", peak CUDA x{mem['median_ratio']:.3f}" if mem else ""),
            flush=True,
        )
    print(f"wrote {path}")
    return path


# ----------------------------------------------------------------------------------------------------------------
# Fused head: log_sum_sq_probs on and off
# ----------------------------------------------------------------------------------------------------------------

GRPO_OUTPUTS = ("log_probs", "entropy")
OTB_OUTPUTS = ("log_probs", "entropy", "log_sum_sq_probs")


def fused_forwards(model):
    """{variant: bound fused forward}: the model patched by TRL's add_fused_lm_head with each variant's outputs."""
    from trl.trainer.utils import add_fused_lm_head

    original = model.forward
    out = {}
    for name, outputs in (("grpo", GRPO_OUTPUTS), ("otb", OTB_OUTPUTS)):
        add_fused_lm_head(model, temperature=1.0, outputs=outputs)
        out[name] = model.forward
        model.forward = original
    return out


def run_fused_head(args) -> Path:
    import torch

    from trl_otb.testing import build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer()
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    model = build_random_model(args.shape, tokenizer, args.device, dtype, args.seed)
    model.gradient_checkpointing_enable()
    model.config.use_cache = False
    forwards = fused_forwards(model)
    V = SHAPES[args.shape]["vocab_size"]
    path = Path(args.out) / "device_fused_head.json"
    meta = {
        "command": command("device_bench.py"),
        **environment(args.device),
        "shape": args.shape,
        "dtype": args.dtype,
        "batch": args.batch,
        "lengths": args.lengths,
        "repeats": args.repeats,
        "variants": {"grpo": list(GRPO_OUTPUTS), "otb": list(OTB_OUTPUTS)},
        "gradient_checkpointing": True,
    }
    rng = random.Random(args.seed)
    results = []
    start = time.perf_counter()
    for length in args.lengths:
        g = torch.Generator(device="cpu").manual_seed(args.seed)
        input_ids = torch.randint(0, V, (args.batch, length), generator=g).to(args.device)
        labels = input_ids.clone()
        labels[:, : length // 8] = -100  # a prompt part, not scored (as in the trainer)
        for mode in ("no_grad", "grad"):

            def call(name, mode=mode, input_ids=input_ids, labels=labels):
                if mode == "no_grad":
                    with torch.no_grad():
                        out = forwards[name](input_ids=input_ids, labels=labels, fused_lm_head=True)
                else:
                    out = forwards[name](input_ids=input_ids, labels=labels, fused_lm_head=True)
                    out.log_probs.sum().backward()
                    model.zero_grad(set_to_none=True)
                return out

            # The variant that asks for it really returns log sum pi^2, the other does not.
            checks = {name: call(name).log_sum_sq_probs is not None for name in forwards}
            if checks != {"grpo": False, "otb": True}:
                raise RuntimeError(f"log_sum_sq_probs returned by variant: {checks}")
            times = {name: [] for name in forwards}
            order = list(forwards)
            for _ in range(args.repeats):
                rng.shuffle(order)
                for name in order:
                    sync(args.device)
                    t0 = time.perf_counter()
                    call(name)
                    sync(args.device)
                    times[name].append(time.perf_counter() - t0)
            ratios = [o / gr for o, gr in zip(times["otb"], times["grpo"])]
            row = {
                "length": length,
                "tokens": args.batch * length,
                "mode": mode,
                "seconds": times,
                "median_s": {k: statistics.median(v) for k, v in times.items()},
                "pair_ratios": ratios,
                "median_ratio": statistics.median(ratios),
            }
            row["median_extra_ms"] = 1e3 * (row["median_s"]["otb"] - row["median_s"]["grpo"])
            results.append(row)
            print(
                f"fused head {args.batch}x{length} {mode:7s}: grpo {row['median_s']['grpo'] * 1e3:.1f} ms, "
                f"otb {row['median_s']['otb'] * 1e3:.1f} ms, x{row['median_ratio']:.3f}",
                flush=True,
            )
            meta["wall_s"] = time.perf_counter() - start
            write_json(path, {"meta": meta, "results": results})
    print(f"wrote {path}")
    return path


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["overhead", "fused-head"])
    parser.add_argument("--dry-run", action="store_true", help="CPU, tiny shape, tiny sizes (the same code path)")
    parser.add_argument("--shape", default="qwen2.5-0.5b", choices=list(SHAPES))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096], help="completion tokens")
    parser.add_argument("--pairs", type=int, default=3, help="interleaved GRPO/OTB pairs per length (overhead)")
    parser.add_argument("--steps", type=int, default=1, help="timed optimizer steps per run (overhead)")
    parser.add_argument("--warmup", type=int, default=0, help="untimed steps per run, after the global warm-up")
    parser.add_argument("--prompts-per-step", type=int, default=2, help="prompts per step (x N=4 completions)")
    parser.add_argument("--budget-s", type=float, default=300.0, help="no new overhead pair past this many seconds")
    parser.add_argument("--batch", type=int, default=8, help="sequences per call (fused-head)")
    parser.add_argument("--repeats", type=int, default=10, help="interleaved repeats (fused-head)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=os.environ.get("OUT") or "benchmarks/results")
    args = parser.parse_args()
    if args.dry_run:
        args.shape, args.device, args.dtype = "tiny-qwen2", "cpu", "fp32"
        args.lengths, args.pairs, args.steps, args.repeats, args.batch = [8, 16], 1, 1, 2, 2
    if args.device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise SystemExit("no CUDA device: run with --dry-run on a CPU (tiny shape, the same code path)")
    (run_overhead if args.what == "overhead" else run_fused_head)(args)


if __name__ == "__main__":
    main()
