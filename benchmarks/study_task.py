"""The training study's policy and tasks: a small Llama made from scratch on CPU, in minutes, with no download.

A machine without the Hub has no pretrained weights, so the policy that RL starts from is made here, the same way
for every arm of a seed (``warm_start``):

1. a seeded random initialisation of a 2-layer Llama (hidden 64) over the test suite's byte-level tokenizer
   (one token per byte, so a digit is a token);
2. a seeded supervised warm start on demonstrations of the two tasks below, so that RL starts, as it does on a
   pretrained LLM, from a policy that answers in the task's format and succeeds some of the time.

The tasks (``TASKS``), on two-digit patterns ``p`` ("00" to "99"):

- ``ramble`` (the long cell): "Repeat 58." is answered by the pattern repeated to 32 characters ("5858...58").
  25% of its demonstrations answer so; the others are right for fewer than 32 characters, then ramble on: 180 to
  250 random digits. The
  warm-started policy answers correctly in some samples and rambles in the others, so completions are long on
  average and differ in length within a group, and a failed completion is long and uncertain (high gradient
  energy) while a correct one is short and confident.
- ``copy`` (the short control): "Copy 58." is answered by the pattern repeated to 16 characters, demonstrated with
  15% of the characters replaced by random digits. Completions are short and alike.

The reward of both is the share of the answer's characters in place, over the longer of the answer and the
completion: 1 for the exact answer, less for each wrong character, and little for a ramble (its few right
characters over its length).

Each seed splits the 100 patterns into 80 for training and 20 held out (``split_patterns``); the held-out score is
the mean reward of sampled completions (temperature 1, ``EVAL_SAMPLES`` per pattern, a fixed generator) on the
held-out patterns. Only torch, transformers and the tokenizer of ``trl_otb.testing`` are used.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from pathlib import Path

DIGITS = "0123456789"
PATTERNS = [a + b for a in DIGITS for b in DIGITS]
HELD_OUT = 20
EVAL_SAMPLES = 4
MODEL_SHAPE = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    tie_word_embeddings=False,
)
WARM_START = dict(steps=600, batch_size=32, learning_rate=3e-3, warmup=20)
"""The supervised warm start: AdamW (no weight decay), linear warm-up then cosine decay, half the examples of each
task in every batch."""


@dataclass(frozen=True)
class Task:
    """One task: the prompt's verb, the answer's length, how its demonstrations are made, its reward."""

    name: str
    verb: str
    answer_chars: int
    max_completion_length: int
    correct_share: float  # demonstrations that are the exact answer (ramble) / characters kept (copy)

    def prompt(self, pattern: str) -> list[dict]:
        return [{"role": "user", "content": f"{self.verb} {pattern}."}]

    def answer(self, pattern: str) -> str:
        return (pattern * self.answer_chars)[: self.answer_chars]

    def demonstration(self, pattern: str, rng: random.Random) -> str:
        if self.name == "ramble":
            if rng.random() < self.correct_share:
                return self.answer(pattern)
            derail = rng.randrange(self.answer_chars)  # right for this many characters, then random digits
            return self.answer(pattern)[:derail] + "".join(rng.choice(DIGITS) for _ in range(rng.randint(180, 250)))
        return "".join(c if rng.random() < self.correct_share else rng.choice(DIGITS) for c in self.answer(pattern))

    def score(self, text: str, pattern: str) -> float:
        """The share of the answer's characters in place, over the longer of the answer and the text."""
        answer = self.answer(pattern)
        return sum(a == b for a, b in zip(text, answer)) / max(len(text), len(answer))


TASKS = {
    "ramble": Task("ramble", "Repeat", 32, 256, correct_share=0.25),
    "copy": Task("copy", "Copy", 16, 32, correct_share=0.85),
}


def split_patterns(seed: int) -> tuple[list[str], list[str]]:
    """(training patterns, held-out patterns) of ``seed``: the same for every arm and task of that seed."""
    shuffled = PATTERNS[:]
    random.Random(seed).shuffle(shuffled)
    return sorted(shuffled[HELD_OUT:]), sorted(shuffled[:HELD_OUT])


def tokenizer():
    from trl_otb.testing import build_tiny_tokenizer

    return build_tiny_tokenizer()


