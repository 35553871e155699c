import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trl_otb.demo.rewards import (
    FORMAT_REWARD,
    _within_deadline,
    accuracy_reward,
    extract_answer_region,
    extract_boxed,
    format_reward,
)

TIME_BOUND = 2.0  # seconds per completion, generous for a loaded CI machine; the deadline itself is 1 s


def as_message(text):
    return [{"role": "assistant", "content": text}]


@pytest.mark.parametrize("wrap", [str, as_message], ids=["string", "conversational"])
def test_accuracy_reward_scores_right_and_wrong_answers(wrap):
    completions = [
        "3 + 4 = 7, so the answer is \\boxed{7}.",
        "The answer is \\boxed{8}.",
        "First I guess \\boxed{8}, but on reflection \\boxed{7}",
        "\\boxed{\\frac{14}{2}}",
    ]
    assert accuracy_reward([wrap(c) for c in completions], ["7"] * 4) == [1.0, 0.0, 1.0, 1.0]


def test_accuracy_reward_compares_latex_answers():
    completions = ["so \\boxed{\\frac{2}{4}}", "so \\boxed{0.5}", "so \\boxed{\\frac{1}{3}}"]
    assert accuracy_reward(completions, ["\\frac{1}{2}"] * 3) == [1.0, 1.0, 0.0]


def test_accuracy_reward_falls_back_to_answer_line_then_tail():
    completions = ["Answer: 12\nThat is all.", "Adding them gives 12", "Adding them gives 13", "no number at all", ""]
    assert accuracy_reward(completions, ["12"] * 5) == [1.0, 1.0, 0.0, 0.0, 0.0]


def test_boxed_answer_wins_over_answer_line():
    assert extract_answer_region("Answer: 3\n\\boxed{4}") == ("4", "boxed")
    assert accuracy_reward(["Answer: 3\n\\boxed{4}"], ["3"]) == [0.0]


def test_unparseable_gold_gives_none_not_zero():
    assert accuracy_reward(["\\boxed{7}", "\\boxed{7}"], ["", "}{"]) == [None, None]


def test_accuracy_reward_rejects_mismatched_lengths():
    with pytest.raises(ValueError, match="answer"):
        accuracy_reward(["\\boxed{1}", "\\boxed{2}"], ["1"])


def test_format_reward_pays_only_for_a_closed_nonempty_box():
    completions = ["so \\boxed{7}", as_message("so \\boxed{7}"), "so 7", "so \\boxed{7", "so \\boxed{}", "Answer: 7"]
    assert format_reward(completions) == [FORMAT_REWARD, FORMAT_REWARD, 0.0, 0.0, 0.0, 0.0]


def test_extract_boxed_takes_the_last_box_with_nested_braces():
    assert extract_boxed("\\boxed{1} then \\boxed{\\frac{1}{2}}") == "\\frac{1}{2}"
    assert extract_boxed("\\fbox{5}") == "5"
    assert extract_boxed("no box") is None
    assert extract_boxed("\\boxed{" + "{" * 100 + "}" * 100 + "}") is None  # too deep
    assert extract_boxed("\\boxed{" + "1" * 500 + "}") is None  # does not close within the scan window


HOSTILE = {
    "huge_integer": "9" * 5000,
    "huge_boxed_integer": "\\boxed{" + "9" * 5000 + "}",
    "exponent_tower": "\\boxed{10^{10^{10}}}",
    "exponent_tower_inline": "so $10^{10^{10}}$",
    "exponent_tower_python": "\\boxed{10**10**10}",
    "exponent_tower_parens": "\\boxed{(10^{9999})^{9999}}",
    "big_power": "\\boxed{999999999999999999999999999999999999999^{9999}}",
    "big_factorial": "\\boxed{100000!}",
    "big_binomial": "\\boxed{\\binom{10^{30}}{10^{29}}}",
    "big_product": "\\boxed{\\prod_{i=1}^{99999} i}",
    "nested_braces": "\\boxed{" + "{" * 5000 + "}" * 5000 + "}",
    "nested_sqrt": "\\boxed{" + "\\sqrt{" * 15 + "2" + "}" * 15 + "}",
    "malformed_latex": "\\frac{\\frac{" * 100 + "\\boxed{\\left( 8 \\right.}" + "}" * 3,
    "long_output": "x" * 10_000,
    "long_sum": "Answer: " + "1+" * 90 + "1",
    "unclosed_box": "\\boxed{7" + " 1" * 5000,
    "nul_and_unicode": "\x00\ufffd\u202e \\boxed{\u0663}",
}


