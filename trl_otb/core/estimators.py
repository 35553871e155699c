"""The advantage estimators by name: OTB and the sequence-level baselines it is compared with.

Every estimator takes the same inputs and returns token-level advantages ``[B, T]`` (zero where ``mask`` is 0), so
one name switches between them:

- ``rewards``   ``[B]``    outcome reward R_i; NaN marks an unscorable completion.
- ``proxy``     ``[B, T]`` per-token weight w_t (see :mod:`trl_otb.core.proxy`), ignored where mask is 0.
- ``mask``      ``[B, T]`` 1 where the token carries gradient.
- ``group_ids`` ``[B]``    integer ids; equal ids = completions of the same prompt.

A row is *valid* when its reward is finite and its mask is not all 0. Invalid rows get advantage 0 everywhere.
``otb``, ``rloo``, ``opo`` and ``ogb`` exclude them from every baseline. ``grpo`` follows TRL's GRPOTrainer: it
excludes only non-finite rewards, so a finite reward whose mask is all 0 still counts in its group's mean and std.

The laws (tests/core/test_laws.py): every estimator is equivariant to permuting rows with their group ids, treats
each group independently (except ``grpo`` with ``scale="batch"``, by design), and is invariant to a constant added
to every reward (except OTB's offset-dependent tails ``"zero"`` and ``"none"``, by design); those that divide by no
std are positively scale-equivariant, ``A(aR) = a A(R)``. Each baseline is a weighted mean of rewards measured from
the group's minimum (``groups.above_group_min``), so a group whose valid rewards tie gets advantages of exactly 0.

Each estimator declares itself once with :func:`register_estimator`: its name, the keyword options it takes,
whether it reads ``proxy`` (``uses_proxy``) and whether its advantages can vary within a sequence
(``token_level``). :data:`ESTIMATORS` maps names to these :class:`Estimator` records, and
:func:`compute_advantages` dispatches by name, rejecting an option the chosen estimator does not take.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .checks import bad_on_mask, check_inputs, raise_overflow
from .groups import above_group_min, group_index, group_sum, valid_rows
from .otb import otb_advantages, token_weights
from .proxy import compute_dtype

__all__ = [
    "ESTIMATORS",
    "GRPO_SCALES",
    "Estimator",
    "compute_advantages",
    "grpo_advantages",
    "ogb_advantages",
    "opo_advantages",
    "register_estimator",
    "rloo_advantages",
]

GRPO_SCALES = ("none", "group", "batch")


@dataclass(frozen=True)
class Estimator:
    """A registered estimator: ``fn(rewards, proxy, mask, group_ids, **options) -> [B, T]``.

    options: the keyword options ``fn`` takes. uses_proxy: whether ``fn`` reads ``proxy`` (when False, any float
    ``[B, T]`` will do and the proxy diagnostics mean nothing). token_level: whether advantages may vary within a
    sequence (False: one value per sequence, broadcast onto its tokens).
    """

    name: str
    fn: Callable[..., torch.Tensor]
    options: frozenset[str]
    uses_proxy: bool
    token_level: bool

    def __call__(self, rewards, proxy, mask, group_ids, **options) -> torch.Tensor:
        return self.fn(rewards, proxy, mask, group_ids, **options)


ESTIMATORS: dict[str, Estimator] = {}


def register_estimator(name: str, *, options=(), uses_proxy: bool, token_level: bool):
    """Decorator: add ``fn`` to :data:`ESTIMATORS` under ``name``; ``fn`` itself is returned unchanged.

    ``options`` must be exactly ``fn``'s keyword-only parameters, so the declaration cannot drift from the code.
    """

    def register(fn: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
        if name in ESTIMATORS:
            raise ValueError(f"advantage estimator {name!r} is already registered.")
        declared = frozenset(options)
        params = inspect.signature(fn).parameters.values()
        keyword_only = frozenset(p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY)
        if declared != keyword_only:
            raise TypeError(
                f"register_estimator({name!r}): options {sorted(declared)} must be {fn.__name__}'s keyword-only "
                f"parameters {sorted(keyword_only)}."
            )
        ESTIMATORS[name] = Estimator(name, fn, declared, uses_proxy, token_level)
        return fn

    return register


def compute_advantages(estimator: str, rewards, proxy, mask, group_ids, **options) -> torch.Tensor:
    """Advantages ``[B, T]`` from the estimator registered as ``estimator``, with its ``options``.

    Raises ValueError for an unknown name (listing the choices) and TypeError for an option the estimator does not
    take (naming the options it does take): an option is never dropped silently.
    """
    if estimator not in ESTIMATORS:
        raise ValueError(f"Unknown advantage estimator {estimator!r}; choose one of {sorted(ESTIMATORS)}.")
    chosen = ESTIMATORS[estimator]
    foreign = set(options) - chosen.options
    if foreign:
        takes = f"its options are {sorted(chosen.options)}" if chosen.options else "it takes no options"
        raise TypeError(
            f"advantage estimator {estimator!r} does not take the option(s) {sorted(foreign)}; {takes}. "
            "Drop those options, or choose an estimator that takes them."
        )
    return chosen(rewards, proxy, mask, group_ids, **options)


register_estimator(
    "otb",
    options=("eps", "tail", "is_weights", "align", "leave_one_out", "shrinkage"),
    uses_proxy=True,
    token_level=True,
)(otb_advantages)


def _sequence_advantages(rewards, baseline, mask, valid, dtype):
    """Broadcast per-sequence advantages R_i - b_i onto the masked tokens; 0 for invalid rows.

    ``rewards`` and ``baseline`` are both measured from the group's minimum reward (``above_group_min``)."""
    adv = torch.where(valid, rewards - baseline, torch.zeros_like(baseline))
    return adv[:, None] * mask.to(dtype)


