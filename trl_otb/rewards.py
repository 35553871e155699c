"""The reward functions' outputs, checked where TRL reads them, and the reward values that would spoil a step.

``OTBTrainer._calculate_rewards`` hands TRL's ``_calculate_rewards`` a checked copy of ``reward_funcs`` for that call
only (:func:`checked_reward_funcs`): each output TRL could not read fails with a message naming the function, and
every output GRPOTrainer reads is passed on as it came. Between calls ``trainer.reward_funcs`` is the list TRL built.

After TRL has read them (``rewards_per_func``, ``[B, n_funcs]``, NaN where a function returned None),
:func:`screen_rewards` treats three values a reward function should never return, each named and never silent:

- NaN (a 0/0 in the function): the completion is unscorable, like one whose every function returned None; warned
  (:class:`NaNRewardWarning`) and counted in ``otb/nan_rewards``. A None means "this function does not score this
  completion": the others still do (TRL's rule). A NaN is not read as a None.
- +inf or -inf: the same, warned (``InfiniteRewardWarning``) and counted in ``otb/infinite_rewards``.
- a finite reward so large (above 1e32) that OTB's fp32 sums would overflow: a ``ValueError`` naming the function.
"""

from __future__ import annotations

import functools
import math
import numbers
import warnings
from collections.abc import Iterable, Iterator, Mapping, Set

import torch
from trl.trainer.utils import is_async_callable

from .core import InfiniteRewardWarning, NaNRewardWarning

__all__ = [
    "REWARD_LIMIT",
    "NaNRewardWarning",
    "checked_reward_func",
    "checked_reward_funcs",
    "local_nan_flags",
    "reward_values",
    "screen_rewards",
]

REWARD_LIMIT = 1e32
"""The largest |reward| OTB's estimators take in fp32 (``R * W`` summed over a group stays finite below it)."""


# --- the outputs, checked as TRL reads them --------------------------------------------------------------------------


def checked_reward_funcs(funcs: list, names: list[str], n: int, returned_nan: dict[int, list[bool]]) -> list:
    """``funcs`` (TRL's ``reward_funcs``) for one call of ``_calculate_rewards`` on ``n`` completions: each callable
    wrapped by :func:`checked_reward_func`, which records in ``returned_nan[i]`` which of its values were NaN. Model
    rewards (``nn.Module``) are TRL's to score and stay as they are."""
    return [
        func
        if isinstance(func, torch.nn.Module)
        else checked_reward_func(func, name, n, returned_nan.setdefault(i, []))
        for i, (func, name) in enumerate(zip(funcs, names))
    ]


def checked_reward_func(func, name: str, n: int, nan_flags: list[bool] | None = None):
    """``func`` wrapped so that an output TRL cannot read fails with a message naming ``name`` (TRL's name for it).

    The wrapper takes any arguments ``func`` takes, is async exactly when ``func`` is (TRL decides with the same
    ``is_async_callable``), keeps ``func``'s name, and returns ``func``'s output as it came (a one-shot iterator as a
    list of the same values). ``nan_flags``, if given, receives one bool per completion: the value was NaN.
    """

    def check(output):
        values = reward_values(output, name, n)
        if nan_flags is not None:
            nan_flags[:] = [v is not None and math.isnan(float(v)) for v in values]
        return values if isinstance(output, Iterator) else output

    if is_async_callable(func):

        async def checked(*args, **kwargs):
            return check(await func(*args, **kwargs))

    else:

        def checked(*args, **kwargs):
            return check(func(*args, **kwargs))

    return functools.wraps(func)(checked)


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _is_numpy(value) -> bool:
    return type(value).__module__ == "numpy"


