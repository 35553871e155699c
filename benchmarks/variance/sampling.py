"""The pools the variance is measured on: each task's model, prompts and reward, the completions sampled per prompt
with the head statistics of every token (each prompt's pool cached on its own), a pool cut at a horizon, and the
groups drawn from a pool.

Tasks. ``math``: the generated math prompts, accuracy reward, temperature 1. ``count``: "List the numbers from 1 to
n, separated by commas." for n in ``--count-targets``, with the assistant turn started as "1, 2, 3,"
(``COUNT_PREFIX``), sampled at temperature 0.7 (at 1.0 the embedded model does not count); the answer needs about 4
to 5 tokens per number (n = 200: ~900 tokens), and the reward is the share of 1..n listed in order before the first
mistake, halved if the list does not end at n: a long answer whose reward is decided by where its first error falls.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch

from benchmarks.common import sample
from trl_otb.gradcheck.gram import head_statistics

COUNT_PREFIX = "1, 2, 3,"
"""The count task's answer starts with this (as the start of the assistant turn): unprompted, the embedded model
often answers "The numbers from 1 to 120 are 1, 2, ..., 20." and stops, which is not a long answer."""


def count_reward(text: str, n: int) -> float:
    """Share of 1..n listed in order (the longest run 1, 2, 3, ... in the text, so a preamble such as "from 1 to
    100:" does not count against it), halved unless the run reaches n and nothing follows it."""
    import re

    numbers = [int(x) for x in re.findall(r"\d+", text)]
    best, complete = 0, False
    for start in (i for i, x in enumerate(numbers) if x == 1):
        run = 0
        while start + run < len(numbers) and run < n and numbers[start + run] == run + 1:
            run += 1
        if run > best:
            best, complete = run, run == n and start + run == len(numbers)
    return best / n * (1.0 if complete else 0.5)


def setup(quick: bool, num_prompts: int, seed: int, task: str = "math", count_targets=(120, 160, 200)):
    """(model, tokenizer, candidate prompts, reward_fn(completion_ids, texts, prompt_index) -> list[float]).

    ``num_prompts`` is the length of the candidate list (math, quick); a fixed list, so that prompt i is the same
    prompt in every invocation."""
    if quick:
        from trl_otb.testing import build_tiny_model, build_tiny_tokenizer

        tokenizer = build_tiny_tokenizer()
        model = build_tiny_model(len(tokenizer), tokenizer.eos_token_id)
        prompts = [[{"role": "user", "content": f"what is {i} + {i % 3}?"}] for i in range(num_prompts)]

        def reward(ids, texts, p):  # synthetic, varies within groups: parity of length and first token
            return [float((len(x) + (int(x[0]) if len(x) else 0) + p) % 2) for x in ids]

        return model, tokenizer, prompts, reward
    if task in STUDY_TASKS:
        return study_setup(task, num_prompts, seed)
    from trl_otb.demo.data import load_math_dataset
    from trl_otb.demo.models import load_model_and_tokenizer
    from trl_otb.demo.rewards import accuracy_reward

    model, tokenizer = load_model_and_tokenizer(dtype=torch.float32)
    if task == "count":
        targets = list(count_targets)
        prompts = [
            [
                {"role": "user", "content": f"List the numbers from 1 to {n}, separated by commas."},
                {"role": "assistant", "content": COUNT_PREFIX},
            ]
            for n in targets
        ]

        def reward(ids, texts, p):
            return [count_reward(COUNT_PREFIX + t, targets[p]) for t in texts]

        return model, tokenizer, prompts, reward
    data = load_math_dataset(split="train", num_train=num_prompts, seed=seed)
    prompts = [row["prompt"] for row in data]
    answers = [row["answer"] for row in data]

    def reward(ids, texts, p):
        return [float(r or 0.0) for r in accuracy_reward(texts, [answers[p]] * len(texts))]

    return model, tokenizer, prompts, reward


STUDY_TASKS = {"study-ramble": "ramble", "study-copy": "copy", "study-long_right": "long_right"}
"""The training study's tasks (``study_task.py``), on its warm-started policy of ``--seed``."""


def study_setup(task: str, num_prompts: int, seed: int):
    """The training study's policy of ``seed`` and the first ``num_prompts`` of its training patterns."""
    from benchmarks import study_task

    spec = study_task.TASKS[STUDY_TASKS[task]]
    model, tokenizer = study_task.warm_start(seed, Path(".cache/training_study"))
    patterns = study_task.split_patterns(seed)[0][:num_prompts]

    def reward(ids, texts, p):
        return [spec.score(t, patterns[p]) for t in texts]

    return model, tokenizer, [spec.prompt(p) for p in patterns], reward


def completion_records(comp, lengths, h, log_z, logp_y, sum_sq, top) -> list[dict]:
    """One dict per completion, every per-token tensor cut to the completion's length (the pool's format)."""
    fields = {"ids": comp, "h": h, "log_z": log_z, "logp_y": logp_y, "sum_sq": sum_sq, "top": top}
    return [{name: x[i, :k] for name, x in fields.items()} for i, k in enumerate(lengths.tolist())]


def sample_pool(model, tokenizer, prompts, pool_size, horizon, batch_size, temperature=1.0, top_k=64):
    """Sample ``pool_size`` completions per prompt and collect the head statistics of every completion token.

    Returns (pools, prompt_ids): per prompt, a list of completion dicts and the prompt's token ids."""
    tokenizer.padding_side = "left"
    pools, prompt_ids = [], []
    eos = tokenizer.eos_token_id
    for p_index, prompt in enumerate(prompts):
        # A final assistant message is a prefix the completion continues (the count task starts the list).
        prefill = prompt[-1]["role"] == "assistant"
        text = tokenizer.apply_chat_template(
            prompt, tokenize=False, add_generation_prompt=not prefill, continue_final_message=prefill
        )
        enc = tokenizer([text], return_tensors="pt", add_special_tokens=False)
        prompt_ids.append(enc["input_ids"][0])
        completions = []
        for start in range(0, pool_size, batch_size):
            n = min(batch_size, pool_size - start)
            with torch.no_grad():
                out = sample(model, enc, tokenizer, temperature, horizon, num_return_sequences=n, eos_token_id=eos)
            comp = out[:, enc["input_ids"].shape[1] :]
            # TRL's completion mask: every token up to and including the first EOS.
            is_eos = comp == eos
            first = torch.where(
                is_eos.any(1), is_eos.int().argmax(1), torch.full((n,), comp.shape[1], dtype=torch.long)
            )
            lengths = torch.clamp(first + 1, max=comp.shape[1])
            mask = torch.arange(comp.shape[1])[None, :] < lengths[:, None]
            comp = torch.where(mask, comp, torch.full_like(comp, tokenizer.pad_token_id))
            input_ids = torch.cat([enc["input_ids"].expand(n, -1), comp], dim=1)
            attention_mask = torch.cat([enc["attention_mask"].expand(n, -1), mask.long()], dim=1)
            # Chunks of at most 4096 tokens: the full-vocabulary logits of a chunk are the largest tensor held.
            step = max(1, min(8, 4096 // input_ids.shape[1]))
            stats = [
                head_statistics(
                    model,
                    input_ids[i : i + step],
                    attention_mask[i : i + step],
                    comp[i : i + step],
                    temperature,
                    top_k,
                )
                for i in range(0, n, step)
            ]
            completions += completion_records(comp, lengths, *(torch.cat(parts) for parts in zip(*stats)))
        pools.append(completions)
        print(
            f"  pool {p_index + 1}/{len(prompts)} sampled, lengths {[len(c['ids']) for c in completions]}", flush=True
        )
    return pools, prompt_ids


def pool_seed(seed: int, prompt_index: int) -> int:
    """The sampling seed of one prompt's pool: fixed by (seed, prompt index), whatever was sampled before it."""
    return seed * 1_000_003 + prompt_index


def load_or_sample_pool(
    model, tokenizer, prompt, prompt_index, cache_dir, key, pool_size, horizon, batch_size, temperature, top_k, seed
):
    """One prompt's pool, from ``cache_dir`` if it was sampled before, else sampled (seeded by ``pool_seed``) and
    saved there. Returns (data, cached): data holds ``records``, ``prompt_ids``, ``prompt``, ``seed``,
    ``sample_seconds`` and the sampling settings."""
    path = Path(cache_dir) / f"{key}-p{prompt_index:03d}.pt"
    settings = {"pool": pool_size, "horizon": horizon, "temperature": temperature, "top_k": top_k}
    if path.exists():
        data = torch.load(path, weights_only=False)
        if data["prompt"] != prompt or data["settings"] != settings:
            raise ValueError(
                f"{path} holds a pool for another prompt or other settings ({data['settings']}); use another --cache "
                "folder or delete the file."
            )
        return data, True
    seed_p = pool_seed(seed, prompt_index)
    torch.manual_seed(seed_p)
    start = time.perf_counter()
    pools, prompt_ids = sample_pool(model, tokenizer, [prompt], pool_size, horizon, batch_size, temperature, top_k)
    data = {
        "records": pools[0],
        "prompt_ids": prompt_ids[0],
        "prompt": prompt,
        "seed": seed_p,
        "settings": settings,
        "sample_seconds": time.perf_counter() - start,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save(data, tmp)
    os.replace(tmp, path)  # a run stopped mid-write leaves no half file behind
    return data, False


def prompt_tensors(completions, rewards, horizon):
    """Rewards [M], proxy [M, T], mask [M, T] for one pool cut at ``horizon`` tokens."""
    M = len(completions)
    T = max(min(len(c["ids"]), horizon) for c in completions)
    proxy = torch.zeros(M, T)
    mask = torch.zeros(M, T, dtype=torch.bool)
    for j, c in enumerate(completions):
        k = min(len(c["ids"]), horizon)
        p = torch.exp(c["logp_y"][:k])
        proxy[j, :k] = (1 - 2 * p + c["sum_sq"][:k]).clamp(0, 2)  # w_t = ||e_y - pi||^2
        mask[j, :k] = True
    return torch.tensor(rewards, dtype=torch.float32), proxy, mask
