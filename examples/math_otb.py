"""Train a math reasoner with the Optimal Token Baseline, evaluate it before and after, and publish it.

    accelerate launch --config_file examples/accelerate_configs/cpu.yaml examples/math_otb.py   # = make demo
    accelerate launch examples/math_otb.py --config examples/recipes/qwen2.5-0.5b_gsm8k.yaml
    python examples/math_otb.py --model_name_or_path Qwen/Qwen2.5-0.5B-Instruct --dataset_name openai/gsm8k \
        --max_steps 200 --use_peft --push_to_hub --hub_model_id me/qwen-otb

Without `--config`, `examples/recipes/cpu_smollm2.yaml` supplies the defaults: the embedded SmolLM2-135M-Instruct,
the generated offline dataset, N=4. Every TRL flag (OTBConfig = GRPOConfig + OTB fields, ModelConfig, ScriptArguments)
overrides a recipe value from the command line. On a machine without CUDA, `use_cpu`, `bf16=False` and
`gradient_checkpointing=False` become the defaults unless the recipe or the command line sets them.

Writes to `output_dir`: the final model with a model card (README.md, with an OTB section), `summary.json`
(held-out accuracy before/after, tokens, steps, times) and `training.png` (reward, accuracy, `otb/` diagnostics).
See docs/training.md.
"""

from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import StoppingCriteria
from trl import ModelConfig, ScriptArguments, TrlParser, get_peft_config
from trl.models.utils import unwrap_model_for_generation

from trl_otb import OTBConfig, OTBTrainer
from trl_otb.demo.card import CardResults, math_card
from trl_otb.demo.data import DEFAULT_LEVEL, EMBEDDED_NAMES, load_math_dataset
from trl_otb.demo.hub import HubPreflightError, preflight_hub
from trl_otb.demo.models import (
    EMBEDDED_ALIASES,
    EMBEDDED_MODEL_NAME,
    EmbeddedModelUnavailableError,
    ModelNotAvailableError,
    load_model_and_tokenizer,
)
from trl_otb.demo.rewards import accuracy_reward, format_reward
from trl_otb.plotting import pyplot
from trl_otb.quiet import quiet_checkpointing_aliases

DEFAULT_RECIPE = Path(__file__).resolve().parent / "recipes" / "cpu_smollm2.yaml"
CPU_DEFAULTS = {"use_cpu": True, "bf16": False, "gradient_checkpointing": False}


@dataclass
class MathArguments:
    """Options of this script beyond TRL's ScriptArguments, OTBConfig and ModelConfig."""

    dataset_level: str = field(
        default=DEFAULT_LEVEL,
        metadata={"help": "Generated dataset only: level(s), comma-separated, e.g. 'add1' or 'copy,add1'."},
    )
    num_train: int = field(default=1000, metadata={"help": "Generated dataset only: training prompts."})
    eval_samples: int = field(
        default=64, metadata={"help": "Held-out prompts scored (pass@1, greedy) before and after training; 0: none."}
    )
    eval_batch_size: int = field(default=32, metadata={"help": "Prompts per batched generate call in evaluation."})
    eval_max_new_tokens: int | None = field(
        default=None, metadata={"help": "Tokens generated per evaluation prompt; None: max_completion_length."}
    )
    base_model_id: str | None = field(
        default=None,
        metadata={
            "help": "Hub id of the base model, for the model card's base_model and quick start, when "
            "--model_name_or_path is a local directory (the embedded model's id is known)."
        },
    )


def make_parser() -> TrlParser:
    return TrlParser((ScriptArguments, MathArguments, OTBConfig, ModelConfig))


