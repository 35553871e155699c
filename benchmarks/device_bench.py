"""GPU benchmarks on a real-shaped, randomly initialised model: trainer overhead, the fused head's sum pi^2 cost, and
the conclusion the two (with the estimator speed) reach.

    python -m benchmarks.device_bench overhead   --out DIR   # OTBTrainer vs GRPOTrainer, whole steps, >= 5 pairs
    python -m benchmarks.device_bench fused-head --out DIR   # TRL's fused LM head with and without log_sum_sq_probs
    python -m benchmarks.device_bench conclude   --out DIR   # device_conclusion.json from the parts' JSON files
    python -m benchmarks.device_bench overhead --dry-run     # CPU, tiny shape, tiny sizes: the same code path

All are run by ``benchmarks/device_run.sh`` (the prepared GPU run). No download: the model is built from a config
with the shapes of Qwen2.5-0.5B (default; vocabulary 151936, so the LM head is a large share of the work) or
SmolLM2-360M (``common.SHAPES``), random weights, and the byte-level tokenizer of the test suite (ids the tokenizer
does not know decode to nothing; the reward, ``common.cheap_reward``, reads token ids, not text). A random model
almost never samples EOS, so every completion runs to the length limit: a step generates exactly ``length`` tokens per
completion.

``overhead`` times whole optimizer steps (generation included). Each trainer is built once per length, on its own
model (same seed), and trains ``--warmup`` untimed steps at that length first (CUDA context, kernels, allocator, the
first generate: the warm-up is never in a pair). Then each pair runs one step of each trainer, in alternating order
(ABBA), lengths interleaved (pair 0 at every length, then pair 1, ...), so a drift of the machine hits both alike;
``trainer.train()`` runs one step per call, timed by ``common.step_clock`` (CUDA synchronised at step start and end).
Reported per step: wall time, and the peak CUDA memory the step added over what was allocated when it began
(``step_peak_extra_mb``; ``peak_cuda_mb``, the absolute peak, includes the other trainer, which stays resident). The
JSON is rewritten after every pair; no new pair starts when ``--budget-s`` would be exceeded. Generation dominates a
whole step at long lengths, so the GPU run times whole steps at a short length and the parts OTB changes at long
ones separately: the rollout pass with sum pi^2 and the loss step (``fused-head``), and the advantages
(``benchmarks.advantages_speed``).

``fused-head``: one model patched twice with ``trl.trainer.utils.add_fused_lm_head``, once with GRPOTrainer's
outputs ``("log_probs", "entropy")`` and once with OTBTrainer's ``("log_probs", "entropy", "log_sum_sq_probs")``.
Each repeat runs both variants in a fresh random order, no-grad (the rollout log-prob pass) and forward + backward
(the training pass), on B x T tokens; medians and the median per-repeat ratio.

``conclude`` reads ``device_overhead.json``, ``device_fused_head.json`` and ``device_advantages_speed.json`` from
``--out`` (whichever exist) and writes ``device_conclusion.json``: one line per measurement, and the verdict.
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


class TimedTrainer:
    """One trainer kept for the whole benchmark: built, warmed up at its length, then stepped one step at a time."""

    def __init__(self, trainer_name, shape, length, warmup, prompts_per_step, device, dtype, tokenizer, workdir, seed):
        import torch

        self.name, self.length, self.device = trainer_name, length, device
        model = build_random_model(shape, tokenizer, device, dtype, seed)
        # timed_training trains the warm-up steps (untimed: their times are dropped).
        self.trainer, self.clock = timed_training(
            trainer_name,
            model,
            tokenizer,
            prompts_per_step=prompts_per_step,
            device=device,
            print_logs=False,
            output_dir=str(Path(workdir) / f"{trainer_name}-{length}"),
            use_cpu=not device.startswith("cuda"),
            bf16=dtype == torch.bfloat16,
            max_completion_length=length,
            max_steps=warmup,
            learning_rate=1e-6,
            seed=seed,
            data_seed=seed,
        )
        self.warmup_s = list(self.clock.wall)

    def step(self) -> dict:
        """One timed optimizer step (``trainer.train()`` with ``max_steps=1``): its wall time and added peak memory."""
        import torch

        on_cuda = self.device.startswith("cuda")
        if on_cuda:
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
        self.trainer.args.max_steps = 1
        self.trainer.train()
        return {
            "trainer": self.name,
            "length": self.length,
            "step_wall_s": self.clock.wall[-1],
            "step_peak_extra_mb": (torch.cuda.max_memory_allocated() - before) / 2**20 if on_cuda else None,
            "peak_cuda_mb": torch.cuda.max_memory_allocated() / 2**20 if on_cuda else None,  # both trainers resident
        }


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
        for key in ("step_wall_s", "step_peak_extra_mb", "peak_cuda_mb"):
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
        "pairs_planned": args.pairs,
        "warmup_steps": args.warmup,
        "budget_s": args.budget_s,
        "timed": "whole optimizer steps (generation, scoring, OTB's advantages, loss, optimizer), warm-up excluded",
        "reward": "common.cheap_reward (reads token ids; costs nothing)",
    }
    start = time.perf_counter()
    runs = []
    with tempfile.TemporaryDirectory() as workdir:
        trainers = {
            (name, length): TimedTrainer(
                name,
                args.shape,
                length,
                args.warmup,
                args.prompts_per_step,
                args.device,
                dtype,
                tokenizer,
                workdir,
                args.seed,
            )  # fmt: skip
            for length in args.lengths
            for name in ("grpo", "otb")
        }
        meta["warmup_s"] = {f"{n}-{length}": t.warmup_s for (n, length), t in trainers.items()}
        meta["setup_s"] = time.perf_counter() - start
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
                for name in ("grpo", "otb") if pair % 2 == 0 else ("otb", "grpo"):
                    r = {**trainers[name, length].step(), "pair": pair}
                    runs.append(r)
                    print(
                        f"overhead {length:5d} tokens pair {pair} {name:4s} step {r['step_wall_s']:.3f} s", flush=True
                    )
                pair_s[length] = time.perf_counter() - t0
                meta["wall_s"] = time.perf_counter() - start
                write_json(path, {"meta": meta, "summary": summarise_overhead(runs, args.lengths), "runs": runs})
            if stopped:
                break
        del trainers
        gc.collect()
    meta["stopped"] = stopped
    meta["wall_s"] = time.perf_counter() - start
    summary = summarise_overhead(runs, args.lengths)
    write_json(path, {"meta": meta, "summary": summary, "runs": runs})
    for length, s in summary.items():
        print(
            f"== {length} tokens, {s['pairs']} pairs: OTB/GRPO step x{s['step_wall_s']['median_ratio']:.3f}",
            flush=True,
        )
    print(f"wrote {path}")
    return path


# ----------------------------------------------------------------------------------------------------------------
# The conclusion of the GPU run
# ----------------------------------------------------------------------------------------------------------------


def _read(path: Path) -> dict | None:
    import json

    return json.loads(path.read_text()) if path.exists() else None


def conclude(out: Path) -> dict:
    """``device_conclusion.json`` in ``out``: one line per measurement the parts wrote, and the verdict on OTB's
    step overhead (the whole-step median ratio over at least 5 pairs, with the range of the pairs)."""
    lines, verdict = [], "no conclusion: the whole-step overhead has fewer than 5 pairs"
    overhead = _read(out / "device_overhead.json")
    for length, s in (overhead or {}).get("summary", {}).items():
        ratios = s["step_wall_s"]["pair_ratios"]
        lines.append(
            f"whole step, {length} tokens: OTB/GRPO x{s['step_wall_s']['median_ratio']:.3f} (median of {s['pairs']} "
            f"pairs, range {min(ratios):.3f} to {max(ratios):.3f}; GRPO {s['step_wall_s']['grpo']:.2f} s)"
        )
        if s["pairs"] >= 5:
            verdict = (
                f"OTB's whole step costs x{s['step_wall_s']['median_ratio']:.3f} GRPO's at {length} tokens "
                f"({s['pairs']} pairs, range {min(ratios):.3f} to {max(ratios):.3f})"
            )
    for r in (_read(out / "device_fused_head.json") or {}).get("results", []):
        part = "rollout pass (no grad)" if r["mode"] == "no_grad" else "loss step (forward + backward)"
        lines.append(
            f"{part} with sum pi^2, {r['tokens']} tokens: x{r['median_ratio']:.3f}, {r['median_extra_ms']:+.1f} ms"
        )
    for r in (_read(out / "device_advantages_speed.json") or {}).get("results", []):
        lines.append(
            f"advantages (otb), {r['tokens'] / 1e6:.2f}M tokens: {r['median_s']['otb'] * 1e3:.1f} ms, "
            f"x{r['ratio_to_floor']['otb']:.2f} the floor"
        )
    device = (overhead or {}).get("meta", {}).get("gpu") or (overhead or {}).get("meta", {}).get("device")
    payload = {"device": device, "verdict": verdict, "lines": lines}
    write_json(out / "device_conclusion.json", payload)
    print("== conclusion: " + verdict + "".join(f"\n   {line}" for line in lines), flush=True)
    return payload


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
    parser.add_argument("what", choices=["overhead", "fused-head", "conclude"])
    parser.add_argument("--dry-run", action="store_true", help="CPU, tiny shape, tiny sizes (the same code path)")
    parser.add_argument("--shape", default="qwen2.5-0.5b", choices=list(SHAPES))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096], help="completion tokens")
    parser.add_argument("--pairs", type=int, default=6, help="interleaved GRPO/OTB step pairs per length (overhead)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps of each trainer before the pairs")
    parser.add_argument("--prompts-per-step", type=int, default=2, help="prompts per step (x N=4 completions)")
    parser.add_argument("--budget-s", type=float, default=300.0, help="no new overhead pair past this many seconds")
    parser.add_argument("--batch", type=int, default=8, help="sequences per call (fused-head)")
    parser.add_argument("--repeats", type=int, default=10, help="interleaved repeats (fused-head)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=os.environ.get("OUT") or "benchmarks/results")
    args = parser.parse_args()
    if args.warmup < 1:
        raise SystemExit("--warmup must be >= 1: the first step of a trainer is never timed")
    if args.dry_run:
        args.shape, args.device, args.dtype = "tiny-qwen2", "cpu", "fp32"
        args.lengths, args.pairs, args.repeats, args.batch = [8, 16], 5, 2, 2
    if args.what == "conclude":
        conclude(Path(args.out))
        return
    if args.device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise SystemExit("no CUDA device: run with --dry-run on a CPU (tiny shape, the same code path)")
    (run_overhead if args.what == "overhead" else run_fused_head)(args)


if __name__ == "__main__":
    main()
