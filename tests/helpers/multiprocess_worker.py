"""One rank of the two-process OTB test (launched by tests/integration/test_multiprocess.py through torchrun).

Usage: ACCELERATE_USE_CPU=1 torchrun --nproc_per_node 2 tests/helpers/multiprocess_worker.py MODEL_DIR OUT_DIR

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

from pathlib import Path  # noqa: E402

import torch  # noqa: E402

from trl_otb import OTBTrainer  # noqa: E402
from trl_otb.testing import MAX_NEW_TOKENS, make_args, split_group_dataset, split_group_reward  # noqa: E402
from trl_otb.testing.multiprocess import leave_without_teardown  # noqa: E402


class SavingTrainer(OTBTrainer):
    def _generate_and_score_completions(self, inputs):
        batch = super()._generate_and_score_completions(inputs)
        keys = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "advantages")
        record = {k: batch[k].cpu() for k in keys}
        record["prompts"] = [str(x["prompt"]) for x in inputs]
        record["metrics"] = {k: v[-1] for k, v in self._metrics["train"].items() if k.startswith("otb/")}
        record["world_size"] = self.accelerator.num_processes
        record["otb_options"] = self.args.estimator_options()  # what the trainer computed with (its defaults)
        torch.save(record, os.path.join(self._out_dir, f"rank{self.accelerator.process_index}.pt"))
        return batch


def main(model_dir: str, out_dir: str) -> None:
    args = make_args(
        Path(out_dir),
        output_dir=os.path.join(out_dir, "run"),
        gradient_checkpointing=True,
        per_device_train_batch_size=2,
        steps_per_generation=3,
    )
    trainer = SavingTrainer(model_dir, reward_funcs=split_group_reward, args=args, train_dataset=split_group_dataset())
    trainer._out_dir = out_dir
    trainer.generation_config.max_new_tokens = MAX_NEW_TOKENS[trainer.accelerator.process_index]
    trainer.train()


if __name__ == "__main__":
    main(*sys.argv[1:3])
    leave_without_teardown()
