"""``trl-otb gradient-check``: on your model, prompts and reward, is OTB's gradient better than GRPO's?

Before a training run, this samples a pool of completions per prompt with ``OTBTrainer``'s own generation, scoring
and rollout pass, then measures each advantage estimator's gradient against the pool's policy gradient with the
yardstick of :mod:`trl_otb.core.yardstick` (``cos``, ``scale``, ``snr``, ``eps_star``, ``kappa``). docs/gradient_check.md
tells how to read it.

===========  ==================================================================================
gram.py      token Gram matrices (LM head, any ``nn.Linear`` set), coefficients, the centred pool
stats.py     the yardstick's estimates from groups, bootstrap intervals, paired differences
pools.py     the pools, drawn through ``OTBTrainer`` and cached per prompt (resumable)
analysis.py  the estimators, each prompt's cells, the report
cli.py       ``trl-otb gradient-check``, :func:`gradient_check`, the table and the plot
===========  ==================================================================================
"""

_CLI_NAMES = ("add_subcommand", "gradient_check", "format_report")


def __getattr__(name):
    if name in _CLI_NAMES:
        from . import cli

        return getattr(cli, name)
    raise AttributeError(f"module 'trl_otb.gradcheck' has no attribute {name!r}")
