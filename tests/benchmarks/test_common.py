"""benchmarks/common.py: the random models the benchmarks build, and the plots' missing-extra message."""

from __future__ import annotations

import sys

import pytest
import torch

from benchmarks import common


def test_random_models_follow_their_shape(tiny_tokenizer):
    """common.build_random_model: the config of SHAPES (or the given vocabulary), the same weights for a seed, and a
    clear error for a vocabulary the tokenizer does not fit in."""
    spec = common.SHAPES["tiny-qwen2"]
    model = common.build_random_model("tiny-qwen2", tiny_tokenizer, seed=3)
    assert type(model).__name__ == "Qwen2ForCausalLM"
    assert all(getattr(model.config, k) == v for k, v in spec.items() if k not in ("arch", "rope_theta"))
    assert model.config.rope_parameters["rope_theta"] == spec["rope_theta"]
    assert model.generation_config.eos_token_id == tiny_tokenizer.eos_token_id
    again = common.build_random_model("tiny-qwen2", tiny_tokenizer, seed=3)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values()))
    own = common.build_random_model("tiny-qwen2", tiny_tokenizer, vocab_size=len(tiny_tokenizer))
    assert own.config.vocab_size == own.get_output_embeddings().weight.shape[0] == len(tiny_tokenizer)
    with pytest.raises(ValueError, match="vocabulary smaller than the tokenizer"):
        common.build_random_model("tiny-qwen2", tiny_tokenizer, vocab_size=len(tiny_tokenizer) - 1)


def test_plots_without_matplotlib_say_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # what an install without the plots extra sees
    with pytest.raises(ImportError, match=r"pip install 'trl-otb\[plots\]'"):
        common.pyplot()
