"""Wall time of the advantage estimators against a minimal floor, from 0.1M to 8.4M tokens.

    python -m benchmarks.advantages_speed            # 128 prompts x 8 completions x T in {128, 512, 2048, 8192}
    python -m benchmarks.advantages_speed --quick    # small sizes, a few seconds
    python -m benchmarks.advantages_speed --device cuda --sizes 128x8x2048 128x8x8192 --stem device_advantages_speed

On a GPU (``--device cuda``) the inputs live on the device and the clock is wall time with the device synchronised
before and after each call (``meta.clock``); on the CPU it is this process's CPU time.

OTB runs with its full contract switched on: ``tail="zero"``, some NaN rewards, ragged lengths and
``is_weights``. The floor is the least work any position-aligned weighted-mean baseline must do on the
same tensors (mask the proxy, cumulative sum, two group sums, one division, one subtraction), written
below with groups assumed contiguous and equal-sized (a reshape instead of a scatter), no validation and
no edge cases. The clock is this process's CPU time on one thread (``--threads 1``), which other jobs
on a shared machine cannot inflate the way they inflate wall time (wall time is recorded too). Each repeat times every estimator once, in a fresh random order (interleaved), so machine
load hits all of them alike; the JSON holds every repeat, the medians and the median of the per-repeat
ratios to the floor. Writes ``advantages_speed.json`` and ``advantages_speed.png`` into ``--out``.
"""

from __future__ import annotations

import argparse
import platform
import random
import statistics
import time
from pathlib import Path

import torch

from benchmarks.common import command, pyplot, save_figure, write_json
from trl_otb import grpo_advantages, ogb_advantages, opo_advantages, otb_advantages, rloo_advantages

FULL_SIZES = [(128, 8, 128), (128, 8, 512), (128, 8, 2048), (128, 8, 8192)]
QUICK_SIZES = [(16, 8, 64), (16, 8, 256), (32, 8, 512)]


def floor_advantages(rewards, proxy, mask, num_prompts, group_size):
    """Minimal position-aligned weighted-mean baseline: contiguous equal groups, finite rewards assumed."""
    w = proxy * mask
    energy = torch.cumsum(w, dim=1) * mask
    T = proxy.shape[1]
    num = (rewards[:, None] * energy).view(num_prompts, group_size, T).sum(1)
    den = energy.view(num_prompts, group_size, T).sum(1)
    baseline = (num / (den + 1e-8)).repeat_interleave(group_size, dim=0)
    return (rewards[:, None] - baseline) * mask


def make_inputs(num_prompts, group_size, T, seed=0, device="cpu"):
    """Ragged completions (lengths uniform in [T/8, T]), proxy in [0, 2), 1% NaN rewards, clipped IS ratios."""
    g = torch.Generator().manual_seed(seed)
    B = num_prompts * group_size
    lengths = torch.randint(max(1, T // 8), T + 1, (B,), generator=g)
    mask = (torch.arange(T)[None, :] < lengths[:, None]).float()
    proxy = 2 * torch.rand(B, T, generator=g)
    rewards = (torch.rand(B, generator=g) < 0.4).float()
    rewards[torch.rand(B, generator=g) < 0.01] = float("nan")
    is_weights = torch.empty(B, T).uniform_(0.8, 1.2, generator=g).clamp(max=1.1)
    group_ids = torch.arange(B) // group_size
    return tuple(x.to(device) for x in (rewards, proxy, mask, group_ids, is_weights))


def _sync(device):
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def estimators(rewards, proxy, mask, group_ids, is_weights, num_prompts, group_size):
    finite = torch.nan_to_num(rewards, nan=0.0)
    return {
        "floor": lambda: floor_advantages(finite, proxy, mask, num_prompts, group_size),
        "otb": lambda: otb_advantages(
            rewards, proxy, mask, group_ids, tail="zero", leave_one_out=False, is_weights=is_weights
        ),
        "otb_loo": lambda: otb_advantages(
            rewards, proxy, mask, group_ids, is_weights=is_weights, leave_one_out=True, tail="zero"
        ),
        "grpo": lambda: grpo_advantages(rewards, proxy, mask, group_ids),
        "grpo_std": lambda: grpo_advantages(rewards, proxy, mask, group_ids, scale="group"),
        "rloo": lambda: rloo_advantages(rewards, proxy, mask, group_ids),
        "opo": lambda: opo_advantages(rewards, proxy, mask, group_ids),
        "ogb": lambda: ogb_advantages(rewards, proxy, mask, group_ids, is_weights=is_weights),
    }


def bench_size(num_prompts, group_size, T, repeats, seed, device="cpu"):
    """Per estimator, the clock's seconds per call: CPU time of this process on the CPU, synchronised wall time on
    a GPU (kept under ``cpu_seconds`` either way, so every reader of the JSON finds it)."""
    inputs = make_inputs(num_prompts, group_size, T, seed, device)
    fns = estimators(*inputs, num_prompts, group_size)
    for fn in fns.values():  # warm-up: allocator, first-call overheads
        fn()
    on_gpu = str(device).startswith("cuda")
    times = {name: [] for name in fns}  # the clock: CPU seconds of this process, or synchronised wall on a GPU
    walls = {name: [] for name in fns}
    order = list(fns)
    rng = random.Random(seed)
    for _ in range(repeats):
        rng.shuffle(order)
        for name in order:
            _sync(device)
            start, start_cpu = time.perf_counter(), time.process_time()
            fns[name]()
            _sync(device)
            wall = time.perf_counter() - start
            times[name].append(wall if on_gpu else time.process_time() - start_cpu)
            walls[name].append(wall)
    tokens = num_prompts * group_size * T
    result = {
        "prompts": num_prompts,
        "group_size": group_size,
        "T": T,
        "tokens": tokens,
        "repeats": repeats,
        "cpu_seconds": times,
        "wall_seconds": walls,
        "median_s": {k: statistics.median(v) for k, v in times.items()},
        "median_wall_s": {k: statistics.median(v) for k, v in walls.items()},
        "ratio_to_floor": {
            k: statistics.median(t / f for t, f in zip(v, times["floor"])) for k, v in times.items() if k != "floor"
        },
    }
    result["ns_per_token"] = {k: 1e9 * v / tokens for k, v in result["median_s"].items()}
    return result


def profile_otb(num_prompts=128, group_size=8, T=1024, calls=5):
    """Share of OTB's CPU time per aten op (full contract on), to see what is left to optimise."""
    rewards, proxy, mask, group_ids, is_weights = make_inputs(num_prompts, group_size, T)

    def otb():
        return otb_advantages(rewards, proxy, mask, group_ids, tail="zero", leave_one_out=False, is_weights=is_weights)

    otb()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(calls):
            otb()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))


