"""OTBTrainer: TRL's GRPOTrainer with the Optimal Token Baseline.

Only two things change in a training step (see docs/method.md):

1. the rollout-time no-grad pass also returns log sum_v pi(v)^2, from TRL's fused LM head, at the
   sampling temperature (it rides along when TRL already runs that pass);
2. the advantages returned by ``_generate_and_score_completions`` are replaced by token-level
   ``[B, T]`` ones from :func:`trl_otb.compute_advantages`, computed on whole groups gathered
   across processes and sliced back.

TRL's loss accepts ``[B, T]`` advantages as they are; everything else is TRL, but for a NaN or +-inf reward, which
makes its completion unscorable (``_calculate_rewards``, :mod:`.rewards`), and inputs TRL would fail on late, checked
early (:mod:`.inputs`).
"""

from __future__ import annotations

import contextlib
import inspect
import math
import textwrap
import warnings
import weakref
from pathlib import Path

import torch
from accelerate.utils import is_peft_model
from datasets import IterableDataset
from huggingface_hub import ModelCard
from trl import GRPOConfig, GRPOTrainer
from trl.models.utils import disable_gradient_checkpointing
from trl.trainer.utils import add_fused_lm_head

from . import compat, sharding
from .bnb import guard_4bit_cpu_repack
from .capture import BatchCapture, GatheredGroups, LogProbPass, recording_hook
from .card import extend_model_card
from .config import OTBConfig
from .core import ESTIMATORS, compute_advantages, logit_gradient_proxy, otb_diagnostics, uniform_proxy
from .fidelity.training import TRAINER_KEYS, batch_fidelity, low_fidelity_message
from .inputs import EmptyTrainingGuard, check_batch_prompts, check_datasets, warn_nonfinite_grad_norm
from .quiet import quiet_checkpointing_aliases
from .rewards import REWARD_LIMIT, checked_reward_funcs, local_nan_flags, screen_rewards
from .rollout_stats import RolloutStatsCollector, collecting_while_generating, scores_are_raw_logits

# The generation batch's multimodal inputs that TRL's log-prob helper forwards to the model: its parameters after the
# ones every call passes (input_ids, attention_mask, logits_to_keep, batch_size) and its two switches.
_FORWARD_KEYS = tuple(
    name
    for name in inspect.signature(GRPOTrainer._get_per_token_logps_and_entropies).parameters
    if name not in ("self", "model", "input_ids", "attention_mask", "logits_to_keep", "batch_size")
    and not name.startswith("compute_")
)


_HOOK_ATTR = "_trl_otb_forward_hook"
"""The model attribute holding the forward hook's handle of the OTBTrainer last built on it (None if it needs none)."""


def _loss_mask(batch: dict) -> torch.Tensor:
    """The tokens that carry gradient: the completion without tool output (TRL's loss mask, compat.REQUIRED)."""
    mask = batch["completion_mask"]
    return mask if "tool_mask" not in batch else mask * batch["tool_mask"]


