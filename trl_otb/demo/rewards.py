"""Math rewards for GRPO/OTB, built on math-verify, with TRL's reward-function signature.

Both rewards take ``completions`` (strings, or conversational lists ``[{"role": "assistant", "content": ...}]``)
and the dataset's ``answer`` column, and return one float per completion, so they plug straight into
``GRPOTrainer(reward_funcs=[accuracy_reward, format_reward])``.

The convention, shared with :mod:`trl_otb.demo.data`: the final answer goes in the last ``\\boxed{...}``. The accuracy
reward also accepts an ``Answer: ...`` line or, failing both, the last expression near the end of the completion,
so that a model that has not yet learned the format still gets a learning signal; the format reward pays for the
box alone.

Safety. Completions are model output, so they are treated as hostile: only a short answer region is ever handed to
math-verify (never the whole text), the region is rejected outright when it could make SymPy compute for long (huge
numbers, exponent towers, large factorials), nothing is ever ``eval``'d, every exception becomes a 0.0 reward, and
each completion is scored within a deadline of about one second, on the main thread and off it alike.
"""

import logging
import re
import signal
import threading
import time
from collections.abc import Callable
from functools import lru_cache

from math_verify import parse, verify

__all__ = [
    "FORMAT_REWARD",
    "accuracy_reward",
    "completion_text",
    "extract_answer_region",
    "extract_boxed",
    "format_reward",
    "is_correct",
    "parse_gold",
]

FORMAT_REWARD = 0.2
"""What ``format_reward`` pays for a well-formed final ``\\boxed{...}``: small next to the accuracy reward."""

MAX_ANSWER_CHARS = 200  # longest answer region handed to math-verify; MATH answers are far shorter
MAX_BRACE_DEPTH = 16  # deeper nesting in a box is treated as malformed
MAX_DIGITS = 40  # longest run of digits in an answer region
MAX_EXPONENT_PRODUCT = 1_000  # product of the integer exponents in an answer region
MAX_COMBINATORIAL_ARGUMENT = 1_000  # largest number allowed beside !, \binom, \sum or \prod
TAIL_CHARS = 120  # fallback region: the end of a completion that has neither a box nor an "Answer:" line
DEADLINE_SECONDS = 1.0  # per completion: parsing and comparing its answer
GOLD_DEADLINE_SECONDS = 10.0  # gold answers come from the dataset, not the model; parsed once and cached

_BOXED_RE = re.compile(r"\\(?:boxed|fbox)\s*\{")
_ANSWER_LINE_RE = re.compile(r"answer\s*(?:is)?\s*[:：]", re.IGNORECASE)
_DIGIT_RUN_RE = re.compile(rf"\d{{{MAX_DIGITS + 1},}}")
_POWER_RE = re.compile(r"\^|\*\*")
_COMBINATORIAL_RE = re.compile(r"!|\\[dt]?binom|\\choose|\\prod|\\sum")


class _DropTimeoutDisabledWarning(logging.Filter):
    # We pass timeout=None to math-verify, which then warns that the caller must bound the time itself. We do (see
    # `_within_deadline`), so the warning is noise.
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Timeout is disabled")


for _name in ("math_verify.parser", "math_verify.grader"):
    logging.getLogger(_name).addFilter(_DropTimeoutDisabledWarning())


