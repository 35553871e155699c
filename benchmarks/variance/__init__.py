"""The gradient-variance benchmark, ``python -m benchmarks.variance`` (its options and commands: ``cli.py``): how much
the policy gradient of each advantage estimator varies, in the LM head's and in a LoRA adapter's parameter space.

Method. For each prompt, a pool of M completions is sampled once (temperature 1) at the longest horizon and scored
with the accuracy reward; a shorter horizon h uses the same completions cut to their first h tokens (exactly what
sampling with max_completion_length=h gives) and scores them again. Only prompts whose rewards differ within the
pool at that horizon are kept. Many groups of N completions are drawn i.i.d. (with replacement) from each pool;
each estimator turns a group into token advantages A_t^(i) and a gradient estimate
g = (1/N) sum_i sum_t A_t^(i) s_t^(i).

    sampling.py     the tasks (model, prompts, reward), each prompt's pool, sampled once and cached, the groups
    estimators.py   the estimators compared: the shipped ones, the study's variants, OTB's tail fallbacks
    gradients.py    each space's token Gram matrix; every gradient as coefficients over the pool's tokens
    statistics.py   the bootstrap: means and intervals, paired tests, the squared bias and its calibration
    yardstick.py    --yardstick: cos, scale, snr, eps_star, kappa of each estimator (bias-corrected, with intervals)
    run.py          one invocation: its plan, its pools, the analysis of each horizon
    report.py       the figure and the printed summary
    cli.py          the options, the JSON's meta, ``main``

The names below are the package's face, for the tests and the training study's precondition.
"""

from benchmarks.variance.cli import main
from benchmarks.variance.estimators import (
    SHARE_BINS,
    SHIFT_INVARIANT_TAILS,
    VARIANCE_ESTIMATORS,
    core_tails,
    fallback_estimators,
    fallback_name,
    otb_carry_advantages,
    otb_fallback_advantages,
    otb_tail_last_advantages,
    share_bin,
)
from benchmarks.variance.gradients import (
    adapter_token_gradients,
    analyse_prompt,
    attach_adapter,
    group_coefficients,
)
from benchmarks.variance.sampling import (
    completion_records,
    count_reward,
    load_or_sample_pool,
    pool_seed,
    prompt_tensors,
    sample_pool,
)
from benchmarks.variance.statistics import squared_bias, summarise
from trl_otb.gradcheck.gram import (
    draw_groups,
    head_statistics,
    position_centring,
    reference_coefficients,
    token_gram,
)

__all__ = [
    "SHARE_BINS",
    "SHIFT_INVARIANT_TAILS",
    "VARIANCE_ESTIMATORS",
    "adapter_token_gradients",
    "analyse_prompt",
    "attach_adapter",
    "completion_records",
    "core_tails",
    "count_reward",
    "draw_groups",
    "fallback_estimators",
    "fallback_name",
    "group_coefficients",
    "head_statistics",
    "load_or_sample_pool",
    "main",
    "otb_carry_advantages",
    "otb_fallback_advantages",
    "otb_tail_last_advantages",
    "pool_seed",
    "position_centring",
    "prompt_tensors",
    "reference_coefficients",
    "sample_pool",
    "share_bin",
    "squared_bias",
    "summarise",
    "token_gram",
]
