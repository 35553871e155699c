"""``trl-otb gradient-check`` and :func:`gradient_check`: the check, its table, its JSON and its plot.

    trl-otb gradient-check --quick --out gc                        # embedded SmolLM2-135M, generated math, offline
    trl-otb gradient-check --config examples/recipes/cpu_smollm2_lora.yaml --out gc
    trl-otb gradient-check --model Qwen/Qwen2.5-0.5B-Instruct --dataset openai/gsm8k --dataset-config main \\
        --reward-funcs my_rewards.accuracy --out gc

A rerun with the same ``--out`` resumes: the pools already drawn are read back, and ``--prompts`` larger than before
extends the check, whose intervals then tighten.
"""

from __future__ import annotations

import dataclasses
import importlib
import itertools
import json
import math
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

from ..config import OTBConfig
from ..plotting import pyplot
from .analysis import CONTROLS, estimators_for, prompt_cells, reading, summarise
from .pools import SPACES, check_trainer, draw_pool, space_data

__all__ = ["add_subcommand", "format_report", "gradient_check", "plot_report"]

DEFAULTS = {"prompts": 16, "pool_size": 16, "num_groups": 64, "bootstrap": 1000}
QUICK = {"prompts": 8, "pool_size": 8, "num_groups": 64, "bootstrap": 400, "max_completion_length": 64}
"""``--quick``: under 3 minutes on 2 CPU cores with the embedded model (docs/gradient_check.md has the timing)."""
DEFAULT_DATASET = "trl_otb.demo.data:load_math_dataset"
DEFAULT_REWARD = "trl_otb.demo.rewards.accuracy_reward"
"""With no dataset and no reward given: the demo's generated math problems and its accuracy reward, loaded by name
on that request only (the library imports no demo module)."""
POOL_SETTINGS = ("model", "pool_size", "max_completion_length", "temperature", "seed")
"""What defines the pools kept in ``out/pools``: a rerun with other values is refused. The parameter space and its
sketch sizes may change: each keeps its own gradients beside the pools, so spaces are compared on the same pools."""


