"""Completions to measure: sampled from the model itself at temperature T, in TRL's batch layout.

:func:`sample_completions` returns the padded tensors the check consumes (``input_ids``, masks,
``group_ids``), not decoded text.
"""

from __future__ import annotations

import torch

from ..bnb import guard_4bit_cpu_repack, is_4bit_model

__all__ = ["DEFAULT_PROMPTS", "sample_completions"]

DEFAULT_PROMPTS = (
    "What is 17 + 25? Answer with a number.",
    "Name three prime numbers greater than 10.",
    "Write one sentence about the sea.",
    "If a train travels 60 km in 1.5 hours, what is its average speed?",
    "Give a synonym for 'happy'.",
    "What is the capital of France, and why is it famous?",
    "Explain in one sentence what a gradient is.",
    "Count from 1 to 5 in words.",
)


def sample_completions(
    model: torch.nn.Module,
    tokenizer,
    prompts,
    *,
    num_samples: int = 4,
    max_new_tokens: int = 32,
    temperature: float = 1.0,
    seed: int = 0,
) -> dict[str, torch.Tensor]:
    """Sample ``num_samples`` completions per prompt from softmax(z / T) (no top-k/top-p), as a token batch.

    ``prompts``: strings (wrapped as one user message when the tokenizer has a chat template) or
    lists of chat messages. Returns a dict of CPU tensors, not text: ``input_ids [B, S]``,
    ``attention_mask [B, S]``, ``completion_mask [B, C]`` (up to and including the first EOS) and
    ``group_ids [B]``, with ``B = len(prompts) * num_samples``, in TRL's layout (left-padded prompt,
    then completion). Sampling is seeded by ``seed``.
    """
    if is_4bit_model(model):
        guard_4bit_cpu_repack(model)
    texts = []
    for prompt in prompts:
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
        if tokenizer.chat_template is not None:
            texts.append(tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))
        else:
            texts.append(prompt if isinstance(prompt, str) else "\n".join(m["content"] for m in messages))
    previous_side = tokenizer.padding_side
    tokenizer.padding_side = "left"
    try:
        enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    finally:
        tokenizer.padding_side = previous_side
    device = next(model.parameters()).device
    prompt_ids, prompt_mask = enc["input_ids"].to(device), enc["attention_mask"].to(device)
    eos = tokenizer.eos_token_id
    was_training = model.training
    model.eval()
    try:
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            torch.manual_seed(seed)
            out = model.generate(
                input_ids=prompt_ids,
                attention_mask=prompt_mask,
                do_sample=True,
                temperature=temperature,
                top_k=0,
                top_p=1.0,
                min_p=None,
                repetition_penalty=1.0,
                max_new_tokens=max_new_tokens,
                num_return_sequences=num_samples,
                pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos,
                eos_token_id=eos,
            )
    finally:
        model.train(was_training)
    P = prompt_ids.shape[1]
    completion = out[:, P:]
    is_eos = completion == eos
    # 1 up to and including the first EOS.
    completion_mask = (torch.cumsum(is_eos.long(), 1) - is_eos.long()) == 0
    prompt_mask = prompt_mask.repeat_interleave(num_samples, 0)
    return {
        "input_ids": out.cpu(),
        "attention_mask": torch.cat([prompt_mask, completion_mask.long()], 1).cpu(),
        "completion_mask": completion_mask.long().cpu(),
        "group_ids": torch.arange(len(prompts)).repeat_interleave(num_samples),
    }
