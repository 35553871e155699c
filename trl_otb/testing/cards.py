"""Model cards in tests: checking one that OTBTrainer wrote, and a tracker run for TRL's card to link."""

from __future__ import annotations

TRACKER_URLS = {
    "trackio": "https://otb-lab-trackio.hf.space?project=otb&runs=run-1&sidebar=collapsed",
    "comet": "https://www.comet.com/otb-lab/otb/0123456789abcdef",
}
"""Where :func:`fake_tracker_run` says the run is tracked."""


def fake_tracker_run(monkeypatch, tracker: str = "trackio") -> str:
    """Make TRL's model card see a running Trackio or Comet run, and return the run's URL.

    TRL's ``create_model_card`` asks ``get_trackio_space_url()`` / ``get_comet_experiment_url()`` (names in
    ``trl.trainer.base_trainer``) for the run's URL; this patches that helper to return :data:`TRACKER_URLS`
    ``[tracker]``. Nothing else is faked: TRL adds its ``trackio:`` tag and its badge link itself. (Offline, neither
    tracker has a URL to give: Trackio's comes from a Hub Space, Comet's from its server.)
    """
    from trl.trainer import base_trainer

    url = TRACKER_URLS[tracker]
    helper = {"trackio": "get_trackio_space_url", "comet": "get_comet_experiment_url"}[tracker]
    monkeypatch.setattr(base_trainer, helper, lambda: url)
    return url


def check_model_card(path, *, base_model=None, adapter=None, accuracy=None, tracker_url=None, run_quick_start=None):
    """Validate a model card that OTBTrainer wrote, with huggingface_hub itself, and return it (``ModelCard``).

    It parses, its metadata round-trips through YAML, ``model-index`` converts to ``EvalResult``s whose
    ``pass@1`` after training is ``accuracy`` (when given), ``base_model``/tags/license are set, the text
    names no ``None`` model, it has one OTB settings section, TRL's link to ``tracker_url`` (when given), and the
    quick start is the one for a full model or for a LoRA/QLoRA adapter.
    ``run_quick_start`` (a mapping of Hub ids to local directories) executes the quick start's code, with
    those ids replaced and 2 new tokens, and checks that it runs to its final print.
    """
    import contextlib
    import io
    import re

    from huggingface_hub import ModelCard
    from huggingface_hub.repocard_data import model_index_to_eval_results

    card = ModelCard.load(path)
    meta = card.data.to_dict()
    assert ModelCard(str(card)).data.to_dict() == meta  # the YAML round-trips
    assert meta.get("base_model") == base_model
    assert {"trl", "grpo", "otb"} <= set(meta["tags"]) and meta["license"] and "licence" not in meta
    assert meta["library_name"] == ("peft" if adapter else "transformers")
    assert "None" not in card.text.replace("NoneType", ""), "the card names a None model or dataset"
    assert card.text.count("### OTB settings") == 1 and "| group size N (num_generations) |" in card.text
    if tracker_url is not None:
        assert f"]({tracker_url})" in card.text, "TRL's tracker badge is missing"
    if accuracy is not None:
        name, results = model_index_to_eval_results(meta["model-index"])
        assert name == card.data.model_name
        after = [r for r in results if r.metric_type == "pass@1" and "before" not in r.metric_name]
        assert [r.metric_value for r in after] == [accuracy] and after[0].task_type == "text-generation"
    code = re.search(r"## Quick start\n.*?```python\n(.*?)```", card.text, re.S).group(1)
    if adapter is None:
        assert "pipeline(" in code and "PeftModel" not in code
    else:
        assert f'AutoModelForCausalLM.from_pretrained("{base_model}"' in code and "PeftModel.from_pretrained" in code
        assert ("BitsAndBytesConfig" in code) == (adapter == "qlora")
    if run_quick_start is not None:
        for hub_id, local in run_quick_start.items():
            code = code.replace(f'"{hub_id}"', repr(str(local)))
        code = re.sub(r"max_new_tokens=\d+", "max_new_tokens=2", code)
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(code, "quick_start", "exec"), {})
        assert out.getvalue().endswith("\n")  # it printed the decoded answer (2 tokens of a random model may be blank)
    return card