def completion_text(completion) -> str:
    """The text of one completion: a plain string, or the concatenated ``content`` of a list of messages."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        return str(completion.get("content") or "")
    if isinstance(completion, (list, tuple)):
        return "".join(completion_text(message) for message in completion)
    return "" if completion is None else str(completion)


def _last_match(pattern: re.Pattern, text: str) -> re.Match | None:
    match = None
    for match in pattern.finditer(text):  # noqa: B007 -- keeps the last one
        pass
    return match


def extract_boxed(text: str, max_chars: int = MAX_ANSWER_CHARS) -> str | None:
    """The content of the last ``\\boxed{...}`` (or ``\\fbox{...}``) in ``text``, or None.

    The scan is bounded: it gives up (None) when the box does not close within ``max_chars`` characters or nests
    braces deeper than ``MAX_BRACE_DEPTH``, so malformed or adversarial LaTeX costs at most ``max_chars`` steps.
    """
    text = text[-20_000:]  # a final answer lives near the end; this bounds the regex scan on 10k-token outputs
    last = _last_match(_BOXED_RE, text)
    if last is None:
        return None
    start = last.end()
    depth = 1
    for i in range(start, min(len(text), start + max_chars + 1)):
        char = text[i]
        if char == "{":
            depth += 1
            if depth > MAX_BRACE_DEPTH:
                return None
        elif char == "}":
            depth -= 1
            if depth == 0:
                content = text[start:i].strip()
                return content or None
    return None


def extract_answer_region(text: str) -> tuple[str, str] | None:
    """The short piece of ``text`` that holds the final answer, and where it came from.

    Returns ``(region, kind)`` with ``kind`` one of ``"boxed"`` (the last ``\\boxed{}``), ``"answer_line"`` (the rest
    of the line after the last "Answer:"), ``"tail"`` (the last ``TAIL_CHARS`` characters), or None for empty text.
    """
    boxed = extract_boxed(text)
    if boxed is not None:
        return boxed, "boxed"
    tail = text[-2_000:]
    last = _last_match(_ANSWER_LINE_RE, tail)
    if last is not None:
        rest = tail[last.end() :].strip()
        line = rest.split("\n", 1)[0].strip()
        if line:
            return line[:MAX_ANSWER_CHARS], "answer_line"
    tail = text[-TAIL_CHARS:].strip()
    return (tail, "tail") if tail else None


def _exponents(region: str):
    """Each exponent in ``region`` (after ``^`` or ``**``): a braced or parenthesised group, a number, or one char."""
    for match in _POWER_RE.finditer(region):
        i = match.end()
        while i < len(region) and region[i].isspace():
            i += 1
        if i == len(region):
            return
        closing = {"{": "}", "(": ")"}.get(region[i])
        if closing is None:
            number = re.match(r"[-+]?\d+", region[i:])
            yield number.group(0) if number else region[i]
            continue
        depth = 0
        for j in range(i, len(region)):
            depth += region[j] == region[i]
            depth -= region[j] == closing
            if depth == 0:
                yield region[i + 1 : j]
                break
        else:
            yield region[i + 1 :]


def _is_safe_to_parse(region: str) -> bool:
    """Whether math-verify may look at ``region`` without risking a long computation in SymPy.

    Python's big-integer arithmetic runs in C while holding the GIL, so neither a signal nor a thread deadline can
    interrupt it: huge literals, exponent towers such as ``10^{10^{10}}`` and large factorials are refused up front.
    """
    if len(region) > MAX_ANSWER_CHARS or _DIGIT_RUN_RE.search(region):
        return False
    product = 1
    for exponent in _exponents(region):
        if _POWER_RE.search(exponent):
            return False  # a tower
        digits = re.sub(r"\D", "", exponent)
        product *= max(int(digits), 1) if digits else 2
        if product > MAX_EXPONENT_PRODUCT:
            return False
    if _COMBINATORIAL_RE.search(region):
        # Factorials, binomials, sums and products of big arguments are slow to evaluate: small literals only.
        if (
            "!!" in region
            or _POWER_RE.search(region)
            or any(int(n) > MAX_COMBINATORIAL_ARGUMENT for n in re.findall(r"\d+", region))
        ):
            return False
    return True


class _DeadlineExceeded(BaseException):
    # A BaseException, so that math-verify's and SymPy's `except Exception` clauses let it through.
    pass


def _within_deadline(function: Callable[[], object], seconds: float = DEADLINE_SECONDS):
    """``function()``, or None when it has not finished after ``seconds``.

    On the main thread a ``SIGALRM`` timer interrupts the work (any timer already running, such as pytest-timeout's,
    is re-armed afterwards). ``signal`` only works on the main thread, so elsewhere (TRL's async reward path, thread
    pools) the call runs in a daemon thread that the caller waits for at most ``seconds``; a late result is dropped.
    math-verify's own timeouts are switched off in both cases: they use ``signal.alarm`` and whole seconds.
    """
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        result = []
        worker = threading.Thread(target=lambda: result.append(function()), daemon=True)
        worker.start()
        worker.join(seconds)
        return result[0] if result else None

    def expire(signum, frame):
        raise _DeadlineExceeded

    start, previous_timer = time.monotonic(), 0.0
    previous_handler = signal.signal(signal.SIGALRM, expire)
    try:
        previous_timer, _ = signal.setitimer(signal.ITIMER_REAL, seconds)
        try:
            return function()
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    except _DeadlineExceeded:
        return None
    finally:
        signal.signal(signal.SIGALRM, previous_handler)
        if previous_timer > 0:
            signal.setitimer(signal.ITIMER_REAL, max(previous_timer - (time.monotonic() - start), 1e-3))


_GOLD_CACHE: dict[str, tuple] = {}


@lru_cache(maxsize=1)
def _warm_up() -> None:
    # The first parse builds math-verify's grammars and imports half of SymPy, which takes longer than a deadline
    # meant for one answer; pay that once, outside any deadline.
    verify(
        parse("\\boxed{1}", parsing_timeout=None),
        parse("\\boxed{\\frac{2}{2}}", parsing_timeout=None),
        timeout_seconds=None,
    )


def parse_gold(answer: str) -> list | None:
    """The gold ``answer`` parsed by math-verify (as if it were boxed), or None when math-verify finds nothing."""
    answer = str(answer).strip()
    if answer not in _GOLD_CACHE:
        if not _is_safe_to_parse(answer):
            return None
        _warm_up()
        parsed = _within_deadline(lambda: parse(f"\\boxed{{{answer}}}", parsing_timeout=None), GOLD_DEADLINE_SECONDS)
        if parsed is None:
            return None  # out of time: not cached, the next call tries again
        if len(_GOLD_CACHE) >= 4096:
            _GOLD_CACHE.clear()
        _GOLD_CACHE[answer] = tuple(parsed)
    return list(_GOLD_CACHE[answer]) or None


def _matches(gold: list, region: str, kind: str) -> bool:
    text = f"\\boxed{{{region}}}" if kind == "boxed" else region
    prediction = parse(text, parsing_timeout=None)
    return bool(prediction) and verify(gold, prediction, timeout_seconds=None)


def is_correct(completion, answer: str) -> bool | None:
    """Whether the final answer of ``completion`` equals the gold ``answer``; None when the gold cannot be parsed.

    Never raises on model output, and returns within about ``DEADLINE_SECONDS`` (False when out of time).
    """
    gold = parse_gold(answer)
    if gold is None:
        return None
    try:
        found = extract_answer_region(completion_text(completion))
        if found is None or not _is_safe_to_parse(found[0]):
            return False
        return bool(_within_deadline(lambda: _matches(gold, *found)))
    except Exception:  # SymPy may raise anything on model output; a crash must not stop training
        return False


def accuracy_reward(completions: list, answer: list[str], **kwargs) -> list[float | None]:
    """1.0 when a completion's final answer matches the gold ``answer`` under math-verify, else 0.0.

    The final answer is the last ``\\boxed{...}``, else the line after the last "Answer:", else the last expression
    in the completion's final ``TAIL_CHARS`` characters. The reward is None, which TRL turns into NaN and leaves out
    of the group statistics, only when the gold answer itself cannot be parsed: that is a data problem, and a 0.0
    would silently punish every completion of the prompt.

    Args:
        completions: strings, or conversational completions ``[{"role": "assistant", "content": ...}]``.
        answer: the gold answers, one per completion (the dataset's ``answer`` column, repeated per generation).
        **kwargs: the other dataset columns and trainer extras; unused.
    """
    if len(completions) != len(answer):
        raise ValueError(
            f"accuracy_reward got {len(completions)} completions but {len(answer)} answers; pass the dataset's "
            "`answer` column, one entry per completion."
        )
    rewards = []
    for completion, gold in zip(completions, answer):
        correct = is_correct(completion, gold)
        rewards.append(None if correct is None else float(correct))
    return rewards


def format_reward(completions: list, **kwargs) -> list[float]:
    """``FORMAT_REWARD`` (0.2) when a completion ends its reasoning with a well-formed, non-empty ``\\boxed{...}``.

    Well-formed means the last box closes within ``MAX_ANSWER_CHARS`` characters without absurd nesting; whether the
    boxed answer is right is the accuracy reward's business. Anything else scores 0.0.
    """
    return [FORMAT_REWARD if extract_boxed(completion_text(c)) is not None else 0.0 for c in completions]
