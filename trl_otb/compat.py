"""The TRL internals OTBTrainer relies on, checked before training starts.

TRL has no advantage hook, so OTBTrainer overrides a few private GRPOTrainer methods and reads a
few private attributes. If an upgrade changes any of them, training must stop with a clear message
instead of silently using GRPO's advantages or a wrong proxy. ``tests/test_compat.py`` runs
this check too, so an upgrade fails the test suite loudly. docs/architecture.md lists each internal and its check.
"""

from __future__ import annotations

import inspect
import os
from importlib import resources

from .card import TEMPLATE_FRAGMENTS

SUPPORTED_TRL = "1.16"
SKIP_ENV = "TRL_OTB_SKIP_TRL_CHECK"

# method -> (parameters it must take, source fragments whose presence our code depends on). Two kinds of fragment:
# the calls and keys OTBTrainer's overrides hook into, and the TRL lines that trl_otb re-derives because TRL keeps
# their value local (each names the trl_otb function that mirrors it).
REQUIRED = {
    "_generate_and_score_completions": (
        ("self", "inputs"),
        (
            # Rewards are scored once for the whole (global) batch through this method...
            "self._calculate_rewards(inputs, prompts, completions, completion_ids_list)",
            # ...the rollout-time pass goes through the log-prob helper, under no_grad...
            "old_per_token_logps, _, _ = self._get_per_token_logps_and_entropies(",
            "with torch.no_grad()",
            # ...and these are the keys of the generation batch we read and replace.
            '"advantages": advantages',
            '"completion_mask": completion_mask',
            'output["tool_mask"] = tool_mask',
            'output["importance_sampling_ratio"] = vllm_importance_sampling_ratio',
            # Mirrored by OTBTrainer._otb_weighted_rewards: the weighted sum, NaN where no function scored.
            "unscorable_mask = torch.isnan(rewards_per_func).all(dim=1)",
            "rewards = (rewards_per_func * self.reward_weights.to(device).unsqueeze(0)).nansum(dim=1)",
            "rewards[unscorable_mask] = torch.nan",
            # Mirrored by OTBTrainer._otb_can_collect_during_generation: when TRL runs its own rollout pass.
            "generate_every = self.args.steps_per_generation * self.num_iterations",
            "if self.args.gradient_accumulation_steps % generate_every != 0 or (",
            # Mirrored by OTBTrainer._otb_gather: this process's rows of the gathered batch.
            "self.accelerator.process_index * len(prompts),",
            "(self.accelerator.process_index + 1) * len(prompts),",
            # Replaced by OTBTrainer._otb_replace_table_advantages: one table entry per gathered completion.
            'self._logs["advantages"].extend(all_process_advantages.tolist())',
        ),
    ),
    "_calculate_rewards": (
        ("self", "inputs", "prompts", "completions", "completion_ids_list"),
        (
            # trl_otb.rewards.checked_reward_func: TRL tells async reward functions apart as the wrapper does, and
            # passes the completions by keyword (the wrapper counts them).
            "elif is_async_callable(reward_func):",
            "prompts=prompts, completions=completions, completion_ids=completion_ids_list, **reward_kwargs",
        ),
    ),
    # Mirrored by check_datasets (trl_otb/inputs.py): a generation batch takes this many prompts (and RepeatSampler
    # yields only whole batches, checked below).
    "_get_train_sampler": (("self",), ("batch_size=self.args.generation_batch_size // self.num_generations",)),
    # transformers' Trainer: the gradient norm of each optimizer step passes through it (OTBTrainer warns when it is
    # not finite, and counts it in otb/nonfinite_grad_norm).
    "_get_grad_norm": (("self", "model", "grad_norm"), ()),
    # Single-turn HF generation calls `generate` on the model with TRL's config (statistics collected while sampling).
    "_generate_single_turn": (
        ("self", "prompt_ids"),
        ("unwrapped_model.generate(", "generation_config=self.generation_config"),
    ),
    "__init__": (
        ("self", "model", "reward_funcs", "args"),
        (
            "self.rollout_func = rollout_func",
            "self.generation_config = GenerationConfig(",
            "self.use_transformers_continuous_batching = ",
            # TRL refuses Liger's fused linear cross-entropy, which would drop the fused head and its sum pi^2.
            'if liger_kernel_config.get("fused_linear_cross_entropy"):',
        ),
    ),
    # trainer._FORWARD_KEYS are this method's parameters after the ones every call passes.
    "_get_per_token_logps_and_entropies": (
        ("self", "model", "input_ids", "attention_mask", "logits_to_keep", "batch_size"),
        ("fused_lm_head=True", "outputs.log_probs[:, -logits_to_keep:]"),
    ),
    "_compute_loss": (
        ("self", "model", "inputs"),
        (
            # [B, T] advantages are used elementwise; 1-D ones are unsqueezed.
            "if advantages.dim() == 1:",
            # Mirrored by trainer._loss_mask: the tokens that carry gradient.
            'mask = completion_mask if "tool_mask" not in inputs else completion_mask * inputs["tool_mask"]',
        ),
    ),
    # Checkpoint saves and push_to_hub write the card through this method; OTBTrainer lets it write TRL's card, then
    # extends the file it saved (trl_otb.card.extend_model_card).
    "create_model_card": (
        ("self", "model_name", "dataset_name", "tags"),
        ('model_card.save(os.path.join(self.args.output_dir, "README.md"))',),
    ),
}