def _rewards_above_min(rewards, rows, group_ids, dtype):
    """``R_i - min_g R`` over the ``rows`` of each group (0 elsewhere), with the dense group index and count."""
    R = torch.where(rows, rewards.to(dtype), torch.zeros((), dtype=dtype, device=rewards.device))
    gid, G = group_index(group_ids)
    return above_group_min(R, rows, gid, G), gid, G


def _weighted_group_baseline(rewards, weights, gid, G, valid, dtype, eps=0.0):
    """b_i = sum_j R_j u_j / (sum_j u_j + eps) over the valid members of i's group (dense index ``gid`` of ``G``
    groups); 0 for singletons.

    ``rewards`` are the group-min-shifted ones, so b is the baseline minus the group's minimum reward (and 0 on a
    singleton gives it advantage 0)."""
    u = torch.where(valid, weights.to(dtype), torch.zeros((), dtype=dtype, device=rewards.device))
    num = group_sum(rewards * u, gid, G)[gid]
    den = group_sum(u, gid, G)[gid]
    n_valid = group_sum(valid.to(dtype), gid, G)[gid]
    safe = torch.where(den + eps > 0, den + eps, torch.ones_like(den))
    return torch.where((n_valid > 1) & (den + eps > 0), num / safe, torch.zeros_like(num))


@register_estimator("grpo", options=("scale",), uses_proxy=False, token_level=False)
def grpo_advantages(
    rewards: torch.Tensor,
    proxy: torch.Tensor,
    mask: torch.Tensor,
    group_ids: torch.Tensor,
    *,
    scale: str = "none",
) -> torch.Tensor:
    """GRPO's group-mean baseline, broadcast to tokens: ``A_i = (R_i - mean_g R) / (std + 1e-4)``.

    Mirrors TRL's ``GRPOTrainer``: the mean runs over the group's finite rewards (a row with an
    empty mask still counts, as in TRL), ``std`` is the Bessel-corrected std over the group
    (``scale="group"``) or the whole batch (``scale="batch"``), or no scaling (``"none"``,
    Dr.GRPO). A group (or batch) with a single finite reward gets advantage 0. ``proxy`` is unused.

    OTBTrainer does not call it: with ``advantage_estimator="grpo"`` it trains on TRL's own advantages, so that the
    arm is GRPOTrainer exactly, with every TRL option (``multi_objective_aggregation`` included) and whatever a
    TRL release changes. This function is the same estimator outside a trainer (the variance benchmark, ablations);
    a trainer test checks that it equals TRL's advantages on a real batch.
    """
    if scale not in GRPO_SCALES:
        raise ValueError(f"scale must be one of {GRPO_SCALES}, got {scale!r}.")
    mask = check_inputs(rewards, proxy, mask, group_ids)
    dtype = compute_dtype(proxy)
    finite = torch.isfinite(rewards)
    R = torch.where(finite, rewards.to(dtype), torch.zeros((), dtype=dtype, device=rewards.device))
    f = finite.to(dtype)
    shifted, gid, G = _rewards_above_min(rewards, finite, group_ids, dtype)  # ties give exactly 0
    count = group_sum(f, gid, G)
    mean = (group_sum(shifted, gid, G) / count.clamp(min=1))[gid]
    adv = (shifted - mean) * f
    if scale == "group":
        var = group_sum(adv * adv, gid, G) / (count - 1).clamp(min=1)
        std = torch.sqrt(var)[gid]
        adv = torch.where(count[gid] > 1, adv / (std + 1e-4), torch.zeros_like(adv))
    elif scale == "batch":
        n = f.sum()
        batch_mean = (R * f).sum() / n.clamp(min=1)
        std = torch.sqrt((((R - batch_mean) * f) ** 2).sum() / (n - 1).clamp(min=1))
        adv = adv / (std + 1e-4) if n > 1 else torch.zeros_like(adv)
    return adv[:, None] * mask.to(dtype)


