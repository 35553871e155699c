"""The datasets and prompts a user hands OTBTrainer that TRL would take too late (the reward functions' outputs are
checked in :mod:`.rewards`).

TRL's GRPOTrainer meets these deep inside a step (a ``KeyError: 'prompt'``, an ``IndexError`` in tokenisation) or not
at all (an empty dataset trains 0 steps). OTBTrainer checks them at construction, or on the batch where they appear,
and says what to change. No check refuses an input GRPOTrainer trains on correctly: a chat prompt whose messages are
blank still gets the chat template's prefix, so only a message list with no message at all counts as empty.

Rewards so large that the gradient norm is not finite are warned about here as well (:func:`warn_nonfinite_grad_norm`).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping

from datasets import Dataset, IterableDataset
from transformers import TrainerCallback

from .core import NonFiniteGradientWarning

__all__ = [
    "EmptyTrainingGuard",
    "check_batch_prompts",
    "check_datasets",
    "warn_nonfinite_grad_norm",
]

# --- rewards so large that the gradient norm is not finite ------------------------------------------------------


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
    """None, a blank string, or a message list with no message. A message list whose contents are blank is not
    empty: the chat template still gives the model a prefix (its role markers), and GRPOTrainer trains on it."""
    if prompt is None:
        return True
    if isinstance(prompt, str):
        return not prompt.strip()
    return isinstance(prompt, list) and not prompt


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
                f"{', ...' if len(empty) > 5 else ''}): an empty or blank string, or a message list with no message, "
                "leaves the model nothing to continue from. Drop or fill them in first, e.g. "
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
            "list with no message), which leaves the model nothing to continue from. Drop or "
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
