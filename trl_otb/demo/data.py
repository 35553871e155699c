"""Math prompts for GRPO/OTB: an offline generated dataset, and adapters for the usual Hub datasets.

Every dataset comes out in TRL's conversational prompt format with the same columns:

- ``prompt``: ``[{"role": "user", "content": ...}]``, the problem followed by ``ANSWER_INSTRUCTION``, which asks
  for the final answer in ``\\boxed{}`` (the convention :mod:`trl_otb.demo.rewards` scores);
- ``answer``: the gold final answer as a string that math-verify parses (``"7"``, ``"\\frac{1}{2}"``);
- ``level``: the difficulty level for generated data, the source dataset's level or name otherwise.

The generated dataset (``load_math_dataset()`` or ``name="otb-math"``) needs no network: it is drawn from a seeded
``random.Random``, so a seed fixes it exactly. Its levels, from easiest to hardest:

==========  ==============================================  ================
level       example                                         distinct problems
==========  ==============================================  ================
copy        Write the number 47.                            100
compare     Which number is larger, 7 or 3?                 90
count       How many letters are in the word "cat"?         78
add1        What is 3 + 4?                                  100
add2        What is 23 + 48?                                8100
word        Tom has 3 apples, gets 4 more, gives away 2...  684
==========  ==============================================  ================

Train and test are disjoint *as problems*, not just as strings: each level's problems are shuffled by the seed and a
``test_fraction`` of them is held out, so no test problem is seen in training under another wording. Rows are then
drawn from each side's problems (with repetition once a side's problems run out, which RL on prompts tolerates).

``DEFAULT_LEVEL`` is tuned so that the embedded SmolLM2-135M-Instruct solves it often but not always at temperature
1.0, which GRPO needs: a group whose rewards are all equal has zero advantage. ``benchmarks/passrate.py`` measures it;
with 16 test prompts x 2 samples of 48 tokens it gave pass@1 copy 0.38, compare 0.28, add1 0.28, word 0.00,
and the model boxed none of its answers (the accuracy reward's fallbacks found them; the format reward has to teach it).
"""

import random
import re
from collections.abc import Callable, Sequence

from datasets import Dataset, DatasetDict

__all__ = [
    "ANSWER_INSTRUCTION",
    "DEFAULT_LEVEL",
    "EMBEDDED_NAMES",
    "LEVELS",
    "adapt_dapo",
    "adapt_dataset",
    "adapt_gsm8k",
    "adapt_math",
    "detect_adapter",
    "generate_math_dataset",
    "load_math_dataset",
    "make_prompt",
]

ANSWER_INSTRUCTION = "Put the final answer in \\boxed{}."
EMBEDDED_NAMES = (None, "embedded", "otb-math")

_WORDS = (
    "at go me up so we no it he hi be do "
    "cat dog sun run red bed hat car map pen cup box egg fox jam key leg net owl pig toy "
    "bird fish tree book cake door frog milk moon rain ship star king lamp nest ring "
    "apple chair bread horse house mouse plant table water zebra river smile train "
    "banana castle garden orange pencil rabbit school window yellow basket "
    "balloon chicken dolphin kitchen rainbow monkey"
).split()
_NAMES = ("Tom", "Ana", "Sam", "Mia", "Leo", "Zoe", "Ben", "Ivy")
_ITEMS = ("apples", "pens", "stickers", "coins", "books", "marbles", "cards", "shells")
_TEMPLATES_ADD = ("What is {a} + {b}?", "Compute {a} + {b}.", "Add {a} and {b}.", "What is the sum of {a} and {b}?")


def make_prompt(problem: str) -> list[dict[str, str]]:
    """The conversational prompt for ``problem``: one user message that ends with ``ANSWER_INSTRUCTION``."""
    return [{"role": "user", "content": f"{problem.strip()}\n{ANSWER_INSTRUCTION}"}]


# Each level: all its problems as keys, and a renderer from key (and a wording rng) to (problem text, gold answer).
def _copy_problems():
    return [(n,) for n in range(100)]


def _copy_render(key, rng):
    (n,) = key
    template = rng.choice(("Write the number {n}.", "Repeat this number: {n}.", "What number is this: {n}?"))
    return template.format(n=n), str(n)


def _compare_problems():
    return [(a, b) for a in range(10) for b in range(10) if a != b]


def _compare_render(key, rng):
    a, b = key
    template = rng.choice(("Which number is larger, {a} or {b}?", "Which is bigger: {a} or {b}?"))
    return template.format(a=a, b=b), str(max(a, b))


