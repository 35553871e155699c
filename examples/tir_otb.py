"""Tool-integrated reasoning with OTB: the model may call a calculator while it answers.

TRL's tool calling runs the loop (generate, parse ``<tool_call>``, run the tool, append its output,
generate again); the tool's output tokens are masked out of the loss (``tool_mask``), and OTB then
compares group members at their k-th *model-generated* token (``otb_align="valid"``, picked
automatically when a tool mask is present).

    python examples/tir_otb.py                # embedded SmolLM2-135M-Instruct, 2 steps (minutes on CPU)
    python examples/tir_otb.py --help

The embedded model is small and rarely calls the tool; a tool-tuned model (e.g. a Qwen2.5/Qwen3
instruct checkpoint, ``--model PATH``) calls it often. Models whose chat template TRL cannot parse
tool calls from get TRL's Qwen3 template (ChatML-based), which works for any ChatML tokenizer.
"""

from __future__ import annotations

import argparse
import random
import re

from datasets import Dataset
from transformers import AutoTokenizer
from trl.chat_template_utils import add_response_schema, qwen3_chat_template

from trl_otb import OTBConfig, OTBTrainer


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression with integers, + - * / and parentheses.

    Args:
        expression: The expression to evaluate, e.g. "(12 + 3) * 4".

    Returns:
        The value of the expression.
    """
    if not expression or set(expression) - set("0123456789+-*/(). "):
        raise ValueError("Only integers, + - * / and parentheses are allowed.")
    return str(eval(expression, {"__builtins__": {}}))


def arithmetic_dataset(n: int, seed: int = 0) -> Dataset:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b, c = rng.randint(10, 99), rng.randint(10, 99), rng.randint(2, 9)
        question = f"What is ({a} + {b}) * {c}? Use the calculator tool, then give the final number."
        rows.append({"prompt": [{"role": "user", "content": question}], "answer": str((a + b) * c)})
    return Dataset.from_list(rows)


def correct_answer(completions, answer, **kwargs):
    """1 when the last assistant message contains the right number, else 0."""
    rewards = []
    for messages, target in zip(completions, answer):
        final = next((m.get("content") or "" for m in reversed(messages) if m["role"] == "assistant"), "")
        rewards.append(float(target in re.findall(r"-?\d+", final)))
    return rewards


def used_tool(completions, **kwargs):
    """0.2 per completion that got a tool result back (shaping, so the small model sees a signal)."""
    return [0.2 * any(m["role"] == "tool" for m in messages) for messages in completions]


def tool_ready_tokenizer(model_path: str):
    """The model's tokenizer, with a chat template TRL can parse tool calls from."""
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    try:
        add_response_schema(tokenizer)
    except ValueError:  # template unknown to TRL: use its Qwen3 (ChatML) template
        tokenizer.chat_template = qwen3_chat_template
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="model path or id (default: the embedded SmolLM2-135M-Instruct)")
    parser.add_argument("--output-dir", default="outputs/tir_otb")
    parser.add_argument("--max-steps", type=int, default=2)
    parser.add_argument("--num-generations", type=int, default=4, help="group size N (>= 2)")
    parser.add_argument("--max-completion-length", type=int, default=64, help="tokens, tool output included")
    parser.add_argument("--max-tool-calls", type=int, default=2, help="max_tool_calling_iterations")
    parser.add_argument("--learning-rate", type=float, default=1e-5)
    parser.add_argument("--cpu", action=argparse.BooleanOptionalAction, default=True, help="train on CPU")
    args = parser.parse_args(argv)

    if args.model is None:
        from trl_otb.demo.models import embedded_model_path

        args.model = embedded_model_path()
    config = OTBConfig(
        output_dir=args.output_dir,
        num_generations=args.num_generations,
        per_device_train_batch_size=args.num_generations,
        max_completion_length=args.max_completion_length,
        max_tool_calling_iterations=args.max_tool_calls,
        max_steps=args.max_steps,
        learning_rate=args.learning_rate,
        logging_steps=1,
        use_cpu=args.cpu,
        bf16=not args.cpu,
        gradient_checkpointing=False,
        report_to="none",
        save_strategy="no",
        # otb_align=None: "valid" is chosen automatically because tool calling produces a tool mask.
    )
    trainer = OTBTrainer(
        args.model,
        reward_funcs=[correct_answer, used_tool],
        args=config,
        train_dataset=arithmetic_dataset(64),
        processing_class=tool_ready_tokenizer(args.model),
        tools=[calculator],
    )
    trainer.train()

    print("\nstep  reward  tool_calls/completion  adv_std  proxy_mean")
    for log in (entry for entry in trainer.state.log_history if "otb/advantage_std" in entry):
        print(
            f"{log['step']:>4}  {log['reward']:6.3f}  {log.get('tools/call_frequency', 0.0):21.2f}  "
            f"{log['otb/advantage_std']:7.3f}  {log['otb/proxy_mean']:10.3f}"
        )


if __name__ == "__main__":
    main()