def _is_number(value) -> bool:
    """One real number as TRL's ``torch.tensor(rewards)`` reads it: a Python or NumPy scalar, a 0-d array, or a
    one-element tensor of any shape (what a row of a reward model's ``[B, 1]`` logits is)."""
    if isinstance(value, numbers.Real):
        return True
    if isinstance(value, torch.Tensor):
        return value.numel() == 1 and not value.is_complex()
    return _is_numpy(value) and getattr(value, "ndim", None) == 0 and value.dtype.kind in "biuf"


def reward_values(output, name: str, n: int) -> list:
    """``output`` of the reward function ``name`` for ``n`` completions, as a list: one number (or None) each.

    Accepted, as GRPOTrainer reads them: a list or tuple (or any iterable) of numbers and Nones, a 1-D NumPy array,
    and a tensor of ``n`` rows of one value each (``[B]``, ``[B, 1]``). Anything else raises a ``TypeError`` or
    ``ValueError`` that names ``name`` and says what to return.
    """
    if output is None:
        raise TypeError(
            f"Reward function {name!r} returned None. A reward function must return a list of floats (or None for a "
            f"completion it cannot score), one per completion ({n} here). Did it forget a `return`?"
        )
    if isinstance(output, str | bytes):
        raise TypeError(
            f"Reward function {name!r} returned a string ({_short(output)}), not a list. A reward function must "
            f"return a list of floats (or None for a completion it cannot score), one per completion ({n} here), "
            "e.g. [score(c) for c in completions]."
        )
    if _is_number(output) and not (isinstance(output, torch.Tensor) and output.ndim):
        raise TypeError(
            f"Reward function {name!r} returned one number ({_short(output)}) for the whole batch. A reward function "
            f"must return a list of floats (or None for a completion it cannot score), one per completion ({n} here), "
            "e.g. [score(c) for c in completions]."
        )
    if isinstance(output, torch.Tensor) or _is_numpy(output):
        shape = tuple(output.shape)
        # TRL reads a tensor row by row (a one-element row is a number); a NumPy row must be a scalar.
        if not (shape[:1] == (n,) and math.prod(shape) == n and (isinstance(output, torch.Tensor) or len(shape) == 1)):
            raise TypeError(
                f"Reward function {name!r} returned a {type(output).__name__} of shape {shape}. A reward function "
                f"must return a list of floats (or None for a completion it cannot score), one per completion ({n} "
                f"here): a list, a 1-D tensor or array of {n} values, or a tensor of shape ({n}, 1)."
            )
    elif isinstance(output, Mapping | Set) or not isinstance(output, Iterable):
        raise TypeError(
            f"Reward function {name!r} returned a {type(output).__name__}. A reward function must return a list of "
            f"floats (or None for a completion it cannot score), one per completion ({n} here), in the order of "
            "`completions`."
        )
    values = list(output)
    if len(values) != n:
        raise ValueError(
            f"Reward function {name!r} returned {len(values)} values for {n} completions. A reward function must "
            "return a list of floats (or None for a completion it cannot score), one per completion, in the order of "
            "`completions`."
        )
    for i, value in enumerate(values):
        if value is not None and not _is_number(value):
            raise TypeError(
                f"Reward function {name!r} returned a list whose item {i} is a {type(value).__name__} "
                f"({_short(value)}), not a number. A reward function must return a list of floats (or None for a "
                f"completion it cannot score), one number per completion ({n} here). For several scores per "
                "completion, pass one reward function per score (reward_funcs=[...], weighted by reward_weights)."
            )
    return values


# --- values TRL reads but that would spoil a step: NaN, +-inf, overflow ---------------------------------------------


def local_nan_flags(returned_nan: dict[int, list[bool]], n: int, n_funcs: int, device) -> torch.Tensor:
    """``[n, n_funcs]`` (float, for gathering): 1 where a checked function returned NaN (from
    :func:`checked_reward_funcs`' record; a function that did not run, or a model reward, has a 0 column)."""
    flags = torch.zeros(n, n_funcs, dtype=torch.float32)
    for i, nan in returned_nan.items():
        if nan:
            flags[:, i] = torch.tensor(nan, dtype=torch.float32)
    return flags.to(device)


