"""trl_otb/inputs.py and trl_otb/rewards.py: the bad inputs that TRL meets too late get a message, from OTBTrainer,
that says what to change: a reward function's output of the wrong type or shape (at the first step, naming the
function), a dataset without a `prompt` column, with no rows, too few for one batch, or with empty prompts (at
construction; a stream's rows at the batch where they come, an empty stream when training ends). Valid inputs pass
unchanged: async, NumPy and model rewards, blank chat messages, and an environment that supplies the prompts."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from datasets import Dataset, IterableDataset
from transformers import AutoModelForSequenceClassification
from trl.trainer.utils import is_async_callable

from trl_otb import OTBTrainer
from trl_otb.rewards import checked_reward_func, reward_values
from trl_otb.testing import N, RecordingReward, make_args, prompts_dataset, tool_ready_model

MUST_RETURN = "must return a list of floats (or None for a completion it cannot score)"


def text_dataset(prompts) -> Dataset:
    return Dataset.from_dict({"prompt": list(prompts)})


def valid_prompts(n=8) -> list[str]:
    return [f"{i} + 1 =" for i in range(n)]


# --- reward functions ------------------------------------------------------------------------------------------------

# (id, what the reward function returns for n completions, error type, what the message says besides MUST_RETURN)
BAD_OUTPUTS = [
    ("string", lambda n: "1.0", TypeError, "returned a string ('1.0'), not a list"),
    ("scalar", lambda n: 0.5, TypeError, "returned one number (0.5) for the whole batch"),
    ("forgotten-return", lambda n: None, TypeError, "returned None"),
    ("list-of-lists", lambda n: [[1.0, 0.0]] * n, TypeError, "item 0 is a list ([1.0, 0.0]), not a number"),
    ("list-of-strings", lambda n: ["1.0"] * n, TypeError, "item 0 is a str ('1.0'), not a number"),
    ("two-column-tensor", lambda n: torch.zeros(n, 2), TypeError, f"returned a Tensor of shape ({N * 2}, 2)"),
    ("column-array", lambda n: np.zeros((n, 1)), TypeError, f"returned a ndarray of shape ({N * 2}, 1)"),
    ("list-of-arrays", lambda n: [np.zeros(1)] * n, TypeError, "item 0 is a ndarray"),
    ("dict", lambda n: {"reward": 1.0}, TypeError, "returned a dict"),
    ("too-short", lambda n: [1.0] * (n - 1), ValueError, f"returned {N * 2 - 1} values for {N * 2} completions"),
]


@pytest.mark.parametrize("output,error,says", [b[1:] for b in BAD_OUTPUTS], ids=[b[0] for b in BAD_OUTPUTS])
def test_a_reward_function_returning_the_wrong_shape_is_named_with_what_it_must_return(
    tiny_model_dir, tmp_path, output, error, says
):
    def my_reward(completions, **kwargs):
        return output(len(completions))

    trainer = OTBTrainer(
        tiny_model_dir, reward_funcs=my_reward, args=make_args(tmp_path), train_dataset=prompts_dataset()
    )
    assert trainer.reward_func_names == ["my_reward"]  # precondition: constructed, under the function's own name
    with pytest.raises(error) as info:
        trainer.train()
    message = str(info.value)
    assert message.startswith("Reward function 'my_reward' returned") and says in message
    assert MUST_RETURN in message


def test_an_async_reward_function_is_checked_too(tiny_model_dir, tmp_path):
    async def forgetful_reward(completions, **kwargs):
        [0.0 for _ in completions]

    trainer = OTBTrainer(
        tiny_model_dir, reward_funcs=forgetful_reward, args=make_args(tmp_path), train_dataset=prompts_dataset()
    )
    assert trainer.reward_funcs[0] is forgetful_reward and is_async_callable(forgetful_reward)  # TRL's own list
    with pytest.raises(TypeError, match=r"Reward function 'forgetful_reward' returned None\..*forget a `return`"):
        trainer.train()


def test_valid_outputs_pass_as_the_same_values():
    n = 3
    for output in (
        [1.0, None, 2],
        (0.5, 1.5, float("nan")),
        np.array([1.0, 2.0, 3.0], dtype=np.float32),
        torch.tensor([1.0, 2.0, 3.0]),
        [np.float64(1.0), np.int64(2), np.bool_(True)],
        [torch.tensor(1.0), None, np.array(2.0)],
        (x for x in [1.0, 2.0, 3.0]),
        torch.tensor([[1.0], [2.0], [3.0]]),  # a reward model's [B, 1] logits
        [torch.tensor([1.0]), torch.tensor([[2.0]]), None],
    ):
        values = reward_values(output, "r", n)
        assert isinstance(values, list) and len(values) == n
        assert torch.tensor([torch.nan if v is None else float(v) for v in values]).shape == (n,)


def test_the_checked_function_keeps_its_name_and_kind():
    async def graded(completions, **kwargs):
        return [1.0] * len(completions)

    def plain(completions, **kwargs):
        return [1.0] * len(completions)

    assert is_async_callable(graded) and not is_async_callable(plain)  # precondition
    assert checked_reward_func(graded, "graded", 1).__name__ == "graded" and is_async_callable(
        checked_reward_func(graded, "graded", 1)
    )
    assert checked_reward_func(plain, "plain", 1).__name__ == "plain" and not is_async_callable(
        checked_reward_func(plain, "plain", 1)
    )
    nan_flags = []
    output = torch.tensor([[1.0], [float("nan")]])
    assert checked_reward_func(lambda **kwargs: output, "column", 2, nan_flags)(prompts=["a", "b"]) is output
    assert nan_flags == [False, True]  # called without completions=, as TRL's environment reward is


def test_async_numpy_and_model_rewards_train_under_their_own_names(tiny_model_dir, tmp_path, tiny_tokenizer):
    async def async_reward(completions, **kwargs):
        return [float(len(c) % 3) for c in completions]

    def numpy_reward(completions, **kwargs):
        return np.array([len(c) % 2 for c in completions], dtype=np.float64)

    scorer = AutoModelForSequenceClassification.from_pretrained(tiny_model_dir, num_labels=1)
    scorer.config.pad_token_id = tiny_tokenizer.pad_token_id
    trainer = OTBTrainer(
        tiny_model_dir,
        reward_funcs=[async_reward, numpy_reward, RecordingReward(), scorer],
        reward_processing_classes=[None, None, None, tiny_tokenizer],
        args=make_args(tmp_path),
        train_dataset=prompts_dataset(),
    )
    names = trainer.reward_func_names
    assert names[:3] == ["async_reward", "numpy_reward", "recording_reward"]
    assert trainer.reward_funcs[0] is async_reward and trainer.reward_funcs[3] is scorer  # TRL's list, unwrapped
    trainer.train()
    logged = trainer.state.log_history[0]
    assert trainer.state.global_step == 1
    assert all(f"rewards/{name}/mean" in logged for name in names)


# --- datasets and prompts --------------------------------------------------------------------------------------------


def test_a_dataset_without_a_prompt_column_is_refused_at_construction(tiny_model_dir, tmp_path):
    questions = Dataset.from_dict({"question": valid_prompts()})
    args = make_args(tmp_path)
    for dataset in (questions, questions.to_iterable_dataset()):
        with pytest.raises(ValueError, match=r"train_dataset has no 'prompt' column \(its columns: \['question'\]\)"):
            OTBTrainer(tiny_model_dir, reward_funcs=RecordingReward(), args=args, train_dataset=dataset)
    with pytest.raises(ValueError, match=r"eval_dataset\['held_out'\] has no 'prompt' column.*rename_column"):
        OTBTrainer(
            tiny_model_dir,
            reward_funcs=RecordingReward(),
            args=args,
            train_dataset=prompts_dataset(),
            eval_dataset={"held_out": questions},
        )
    renamed = questions.rename_column("question", "prompt")  # what the message says to do
    OTBTrainer(tiny_model_dir, reward_funcs=RecordingReward(), args=args, train_dataset=renamed)


def test_an_empty_dataset_or_one_smaller_than_a_batch_is_refused_at_construction(tiny_model_dir, tmp_path):
    args = make_args(tmp_path)  # 8 completions per batch, N = 4: one generation batch takes 2 prompts
    assert args.generation_batch_size // args.num_generations == 2  # precondition
    with pytest.raises(ValueError, match="train_dataset has no rows"):
        OTBTrainer(tiny_model_dir, reward_funcs=RecordingReward(), args=args, train_dataset=text_dataset([]))
    with pytest.raises(ValueError, match=r"fewer prompts \(1\) than one generation batch takes \(2 = "):
        OTBTrainer(tiny_model_dir, reward_funcs=RecordingReward(), args=args, train_dataset=text_dataset(["1 ="]))
    trainer = OTBTrainer(
        tiny_model_dir, reward_funcs=RecordingReward(), args=args, train_dataset=text_dataset(["1 =", "2 ="])
    )
    trainer.train()
    assert trainer.state.global_step == 1  # two prompts are one batch: a step


EMPTY_PROMPTS = [
    ("empty-string", ""),
    ("blank-string", "  \n"),
    ("no-message", []),
    ("none", None),
]


@pytest.mark.parametrize("empty", [e[1] for e in EMPTY_PROMPTS], ids=[e[0] for e in EMPTY_PROMPTS])
def test_empty_prompts_are_refused_at_construction_with_their_rows(tiny_model_dir, tmp_path, empty):
    conversational = isinstance(empty, list)
    prompts = [[{"role": "user", "content": p}] if conversational else p for p in valid_prompts()]
    args = make_args(tmp_path)
    OTBTrainer(tiny_model_dir, reward_funcs=RecordingReward(), args=args, train_dataset=text_dataset(prompts))
    prompts[3] = prompts[6] = empty  # precondition above: the same prompts without these two are accepted
    with pytest.raises(ValueError, match=r"train_dataset: 2 of its 8 prompts are empty \(rows \[3, 6\]\)"):
        OTBTrainer(tiny_model_dir, reward_funcs=RecordingReward(), args=args, train_dataset=text_dataset(prompts))


def test_a_streamed_dataset_is_checked_at_the_batch_where_a_bad_prompt_comes(tiny_model_dir, tmp_path):
    def stream(rows):
        return IterableDataset.from_generator(lambda: iter(rows))

    args = make_args(tmp_path)
    trainer = OTBTrainer(
        tiny_model_dir, reward_funcs=RecordingReward(), args=args, train_dataset=stream([{"prompt": ""}] * 8)
    )  # a stream is not read at construction
    with pytest.raises(ValueError, match=r"8 of the 8 prompts of this batch are empty"):
        trainer.train()
    questions = stream([{"question": "1 + 1 ="}] * 8)
    assert questions.column_names is None  # precondition: its columns are unknown until read
    trainer = OTBTrainer(tiny_model_dir, reward_funcs=RecordingReward(), args=args, train_dataset=questions)
    with pytest.raises(
        ValueError, match=r"8 of the 8 examples of this batch have no 'prompt' \(their keys: \['question'\]\)"
    ):
        trainer.train()


def test_a_stream_that_yields_no_batch_fails_when_training_ends(tiny_model_dir, tmp_path):
    empty = IterableDataset.from_generator(lambda: iter([]))
    trainer = OTBTrainer(tiny_model_dir, reward_funcs=RecordingReward(), args=make_args(tmp_path), train_dataset=empty)
    with pytest.raises(ValueError, match=r"Training ran 0 of its 1 steps: train_dataset, an IterableDataset"):
        trainer.train()
    assert trainer.state.global_step == 0


class CountingEnvironment:
    """An environment that supplies the prompt (``reset``) and owns the reward: the dataset's prompts may be empty."""

    def reset(self, **kwargs):
        self.calls = 0
        return "what is 2 + 3?"

    def add(self, a: int, b: int) -> str:
        """Add two numbers.

        Args:
            a: The first number.
            b: The second number.

        Returns:
            The sum.
        """
        self.calls += 1
        return str(a + b)

    def get_reward(self):
        return float(self.calls)


def test_an_environment_that_supplies_the_prompts_may_have_empty_ones(tiny_model_dir, tmp_path):
    placeholders = text_dataset([[{"role": "user", "content": ""}]] * 4)  # TRL's own placeholder prompts
    model, tokenizer = tool_ready_model(tiny_model_dir)
    args = make_args(tmp_path, max_completion_length=8)
    with pytest.raises(ValueError, match="prompts are empty"):  # precondition: an empty text prompt is refused...
        OTBTrainer(model, reward_funcs=RecordingReward(), args=args, train_dataset=text_dataset([""] * 4))
    trainer = OTBTrainer(
        model,
        args=args,
        train_dataset=placeholders,
        processing_class=tokenizer,
        environment_factory=CountingEnvironment,
    )  # ...but not where an environment supplies the prompts
    trainer.train()
    assert trainer.state.global_step == 1 and trainer.reward_func_names == ["CountingEnvironment"]
