"""``trl-otb fidelity``: sample, measure every training path, print a table, write JSON and plots.

:func:`run_fidelity_check` is the same work for one path, callable from Python. The plots need
matplotlib, an optional extra (``pip install 'trl-otb[plots]'``): it is imported only when a plot is drawn.
"""

from __future__ import annotations

import importlib.util
import json
import sys

import torch

from ..plotting import pyplot
from .peft import PEFT_PATHS, prepare_peft_model, training_path
from .report import FidelityReport, fidelity_check, format_table
from .sampling import DEFAULT_PROMPTS, sample_completions

__all__ = ["add_subcommand", "plot_reports", "run_fidelity_check"]


def run_fidelity_check(
    model: torch.nn.Module,
    tokenizer,
    prompts=None,
    *,
    num_samples: int = 4,
    max_new_tokens: int = 32,
    temperature: float = 1.0,
    peft: str = "none",
    seed: int = 0,
    rewards: torch.Tensor | None = None,
    **lora_options,
) -> FidelityReport:
    """Sample completions and measure proxy fidelity on one training path.

    ``model`` is wrapped according to ``peft`` by :func:`prepare_peft_model` (``lora_options``:
    ``lora_r``, ``lora_alpha``, ``target_modules``). ``prompts`` defaults to a few short
    instructions; each gets ``num_samples`` completions forming one group. ``rewards [B]`` default to
    random 0/1 from ``seed``.
    """
    model = prepare_peft_model(model, peft, **lora_options)
    prompts = list(DEFAULT_PROMPTS if prompts is None else prompts)
    batch = sample_completions(
        model,
        tokenizer,
        prompts,
        num_samples=num_samples,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        seed=seed,
    )
    path = training_path(model) if peft == "none" else peft
    return fidelity_check(
        model,
        batch["input_ids"],
        batch["attention_mask"],
        batch["completion_mask"],
        temperature,
        rewards=rewards,
        group_ids=batch["group_ids"],
        seed=seed,
        path=path,
    )


def _pyplot():
    """pyplot for the ``--plot`` scatter; without matplotlib, an ImportError naming the plots extra."""
    return pyplot(otherwise="or pass no plot option, e.g. drop --plot")


def plot_reports(reports: dict[str, FidelityReport], filename: str, proxies=("logit", "hidden")) -> None:
    """Scatter each proxy (rows) against the exact ``||s_t||^2`` per path (columns); write a PNG."""
    plt = _pyplot()
    proxies = [name for name in proxies if any(name in r.values for r in reports.values())]
    fig, axes = plt.subplots(
        len(proxies), len(reports), figsize=(3.2 * len(reports), 2.8 * len(proxies)), squeeze=False
    )
    for col, (path, report) in enumerate(reports.items()):
        exact = report.values["exact"].numpy()
        for row, name in enumerate(proxies):
            ax = axes[row][col]
            if name in report.values:
                ax.scatter(exact, report.values[name].numpy(), s=6, alpha=0.5)
                rho = report.proxies[name].token_spearman
                ax.set_title(f"{path}: {name} (rho={rho:.2f})", fontsize=9)
            ax.set_xscale("log")
            ax.set_yscale("log" if name != "logit" else "linear")
            ax.set_xlabel("exact ||s_t||^2", fontsize=8)
            ax.set_ylabel(f"proxy w_t ({name})", fontsize=8)
            ax.tick_params(labelsize=7)
    fig.tight_layout()
    fig.savefig(filename, dpi=80)
    plt.close(fig)


def add_subcommand(subparsers) -> None:
    """Register ``trl-otb fidelity`` on an ``argparse`` subparsers object."""
    parser = subparsers.add_parser(
        "fidelity",
        help="compare the OTB proxy with exact per-token gradient norms (full / LoRA / QLoRA)",
        description="Proxy fidelity: does the OTB proxy w_t rank tokens like the true per-token gradient norm?"
        " Samples completions, computes the exact ||grad log pi(y_t)||^2 over the trainable parameters, "
        "and compares every proxy with it. Rewards are random 0/1 (seeded).",
    )
    parser.add_argument("--model", default=None, help="local directory or Hub id (default: the embedded SmolLM2)")
    parser.add_argument("--peft", choices=(*PEFT_PATHS, "all"), default="all", help="training path(s) to measure")
    parser.add_argument("--num-prompts", type=int, default=2, help="prompts (groups) taken from the built-in list")
    parser.add_argument("--num-samples", type=int, default=4, help="completions per prompt (group size)")
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lora-r", type=int, default=8)
    parser.add_argument("--output-json", default=None, help="write the metrics of every path to this file")
    parser.add_argument("--plot", default=None, help="write proxy-vs-exact scatter plots to this PNG")
    parser.set_defaults(func=_fidelity_command)


