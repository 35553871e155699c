"""OTBTrainer: TRL's GRPOTrainer with the Optimal Token Baseline.

Only two things change in a training step (see docs/method.md):

1. the rollout-time no-grad pass also returns log sum_v pi(v)^2, from TRL's fused LM head, at the
   sampling temperature (it rides along when TRL already runs that pass);
2. the advantages returned by ``_generate_and_score_completions`` are replaced by token-level
   ``[B, T]`` ones from :func:`trl_otb.compute_advantages`, computed on whole groups gathered
   across processes and sliced back.

TRL's loss accepts ``[B, T]`` advantages as they are; everything else is TRL.
"""

from __future__ import annotations

import functools
import inspect
import textwrap
import warnings
from pathlib import Path

import torch
from accelerate.utils import is_peft_model
from transformers import LogitsProcessorList, TrainerCallback
from trl import GRPOConfig, GRPOTrainer
from trl.models.utils import disable_gradient_checkpointing
from trl.trainer.utils import add_fused_lm_head

from . import compat, sharding
from .baselines import compute_advantages
from .card import trainer_model_card
from .config import OTBConfig
from .fidelity import TRAINER_KEYS, batch_fidelity, low_fidelity_message
from .fidelity_bnb import guard_4bit_cpu_repack
from .metrics import otb_diagnostics
from .proxy import logit_gradient_proxy, uniform_proxy
from .rollout_stats import RolloutStatsCollector, scores_are_raw_logits

# Keys of the generation batch that TRL's own log-prob passes forward to the model (multimodal inputs).
_FORWARD_KEYS = (
    "pixel_values",
    "image_grid_thw",
    "num_images",
    "pixel_attention_mask",
    "spatial_shapes",
    "num_tiles",
    "image_sizes",
    "token_type_ids",
    "mm_token_type_ids",
    "image_position_ids",
)


