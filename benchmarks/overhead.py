"""Step time and peak memory of OTBTrainer against GRPOTrainer on the same config and seeds.

    python -m benchmarks.overhead --quick                       # tiny random Llama, on-policy, 1 pair (CI)
    python -m benchmarks.overhead --models tiny --pairs 3       # tiny model, on- and off-policy
    python -m benchmarks.overhead --models smollm2 --pairs 2    # embedded SmolLM2-135M with LoRA r=8 on q/v
    python -m benchmarks.overhead --vllm --pairs 3              # vLLM colocate on CPU, correction on and off

Every run is a fresh subprocess (so its peak RSS, ``getrusage(RUSAGE_SELF).ru_maxrss``, is its own), and runs are
interleaved GRPO, OTB, GRPO, OTB, ... so that slow phases of a shared machine hit both trainers alike. Each run
trains ``warmup + steps`` optimizer steps with the same seed and reports the per-step wall and CPU time of the last
``steps`` (steps_per_generation steps share one generation, so ``steps`` is a multiple of it). The JSON holds every
run, the medians and the per-pair ratios OTB / GRPO. Torch runs on one thread (``--threads``): CPU time then
measures the work done, which other jobs on a shared machine do not inflate.

On-policy (the default, one optimizer step per generation) GRPOTrainer runs no log-prob pass at rollout time;
OTBTrainer then reads pi(y_t) and sum_v pi(v)^2 while ``generate`` samples (or, where it cannot, runs one no-grad
forward). Off-policy (``steps_per_generation=2``) TRL runs that pass itself and OTB's statistics ride along.

With ``--vllm`` (in the vLLM venv, ``make setup-vllm``) both trainers generate with vLLM colocate on CPU, with TRL's
importance-sampling correction on (TRL runs the log-prob pass; sum pi^2 rides along) and off (TRL runs no pass; OTB
runs one extra no-grad forward). TRL's weight sync cannot run on CPU; both trainers use the test suite's
replacement (``trl_otb.testing.vllm_cpu``), so its cost is the same on both sides of each ratio. The tiny model then
has 32-dim heads, the smallest vLLM's CPU attention takes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.common import N, command, pyplot, save_figure, timed_training, write_json

ROOT = Path(__file__).resolve().parent.parent
"""The repository root, where each run's subprocess starts (``python -m benchmarks.overhead --worker``)."""

MODELS = {
    # max_completion_length, prompt count per batch
    "tiny": {"max_completion_length": 24, "prompts_per_batch": 2},
    "smollm2": {"max_completion_length": 32, "prompts_per_batch": 1},
}
POLICIES = {
    "on": {},
    "off": {"steps_per_generation": 2},
    "vllm-is": {"use_vllm": True, "vllm_mode": "colocate", "vllm_importance_sampling_correction": True},
    "vllm-nois": {"use_vllm": True, "vllm_mode": "colocate", "vllm_importance_sampling_correction": False},
}


def model_tokenizer_and_peft(name: str, workdir: Path, vllm: bool = False):
    """(model or path, tokenizer, peft_config) for a benchmark model (a path for vLLM, which loads it itself)."""
    if name == "tiny":
        from trl_otb.testing import build_tiny_model, build_tiny_tokenizer

        tokenizer = build_tiny_tokenizer()
        model = build_tiny_model(len(tokenizer), tokenizer.eos_token_id, **({"head_dim": 32} if vllm else {}))
        model.generation_config.pad_token_id = tokenizer.pad_token_id
        if vllm:
            path = workdir / "tiny-vllm"
            model.save_pretrained(path)
            tokenizer.save_pretrained(path)
            return str(path), tokenizer, None
        return model, tokenizer, None
    from peft import LoraConfig

    from trl_otb.demo.models import load_model_and_tokenizer

    model, tokenizer = load_model_and_tokenizer()
    lora = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    return model, tokenizer, lora