@pytest.mark.parametrize("completion", HOSTILE.values(), ids=HOSTILE.keys())
def test_hostile_completions_score_zero_in_bounded_time(completion):
    start = time.perf_counter()
    assert accuracy_reward([completion, as_message(completion)], ["7", "7"]) == [0.0, 0.0]
    assert set(format_reward([completion])) <= {0.0, FORMAT_REWARD}
    assert time.perf_counter() - start < 2 * TIME_BOUND


def test_long_output_with_a_final_box_still_scores():
    assert accuracy_reward(["blah " * 2000 + "\\boxed{7}"], ["7"]) == [1.0]


COMPLETIONS = ["\\boxed{7}", "\\boxed{8}", "It is 7", HOSTILE["exponent_tower"], HOSTILE["nested_sqrt"], "x" * 10_000]
EXPECTED = [1.0, 0.0, 1.0, 0.0, 0.0, 0.0]


def test_rewards_work_in_a_thread():
    results = {}

    def score():
        start = time.perf_counter()
        results["accuracy"] = accuracy_reward(COMPLETIONS, ["7"] * len(COMPLETIONS))
        results["format"] = format_reward(COMPLETIONS)
        results["seconds"] = time.perf_counter() - start

    worker = threading.Thread(target=score)
    worker.start()
    worker.join(timeout=30)
    assert results["accuracy"] == EXPECTED
    assert results["format"] == [FORMAT_REWARD, FORMAT_REWARD, 0.0, FORMAT_REWARD, FORMAT_REWARD, 0.0]
    assert results["seconds"] < TIME_BOUND * len(COMPLETIONS)


def test_rewards_work_in_a_thread_pool():
    with ThreadPoolExecutor(max_workers=3) as pool:
        scores = list(pool.map(lambda c: accuracy_reward([c], ["7"])[0], COMPLETIONS))
    assert scores == EXPECTED


def test_deadline_off_the_main_thread_returns_none_in_time():
    outcome = {}

    def run():
        start = time.perf_counter()
        outcome["value"] = _within_deadline(lambda: time.sleep(5) or "late", seconds=0.2)
        outcome["seconds"] = time.perf_counter() - start

    worker = threading.Thread(target=run)
    worker.start()
    worker.join()
    assert outcome["value"] is None
    assert outcome["seconds"] < 1.0


def test_deadline_on_the_main_thread_interrupts_and_restores_the_previous_timer():
    fired = []
    previous = signal.signal(signal.SIGALRM, lambda signum, frame: fired.append(signum))
    try:
        signal.setitimer(signal.ITIMER_REAL, 1.0)

        def spin():
            while True:
                pass

        start = time.perf_counter()
        assert _within_deadline(spin, seconds=0.2) is None
        assert time.perf_counter() - start < 0.8
        assert _within_deadline(lambda: 42, seconds=0.2) == 42
        remaining, _ = signal.getitimer(signal.ITIMER_REAL)
        assert 0.0 < remaining < 1.0  # the outer timer is still pending, less the time spent
        time.sleep(remaining + 0.2)
        assert fired == [signal.SIGALRM]
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


TOKENS = list("0123456789{}^()!*+-/=., \n\\abfoxedrqt$") + ["\\boxed{", "\\frac{", "Answer:", "999999"]
MATHY = st.lists(st.sampled_from(TOKENS), max_size=80).map("".join)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=st.one_of(st.text(max_size=300), MATHY), gold=st.sampled_from(["7", "12", "\\frac{1}{2}", "x^2"]))
def test_rewards_stay_in_range_and_never_raise(text, gold):
    accuracy = accuracy_reward([text, as_message(text)], [gold, gold])
    assert accuracy[0] == accuracy[1] and accuracy[0] in (0.0, 1.0)
    assert format_reward([text])[0] in (0.0, FORMAT_REWARD)


@settings(max_examples=50, deadline=None)
@given(n=st.integers(min_value=-(10**12), max_value=10**12))
def test_any_integer_boxed_matches_itself(n):
    assert accuracy_reward([f"so \\boxed{{{n}}}"], [str(n)]) == [1.0]
