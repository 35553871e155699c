"""OTBTrainer's model card: TRL's card, plus what OTB adds.

``OTBTrainer.create_model_card`` lets TRL write its card first (the tags, ``hf_jobs``, ``unsloth`` and ``trackio:``
among them; the run's Weights & Biases, Trackio or Comet link; the paper and citation of ``OTBTrainer._paper``; the
framework versions), then :func:`extend_model_card` adds to it:

- the OTB settings, under TRL's "Training procedure" (:func:`otb_settings_section`), and the caller's sections after
  them (the math demo's results: :mod:`trl_otb.demo.card`);
- for a LoRA or QLoRA adapter, a quick start that loads the adapter on its named base with
  ``PeftModel.from_pretrained`` (the base in NF4 for QLoRA), ``library_name: peft`` and the adapter's tags;
- what the caller knows and TRL cannot read from the model: ``base_model`` (a model loaded from a local directory
  has no Hub id), ``license`` and ``eval_results`` (written as ``model-index``).

It repairs what TRL's template writes wrong for such runs: a ``[None](https://huggingface.co/None)`` link when the
base model has no Hub id, a quick start that loads ``"None"`` when the model is not pushed, and a ``licence: license``
line, which is no Hub field: the card says ``license``, ``other`` when none is given. ``trl_otb.compat`` checks that
TRL's template still has the lines these edits look for (:data:`TEMPLATE_FRAGMENTS`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from importlib.metadata import PackageNotFoundError, version

from .bnb import is_4bit_model
from .core import resolve_shrinkage

__all__ = ["TEMPLATE_FRAGMENTS", "adapter_kind", "adapter_quick_start", "extend_model_card", "otb_settings_section"]

_QUICK_START = "## Quick start"
_VERSIONS = "### Framework versions"
_CITATIONS = "## Citations"
_BASE_LINK = "[{{ base_model }}](https://huggingface.co/{{ base_model }})"
_REPO_ARGUMENT = 'model="{{ hub_model_id }}"'
TEMPLATE_FRAGMENTS = (_QUICK_START, _VERSIONS, _CITATIONS, _BASE_LINK, _REPO_ARGUMENT)
"""The lines of TRL's card template (``trl/templates/lm_model_card.md``) that :func:`extend_model_card` edits."""

_QUESTION = "Explain in two sentences why the sky is blue."


def _link(base_model) -> str:
    return _BASE_LINK.replace("{{ base_model }}", str(base_model))


def adapter_kind(model) -> str | None:
    """``"qlora"``, ``"lora"`` or None (a full model): what the card's quick start loads."""
    from accelerate.utils import is_peft_model

    if not is_peft_model(model):
        return None
    return "qlora" if is_4bit_model(model) else "lora"


def otb_settings_section(args) -> str:
    """The card's "OTB settings" section, as Markdown, from the run's :class:`~trl_otb.OTBConfig`."""
    rows = [
        ("advantage estimator", args.advantage_estimator),
        ("proxy w_t", args.otb_proxy),
        ("group size N (num_generations)", args.num_generations),
        ("tail", args.otb_tail),
        ("epsilon", args.otb_epsilon),
        ("leave-one-out", args.otb_leave_one_out),
        ("shrinkage", resolve_shrinkage(args.otb_shrinkage, args.otb_tail, args.otb_leave_one_out)),
        ("loss_type", args.loss_type),
        ("KL beta", args.beta),
        ("max_completion_length", args.max_completion_length),
        ("learning_rate", args.learning_rate),
    ]
    return "\n".join(
        [
            "### OTB settings",
            "",
            "Trained with `trl_otb.OTBTrainer`: TRL's `GRPOTrainer` with token-level advantages from the Optimal "
            "Token Baseline.",
            "",
            "| OTB setting | value |",
            "|---|---|",
            *(f"| {key} | `{value}` |" for key, value in rows),
        ]
    )


