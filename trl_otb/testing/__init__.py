"""Tiny models and shared helpers for the test suite and the benchmarks (the role of TRL's ``testing_utils``).

- The tiny random Llama and its tokenizer: :func:`build_tiny_tokenizer`, :func:`build_tiny_model`,
  :func:`tiny_model_and_tokenizer`, :func:`save_tiny_checkpoint`.
- One-process trainer tests: :func:`make_args`, :func:`prompts_dataset`, :func:`generation_inputs`,
  :class:`RecordingReward`, and the independent recomputations :func:`independent_rollout_stats` and
  :func:`independent_ratio`.
- Multi-process tests (groups split across 2 ranks): :data:`SPLIT_PROMPTS`, :func:`split_group_dataset`,
  :func:`split_group_reward`, :data:`MAX_NEW_TOKENS`, :func:`free_port`, :func:`pad_to`.
- :func:`tool_ready_model`, the 4-bit helpers :func:`load_qlora`, :func:`arm_4bit_cpu_repack` and
  :func:`repack_4bit_layers`, :func:`load_script` (a benchmark script as a module), :func:`check_model_card` and
  :func:`fake_tracker_run`.
- Test-only switches, imported on their own: :mod:`trl_otb.testing.sharded_cpu` (accelerate's FSDP2 and DeepSpeed
  ZeRO-3 paths on CPU processes) and :mod:`trl_otb.testing.vllm_cpu` (TRL's vLLM weight sync on a CPU build of vLLM).

Only torch is imported here; transformers, TRL, datasets, peft and pytest are imported by the helpers that use them.
"""

from __future__ import annotations

import math
import socket

import torch

N = 4  # group size of the trainer tests

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
TINY_SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


# --------------------------------------------------------------------------- the tiny random Llama


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


# --------------------------------------------------------------------------- one-process trainer tests


def make_args(tmp_path, **overrides):
    """The trainer tests' ``OTBConfig``: CPU, fp32, groups of :data:`N`, 8 completions of up to 12 tokens, 1 step."""
    from trl_otb import OTBConfig

    base = dict(
        output_dir=str(tmp_path / "out"),
        use_cpu=True,
        bf16=False,
        gradient_checkpointing=False,
        per_device_train_batch_size=8,
        num_generations=N,
        max_completion_length=12,
        max_steps=1,
        report_to="none",
        logging_steps=1,
        save_strategy="no",
        seed=0,
        temperature=0.7,
    )
    return OTBConfig(**{**base, **overrides})


def prompts_dataset(n=16):
    from datasets import Dataset

    return Dataset.from_list([{"prompt": [{"role": "user", "content": f"what is {i} + {i % 3}?"}]} for i in range(n)])


def generation_inputs(n_prompts=2):
    """The inputs of one generation batch: ``n_prompts`` prompts, each :data:`N` times."""
    return [{"prompt": [{"role": "user", "content": f"what is {p} + 1?"}]} for p in range(n_prompts) for _ in range(N)]


class RecordingReward:
    """A deterministic reward that varies within groups and remembers what it returned.

    The reward of a completion is ``len % 3 + 0.25 * (first token % 2)``, a multiple of 0.25 in [0, 2.25]. Most
    completions of the tiny model run to the length limit, so a whole group of :data:`N` often ties: its advantages are
    then 0, and a batch of tied groups trains nothing. ``distinct=True`` adds ``0.1 * (i % N)`` to row i (its index
    within its group of N consecutive rows): 0.1, 0.2 and 0.3 are no multiples of 0.25, so no two rewards of a group
    tie, every batch has non-zero advantages and every optimizer step has a gradient, which a test that needs the
    trainer to move relies on. The rewards stay within [0, 2.55], the scale the tests' tolerances are set for.
    """

    __name__ = "recording_reward"
    DISTINCT_STEP = 0.1

    def __init__(self, none_rows=(), distinct=False):
        self.calls = []
        self.none_rows = set(none_rows)
        self.step = self.DISTINCT_STEP if distinct else 0.0

    def __call__(self, completions, completion_ids, **kwargs):
        out = [
            None
            if i in self.none_rows
            else float(len(ids) % 3) + 0.25 * (ids[0] % 2 if ids else 0) + self.step * (i % N)
            for i, ids in enumerate(completion_ids)
        ]
        self.calls.append(out)
        return out


def independent_rollout_stats(model, batch, temperature):
    """pi(y_t), sum_v pi(v)^2 and ||e_y - pi||^2 from a plain forward with full logits (no fused head), in fp64."""
    input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    attention_mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
    T = batch["completion_ids"].size(1)
    with torch.no_grad():
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, -T - 1 : -1].double()
    probs = torch.softmax(logits / temperature, dim=-1)
    p_token = probs.gather(-1, batch["completion_ids"].unsqueeze(-1)).squeeze(-1)
    one_hot = torch.nn.functional.one_hot(batch["completion_ids"], probs.size(-1)).double()
    proxy = ((one_hot - probs) ** 2).sum(-1)  # ||e_y - pi||^2, computed directly
    return p_token, (probs**2).sum(-1), proxy