def _fidelity_command(args) -> int:
    """Every path of ``--peft``; the JSON holds the paths that finished, even when a later one fails."""
    if not 1 <= args.num_prompts <= len(DEFAULT_PROMPTS):
        raise SystemExit(f"--num-prompts must be between 1 and {len(DEFAULT_PROMPTS)}, got {args.num_prompts}.")
    paths = PEFT_PATHS if args.peft == "all" else (args.peft,)
    _check_extras(paths, plot=bool(args.plot))  # before the minutes of measuring, not after
    device = "cuda" if torch.cuda.is_available() else "cpu"
    reports, failed = {}, None
    try:
        for peft in paths:
            failed = peft
            report = _measure(args, peft, device)
            reports[report.path] = report
            failed = None
    finally:
        if args.output_json and (reports or failed is None):
            _write_json(args, reports, device, failed)
    print(format_table(reports))
    if args.plot:
        plot_reports(reports, args.plot)
    return 0


def _check_extras(paths, *, plot: bool) -> None:
    """A SystemExit naming the extra to install, for the first path (or the plot) that could not run."""
    if "qlora" in paths and importlib.util.find_spec("bitsandbytes") is None:
        others = " or ".join(f"--peft {p}" for p in PEFT_PATHS if p != "qlora")
        raise SystemExit(
            "trl-otb fidelity: the qlora path needs bitsandbytes, which is not installed. Install it with "
            f"`pip install 'trl-otb[quantization]'`, or measure the other paths only ({others})."
        )
    if plot:
        try:
            _pyplot()
        except ImportError as err:
            raise SystemExit(str(err)) from None


def _measure(args, peft: str, device: str) -> FidelityReport:
    from ..models import EmbeddedModelUnavailableError, ModelNotAvailableError, load_model_and_tokenizer

    try:
        model, tokenizer = load_model_and_tokenizer(
            args.model, dtype=torch.float32, quantization="4bit" if peft == "qlora" else None, device_map=device
        )
    except (ModelNotAvailableError, EmbeddedModelUnavailableError) as err:
        # One line, in this command's words: its flag is --model.
        message = " ".join(str(err).split()).replace("--model_name_or_path", "--model")
        raise SystemExit(f"trl-otb fidelity: {message}") from None
    report = run_fidelity_check(
        model,
        tokenizer,
        DEFAULT_PROMPTS[: args.num_prompts],
        num_samples=args.num_samples,
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        peft=peft,
        seed=args.seed,
        lora_r=args.lora_r,
        lora_alpha=2 * args.lora_r,
    )
    print(
        f"[fidelity] {report.path}: {report.num_tokens} tokens in {report.seconds:.0f} s, "
        f"token_spearman={report.token_spearman:.3f}",
        file=sys.stderr,
        flush=True,
    )
    return report


def _write_json(args, reports: dict[str, FidelityReport], device: str, failed: str | None) -> None:
    """``--output-json``: the settings and every finished path; ``failed`` names the path that did not finish."""
    settings = {k: getattr(args, k) for k in ("num_prompts", "num_samples", "max_new_tokens", "temperature")}
    settings.update(seed=args.seed, lora_r=args.lora_r, lora_alpha=2 * args.lora_r, device=device)
    payload = {
        "model": args.model or "embedded",
        "settings": settings,
        "paths": {path: report.to_dict() for path, report in reports.items()},
    }
    if failed is not None:
        payload["failed"] = failed
    with open(args.output_json, "w") as f:
        json.dump(payload, f, indent=2)
        f.write("\n")