def gradient_check(model, reward_funcs, train_dataset, args: OTBConfig | None = None, *, processing_class=None,
                   peft_config=None, params: str | None = None, prompts: int = 16, pool_size: int = 16,
                   num_groups: int = 64, batch_groups: int | None = None, bootstrap: int = 1000, seed: int = 0,
                   out=None, kappa_dim: int = 4096, sketch_dim: int = 2**14, progress: bool = True) -> dict:  # fmt: skip
    """Measure each advantage estimator's gradient on your setup, before training; returns the report (as JSON).

    Takes what ``OTBTrainer`` takes (``model``, ``reward_funcs``, ``train_dataset`` with a ``prompt`` column, an
    ``OTBConfig``, ``processing_class``, ``peft_config``). For each of ``prompts`` prompts it draws a pool of
    ``pool_size`` completions with the trainer's generation, scoring and rollout pass, then draws ``num_groups``
    groups of ``args.num_generations`` from each pool and reports per estimator ``cos``, ``scale``, ``snr``,
    ``eps_star``, ``kappa`` and ``signal_kept`` (1 - eps_star) with 95% intervals, at ``batch_groups`` groups per
    step (default: the config's per optimizer step), and the paired comparisons against unscaled GRPO and TRL's GRPO.
    ``params`` is where the per-token gradients live (``SPACES``; default ``adapter`` for a PEFT model, else
    ``head``). ``out``: a directory that keeps the pools (a rerun resumes or extends) and the JSON.
    """
    from accelerate.utils import is_peft_model

    with tempfile.TemporaryDirectory(prefix="trl-otb-gradient-check-") as scratch:  # the trainer's output_dir
        args = args or OTBConfig(output_dir=scratch, **({} if torch.cuda.is_available() else CPU_DEFAULTS))
        N = args.num_generations
        if pool_size < N:
            raise ValueError(
                f"pool_size ({pool_size}) must be at least num_generations ({N}): groups are drawn from it."
            )
        if prompts < 2:
            raise ValueError(
                f"prompts={prompts}: an interval needs at least 2 prompts whose rewards differ; pass more."
            )
        if getattr(args, "loss_type", None) == "grpo":
            warnings.warn(
                "loss_type='grpo' divides each completion's loss by its length; gradient-check measures the sum over "
                "tokens (the direction of 'dapo', 'bnpo' and 'dr_grpo'), so its numbers describe those losses.",
                stacklevel=2,
            )
        trainer = check_trainer(model, reward_funcs, train_dataset, args, pool_size, scratch,
                                processing_class=processing_class, peft_config=peft_config)  # fmt: skip
        if trainer.accelerator.num_processes > 1:
            raise ValueError(
                f"gradient-check runs in one process (this launch has {trainer.accelerator.num_processes}): start it with "
                "`trl-otb gradient-check` or `python`, not `accelerate launch` with several processes."
            )
        model = trainer.model
        params = params or ("adapter" if is_peft_model(model) else "head")
        if params not in SPACES:
            raise ValueError(f"params={params!r}: choose one of {SPACES}.")
        batch = batch_groups or max(1, args.per_device_train_batch_size * args.gradient_accumulation_steps // N)
        settings = {
            "model": _model_name(model), "params": params, "pool_size": pool_size,
            "max_completion_length": args.max_completion_length, "temperature": trainer.temperature, "seed": seed,
            "kappa_dim": kappa_dim, "sketch_dim": sketch_dim if params != "head" else 0,
        }  # fmt: skip
        cache = _pool_cache(out, {k: settings[k] for k in POOL_SETTINGS})
        rows = _first_rows(trainer.train_dataset, prompts, seed)
        estimators = estimators_for(args)
        start, cells, unscorable, reused = time.perf_counter(), [], 0, 0
        bar = _progress(prompts, progress)
        for i in range(prompts):
            pool_path = None if cache is None else cache / f"p{i:04d}.pt"
            space_path = (
                None if cache is None else cache / f"p{i:04d}-{params}-k{kappa_dim}-s{settings['sketch_dim']}.pt"
            )
            if pool_path is not None and pool_path.exists():
                pool, reused = torch.load(pool_path, weights_only=False), reused + 1
            else:
                bar.set_description(f"prompt {i + 1}/{prompts}: sampling")
                pool = draw_pool(trainer, rows[i], pool_size, seed * 100_003 + i)
                if pool_path is not None:
                    torch.save(pool, pool_path)
            if space_path is not None and space_path.exists():
                space = torch.load(space_path, weights_only=False)
            else:
                bar.set_description(f"prompt {i + 1}/{prompts}: gradients ({params})")
                space = space_data(model, pool, params, trainer.temperature, kappa_dim=kappa_dim,
                                   sketch_dim=sketch_dim, seed=seed + i)  # fmt: skip
                if space_path is not None:
                    torch.save(space, space_path)
            unscorable += int((~torch.isfinite(pool["rewards"])).sum())
            generator = torch.Generator().manual_seed(seed * 7919 + i)  # each prompt's groups: extending keeps them
            cells.append(prompt_cells(space, pool, N, num_groups, generator, estimators))
            bar.update(1)
        bar.close()
        informative = [c for c in cells if c is not None]
        if not informative:
            raise ValueError(
                f"Every one of the {prompts} pools tied (all scorable completions of a prompt got the same reward): no "
                "estimator has a gradient there, so none can be compared. Use prompts the model sometimes solves, a "
                "reward with more levels, or more prompts."
            )
        if len(informative) < 2:
            raise ValueError(f"Only 1 of {prompts} prompts has rewards that differ; an interval needs 2 or more: pass more prompts.")  # fmt: skip
        rows, paired = summarise(informative, estimators, batch, bootstrap, seed)
        report = {
            "meta": {
                **settings, "num_generations": N, "batch_groups": batch, "num_groups": num_groups, "bootstrap": bootstrap,
                "prompts": prompts, "informative_prompts": len(informative), "unscorable_completions": unscorable,
                "estimators": {name: {"estimator": e, "options": o} for name, (e, o) in estimators.items()},
                "seconds": round(time.perf_counter() - start, 1), "pools_read_back": reused, "command": _command_line(),
            },
            "rows": rows,
            "paired": paired,
            "reading": reading(paired),
        }  # fmt: skip
        if len(informative) < 4:
            warnings.warn(
                f"Only {len(informative)} prompts had rewards that differ: the intervals are wide.", stacklevel=2
            )
        if out is not None:
            Path(out, "gradient_check.json").write_text(json.dumps(report, indent=1) + "\n")
        return report


def _model_name(model) -> str:
    """The model's name or path; the embedded model by its display name (not its cache path)."""
    from ..models import EMBEDDED_MODEL_NAME, is_embedded_checkpoint

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    name = str(getattr(base.config, "_name_or_path", ""))
    return EMBEDDED_MODEL_NAME if name and is_embedded_checkpoint(name) else name


def _first_rows(dataset, prompts: int, seed: int) -> list[dict]:
    """The first ``prompts`` rows of the dataset shuffled by ``seed`` (a streamed dataset: its first rows, as read)."""
    from datasets import IterableDataset

    if isinstance(dataset, IterableDataset):
        rows = list(itertools.islice(dataset, prompts))
    else:
        shuffled = dataset.shuffle(seed=seed)
        rows = [shuffled[i] for i in range(min(prompts, len(shuffled)))]
    if len(rows) < prompts:
        raise ValueError(f"The dataset has {len(rows)} prompts; prompts={prompts} needs that many: pass fewer.")
    return rows


def _command_line() -> str:
    """How this process was started, with the entry point by its name (``trl-otb``, ``python -m trl_otb.cli``)."""
    first = Path(sys.argv[0])
    name = "trl-otb" if first.name == "trl-otb" else "python -m trl_otb.cli" if first.name == "cli.py" else str(first)
    return " ".join([name, *sys.argv[1:]])


def _pool_cache(out, settings: dict) -> Path | None:
    if out is None:
        return None
    cache = Path(out) / "pools"
    cache.mkdir(parents=True, exist_ok=True)
    file = cache / "settings.json"
    if file.exists():
        before = json.loads(file.read_text())
        changed = {k: (before.get(k), settings[k]) for k in settings if before.get(k) != settings[k]}
        if changed:
            raise ValueError(
                f"{out} holds pools drawn with other settings ({changed}, as (then, now)): use another --out, or the "
                "same settings to resume or extend it."
            )
    file.write_text(json.dumps(settings, indent=1) + "\n")
    return cache


def _progress(total: int, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, unit="prompt", disable=not enabled, file=sys.stderr)


def format_report(report: dict) -> str:
    """The terminal table: one row per estimator, then the calibration and the reading."""
    meta, rows = report["meta"], report["rows"]

    def ci(row, key, fmt="{:.3f}"):
        lo, hi = row[f"{key}_ci"]
        return f"{fmt.format(row[key])} [{fmt.format(lo)}, {fmt.format(hi)}]"

    lines = [
        f"gradient-check: {meta['model']} | gradients in: {meta['params']} | N={meta['num_generations']}, "
        f"B={meta['batch_groups']} groups per step | {meta['informative_prompts']} of {meta['prompts']} prompts with "
        f"differing rewards, pools of {meta['pool_size']}",
        f"{'estimator':<26}{'cos [95% CI]':<27}{'scale':>7}{'snr':>8}  {'eps_star [95% CI]':<27}{'kappa':>7}"
        f"{'signal kept':>13}",
    ]
    for name, row in rows.items():
        label = name + (f" ({CONTROLS[name]})" if name in CONTROLS else "")
        lines.append(
            f"{label:<26}{ci(row, 'cos'):<27}{row['scale']:>7.3f}{row['snr']:>8.3f}  {ci(row, 'eps_star'):<27}"
            f"{row['kappa']:>7.3f}{row['signal_kept']:>13.3f}"
        )
    N = meta["num_generations"]
    lines.append(
        f"calibration: in expectation unscaled GRPO's scale is 1 - 1/N = {1 - 1 / N:.3f} and RLOO's 1, both with cos 1;"
        f" measured {ci(rows['grpo'], 'scale')} and {ci(rows['rloo'], 'scale')}."
    )
    lines.append(report["reading"])
    return "\n".join(lines)


def plot_report(report: dict, filename) -> None:
    """``eps_star`` and ``cos`` per estimator with their 95% intervals."""
    plt = pyplot(otherwise="or drop --plot")
    names = list(report["rows"])
    fig, axes = plt.subplots(1, 2, figsize=(10, 0.45 * len(names) + 1.5), sharey=True)
    for ax, key, label in zip(axes, ("eps_star", "cos"), ("eps_star (lower is better)", "cos (1 is unbiased)")):
        values = [report["rows"][n][key] for n in names]
        lo = [v - report["rows"][n][f"{key}_ci"][0] for n, v in zip(names, values)]
        hi = [report["rows"][n][f"{key}_ci"][1] - v for n, v in zip(names, values)]
        ax.errorbar(values, range(len(names)), xerr=[lo, hi], fmt="o")
        ax.set_xlabel(label)
    axes[0].set_yticks(range(len(names)), names)
    fig.suptitle(report["reading"], fontsize=7, wrap=True)
    fig.tight_layout()
    fig.savefig(filename, dpi=120)
    plt.close(fig)


# --- the command ------------------------------------------------------------------------------------------------


def add_subcommand(subparsers) -> None:
    """``trl-otb gradient-check``: its options."""
    p = subparsers.add_parser(
        "gradient-check",
        help="Is OTB's gradient better than GRPO's on your model, prompts and reward? (minutes, before training)",
        description=__doc__.split("\n\n")[0],
    )
    p.add_argument("--config", help="a YAML recipe (examples/recipes/): OTBConfig fields, model and dataset keys")
    p.add_argument("--model", help="model name or path (default: the recipe's, else the embedded SmolLM2-135M)")
    p.add_argument("--dataset", help="a Hub id, a local dataset or .json/.jsonl/.csv/.parquet file, or "
                   "module:callable returning one (default: the demo's generated math problems)")  # fmt: skip
    p.add_argument("--dataset-config", default=None)
    p.add_argument("--dataset-split", default="train")
    p.add_argument("--reward-funcs", nargs="+", help="import paths of reward functions, e.g. my_rewards.accuracy")
    p.add_argument("--params", choices=SPACES, help="where the gradients live (default: adapter with PEFT, else head)")
    p.add_argument("--use-peft", action="store_true", help="measure a fresh LoRA adapter (--lora-r, --lora-alpha)")
    p.add_argument("--lora-r", type=int, default=16)
    p.add_argument("--lora-alpha", type=int, default=32)
    p.add_argument("--num-generations", type=int, help="group size N (default: the recipe's, else 4)")
    p.add_argument("--prompts", type=int, help=f"prompts measured (default {DEFAULTS['prompts']})")
    p.add_argument("--pool", type=int, help=f"completions per prompt (default {DEFAULTS['pool_size']})")
    p.add_argument("--groups", type=int, help=f"groups drawn per prompt (default {DEFAULTS['num_groups']})")
    p.add_argument(
        "--batch-groups", type=int, help="groups per training step for snr and eps_star (default: the config's)"
    )
    p.add_argument("--bootstrap", type=int, help=f"bootstrap resamples (default {DEFAULTS['bootstrap']})")
    p.add_argument("--max-completion-length", type=int, help="overrides the config's")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="a smaller check: 8 prompts, pools of 8, 64 tokens")
    p.add_argument("--out", default="gradient_check", help="directory for the pools, the JSON and the plot")
    p.add_argument("--plot", action="store_true", help="also write gradient_check.png (needs matplotlib)")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=_command)


