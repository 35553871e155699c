"""trl_otb.demo.card: what the math demo adds to OTBTrainer's model card (trl_otb.card): the base model's Hub id and
license, and the held-out results. The cards the demo writes end to end: tests/integration/test_math_otb.py; the card
of OTBTrainer itself: tests/test_card.py."""

from __future__ import annotations

from trl_otb import OTBTrainer
from trl_otb.demo.card import (
    CardResults,
    base_model_description,
    base_model_hub_id,
    base_model_license,
    math_card,
)
from trl_otb.demo.models import EMBEDDED_HUB_ID
from trl_otb.testing import RecordingReward, make_args, prompts_dataset


def test_embedded_model_card_names_the_hub_base_model_and_its_license(tmp_path):
    (tmp_path / "trl_otb_conversion.json").write_text("{}")  # what the embedded model's directory carries
    assert base_model_hub_id(None) == base_model_hub_id("embedded") == EMBEDDED_HUB_ID
    assert base_model_hub_id(tmp_path) == EMBEDDED_HUB_ID
    assert base_model_hub_id(tmp_path.parent) is None  # some other local directory: unknown
    assert base_model_hub_id("Qwen/Qwen2.5-0.5B-Instruct") == "Qwen/Qwen2.5-0.5B-Instruct"
    assert base_model_license(EMBEDDED_HUB_ID) == "apache-2.0"
    assert base_model_license("Qwen/Qwen2.5-0.5B-Instruct") is None  # offline: not known
    described = base_model_description(EMBEDDED_HUB_ID, tmp_path)
    assert described.startswith(f"[{EMBEDDED_HUB_ID}](https://huggingface.co/{EMBEDDED_HUB_ID})")
    assert "dequantized from the Q4_1 GGUF" in described
    assert base_model_description(EMBEDDED_HUB_ID, tmp_path.parent) is None  # the Hub checkpoint itself: its link
    assert base_model_description("acme/tiny", tmp_path) is None


def test_card_of_a_pushed_model_loads_the_hub_repo(tiny_model_dir, tmp_path, check_model_card):
    args = make_args(tmp_path, otb_leave_one_out=True)
    trainer = OTBTrainer(tiny_model_dir, reward_funcs=RecordingReward(), args=args, train_dataset=prompts_dataset())
    trainer.hub_model_id = "me/qwen-otb"  # what Trainer.init_hf_repo sets when the run pushes
    results = CardResults(
        before=0.25,
        after=0.5,
        samples=8,
        dataset_type="openai/gsm8k",
        dataset_name="openai/gsm8k",
        dataset_config="main",
    )
    card = math_card(
        trainer,
        dataset_name="openai/gsm8k",
        results=results,
        summary={"steps": 3},
        base_model="Qwen/Qwen2.5-0.5B-Instruct",
    )
    assert card["license"] is None  # offline, the Qwen card cannot be read; a known license is passed on
    trainer.create_model_card(model_name="qwen-otb", dataset_name="openai/gsm8k", **{**card, "license": "apache-2.0"})
    parsed = check_model_card(f"{args.output_dir}/README.md", base_model="Qwen/Qwen2.5-0.5B-Instruct", accuracy=0.5)
    assert parsed.data.datasets == "openai/gsm8k" and parsed.data.license == "apache-2.0"
    assert 'model="me/qwen-otb"' in parsed.text
    assert "| leave-one-out | `True` |" in parsed.text and "| after training | 0.500 |" in parsed.text
    assert "- training steps: 3" in parsed.text
    before = [r for r in parsed.data.eval_results if "before" in r.metric_name]
    assert [(r.metric_value, r.dataset_config, r.task_name) for r in before] == [(0.25, "main", "Math reasoning")]
