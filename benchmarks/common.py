"""What the benchmark scripts share: model shapes built from a config (random weights, no download), the prompts and
reward of the timed trainer runs, a step clock, one timed GRPOTrainer or OTBTrainer run, the JSON and plot writers.

The scripts run from the repository root as ``python -m benchmarks.<script>`` and import this module as
``benchmarks.common``. Heavy packages (torch, transformers, TRL) are imported inside the functions: a script may set
its environment (threads, vLLM's CPU settings) before torch loads.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

N = 4
"""Completions per prompt in the timed trainer runs."""

_SHAPE_FIELDS = (
    "arch",
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "max_position_embeddings",
    "rope_theta",
    "rms_norm_eps",
)
SHAPES = {
    name: {**dict(zip(_SHAPE_FIELDS, values)), "tie_word_embeddings": True}
    for name, values in {
        # Qwen2.5-0.5B's config.json shapes.
        "qwen2.5-0.5b": ("qwen2", 151936, 896, 4864, 24, 14, 2, 32768, 1000000.0, 1e-6),
        # SmolLM2-360M's config.json shapes.
        "smollm2-360m": ("llama", 49152, 960, 2560, 32, 15, 5, 8192, 100000.0, 1e-5),
        # The dry run's shape: the same architecture class as qwen2.5-0.5b, tiny.
        "tiny-qwen2": ("qwen2", 1024, 64, 128, 2, 4, 2, 4096, 1000000.0, 1e-6),
        # SmolLM2-135M's layer sizes, 2048 positions, LlamaConfig's default rope_theta and eps: the model of the
        # sample-efficiency job's "random-smollm2" (which gives it the tokenizer's vocabulary).
        "smollm2-135m-layers": ("llama", 49152, 576, 1536, 30, 9, 3, 2048, 10000.0, 1e-6),
    }.items()
}
"""Model configs by name: the architecture (``qwen2`` or ``llama``) and the fields of its transformers config."""


def build_random_model(shape: str, tokenizer, device: str = "cpu", dtype=None, seed: int = 0, vocab_size=None):
    """A randomly initialised causal LM with ``shape``'s config (``SHAPES``; ``vocab_size`` replaces the shape's),
    built on ``device`` (no download)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    spec = dict(SHAPES[shape])
    arch = spec.pop("arch")
    spec["vocab_size"] = vocab_size or spec["vocab_size"]
    if spec["vocab_size"] < len(tokenizer):
        raise ValueError(f"shape {shape!r} has a vocabulary smaller than the tokenizer's ({len(tokenizer)})")
    config_cls, model_cls = (Qwen2Config, Qwen2ForCausalLM) if arch == "qwen2" else (LlamaConfig, LlamaForCausalLM)
    config = config_cls(**spec, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(seed)
    with torch.device(device):
        model = model_cls(config)
    if dtype is not None:
        model = model.to(dtype)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model


# ----------------------------------------------------------------------------------------------------------------
# Timed trainer runs
# ----------------------------------------------------------------------------------------------------------------


def cheap_reward(completion_ids, **kwargs):
    """Deterministic, varies within groups, costs nothing: keeps the timing on the trainer."""
    return [float(len(ids) % 3) + 0.25 * (ids[0] % 2 if ids else 0) for ids in completion_ids]


def prompt_dataset(count: int = 64):
    """The timed runs' training prompts: ``count`` conversational addition questions."""
    from datasets import Dataset

    prompts = [f"Add {i} and {i % 7 + 2}. Put the final answer in \\boxed{{}}." for i in range(count)]
    return Dataset.from_list([{"prompt": [{"role": "user", "content": p}]} for p in prompts])


def sync(device: str) -> None:
    """Wait for the device's queued work (CUDA); nothing on a CPU."""
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def step_clock(device: str = "cpu"):
    """A trainer callback that records each optimizer step's wall time (``wall``, CUDA synchronised at the step's
    start and end) and this process's CPU time (``cpu``)."""
    from transformers import TrainerCallback

    class StepClock(TrainerCallback):
        def __init__(self):
            self.wall, self.cpu = [], []

        def on_step_begin(self, *args, **kwargs):
            sync(device)
            self._wall, self._cpu = time.perf_counter(), time.process_time()

        def on_step_end(self, *args, **kwargs):
            sync(device)
            self.wall.append(time.perf_counter() - self._wall)
            self.cpu.append(time.process_time() - self._cpu)

    return StepClock()


def timed_training(
    trainer_name: str,
    model,
    tokenizer,
    *,
    prompts_per_step: int,
    device: str = "cpu",
    peft_config=None,
    print_logs: bool = True,
    **config,
):
    """Train GRPOTrainer (``trainer_name`` "grpo") or OTBTrainer ("otb") on ``prompt_dataset`` with ``cheap_reward``,
    N completions per prompt, ``prompts_per_step`` prompts per step. ``config`` holds the rest of the trainer's
    arguments (``output_dir``, ``max_steps``, ``seed``, ...); the reward is not scaled, nothing is saved or reported.
    Returns (trainer, clock): the trained trainer and its ``step_clock``."""
    from trl import GRPOConfig, GRPOTrainer

    from trl_otb import OTBConfig, OTBTrainer

    config_cls, trainer_cls = (OTBConfig, OTBTrainer) if trainer_name == "otb" else (GRPOConfig, GRPOTrainer)
    args = config_cls(
        per_device_train_batch_size=N * prompts_per_step,
        num_generations=N,
        scale_rewards="none",
        report_to="none",
        logging_steps=1,
        save_strategy="no",
        temperature=1.0,
        disable_tqdm=True,
        **config,
    )
    clock = step_clock(device)
    trainer = trainer_cls(
        model,
        reward_funcs=cheap_reward,
        args=args,
        train_dataset=prompt_dataset(),
        processing_class=tokenizer,
        peft_config=peft_config,
        callbacks=[clock],
    )
    if not print_logs:
        from transformers.trainer_callback import PrinterCallback

        trainer.remove_callback(PrinterCallback)  # the logs of every step would flood the output
    trainer.train()
    return trainer, clock


# ----------------------------------------------------------------------------------------------------------------
# Training curves
# ----------------------------------------------------------------------------------------------------------------


class CountingReward:
    """``reward`` (a TRL reward function) that also adds up the completion tokens it scores, in ``tokens``: the x axis
    of the training curves. It keeps ``reward``'s ``__name__``, which TRL logs the reward under."""

    def __init__(self, reward):
        self.reward = reward
        self.tokens = 0
        self.__name__ = reward.__name__

    def __call__(self, completions, completion_ids, **kwargs):
        self.tokens += sum(len(ids) for ids in completion_ids)
        return self.reward(completions, **kwargs)


def tokens_to_target(curve: list[dict], target: float) -> float | None:
    """Tokens at which the score first reaches ``target``, interpolated between evaluations (None: never).

    ``curve``: evaluations in order, each a dict with ``tokens`` and ``score``."""
    if curve and curve[0]["score"] >= target:
        return float(curve[0]["tokens"])
    for before, after in zip(curve, curve[1:]):
        if after["score"] >= target:
            share = (target - before["score"]) / (after["score"] - before["score"])
            return before["tokens"] + share * (after["tokens"] - before["tokens"])
    return None


# ----------------------------------------------------------------------------------------------------------------
# Output
# ----------------------------------------------------------------------------------------------------------------


def command(script: str, argv: list[str] | None = None) -> str:
    """The command line that ran ``script`` (a module of benchmarks/ by its file or package name, or any module by its
    dotted name) with ``argv`` (default: this process's arguments), as the JSON's ``meta.command``."""
    dotted = "." in script and not script.endswith(".py")
    module = script if dotted else f"benchmarks.{Path(script).stem}"
    return " ".join([f"python -m {module}", *(sys.argv[1:] if argv is None else argv)])


def write_json(path: Path, payload: dict) -> None:
    """Write ``payload`` (indent 1) to ``path`` through a temporary file: a run stopped mid-write leaves the last
    complete file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(payload, indent=1))
    tmp.replace(path)


def pyplot():
    """matplotlib's pyplot on the Agg backend; without the plots extra, an ImportError that names it."""
    from trl_otb.plotting import pyplot

    return pyplot("Plotting the benchmark results", otherwise="the JSON results are written before the plot")


def save_figure(fig, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def sample(model, enc, tokenizer, temperature: float, max_new_tokens: int, **kwargs):
    """``model.generate`` on the encoded prompts ``enc``, sampling from the temperature-scaled distribution itself (no
    top-k or top-p truncation, as TRL samples by default), padded with the tokenizer's pad token."""
    return model.generate(
        **enc,
        do_sample=True,
        temperature=temperature,
        top_k=0,
        top_p=1.0,
        max_new_tokens=max_new_tokens,
        pad_token_id=tokenizer.pad_token_id,
        **kwargs,
    )


def train_measuring_movement(trainer, model, order: float = 2) -> float:
    """``trainer.train()``; returns how far it moved ``model``'s parameters (the sum over tensors of the ``order``-norm
    of each one's change; ``order=1`` is the total L1 movement), the precondition of every comparison that follows
    from a run."""
    params = list(model.parameters())
    before = [p.detach().clone() for p in params]
    trainer.train()
    return sum(float((p.detach() - b).norm(p=order)) for p, b in zip(params, before))


def run_outcome(curve: list[dict], steps: list[dict], moved: float, tokens: int, cpu: float, wall: float) -> dict:
    """The part of a training run's record that every study writes: the held-out curve, the logged steps, how far
    the weights moved, the completion tokens, and the CPU and wall seconds since ``cpu`` and ``wall``."""
    return {
        "curve": curve,
        "steps": steps,
        "weights_moved": moved,
        "tokens": tokens,
        "cpu_seconds": time.process_time() - cpu,
        "wall_seconds": time.perf_counter() - wall,
    }
