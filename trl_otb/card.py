"""Model cards of OTB runs.

:func:`build_model_card` writes the whole card as a ``huggingface_hub.ModelCard``: metadata (``base_model``,
``datasets``, ``license``, tags ``trl``/``grpo``/``otb``, held-out accuracy as ``model-index`` eval results), a quick
start that loads the published repo (a full model, or a LoRA/QLoRA adapter on its base), the OTB settings
(:func:`otb_card_section`) and citations. :func:`trainer_model_card` fills it in from a trainer; it is what
``OTBTrainer.create_model_card`` writes for every saved checkpoint and for ``trainer.push_to_hub(...)``. What it says
of the base model (Hub id, license, description) comes from :mod:`trl_otb.recipes.hub`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from .recipes.hub import base_model_description, base_model_hub_id, base_model_license

__all__ = [
    "CardResults",
    "OTB_CITATION",
    "TRL_CITATION",
    "adapter_kind",
    "build_model_card",
    "otb_card_section",
    "trainer_model_card",
]

OTB_CITATION = """\
@article{li2026optimal,
    title        = {{The Optimal Token Baseline: Variance Reduction for Long-Horizon LLM-RL}},
    author       = {Li et al.},
    year         = 2026,
    eprint       = {arXiv:2602.07078},
}"""

TRL_CITATION = """\
@software{vonwerra2020trl,
    title        = {{TRL: Transformers Reinforcement Learning}},
    author       = {von Werra, Leandro and Belkada, Younes and Tunstall, Lewis and Beeching, Edward and Thrush, Tristan and Lambert, Nathan and Huang, Shengyi and Rasul, Kashif and Gallouédec, Quentin},
    license      = {Apache-2.0},
    url          = {https://github.com/huggingface/trl},
    year         = {2020}
}"""

_SECTION_MARKER = "## Optimal Token Baseline (OTB)"


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


def otb_card_section(args, *, dataset_name: str, summary: Mapping | None = None) -> str:
    """The OTB section of a model card, as Markdown: the OTB settings and, with ``summary``, the run's results.

    Args:
        args: the run's :class:`~trl_otb.OTBConfig` (estimator, proxy, N, tail, epsilon, leave-one-out, loss).
        dataset_name: the training data, as a reader should see it.
        summary: optional run results: ``accuracy_before``, ``accuracy_after``, ``eval_samples``, ``steps``,
            ``completion_tokens``, ``wall_time_s``.
    """
    summary = dict(summary or {})
    rows = [
        ("advantage estimator", args.advantage_estimator),
        ("proxy w_t", args.otb_proxy),
        ("group size N (num_generations)", args.num_generations),
        ("tail", args.otb_tail),
        ("epsilon", args.otb_epsilon),
        ("leave-one-out", args.otb_leave_one_out),
        ("loss_type", args.loss_type),
        ("KL beta", args.beta),
        ("max_completion_length", args.max_completion_length),
        ("learning_rate", args.learning_rate),
    ]
    lines = [
        _SECTION_MARKER,
        "",
        "Trained with GRPO using the Optimal Token Baseline ([arXiv 2602.07078](https://arxiv.org/abs/2602.07078)): "
        f"`trl_otb.OTBTrainer`, a subclass of TRL's `GRPOTrainer`, on **{dataset_name}**.",
        "",
        "| OTB setting | value |",
        "|---|---|",
        *(f"| {key} | `{value}` |" for key, value in rows),
    ]
    if summary:
        n = summary.get("eval_samples")
        lines += [
            "",
            "### Results",
            "",
            f"Held-out pass@1 (greedy decoding{f', {n} prompts' if n else ''}), scored by `trl_otb.recipes.rewards.accuracy_reward`:",
            "",
            "| | accuracy |",
            "|---|---|",
            f"| before training | {_fmt(summary.get('accuracy_before'))} |",
            f"| after training | {_fmt(summary.get('accuracy_after'))} |",
        ]
        extra = [
            ("training steps", summary.get("steps")),
            ("completion tokens generated in training", summary.get("completion_tokens")),
            ("wall time (s)", summary.get("wall_time_s")),
        ]
        extra = [(k, v) for k, v in extra if v is not None]
        if extra:
            lines += ["", *(f"- {key}: {_fmt(value)}" for key, value in extra)]
    return "\n".join(lines) + "\n"


def _quick_start(repo: str, base_model: str | None, adapter: str | None) -> list[str]:
    question = 'messages = [{"role": "user", "content": "What is 17 + 25? Put the answer in \\\\boxed{}."}]'
    if adapter is None:
        return [
            "```python",
            "from transformers import pipeline",
            "",
            f'generator = pipeline("text-generation", model="{repo}")',
            question,
            'print(generator(messages, max_new_tokens=256, return_full_text=False)[0]["generated_text"])',
            "```",
        ]
    base = base_model or "<the base model this adapter was trained on>"
    quantized = adapter == "qlora"
    lines = [
        f"This repository holds a {'QLoRA' if quantized else 'LoRA'} adapter, not a full model: load the base "
        f"model{' in 4-bit (NF4)' if quantized else ''}, then the adapter on top of it.",
        "",
        "```python",
        "from peft import PeftModel",
        "from transformers import AutoModelForCausalLM, AutoTokenizer" + (", BitsAndBytesConfig" if quantized else ""),
        "",
    ]
    if quantized:
        lines += [
            'quantization = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", '
            "bnb_4bit_use_double_quant=True)",
            f'base = AutoModelForCausalLM.from_pretrained("{base}", quantization_config=quantization)',
        ]
    else:
        lines.append(f'base = AutoModelForCausalLM.from_pretrained("{base}")')
    lines += [
        f'model = PeftModel.from_pretrained(base, "{repo}")',
        f'tokenizer = AutoTokenizer.from_pretrained("{repo}")',
        question,
        'inputs = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", '
        "return_dict=True)",
        "output = model.generate(**inputs, max_new_tokens=256)",
        'print(tokenizer.decode(output[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True))',
        "```",
    ]
    return lines


def _versions() -> list[str]:
    lines = []
    for name in ("trl-otb", "trl", "transformers", "torch", "peft", "datasets", "tokenizers"):
        try:
            lines.append(f"- {name}: {version(name)}")
        except PackageNotFoundError:
            continue
    return lines


def build_model_card(
    args,
    *,
    model_name: str,
    repo_id: str,
    base_model: str | None,
    base_description: str | None = None,
    license: str | None = None,
    datasets: Sequence[str] = (),
    dataset_name: str | None = None,
    adapter: str | None = None,
    results: CardResults | None = None,
    summary: Mapping | None = None,
    tags: Sequence[str] = ("trl", "grpo", "otb"),
):
    """The model card of an OTB run, as a ``huggingface_hub.ModelCard``.

    Args:
        args: the run's :class:`~trl_otb.OTBConfig`.
        model_name: the card's title.
        repo_id: what the quick start loads: the Hub repo id when the model is pushed, else the output directory.
        base_model: the base model's Hub id (``base_model`` metadata, links the model tree), or None if unknown.
        base_description: how the text names the base model when it is not simply its Hub id.
        license: the base model's license (a Hub license id); None writes ``license: other`` and points the reader
            to the base model.
        datasets: Hub ids of the training data (``datasets`` metadata); generated data has none.
        dataset_name: the training data as the text names it (default: the datasets joined).
        adapter: None (full model), ``"lora"`` or ``"qlora"``: the quick start then loads the adapter on its base.
        results: held-out accuracy, written to ``model-index`` and to the text.
        summary: the run's summary (steps, tokens, wall time), for the OTB section.
    """
    from huggingface_hub import ModelCard, ModelCardData

    if adapter not in (None, "lora", "qlora"):
        raise ValueError(f"adapter must be None, 'lora' or 'qlora', got {adapter!r}.")
    datasets = list(datasets)
    dataset_name = dataset_name or ", ".join(datasets) or "unspecified data"
    card_data = ModelCardData(
        base_model=base_model,
        datasets=datasets or None,
        license=license or "other",
        library_name="peft" if adapter else "transformers",
        model_name=model_name,
        pipeline_tag="text-generation",
        tags=sorted(
            {*tags, *(["lora"] if adapter else []), *(["4-bit", "bitsandbytes"] if adapter == "qlora" else [])}
        ),
        eval_results=results.eval_results() if results is not None else None,
    )
    base_text = base_description or (f"[{base_model}](https://huggingface.co/{base_model})" if base_model else None)
    summary = dict(summary or {})
    if results is not None:
        summary.setdefault("accuracy_before", results.before)
        summary.setdefault("accuracy_after", results.after)
        summary.setdefault("eval_samples", results.samples)
    lines = [
        f"# {model_name}",
        "",
        (f"A fine-tuned version of {base_text}" if base_text else "A fine-tuned model")
        + f", trained on {dataset_name} with GRPO and the Optimal Token Baseline (OTB), using trl-otb's "
        "`OTBTrainer` on top of [TRL](https://github.com/huggingface/trl)."
        + ("" if base_model else " The base model's Hub id was not given, so the card does not link it."),
        "",
        "## Quick start",
        "",
        *_quick_start(repo_id, base_model, adapter),
        "",
        otb_card_section(args, dataset_name=dataset_name, summary=summary),
        "## License",
        "",
        f"`{license}`, the license of the base model."
        if license
        else "The base model's license applies: check it before use.",
        "",
        "## Framework versions",
        "",
        *_versions(),
        "",
        "## Citations",
        "",
        "Optimal Token Baseline:",
        "",
        "```bibtex",
        OTB_CITATION,
        "```",
        "",
        "TRL:",
        "",
        "```bibtex",
        TRL_CITATION,
        "```",
        "",
    ]
    return ModelCard(f"---\n{card_data.to_yaml()}\n---\n\n" + "\n".join(lines))


def adapter_kind(model) -> str | None:
    """``"qlora"``, ``"lora"`` or None: what :func:`build_model_card` should tell users to load."""
    from accelerate.utils import is_peft_model

    from .bnb import is_4bit_model

    if not is_peft_model(model):
        return None
    return "qlora" if is_4bit_model(model) else "lora"


def trainer_model_card(
    trainer,
    *,
    model_name: str | None = None,
    dataset_name: str | None = None,
    tags: str | Sequence[str] | None = None,
    base_model: str | None = None,
    dataset_description: str | None = None,
    results: CardResults | None = None,
    summary: Mapping | None = None,
):
    """The card of ``trainer``'s model (:func:`build_model_card`), with what the trainer knows filled in.

    ``base_model`` defaults to the Hub id the model was loaded from (the embedded model's is known); the quick start
    loads the Hub repo when the run pushes (``hub_model_id``), else the output directory; the adapter kind comes from
    the model. ``dataset_name`` is a Hub dataset id, ``dataset_description`` how the text names the data.
    """
    from trl.trainer.utils import get_config_model_id

    args = trainer.args
    loaded_from = get_config_model_id(trainer.model.config) or None
    base_model = base_model or base_model_hub_id(loaded_from)
    tags = [tags] if isinstance(tags, str) else list(tags or ())
    repo_id = trainer.hub_model_id or (args.hub_model_id if args.push_to_hub else None) or args.output_dir
    return build_model_card(
        args,
        model_name=model_name or Path(args.output_dir).name,
        repo_id=repo_id,
        base_model=base_model,
        base_description=base_model_description(base_model, loaded_from),
        license=base_model_license(base_model),
        datasets=[dataset_name] if dataset_name else (),
        dataset_name=dataset_description,
        adapter=adapter_kind(trainer.model),
        results=results,
        summary=summary,
        tags=[*trainer._tag_names, *tags],
    )