def _count_problems():
    return [(word,) for word in _WORDS]


def _count_render(key, rng):
    (word,) = key
    template = rng.choice(('How many letters are in the word "{w}"?', 'Count the letters in "{w}".'))
    return template.format(w=word), str(len(word))


def _add1_problems():
    return [(a, b) for a in range(10) for b in range(10)]


def _add2_problems():
    return [(a, b) for a in range(10, 100) for b in range(10, 100)]


def _add_render(key, rng):
    a, b = key
    return rng.choice(_TEMPLATES_ADD).format(a=a, b=b), str(a + b)


def _word_problems():
    return [(a, b, c) for a in range(2, 10) for b in range(1, 10) for c in range(1, a + b)]


def _word_render(key, rng):
    a, b, c = key
    name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
    problem = (
        f"{name} has {a} {item}. {name} gets {b} more {item}, then gives away {c}. "
        f"How many {item} does {name} have now?"
    )
    return problem, str(a + b - c)


LEVELS: dict[str, tuple[Callable[[], list[tuple]], Callable[[tuple, random.Random], tuple[str, str]]]] = {
    "copy": (_copy_problems, _copy_render),
    "compare": (_compare_problems, _compare_render),
    "count": (_count_problems, _count_render),
    "add1": (_add1_problems, _add_render),
    "add2": (_add2_problems, _add_render),
    "word": (_word_problems, _word_render),
}
"""Generated levels by name: ``(problems, render)``, from easiest to hardest."""

DEFAULT_LEVEL = "add1"


def _draw(problems: list[tuple], n: int, rng: random.Random) -> list[tuple]:
    """``n`` problems: all distinct while they last, then again in a fresh order."""
    drawn = []
    while len(drawn) < n:
        batch = list(problems)
        rng.shuffle(batch)
        drawn.extend(batch[: n - len(drawn)])
    return drawn


def generate_math_dataset(
    level: str | Sequence[str] = DEFAULT_LEVEL,
    num_train: int = 1000,
    num_test: int = 100,
    seed: int = 0,
    test_fraction: float = 0.2,
) -> DatasetDict:
    """The generated math dataset: a ``DatasetDict`` with ``train`` and ``test`` splits.

    Args:
        level: one of ``LEVELS``, or several to mix (rows go to the levels in turn).
        num_train: rows in ``train``.
        num_test: rows in ``test``.
        seed: fixes every choice; the same arguments give the same rows.
        test_fraction: share of each level's distinct problems held out for ``test``.
    """
    levels = [level] if isinstance(level, str) else list(level)
    unknown = [name for name in levels if name not in LEVELS]
    if not levels or unknown:
        raise ValueError(f"Unknown level(s) {unknown or levels}; choose from {list(LEVELS)}.")
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}.")
    if num_train < 0 or num_test < 0:
        raise ValueError(f"num_train and num_test must be >= 0, got {num_train} and {num_test}.")

    rng = random.Random(seed)
    rows = {"train": [], "test": []}
    for index, name in enumerate(levels):
        make_problems, render = LEVELS[name]
        problems = make_problems()
        rng.shuffle(problems)
        held_out = max(1, round(test_fraction * len(problems)))
        pools = {"test": problems[:held_out], "train": problems[held_out:]}
        for split, total in (("train", num_train), ("test", num_test)):
            # Level `index` of k gets rows index, index + k, ...; so a mix is balanced and interleaves after sorting.
            n = len(range(index, total, len(levels)))
            for position, key in zip(range(index, total, len(levels)), _draw(pools[split], n, rng)):
                problem, answer = render(key, rng)
                rows[split].append((position, {"prompt": make_prompt(problem), "answer": answer, "level": name}))
    return DatasetDict(
        {
            split: Dataset.from_list([row for _, row in sorted(pairs, key=lambda p: p[0])])
            for split, pairs in rows.items()
        }
    )


# Adapters: one Hub row -> {"prompt", "answer", "level"}.
_GSM8K_FINAL_RE = re.compile(r"####\s*(.+?)\s*$", re.DOTALL)
_DAPO_PREFIX = "The last line of your response should be of the form Answer: $Answer"
_DAPO_SUFFIX_RE = re.compile(r"\s*Remember to put your answer on its own line after \"Answer:\"\.?\s*$")