# (method, earlier fragment, later fragment): capture.BatchCapture.rollout_pass takes TRL's rollout pass to be the
# first log-prob pass of a batch, before any reference-model pass.
REQUIRED_ORDER = (
    (
        "_generate_and_score_completions",
        "old_per_token_logps, _, _ = self._get_per_token_logps_and_entropies(",
        "ref_per_token_logps, _, _ = self._get_per_token_logps_and_entropies(",
    ),
)

# RepeatSampler drops an incomplete generation batch, so a training set smaller than one trains 0 steps
# (trl_otb.inputs.check_datasets refuses it).
WHOLE_BATCHES_ONLY = "indexes = [chunk for chunk in indexes if len(chunk) == self.batch_size]"


class TRLCompatibilityError(RuntimeError):
    """The installed TRL differs from the one trl-otb was built and tested against."""


def check_trl_compatibility(base: type | None = None) -> None:
    """Raise :class:`TRLCompatibilityError` if the GRPOTrainer internals OTB depends on changed.

    ``base`` is the class whose methods are checked: the one OTBTrainer subclasses (default: TRL's GRPOTrainer from
    its own module, not the ``trl.GRPOTrainer`` name, which a harness may have aliased to OTBTrainer). Set ``TRL_OTB_SKIP_TRL_CHECK=1`` to skip the check at your own risk.
    """
    if os.environ.get(SKIP_ENV) == "1":
        return
    import trl
    from trl.trainer.utils import FusedCausalLMOutput, RepeatSampler, add_fused_lm_head

    if base is None:
        from trl.trainer.grpo_trainer import GRPOTrainer as base

    problems = []
    if not trl.__version__.startswith(SUPPORTED_TRL + "."):
        problems.append(f"trl {trl.__version__} is installed; trl-otb supports trl {SUPPORTED_TRL}.x")
    for name, (params, fragments) in REQUIRED.items():
        method = getattr(base, name, None)
        if method is None:
            problems.append(f"GRPOTrainer.{name} no longer exists")
            continue
        have = list(inspect.signature(method).parameters)
        missing = [p for p in params if p not in have]
        if missing:
            problems.append(f"GRPOTrainer.{name} lost parameter(s) {missing}")
        source = inspect.getsource(method)
        for fragment in fragments:
            if fragment not in source:
                problems.append(f"GRPOTrainer.{name} no longer contains `{fragment}`")
    for name, first, then in REQUIRED_ORDER:
        source = inspect.getsource(getattr(base, name))
        if first in source and then in source and source.index(first) > source.index(then):
            problems.append(f"GRPOTrainer.{name} no longer runs `{first.strip()}` before `{then.strip()}`")
    if "outputs" not in inspect.signature(add_fused_lm_head).parameters:
        problems.append("trl.trainer.utils.add_fused_lm_head no longer takes `outputs`")
    if "log_sum_sq_probs" not in FusedCausalLMOutput.__dataclass_fields__:
        problems.append("FusedCausalLMOutput no longer has `log_sum_sq_probs`")
    if WHOLE_BATCHES_ONLY not in inspect.getsource(RepeatSampler.__iter__):
        problems.append(f"trl.trainer.utils.RepeatSampler no longer contains `{WHOLE_BATCHES_ONLY}`")
    # The card template TRL's create_model_card renders (its default when the trainer names none).
    template = resources.files("trl").joinpath("templates", base._template_file or "lm_model_card.md")
    text = template.read_text() if template.is_file() else ""
    missing = [fragment for fragment in TEMPLATE_FRAGMENTS if fragment not in text]
    problems += [f"TRL's card template {template.name} no longer contains `{fragment}`" for fragment in missing]
    if problems:
        raise TRLCompatibilityError(
            "OTBTrainer relies on GRPOTrainer internals that changed:\n  - "
            + "\n  - ".join(problems)
            + f"\nInstall a supported TRL (pip install 'trl>={SUPPORTED_TRL}.0,<1.17'), or set {SKIP_ENV}=1 to "
            "skip this check at your own risk."
        )