def worker(args) -> dict:
    """One training run in this process; returns timings and peak RSS."""
    import resource

    vllm = args.policy.startswith("vllm")
    if vllm:
        from trl_otb.testing import vllm_cpu

        os.environ.update(vllm_cpu.CPU_ENV)
    import torch

    torch.set_num_threads(args.threads)
    if vllm:
        vllm_cpu.install()
    spec = MODELS[args.model]
    policy = POLICIES[args.policy]
    spg = policy.get("steps_per_generation", 1)
    warmup, steps = args.warmup * spg, args.steps * spg
    workdir = Path(args.workdir)
    model, tokenizer, peft_config = model_tokenizer_and_peft(args.model, workdir, vllm)
    _, clock = timed_training(
        args.trainer,
        model,
        tokenizer,
        prompts_per_step=spec["prompts_per_batch"],
        peft_config=peft_config,
        output_dir=str(workdir / f"{args.trainer}-{args.model}-{args.policy}"),
        use_cpu=True,
        bf16=False,
        gradient_checkpointing=False,
        max_completion_length=spec["max_completion_length"],
        max_steps=warmup + steps,
        seed=args.seed,
        data_seed=args.seed,
        **policy,
    )
    wall, cpu = clock.wall[warmup:], clock.cpu[warmup:]
    return {
        "trainer": args.trainer,
        "model": args.model,
        "policy": args.policy,
        "seed": args.seed,
        "steps": len(wall),
        "step_wall_s": sum(wall) / len(wall),
        "step_cpu_s": sum(cpu) / len(cpu),
        "per_step_wall_s": wall,
        "per_step_cpu_s": cpu,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def run_subprocess(trainer, model, policy, args) -> dict:
    workdir = str(Path(args.workdir).resolve())  # the subprocess starts in ROOT
    out = Path(workdir) / f"run-{trainer}-{model}-{policy}-{time.monotonic_ns()}.json"
    cmd = [
        sys.executable,
        "-m",
        "benchmarks.overhead",
        "--worker",
        "--trainer",
        trainer,
        "--model",
        model,
        "--policy",
        policy,
    ]
    cmd += ["--steps", str(args.steps), "--warmup", str(args.warmup), "--seed", str(args.seed)]
    cmd += ["--threads", str(args.threads), "--workdir", workdir, "--worker-out", str(out)]
    subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL if not args.verbose else None)
    return json.loads(out.read_text())


def summarise(runs: list[dict]) -> dict:
    grpo = [r for r in runs if r["trainer"] == "grpo"]
    otb = [r for r in runs if r["trainer"] != "grpo"]
    pairs = list(zip(grpo, otb))
    out = {}
    for key in ("step_wall_s", "step_cpu_s", "peak_rss_mb"):
        out[key] = {"grpo": statistics.median(r[key] for r in grpo), "otb": statistics.median(r[key] for r in otb)}
        ratios = [b[key] / a[key] for a, b in pairs]
        out[key]["pair_ratios"] = ratios
        out[key]["median_ratio"] = statistics.median(ratios)
    return out


def plot(summary: dict, path: Path) -> None:
    names = list(summary)
    fig, ax = pyplot().subplots(figsize=(max(5, 1.6 * len(names) + 2), 3.6))
    x = range(len(names))
    for offset, key, label in ((-0.2, "step_cpu_s", "step CPU time"), (0.2, "peak_rss_mb", "peak RSS")):
        med = [summary[n][key]["median_ratio"] for n in names]
        ax.bar([i + offset for i in x], med, width=0.38, label=label)
        for i, n in enumerate(names):
            ax.scatter([i + offset] * len(summary[n][key]["pair_ratios"]), summary[n][key]["pair_ratios"], c="k", s=8)
    ax.axhline(1.05, color="red", ls=":", lw=1, label="budget 1.05")
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.set_xticks(list(x), names, fontsize=8)
    ax.set_ylabel("OTBTrainer / GRPOTrainer")
    ax.set_ylim(0.8, max(1.3, max(max(summary[n]["step_cpu_s"]["pair_ratios"]) for n in names) + 0.05))
    ax.legend(fontsize=7)
    save_figure(fig, path)


