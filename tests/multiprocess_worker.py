"""One rank of the two-process OTB test (launched by tests/test_multiprocess.py through torchrun).

Usage: ACCELERATE_USE_CPU=1 torchrun --nproc_per_node 2 tests/multiprocess_worker.py MODEL_DIR OUT_DIR

Each rank generates 6 completions (per_device_train_batch_size=2, steps_per_generation=3) for
groups of 4, so the 12 completions of a generation batch form 3 groups and the middle one is
split across the two ranks. Rank 0 generates at most 5 tokens and rank 1 up to 12, so the ranks'
completion tensors have different widths. Prompts containing "unscorable" get reward None. Each
rank saves its local batch, its advantages and the otb/ metrics it logged to OUT_DIR/rank{r}.pt.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from datasets import Dataset  # noqa: E402

from trl_otb import OTBConfig, OTBTrainer  # noqa: E402

N = 4
MAX_NEW_TOKENS = {0: 5, 1: 12}


def reward(prompts, completion_ids, **kwargs):
    """Deterministic in the completion, so the test can recompute it; None for the unscorable prompt."""
    return [
        None if "unscorable" in str(prompt) else float(len(ids) % 3) + 0.25 * (ids[0] % 2)
        for prompt, ids in zip(prompts, completion_ids)
    ]


class SavingTrainer(OTBTrainer):
    def _generate_and_score_completions(self, inputs):
        batch = super()._generate_and_score_completions(inputs)
        keys = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "advantages")
        record = {k: batch[k].cpu() for k in keys}
        record["prompts"] = [str(x["prompt"]) for x in inputs]
        record["metrics"] = {k: v[-1] for k, v in self._metrics["train"].items() if k.startswith("otb/")}
        record["world_size"] = self.accelerator.num_processes
        torch.save(record, os.path.join(self._out_dir, f"rank{self.accelerator.process_index}.pt"))
        return batch


def main(model_dir: str, out_dir: str) -> None:
    prompts = ["what is 1 + 1?", "unscorable: what is 2 + 2?", "what is 3 + 3?"]
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": p}]} for p in prompts])
    args = OTBConfig(
        output_dir=os.path.join(out_dir, "run"),
        use_cpu=True,
        bf16=False,
        per_device_train_batch_size=2,
        steps_per_generation=3,
        num_generations=N,
        max_completion_length=12,
        max_steps=1,
        temperature=0.7,
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        seed=0,
    )
    trainer = SavingTrainer(model_dir, reward_funcs=reward, args=args, train_dataset=dataset)
    trainer._out_dir = out_dir
    trainer.generation_config.max_new_tokens = MAX_NEW_TOKENS[trainer.accelerator.process_index]
    trainer.train()


if __name__ == "__main__":
    main(*sys.argv[1:3])
