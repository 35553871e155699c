"""Shared pytest fixtures. Names here are used across the test suite: keep them stable.

Fixtures:

- ``tiny_model_dir`` (session): path (str) of a tiny random ``LlamaForCausalLM`` saved with its
  tokenizer, built once per session in a temporary directory. Loads in well under a second, and a
  GRPO step on CPU takes about a second.
    * model: hidden 32, 2 layers, 4 heads (2 kv heads), intermediate 64, 512 positions,
      untied embeddings, ~26k parameters, seeded. Its policy is peaked (logits std ~1.5) and
      ends with EOS about 9% of the time per token, so sampled completion lengths vary.
    * tokenizer: byte-level (every string encodes and decodes exactly), 259 tokens; specials
      ``<|endoftext|>`` (0, unk), ``<|im_start|>`` (1), ``<|im_end|>`` (2, eos and pad, as in
      SmolLM2); a ChatML chat template without a system prompt, so conversational prompts
      (``[{"role": "user", "content": ...}]``) and plain-text prompts both work.
- ``tiny_model`` / ``tiny_tokenizer`` (function): fresh copies loaded from ``tiny_model_dir``.
- ``smollm2_dir`` (session): the embedded SmolLM2-135M-Instruct converted to a plain checkpoint
  (``trl_otb.recipes.models.embedded_model_path()``; ~25 s the first time on a machine, then cached in
  ``$TRL_OTB_CACHE`` or ``~/.cache/trl-otb``). Mark tests using it ``@pytest.mark.slow``.

Also set for every test: ``HF_HUB_OFFLINE=1`` (tests never touch the Hub), and
``torch.manual_seed(0)`` before each test.
"""

import os

# Before anything imports huggingface_hub, which reads these once at import time.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import math  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
TINY_SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def build_tiny_tokenizer():
    """A byte-level BPE tokenizer with no merges: one token per byte plus the ChatML specials."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {token: i for i, token in enumerate(TINY_SPECIAL_TOKENS + alphabet)}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(TINY_SPECIAL_TOKENS)
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        unk_token="<|endoftext|>",
        eos_token="<|im_end|>",
        pad_token="<|im_end|>",
        chat_template=CHATML_TEMPLATE,
    )


def build_tiny_model(vocab_size: int, eos_token_id: int, seed: int = 0, **config_overrides):
    """A seeded random 2-layer Llama whose sampled completions end early some of the time.

    A random init gives near-uniform next-token distributions (EOS at ~1/V per token, so every
    completion runs to the length limit). Two edits make it behave more like a trained model for
    tests: the LM head is scaled to logits of std ~1.5 (a peaked policy), and every embedding gets
    a constant +0.1 in hidden dimension 0, which survives the final RMSNorm as a shared feature the
    EOS row of the LM head reads (+1.2), so EOS has probability ~9% at each position.
    ``config_overrides`` go to ``LlamaConfig`` (the vLLM tests need ``head_dim=32``: vLLM's CPU attention kernels
    take no smaller head).
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=eos_token_id,
        pad_token_id=eos_token_id,
        **config_overrides,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
        with torch.no_grad():
            model.lm_head.weight.normal_(0.0, 1.5 / math.sqrt(config.hidden_size))
            model.model.embed_tokens.weight[:, 0] = 0.1
            model.lm_head.weight[eos_token_id, 0] = 1.2
    return model


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """Directory (str) of the tiny random Llama and its ChatML byte-level tokenizer."""
    path = tmp_path_factory.mktemp("tiny-llama")
    tokenizer = build_tiny_tokenizer()
    model = build_tiny_model(len(tokenizer), tokenizer.eos_token_id)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


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


@pytest.fixture(scope="session")
def smollm2_dir():
    """Directory (str) of the embedded SmolLM2-135M-Instruct as a plain checkpoint (slow tests only)."""
    from trl_otb.recipes.models import embedded_model_path

    return embedded_model_path()


@pytest.fixture(autouse=True)
def _seed_torch():
    """Seed torch before every test so random inputs are reproducible."""
    torch.manual_seed(0)


def _check_model_card(path, *, base_model=None, adapter=None, accuracy=None, run_quick_start=None):
    """Validate a model card with huggingface_hub itself and return it (``ModelCard``).

    It parses, its metadata round-trips through YAML, ``model-index`` converts to ``EvalResult``s whose
    ``pass@1`` after training is ``accuracy`` (when given), ``base_model``/tags/license are set, the text
    names no ``None`` model, and the quick start is the one for a full model or for a LoRA/QLoRA adapter.
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
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(code.replace("max_new_tokens=256", "max_new_tokens=2"), "quick_start", "exec"), {})
        assert out.getvalue().endswith("\n")  # it printed the decoded answer (2 tokens of a random model may be blank)
    return card


@pytest.fixture
def check_model_card():
    """:func:`_check_model_card`: validates a written model card with huggingface_hub."""
    return _check_model_card
