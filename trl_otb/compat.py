"""The TRL internals OTBTrainer relies on, checked before training starts.

TRL has no advantage hook, so OTBTrainer overrides a few private GRPOTrainer methods and reads a
few private attributes. If an upgrade changes any of them, training must stop with a clear message
instead of silently using GRPO's advantages or a wrong proxy. ``tests/test_compat.py`` runs this
check too, so an upgrade fails the test suite loudly.
"""

from __future__ import annotations

import inspect
import os

SUPPORTED_TRL = "1.16"
SKIP_ENV = "TRL_OTB_SKIP_TRL_CHECK"

# method -> (parameters it must take, source fragments whose presence our override depends on)
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
            'self._logs["advantages"].extend(',
        ),
    ),
    "_calculate_rewards": (("self", "inputs", "prompts", "completions", "completion_ids_list"), ()),
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
        ),
    ),
    "_get_per_token_logps_and_entropies": (
        ("self", "model", "input_ids", "attention_mask", "logits_to_keep", "batch_size"),
        ("fused_lm_head=True", "outputs.log_probs[:, -logits_to_keep:]"),
    ),
    # [B, T] advantages are used elementwise; 1-D ones are unsqueezed.
    "_compute_loss": (("self", "model", "inputs"), ("if advantages.dim() == 1:",)),
    # Checkpoint saves and push_to_hub write the card through this method; OTBTrainer writes its own card.
    "create_model_card": (("self", "model_name", "dataset_name", "tags"), ()),
}


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
    from trl.trainer.utils import FusedCausalLMOutput, add_fused_lm_head

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
    if "outputs" not in inspect.signature(add_fused_lm_head).parameters:
        problems.append("trl.trainer.utils.add_fused_lm_head no longer takes `outputs`")
    if "log_sum_sq_probs" not in FusedCausalLMOutput.__dataclass_fields__:
        problems.append("FusedCausalLMOutput no longer has `log_sum_sq_probs`")
    if problems:
        raise TRLCompatibilityError(
            "OTBTrainer relies on GRPOTrainer internals that changed:\n  - "
            + "\n  - ".join(problems)
            + f"\nInstall a supported TRL (pip install 'trl>={SUPPORTED_TRL}.0,<1.17'), or set {SKIP_ENV}=1 to "
            "skip this check at your own risk."
        )