def adapt_gsm8k(row: dict) -> dict:
    """A gsm8k row (``question``, ``answer`` ending in ``#### 42``) in the common format."""
    match = _GSM8K_FINAL_RE.search(row["answer"])
    if match is None:
        raise ValueError(f"gsm8k answer has no '#### <final answer>' line: {row['answer'][-80:]!r}")
    return {"prompt": make_prompt(row["question"]), "answer": match.group(1).replace(",", ""), "level": "gsm8k"}


def adapt_math(row: dict) -> dict:
    """A MATH / MATH-500 row (``problem``, and ``answer`` or a ``solution`` with ``\\boxed{}``) in the common format."""
    from .rewards import extract_boxed

    answer = row.get("answer")
    if not answer:
        answer = extract_boxed(row.get("solution") or "", max_chars=1_000)
    if not answer:
        raise ValueError("MATH row has neither an 'answer' nor a '\\boxed{}' in its 'solution'.")
    level = row.get("level")
    return {"prompt": make_prompt(row["problem"]), "answer": answer.strip(), "level": str(level or "math")}


def adapt_dapo(row: dict) -> dict:
    """A DAPO-Math-17k row (``prompt`` messages, ``reward_model.ground_truth``) in the common format.

    DAPO's prompt asks for an ``Answer:`` line; its instruction wrapper is stripped and the problem re-asked with
    ``ANSWER_INSTRUCTION``, so the format reward means the same on every dataset.
    """
    content = row["prompt"][-1]["content"]
    if _DAPO_PREFIX in content:
        content = content.split("\n\n", 1)[-1]
    content = _DAPO_SUFFIX_RE.sub("", content)
    return {
        "prompt": make_prompt(content),
        "answer": str(row["reward_model"]["ground_truth"]).strip(),
        "level": str(row.get("data_source") or "dapo"),
    }


def detect_adapter(column_names: Sequence[str]) -> Callable[[dict], dict]:
    """The adapter for a dataset with these columns (gsm8k, MATH, or DAPO layout)."""
    columns = set(column_names)
    if {"prompt", "reward_model"} <= columns:
        return adapt_dapo
    if "problem" in columns and columns & {"answer", "solution"}:
        return adapt_math
    if {"question", "answer"} <= columns:
        return adapt_gsm8k
    raise ValueError(
        f"No adapter for columns {sorted(columns)}: expected gsm8k (question, answer), MATH (problem, solution or "
        "answer) or DAPO (prompt, reward_model). Map the rows to prompt/answer yourself, e.g. with `make_prompt`."
    )


_HUB_CONFIGS = {"openai/gsm8k": "main", "gsm8k": "main"}


def load_math_dataset(
    name: str | None = None,
    split: str | None = None,
    level: str | Sequence[str] = DEFAULT_LEVEL,
    num_train: int = 1000,
    num_test: int = 100,
    seed: int = 0,
    config: str | None = None,
) -> Dataset | DatasetDict:
    """A math dataset in the common ``prompt`` / ``answer`` / ``level`` format.

    Args:
        name: None, ``"embedded"`` or ``"otb-math"`` for the generated dataset (no network); otherwise a Hub dataset
            such as ``"openai/gsm8k"``, ``"HuggingFaceH4/MATH-500"`` or ``"BytedTsinghua-SIA/DAPO-Math-17k"``, whose
            layout is recognised from its columns.
        split: ``"train"`` or ``"test"`` (any split the Hub dataset has), or None for all splits.
        level, num_train, num_test, seed: for the generated dataset, see `generate_math_dataset`.
        config: the Hub dataset's configuration, when it needs one (gsm8k's ``"main"`` is filled in).
    """
    if name in EMBEDDED_NAMES:
        data = generate_math_dataset(level=level, num_train=num_train, num_test=num_test, seed=seed)
        if split is None:
            return data
        if split not in data:
            raise ValueError(f"The generated dataset has splits {list(data)}, not {split!r}.")
        return data[split]

    from datasets import load_dataset

    return adapt_dataset(load_dataset(name, config or _HUB_CONFIGS.get(name), split=split))


def adapt_dataset(data: Dataset | DatasetDict) -> Dataset | DatasetDict:
    """``data`` mapped to the common ``prompt`` / ``answer`` / ``level`` columns by the adapter its columns call for."""
    columns = data.column_names if isinstance(data, Dataset) else next(iter(data.values())).column_names
    return data.map(detect_adapter(columns), remove_columns=columns).select_columns(["prompt", "answer", "level"])
