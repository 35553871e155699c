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
- ``long_right`` (the second study's long task where long is right): "Write 58." is answered by the pattern
  repeated to 150 + 10 x (first digit) characters (150 to 240; "Write 58." to 200). 25% of its demonstrations are
  the whole answer; the others stop early, right so far, at a uniformly random point (1 to the answer's length - 1
  characters). Correct completions are long (195 characters on average) and failures are mostly short ones that
  stopped too early, so a push toward length helps here, where on ``ramble`` it hurts.

The reward of all three is the share of the answer's characters in place, over the longer of the answer and the
completion: 1 for the exact answer, less for each wrong character, and little for a ramble (its few right
characters over its length).

Each seed splits the 100 patterns into 80 for training and 20 held out (``split_patterns``); the held-out score is
the mean reward of sampled completions (temperature 1, ``EVAL_SAMPLES`` per pattern, a fixed generator) on the
held-out patterns. Only torch, transformers and the tokenizer of ``trl_otb.testing`` are used (``study_trainer``,
the second study's trainer, imports trl_otb when called).

The warm start learns the tasks it is given (``WARM_START_TASKS``, half of each batch each: the first study's
ramble and copy); the second study's long_right cell starts from a warm start on long_right and copy, cached
under its own name, so the first study's policies stay what they were.
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
WARM_START_TASKS = ("ramble", "copy")
"""The tasks of the first study's warm start (the default of ``warm_start``)."""


@dataclass(frozen=True)
class Task:
    """One task: the prompt's verb, the answer's length, how its demonstrations are made, its reward."""

    name: str
    verb: str
    answer_chars: int
    max_completion_length: int
    correct_share: float  # demonstrations that are the exact answer (ramble, long_right) / characters kept (copy)
    length_step: int = 0  # the answer's length grows by this per unit of the pattern's first digit (long_right)

    def prompt(self, pattern: str) -> list[dict]:
        return [{"role": "user", "content": f"{self.verb} {pattern}."}]

    def answer_length(self, pattern: str) -> int:
        return self.answer_chars + self.length_step * int(pattern[0])

    def answer(self, pattern: str) -> str:
        n = self.answer_length(pattern)
        return (pattern * n)[:n]

    def demonstration(self, pattern: str, rng: random.Random) -> str:
        if self.name == "long_right":  # whole, or right so far and stopped early at a random point
            answer = self.answer(pattern)
            return answer if rng.random() < self.correct_share else answer[: rng.randrange(1, len(answer))]
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
    "long_right": Task("long_right", "Write", 150, 256, correct_share=0.25, length_step=10),
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


def warm_start_path(cache, seed: int, steps: int, tasks=WARM_START_TASKS) -> Path:
    """Where ``warm_start`` caches a policy (the first study's tasks keep their original name)."""
    name = "" if tuple(tasks) == WARM_START_TASKS else "+".join(tasks) + "-"
    return Path(cache) / f"warm_start-{name}s{seed}-{steps}.pt"


def warm_start(seed: int, cache: Path | None = None, steps: int | None = None, tasks=WARM_START_TASKS):
    """(model, tokenizer): stage 1 and the supervised warm start (stage 2) of ``seed`` on ``tasks``, from ``cache``
    if there.

    Deterministic for a seed (one thread). ``steps`` overrides ``WARM_START["steps"]`` (the quick mode)."""
    import torch

    tok = tokenizer()
    model = random_model(seed, tok)
    steps = WARM_START["steps"] if steps is None else steps
    path = None if cache is None else warm_start_path(cache, seed, steps, tasks)
    if path is not None and path.exists():
        model.load_state_dict(torch.load(path, weights_only=True))
        return model, tok
    _supervised(model, tok, seed, steps, [TASKS[t] for t in tasks])
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        torch.save(model.state_dict(), tmp)
        tmp.replace(path)
    return model, tok


def _supervised(model, tok, seed: int, steps: int, tasks: list[Task]) -> None:
    import torch

    rng = random.Random(10_000 + seed)
    train, _ = split_patterns(seed)
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


def reward_function(task: Task, offset: float = 0.0, quantum: float | None = None):
    """TRL reward function of ``task`` (reads the dataset's ``pattern`` column).

    ``quantum`` (the second study: 2**-16) rounds each score to a multiple of it before ``offset`` is added, so
    that the reward and the reward + offset are both exact in fp32 (TRL's dtype) for a dyadic offset: the score
    itself is not (k / L for a completion of L > 32 characters), and fp32(s - 0.5) differs from fp32(s) - 0.5 for
    about a fifth of ramble's scores."""

    def reward(completions, pattern, **kwargs):
        scores = [task.score(completion_text(c), p) for c, p in zip(completions, pattern)]
        if quantum is not None:
            scores = [round(s / quantum) * quantum for s in scores]
        return [s + offset for s in scores]

    reward.__name__ = f"{task.name}_reward"
    return reward


def held_out_score(model, tok, task: Task, patterns: list[str], seed: int, samples: int = EVAL_SAMPLES) -> float:
    """Mean reward of ``samples`` sampled completions (temperature 1, generator seeded by ``seed``) per held-out
    pattern."""
    scores = held_out_samples(model, tok, task, patterns, seed, samples)
    return sum(scores) / len(scores)


def sampling_se(scores: list[float], samples: int) -> float:
    """The sampling standard error of the held-out score (its mean), given the policy: ``scores`` pattern-major
    (``samples`` per pattern), each pattern's Bessel-corrected variance over its samples, sqrt(sum_p var_p / S) / P.
    NaN with one sample per pattern."""
    if samples < 2:
        return float("nan")
    groups = [scores[i : i + samples] for i in range(0, len(scores), samples)]
    var = [sum((x - sum(g) / samples) ** 2 for x in g) / (samples - 1) for g in groups]
    return math.sqrt(sum(v / samples for v in var)) / len(groups)


def held_out_samples(model, tok, task: Task, patterns: list[str], seed: int, samples: int = EVAL_SAMPLES) -> list:
    """The reward of each sampled held-out completion, pattern-major (``held_out_score``'s draws)."""
    import torch

    was_training = model.training
    model.eval()
    tok.padding_side = "left"
    prompts = [
        tok.apply_chat_template(task.prompt(p), tokenize=False, add_generation_prompt=True)
        for p in patterns
        for _ in range(samples)
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
    scores = [task.score(t, p) for t, p in zip(texts, [p for p in patterns for _ in range(samples)])]
    model.train(was_training)
    return scores


# ----------------------------------------------------------------------------------------------------------------
# The second study's trainer: two things the library does not do, kept in the harness
# ----------------------------------------------------------------------------------------------------------------


def lone_token_share(rewards, mask, group_ids) -> float:
    """Share of the valid completion tokens at positions where no other member of the group is active: where a
    token-level baseline cannot be estimated from the group and a fallback (the tail rule) applies.

    ``rewards [B]`` (NaN = unscorable), ``mask [B, T]``, ``group_ids [B]``; positions aligned by completion index."""
    import torch

    valid = torch.isfinite(rewards) & (mask.sum(dim=1) > 0)
    m = mask.float() * valid[:, None].float()
    gid = torch.unique(group_ids, return_inverse=True)[1]
    active = torch.zeros(int(gid.max()) + 1, m.size(1), dtype=m.dtype).index_add_(0, gid, m)
    lone = (active[gid] == 1) & (m > 0)
    total = m.sum()
    return float(lone.sum() / total) if total > 0 else 0.0


def scale_by_group_std(advantages, rewards, group_ids, eps: float = 1e-4):
    """``advantages [B, T]`` divided by their group's reward std + ``eps``, as TRL's ``scale_rewards="group"``
    (Bessel-corrected std over the group's finite rewards; a group of one finite reward is left as is).

    The std is taken of the rewards measured from the group's minimum, so that it is exactly shift-invariant."""
    import torch

    finite = torch.isfinite(rewards)
    gid = torch.unique(group_ids, return_inverse=True)[1]
    G = int(gid.max()) + 1
    R = torch.where(finite, rewards.to(advantages.dtype), torch.zeros((), dtype=advantages.dtype))
    big = torch.full_like(R, float("inf"))
    low = torch.full((G,), float("inf"), dtype=R.dtype).scatter_reduce(0, gid, torch.where(finite, R, big), "amin")
    shifted = torch.where(finite, R - low[gid], torch.zeros_like(R))
    f = finite.to(R.dtype)
    count = torch.zeros(G, dtype=R.dtype).index_add_(0, gid, f)
    mean = torch.zeros(G, dtype=R.dtype).index_add_(0, gid, shifted) / count.clamp(min=1)
    dev = (shifted - mean[gid]) * f
    std = torch.sqrt(torch.zeros(G, dtype=R.dtype).index_add_(0, gid, dev * dev) / (count - 1).clamp(min=1))
    divisor = torch.where(count > 1, std + eps, torch.ones_like(std))[gid]
    return advantages / divisor[:, None]


def study_trainer():
    """``OTBTrainer`` with the second study's two additions (imports trl_otb; a class made once per process):

    - ``harness_scale="group"``: the advantages the configured estimator returns are divided by the group's reward
      std + 1e-4 (``scale_by_group_std``), the scaling of TRL's default GRPO, which OTBConfig refuses for OTB; the
      study's scaled arm, to separate the baseline's effect from the scaling's;
    - every generation batch logs ``study/lone_token_frac`` (``lone_token_share``), whatever the estimator."""
    global _STUDY_TRAINER
    if _STUDY_TRAINER is None:
        from trl_otb import OTBTrainer

        class StudyTrainer(OTBTrainer):
            def __init__(self, *args, harness_scale: str | None = None, **kwargs):
                if harness_scale not in (None, "group"):
                    raise ValueError(f"harness_scale must be None or 'group', got {harness_scale!r}")
                self.harness_scale = harness_scale
                super().__init__(*args, **kwargs)

            def _otb_estimate(self, groups):
                advantages = super()._otb_estimate(groups)
                mode = "train" if self.model.training else "eval"
                share = lone_token_share(groups.rewards, groups.mask, groups.group_ids)
                self._metrics[mode]["study/lone_token_frac"].append(share)
                if self.harness_scale == "group":
                    advantages = scale_by_group_std(advantages, groups.rewards, groups.group_ids)
                return advantages

        _STUDY_TRAINER = StudyTrainer
    return _STUDY_TRAINER


_STUDY_TRAINER = None
