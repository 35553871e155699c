"""The inputs a user hands OTBTrainer that TRL would take too late: each reward function's output, and the prompts.

TRL's GRPOTrainer meets these deep inside a step (``'NoneType' object is not iterable``, a ``KeyError: 'prompt'``,
an ``IndexError`` in tokenisation) or not at all (an empty dataset trains 0 steps). OTBTrainer checks them at
construction, or on the batch where they appear, and says what to change. No check changes a valid input.

Two reward values TRL reads but that would quietly spoil a step are warned about here as well: a +-inf reward (its
completion is made unscorable, :func:`unscorable_if_infinite`) and rewards so large that the gradient norm is not
finite (:func:`warn_nonfinite_grad_norm`).
"""

from __future__ import annotations

import functools
import numbers
import warnings
from collections.abc import Iterable, Mapping, Set

import torch
from datasets import Dataset, IterableDataset
from transformers import TrainerCallback
from trl.trainer.utils import is_async_callable

from .core import InfiniteRewardWarning, NonFiniteGradientWarning

__all__ = [
    "EmptyTrainingGuard",
    "check_batch_prompts",
    "check_datasets",
    "checked_reward_func",
    "checked_reward_funcs",
    "unscorable_if_infinite",
    "warn_nonfinite_grad_norm",
]

# --- reward functions ----------------------------------------------------------------------------------------------


def checked_reward_funcs(funcs: list, names: list[str]) -> list:
    """TRL's ``reward_funcs``, each callable wrapped by :func:`checked_reward_func` (model rewards: TRL scores them)."""
    return [
        func if isinstance(func, torch.nn.Module) else checked_reward_func(func, n) for func, n in zip(funcs, names)
    ]


def checked_reward_func(func, name: str):
    """``func`` wrapped so that an output TRL cannot read fails with a message naming ``name`` (TRL's name for it).

    The wrapper is async exactly when ``func`` is (TRL decides with the same ``is_async_callable``), keeps ``func``'s
    name and attributes, and returns the output as a list of the same values.
    """
    if is_async_callable(func):

        async def checked(*args, **kwargs):
            return reward_values(await func(*args, **kwargs), name, len(kwargs["completions"]))

    else:

        def checked(*args, **kwargs):
            return reward_values(func(*args, **kwargs), name, len(kwargs["completions"]))

    return functools.wraps(func)(checked)


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _array_ndim(value) -> int | None:
    """The number of dimensions of a tensor or NumPy array or scalar, None for anything else."""
    is_array = isinstance(value, torch.Tensor) or type(value).__module__ == "numpy"
    return getattr(value, "ndim", None) if is_array else None


def _is_number(value) -> bool:
    """A real number as TRL's ``torch.tensor(rewards)`` reads it: a Python or NumPy scalar, a 0-d tensor or array."""
    if isinstance(value, numbers.Real):
        return True
    return _array_ndim(value) == 0 and getattr(value.dtype, "kind", "f") in "biuf"  # a torch dtype has no kind