class OTBTrainer(GRPOTrainer):
    """[`trl.GRPOTrainer`] whose advantages come from the Optimal Token Baseline.

    Takes exactly GRPOTrainer's arguments; ``args`` must be an [`OTBConfig`] (or ``None``).
    ``advantages`` in the generation batch are ``[B, T]``, aligned with ``completion_ids``.
    Diagnostics are logged under ``otb/``.
    """

    _tag_names = ["trl", "grpo", "otb"]
    _name = "OTB"
    _paper = {
        "title": "The Optimal Token Baseline: Variance Reduction for Long-Horizon LLM-RL",
        "id": "2602.07078",
        # docstyle-ignore
        "citation": textwrap.dedent("""\
            @article{li2026optimal,
                title        = {{The Optimal Token Baseline: Variance Reduction for Long-Horizon LLM-RL}},
                author       = {Li et al.},
                year         = 2026,
                eprint       = {arXiv:2602.07078},
            }"""),
    }

    def __init__(self, model, reward_funcs=None, args: OTBConfig | None = None, **kwargs):
        compat.check_trl_compatibility(GRPOTrainer)  # the class we subclass, whatever `trl.GRPOTrainer` is now
        if args is None:
            name = model if isinstance(model, str) else model.config._name_or_path
            args = OTBConfig(f"{str(name).split('/')[-1]}-OTB")
        elif not isinstance(args, OTBConfig):
            kind = "GRPOConfig" if isinstance(args, GRPOConfig) else type(args).__name__
            raise TypeError(
                f"OTBTrainer needs an OTBConfig, got a {kind}. Build it with trl_otb.OTBConfig(...): it takes every "
                "GRPOConfig argument plus the OTB options."
            )
        self._otb_prompts_required = kwargs.get("environment_factory") is None  # else an environment supplies them
        check_datasets(kwargs.get("train_dataset"), kwargs.get("eval_dataset"), args, self._otb_prompts_required)
        with quiet_checkpointing_aliases():  # TRL's own calls of transformers' deprecated names
            super().__init__(model, reward_funcs, args=args, **kwargs)
        if isinstance(self.train_dataset, IterableDataset):
            self.add_callback(EmptyTrainingGuard())
        # bitsandbytes repacks 4-bit CPU weights after an eval-mode no-grad forward (generation), and adapter
        # gradients through them are wrong from then on: keep them on the differentiable path.
        guard_4bit_cpu_repack(self.model)
        self._otb_engine = sharding.engine(self.accelerator)
        if self._otb_engine == "fsdp2":
            self.add_callback(sharding.RefuseLMHeadUnit())
        if args.otb_fidelity_check_steps:
            sharding.check_fidelity_check_supported(self._otb_engine, is_peft_model(self.model))
        self._otb_capture: BatchCapture | None = None  # open only while TRL scores a generation batch
        # A trainer built earlier on this model object (a notebook cell run twice, a sweep in one process) stops
        # recording: its hook goes, so one hook remains and the old trainer can be collected.
        previous = getattr(self.model, _HOOK_ATTR, None)
        if previous is not None:
            previous.remove()
        self._otb_hook = None
        if self._otb_needs_sum_pi_sq:
            # TRL's fused head already accumulates sum exp(2(z - max)); ask it to return log sum pi^2 too.
            # Patching again wraps TRL's patch; only the fused call path changes.
            target = self.model.get_base_model() if is_peft_model(self.model) else self.model
            add_fused_lm_head(
                target,
                temperature=self.temperature,
                cast_lm_head_to_fp32=args.cast_lm_head_to_fp32,
                outputs=("log_probs", "entropy", "log_sum_sq_probs"),
            )
            # The hook holds the trainer weakly: the model must not keep a finished trainer alive.
            self._otb_hook = self.model.register_forward_hook(recording_hook(weakref.ref(self)))
        setattr(self.model, _HOOK_ATTR, self._otb_hook)  # _generate_and_score_completions checks it is still ours

    # Introspection (IDEs, docs) shows every GRPOTrainer argument: __init__ passes them all through.
    __init__.__signature__ = inspect.signature(GRPOTrainer.__init__)

    @property
    def _otb_needs_sum_pi_sq(self) -> bool:
        return self.args.otb_proxy == "logit" and ESTIMATORS[self.args.advantage_estimator].uses_proxy

    # --- one generation batch: TRL scores it while the capture is open, then OTB replaces its advantages ---------

    def _generate_and_score_completions(self, inputs):
        if self._otb_hook is not None and getattr(self.model, _HOOK_ATTR, None) is not self._otb_hook:
            raise RuntimeError(
                "This OTBTrainer's model was taken over by a newer OTBTrainer built on the same model object: that "
                "trainer removed this one's recording hook and patched the LM head for its own settings. Train the "
                "newest trainer, or build a new OTBTrainer to train this model again."
            )
        if self._otb_prompts_required:
            check_batch_prompts(inputs)
        mode = "train" if self.model.training else "eval"
        with self._otb_capturing() as capture, quiet_checkpointing_aliases():
            # TRL's method; the overrides below record into the capture whenever it calls them.
            batch = super()._generate_and_score_completions(inputs)
            proxy = self._otb_local_proxy(batch, capture)  # may run one more no-grad pass, into the capture
        groups = self._otb_gather(batch, proxy, self._otb_weighted_rewards(capture.rewards()))
        advantages = self._otb_estimate(groups)
        batch["advantages"] = advantages[groups.rows, : groups.width].contiguous()
        self._otb_log(groups, advantages, mode)
        every = self.args.otb_fidelity_check_steps
        if mode == "train" and every and self.state.global_step % every == 0:
            self._otb_fidelity(batch, groups)
        return batch

    @contextlib.contextmanager
    def _otb_capturing(self):
        if self._otb_capture is not None:
            raise RuntimeError("A generation batch is already being scored; OTBTrainer scores one at a time.")
        self._otb_capture = BatchCapture(wants_sum_pi_sq=self._otb_needs_sum_pi_sq)
        try:
            yield self._otb_capture
        finally:
            self._otb_capture = None

    # --- the overrides: each records into the open capture and otherwise is TRL's method, except that ---------
    # --- _calculate_rewards checks the outputs and makes a completion with a NaN or +-inf reward unscorable ----

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        """TRL's ``[B_global, n_funcs]``, outputs checked as TRL reads them; ``reward_funcs`` stays TRL's list."""
        trl_funcs, returned_nan = self.reward_funcs, {}
        self.reward_funcs = checked_reward_funcs(trl_funcs, self.reward_func_names, len(prompts), returned_nan)
        try:
            rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        finally:
            self.reward_funcs = trl_funcs
        local_nan = local_nan_flags(returned_nan, len(prompts), len(trl_funcs), self.accelerator.device)
        rewards_per_func, counts = screen_rewards(
            rewards_per_func,
            self.reward_func_names,
            self.accelerator.gather(local_nan),
            is_model=[isinstance(func, torch.nn.Module) for func in trl_funcs],
            warn=self.accelerator.is_main_process,
            limit=None if self.args.advantage_estimator == "grpo" else REWARD_LIMIT,  # grpo stays GRPOTrainer's
        )
        for name, count in counts.items():
            self._metrics["train" if self.model.training else "eval"][f"otb/{name}"].append(float(count))
        if self._otb_capture is not None:
            self._otb_capture.rewards_per_func = rewards_per_func  # [B_global, n_funcs], NaN = unscorable
        return rewards_per_func

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, *args, **kwargs):
        capture = self._otb_capture
        if capture is None or not capture.wants_sum_pi_sq or torch.is_grad_enabled():
            return super()._get_per_token_logps_and_entropies(
                model, input_ids, attention_mask, logits_to_keep, *args, **kwargs
            )
        capture.begin_pass()
        result = None
        try:
            result = super()._get_per_token_logps_and_entropies(
                model, input_ids, attention_mask, logits_to_keep, *args, **kwargs
            )
        finally:
            capture.end_pass(None if result is None else result[0], logits_to_keep)
        return result

    def _generate_single_turn(self, *args, **kwargs):
        capture = self._otb_capture
        if capture is None or not self._otb_can_collect_during_generation():
            return super()._generate_single_turn(*args, **kwargs)
        collector = RolloutStatsCollector(self.temperature)
        with collecting_while_generating(self.model, collector):
            result = super()._generate_single_turn(*args, **kwargs)
        capture.sampling_stats = collector
        return result

    def _otb_can_collect_during_generation(self) -> bool:
        """Single-turn HF `generate` whose scores are plain logits: the statistics can be read while sampling."""
        model_config = getattr(self.model, "generation_config", None)
        # When generation and optimizer steps are misaligned TRL runs its own rollout pass (TRL's condition, checked
        # by compat.REQUIRED): the statistic rides there instead.
        trl_runs_pass = self.args.gradient_accumulation_steps % (self.args.steps_per_generation * self.num_iterations)
        return (
            self._otb_needs_sum_pi_sq
            and not trl_runs_pass
            and not self.use_vllm
            and not self.use_transformers_continuous_batching
            and not self.tools
            and self.rollout_func is None
            and scores_are_raw_logits(self.generation_config, model_config)
        )

    # --- arrow 1: the per-token proxy w_t of this process's rows ----------------------------------------------

    def _otb_local_proxy(self, batch: dict, capture: BatchCapture) -> torch.Tensor:
        """``[B_local, T_local]`` w_t from the cheapest source of log pi(y_t) and log sum pi^2: TRL's rollout pass,
        else the statistics recorded while sampling, else one more no-grad pass.

        Both come from one source, in one precision, and w_t is formed in fp32: from a pass, the fused head's outputs
        as the forward hook read them, not the log-probs TRL received (under FSDP2 mixed precision, accelerate <= 1.15
        casts those to bf16)."""
        if not capture.wants_sum_pi_sq:
            return uniform_proxy(batch["completion_mask"])
        stats = capture.rollout_pass(batch.get("old_per_token_logps"))
        if stats is None and capture.sampling_stats is not None:
            sampled = capture.sampling_stats.finish(batch["completion_ids"])  # None if it cannot be aligned
            stats = None if sampled is None else LogProbPass(*sampled)
        if stats is None:
            stats = self._otb_extra_pass(batch, capture)
        # Positions whose label is -100 hold 0 in log space; the mask removes them downstream.
        return logit_gradient_proxy(stats.logps, torch.exp(stats.log_sum_sq_probs.float()))

    def _otb_extra_pass(self, batch: dict, capture: BatchCapture) -> LogProbPass:
        train = self.model.training
        batch_size = self.args.per_device_train_batch_size if train else self.args.per_device_eval_batch_size
        forward_kwargs = {k: batch[k] for k in _FORWARD_KEYS if k in batch}
        with torch.no_grad(), disable_gradient_checkpointing(self.model, self.args.gradient_checkpointing_kwargs):
            self._get_per_token_logps_and_entropies(
                self.model,
                torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1),
                torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1),
                batch["completion_ids"].size(1),
                batch_size=batch_size,
                **forward_kwargs,
            )
        if not capture.passes:
            raise RuntimeError(
                "OTBTrainer's log-prob pass recorded no log_sum_sq_probs: the model's forward did not run through the "
                "fused LM head OTBTrainer patched. Set otb_proxy='uniform' if the model cannot use it."
            )
        return capture.passes[-1]

    # --- arrow 2: token-level advantages on whole groups: gather, estimate, log -------------------------------

    def _otb_weighted_rewards(self, rewards_per_func: torch.Tensor) -> torch.Tensor:
        """``[B_global]`` weighted reward sum, NaN where every reward function returned None (TRL's own sum, which
        it keeps local: compat.REQUIRED checks the lines mirrored here)."""
        rewards = (rewards_per_func * self.reward_weights.to(rewards_per_func.device).unsqueeze(0)).nansum(dim=1)
        rewards[torch.isnan(rewards_per_func).all(dim=1)] = torch.nan
        return rewards

    def _otb_gather(self, batch: dict, proxy: torch.Tensor, rewards: torch.Tensor) -> GatheredGroups:
        """Every process's rows, so that each group is whole (collective: every process calls it)."""
        mask = _loss_mask(batch)
        is_weights = batch.get("importance_sampling_ratio")
        if is_weights is not None:
            # Tokens whose importance ratio a masked mode zeroed leave their group (or their whole sequence does).
            mask = mask * (is_weights > 0).to(mask.dtype)
        num_generations = self.num_generations if self.model.training else self.num_generations_eval
        n = batch["completion_ids"].size(0)
        g_mask = self._otb_gather_padded(mask.to(torch.float32))
        trl_advantages = batch["advantages"] if self.args.advantage_estimator == "grpo" else None
        return GatheredGroups(
            rewards=rewards.to(g_mask.device),
            proxy=self._otb_gather_padded(proxy.to(torch.float32)),
            mask=g_mask,
            group_ids=torch.arange(g_mask.size(0), device=g_mask.device) // num_generations,
            is_weights=None if is_weights is None else self._otb_gather_padded(is_weights.float(), pad_value=1.0),
            trl_advantages=None if trl_advantages is None else self.accelerator.gather(trl_advantages),
            rows=slice(self.accelerator.process_index * n, (self.accelerator.process_index + 1) * n),
            width=batch["completion_ids"].size(1),
            align=self.args.otb_align or ("valid" if "tool_mask" in batch else "position"),
        )

    def _otb_gather_padded(self, x: torch.Tensor, pad_value=0) -> torch.Tensor:
        """[B_local, T_local] on each process -> [B_global, T_max] on every process."""
        return self.accelerator.gather(self.accelerator.pad_across_processes(x, dim=1, pad_index=pad_value))

    def _otb_estimate(self, groups: GatheredGroups) -> torch.Tensor:
        """``[B_global, T_max]`` advantages of the configured estimator."""
        name = self.args.advantage_estimator
        if name == "grpo":
            # TRL's own advantages, made token-level, not the registry's grpo_advantages: the arm is then
            # GRPOTrainer's, with every TRL scaling and aggregation option (grpo_advantages is the same
            # estimator outside a trainer; a test checks they agree on a real batch). One difference: a completion
            # with a +-inf reward reached TRL unscorable (_calculate_rewards), so it gets advantage 0 where
            # GRPOTrainer would give its whole group non-finite advantages.
            return groups.trl_advantages[:, None] * groups.mask
        options = self.args.estimator_options(align=groups.align)  # the alignment resolved for this batch
        if "is_weights" in ESTIMATORS[name].options:
            options["is_weights"] = groups.is_weights
        return compute_advantages(name, groups.rewards, groups.proxy, groups.mask, groups.group_ids, **options)

    def _otb_log(self, groups: GatheredGroups, advantages: torch.Tensor, mode: str) -> None:
        """``otb/*`` metrics (no proxy statistics where the estimator uses no per-token weight), and the table's
        advantage column; leave-one-out baselines are compared with the others' mean (``otb_diagnostics``)."""
        proxy = groups.proxy if ESTIMATORS[self.args.advantage_estimator].uses_proxy else None
        loo = self.args.advantage_estimator == "rloo" or self.args.estimator_options().get("leave_one_out", False)
        stats = otb_diagnostics(groups.rewards, advantages, proxy, groups.mask, groups.group_ids, groups.align, loo)
        for name, value in stats.items():
            self._metrics[mode][f"otb/{name}"].append(value)
        self._otb_replace_table_advantages(advantages, groups.mask)

    def _otb_replace_table_advantages(self, advantages: torch.Tensor, mask: torch.Tensor) -> None:
        """TRL appended one advantage per gathered completion (its own) to the completions table; replace those
        entries by the token mean of ours (compat.REQUIRED checks TRL's line)."""
        per_sequence = (advantages * mask).sum(1) / mask.sum(1).clamp(min=1)
        table = self._logs["advantages"]
        for _ in range(min(len(table), per_sequence.numel())):
            table.pop()
        table.extend(per_sequence.tolist())

    # --- the optimizer step: transformers' gradient norm, with a non-finite one warned and counted ----------------

    def _get_grad_norm(self, model, grad_norm=None):
        """transformers' gradient norm of this optimizer step; a non-finite one is warned and counted
        (``otb/nonfinite_grad_norm``, the share of steps)."""
        grad_norm = super()._get_grad_norm(model, grad_norm=grad_norm)
        finite = grad_norm is None or math.isfinite(float(grad_norm))
        self._metrics["train"]["otb/nonfinite_grad_norm"].append(0.0 if finite else 1.0)
        if not finite and self.accelerator.is_main_process:
            warn_nonfinite_grad_norm(self.state.global_step + 1, float(grad_norm))
        return grad_norm

    # --- the in-training fidelity check -------------------------------------------------------------------------

    def _otb_fidelity(self, batch: dict, groups: GatheredGroups) -> None:
        """Proxy vs exact per-token gradient norms on a few rows of this process (docs/fidelity.md)."""
        # Under FSDP2/ZeRO-3 each rank holds a slice of every parameter: gather them into a plain copy (collective).
        model = self.model if self._otb_engine is None else sharding.full_replica(self.model, self._otb_engine)
        local = batch_fidelity(
            model,
            batch,
            _loss_mask(batch),
            groups.rewards[groups.rows],
            self.args.otb_fidelity_rows,
            self.temperature,
            first_row=groups.rows.start,
            num_generations=self.num_generations,
        )
        values = self.accelerator.gather(torch.tensor([local], device=self.accelerator.device)).nanmean(0).tolist()
        for key, value in zip(TRAINER_KEYS, values):
            self._metrics["train"][f"otb/fidelity/{key}"].append(value)
        energy, threshold = values[TRAINER_KEYS.index("energy_spearman")], self.args.otb_fidelity_min_energy_spearman
        if self.accelerator.is_main_process and energy < threshold:
            warnings.warn(low_fidelity_message(energy, self.state.global_step, threshold), stacklevel=2)

    def create_model_card(self, model_name=None, dataset_name=None, tags=None, **card) -> None:
        """TRL's card in ``output_dir/README.md``, extended by :func:`trl_otb.card.extend_model_card`.

        TRL's arguments (``model_name`` defaults to the output directory's name, as in TRL's checkpoint saves;
        ``dataset_name`` is a Hub dataset id), then ``extend_model_card``'s: what TRL cannot know (``base_model``,
        ``license``, ``eval_results``) and extra ``sections``. ``push_to_hub(**card)`` passes them here.
        """
        super().create_model_card(model_name or Path(self.args.output_dir).name, dataset_name, tags)
        if self.is_world_process_zero():
            readme = Path(self.args.output_dir) / "README.md"  # where TRL's method saves its card (compat.REQUIRED)
            extend_model_card(ModelCard.load(readme), self, **card).save(readme)