def plot(results, path, ylabel="median CPU ms (1 thread)"):
    fig, (ax1, ax2) = pyplot().subplots(1, 2, figsize=(11, 4))
    tokens = [r["tokens"] for r in results]
    for name in results[0]["median_s"]:
        style = (
            dict(lw=2.5, color="black") if name == "otb" else dict(ls="--", color="gray") if name == "floor" else {}
        )
        ax1.plot(tokens, [r["median_s"][name] * 1e3 for r in results], marker="o", label=name, **style)
        if name != "floor":
            ax2.plot(tokens, [r["ratio_to_floor"][name] for r in results], marker="o", label=name, **style)
    ax1.set(xscale="log", yscale="log", xlabel="tokens (B x T)", ylabel=ylabel, title="Time per call")
    ax2.axhline(2.0, color="red", lw=1, ls=":", label="2x floor")
    ax2.set(xscale="log", xlabel="tokens (B x T)", ylabel="time / floor (median of per-repeat ratios)")
    ax2.set_title("Ratio to the floor")
    ax1.legend(fontsize=7)
    ax2.legend(fontsize=7)
    save_figure(fig, path)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (CI)")
    parser.add_argument(
        "--repeats",
        type=int,
        default=None,
        help="interleaved repeats at 2M+ tokens (default 9, quick 5); smaller sizes get proportionally more, up to 60",
    )
    parser.add_argument(
        "--threads", type=int, default=1, help="torch.set_num_threads (1: CPU time is then a fair clock)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument("--device", default="cpu", help="cpu, or cuda (inputs on the GPU, synchronised wall clock)")
    parser.add_argument(
        "--sizes", nargs="+", default=None, help="PROMPTSxGROUPxT, e.g. 128x8x2048 (default: the full or quick set)"
    )
    parser.add_argument("--stem", default=None, help="output file name without suffix")
    parser.add_argument("--profile", action="store_true", help="print the torch profile of OTB at 1M tokens, and exit")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.profile:
        profile_otb()
        return
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device here")
    sizes = QUICK_SIZES if args.quick else FULL_SIZES
    if args.sizes:
        try:
            sizes = [tuple(int(x) for x in s.lower().split("x")) for s in args.sizes]
        except ValueError:
            sizes = []
        if not sizes or any(len(s) != 3 or min(s) < 1 for s in sizes):
            raise SystemExit(
                f"--sizes takes PROMPTSxGROUPxT with positive integers, e.g. 128x8x2048, got {args.sizes}"
            )
    repeats = args.repeats or (5 if args.quick else 9)
    results = []
    for num_prompts, group_size, T in sizes:
        # Small sizes are cheap and their timings noisy (a call lasts ~1 ms): more repeats, up to 60.
        tokens = num_prompts * group_size * T
        reps = min(60, max(repeats, int(repeats * 2e6 / tokens)))
        r = bench_size(num_prompts, group_size, T, reps, args.seed, args.device)
        results.append(r)
        ratios = " ".join(f"{k}={v:.2f}" for k, v in r["ratio_to_floor"].items())
        print(f"{r['tokens'] / 1e6:6.2f}M tokens  floor {r['median_s']['floor'] * 1e3:8.1f} ms  x floor: {ratios}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = args.stem or ("advantages_speed_quick" if args.quick else "advantages_speed")
    on_gpu = args.device.startswith("cuda")
    meta = {
        "command": command("advantages_speed.py"),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "machine": platform.processor() or platform.machine(),
        "device": torch.cuda.get_device_name(0) if on_gpu else "cpu",
        "clock": "wall, device synchronised before and after each call" if on_gpu else "process CPU time",
    }
    write_json(out / f"{stem}.json", {"meta": meta, "results": results})
    plot(results, out / f"{stem}.png", "median wall ms (GPU, synchronised)" if on_gpu else "median CPU ms (1 thread)")
    print(f"wrote {out / stem}.json and .png")


if __name__ == "__main__":
    main()