def reward_values(output, name: str, n: int) -> list:
    """``output`` of the reward function ``name`` for ``n`` completions, as a list: one float (or None) each."""
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
    if _is_number(output):
        raise TypeError(
            f"Reward function {name!r} returned one number ({_short(output)}) for the whole batch. A reward function "
            f"must return a list of floats (or None for a completion it cannot score), one per completion ({n} here), "
            "e.g. [score(c) for c in completions]."
        )
    if _array_ndim(output) is not None:
        if output.ndim != 1:
            raise TypeError(
                f"Reward function {name!r} returned a {type(output).__name__} of shape {tuple(output.shape)}. A reward "
                f"function must return a list of floats (or None for a completion it cannot score), one per "
                f"completion ({n} here), or a 1-D tensor or array of {n} values."
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
            f"return a list of floats (or None for a completion it cannot score), one per completion, in the order of "
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


# --- reward values that would spoil a step: +-inf, and rewards too large for the gradient --------------------------


def unscorable_if_infinite(rewards_per_func: torch.Tensor, func_names: list[str], *, warn: bool):
    """``(rewards_per_func, count)``: a completion with a +-inf reward becomes unscorable (its whole row NaN, TRL's
    rule for "every function returned None"), and ``count`` such completions were found.

    Such a completion leaves its group and gets advantage 0 in every estimator, TRL's ``grpo`` included, where an
    infinite reward would otherwise make the whole group's advantages infinite. ``rewards_per_func`` is
    ``[B, n_funcs]``, one column per name of ``func_names``; ``warn`` (the main process) issues an
    :class:`InfiniteRewardWarning` naming the functions, so that it is never silent. The input is not modified.
    """
    infinite = torch.isinf(rewards_per_func)
    rows = infinite.any(dim=1)
    count = int(rows.sum())
    if not count:
        return rewards_per_func, 0
    if warn:
        per_func = ", ".join(f"{name!r} on {int(n)}" for name, n in zip(func_names, infinite.sum(dim=0).tolist()) if n)
        warnings.warn(
            f"Reward functions returned +inf or -inf ({per_func} of {rewards_per_func.size(0)} completions). "
            f"Those {count} completions are treated as unscorable: excluded from their group, advantage 0 "
            "(counted in otb/infinite_rewards). An infinite reward is almost always a bug in the reward function: "
            "return a finite value, or None for a completion it cannot score.",
            InfiniteRewardWarning,
            stacklevel=2,  # OTBTrainer._calculate_rewards
        )
    rewards_per_func = rewards_per_func.clone()
    rewards_per_func[rows] = torch.nan
    return rewards_per_func, count


def warn_nonfinite_grad_norm(step: int, grad_norm: float) -> None:
    """A :class:`NonFiniteGradientWarning` for optimizer step ``step``: clipping by an infinite norm makes the step no
    update, and without a word the run would go on learning nothing."""
    warnings.warn(
        f"The gradient norm of optimizer step {step} is {grad_norm}, so clipping turned the step into no update "
        "(counted in otb/nonfinite_grad_norm). With finite rewards this means advantages too large for the gradient's "
        "dtype: otb/advantage_abs_max shows them. Rescale the reward functions' outputs (rewards of order 1 are what "
        "GRPO and OTB are tuned for), or set scale_rewards='group' with advantage_estimator='grpo'.",
        NonFiniteGradientWarning,
        stacklevel=3,  # the caller of OTBTrainer._get_grad_norm
    )


# --- datasets and prompts ------------------------------------------------------------------------------------------


def _is_empty_prompt(prompt) -> bool:
    """None, a blank string, or a message list with no message or only blank text contents."""
    if prompt is None:
        return True
    if isinstance(prompt, str):
        return not prompt.strip()
    if isinstance(prompt, list):
        return all(isinstance(m, Mapping) and not str(m.get("content") or "").strip() for m in prompt)
    return False


def _empty_rows(prompts) -> list[int]:
    return [i for i, prompt in enumerate(prompts) if _is_empty_prompt(prompt)]


def check_datasets(train_dataset, eval_dataset, args, prompts_required: bool = True) -> None:
    """At construction: every map-style dataset has a ``prompt`` column, no empty prompt, and rows (the training set at
    least the prompts one generation batch of ``args``, a GRPOConfig, takes); an ``IterableDataset`` whose columns are
    known has a ``prompt`` column (its rows are checked batch by batch). ``prompts_required=False`` (an environment
    supplies the prompts) checks the rows only."""
    prompts_per_batch = args.generation_batch_size // args.num_generations
    named = [("train_dataset", train_dataset)]
    if isinstance(eval_dataset, Mapping):
        named += [(f"eval_dataset[{key!r}]", dataset) for key, dataset in eval_dataset.items()]
    else:
        named.append(("eval_dataset", eval_dataset))
    for what, dataset in named:
        if not isinstance(dataset, Dataset | IterableDataset):
            continue  # None, or a type TRL itself refuses
        columns = dataset.column_names
        if prompts_required and columns is not None and "prompt" not in columns:
            raise ValueError(
                f"{what} has no 'prompt' column (its columns: {columns}). GRPOTrainer reads each example's prompt "
                f"from it: rename the column that holds the prompts, e.g. dataset.rename_column({columns[0]!r}, "
                "'prompt') if that is the one, or build the column with dataset.map."
            )
        if isinstance(dataset, IterableDataset):
            continue  # reading it here would consume a stream: its batches are checked as they come
        if len(dataset) == 0:
            raise ValueError(
                f"{what} has no rows, so there is nothing to generate from (training would run 0 steps). Pass a "
                "dataset with at least one prompt; if a filter emptied it, check the filter."
            )
        if what == "train_dataset" and len(dataset) < prompts_per_batch:
            # TRL's sampler (RepeatSampler) yields only whole generation batches (compat.REQUIRED).
            raise ValueError(
                f"train_dataset has fewer prompts ({len(dataset)}) than one generation batch takes ({prompts_per_batch}"
                " = generation_batch_size / num_generations), and TRL's sampler yields only whole batches: training "
                "would run 0 steps. Add prompts, or lower per_device_train_batch_size (or steps_per_generation, "
                "generation_batch_size)."
            )
        if not prompts_required:
            continue
        prompts = dataset.select_columns(["prompt"]).with_format(None)
        empty = [
            start + i
            for start in range(0, len(prompts), 1000)
            for i in _empty_rows(prompts[start : start + 1000]["prompt"])
        ]
        if empty:
            raise ValueError(
                f"{what}: {len(empty)} of its {len(dataset)} prompts are empty (rows {empty[:5]}"
                f"{', ...' if len(empty) > 5 else ''}): an empty or blank string, or a message list with no message or "
                "only blank contents, leaves the model nothing to continue from. Drop or fill them in first, e.g. "
                "dataset.filter(lambda row: row['prompt'].strip()) for text prompts."
            )


def check_batch_prompts(inputs: list[dict]) -> None:
    """On every generation batch (streamed datasets are only checked here): each example has a non-empty prompt."""
    missing = [i for i, example in enumerate(inputs) if "prompt" not in example]
    if missing:
        raise ValueError(
            f"{len(missing)} of the {len(inputs)} examples of this batch have no 'prompt' (their keys: "
            f"{sorted(inputs[missing[0]])}). GRPOTrainer reads each example's prompt from it: give the dataset a "
            "'prompt' column, e.g. dataset.rename_column('question', 'prompt')."
        )
    empty = _empty_rows([example["prompt"] for example in inputs])
    if empty:
        raise ValueError(
            f"{len(empty)} of the {len(inputs)} prompts of this batch are empty (an empty or blank string, or a message "
            "list with no message or only blank contents), which leaves the model nothing to continue from. Drop or "
            "fill them in in the dataset first, e.g. dataset.filter(lambda row: row['prompt'].strip()) for text prompts."
        )


class EmptyTrainingGuard(TrainerCallback):
    """A streamed training set (``IterableDataset``) that yields not one generation batch trains 0 steps, where
    transformers only logs a warning: raise instead. (A map-style one is checked at construction.)"""

    def on_train_end(self, args, state, control, **kwargs):
        if state.global_step == 0 and state.max_steps > 0:
            raise ValueError(
                f"Training ran 0 of its {state.max_steps} steps: train_dataset, an IterableDataset, yielded not one "
                "generation batch of prompts. Check that the stream has rows (next(iter(train_dataset))), and enough "
                "for one batch (generation_batch_size / num_generations prompts)."
            )