MODEL_KEYS = ("model_name_or_path", "use_peft", "lora_r", "lora_alpha", "lora_target_modules", "dtype")
DATA_KEYS = ("dataset_name", "dataset_config", "dataset_train_split", "reward_funcs")
CPU_DEFAULTS = {"use_cpu": True, "bf16": False, "gradient_checkpointing": False}


def _recipe(path) -> tuple[dict, dict]:
    """(OTBConfig fields, the recipe's model and data keys); other keys are named in a warning, never dropped
    silently."""
    import yaml

    recipe = yaml.safe_load(Path(path).read_text()) if path else {}
    names = {f.name for f in dataclasses.fields(OTBConfig) if f.init}
    config = {k: v for k, v in recipe.items() if k in names}
    other = {k: v for k, v in recipe.items() if k in MODEL_KEYS + DATA_KEYS}
    ignored = sorted(set(recipe) - set(config) - set(other))
    if ignored:
        warnings.warn(
            f"gradient-check ignores these keys of {path} (not OTBConfig, model or data keys): {ignored}", stacklevel=2
        )
    return config, other


def _load(spec: str):
    """``module:attr`` or ``module.attr`` -> the object."""
    module, _, attr = spec.partition(":") if ":" in spec else spec.rpartition(".")
    if not module:
        raise ValueError(f"{spec!r} is not an import path: write module.function (or module:function).")
    sys.path.insert(0, ".")
    return getattr(importlib.import_module(module), attr)


