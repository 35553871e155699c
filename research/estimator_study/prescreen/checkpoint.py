"""The pre-screen's partly trained policies: a few steps of TRL's GRPO (std-scaled, N = 4), saved as a state dict
that ``python -m benchmarks.variance --checkpoint`` loads before sampling its pools.

    PYTHONPATH=. python research/estimator_study/prescreen/checkpoint.py ramble   # the 2-layer toy; long_right, copy
    PYTHONPATH=. python research/estimator_study/prescreen/checkpoint.py count    # SmolLM2-135M

- ``ramble``: seed 0's warm-started 2-layer policy (``benchmarks.study_task.warm_start``, what ``--task
  study-ramble --seed 0`` measures), then ``RAMBLE["steps"]`` steps of the first study's ``grpo_N4`` arm in its
  cell ``long`` (learning rate 1e-3, constant, 4 prompts per step): about a third of that cell's 120k-token budget.
  ``long_right`` and ``copy`` (study 4's other training tasks) are trained the same way on their own task.
- ``count``: the embedded SmolLM2-135M-Instruct (what ``--task count`` measures), then ``COUNT["steps"]`` steps of
  the real-model study's reach design, arm ``grpo_N4`` at its pilot-chosen rate 1e-5 (``make_trainer``: 2 prompts of
  n in 36..64 per step, 256 tokens, temperature 0.7). Both variance count tasks load the same weights.

Written to ``.cache/estimator_study/<name>.pt`` (its file name joins the variance tool's cache key); the command,
steps and seconds beside it in ``<name>.json``. Run at ``nice -n 19``.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

CACHE = Path(".cache/estimator_study")
RAMBLE = {"seed": 0, "steps": 15, "learning_rate": 1e-3, "num_generations": 4, "prompts_per_step": 4}
COUNT = {"seed": 0, "steps": 3, "learning_rate": 1e-5}


def toy_checkpoint(workdir: Path, name: str = "ramble"):
    from benchmarks import study_task
    from trl_otb import OTBConfig, OTBTrainer

    task = study_task.TASKS[name]
    model, tok = study_task.warm_start(RAMBLE["seed"], Path(".cache/training_study"))
    train_patterns, _ = study_task.split_patterns(RAMBLE["seed"])
    N = RAMBLE["num_generations"]
    config = OTBConfig(
        output_dir=str(workdir),
        advantage_estimator="grpo",
        scale_rewards="group",
        num_generations=N,
        per_device_train_batch_size=N * RAMBLE["prompts_per_step"],
        max_completion_length=task.max_completion_length,
        learning_rate=RAMBLE["learning_rate"],
        lr_scheduler_type="constant",
        max_steps=RAMBLE["steps"],
        seed=RAMBLE["seed"],
        use_cpu=True,
        bf16=False,
        gradient_checkpointing=False,
        report_to="none",
        logging_steps=1,
        save_strategy="no",
        disable_tqdm=True,
    )
    trainer = OTBTrainer(
        model,
        reward_funcs=study_task.reward_function(task),
        args=config,
        train_dataset=study_task.dataset(task, train_patterns, RAMBLE["seed"]),
        processing_class=tok,
    )
    trainer.train()
    return model, trainer, RAMBLE


def count_checkpoint(workdir: Path):
    from research.harness.real_model_preregistration import DESIGNS
    from research.harness.real_model_study import make_trainer
    from research.harness.real_model_task import count_task_reward, load_policy

    pre = DESIGNS["reach"]
    model, tok = load_policy()
    job = {
        "design": "reach",
        "task": pre["task"],
        "seed": COUNT["seed"],
        "arm": "grpo_N4",
        "cell": "prescreen",
        "learning_rate": COUNT["learning_rate"],
        "workdir": str(workdir),
    }
    trainer = make_trainer(job, model, tok, count_task_reward, max_steps=COUNT["steps"])
    trainer.train()
    return model, trainer, COUNT


def main(name: str) -> None:
    torch.set_num_threads(1)
    CACHE.mkdir(parents=True, exist_ok=True)
    start = time.process_time()
    if name == "count":
        model, trainer, settings = count_checkpoint(CACHE / f"{name}-work")
    else:
        model, trainer, settings = toy_checkpoint(CACHE / f"{name}-work", name)
    path = CACHE / f"{name}_grpo.pt"
    torch.save(model.state_dict(), path)
    logs = [
        {k: e.get(k) for k in ("step", "reward", "reward_std", "loss", "grad_norm", "completions/mean_length")}
        for e in trainer.state.log_history
        if "loss" in e
    ]
    meta = {
        "command": "PYTHONPATH=. python research/estimator_study/prescreen/checkpoint.py " + name,
        "settings": settings,
        "cpu_seconds": time.process_time() - start,
        "steps": logs,
    }
    path.with_suffix(".json").write_text(json.dumps(meta, indent=1))
    print(f"wrote {path} ({meta['cpu_seconds']:.0f} CPU s)")


if __name__ == "__main__":
    main(sys.argv[1])