def parse_args(argv: list[str] | None = None):
    """(script_args, math_args, training_args, model_args), with the CPU recipe when no --config is given."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--config" not in argv and not {"-h", "--help"} & set(argv):
        argv = ["--config", str(DEFAULT_RECIPE), *argv]
    parser = make_parser()
    if not torch.cuda.is_available():
        parser.set_defaults_with_config(**CPU_DEFAULTS)  # the recipe, then the command line, override these
    return parser.parse_args_and_config(argv)


def model_display_name(name: str | None) -> str:
    return EMBEDDED_MODEL_NAME if name is None or name.strip().lower() in EMBEDDED_ALIASES else name


def dataset_display_name(script_args, math_args) -> str:
    if script_args.dataset_name in EMBEDDED_NAMES:
        return f"otb-math (generated offline, level {math_args.dataset_level})"
    return script_args.dataset_name


def load_splits(script_args, math_args, seed: int):
    """(train, held-out, held-out split's name) in the prompt/answer format; held-out has at most eval_samples rows."""
    name = script_args.dataset_name
    if name in EMBEDDED_NAMES:
        levels = [level.strip() for level in math_args.dataset_level.split(",") if level.strip()]
        data = load_math_dataset(
            level=levels[0] if len(levels) == 1 else levels,
            num_train=math_args.num_train,
            num_test=max(math_args.eval_samples, 1),
            seed=seed,
        )
    else:
        try:
            data = load_math_dataset(name, config=script_args.dataset_config)
        except Exception as err:  # offline, unknown name, unknown layout: all stop here, before any training
            raise SystemExit(
                f"error: could not load the dataset {name!r} ({type(err).__name__}: {err}). Without the Hub, omit "
                "--dataset_name to train on the generated offline dataset (otb-math)."
            ) from err
    train_split, test_split = script_args.dataset_train_split, script_args.dataset_test_split
    if train_split not in data:
        raise SystemExit(f"error: the dataset {name!r} has splits {list(data)}, not {train_split!r}.")
    train = data[train_split]
    if test_split in data and test_split != train_split:
        test = data[test_split]
    elif math_args.eval_samples > 0:  # e.g. DAPO-Math-17k has only 'train': hold some of it out
        parts = train.train_test_split(test_size=math_args.eval_samples, seed=seed)
        train, test = parts["train"], parts["test"]
        test_split = f"{train_split} (held-out rows)"
    else:
        test, test_split = train.select([]), None
    test = test.shuffle(seed=seed).select(range(min(math_args.eval_samples, len(test))))
    return train, test, test_split


def load_model(model_args, training_args):
    """(model, tokenizer); a model that cannot be had (offline Hub id, missing package) stops the script here."""
    if model_args.load_in_8bit:
        raise SystemExit("error: --load_in_8bit is not supported; use --load_in_4bit (QLoRA, with --use_peft).")
    kwargs = {}
    if model_args.model_revision not in (None, "main"):
        kwargs["revision"] = model_args.model_revision
    if model_args.attn_implementation is not None:
        kwargs["attn_implementation"] = model_args.attn_implementation
    if training_args.trust_remote_code:
        kwargs["trust_remote_code"] = True
    quantization = "4bit" if model_args.load_in_4bit else None
    if quantization and torch.cuda.is_available():
        from accelerate import PartialState

        kwargs["device_map"] = {"": PartialState().local_process_index}  # each process its own GPU
    try:
        return load_model_and_tokenizer(
            model_args.model_name_or_path, dtype=model_args.dtype, quantization=quantization, **kwargs
        )
    except (ModelNotAvailableError, EmbeddedModelUnavailableError) as err:
        raise SystemExit(f"error: {err}") from err


class _ProgressTick(StoppingCriteria):
    """A stopping criterion that never stops: it advances a progress bar by one step per generated token."""

    def __init__(self, bar):
        self.bar = bar

    def __call__(self, input_ids: torch.Tensor, scores, **kwargs) -> torch.Tensor:
        self.bar.update(1)
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)


@torch.no_grad()
def evaluate(
    model, tokenizer, dataset, batch_size: int, max_new_tokens: int, accelerator, description: str = "evaluating"
) -> dict:
    """pass@1 of greedy decoding on ``dataset``, scored by accuracy_reward. Every process takes a share; the main
    process shows a progress bar (one step per generate call)."""
    from tqdm.auto import tqdm
    from transformers import GenerationConfig, StoppingCriteriaList

    start = time.perf_counter()
    rows = list(range(len(dataset)))
    if not rows:
        return {"accuracy": None, "samples": 0, "seconds": 0.0, "examples": []}
    generation_config = GenerationConfig(
        max_new_tokens=max_new_tokens,
        do_sample=False,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=model.generation_config.eos_token_id or tokenizer.eos_token_id,
    )
    padding_side, tokenizer.padding_side = tokenizer.padding_side, "left"
    was_training = model.training
    model.eval()
    results = []
    try:
        # Equal shares (the last row repeated), so that sharded models run the same number of generate calls.
        with accelerator.split_between_processes(rows, apply_padding=True) as share:
            starts = range(0, len(share), batch_size)
            # One step per generated token (a batch that stops early at EOS jumps ahead): a 64-prompt evaluation
            # is one or two generate calls, each of which can take minutes on a CPU.
            with tqdm(
                total=len(starts) * max_new_tokens,
                desc=f"{description} ({len(rows)} prompts)",
                unit="tok",
                disable=not accelerator.is_local_main_process,
            ) as bar:
                progress = StoppingCriteriaList([_ProgressTick(bar)])
                for n, i in enumerate(starts, start=1):
                    batch = dataset.select(share[i : i + batch_size])
                    texts = [
                        tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
                        for prompt in batch["prompt"]
                    ]
                    encoded = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
                    encoded = encoded.to(accelerator.device)
                    output = model.generate(**encoded, generation_config=generation_config, stopping_criteria=progress)
                    bar.update(n * max_new_tokens - bar.n)
                    completions = tokenizer.batch_decode(
                        output[:, encoded["input_ids"].shape[1] :], skip_special_tokens=True
                    )
                    rewards = accuracy_reward(completions, answer=batch["answer"])
                    results += [(row, text, float(r or 0.0)) for row, text, r in zip(share[i:], completions, rewards)]
    finally:
        tokenizer.padding_side = padding_side
        model.train(was_training)
    from accelerate.utils import gather_object

    gathered = {row: (text, reward) for row, text, reward in gather_object(results)}  # drops the padding repeats
    accuracy = sum(reward for _, reward in gathered.values()) / len(gathered)
    examples = [
        {"prompt": dataset[row]["prompt"][-1]["content"], "answer": dataset[row]["answer"], "completion": text}
        for row, (text, _) in sorted(gathered.items())[:3]
    ]
    return {
        "accuracy": accuracy,
        "samples": len(gathered),
        "seconds": time.perf_counter() - start,
        "examples": examples,
    }


