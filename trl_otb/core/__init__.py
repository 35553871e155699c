"""The math of trl-otb, torch only (no TRL import), usable from any training loop.

- :mod:`.proxy`       per-token weights w_t from forward probabilities (``logit_gradient_proxy``, ``sum_pi_squared``)
- :mod:`.otb`         the Optimal Token Baseline (``otb_advantages``, ``otb_terms``)
- :mod:`.spec`        its specification as plain loops (``reference_otb``), what ``otb`` is tested against
- :mod:`.estimators`  OTB and the sequence-level baselines by name (``ESTIMATORS``, ``compute_advantages``)
- :mod:`.diagnostics` the per-step ``otb/`` statistics (``otb_diagnostics``)
- :mod:`.yardstick`   how good a gradient estimator is: cos, scale, snr, eps_star, kappa (``yardstick``)
- :mod:`.groups`, :mod:`.checks`  group reductions and input validation shared by the above
"""

from .checks import InfiniteRewardWarning, NaNRewardWarning, NonFiniteGradientWarning
from .diagnostics import otb_diagnostics
from .estimators import (
    ESTIMATORS,
    GRPO_SCALES,
    Estimator,
    compute_advantages,
    grpo_advantages,
    ogb_advantages,
    opo_advantages,
    register_estimator,
    rloo_advantages,
)
from .otb import (
    ALIGNS,
    OFFSET_DEPENDENT_TAILS,
    REMOVED_TAILS,
    SHIFT_INVARIANT_TAILS,
    SHRINKAGES,
    TAILS,
    OTBTerms,
    check_tail,
    otb_advantages,
    otb_terms,
    resolve_shrinkage,
)
from .proxy import compute_dtype, logit_gradient_proxy, sum_pi_squared, uniform_proxy
from .yardstick import yardstick, yardstick_from_products

__all__ = [
    "ALIGNS",
    "ESTIMATORS",
    "GRPO_SCALES",
    "OFFSET_DEPENDENT_TAILS",
    "REMOVED_TAILS",
    "SHIFT_INVARIANT_TAILS",
    "SHRINKAGES",
    "TAILS",
    "Estimator",
    "InfiniteRewardWarning",
    "NaNRewardWarning",
    "NonFiniteGradientWarning",
    "OTBTerms",
    "compute_advantages",
    "compute_dtype",
    "grpo_advantages",
    "logit_gradient_proxy",
    "ogb_advantages",
    "opo_advantages",
    "otb_advantages",
    "otb_diagnostics",
    "check_tail",
    "otb_terms",
    "resolve_shrinkage",
    "register_estimator",
    "rloo_advantages",
    "sum_pi_squared",
    "uniform_proxy",
    "yardstick",
    "yardstick_from_products",
]
