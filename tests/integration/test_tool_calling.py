"""Tool-integrated reasoning end to end: TRL's own tool-calling loop (``tools=[...]``) runs a real
calculator, its output tokens are masked (``tool_mask``), and OTB aligns group members by their
k-th model-generated token.

A random tiny model never writes a valid tool call, so the first assistant turn is scripted for
some rows (a ``<tool_call>`` block in the Qwen format TRL parses); TRL then parses it, runs the
tool, appends the tool response, and the model samples the next turn itself.
"""

from __future__ import annotations

import pytest
import torch

from trl_otb import OTBTrainer, otb_advantages
from trl_otb.testing import N, independent_rollout_stats, make_args, prompts_dataset, tool_ready_model

CALLS = []


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression with + - * / and parentheses.

    Args:
        expression: The expression, e.g. "12 * 34".

    Returns:
        The value, as text.
    """
    if set(expression) - set("0123456789+-*/(). "):
        raise ValueError(f"unsupported expression {expression!r}")
    CALLS.append(expression)
    return str(eval(expression, {"__builtins__": {}}))


# Per row of a group: the expression of the scripted tool call, or None (the model answers directly).
# Different lengths put the tool-output hole at a different position in each member.
SCRIPT = [None, "2+3", "12*34", "(1+2)*(3+4)"]


def tool_call_text(expression: str) -> str:
    return (
        f'<tool_call>\n{{"name": "calculator", "arguments": {{"expression": "{expression}"}}}}\n</tool_call><|im_end|>'
    )


class ScriptedFirstTurn(OTBTrainer):
    """Scripts the first assistant turn of rows that call the tool; every other turn is sampled."""

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        completion_ids, logprobs = super()._generate_single_turn(
            prompt_ids, images, multimodal_fields, num_generations, has_tool_images
        )
        if num_generations == 1:  # TRL's post-tool turn: keep the model's own sample
            return completion_ids, logprobs
        for i in range(len(completion_ids)):
            expression = SCRIPT[i % len(SCRIPT)]
            if expression is not None:
                completion_ids[i] = self.processing_class.encode(tool_call_text(expression))
        return completion_ids, logprobs


class ToolReward:
    """Varies within a group (tool use counts 1, plus a length term) and remembers what it returned."""

    __name__ = "tool_reward"

    def __init__(self):
        self.calls = []

    def __call__(self, completions, completion_ids, **kwargs):
        out = [
            sum(m["role"] == "tool" for m in c) + 0.1 * (len(ids) % 5) for c, ids in zip(completions, completion_ids)
        ]
        self.calls.append(out)
        return out


def run_tool_batch(tiny_model_dir, tmp_path, **overrides):
    model, tokenizer = tool_ready_model(tiny_model_dir)
    args = make_args(tmp_path, max_completion_length=160, max_tool_calling_iterations=1, **overrides)
    reward = ToolReward()
    trainer = ScriptedFirstTurn(
        model,
        reward_funcs=reward,
        args=args,
        train_dataset=prompts_dataset(),
        processing_class=tokenizer,
        tools=[calculator],
    )
    inputs = [{"prompt": [{"role": "user", "content": "what is 2 + 3?"}]}] * N  # one group: long prompts are slow
    CALLS.clear()
    batch = trainer._generate_and_score_completions(inputs)
    return trainer, batch, torch.tensor(reward.calls[-1], dtype=torch.float32)


@pytest.fixture(scope="module")
def tool_batch(tiny_model_dir, tmp_path_factory):
    return run_tool_batch(tiny_model_dir, tmp_path_factory.mktemp("tir"))


def test_trl_tool_loop_runs_the_calculator_and_masks_its_output(tool_batch):
    trainer, batch, _ = tool_batch
    assert CALLS == [e for e in SCRIPT if e is not None]
    tool_mask = batch["tool_mask"]
    tokenizer = trainer.processing_class
    for i in range(tool_mask.size(0)):
        expression = SCRIPT[i % len(SCRIPT)]
        holes = batch["completion_ids"][i][(tool_mask[i] == 0) & (batch["completion_mask"][i] == 1)]
        if expression is None:
            assert holes.numel() == 0
        else:
            text = tokenizer.decode(holes)
            assert f"<tool_response>\n{eval(expression)}\n</tool_response>" in text
            assert "<|im_start|>assistant" in text  # the header of the next turn is not the model's either


def test_tool_masked_advantages_align_by_model_token(tool_batch):
    trainer, batch, rewards = tool_batch
    _, _, proxy = independent_rollout_stats(trainer.model, batch, trainer.temperature)
    mask = batch["completion_mask"] * batch["tool_mask"]
    group_ids = torch.arange(len(rewards)) // N
    valid = otb_advantages(rewards, proxy.float(), mask, group_ids, align="valid", tail=trainer.args.otb_tail)
    position = otb_advantages(rewards, proxy.float(), mask, group_ids, align="position", tail=trainer.args.otb_tail)
    assert torch.allclose(batch["advantages"], valid, atol=1e-5)
    # The holes sit at different positions, so comparing members position by position gives other numbers.
    assert (batch["advantages"] - position).abs().max() > 1e-3
    assert (batch["advantages"][mask == 0] == 0).all()


def test_otb_align_position_overrides_the_automatic_choice(tool_batch):
    trainer, batch, rewards = tool_batch
    _, _, proxy = independent_rollout_stats(trainer.model, batch, trainer.temperature)
    mask = batch["completion_mask"] * batch["tool_mask"]
    expected = otb_advantages(
        rewards, proxy.float(), mask, torch.arange(len(rewards)) // N, align="position", tail=trainer.args.otb_tail
    )
    # The same batch through the trainer's advantage step, with the option set.
    trainer.args.otb_align = "position"
    try:
        groups = trainer._otb_gather(batch, proxy, rewards)
        advantages = trainer._otb_estimate(groups)[groups.rows, : groups.width]
    finally:
        trainer.args.otb_align = None
    assert torch.allclose(advantages, expected, atol=1e-5)
    assert not torch.allclose(advantages, batch["advantages"], atol=1e-3)