def completion_tokens(log_history: list[dict], args: OTBConfig, world_size: int) -> int:
    """Completion tokens generated in training, from TRL's per-log `completions/mean_length`.

    Each optimizer step consumes per_device_train_batch_size x gradient_accumulation_steps x world_size completions,
    generated once per num_iterations reuses; a log entry averages its window's generation batches (equal sizes).
    """
    per_step = args.per_device_train_batch_size * args.gradient_accumulation_steps * world_size / args.num_iterations
    total, previous_step = 0.0, 0
    for entry in log_history:
        if "completions/mean_length" in entry:
            total += entry["completions/mean_length"] * per_step * (entry["step"] - previous_step)
            previous_step = entry["step"]
    return round(total)


def training_pyplot():
    """pyplot for `training.png`; SystemExit naming the plots extra when matplotlib is missing."""
    try:
        return pyplot("Plotting this example's training curves (training.png)")
    except ImportError as err:
        raise SystemExit(f"error: {err}") from err


def plot_training(log_history: list[dict], summary: dict, path: Path) -> None:
    """Reward, accuracy and every `otb/` diagnostic against the step, one panel each."""
    plt = training_pyplot()
    logs = [entry for entry in log_history if "reward" in entry]
    otb_keys = sorted({key for entry in logs for key in entry if key.startswith("otb/")})
    panels = ["reward", "rewards/accuracy_reward/mean", *otb_keys]
    columns = 3
    rows = math.ceil(len(panels) / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(4.2 * columns, 2.8 * rows), squeeze=False)
    for ax, key in zip(axes.flat, panels):
        points = [(entry["step"], entry[key]) for entry in logs if key in entry and entry[key] is not None]
        if points:
            ax.plot(*zip(*points), marker=".", linewidth=1)
        if key == "rewards/accuracy_reward/mean":
            ax.set_title("accuracy (train batch; held-out pass@1 dashed)", fontsize=9)
            for name, color in (("accuracy_before", "tab:gray"), ("accuracy_after", "tab:green")):
                if summary.get(name) is not None:
                    ax.axhline(summary[name], color=color, linestyle="--", label=f"{name}={summary[name]:.2f}")
            ax.legend(fontsize=7)
        else:
            ax.set_title(key, fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        ax.tick_params(labelsize=7)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    fig.suptitle(f"OTB on {summary['dataset']} - {summary['model']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(script_args, math_args, training_args, model_args) -> dict:
    start = time.perf_counter()
    training_pyplot()  # fail before training, not after it, when `training.png` cannot be drawn
    if training_args.push_to_hub:  # fail now, not after an hour of training
        try:
            hub_id = training_args.hub_model_id or Path(training_args.output_dir).name
            training_args.hub_model_id = preflight_hub(hub_id, token=training_args.hub_token)
        except HubPreflightError as err:
            raise SystemExit(f"error: {err}") from err

    model, tokenizer = load_model(model_args, training_args)
    train_dataset, eval_dataset, eval_split = load_splits(script_args, math_args, training_args.seed)
    model_name = model_display_name(model_args.model_name_or_path)
    dataset_name = dataset_display_name(script_args, math_args)
    max_new_tokens = math_args.eval_max_new_tokens or training_args.max_completion_length

    trainer = OTBTrainer(
        model=model,
        reward_funcs=[accuracy_reward, format_reward],
        args=training_args,
        train_dataset=train_dataset,
        processing_class=tokenizer,
        peft_config=get_peft_config(model_args),
    )
    accelerator = trainer.accelerator
    print_main = accelerator.print
    print_main(
        f"Model: {model_name} | data: {dataset_name} ({len(train_dataset)} train, {len(eval_dataset)} held out)"
    )

    # TRL's own unwrap for generation: under DeepSpeed ZeRO-3 the weights are partitioned from loading on, and it
    # gathers them (before training too, when model_wrapped is still the model itself).
    with quiet_checkpointing_aliases(), unwrap_model_for_generation(trainer.model_wrapped, accelerator) as unwrapped:
        before = evaluate(
            unwrapped, tokenizer, eval_dataset, math_args.eval_batch_size, max_new_tokens, accelerator, "pass@1 before"
        )
    print_main(
        f"Held-out pass@1 before training: {before['accuracy']} ({before['samples']} prompts, {before['seconds']:.0f} s)"
    )

    train_output = trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)

    with quiet_checkpointing_aliases(), unwrap_model_for_generation(trainer.model_wrapped, accelerator) as unwrapped:
        after = evaluate(
            unwrapped, tokenizer, eval_dataset, math_args.eval_batch_size, max_new_tokens, accelerator, "pass@1 after"
        )
    print_main(
        f"Held-out pass@1 after training: {after['accuracy']} ({after['samples']} prompts, {after['seconds']:.0f} s)"
    )

    history = trainer.state.log_history
    steps = trainer.state.global_step
    num_tokens = [entry["num_tokens"] for entry in history if "num_tokens" in entry]
    train_runtime = train_output.metrics.get("train_runtime")
    summary = {
        "model": model_name,
        "dataset": dataset_name,
        "eval_samples": after["samples"],
        "accuracy_before": before["accuracy"],
        "accuracy_after": after["accuracy"],
        "steps": steps,
        "completion_tokens": completion_tokens(history, training_args, accelerator.num_processes),
        "completion_tokens_note": "completion tokens generated in training (from TRL's completions/mean_length)",
        "trl_num_tokens": num_tokens[-1] if num_tokens else None,
        "trl_num_tokens_note": "TRL's num_tokens: prompt + completion tokens seen in training (cumulative)",
        "train_runtime_s": train_runtime,
        "seconds_per_step": train_runtime / steps if train_runtime and steps else None,
        "eval_before_s": before["seconds"],
        "eval_after_s": after["seconds"],
        "num_generations": training_args.num_generations,
        "max_completion_length": training_args.max_completion_length,
        "per_device_train_batch_size": training_args.per_device_train_batch_size,
        "num_processes": accelerator.num_processes,
        "advantage_estimator": training_args.advantage_estimator,
        "use_peft": model_args.use_peft,
        "load_in_4bit": model_args.load_in_4bit,
        "examples_after": after["examples"],
    }

    trainer.save_model(training_args.output_dir)
    summary["wall_time_s"] = time.perf_counter() - start  # up to the saved model; the card and plot take seconds
    output_dir = Path(training_args.output_dir)
    # TRL's card fields take Hub ids only: the generated dataset is described in the text and in model-index.
    embedded_data = script_args.dataset_name in EMBEDDED_NAMES
    hub_dataset = None if embedded_data else script_args.dataset_name
    results = CardResults(
        before=before["accuracy"],
        after=after["accuracy"],
        samples=after["samples"],
        dataset_type="otb-math" if embedded_data else script_args.dataset_name,
        dataset_name=dataset_name,
        dataset_config=math_args.dataset_level if embedded_data else script_args.dataset_config,
        dataset_split=eval_split,
    )
    card = math_card(
        trainer,
        dataset_name=dataset_name,
        results=results if after["samples"] else None,
        summary=summary,
        base_model=math_args.base_model_id,  # default: the Hub id the model was loaded from
    )
    trainer.create_model_card(model_name=output_dir.name, dataset_name=hub_dataset, **card)
    if training_args.push_to_hub:
        trainer.push_to_hub(dataset_name=hub_dataset, **card)  # writes the same card again, then uploads
        print_main(f"Pushed to https://huggingface.co/{trainer.hub_model_id}")
    if accelerator.is_main_process:
        (output_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        plot_training(history, summary, output_dir / "training.png")
        print_main(
            f"\nheld-out pass@1: {summary['accuracy_before']} -> {summary['accuracy_after']} "
            f"({summary['eval_samples']} prompts) | steps {steps} | completion tokens {summary['completion_tokens']} "
            f"(TRL num_tokens, prompt+completion: {summary['trl_num_tokens']}) | wall {summary['wall_time_s']:.0f} s\n"
            f"wrote {output_dir}/README.md, summary.json, training.png"
        )
    accelerator.end_training()
    return summary


if __name__ == "__main__":
    main(*parse_args())
