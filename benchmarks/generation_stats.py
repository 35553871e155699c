"""Prototype: OTB's rollout statistics collected during generation, so on-policy OTB needs no extra forward.

On-policy, TRL runs no log-prob pass at rollout time, and OTBTrainer runs one (a no-grad forward over prompt +
completion) for pi(y_t) and sum_v pi(v)^2. Sampling already computes the distribution these come from. This
prototype hands ``generate`` a logits processor that, at every decoding step, reads the scores, applies the
temperature (exact when nothing else changes the distribution: TRL's defaults ``top_k=0, top_p=1, min_p=None``,
no repetition penalty) and records log sum pi^2 and, one step later, log pi of the token that was sampled.

``GenerationStatsOTBTrainer`` wires it in by subclassing OTBTrainer (for the benchmark only; the change it implies
for ``trl_otb/trainer.py`` is described in docs/benchmarks.md). It falls back to the trainer's own pass whenever
the statistics do not line up with the batch (vLLM, tool calls, several generate calls).
"""

from __future__ import annotations

import torch
from transformers import LogitsProcessor, LogitsProcessorList

from trl_otb import OTBTrainer


class RolloutStatsProcessor(LogitsProcessor):
    """Records, per generated position, log pi(y_t) and log sum_v pi(v)^2 of the distribution sampled from."""

    def __init__(self, temperature: float = 1.0):
        # transformers runs a user's processors before its sampling warpers (temperature, top-k, top-p), so the
        # scores arrive untempered: divide here.
        self.temperature = temperature
        self.log_sum_sq, self.logps = [], []
        self._last = None  # log_softmax of the previous step, read once its token is known

    def __call__(self, input_ids, scores):
        logp = torch.log_softmax(scores.float() / self.temperature, dim=-1)
        if self._last is not None:
            self.logps.append(self._last.gather(1, input_ids[:, -1:]).squeeze(1))
        self.log_sum_sq.append(torch.logsumexp(2 * logp, dim=-1))
        self._last = logp
        return scores

    def finish(self, last_tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """[B, T] log pi(y_t) and log sum pi^2, given the tokens sampled at the last step."""
        if self._last is not None:
            self.logps.append(self._last.gather(1, last_tokens[:, None]).squeeze(1))
            self._last = None
        return torch.stack(self.logps, dim=1), torch.stack(self.log_sum_sq, dim=1)


class GenerationStatsOTBTrainer(OTBTrainer):
    """OTBTrainer that takes pi(y_t) and sum pi^2 from generation when TRL runs no rollout log-prob pass."""

    _gen_stats = None

    def _generate_and_score_completions(self, inputs):
        processor = RolloutStatsProcessor(self.temperature)
        model = self.accelerator.unwrap_model(self.model)
        original = model.generate
        outputs = {}

        def generate(*args, **kwargs):
            kwargs["logits_processor"] = LogitsProcessorList([*(kwargs.get("logits_processor") or []), processor])
            out = original(*args, **kwargs)
            outputs["count"] = outputs.get("count", 0) + 1
            outputs["last"] = out[:, -1]
            return out

        model.generate = generate
        try:

            def capture(batch):
                if outputs.get("count") == 1 and processor.log_sum_sq:
                    return processor.finish(outputs["last"])
                return None

            self._gen_stats = capture
            return super()._generate_and_score_completions(inputs)
        finally:
            del model.generate  # back to the class's method
            self._gen_stats = None

    def _otb_rollout_stats(self, batch):
        old = batch.get("old_per_token_logps")
        if old is None and self._gen_stats is not None:
            stats = self._gen_stats(batch)
            T = batch["completion_ids"].shape[1]
            if stats is not None and stats[0].shape[0] == batch["completion_ids"].shape[0] and stats[0].shape[1] >= T:
                logps, log_sum_sq = stats[0][:, :T], stats[1][:, :T]
                # Positions past a sequence's end hold pad-token stats; the completion mask removes them.
                return logps.to(batch["completion_ids"].device), log_sum_sq.to(batch["completion_ids"].device)
        return super()._otb_rollout_stats(batch)
