"""Shared pytest fixtures. Names here are used across the test suite: keep them stable.

The helpers behind them (the tiny model and tokenizer, the trainer-test helpers) live in :mod:`trl_otb.testing`.

Fixtures:

- ``tiny_model_dir`` (session): path (str) of a tiny random ``LlamaForCausalLM`` saved with its
  tokenizer (``trl_otb.testing.save_tiny_checkpoint``), built once per session in a temporary directory. Loads
  in well under a second, and a GRPO step on CPU takes about a second.
    * model: hidden 32, 2 layers, 4 heads (2 kv heads), intermediate 64, 512 positions,
      untied embeddings, ~26k parameters, seeded. Its policy is peaked (logits std ~1.5) and
      ends with EOS about 9% of the time per token, so sampled completion lengths vary.
    * tokenizer: byte-level (every string encodes and decodes exactly), 259 tokens; specials
      ``<|endoftext|>`` (0, unk), ``<|im_start|>`` (1), ``<|im_end|>`` (2, eos and pad, as in
      SmolLM2); a ChatML chat template without a system prompt, so conversational prompts
      (``[{"role": "user", "content": ...}]``) and plain-text prompts both work.
- ``tiny_model`` / ``tiny_tokenizer`` (function): fresh copies loaded from ``tiny_model_dir``.
- ``tiny_4bit_dir`` (function): a random Llama with 64-wide layers and the tiny tokenizer, for 4-bit loading.
- ``smollm2_dir`` (session): the embedded SmolLM2-135M-Instruct converted to a plain checkpoint
  (``trl_otb.demo.models.embedded_model_path()``; ~25 s the first time on a machine, then cached in
  ``$TRL_OTB_CACHE`` or ``~/.cache/trl-otb``). Mark tests using it ``@pytest.mark.slow``.
- ``check_model_card``: ``trl_otb.testing.check_model_card``, which validates a written model card.

Also set for every test: ``HF_HUB_OFFLINE=1`` (tests never touch the Hub), and
``torch.manual_seed(0)`` before each test.
"""

import os

# Before anything imports huggingface_hub, which reads these once at import time.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402
import torch  # noqa: E402

from trl_otb import testing  # noqa: E402


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """Directory (str) of the tiny random Llama and its ChatML byte-level tokenizer."""
    return testing.save_tiny_checkpoint(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture
def tiny_model(tiny_model_dir):
    """A fresh fp32 copy of the tiny model (safe to train or modify in the test)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)


@pytest.fixture
def tiny_tokenizer(tiny_model_dir):
    """A fresh copy of the tiny model's tokenizer."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture
def tiny_4bit_dir(tmp_path_factory, tiny_tokenizer):
    """A tiny Llama with 64-wide layers (bitsandbytes' CPU repack needs in_features >= its block size 64)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tiny_tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, eos_token_id=tiny_tokenizer.eos_token_id,
        pad_token_id=tiny_tokenizer.pad_token_id, bos_token_id=None,
    )  # fmt: skip
    path = tmp_path_factory.mktemp("tiny-4bit")
    LlamaForCausalLM(config).save_pretrained(path)
    tiny_tokenizer.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="session")
def smollm2_dir():
    """Directory (str) of the embedded SmolLM2-135M-Instruct as a plain checkpoint (slow tests only)."""
    from trl_otb.demo.models import embedded_model_path

    return embedded_model_path()


@pytest.fixture(autouse=True)
def _seed_torch():
    """Seed torch before every test so random inputs are reproducible."""
    torch.manual_seed(0)


@pytest.fixture
def check_model_card():
    """:func:`trl_otb.testing.check_model_card`: validates a written model card with huggingface_hub."""
    return testing.check_model_card