class _RefuseLMHeadUnit(TrainerCallback):
    """Stops before the first step when FSDP2 made the LM head its own unit (sharding.LM_HEAD_UNIT_MESSAGE)."""

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if model is not None and sharding.lm_head_own_fsdp2_unit(model):
            raise ValueError(sharding.LM_HEAD_UNIT_MESSAGE)


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
        super().__init__(model, reward_funcs, args=args, **kwargs)
        # bitsandbytes repacks 4-bit CPU weights after an eval-mode no-grad forward (generation), and adapter
        # gradients through them are wrong from then on: keep them on the differentiable path.
        guard_4bit_cpu_repack(self.model)
        self._otb_engine = sharding.engine(self.accelerator)
        if self._otb_engine == "fsdp2":
            self.add_callback(_RefuseLMHeadUnit())
        if args.otb_fidelity_check_steps and self._otb_engine is not None:
            if self._otb_engine == "fsdp1":
                raise ValueError(
                    "otb_fidelity_check_steps > 0 runs under FSDP2 and DeepSpeed ZeRO-3, not FSDP1 (it gathers the "
                    "sharded parameters into a full copy). Set fsdp_version: 2 in the accelerate config, or "
                    "otb_fidelity_check_steps=0."
                )
            if is_peft_model(self.model):
                raise ValueError(
                    f"otb_fidelity_check_steps > 0 with a PEFT model is not supported under {self._otb_engine} "
                    "(the check copies the sharded model into a plain one, which is implemented for full fine-tuning "
                    "only). Set otb_fidelity_check_steps=0, or run the check without sharding (`trl-otb fidelity`)."
                )
        self._otb_sink = None  # list while a generation batch is scored: (logps, log_sum_sq_probs) per pass
        self._otb_chunks = None  # list while one armed log-prob pass runs: log_sum_sq_probs per chunk
        self._otb_rewards_per_func = None
        self._otb_collector = None  # RolloutStatsCollector of the last single-turn HF generate, if any
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
            self.model.register_forward_hook(self._otb_capture_hook)

    # Introspection (IDEs, docs) shows every GRPOTrainer argument: __init__ passes them all through.
    __init__.__signature__ = inspect.signature(GRPOTrainer.__init__)

    @property
    def _otb_needs_sum_pi_sq(self) -> bool:
        return self.args.otb_proxy == "logit" and self.args.advantage_estimator in ("otb", "ogb")

    # --- arrow 1: sum pi^2 from the rollout-time pass -------------------------------------------------------------

    def _otb_capture_hook(self, module, args, output):
        if self._otb_chunks is None:
            return
        log_sum_sq = getattr(output, "log_sum_sq_probs", None)
        if log_sum_sq is None:
            raise RuntimeError(
                "The model's fused LM head returned no log_sum_sq_probs, so the OTB proxy cannot be formed. Something "
                "replaced the forward that OTBTrainer patched (e.g. a fused-loss kernel); remove it, or set "
                "otb_proxy='uniform'."
            )
        self._otb_chunks.append(log_sum_sq)

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, *args, **kwargs):
        if self._otb_sink is None or torch.is_grad_enabled():
            return super()._get_per_token_logps_and_entropies(
                model, input_ids, attention_mask, logits_to_keep, *args, **kwargs
            )
        self._otb_chunks = []
        try:
            result = super()._get_per_token_logps_and_entropies(
                model, input_ids, attention_mask, logits_to_keep, *args, **kwargs
            )
            chunks = self._otb_chunks
        finally:
            self._otb_chunks = None
        if chunks:
            self._otb_sink.append((result[0], torch.cat([c[:, -logits_to_keep:] for c in chunks], dim=0)))
        return result

    def _otb_can_collect_during_generation(self) -> bool:
        """Single-turn HF `generate` whose scores are plain logits: the statistics can be read while sampling."""
        model_config = getattr(self.model, "generation_config", None)
        # When generation and optimizer steps are misaligned TRL runs its own rollout pass: the statistic rides there.
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

    def _generate_single_turn(self, *args, **kwargs):
        self._otb_collector = None
        if not self._otb_can_collect_during_generation():
            return super()._generate_single_turn(*args, **kwargs)
        collector = RolloutStatsCollector(self.temperature)
        had_own = "generate" in self.model.__dict__
        original = self.model.generate
        self.model.generate = functools.partial(original, logits_processor=LogitsProcessorList([collector]))
        try:
            result = super()._generate_single_turn(*args, **kwargs)
        finally:
            if had_own:
                self.model.generate = original
            else:
                del self.model.generate
        self._otb_collector = collector
        return result

    def _otb_rollout_stats(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """log pi(y_t) and log sum pi^2 of the generation batch, from the cheapest source available:
        TRL's own rollout pass, else the statistics recorded while sampling, else one no-grad pass."""
        old = batch.get("old_per_token_logps")
        for logps, log_sum_sq in self._otb_sink or ():
            if old is not None and logps is old:
                return logps, log_sum_sq
        collector, self._otb_collector = self._otb_collector, None
        if collector is not None:
            stats = collector.finish(batch["completion_ids"])
            if stats is not None:
                return stats
        mode = "train" if self.model.training else "eval"
        batch_size = self.args.per_device_train_batch_size if mode == "train" else self.args.per_device_eval_batch_size
        input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
        attention_mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
        forward_kwargs = {k: batch[k] for k in _FORWARD_KEYS if k in batch}
        self._otb_sink = []
        try:
            with torch.no_grad(), disable_gradient_checkpointing(self.model, self.args.gradient_checkpointing_kwargs):
                self._get_per_token_logps_and_entropies(
                    self.model,
                    input_ids,
                    attention_mask,
                    batch["completion_ids"].size(1),
                    batch_size=batch_size,
                    **forward_kwargs,
                )
            return self._otb_sink[0]
        finally:
            self._otb_sink = None

    # --- arrow 2: token-level advantages -------------------------------------------------------------------------

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._otb_rewards_per_func = rewards_per_func  # [B_global, n_funcs], NaN where a function returned None
        return rewards_per_func

    def _generate_and_score_completions(self, inputs):
        self._otb_sink = [] if self._otb_needs_sum_pi_sq else None
        try:
            batch = super()._generate_and_score_completions(inputs)
            proxy = self._otb_local_proxy(batch)
        finally:
            self._otb_sink = None
        advantages, diagnostics = self._otb_advantages(batch, proxy)
        batch["advantages"] = advantages
        mode = "train" if self.model.training else "eval"
        for name, value in diagnostics.items():
            self._metrics[mode][f"otb/{name}"].append(value)
        every = self.args.otb_fidelity_check_steps
        if mode == "train" and every and self.state.global_step % every == 0:
            self._otb_fidelity(batch)
        return batch

    def _otb_fidelity(self, batch: dict) -> None:
        """Proxy vs exact per-token gradient norms on a few rows of this process (docs/fidelity.md)."""
        rows = self._otb_rows(batch)
        # Under FSDP2/ZeRO-3 each rank holds a slice of every parameter: gather them into a plain copy (collective).
        model = self.model if self._otb_engine is None else sharding.full_replica(self.model, self._otb_engine)
        local = batch_fidelity(
            model,
            batch,
            self._otb_loss_mask(batch),
            self._otb_rewards()[rows],
            self.args.otb_fidelity_rows,
            self.temperature,
            first_row=rows.start,
            num_generations=self.num_generations,
        )
        values = self.accelerator.gather(torch.tensor([local], device=self.accelerator.device)).nanmean(0).tolist()
        for key, value in zip(TRAINER_KEYS, values):
            self._metrics["train"][f"otb/fidelity/{key}"].append(value)
        energy, threshold = values[TRAINER_KEYS.index("energy_spearman")], self.args.otb_fidelity_min_energy_spearman
        if self.accelerator.is_main_process and energy < threshold:
            warnings.warn(low_fidelity_message(energy, self.state.global_step, threshold), stacklevel=2)

    def _otb_local_proxy(self, batch: dict) -> torch.Tensor:
        if not self._otb_needs_sum_pi_sq:
            return uniform_proxy(batch["completion_mask"])
        logps, log_sum_sq = self._otb_rollout_stats(batch)
        # Positions whose label is -100 hold 0 in log space; the mask removes them downstream.
        return logit_gradient_proxy(logps, torch.exp(log_sum_sq.float()))

    def _otb_rewards(self) -> torch.Tensor:
        """[B_global] weighted reward sum, NaN where every reward function returned None (as TRL does)."""
        rewards_per_func = self._otb_rewards_per_func
        rewards = (rewards_per_func * self.reward_weights.to(rewards_per_func.device).unsqueeze(0)).nansum(dim=1)
        rewards[torch.isnan(rewards_per_func).all(dim=1)] = torch.nan
        return rewards

    @staticmethod
    def _otb_loss_mask(batch: dict) -> torch.Tensor:
        """Tokens that carry gradient: the completion without tool output (TRL's loss mask)."""
        tool_mask = batch.get("tool_mask")
        return batch["completion_mask"] if tool_mask is None else batch["completion_mask"] * tool_mask

    def _otb_rows(self, batch: dict) -> slice:
        """This process's rows of the gathered generation batch."""
        n = batch["completion_ids"].size(0)
        return slice(self.accelerator.process_index * n, (self.accelerator.process_index + 1) * n)

    def _otb_gather(self, x: torch.Tensor, pad_value=0) -> torch.Tensor:
        """[B_local, T_local] on each process -> [B_global, T_max] on every process."""
        x = self.accelerator.pad_across_processes(x, dim=1, pad_index=pad_value)
        return self.accelerator.gather(x)

    def _otb_advantages(self, batch: dict, proxy: torch.Tensor) -> tuple[torch.Tensor, dict]:
        args = self.args
        mode = "train" if self.model.training else "eval"
        num_generations = self.num_generations if mode == "train" else self.num_generations_eval
        T_local = batch["completion_ids"].size(1)
        mask = self._otb_loss_mask(batch)
        tool_mask = batch.get("tool_mask")
        is_weights = batch.get("importance_sampling_ratio")
        if is_weights is not None:
            # Masked importance-sampling modes zero a ratio: those tokens (or sequences) leave their group.
            mask = mask * (is_weights > 0).to(mask.dtype)
        align = args.otb_align or ("valid" if tool_mask is not None else "position")

        rewards = self._otb_rewards()

        g_mask = self._otb_gather(mask.to(torch.float32))
        g_proxy = self._otb_gather(proxy.to(torch.float32))
        g_is = None if is_weights is None else self._otb_gather(is_weights.to(torch.float32), pad_value=1.0)
        group_ids = torch.arange(g_mask.size(0), device=g_mask.device) // num_generations
        rows = self._otb_rows(batch)

        if args.advantage_estimator == "grpo":
            # TRL's own group-normalised advantages (all its scaling and aggregation options), made token-level.
            local = batch["advantages"][:, None] * mask.to(torch.float32)
            g_adv = self._otb_gather(local)
        else:
            g_adv = compute_advantages(
                args.advantage_estimator,
                rewards.to(g_proxy.device),
                g_proxy,
                g_mask,
                group_ids,
                eps=args.otb_epsilon,
                tail=args.otb_tail,
                is_weights=g_is,
                align=align,
                leave_one_out=args.otb_leave_one_out,
            )
        diagnostics = otb_diagnostics(rewards.to(g_proxy.device), g_adv, g_proxy, g_mask, group_ids)
        self._otb_log_table_advantages(g_adv, g_mask)
        return g_adv[rows, :T_local].contiguous(), diagnostics

    def _otb_log_table_advantages(self, g_adv: torch.Tensor, g_mask: torch.Tensor) -> None:
        """The completions table shows one advantage per completion: use the token mean of ours, not TRL's."""
        per_sequence = (g_adv * g_mask).sum(1) / g_mask.sum(1).clamp(min=1)
        table = self._logs["advantages"]
        for _ in range(min(len(table), per_sequence.numel())):
            table.pop()
        table.extend(per_sequence.tolist())

    def create_model_card(
        self,
        model_name: str | None = None,
        dataset_name: str | None = None,
        tags: str | list[str] | None = None,
        **card,
    ) -> None:
        """Write ``README.md`` in ``output_dir``: the card of :func:`trl_otb.card.trainer_model_card`.

        TRL's arguments (``dataset_name`` is a Hub dataset id), plus the keyword arguments of ``trainer_model_card``
        (``base_model``, ``dataset_description``, ``results``, ``summary``); ``push_to_hub`` passes its extra keyword
        arguments here.
        """
        if self.is_world_process_zero():
            readme = Path(self.args.output_dir) / "README.md"
            trainer_model_card(self, model_name=model_name, dataset_name=dataset_name, tags=tags, **card).save(readme)
