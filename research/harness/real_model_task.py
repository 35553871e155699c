"""The real-model study's task (research/harness/real_model_study.py): the count task of benchmarks.variance as a training
task on the embedded SmolLM2-135M-Instruct, with held-out prompts scored by the same reward.

"List the numbers from 1 to n, separated by commas.", the assistant turn started as ``COUNT_PREFIX`` ("1, 2, 3,"):
the chat template is rendered here with ``continue_final_message`` (as benchmarks.variance samples its pools) and
TRL gets the text, since TRL would add a generation prompt after a final assistant message. The reward is
``count_reward(COUNT_PREFIX + completion, n)``.
"""

from __future__ import annotations

import json
import math
import statistics
import time
from pathlib import Path

from benchmarks.common import sample, write_json
from benchmarks.variance.sampling import COUNT_PREFIX, count_reward


def load_policy(name: str = "embedded"):
    """(model, tokenizer): the embedded SmolLM2-135M-Instruct in fp32, as the demo loads it; or the test suite's
    tiny random Llama and byte-level tokenizer (``"tiny"``, the quick mode)."""
    import torch

    if name == "tiny":
        from trl_otb.testing import build_tiny_model, build_tiny_tokenizer

        tok = build_tiny_tokenizer()
        model = build_tiny_model(len(tok), tok.eos_token_id)
        model.generation_config.pad_token_id = tok.pad_token_id
        return model, tok
    from trl_otb.demo.models import load_model_and_tokenizer

    return load_model_and_tokenizer(dtype=torch.float32)


def prompt_text(tok, n: int) -> str:
    """The count prompt for ``n``, rendered as benchmarks.variance renders it (the assistant turn started by the
    prefix)."""
    messages = [
        {"role": "user", "content": f"List the numbers from 1 to {n}, separated by commas."},
        {"role": "assistant", "content": COUNT_PREFIX},
    ]
    return tok.apply_chat_template(messages, tokenize=False, continue_final_message=True)


def dataset(tok, targets: list[int], seed: int, size: int = 2000):
    """Training prompts: ``size`` rows drawn from ``targets`` (seeded), each with its ``n`` for the reward."""
    import random

    from datasets import Dataset

    rng = random.Random(20_000 + seed)
    rows = [rng.choice(targets) for _ in range(size)]
    return Dataset.from_list([{"prompt": prompt_text(tok, n), "n": n} for n in rows])


def count_task_reward(completions, n, **kwargs):
    """TRL reward function: count_reward of the prefix and the completion, against the row's ``n``."""
    return [count_reward(COUNT_PREFIX + text, target) for text, target in zip(completions, n)]


def held_out_scores(model, tok, targets, seed: int, samples: int, horizon: int, temperature: float) -> list[float]:
    """count_reward of ``samples`` sampled completions per held-out target, target-major (seeded generator)."""
    import torch

    was_training = model.training
    model.eval()
    tok.padding_side = "left"
    ns = [n for n in targets for _ in range(samples)]
    enc = tok([prompt_text(tok, n) for n in ns], return_tensors="pt", padding=True, add_special_tokens=False)
    with torch.no_grad(), torch.random.fork_rng():
        torch.manual_seed(30_000 + seed)
        out = sample(model, enc, tok, temperature, horizon)
    texts = tok.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    model.train(was_training)
    return [count_reward(COUNT_PREFIX + t, n) for t, n in zip(texts, ns)]


def sampling_se(scores: list[float], samples: int) -> float:
    """The held-out mean's sampling SE given the policy, targets as strata (NaN with one sample per target)."""
    if samples < 2:
        return float("nan")
    groups = [scores[i : i + samples] for i in range(0, len(scores), samples)]
    var = [statistics.variance(g) for g in groups]
    return math.sqrt(sum(v / samples for v in var)) / len(groups)


def initial_score(job: dict, model, tok) -> dict:
    """The evaluation at step 0: the same for every arm of a seed (same weights, same generator), cached."""
    task = job["task"]
    key = f"initial-{job['model']}-s{job['seed']}-k{task['eval_samples']}-h{task['max_completion_length']}"
    key += f"-T{task['temperature']:g}"
    path = Path(job["cache"]) / f"{key}-{'-'.join(map(str, task['held_out_targets']))}.json"
    if path.exists():
        return json.loads(path.read_text())
    point = evaluate(job, model, tok)
    write_json(path, point)
    return point


def evaluate(job: dict, model, tok) -> dict:
    """The held-out score now, its sampling SE and the evaluation's CPU seconds."""
    task, start = job["task"], time.process_time()
    k = task["eval_samples"]
    scores = held_out_scores(
        model, tok, task["held_out_targets"], job["seed"], k, task["max_completion_length"], task["temperature"]
    )
    return {
        "score": sum(scores) / len(scores),
        "se": sampling_se(scores, k),
        "eval_cpu_seconds": time.process_time() - start,
    }


def group_signal(
    pools: Path, horizons=(256, 512, 1024), group_size=4, draws=200, seed=0, decode=None, pool_horizon=1024
) -> dict:
    """How often a group carries no signal at each horizon, from the variance benchmark's cached count pools (the
    pretrained policy at temperature 0.7, completions sampled to ``pool_horizon`` tokens): per prompt, ``draws``
    random groups of ``group_size`` completions, each cut at the horizon and scored by ``count_reward``. Returns, per
    horizon, the share of groups whose rewards tie (no gradient for any arm), the mean within-group reward std and
    the mean length of the cut completions, over every prompt's draws; and, over the completions, the share that
    score 1 (the list reached n and stopped there), the mean reward and the mean within-prompt reward std (what an
    evaluation's sampling SE is made of). ``decode`` (token ids -> text) defaults to the
    embedded model's tokenizer."""
    import random

    import torch

    if decode is None:
        from transformers import AutoTokenizer

        from trl_otb.demo.models import embedded_model_path

        tok = AutoTokenizer.from_pretrained(embedded_model_path())

        def decode(ids):
            return tok.decode(ids, skip_special_tokens=True)

    rng = random.Random(seed)
    files = sorted(Path(pools).glob(f"count-M12-h{pool_horizon}-T0.7-k64-s0-p*.pt"))
    if not files:
        raise SystemExit(f"no count pools in {pools}: python -m benchmarks.variance --task count --pool 12 ... first")
    out = {}
    for h in horizons:
        ties, stds, lengths, scores, spread = [], [], [], [], []
        for path in files:
            data = torch.load(path, weights_only=False)
            n = int(data["prompt"][0]["content"].split(" to ")[1].split(",")[0])
            cut = [r["ids"][:h] for r in data["records"]]
            rewards = [count_reward(COUNT_PREFIX + decode(ids), n) for ids in cut]
            lengths += [len(ids) for ids in cut]
            scores += rewards
            spread.append(statistics.pstdev(rewards))
            for _ in range(draws):
                group = rng.sample(rewards, group_size)
                ties.append(max(group) == min(group))
                stds.append(statistics.pstdev(group))
        out[str(h)] = {
            "tied_share": sum(ties) / len(ties),
            "reward_std_mean": statistics.fmean(stds),
            "mean_length": statistics.fmean(lengths),
            "complete_share": sum(r == 1.0 for r in scores) / len(scores),
            "reward_mean": statistics.fmean(scores),
            "reward_std_within_prompt": statistics.fmean(spread),
            "prompts": len(files),
            "groups": len(ties),
        }
    return out