def time_pieces(repeats: int = 2000) -> dict[str, float]:
    """CPU microseconds per call of OTBTrainer's own per-step work on the tiny on-policy config (8 completions of
    24 tokens, the tiny vocabulary): the generation-time collector (called once per sampled token), the advantages
    and the diagnostics."""
    import torch

    from trl_otb import otb_advantages
    from trl_otb.core import otb_diagnostics
    from trl_otb.rollout_stats import RolloutStatsCollector
    from trl_otb.testing import build_tiny_tokenizer

    torch.manual_seed(0)
    B, T, V = (
        N * MODELS["tiny"]["prompts_per_batch"],
        MODELS["tiny"]["max_completion_length"],
        len(build_tiny_tokenizer()),
    )
    scores, ids = torch.randn(B, V), torch.randint(0, V, (B, T))
    rewards, proxy, mask, group_ids = torch.rand(B), 2 * torch.rand(B, T), torch.ones(B, T), torch.arange(B) // N
    advantages = otb_advantages(rewards, proxy, mask, group_ids, tail="zero", leave_one_out=False)
    collector = RolloutStatsCollector(1.0)
    pieces = {
        "collector_per_token": lambda: collector(ids, scores),
        "otb_advantages": lambda: otb_advantages(rewards, proxy, mask, group_ids, tail="zero", leave_one_out=False),
        "otb_diagnostics": lambda: otb_diagnostics(rewards, advantages, proxy, mask, group_ids),
    }
    out = {}
    for name, fn in pieces.items():
        for _ in range(100):
            fn()
        start = time.process_time()
        for _ in range(repeats):
            fn()
        out[name] = (time.process_time() - start) / repeats * 1e6
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny model, on-policy, one pair, 2 steps (CI)")
    parser.add_argument("--models", nargs="+", default=["tiny"], choices=list(MODELS))
    parser.add_argument("--policies", nargs="+", default=["on", "off"], choices=list(POLICIES))
    parser.add_argument("--pairs", type=int, default=3, help="interleaved GRPO/OTB pairs per config")
    parser.add_argument("--steps", type=int, default=4, help="timed generation cycles per run")
    parser.add_argument("--warmup", type=int, default=1, help="untimed generation cycles per run")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument("--workdir", default=None, help="scratch directory (default: a temporary one)")
    parser.add_argument("--verbose", action="store_true")
    parser.add_argument("--tag", default=None, help="suffix of the output file names")
    parser.add_argument("--pieces", action="store_true", help="time OTB's own per-step pieces (tiny config), and exit")
    parser.add_argument("--vllm", action="store_true", help="vLLM colocate, correction on and off (vLLM venv)")
    # Internal: one run.
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--trainer", choices=["grpo", "otb"], help=argparse.SUPPRESS)
    parser.add_argument("--model", choices=list(MODELS), help=argparse.SUPPRESS)
    parser.add_argument("--policy", choices=list(POLICIES), help=argparse.SUPPRESS)
    parser.add_argument("--worker-out", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.worker:
        Path(args.worker_out).write_text(json.dumps(worker(args)))
        return
    if args.pieces:
        import torch

        torch.set_num_threads(args.threads)
        for name, us in time_pieces().items():
            print(f"{name:22s} {us:8.0f} us per call")
        return
    if args.quick:
        args.models, args.policies, args.pairs, args.steps, args.warmup = ["tiny"], ["on"], 1, 2, 1
    if args.vllm:
        args.policies = ["vllm-is", "vllm-nois"]
    import tempfile

    tmp = None
    if args.workdir is None:
        tmp = tempfile.TemporaryDirectory()
        args.workdir = tmp.name
    runs, summary = [], {}
    for model in args.models:
        for policy in args.policies:
            config_runs = []
            for pair in range(args.pairs):
                # Alternate which trainer goes first (ABBA), so a drift in machine load does not favour one.
                order = ("grpo", "otb") if pair % 2 == 0 else ("otb", "grpo")
                for trainer in order:
                    r = run_subprocess(trainer, model, policy, args)
                    r["pair"] = pair
                    config_runs.append(r)
                    print(
                        f"{model:8s} {policy}-policy pair {pair} {trainer:4s} step {r['step_wall_s']:.3f} s wall "
                        f"{r['step_cpu_s']:.3f} s cpu, peak RSS {r['peak_rss_mb']:.0f} MB",
                        flush=True,
                    )
            config_runs.sort(key=lambda r: (r["pair"], r["trainer"]))
            name = f"{model}/{policy}-policy"
            summary[name] = summarise(config_runs)
            s = summary[name]
            print(
                f"== {name}: OTB/GRPO step cpu x{s['step_cpu_s']['median_ratio']:.3f}, "
                f"wall x{s['step_wall_s']['median_ratio']:.3f}, peak RSS x{s['peak_rss_mb']['median_ratio']:.3f}",
                flush=True,
            )
            runs.extend(config_runs)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = "overhead_quick" if args.quick else "overhead_" + "_".join(args.models)
    if args.vllm:
        stem += "_vllm"
    if args.tag:
        stem += f"_{args.tag}"
    meta = {"command": command("overhead.py"), "threads": args.threads, "N": N}
    meta["configs"] = {
        m: {**MODELS[m], "per_device_train_batch_size": N * MODELS[m]["prompts_per_batch"]} for m in args.models
    }
    write_json(out / f"{stem}.json", {"meta": meta, "summary": summary, "runs": runs})
    plot(summary, out / f"{stem}.png")
    print(f"wrote {out / stem}.json and .png")
    if tmp is not None:
        tmp.cleanup()


if __name__ == "__main__":
    main()
