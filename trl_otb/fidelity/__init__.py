"""Proxy fidelity: does the OTB proxy w_t rank tokens like the true per-token gradient norm?

OTB's optimal baseline weighs tokens by the realized energy ``W_t = sum_{j<=t} ||s_j||^2`` of the
score ``s_t = grad_theta log pi(y_t | x, y_<t)``, taken over the parameters that train. The
trainer uses the logit-gradient proxy ``w_t = ||e_{y_t} - pi_t||^2`` instead (exact for the
gradient w.r.t. the logits). This package computes both on a small batch and compares them.
One file per job:

===========  ==================================================================================
proxies.py   the candidate proxies (``logit``, ``uniform``, ``length``, ``head``, ``hidden``)
exact.py     exact per-token ``||s_t||^2`` over the trainable parameters, and the proxies beside it
stats.py     rank statistics and the baselines they lead to (:class:`ProxyFidelity`)
report.py    :func:`fidelity_check` on sampled rows, :class:`FidelityReport`, the table
training.py  the check as ``OTBTrainer`` runs it on a generation batch
peft.py      the training paths: full, LoRA, QLoRA
sampling.py  completions to measure, in TRL's batch layout
cli.py       ``trl-otb fidelity``, :func:`run_fidelity_check` and the plots (matplotlib: an extra);
             loaded on first use of its names, so ``OTBTrainer`` (which runs ``training.py``) never
             imports the command
===========  ==================================================================================

QLoRA on CPU: bitsandbytes repacks 4-bit weights on the first eval/no-grad forward and gradients
through them are wrong afterwards; every entry point here calls
:func:`trl_otb.bnb.guard_4bit_cpu_repack` first (see that module, beside the trainer).
"""

from .exact import TokenStatistics, token_statistics
from .peft import PEFT_PATHS, prepare_peft_model
from .proxies import CANDIDATE_PROXIES, hidden_gradient_proxy
from .report import FidelityReport, fidelity_check, format_table
from .sampling import DEFAULT_PROMPTS, sample_completions
from .stats import ProxyFidelity, fidelity_metrics, pearson, spearman
from .training import TRAINER_KEYS, batch_fidelity, low_fidelity_message

__all__ = [
    "CANDIDATE_PROXIES",
    "DEFAULT_PROMPTS",
    "PEFT_PATHS",
    "TRAINER_KEYS",
    "FidelityReport",
    "ProxyFidelity",
    "TokenStatistics",
    "add_subcommand",
    "batch_fidelity",
    "fidelity_check",
    "fidelity_metrics",
    "format_table",
    "hidden_gradient_proxy",
    "low_fidelity_message",
    "pearson",
    "plot_reports",
    "prepare_peft_model",
    "run_fidelity_check",
    "sample_completions",
    "spearman",
    "token_statistics",
]

_CLI_NAMES = ("add_subcommand", "plot_reports", "run_fidelity_check")


def __getattr__(name):
    if name in _CLI_NAMES:
        from . import cli

        return getattr(cli, name)
    raise AttributeError(f"module 'trl_otb.fidelity' has no attribute {name!r}")
