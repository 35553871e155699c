import re

import pytest
from datasets import Dataset, DatasetDict
from trl.data_utils import is_conversational

from trl_otb.demo.data import (
    ANSWER_INSTRUCTION,
    DEFAULT_LEVEL,
    LEVELS,
    adapt_dapo,
    adapt_dataset,
    adapt_gsm8k,
    adapt_math,
    detect_adapter,
    generate_math_dataset,
    load_math_dataset,
)
from trl_otb.demo.rewards import accuracy_reward


def problem_key(row):
    """What identifies a problem whatever its wording: its numbers and quoted words."""
    text = row["prompt"][-1]["content"].replace(ANSWER_INSTRUCTION, "")
    return row["level"], tuple(re.findall(r"\d+|\"\w+\"", text))


def test_same_seed_gives_the_same_rows():
    first = generate_math_dataset(list(LEVELS), num_train=60, num_test=30, seed=3)
    second = generate_math_dataset(list(LEVELS), num_train=60, num_test=30, seed=3)
    for split in ("train", "test"):
        assert first[split].to_list() == second[split].to_list()


def test_different_seeds_give_different_rows():
    first = generate_math_dataset(DEFAULT_LEVEL, num_train=50, num_test=10, seed=0)
    second = generate_math_dataset(DEFAULT_LEVEL, num_train=50, num_test=10, seed=1)
    assert first["train"]["prompt"] != second["train"]["prompt"]


@pytest.mark.parametrize("level", list(LEVELS))
def test_train_and_test_share_no_problem(level):
    data = generate_math_dataset(level, num_train=300, num_test=100, seed=0)
    train = {problem_key(row) for row in data["train"]}
    test = {problem_key(row) for row in data["test"]}
    assert train and test and not train & test


def test_rows_are_conversational_prompts_asking_for_a_box():
    data = generate_math_dataset(list(LEVELS), num_train=12, num_test=6)
    assert isinstance(data, DatasetDict) and set(data) == {"train", "test"}
    assert data["train"].column_names == ["prompt", "answer", "level"]
    for row in data["train"]:
        assert is_conversational(row)
        assert row["prompt"][-1]["role"] == "user"
        assert row["prompt"][-1]["content"].endswith(ANSWER_INSTRUCTION)


def test_mixed_levels_are_balanced_and_interleaved():
    train = generate_math_dataset(["copy", "add1", "word"], num_train=9, num_test=3)["train"]
    assert train["level"] == ["copy", "add1", "word"] * 3


def test_every_gold_answer_is_scored_correct_when_boxed():
    data = generate_math_dataset(list(LEVELS), num_train=240, num_test=60, seed=7)
    for split in ("train", "test"):
        answers = data[split]["answer"]
        completions = [f"The result is \\boxed{{{a}}}." for a in answers]
        assert accuracy_reward(completions, answers) == [1.0] * len(answers)


def expected_answer(level, text):
    numbers = [int(n) for n in re.findall(r"\d+", text)]
    if level in ("add1", "add2"):
        return sum(numbers)
    if level == "compare":
        return max(numbers)
    if level == "word":
        return numbers[0] + numbers[1] - numbers[2]
    return len(re.search(r"\"(\w+)\"", text).group(1))  # count


def test_gold_answers_are_right():
    rows = generate_math_dataset(["add1", "add2", "compare", "word", "count"], num_train=50, num_test=0)["train"]
    for row in rows:
        text = row["prompt"][-1]["content"]
        assert row["answer"] == str(expected_answer(row["level"], text)), text


def test_unknown_level_names_the_choices():
    with pytest.raises(ValueError, match="add1"):
        generate_math_dataset("calculus")


@pytest.mark.parametrize("name", [None, "embedded", "otb-math"])
def test_load_math_dataset_gives_the_generated_dataset_offline(name):
    train = load_math_dataset(name, split="train", num_train=10, num_test=5, seed=2)
    assert isinstance(train, Dataset) and len(train) == 10
    assert train.to_list() == generate_math_dataset(num_train=10, num_test=5, seed=2)["train"].to_list()
    assert set(load_math_dataset(name, num_train=4, num_test=2)) == {"train", "test"}