def adapter_quick_start(repo: str, base_model: str | None, quantized: bool) -> str:
    """A quick start (prose and a Python block) that loads the adapter ``repo`` on ``base_model``, in NF4 if
    ``quantized``."""
    base = base_model or "<the base model this adapter was trained on>"
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
        f'messages = [{{"role": "user", "content": "{_QUESTION}"}}]',
        'inputs = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", '
        "return_dict=True)",
        "output = model.generate(**inputs, max_new_tokens=128)",
        'print(tokenizer.decode(output[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True))',
        "```",
    ]
    return "\n".join(lines)


def _versions(adapter: str | None) -> str:
    lines = []
    packages = {None: [], "lora": ["PEFT"], "qlora": ["PEFT", "bitsandbytes"]}[adapter]
    for name in ["trl-otb", *packages]:
        try:
            # PEFT's save_pretrained adds "- PEFT <version>" to a card's versions unless that very line is there.
            lines.append(f"- PEFT {version('peft')}" if name == "PEFT" else f"- {name}: {version(name.lower())}")
        except PackageNotFoundError:
            continue
    return "\n".join(lines) + "\n"


def _insert_before(text: str, anchor: str, block: str) -> str:
    at = text.find(anchor)
    return text.rstrip("\n") + "\n\n" + block + "\n" if at < 0 else text[:at] + block + "\n\n" + text[at:]


def extend_model_card(
    card,
    trainer,
    *,
    base_model: str | None = None,
    license: str | None = None,
    eval_results: Sequence | None = None,
    sections: Mapping[str, str] | None = None,
):
    """Add OTB's part to TRL's card of ``trainer``'s run; returns ``card`` (a ``huggingface_hub.ModelCard``), edited.

    Args:
        card: the card TRL's ``create_model_card`` wrote for ``trainer``.
        trainer: the :class:`~trl_otb.OTBTrainer`: its config (the OTB settings), its model (full, LoRA or QLoRA),
            and where the quick start loads from (``hub_model_id`` when the run pushes, else ``output_dir``).
        base_model: the base model's Hub id; it replaces TRL's, which only a model loaded from the Hub has.
        license: the model's license (a Hub license id); None writes ``license: other`` and a line saying that the
            base model's license applies.
        eval_results: ``huggingface_hub.EvalResult`` objects, written as ``model-index``.
        sections: title -> Markdown, added after the OTB settings.
    """
    adapter = adapter_kind(trainer.model)
    data, text = card.data, card.text
    linked = data.base_model  # TRL's: None (linked as "[None]") unless the model came from the Hub
    base_model = base_model or linked
    data.base_model = base_model
    data.pop("licence")
    data.license = license or "other"
    data.library_name = "peft" if adapter else "transformers"
    data.pipeline_tag = "text-generation"
    adapter_tags = {"lora": ["lora"], "qlora": ["lora", "4-bit", "bitsandbytes"]}.get(adapter, [])
    data.tags = sorted({*(data.tags or []), *adapter_tags})  # TRL builds them as a set: sorted, the card is stable
    if eval_results:
        data.eval_results = list(eval_results)  # model-index is named after TRL's model_name

    named = f"[{base_model}](https://huggingface.co/{base_model})" if base_model else "a model without a Hub id"
    text = text.replace(_link(linked), named)
    repo = trainer.hub_model_id or trainer.args.output_dir
    if adapter:
        quick_start = adapter_quick_start(repo, base_model, quantized=adapter == "qlora")
        pattern = re.compile(re.escape(_QUICK_START) + r"\n\n```python\n.*?```", re.S)
        text = pattern.sub(lambda _: f"{_QUICK_START}\n\n{quick_start}", text, count=1)
    elif trainer.hub_model_id is None:
        text = text.replace(_REPO_ARGUMENT.replace("{{ hub_model_id }}", "None"), f'model="{repo}"')
    blocks = [otb_settings_section(trainer.args)]
    blocks += [f"### {title}\n\n{body.strip()}" for title, body in (sections or {}).items()]
    text = _insert_before(text, _VERSIONS, "\n\n".join(blocks))
    text = text.replace(f"{_VERSIONS}\n\n", f"{_VERSIONS}\n\n{_versions(adapter)}", 1)
    if license is None:
        note = (
            "## License\n\nNo license was given for this model (`license: other`): the base model's license applies."
        )
        text = _insert_before(text, _CITATIONS, note)
    card.text = text
    return card
