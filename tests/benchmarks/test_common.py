"""benchmarks/common.py: the random models the benchmarks build, the counting reward of the training curves, and the
plots' missing-extra message."""

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


def test_counting_reward_adds_up_completion_tokens_and_keeps_the_reward():
    """common.CountingReward: the wrapped reward's scores and name, and every scored completion's tokens added up over
    calls (the x axis of sample_efficiency.py's and training_study's curves)."""

    def length_reward(completions, **kwargs):
        return [float(len(c)) + kwargs["bonus"] for c in completions]

    counted = common.CountingReward(length_reward)
    assert counted.__name__ == "length_reward" and counted.tokens == 0
    assert counted(["ab", "c"], completion_ids=[[1, 2], [3]], bonus=1.0) == [3.0, 2.0]
    assert counted(["defg"], completion_ids=[[4, 5, 6, 7]], bonus=0.0) == [4.0]
    assert counted.tokens == 7


def test_plots_without_matplotlib_say_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # what an install without the plots extra sees
    with pytest.raises(ImportError, match=r"pip install 'trl-otb\[plots\]'"):
        common.pyplot()