GSM8K_ROW = {
    "question": "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
    "How many clips did Natalia sell altogether in April and May?",
    "answer": "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 clips.\n#### 1,072",
}
MATH500_ROW = {
    "problem": "Convert the point $(0,3)$ in rectangular coordinates to polar coordinates.",
    "solution": "We have $r = 3$ ... so the answer is $\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}.$",
    "answer": "\\left( 3, \\frac{\\pi}{2} \\right)",
    "subject": "Precalculus",
    "level": 2,
    "unique_id": "test/precalculus/807.json",
}
MATH_ROW = {
    "problem": "What is $\\frac{1}{2} + \\frac{1}{4}$?",
    "solution": "First \\boxed{x} is a distraction. We get $\\frac{2}{4} + \\frac{1}{4} = \\boxed{\\frac{3}{4}}$.",
    "level": "Level 1",
    "type": "Prealgebra",
}
DAPO_ROW = {
    "data_source": "math_dapo",
    "prompt": [
        {
            "content": "Solve the following math problem step by step. The last line of your response should be of "
            "the form Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n"
            "In triangle $ABC$, $\\sin \\angle A = \\frac{4}{5}$. Find the integer nearest to $100 \\cos A$.\n\n"
            'Remember to put your answer on its own line after "Answer:".',
            "role": "user",
        }
    ],
    "ability": "MATH",
    "reward_model": {"ground_truth": "60", "style": "rule-lighteval/MATH_v2"},
    "extra_info": {"index": "9a9b6eb4-a1cb-49d1-8c1e-62eaf2f74079"},
}


def test_gsm8k_adapter_takes_the_number_after_hashes():
    row = adapt_gsm8k(GSM8K_ROW)
    assert row["answer"] == "1072" and row["level"] == "gsm8k"
    assert row["prompt"][0]["content"].startswith("Natalia sold clips")
    with pytest.raises(ValueError, match="####"):
        adapt_gsm8k({"question": "q", "answer": "no final line"})


def test_math_adapters_prefer_the_answer_column_then_the_last_box():
    assert adapt_math(MATH500_ROW)["answer"] == "\\left( 3, \\frac{\\pi}{2} \\right)"
    assert adapt_math(MATH500_ROW)["level"] == "2"
    assert adapt_math(MATH_ROW)["answer"] == "\\frac{3}{4}"
    with pytest.raises(ValueError, match="boxed"):
        adapt_math({"problem": "p", "solution": "no box"})


def test_dapo_adapter_rewraps_the_problem_for_a_box():
    row = adapt_dapo(DAPO_ROW)
    content = row["prompt"][0]["content"]
    assert content.startswith("In triangle $ABC$") and content.endswith(ANSWER_INSTRUCTION)
    assert "Answer: $Answer" not in content and "Remember" not in content
    assert row["answer"] == "60" and row["level"] == "math_dapo"


@pytest.mark.parametrize(
    ("row", "adapter"),
    [(GSM8K_ROW, adapt_gsm8k), (MATH500_ROW, adapt_math), (MATH_ROW, adapt_math), (DAPO_ROW, adapt_dapo)],
)
def test_adapted_datasets_have_the_common_columns_and_verifiable_answers(row, adapter):
    assert detect_adapter(list(row)) is adapter
    data = adapt_dataset(Dataset.from_list([row, row]))
    assert data.column_names == ["prompt", "answer", "level"]
    assert is_conversational(data[0])
    assert accuracy_reward([f"\\boxed{{{a}}}" for a in data["answer"]], data["answer"]) == [1.0, 1.0]
    assert set(adapt_dataset(DatasetDict({"train": Dataset.from_list([row])}))["train"].column_names) == {
        "prompt",
        "answer",
        "level",
    }


def test_unknown_layout_says_what_is_expected():
    with pytest.raises(ValueError, match="gsm8k"):
        detect_adapter(["text", "label"])
