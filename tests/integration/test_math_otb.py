"""examples/math_otb.py end to end on the tiny model (full, LoRA, and QLoRA on the embedded SmolLM2), its recipes, and
the checks that stop it before training. What it is made of: tests/demo/ (test_hub.py for the Hub pre-flight and the
offline switch, test_card.py for what trl_otb.demo.card adds to the model card)."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest
import torch

from trl_otb import OTBConfig
from trl_otb.demo.models import EMBEDDED_HUB_ID, EMBEDDED_MODEL_NAME
from trl_otb.testing import fake_tracker_run

ROOT = Path(__file__).resolve().parents[2]
RECIPES = sorted((ROOT / "examples" / "recipes").glob("*.yaml"))


@pytest.fixture(scope="module")
def math_otb():
    spec = importlib.util.spec_from_file_location("math_otb", ROOT / "examples" / "math_otb.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["math_otb"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def tiny_argv(model_dir, output_dir, *extra):
    return [
        "--model_name_or_path", str(model_dir),
        "--output_dir", str(output_dir),
        "--max_steps", "2",
        "--eval_samples", "4",
        "--num_train", "16",
        "--per_device_train_batch_size", "4",
        "--max_completion_length", "8",
        *extra,
    ]  # fmt: skip


def test_example_trains_and_writes_checkpoint_card_summary_and_plot(
    math_otb, tiny_model_dir, tmp_path, check_model_card, capsys, monkeypatch
):
    url = fake_tracker_run(monkeypatch)  # the run is tracked: TRL's card links it
    out = tmp_path / "run"
    argv = tiny_argv(tiny_model_dir, out, "--base_model_id", "acme/tiny-llama")
    summary = math_otb.main(*math_otb.parse_args(argv))
    progress = capsys.readouterr().err
    for when in ("before", "after"):  # one bar per evaluation, counting generated tokens to its end (8 here)
        assert re.search(rf"pass@1 {when} \(4 prompts\): 100%.* 8/8 ", progress), progress[-2000:]

    assert (out / "model.safetensors").is_file() and (out / "tokenizer.json").is_file()
    saved = json.loads((out / "summary.json").read_text())
    assert saved["steps"] == summary["steps"] == 2
    assert saved["eval_samples"] == 4
    for key in ("accuracy_before", "accuracy_after"):
        assert 0.0 <= saved[key] <= 1.0
    assert saved["completion_tokens"] > 0
    assert saved["trl_num_tokens"] > saved["completion_tokens"]  # TRL's count includes the prompts
    assert saved["wall_time_s"] > 0
    assert (out / "training.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    parsed = check_model_card(
        out / "README.md",
        base_model="acme/tiny-llama",
        accuracy=saved["accuracy_after"],
        tracker_url=url,
        run_quick_start={},  # the quick start loads the output directory itself
    )
    assert parsed.data.license == "other"  # unknown offline: the card says to check the base model's license
    assert f'pipeline("text-generation", model="{out}"' in parsed.text  # no hub_model_id: the output directory
    card = (out / "README.md").read_text()
    defaults = ("| leave-one-out | `True` |", "| tail | `others_mean` |", "| shrinkage | `ess` |")  # OTBConfig's
    for text in ("| group size N (num_generations) | `4` |", "| proxy w_t | `logit` |", *defaults):
        assert text in card
    assert card.index("### OTB settings") < card.index("### Math demo") < card.index("### Framework versions")
    assert f"| before training | {saved['accuracy_before']:.3f} |" in card
    assert f"| after training | {saved['accuracy_after']:.3f} |" in card
    assert "scored by `trl_otb.demo.rewards.accuracy_reward`" in card
    assert "arXiv:2602.07078" in card and "vonwerra2020trl" in card


def test_use_peft_trains_a_lora_adapter_for_one_step(
    math_otb, tiny_model_dir, tmp_path, check_model_card, monkeypatch
):
    url = fake_tracker_run(monkeypatch)
    out = tmp_path / "lora"
    argv = tiny_argv(tiny_model_dir, out, "--use_peft", "--lora_r", "4", "--max_steps", "1", "--eval_samples", "2")
    argv += ["--base_model_id", "acme/tiny-llama"]
    summary = math_otb.main(*math_otb.parse_args(argv))
    assert summary["steps"] == 1 and summary["use_peft"]
    assert (out / "adapter_model.safetensors").is_file()
    assert not (out / "model.safetensors").exists()
    card = check_model_card(
        out / "README.md",
        base_model="acme/tiny-llama",
        adapter="lora",
        accuracy=summary["accuracy_after"],
        tracker_url=url,
        run_quick_start={"acme/tiny-llama": tiny_model_dir},
    )
    assert "LoRA adapter" in card.text and "lora" in card.data.tags


def test_no_arguments_use_the_cpu_recipe_with_cpu_settings(math_otb):
    import yaml

    script_args, math_args, args, model_args = math_otb.parse_args([])
    recipe = yaml.safe_load(math_otb.DEFAULT_RECIPE.read_text())
    assert model_args.model_name_or_path is None  # the embedded SmolLM2
    assert script_args.dataset_name is None  # the generated offline dataset
    assert math_args.eval_samples == recipe["eval_samples"]
    for key in ("num_generations", "max_steps", "max_completion_length", "per_device_train_batch_size"):
        assert getattr(args, key) == recipe[key]
    assert args.num_generations == 4 and args.advantage_estimator == "otb"
    if not torch.cuda.is_available():
        assert args.use_cpu and not args.bf16 and not args.gradient_checkpointing


def test_command_line_overrides_the_recipe_and_the_cpu_defaults(math_otb):
    _, math_args, args, model_args = math_otb.parse_args(
        ["--max_steps", "3", "--gradient_checkpointing", "true", "--eval_samples", "5", "--use_peft"]
    )
    assert args.max_steps == 3 and args.gradient_checkpointing and math_args.eval_samples == 5 and model_args.use_peft


@pytest.mark.parametrize("recipe", RECIPES, ids=[path.name for path in RECIPES])
def test_recipe_parses(math_otb, recipe):
    script_args, math_args, args, model_args = math_otb.parse_args(["--config", str(recipe)])
    assert isinstance(args, OTBConfig)
    assert args.num_generations >= 2
    assert args.per_device_train_batch_size * args.gradient_accumulation_steps % args.num_generations == 0
    if recipe.name.startswith("qwen3-8b_dapo_math"):
        assert args.use_vllm and args.vllm_mode == "colocate" and args.bf16 and args.beta == 0.0
        assert args.loss_type == "dapo" and args.max_completion_length == 8192
        assert script_args.dataset_name == "BytedTsinghua-SIA/DAPO-Math-17k"
        assert args.num_generations == (4 if "n4" in recipe.name else 16)
    if "lora" in recipe.name:
        assert model_args.use_peft
    if "qlora" in recipe.name:
        assert model_args.load_in_4bit


def test_the_recipe_set_is_complete():
    names = {path.name for path in RECIPES}
    assert {
        "cpu_smollm2.yaml",
        "cpu_smollm2_lora.yaml",
        "qwen2.5-0.5b_gsm8k.yaml",
        "qwen2.5-0.5b_gsm8k_qlora.yaml",
    } <= names
    assert {"qwen3-8b_dapo_math.yaml", "qwen3-8b_dapo_math_n4.yaml"} <= names


def test_offline_uncached_hub_model_stops_before_training_naming_the_embedded_default(math_otb, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    out = tmp_path / "never"
    argv = ["--model_name_or_path", "some-org/not-a-cached-model", "--output_dir", str(out)]
    with pytest.raises(SystemExit) as excinfo:
        math_otb.main(*math_otb.parse_args(argv))
    message = str(excinfo.value)
    assert "some-org/not-a-cached-model" in message and EMBEDDED_MODEL_NAME in message
    assert "--model_name_or_path embedded" in message
    assert not out.exists()  # nothing trained, nothing written


def test_missing_matplotlib_stops_before_training_naming_the_plots_extra(math_otb, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` raises, as when it is not installed
    out = tmp_path / "never"
    with pytest.raises(SystemExit, match=re.escape("pip install 'trl-otb[plots]'")):
        math_otb.main(*math_otb.parse_args(["--output_dir", str(out)]))
    assert not out.exists()


def test_push_to_hub_offline_stops_before_loading_anything(math_otb, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    out = tmp_path / "never"
    argv = ["--push_to_hub", "--hub_model_id", "me/otb", "--output_dir", str(out)]
    with pytest.raises(SystemExit, match="HF_HUB_OFFLINE"):
        math_otb.main(*math_otb.parse_args(argv))
    assert not out.exists()


@pytest.mark.slow
def test_qlora_trains_smollm2_for_one_step(math_otb, smollm2_dir, tmp_path, check_model_card, monkeypatch):
    # bitsandbytes' CPU inference kernel needs in_features >= its block size (64): the tiny model (hidden 32) cannot be
    # evaluated in 4-bit, so QLoRA is checked on the embedded SmolLM2 (hidden 576). Slow: 4-bit matmuls on CPU.
    pytest.importorskip("bitsandbytes")
    out = tmp_path / "qlora"
    argv = [
        "--model_name_or_path", smollm2_dir,
        "--output_dir", str(out),
        "--use_peft", "--load_in_4bit",
        "--max_steps", "1",
        "--eval_samples", "1",
        "--eval_max_new_tokens", "4",
        "--num_train", "8",
        "--per_device_train_batch_size", "4",
        "--max_completion_length", "8",
    ]  # fmt: skip
    url = fake_tracker_run(monkeypatch, "comet")
    summary = math_otb.main(*math_otb.parse_args(argv))
    assert summary["steps"] == 1 and summary["load_in_4bit"] and summary["use_peft"]
    assert (out / "adapter_model.safetensors").is_file() and (out / "summary.json").is_file()
    card = check_model_card(
        out / "README.md",
        base_model=EMBEDDED_HUB_ID,
        adapter="qlora",
        accuracy=summary["accuracy_after"],
        tracker_url=url,
    )
    assert card.data.license == "apache-2.0" and "4-bit" in card.data.tags
    assert "dequantized from the Q4_1 GGUF" in card.text  # the embedded model, as the demo's section names it