def _dataset(spec: str | None, config: str | None, split: str):
    if spec is None or ":" in spec:
        data = _load(spec or DEFAULT_DATASET)()
    elif Path(spec).suffix in (".json", ".jsonl", ".csv", ".parquet"):
        from datasets import load_dataset

        data = load_dataset(Path(spec).suffix.strip(".").replace("jsonl", "json"), data_files=spec)
    else:
        from datasets import load_dataset

        data = load_dataset(spec, config)
    return data[split] if hasattr(data, "keys") else data


def _command(args) -> int:
    fields, other = _recipe(args.config)
    if not torch.cuda.is_available():
        fields = {**CPU_DEFAULTS, **fields}
    sizes = dict(DEFAULTS, **({k: v for k, v in QUICK.items() if k in DEFAULTS} if args.quick else {}))
    if args.quick:
        fields["max_completion_length"] = min(fields.get("max_completion_length", 64), QUICK["max_completion_length"])
    if args.max_completion_length:
        fields["max_completion_length"] = args.max_completion_length
    if args.num_generations:
        fields["num_generations"] = args.num_generations
    fields.setdefault("num_generations", 4)  # the README's quick start and the paper's N = 4
    config = OTBConfig(output_dir=None, **{k: v for k, v in fields.items() if k != "output_dir"})  # the check's own
    from ..models import load_model_and_tokenizer

    model, tokenizer = load_model_and_tokenizer(args.model or other.get("model_name_or_path"))
    peft_config = None
    if args.use_peft or other.get("use_peft"):
        from peft import LoraConfig

        peft_config = LoraConfig(r=other.get("lora_r", args.lora_r), lora_alpha=other.get("lora_alpha", args.lora_alpha),
                                 target_modules=other.get("lora_target_modules") or "all-linear", task_type="CAUSAL_LM")  # fmt: skip
    given = args.dataset or other.get("dataset_name")
    rewards = args.reward_funcs or other.get("reward_funcs") or ([DEFAULT_REWARD] if given is None else None)
    if not rewards:
        raise SystemExit("gradient-check needs --reward-funcs (import paths) with your own --dataset.")
    dataset = _dataset(given, args.dataset_config or other.get("dataset_config"), args.dataset_split)
    report = gradient_check(
        model, [_load(r) for r in rewards], dataset, config, processing_class=tokenizer, peft_config=peft_config,
        params=args.params, prompts=args.prompts or sizes["prompts"], pool_size=args.pool or sizes["pool_size"],
        num_groups=args.groups or sizes["num_groups"], batch_groups=args.batch_groups,
        bootstrap=args.bootstrap or sizes["bootstrap"], seed=args.seed, out=args.out, progress=not args.no_progress,
    )  # fmt: skip
    print(format_report(report))
    if args.plot:
        plot_report(report, Path(args.out) / "gradient_check.png")
    print(f"wrote {Path(args.out) / 'gradient_check.json'}" + (" and gradient_check.png" if args.plot else ""))
    return 0 if all(math.isfinite(r["eps_star"]) for r in report["rows"].values()) else 1
