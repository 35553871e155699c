"""trl-otb: the Optimal Token Baseline (OTB) for GRPO training in Hugging Face TRL.

The math (``otb_advantages`` and friends, in ``trl_otb.core``) imports only torch; ``OTBConfig`` and ``OTBTrainer``
import TRL on first use.
"""

from .core import (
    ESTIMATORS,
    InfiniteRewardWarning,
    NaNRewardWarning,
    NonFiniteGradientWarning,
    compute_advantages,
    grpo_advantages,
    logit_gradient_proxy,
    ogb_advantages,
    opo_advantages,
    otb_advantages,
    otb_terms,
    rloo_advantages,
    sum_pi_squared,
)

__version__ = "0.2.0"

__all__ = [
    "ESTIMATORS",
    "InfiniteRewardWarning",
    "NaNRewardWarning",
    "NonFiniteGradientWarning",
    "OTBConfig",
    "OTBTrainer",
    "compute_advantages",
    "grpo_advantages",
    "logit_gradient_proxy",
    "ogb_advantages",
    "opo_advantages",
    "otb_advantages",
    "otb_terms",
    "rloo_advantages",
    "sum_pi_squared",
]


def __getattr__(name):
    if name == "OTBConfig":
        from .config import OTBConfig

        return OTBConfig
    if name == "OTBTrainer":
        from .trainer import OTBTrainer

        return OTBTrainer
    raise AttributeError(f"module 'trl_otb' has no attribute {name!r}")