def random_model(seed: int, tok):
    """The seeded random initialisation (stage 1)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tok),
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        bos_token_id=None,
        **MODEL_SHAPE,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.generation_config.pad_token_id = tok.pad_token_id
    model.generation_config.eos_token_id = tok.eos_token_id
    return model


def warm_start(seed: int, cache: Path | None = None, steps: int | None = None):
    """(model, tokenizer): stage 1 and the supervised warm start (stage 2) of ``seed``, from ``cache`` if there.

    Deterministic for a seed (one thread). ``steps`` overrides ``WARM_START["steps"]`` (the quick mode)."""
    import torch

    tok = tokenizer()
    model = random_model(seed, tok)
    steps = WARM_START["steps"] if steps is None else steps
    path = None if cache is None else Path(cache) / f"warm_start-s{seed}-{steps}.pt"
    if path is not None and path.exists():
        model.load_state_dict(torch.load(path, weights_only=True))
        return model, tok
    _supervised(model, tok, seed, steps)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        torch.save(model.state_dict(), tmp)
        tmp.replace(path)
    return model, tok


def _supervised(model, tok, seed: int, steps: int) -> None:
    import torch

    rng = random.Random(10_000 + seed)
    train, _ = split_patterns(seed)
    tasks = list(TASKS.values())
    optimizer = torch.optim.AdamW(model.parameters(), lr=WARM_START["learning_rate"], weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda step: min(1.0, (step + 1) / WARM_START["warmup"]) * 0.5 * (1 + math.cos(math.pi * step / steps)),
    )
    model.train()
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        for _ in range(steps):
            ids, labels = [], []
            for i in range(WARM_START["batch_size"]):
                task, pattern = tasks[i % len(tasks)], rng.choice(train)
                prompt = tok.apply_chat_template(task.prompt(pattern), tokenize=False, add_generation_prompt=True)
                a = tok(prompt, add_special_tokens=False)["input_ids"]
                b = tok(task.demonstration(pattern, rng), add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
                ids.append(a + b)
                labels.append([-100] * len(a) + b)
            width = max(map(len, ids))
            pad = tok.pad_token_id
            batch = dict(
                input_ids=torch.tensor([x + [pad] * (width - len(x)) for x in ids]),
                attention_mask=torch.tensor([[1] * len(x) + [0] * (width - len(x)) for x in ids]),
                labels=torch.tensor([y + [-100] * (width - len(y)) for y in labels]),
            )
            model(**batch).loss.backward()
            optimizer.step()
            schedule.step()
            optimizer.zero_grad()
    model.eval()


def completion_text(completion) -> str:
    """The text of a TRL completion (a string, or a conversation whose last message is the answer)."""
    return completion if isinstance(completion, str) else completion[-1]["content"]


def dataset(task: Task, patterns: list[str], seed: int, size: int = 2000):
    """Training prompts: ``size`` rows drawn from ``patterns`` (seeded), each with its pattern for the reward."""
    from datasets import Dataset

    rng = random.Random(20_000 + seed)
    rows = [rng.choice(patterns) for _ in range(size)]
    return Dataset.from_list([{"prompt": task.prompt(p), "pattern": p} for p in rows])


def reward_function(task: Task):
    """TRL reward function of ``task`` (reads the dataset's ``pattern`` column)."""

    def reward(completions, pattern, **kwargs):
        return [task.score(completion_text(c), p) for c, p in zip(completions, pattern)]

    reward.__name__ = f"{task.name}_reward"
    return reward


def held_out_score(model, tok, task: Task, patterns: list[str], seed: int) -> float:
    """Mean reward of ``EVAL_SAMPLES`` sampled completions (temperature 1, generator seeded by ``seed``) per
    held-out pattern."""
    import torch

    was_training = model.training
    model.eval()
    tok.padding_side = "left"
    prompts = [
        tok.apply_chat_template(task.prompt(p), tokenize=False, add_generation_prompt=True)
        for p in patterns
        for _ in range(EVAL_SAMPLES)
    ]
    enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    with torch.no_grad(), torch.random.fork_rng():
        torch.manual_seed(30_000 + seed)
        out = model.generate(
            **enc,
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=task.max_completion_length,
            pad_token_id=tok.pad_token_id,
        )
    texts = tok.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    scores = [task.score(t, p) for t, p in zip(texts, [p for p in patterns for _ in range(EVAL_SAMPLES)])]
    model.train(was_training)
    return sum(scores) / len(scores)
