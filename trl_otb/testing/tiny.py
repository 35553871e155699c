"""The tiny random Llama and its byte-level tokenizer: what most tests and the CPU benchmarks train."""

from __future__ import annotations

import math

import torch

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
TINY_SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def build_tiny_tokenizer():
    """A byte-level BPE tokenizer with no merges: one token per byte plus the ChatML specials.

    Every string encodes and decodes exactly; 259 tokens; ``<|endoftext|>`` (0, unk), ``<|im_start|>`` (1),
    ``<|im_end|>`` (2, eos and pad, as in SmolLM2); a ChatML chat template without a system prompt.
    """
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

    Hidden 32, 2 layers, 4 heads (2 kv heads), intermediate 64, 512 positions, untied embeddings. A random init
    gives near-uniform next-token distributions (EOS at ~1/V per token, so every completion runs to the length
    limit). Two edits make it behave more like a trained model for tests: the LM head is scaled to logits of std
    ~1.5 (a peaked policy), and every embedding gets a constant +0.1 in hidden dimension 0, which survives the final
    RMSNorm as a shared feature the EOS row of the LM head reads (+1.2), so EOS has probability ~9% at each position.
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


def tiny_model_and_tokenizer(seed: int = 0, **config_overrides):
    """``(model, tokenizer)``: :func:`build_tiny_model` for :func:`build_tiny_tokenizer`, generation padding set."""
    tokenizer = build_tiny_tokenizer()
    model = build_tiny_model(len(tokenizer), tokenizer.eos_token_id, seed=seed, **config_overrides)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer


def save_tiny_checkpoint(path, **config_overrides) -> str:
    """Save :func:`tiny_model_and_tokenizer`'s model and tokenizer to ``path``; returns it as a string."""
    model, tokenizer = tiny_model_and_tokenizer(**config_overrides)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def tool_ready_model(model_dir):
    """The tiny model with a chat template TRL can parse tool calls from (and room for its longer prompts)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl.chat_template_utils import qwen3_chat_template

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.chat_template = qwen3_chat_template
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    model.config.max_position_embeddings = 4096  # rotary positions: the tool schema makes prompts ~750 tokens
    return model, tokenizer
