"""One invocation's work: its plan (the settings, with the defaults of ``--quick`` and of the task filled in, and the
cache key of its pools), the pools of the candidate prompts until enough of them have rewards that vary, the
estimators it compares, and the analysis of each horizon in each space, down to the JSON entry of one space."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from benchmarks.variance.estimators import (
    DECOMPOSED,
    PAIRS,
    STUDY_ESTIMATORS,
    STUDY_PAIRS,
    VARIANCE_ESTIMATORS,
    check_fallbacks,
    fallback_estimators,
    fallback_pairs,
    yardstick_estimators,
)
from benchmarks.variance.gradients import analyse_prompt, cached_lora_gram
from benchmarks.variance.sampling import STUDY_TASKS, load_or_sample_pool, pool_seed, prompt_tensors
from benchmarks.variance.statistics import calibration, decomposition_summary, matching_n, summarise
from benchmarks.variance.yardstick import summarise_yardstick
from trl_otb.gradcheck.gram import head_coordinates, token_gram


@dataclass
class Plan:
    """The settings of one invocation, with the defaults of ``--quick`` and of the task filled in."""

    spaces: list[str]
    horizons: list[int]
    lora_horizons: list[int]
    sample_horizon: int
    temperature: float
    sketch_dim: int
    target: int
    candidates: int
    pool_size: int
    Ns: list[int]
    num_groups: int
    cache: Path
    key: str
    deadline: float


def plan(args) -> Plan:
    """The settings of ``args``, and the cache key of its pools: ``{task}-M{pool}-h{horizon}-T{temp}-k{topk}-s{seed}``
    (a pool file adds ``-p{prompt index}``)."""
    q = args.quick
    study = STUDY_TASKS.get(args.task)
    if study and not args.horizons:  # the task's own completion length
        from benchmarks import study_task

        args.horizons = [study_task.TASKS[study].max_completion_length]
    horizons = sorted(args.horizons or ([8, 24] if q else [64, 256]))
    sample_horizon = args.sample_horizon or max(horizons)
    if sample_horizon < max(horizons):
        raise SystemExit(f"--sample-horizon {sample_horizon} is below the largest horizon {max(horizons)}")
    temperature = args.temperature or (0.7 if args.task == "count" and not q else 1.0)
    pool_size = args.pool or (12 if q else 16)
    candidates = len(args.count_targets) if args.task == "count" and not q else (args.candidates or (6 if q else 64))
    # Prompt i of a task is the same prompt in every invocation (a cached pool is checked against it on load), so
    # candidates can be appended (more --count-targets, a larger --candidates) without resampling the others.
    task_tag = "quick" if q else args.task
    # A checkpoint's pools are its own: its file name joins the cache key.
    checkpoint = f"-c{Path(args.checkpoint).stem}" if getattr(args, "checkpoint", None) else ""
    return Plan(
        spaces=args.spaces or (["lm_head", "lora"] if args.task == "math" else ["lm_head"]),
        horizons=horizons,
        lora_horizons=sorted(args.lora_horizons or [min(horizons)]),
        sample_horizon=sample_horizon,
        temperature=temperature,
        sketch_dim=args.sketch_dim if args.sketch_dim is not None else (0 if q else 2**16),
        target=args.prompts or (3 if q else 12),
        candidates=candidates,
        pool_size=pool_size,
        Ns=args.Ns or ([2, 4, 8] if q else [2, 4, 8, 16]),
        num_groups=args.groups or (64 if q else 100),
        cache=Path(args.cache or (Path(args.out) / "pools_quick" if q else ".cache/variance")),
        key=f"{task_tag}-M{pool_size}-h{sample_horizon}-T{temperature:g}-k{args.top_k}-s{args.seed}{checkpoint}",
        deadline=time.perf_counter() + 60 * args.time_limit if args.time_limit else float("inf"),
    )


@dataclass
class Pools:
    """The candidates' pools (``data`` by prompt index, as ``load_or_sample_pool`` returns them), their rewards at
    each horizon, the prompts kept at each horizon, and why fewer than the target were kept (None: enough)."""

    data: dict = field(default_factory=dict)
    rewards: dict = field(default_factory=dict)  # (prompt, horizon) -> rewards of the pool cut at the horizon
    kept: dict = field(default_factory=dict)  # horizon -> prompt indices
    missing: str | None = None


def collect_pools(model, tokenizer, prompts, reward_fn, args, run: Plan) -> Pools:
    """Candidates in a fixed order, until every horizon has ``run.target`` prompts whose pool rewards vary there;
    each pool from the cache or sampled (no new one past the time limit)."""
    pools = Pools(kept={h: [] for h in run.horizons})
    kept, missing = pools.kept, None
    for p, prompt in enumerate(prompts):
        if all(len(kept[h]) >= run.target for h in run.horizons):
            break
        path = run.cache / f"{run.key}-p{p:03d}.pt"
        if not path.exists() and time.perf_counter() > run.deadline:
            missing = f"time limit reached before candidate {p} was sampled"
            break
        data, was_cached = load_or_sample_pool(
            model, tokenizer, prompt, p, run.cache, run.key, run.pool_size, run.sample_horizon, args.batch_size,
            run.temperature, args.top_k, args.seed,
        )  # fmt: skip
        pools.data[p] = data
        for h in run.horizons:
            ids = [c["ids"][:h] for c in data["records"]]
            texts = tokenizer.batch_decode(ids, skip_special_tokens=True)
            pools.rewards[(p, h)] = reward_fn([x.tolist() for x in ids], texts, p)
            if len(kept[h]) < run.target and len(set(pools.rewards[(p, h)])) > 1:
                kept[h].append(p)
        how = "cached" if was_cached else f"sampled in {data['sample_seconds']:.0f} s"
        print(
            f"candidate {p}: {how}, kept at "
            f"{[h for h in run.horizons if p in kept[h]]}; kept so far {[len(kept[h]) for h in run.horizons]}",
            flush=True,
        )
    short = {h: len(kept[h]) for h in run.horizons if len(kept[h]) < run.target}
    if short and missing is None:
        missing = f"the {len(prompts)} candidates gave fewer than {run.target} prompts with varying rewards"
    if short:
        print(f"WARNING: {missing}: prompts kept per horizon {short} (target {run.target})", flush=True)
        pools.missing = missing
    return pools


@dataclass
class Analysis:
    """What the estimators are compared on: the estimators, the paired comparisons, the decomposed estimators."""

    estimators: dict
    pairs: tuple
    decompose: tuple
    fallbacks: bool = False
    implementation: dict = field(default_factory=dict)  # --fallbacks: estimator -> "core" or the package's reference
    yardstick: bool = False

    @property
    def centred(self) -> bool:
        """Whether the cells are also analysed in the score-centred pool (the yardstick's world)."""
        return self.fallbacks or self.yardstick

    @classmethod
    def of(cls, study: bool, fallbacks: bool = False, yardstick: bool = False) -> Analysis:
        if yardstick and not fallbacks:
            estimators = {**yardstick_estimators(), **(STUDY_ESTIMATORS if study else {})}
            pairs = (("otb_default", "grpo"), ("otb_default", "grpo_std")) + PAIRS + (STUDY_PAIRS if study else ())
            decompose = tuple(e for e in DECOMPOSED if e in estimators) if study else ()
            return cls(estimators, pairs, decompose, yardstick=True)
        if not fallbacks:
            return cls(
                estimators={**VARIANCE_ESTIMATORS, **(STUDY_ESTIMATORS if study else {})},
                pairs=PAIRS + (STUDY_PAIRS if study else ()),
                decompose=DECOMPOSED if study else (),
            )
        grid, implementation = fallback_estimators()
        estimators = {**grid, **(yardstick_estimators() if yardstick else {}), **(STUDY_ESTIMATORS if study else {})}
        pairs = tuple(dict.fromkeys(PAIRS + fallback_pairs(grid) + (STUDY_PAIRS if study else ())))
        decompose = tuple(e for e in DECOMPOSED if e in estimators) if study else ()
        return cls(estimators, pairs, decompose, True, implementation, yardstick)


def analyse_horizon(h, pools: Pools, head_weight, adapter, args, run: Plan, analysis: Analysis, lora_s: dict):
    """Per space, the per-prompt cells (``analyse_prompt``) of every prompt kept at horizon ``h``, and what the
    summary reports beside them: the prompts used, mean lengths, tail bounds, seconds, adapter Grams missing."""
    spaces = run.spaces
    per_prompt = {space: [] for space in spaces}
    bounds, subset_sizes, mean_len, kept_rows, lora_missing = [], [], [], [], []
    t_head = t_lora = 0.0
    fallback_checks = {}
    generator = torch.Generator()
    for p in pools.kept[h]:
        comps, rewards = pools.data[p]["records"], pools.rewards[(p, h)]
        R, proxy, mask = prompt_tensors(comps, rewards, h)
        grams = {}
        t0 = time.perf_counter()
        if "lm_head" in spaces:
            cut = [{k: v[:h] for k, v in c.items()} for c in comps]
            grams["lm_head"], bound, subset = token_gram(cut, head_weight, run.temperature)
            bounds.append(bound)
            subset_sizes.append(subset)
        t1 = time.perf_counter()
        if "lora" in spaces and h in run.lora_horizons:
            gram_path = run.cache / f"{run.key}-p{p:03d}-lora-h{h}-d{run.sketch_dim}.pt"
            if gram_path.exists() or time.perf_counter() < run.deadline:
                lora = cached_lora_gram(
                    adapter, pools.data[p], run.cache, run.key, p, h, run.sketch_dim, run.temperature
                )
                grams["lora"] = lora["K"]
                lora_s[p] = lora["seconds"]
            else:
                lora_missing.append(p)
        t2 = time.perf_counter()
        coords = None
        if analysis.yardstick and "lm_head" in grams:
            coord_gen = torch.Generator().manual_seed(pool_seed(args.seed, p) * 7919 + h + 1)
            coords = head_coordinates(cut, head_weight, run.temperature, args.kappa_coords, coord_gen)
        for space, K in grams.items():
            # The same random groups in every space and for every estimator: seeded by (seed, prompt, horizon).
            generator.manual_seed(pool_seed(args.seed, p) * 7919 + h)
            per_prompt[space].append(
                analyse_prompt(
                    K, R, proxy, mask, run.Ns, run.num_groups, generator, analysis.estimators, analysis.decompose,
                    args.decompose_Ns, centred=analysis.centred, coords=coords if space == "lm_head" else None,
                )
            )  # fmt: skip
        if analysis.fallbacks:
            generator.manual_seed(pool_seed(args.seed, p) * 7919 + h)  # the groups analysed above, drawn again
            for name, value in check_fallbacks(R, proxy, mask, run.Ns, run.num_groups, generator).items():
                fallback_checks[name] = max(fallback_checks.get(name, 0.0), value)
        t3 = time.perf_counter()
        t_head += (t1 - t0) + (t3 - t2) * ("lm_head" in grams) / max(len(grams), 1)
        t_lora += (t2 - t1) + (t3 - t2) * ("lora" in grams) / max(len(grams), 1)
        kept_rows.append({"prompt": p, "mean_reward": sum(rewards) / len(rewards), "seed": pools.data[p]["seed"]})
        mean_len.append(float(mask.sum(1).float().mean()))
    return {
        "per_prompt": per_prompt,
        "bounds": bounds,
        "subset_sizes": subset_sizes,
        "mean_len": mean_len,
        "kept_rows": kept_rows,
        "lora_missing": lora_missing,
        "seconds": {"lm_head": t_head, "lora": t_lora},
        "fallback_checks": fallback_checks,
    }


def summarise_space(space, h, cells: dict, args, run: Plan, analysis: Analysis) -> dict:
    """The JSON entry of one space at horizon ``h``: the bootstrap table, the paired tests, the decomposition."""
    rows = cells["per_prompt"][space]
    generator = torch.Generator().manual_seed(args.seed * 31 + h)
    table, paired = (
        summarise(rows, run.Ns, args.bootstrap, generator, list(analysis.estimators), analysis.pairs)
        if rows
        else ({}, {})
    )
    decomposition = (
        decomposition_summary(rows, table, [n for n in run.Ns if n in args.decompose_Ns], analysis.decompose)
        if rows and analysis.decompose
        else None
    )
    centred = yardstick = None
    if rows and analysis.centred:
        # The same analysis in the score-centred pool (position_centring), with its own resampling seed so that
        # the pool reference's numbers do not depend on whether this runs.
        view = [{key[1:]: cell for key, cell in pp.items() if key[0] == "centred"} for pp in rows]
        table_c, paired_c = summarise(
            view, run.Ns, args.bootstrap, torch.Generator().manual_seed(args.seed * 31 + h + 17),
            list(analysis.estimators), analysis.pairs,
        )  # fmt: skip
        centred = {"table": table_c, "paired": paired_c, "calibration": calibration(table_c, run.Ns)}
        if analysis.yardstick:
            y_table, y_paired = summarise_yardstick(
                view, run.Ns, list(analysis.estimators), args.batch_groups, args.bootstrap,
                torch.Generator().manual_seed(args.seed * 31 + h + 29),
            )  # fmt: skip
            yardstick = {"batch_groups": args.batch_groups, "table": y_table, "paired": y_paired}
    answer = matching_n(table, run.Ns) if table and 4 in run.Ns else None
    lora_missing = cells["lora_missing"]
    mean_len = cells["mean_len"]
    return {
        "horizon": h,
        **({"yardstick": yardstick} if yardstick else {}),
        "prompts_kept": [r for r in cells["kept_rows"] if space != "lora" or r["prompt"] not in lora_missing],
        "prompts_target": run.target,
        "mean_completion_tokens": sum(mean_len) / max(len(mean_len), 1),
        "tail_bound_max": max(cells["bounds"], default=0.0) if space == "lm_head" else 0.0,
        "vocab_subset_sizes": cells["subset_sizes"] if space == "lm_head" else [],
        "grpo_N_matching_otb_N4": answer,
        "grpo_std_N_matching_otb_N4": matching_n(table, run.Ns, "grpo_std")
        if answer is not None and f"N={run.Ns[0]}/grpo_std" in table
        else None,
        "table": table,
        "paired": paired,
        "decomposition": decomposition,
        "missing": (f"adapter Gram matrices of prompts {lora_missing} (time limit)" if lora_missing else None)
        if space == "lora"
        else None,
        **(
            {
                "calibration": calibration(table, run.Ns),
                "fallback_checks": cells["fallback_checks"],
                "centred": centred,
            }
            if analysis.centred and table
            else {}
        ),
    }
