"""One-process trainer tests: the ``OTBConfig`` they train with, their prompts, and a reward that remembers."""

from __future__ import annotations

N = 4  # group size of the trainer tests


def make_args(tmp_path, **overrides):
    """The trainer tests' ``OTBConfig``: CPU, fp32, groups of :data:`N`, 8 completions of up to 12 tokens, 1 step."""
    from trl_otb import OTBConfig

    base = dict(
        output_dir=str(tmp_path / "out"),
        use_cpu=True,
        bf16=False,
        gradient_checkpointing=False,
        per_device_train_batch_size=8,
        num_generations=N,
        max_completion_length=12,
        max_steps=1,
        report_to="none",
        logging_steps=1,
        save_strategy="no",
        seed=0,
        temperature=0.7,
    )
    return OTBConfig(**{**base, **overrides})


def prompts_dataset(n=16):
    from datasets import Dataset

    return Dataset.from_list([{"prompt": [{"role": "user", "content": f"what is {i} + {i % 3}?"}]} for i in range(n)])


def generation_inputs(n_prompts=2):
    """The inputs of one generation batch: ``n_prompts`` prompts, each :data:`N` times."""
    return [{"prompt": [{"role": "user", "content": f"what is {p} + 1?"}]} for p in range(n_prompts) for _ in range(N)]


class RecordingReward:
    """A deterministic reward that varies within groups and remembers what it returned.

    The reward of a completion is ``len % 3 + 0.25 * (first token % 2)``, a multiple of 0.25 in [0, 2.25]. Most
    completions of the tiny model run to the length limit, so a whole group of :data:`N` often ties: its advantages are
    then 0, and a batch of tied groups trains nothing. ``distinct=True`` adds ``0.1 * (i % N)`` to row i (its index
    within its group of N consecutive rows): 0.1, 0.2 and 0.3 are no multiples of 0.25, so no two rewards of a group
    tie, every batch has non-zero advantages and every optimizer step has a gradient, which a test that needs the
    trainer to move relies on. The rewards stay within [0, 2.55], the scale the tests' tolerances are set for.
    """

    __name__ = "recording_reward"
    DISTINCT_STEP = 0.1

    def __init__(self, none_rows=(), distinct=False):
        self.calls = []
        self.none_rows = set(none_rows)
        self.step = self.DISTINCT_STEP if distinct else 0.0

    def __call__(self, completions, completion_ids, **kwargs):
        out = [
            None
            if i in self.none_rows
            else float(len(ids) % 3) + 0.25 * (ids[0] % 2 if ids else 0) + self.step * (i % N)
            for i, ids in enumerate(completion_ids)
        ]
        self.calls.append(out)
        return out
