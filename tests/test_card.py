"""OTBTrainer's model card (trl_otb/card.py): TRL's card, with its tracker links, tags and citations, plus OTB's part.

The full, LoRA and QLoRA cards of the math example are checked end to end in tests/integration/test_math_otb.py, and
what trl_otb.demo.card adds to them in tests/demo/test_card.py.
"""

from __future__ import annotations

import pytest
from huggingface_hub import EvalResult

from trl_otb import OTBTrainer
from trl_otb.testing import RecordingReward, fake_tracker_run, make_args, prompts_dataset


@pytest.fixture
def trainer(tiny_model_dir, tmp_path):
    return OTBTrainer(
        tiny_model_dir, reward_funcs=RecordingReward(), args=make_args(tmp_path), train_dataset=prompts_dataset()
    )


@pytest.mark.parametrize("tracker", ["trackio", "comet"])
def test_card_keeps_trls_tracker_link_beside_the_otb_settings(trainer, tracker, monkeypatch, check_model_card):
    url = fake_tracker_run(monkeypatch, tracker)
    trainer.create_model_card()
    card = check_model_card(f"{trainer.args.output_dir}/README.md", tracker_url=url)
    if tracker == "trackio":
        assert f"trackio:{url}" in card.data.tags  # TRL's tag, which the Trackio dashboard reads
    # TRL's own parts are there, each once: the paper named by OTBTrainer._paper, its citation, TRL's citation.
    assert "a method introduced in [The Optimal Token Baseline" in card.text
    assert "https://huggingface.co/papers/2602.07078" in card.text
    assert card.text.count("@article{li2026optimal") == 1 and card.text.count("@software{vonwerra2020trl") == 1
    # TRL's sections come first, the OTB settings under its training procedure.
    order = ["## Quick start", "## Training procedure", "### OTB settings", "### Framework versions", "## Citations"]
    assert [card.text.index(heading) for heading in order] == sorted(card.text.index(h) for h in order)


def test_without_a_tracker_there_is_no_tracker_link(trainer, check_model_card):
    trainer.create_model_card()
    card = check_model_card(f"{trainer.args.output_dir}/README.md")
    assert "Visualize in" not in card.text and not any(tag.startswith("trackio:") for tag in card.data.tags)


def test_card_fixes_what_trls_template_writes_for_a_local_unpushed_model(trainer, check_model_card):
    # TRL alone: the model came from a local directory and is not pushed.
    readme = f"{trainer.args.output_dir}/README.md"
    super(OTBTrainer, trainer).create_model_card(model_name="out")
    trl_card = open(readme).read()
    assert "[None](https://huggingface.co/None)" in trl_card and 'model="None"' in trl_card
    assert "licence: license" in trl_card  # not a Hub metadata field

    trainer.save_model()
    trainer.create_model_card()
    card = check_model_card(readme, base_model=None, run_quick_start={})  # the quick start loads the output dir
    assert "fine-tuned version of a model without a Hub id" in card.text
    assert f'model="{trainer.args.output_dir}"' in card.text
    assert card.data.license == "other" and "the base model's license applies" in card.text


def test_caller_gives_base_model_license_eval_results_and_sections(trainer, check_model_card):
    trainer.hub_model_id = "otb-lab/tiny-otb"  # what Trainer.init_hf_repo sets when the run pushes
    result = EvalResult(
        task_type="text-generation", dataset_type="acme/prompts", dataset_name="acme prompts",
        metric_type="pass@1", metric_name="pass@1 (greedy)", metric_value=0.75,
    )  # fmt: skip
    trainer.create_model_card(
        model_name="tiny-otb",
        dataset_name="acme/prompts",
        base_model="acme/tiny-llama",
        license="apache-2.0",
        eval_results=[result],
        sections={"Results": "Scored on 8 held-out prompts."},
    )
    card = check_model_card(f"{trainer.args.output_dir}/README.md", base_model="acme/tiny-llama", accuracy=0.75)
    assert card.data.license == "apache-2.0" and "## License" not in card.text
    assert card.data.datasets == "acme/prompts"  # TRL's dataset metadata, and its link:
    assert "[acme/prompts](https://huggingface.co/datasets/acme/prompts)" in card.text
    assert "[acme/tiny-llama](https://huggingface.co/acme/tiny-llama)" in card.text
    assert 'model="otb-lab/tiny-otb"' in card.text
    assert card.text.index("### OTB settings") < card.text.index("### Results\n\nScored on 8 held-out prompts.")


def test_an_unknown_card_argument_is_refused(trainer):
    with pytest.raises(TypeError, match="dataset_description"):
        trainer.create_model_card(dataset_description="generated math")


def test_push_to_hub_writes_the_extended_card_before_uploading(trainer, monkeypatch, check_model_card):
    import transformers.trainer

    uploads = []

    class Hub:  # the upload only: what transformers' push_to_hub sends, with the README as it is at that moment
        def upload_folder(self, repo_id, folder_path, **kwargs):
            uploads.append((repo_id, open(f"{folder_path}/README.md").read()))

    monkeypatch.setattr(transformers.trainer, "hf_api", Hub)
    trainer.hub_model_id = "otb-lab/tiny-otb"  # what Trainer.init_hf_repo sets (it needs the Hub)
    trainer.push_to_hub(base_model="acme/tiny-llama", sections={"Results": "Scored on 8 held-out prompts."})
    [(repo_id, uploaded)] = uploads
    assert repo_id == "otb-lab/tiny-otb"
    card = check_model_card(f"{trainer.args.output_dir}/README.md", base_model="acme/tiny-llama")
    assert uploaded == open(f"{trainer.args.output_dir}/README.md").read()
    assert "### Results" in uploaded and 'model="otb-lab/tiny-otb"' in card.text


def test_a_lora_card_lists_each_framework_once_after_peft_saves_into_it(tiny_model_dir, tmp_path):
    """A checkpoint save writes the card into output_dir; trainer.save_model() then has PEFT add its version to the
    card's framework versions unless the very line is there: each framework stays listed once."""
    import re

    from huggingface_hub import ModelCard
    from peft import LoraConfig

    args = make_args(tmp_path, save_strategy="steps", save_steps=1)
    trainer = OTBTrainer(
        tiny_model_dir,
        reward_funcs=RecordingReward(),
        args=args,
        train_dataset=prompts_dataset(),
        peft_config=LoraConfig(r=4, target_modules=["q_proj"]),
    )
    trainer.train()
    readme = f"{args.output_dir}/README.md"
    assert "### OTB settings" in open(readme).read()  # precondition: the checkpoint wrote OTB's card in output_dir
    trainer.save_model()  # PEFT's save_pretrained edits that card
    card = ModelCard.load(readme)
    block = card.text.split("### Framework versions", 1)[1].split("\n## ", 1)[0]
    names = [re.match(r"- ([\w-]+)", line)[1].lower() for line in block.splitlines() if line.startswith("- ")]
    assert {"peft", "trl", "trl-otb", "transformers"} <= set(names)
    assert len(names) == len(set(names)), names


def test_the_otb_settings_section_names_every_estimator_option():
    from trl_otb import OTBConfig
    from trl_otb.card import otb_settings_section

    args = OTBConfig(
        output_dir="unused", use_cpu=True, bf16=False, otb_leave_one_out=True, otb_tail="others_mean",
        otb_shrinkage="ess",
    )  # fmt: skip
    section = otb_settings_section(args)
    for row in ("| tail | `others_mean` |", "| leave-one-out | `True` |", "| shrinkage | `ess` |"):
        assert row in section