def screen_rewards(
    rewards_per_func: torch.Tensor,
    func_names: list[str],
    returned_nan: torch.Tensor,
    *,
    is_model: list[bool] | None = None,
    warn: bool,
    limit: float | None = REWARD_LIMIT,
) -> tuple[torch.Tensor, dict[str, int]]:
    """``(rewards_per_func, counts)``: each completion with a NaN or a +-inf reward made unscorable (its whole row
    NaN, TRL's rule for "every function returned None"), and ``counts`` = ``{"nan_rewards": ..,
    "infinite_rewards": ..}``, the completions found.

    ``rewards_per_func`` is ``[B, n_funcs]`` as TRL read it, one column per name of ``func_names``; ``returned_nan``
    ``[B, n_funcs]`` marks the NaNs a function returned (the other NaNs are its Nones); a column whose ``is_model``
    is True is a reward model's, whose every NaN is its own (a model never returns None). ``warn`` (the main
    process) warns once per kind, naming the functions and their counts. A finite reward above ``limit`` in absolute
    value raises a ``ValueError`` naming its function (``limit=None``: no check). The input is not modified.
    """
    nan = returned_nan.to(rewards_per_func.device).bool()
    for i, model in enumerate(is_model or []):
        if model:
            nan[:, i] = torch.isnan(rewards_per_func[:, i])
    infinite = torch.isinf(rewards_per_func)
    counts = {"nan_rewards": int(nan.any(dim=1).sum()), "infinite_rewards": int(infinite.any(dim=1).sum())}
    if limit is not None:
        _raise_if_overflowing(rewards_per_func, func_names, limit)
    if not any(counts.values()):
        return rewards_per_func, counts
    total = rewards_per_func.size(0)
    if warn and counts["nan_rewards"]:
        warnings.warn(
            f"Reward functions returned NaN ({_per_func(nan, func_names)} of {total} completions). Those "
            f"{counts['nan_rewards']} completions are treated as unscorable: excluded from their group, advantage 0 "
            "(counted in otb/nan_rewards). A NaN is almost always a bug in the reward function (a 0/0): return a "
            "number, or None for a completion it does not score (the other reward functions then still score it).",
            NaNRewardWarning,
            stacklevel=3,  # the caller of OTBTrainer._calculate_rewards
        )
    if warn and counts["infinite_rewards"]:
        warnings.warn(
            f"Reward functions returned +inf or -inf ({_per_func(infinite, func_names)} of {total} completions). "
            f"Those {counts['infinite_rewards']} completions are treated as unscorable: excluded from their group, "
            "advantage 0 (counted in otb/infinite_rewards). An infinite reward is almost always a bug in the reward "
            "function: return a finite value, or None for a completion it cannot score.",
            InfiniteRewardWarning,
            stacklevel=3,
        )
    rewards_per_func = rewards_per_func.clone()
    rewards_per_func[(nan | infinite).any(dim=1)] = torch.nan
    return rewards_per_func, counts


def _per_func(flags: torch.Tensor, func_names: list[str]) -> str:
    return ", ".join(f"{name!r} on {int(k)}" for name, k in zip(func_names, flags.sum(dim=0).tolist()) if k)


def _raise_if_overflowing(rewards_per_func: torch.Tensor, func_names: list[str], limit: float) -> None:
    too_large = torch.isfinite(rewards_per_func) & (rewards_per_func.abs() > limit)
    if bool(too_large.any()):
        largest = rewards_per_func[too_large].abs().max().item()
        raise ValueError(
            f"Reward functions returned rewards too large for OTB's fp32 advantages ({_per_func(too_large, func_names)}"
            f" of {rewards_per_func.size(0)} completions, up to {largest:.3g}; the limit is {limit:g}). Rescale "
            "those functions' outputs: rewards of order 1 are what GRPO and OTB are tuned for."
        )
