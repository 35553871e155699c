"""Gradient variance of the advantage estimators, in the LM head's and in a LoRA adapter's parameter space.

    python -m benchmarks.variance            # embedded SmolLM2-135M, generated math prompts, horizons 64 and 256
    python -m benchmarks.variance --task count --pool 12 --horizons 256 512 1024   # long answers, LM head only
    python -m benchmarks.variance --quick    # tiny random Llama, a cheap synthetic reward (CI, seconds)
    python -m benchmarks.variance --task count --pool 12 --horizons 256 512 1024 --fallbacks \
        --stem variance_fallbacks_count12    # OTB's tail fallbacks: variance, squared bias and MSE of each candidate
    python -m benchmarks.variance --task study-ramble --yardstick --batch-groups 4   # direction and optimal-scale error

Prompts. Candidates are tried in a fixed order (math: the first 64 generated training prompts; count: one per
``--count-targets``) until ``--prompts`` (default 12) of them have pool rewards that vary at each horizon. Each
prompt's pool is sampled once, seeded by (``--seed``, prompt index), and cached in ``--cache`` (default
``.cache/variance``) with its seed and settings, so a run can stop (``--time-limit`` minutes: no new pool after
that) and the same command resumes it later; ``--sample-only`` only fills the cache. The LoRA space's Gram matrices
are cached the same way. ``--study`` adds the estimator study (the tail rule off, two OTB variants, the variance
split by share of active members).

What is measured, and how: the package's docstring (``__init__.py``) and its modules'.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from benchmarks.common import command, write_json
from benchmarks.variance.estimators import FALLBACK_TAILS, core_tails
from benchmarks.variance.gradients import attach_adapter
from benchmarks.variance.report import SPACE_LABELS, plot, print_summary
from benchmarks.variance.run import Analysis, Plan, Pools, analyse_horizon, collect_pools, plan, summarise_space
from benchmarks.variance.sampling import STUDY_TASKS, setup


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog="python -m benchmarks.variance", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny random model, synthetic reward (CI)")
    parser.add_argument("--task", default="math", choices=["math", "count", *STUDY_TASKS])
    parser.add_argument(
        "--spaces",
        nargs="+",
        default=None,
        choices=list(SPACE_LABELS),
        help="parameter spaces (default: both for math, lm_head for count)",
    )
    parser.add_argument(
        "--prompts", type=int, default=None, help="prompts kept per horizon (rewards vary in the pool; default 12)"
    )
    parser.add_argument(
        "--candidates",
        type=int,
        default=None,
        help="math: size of the fixed candidate list, tried in order until --prompts are kept (default 64)",
    )
    parser.add_argument(
        "--count-targets",
        type=int,
        nargs="+",
        default=list(range(100, 240, 10)),
        help="n of the count task, one candidate prompt each, tried in order (default 100, 110, ..., 230)",
    )
    parser.add_argument("--pool", type=int, default=None, help="completions per prompt (default 16, quick 12)")
    parser.add_argument("--horizons", type=int, nargs="+", default=None, help="default 64 256 (quick 8 24)")
    parser.add_argument(
        "--sample-horizon",
        type=int,
        default=None,
        help="horizon the pools are sampled at (default the largest of --horizons; a pool serves every horizon up to "
        "its own, cut to the first h tokens)",
    )
    parser.add_argument("--Ns", type=int, nargs="+", default=None, help="group sizes (default 2 4 8 16)")
    parser.add_argument("--groups", type=int, default=None, help="random groups per prompt and N (default 100)")
    parser.add_argument("--bootstrap", type=int, default=2000)
    parser.add_argument("--temperature", type=float, default=None, help="sampling temperature (math 1.0, count 0.7)")
    parser.add_argument("--batch-size", type=int, default=32, help="completions per generate call")
    parser.add_argument("--top-k", type=int, default=64, help="per-token top-k kept in the vocabulary subset")
    parser.add_argument(
        "--sketch-dim", type=int, default=None, help="LoRA gradient sketch size (default 65536, quick 0 = exact)"
    )
    parser.add_argument(
        "--lora-horizons",
        type=int,
        nargs="+",
        default=None,
        help="horizons analysed in the LoRA space (default: the shortest; the cost is quadratic in it)",
    )
    parser.add_argument(
        "--cache",
        default=None,
        help="folder of the sampled pools and adapter Gram matrices (default .cache/variance; quick: OUT/pools_quick)",
    )
    parser.add_argument(
        "--time-limit",
        type=float,
        default=None,
        help="minutes after which no new pool (or adapter Gram matrix) is computed; the run then analyses what is "
        "cached and says what is missing, and the same command later resumes",
    )
    parser.add_argument("--sample-only", action="store_true", help="sample and cache the pools, analyse nothing")
    parser.add_argument(
        "--study",
        action="store_true",
        help="also the tail rule off and two OTB variants (paired against OTB), and the variance by share of active "
        "members (the variant study of research/variance/README.md)",
    )
    parser.add_argument(
        "--fallbacks",
        action="store_true",
        help="the candidate grid instead of the shipped estimators: OTB with every tail of FALLBACK_TAILS, without "
        "and with leave-one-out, unscaled GRPO, RLOO and OGB, each with variance, squared bias and MSE, paired "
        "against reference OTB and GRPO, the calibration of the squared bias (RLOO 0, GRPO ||g_ref||^2 / N^2)",
    )
    parser.add_argument(
        "--yardstick",
        action="store_true",
        help="the yardstick (cos, scale, snr, eps_star, kappa; benchmarks/variance/yardstick.py) of TRL's GRPO, "
        "unscaled GRPO, RLOO, OGB and OTB's default, reference, leave-one-out and unbiased options, in the "
        "score-centred pool (each horizon's `yardstick` entry), beside the variance columns",
    )
    parser.add_argument(
        "--batch-groups",
        type=int,
        default=4,
        help="B, the groups one training step averages, at which snr, eps_star and kappa are taken (default 4, the "
        "training studies' prompts per step)",
    )
    parser.add_argument(
        "--kappa-coords",
        type=int,
        default=1024,
        help="LM-head coordinates sampled per prompt for kappa (default 1024)",
    )
    parser.add_argument(
        "--checkpoint",
        default=None,
        help="a state dict (torch.save) loaded into the task's model before sampling: the pools of a trained policy "
        "(its file name joins the cache key)",
    )
    parser.add_argument(
        "--decompose-Ns", type=int, nargs="+", default=[4], help="group sizes of the --study split (default 4)"
    )
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument("--stem", default=None, help="output file name (default variance, variance_count, ..._quick)")
    parser.add_argument("--replot", action="store_true", help="only redraw the PNG from the JSON in --out")
    return parser.parse_args(argv)


def output_stem(args) -> str:
    if args.stem:
        return args.stem
    return "variance_quick" if args.quick else ("variance" if args.task == "math" else f"variance_{args.task}")


def run_meta(args, run: Plan, pools: Pools, lora_s: dict, analysis_s: dict, start: float) -> dict:
    q = args.quick
    return {
        "command": args.command,
        "model": "tiny random Llama"
        if q
        else f"the training study's warm-started 2-layer Llama (seed {args.seed})"
        if args.task in STUDY_TASKS
        else "embedded SmolLM2-135M-Instruct",
        "task": "synthetic" if q else args.task,
        "count_targets": args.count_targets if args.task == "count" and not q else None,
        "spaces": run.spaces,
        "temperature": run.temperature,
        "prompts_target": run.target,
        "candidates": run.candidates,
        "candidates_tried": len(pools.data),
        "pool": run.pool_size,
        "sample_horizon": run.sample_horizon,
        "seed": args.seed,
        "cache_key": run.key,
        "Ns": run.Ns,
        "groups_per_prompt": run.num_groups,
        "bootstrap": args.bootstrap,
        "intervals": "95% percentile bootstrap; `*_ci`: prompts resampled, then groups within each (two levels); "
        "`*_ci_groups`: prompts fixed, groups resampled; the scale a is re-estimated in every resample",
        "top_k": args.top_k,
        "lora": {
            "r": 16,
            "alpha": 32,
            "target_modules": "all-linear",
            "sketch_dim": run.sketch_dim,
            "horizons": run.lora_horizons,
        }
        if "lora" in run.spaces
        else None,
        "missing": pools.missing,
        "cost": {
            "sample_seconds_per_pool": {str(p): d["sample_seconds"] for p, d in pools.data.items()},
            "adapter_gram_seconds_per_prompt": {str(p): t for p, t in lora_s.items()},
            "analysis_seconds": analysis_s,
            "note": "sampling and adapter-gradient seconds were measured when each was computed (possibly by an "
            "earlier invocation); analysis seconds are this invocation's",
        },
        "total_seconds": time.perf_counter() - start,
    }


def replot(args) -> None:
    """Redraw the PNG from the JSON in ``--out``."""
    out, stem = Path(args.out), output_stem(args)
    data = json.loads((out / f"{stem}.json").read_text())
    horizons = sorted(int(h) for h in next(iter(data["results"].values())))
    plot(data["results"], data["meta"]["Ns"], horizons, out / f"{stem}.png")


def main(argv=None):
    args = parse_args(argv)
    # The command that reproduces this run: its own arguments when another script calls main(argv).
    args.command = command("variance", argv)
    if args.replot:
        return replot(args)
    torch.set_num_threads(args.threads)
    run = plan(args)
    start = time.perf_counter()
    model, tokenizer, prompts, reward_fn = setup(args.quick, run.candidates, args.seed, args.task, args.count_targets)
    if args.checkpoint:
        model.load_state_dict(torch.load(args.checkpoint, weights_only=True))
    model.eval()
    pools = collect_pools(model, tokenizer, prompts, reward_fn, args, run)
    if args.sample_only:
        print(f"pools cached in {run.cache} ({time.perf_counter() - start:.0f} s)")
        return

    analysis = Analysis.of(args.study, args.fallbacks, args.yardstick)
    head_weight = model.get_output_embeddings().weight.detach()
    adapter = None
    if "lora" in run.spaces:
        adapter = attach_adapter(model)
        adapter.eval()
    results = {space: {} for space in run.spaces}
    analysis_s = {space: {} for space in run.spaces}
    lora_s = {}  # prompt -> seconds its adapter Gram matrix took
    for h in run.horizons:
        cells = analyse_horizon(h, pools, head_weight, adapter, args, run, analysis, lora_s)
        for space in run.spaces:
            if space == "lora" and h not in run.lora_horizons:
                continue
            analysis_s[space][str(h)] = cells["seconds"][space]
            results[space][str(h)] = summarise_space(space, h, cells, args, run, analysis)
            print_summary(space, h, results[space][str(h)], len(cells["per_prompt"][space]))
    out, stem = Path(args.out), output_stem(args)
    meta = run_meta(args, run, pools, lora_s, analysis_s, start)
    if analysis.fallbacks:
        meta["fallbacks"] = {
            "tails": list(FALLBACK_TAILS),
            "implementation": analysis.implementation,
            "core_tails": list(core_tails()),
            "bias": "bias_sq = ||E g - g_ref||^2 per prompt, the plug-in ||g_bar - g_ref||^2 less the unbiased "
            "Var(g) / G (squared_bias); bias_sq_plugin is the uncorrected one; mse = var G / (G - 1) + bias_sq",
        }
    if analysis.yardstick:
        meta["yardstick"] = {
            "batch_groups": args.batch_groups,
            "checkpoint": args.checkpoint,
            "estimators": {name: [str(spec[0]), spec[1]] for name, spec in analysis.estimators.items()},
            "world": "the score-centred pool (gradients.position_centring): the reference g~_ref is exact there",
            "estimates": "<m, g> = mean_k <g_k, g_ref>; tr S = (mean_k ||g_k||^2 - ||g_bar||^2) G / (G - 1); "
            "||m||^2 = ||g_bar||^2 - tr S / G (the plug-in is inflated by tr S / G); summed over prompts; "
            "cos, scale, snr, eps_star by trl_otb.core.yardstick.yardstick_from_products at B = batch_groups",
            "kappa": f"on {args.kappa_coords} sampled LM-head coordinates per prompt (two strata: the rows of the "
            "pool's sampled tokens, the other rows; inverse-inclusion weights); every coordinate when V*H is smaller",
            "intervals": "95% percentile bootstrap, prompts then groups resampled, the same resamples for every "
            "estimator (paired: a - control per resample); kappa's interval on the first 200 resamples",
        }
    write_json(out / f"{stem}.json", {"meta": meta, "results": results})
    plot(results, run.Ns, run.horizons, out / f"{stem}.png")
    print(f"wrote {out / stem}.json and .png ({meta['total_seconds']:.0f} s)")