def independent_ratio(old_logps, sampling_logps, mask, mode, clip_min, clip_max):
    """rho = pi_train / pi_behaviour, per token or per sequence, truncated or masked to [clip_min, clip_max]."""
    diff = (old_logps - sampling_logps) * mask
    ratio = torch.exp(diff.sum(dim=1, keepdim=True) if mode.startswith("sequence") else diff)
    if mode.endswith("truncate"):
        return ratio.clamp(clip_min, clip_max)
    return torch.where((ratio < clip_min) | (ratio > clip_max), torch.zeros_like(ratio), ratio)


def tool_ready_model(model_dir):
    """The tiny model with a chat template TRL can parse tool calls from (and room for its longer prompts)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl.chat_template_utils import qwen3_chat_template

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.chat_template = qwen3_chat_template
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    model.config.max_position_embeddings = 4096  # rotary positions: the tool schema makes prompts ~750 tokens
    return model, tokenizer


# --------------------------------------------------------------------------- multi-process tests

# Three groups of N: with 6 completions per rank, the middle group is split across 2 ranks.
SPLIT_PROMPTS = ["what is 1 + 1?", "unscorable: what is 2 + 2?", "what is 3 + 3?"]
MAX_NEW_TOKENS = {0: 5, 1: 12}  # per rank, so that the ranks' completion tensors have different widths


def split_group_dataset():
    from datasets import Dataset

    return Dataset.from_list([{"prompt": [{"role": "user", "content": p}]} for p in SPLIT_PROMPTS])


def split_group_reward(prompts, completion_ids, **kwargs):
    """Deterministic in the completion, so the test can recompute it; None for the unscorable prompt."""
    return [
        None if "unscorable" in str(prompt) else float(len(ids) % 3) + 0.25 * (ids[0] % 2)
        for prompt, ids in zip(prompts, completion_ids)
    ]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pad_to(x: torch.Tensor, width: int) -> torch.Tensor:
    """Right-pad the last dimension of a 2-D tensor with zeros to ``width``."""
    return torch.nn.functional.pad(x, (0, width - x.size(1)))


# --------------------------------------------------------------------------- 4-bit on CPU


def load_qlora(path):
    """A 4-bit model from ``path`` on CPU; skips the calling test where bitsandbytes is missing or cannot load it."""
    import pytest

    pytest.importorskip("bitsandbytes")
    from trl_otb.demo.models import load_model_and_tokenizer

    try:
        model, _ = load_model_and_tokenizer(path, quantization="4bit", dtype=torch.float32, device_map="cpu")
    except Exception as err:  # pragma: no cover - depends on the bitsandbytes build
        pytest.skip(f"bitsandbytes cannot load a 4-bit model on this CPU: {err}")
    return model


def arm_4bit_cpu_repack(model) -> int:
    """Arm bitsandbytes' CPU repack on every 4-bit layer, as loading on a CPU with AVX512-BF16 does; returns the count.

    bitsandbytes sets ``support_avx512bf16_for_cpu`` when a layer is built, to whether the CPU has AVX512-BF16; only
    then does the first eval-mode forward without gradients repack the layer (the trap
    :func:`trl_otb.bnb.guard_4bit_cpu_repack` stops). Elsewhere nothing is ever repacked, so a test that
    concludes "no layer was repacked" from a guarded run sets the flag first: the repack (bitsandbytes' own
    conversion) then happens on any CPU.
    """
    from trl_otb.bnb import linear4bit_modules

    layers = linear4bit_modules(model)
    for _, module in layers:
        module.support_avx512bf16_for_cpu = True
    return len(layers)


def repack_4bit_layers(model, ids, how: str) -> None:
    """Put ``model``'s 4-bit layers into bitsandbytes' CPU inference layout, as its eval-mode forward does.

    ``how="forward"``: the real trap, an eval-mode no-grad forward; bitsandbytes repacks only on CPUs with
    AVX512-BF16, so this branch is skipped elsewhere. ``how="simulated"``: the repack that forward would do, by
    bitsandbytes' own conversion (pure torch, any CPU), so the detection and restore paths are tested everywhere.
    """
    import pytest
    from bitsandbytes.functional import _convert_weight_packed_for_cpu, has_avx512bf16

    from trl_otb.bnb import linear4bit_modules

    if how == "forward":
        if not has_avx512bf16():
            pytest.skip("the CPU has no AVX512-BF16 (avx512_bf16 in /proc/cpuinfo): bitsandbytes never repacks here")
        model.eval()
        with torch.no_grad():
            model(input_ids=ids)  # the trap: eval mode, no grad, on CPU
        return
    for _, module in linear4bit_modules(model):
        weight = module.weight
        weight.data, weight.quant_state = _convert_weight_packed_for_cpu(weight.data, weight.quant_state)


# --------------------------------------------------------------------------- scripts and model cards


def load_script(path):
    """Import a script (e.g. ``benchmarks/variance.py``) as a module from its path, leaving ``sys.path`` alone."""
    import importlib.util
    import sys
    from pathlib import Path

    path = Path(path)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses and pickle find a module's classes through sys.modules
    spec.loader.exec_module(module)
    return module


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
