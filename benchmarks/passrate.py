"""Pass@1 of the embedded model on each level of the generated math dataset, at temperature 1.0.

GRPO learns only from groups whose rewards differ, so the default level must be neither too easy nor too hard for the
model being trained. This script measures it; `trl_otb.demo.data.DEFAULT_LEVEL` was chosen with it.

    python -m benchmarks.passrate --num-prompts 48 --samples 2 --max-new-tokens 64 --levels copy compare add1

Prints a JSON with, per level, pass@1 (mean accuracy reward), the share of completions with a well-formed box, and the
share of prompts whose samples disagree (the ones GRPO learns from); also written to ``--output``.
"""

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from trl_otb.demo.data import LEVELS, generate_math_dataset
from trl_otb.demo.models import load_model_and_tokenizer
from trl_otb.demo.rewards import FORMAT_REWARD, accuracy_reward, format_reward


@torch.no_grad()
def sample_texts(model, tokenizer, prompts, samples, max_new_tokens, batch_size):
    """``samples`` completions per conversational prompt, sampled at temperature 1.0; [prompt][sample] strings."""
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    texts = [tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True) for p in prompts]
    completions = []
    for start in range(0, len(texts), batch_size):
        batch = tokenizer(
            texts[start : start + batch_size], return_tensors="pt", padding=True, add_special_tokens=False
        )
        out = model.generate(
            **batch,
            do_sample=True,
            temperature=1.0,
            top_p=1.0,
            top_k=0,
            max_new_tokens=max_new_tokens,
            num_return_sequences=samples,
            pad_token_id=tokenizer.pad_token_id,
        )
        decoded = tokenizer.batch_decode(out[:, batch["input_ids"].shape[1] :], skip_special_tokens=True)
        completions.extend(decoded[i : i + samples] for i in range(0, len(decoded), samples))
    return completions


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-prompts", type=int, default=48)
    parser.add_argument("--samples", type=int, default=2, help="completions per prompt")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--levels", nargs="+", default=list(LEVELS), choices=list(LEVELS))
    parser.add_argument("--batch-size", type=int, default=24, help="prompts per generate call")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--split", default="test", choices=["train", "test"])
    parser.add_argument("--output", default="outputs/passrate.json")
    parser.add_argument("--show", type=int, default=0, help="print this many completions per level")
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    model, tokenizer = load_model_and_tokenizer()  # the embedded SmolLM2-135M-Instruct
    model.eval()

    results = {}
    for level in args.levels:
        start = time.perf_counter()
        rows = generate_math_dataset(level, num_train=0, num_test=args.num_prompts, seed=args.seed)[args.split]
        groups = sample_texts(model, tokenizer, rows["prompt"], args.samples, args.max_new_tokens, args.batch_size)
        flat = [c for group in groups for c in group]
        answers = [a for a in rows["answer"] for _ in range(args.samples)]
        accuracy = accuracy_reward(flat, answers)
        formatted = format_reward(flat)
        per_prompt = [accuracy[i : i + args.samples] for i in range(0, len(accuracy), args.samples)]
        results[level] = {
            "pass@1": round(sum(accuracy) / len(accuracy), 4),
            "boxed": round(sum(formatted) / FORMAT_REWARD / len(formatted), 4),
            "mixed_groups": round(sum(len(set(g)) > 1 for g in per_prompt) / len(per_prompt), 4),
            "completions": len(flat),
            "seconds": round(time.perf_counter() - start, 1),
        }
        print(json.dumps({level: results[level]}), file=sys.stderr, flush=True)
        for prompt, completion, reward in list(zip(rows["prompt"], groups, per_prompt))[: args.show]:
            print(json.dumps({"q": prompt[-1]["content"], "c": completion, "r": reward}))
    report = {"config": vars(args), "levels": results}
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