@register_estimator("rloo", uses_proxy=False, token_level=False)
def rloo_advantages(rewards, proxy, mask, group_ids) -> torch.Tensor:
    """Leave-one-out baseline: ``b_i`` = mean of the other valid members' rewards (a member with none gets advantage 0).

    Equals ``N / (N - 1)`` times unscaled GRPO on a group of N valid members. ``proxy`` is unused.
    """
    mask = check_inputs(rewards, proxy, mask, group_ids)
    dtype = compute_dtype(proxy)
    valid = valid_rows(rewards, mask)
    R, gid, G = _rewards_above_min(rewards, valid, group_ids, dtype)
    others = group_sum(valid.to(dtype), gid, G)[gid] - valid.to(dtype)
    total = group_sum(R, gid, G)[gid] - R
    baseline = torch.where(others > 0, total / others.clamp(min=1), R)  # no other member: advantage 0
    return _sequence_advantages(R, baseline, mask, valid, dtype)


@register_estimator("opo", uses_proxy=False, token_level=False)
def opo_advantages(rewards, proxy, mask, group_ids) -> torch.Tensor:
    """Length-weighted baseline ``b = sum_i L_i R_i / sum_i L_i`` (Hao et al. 2025), L_i = masked tokens.

    One value per group; a group with one valid member gets advantage 0. ``proxy`` is unused.
    """
    mask = check_inputs(rewards, proxy, mask, group_ids)
    dtype = compute_dtype(proxy)
    valid = valid_rows(rewards, mask)
    lengths = mask.sum(dim=1)
    R, gid, G = _rewards_above_min(rewards, valid, group_ids, dtype)
    baseline = _weighted_group_baseline(R, lengths, gid, G, valid, dtype)
    return _sequence_advantages(R, baseline, mask, valid, dtype)


@register_estimator("ogb", options=("eps", "is_weights"), uses_proxy=True, token_level=False)
def ogb_advantages(rewards, proxy, mask, group_ids, *, eps: float = 1e-8, is_weights=None) -> torch.Tensor:
    """Optimal global (sequence-level) baseline ``b = sum_i R_i W_i / (sum_i W_i + eps)``, W_i = sum_t w_t m_t.

    With ``is_weights``, ``w_t <- w_t rho_bar_t^2`` as in OTB. A group with one valid member gets advantage 0.
    """
    mask = check_inputs(rewards, proxy, mask, group_ids, is_weights)
    dtype = compute_dtype(proxy)
    valid = valid_rows(rewards, mask)
    w = token_weights(proxy, mask, is_weights, dtype)
    if is_weights is not None and bad_on_mask(w, mask):
        raise_overflow()
    R, gid, G = _rewards_above_min(rewards, valid, group_ids, dtype)
    baseline = _weighted_group_baseline(R, w.sum(dim=1), gid, G, valid, dtype, eps=eps)
    return _sequence_advantages(R, baseline, mask, valid, dtype)
