"""What OTBTrainer records while TRL scores one generation batch, and the whole groups it then gathers.

TRL's GRPOTrainer has no advantage hook. Its ``_generate_and_score_completions`` calls three methods
that OTBTrainer overrides, and each override writes what OTB needs into one :class:`BatchCapture`,
opened for that batch only (``OTBTrainer._otb_capturing``) and dropped when the batch is scored:

============================================  =====================  ==========================================
TRL method (overridden)                       field                  what
============================================  =====================  ==========================================
``_calculate_rewards``                        ``rewards_per_func``   ``[B_global, n_funcs]``, NaN = no reward
``_generate_single_turn`` (HF ``generate``)   ``sampling_stats``     log pi(y_t), log sum pi^2 while sampling
``_get_per_token_logps_and_entropies``        ``passes``             one :class:`LogProbPass` per no-grad pass
============================================  =====================  ==========================================

After TRL returns, the trainer gathers every process's rows into :class:`GatheredGroups` (whole groups, on every
process), estimates the advantages on them and keeps its own rows. No TRL import.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .rollout_stats import RolloutStatsCollector

__all__ = ["BatchCapture", "GatheredGroups", "LogProbPass", "recording_hook"]


@dataclass(frozen=True)
class LogProbPass:
    """log pi(y_t) and log sum_v pi(v)^2, both ``[B, T]``, from one source and so in one precision.

    For a no-grad pass both are read by a forward hook from the same fused-head output (fp32 in TRL 1.16), and
    ``returned`` is what TRL received from that pass, which an engine may have cast since: accelerate <= 1.15's FSDP2
    casts the outputs of a bf16 run to bf16, so a proxy formed from ``returned`` would mix bf16 log pi with fp32
    sum pi^2. ``returned`` is None for the statistics read while sampling.
    """

    logps: torch.Tensor
    log_sum_sq_probs: torch.Tensor
    returned: torch.Tensor | None = None


@dataclass
class BatchCapture:
    """The statistics of one generation batch, filled by OTBTrainer's overrides while TRL runs.

    ``wants_sum_pi_sq``: whether the estimator uses the logit proxy, so log sum pi^2 must be recorded.
    """

    wants_sum_pi_sq: bool
    rewards_per_func: torch.Tensor | None = None
    sampling_stats: RolloutStatsCollector | None = None
    passes: list[LogProbPass] = field(default_factory=list)
    _chunks: list[tuple[torch.Tensor, torch.Tensor]] | None = None  # (log pi, log sum pi^2) per forward while armed

    # --- filled while TRL runs ---------------------------------------------------------------------------------

    def begin_pass(self) -> None:
        """A no-grad log-prob pass starts: arm :meth:`record_forward`."""
        self._chunks = []

    def record_forward(self, output) -> None:
        """Forward hook body: keep the fused head's ``log_probs`` and ``log_sum_sq_probs`` while a pass is armed."""
        if self._chunks is None:
            return
        log_sum_sq = getattr(output, "log_sum_sq_probs", None)
        if log_sum_sq is None:
            raise RuntimeError(
                "The model's fused LM head returned no log_sum_sq_probs, so the OTB proxy cannot be formed. Something "
                "replaced the forward that OTBTrainer patched (e.g. a fused-loss kernel); remove it, or set "
                "otb_proxy='uniform'."
            )
        self._chunks.append((output.log_probs, log_sum_sq))

    def end_pass(self, returned: torch.Tensor | None, logits_to_keep: int) -> None:
        """The pass returned ``returned`` (None if it raised): store it with its chunks, disarm."""
        chunks, self._chunks = self._chunks, None
        if returned is None or not chunks:
            return
        logps, log_sum_sq = (torch.cat([c[i][:, -logits_to_keep:] for c in chunks], dim=0) for i in range(2))
        if logps.shape != returned.shape:
            raise RuntimeError(
                f"The fused head's forwards gave log-probs of shape {tuple(logps.shape)} but TRL's log-prob pass "
                f"returned {tuple(returned.shape)}: the TRL internals changed (see trl_otb/compat.py)."
            )
        self.passes.append(LogProbPass(logps, log_sum_sq, returned))

    # --- read after TRL returned -------------------------------------------------------------------------------

    def rewards(self) -> torch.Tensor:
        """``[B_global, n_funcs]`` rewards TRL computed for this batch."""
        if self.rewards_per_func is None:
            raise RuntimeError(
                "TRL scored this generation batch without calling _calculate_rewards, so OTB has no rewards for it "
                "(the TRL internals changed; see trl_otb/compat.py)."
            )
        return self.rewards_per_func

    def rollout_pass(self, old_per_token_logps: torch.Tensor | None) -> LogProbPass | None:
        """TRL's own rollout-time pass, if it ran one (``old_per_token_logps`` is then what it returned).

        TRL 1.16 runs it before any reference-model pass (``compat.REQUIRED_ORDER`` checks the order), so it is
        the first pass recorded; the identity check makes a change of order fail instead of using the wrong pass.
        """
        if old_per_token_logps is None or not self.passes:
            return None
        first = self.passes[0]
        if first.returned is not old_per_token_logps:
            raise RuntimeError(
                "The first log-prob pass of this generation batch is not TRL's rollout pass (old_per_token_logps); "
                "the TRL internals changed (see trl_otb/compat.py)."
            )
        return first


@dataclass(frozen=True)
class GatheredGroups:
    """The generation batch of every process, so that each group is whole: ``B = B_global``, ``T = T_max``.

    ``rewards [B]`` (NaN = unscorable), ``proxy``, ``mask`` (TRL's loss mask, less tokens whose importance ratio a
    masked mode zeroed) and ``is_weights`` (or None) ``[B, T]`` fp32, ``group_ids [B]``, ``trl_advantages [B]`` (TRL's
    own, kept for ``advantage_estimator="grpo"``, else None). ``rows`` is this process's slice, ``width`` its
    ``T_local``; ``align`` the OTB alignment to use.
    """

    rewards: torch.Tensor
    proxy: torch.Tensor
    mask: torch.Tensor
    group_ids: torch.Tensor
    is_weights: torch.Tensor | None
    trl_advantages: torch.Tensor | None
    rows: slice
    width: int
    align: str


def recording_hook(trainer_ref):
    """A forward hook for the model: the fused head's output goes into the open :class:`BatchCapture` of the trainer
    ``trainer_ref`` refers to (a ``weakref.ref``, so that the model does not keep a finished trainer alive), while it
    lives."""

    def hook(module, args, output):
        trainer = trainer_ref()
        if trainer is not None and trainer._otb_capture is not None:
            trainer._otb_capture.record_forward(output)

    return hook
