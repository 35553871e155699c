"""log pi(y_t) and log sum_v pi(v)^2 collected while `generate` samples, so no extra forward is needed.

No TRL import. `transformers` applies custom logits processors *before* its temperature and
truncation warpers (top-k, top-p, min-p), so the scores this processor sees are the raw logits;
it divides them by the temperature itself. That is the distribution TRL's fused LM head scores
(temperature only), so both ways give the same statistics up to float rounding.
"""

from __future__ import annotations

import contextlib

import torch
from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList

# GenerationConfig fields that add logits processors *before* ours. When any is active, the scores we
# would see are not plain logits, so the trainer falls back to a forward pass instead.
_PRE_WARPER_FIELDS = {
    "repetition_penalty": (None, 1.0),
    "encoder_repetition_penalty": (None, 1.0),
    "no_repeat_ngram_size": (None, 0),
    "encoder_no_repeat_ngram_size": (None, 0),
    "bad_words_ids": (None,),
    "min_length": (None, 0),
    "min_new_tokens": (None, 0),
    "sequence_bias": (None,),
    "suppress_tokens": (None,),
    "begin_suppress_tokens": (None,),
    "forced_bos_token_id": (None,),
    "forced_eos_token_id": (None,),
    "guidance_scale": (None, 1.0),
    "exponential_decay_length_penalty": (None,),
    "remove_invalid_values": (None, False),
    "watermarking_config": (None,),
}


def scores_are_raw_logits(*configs: GenerationConfig | None) -> bool:
    """Whether no processor changes the logits before the temperature warper, for every given config."""
    for config in configs:
        if config is None:
            continue
        for name, neutral in _PRE_WARPER_FIELDS.items():
            if getattr(config, name, None) not in neutral:
                return False
    return True


class RolloutStatsCollector(LogitsProcessor):
    """A pass-through logits processor that records, per decoding step, at temperature T:

    - ``log sum_v pi(v)^2`` of ``pi = softmax(scores / T)``, and
    - ``log pi(y)`` of the token sampled at that step (read at the next step from ``input_ids``,
      or by :meth:`finish` for the last step).

    Memory: one ``[B, V]`` fp32 log-softmax (the previous step's), plus ``[B]`` per step.
    """

    def __init__(self, temperature: float):
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {temperature}.")
        self.inv_temperature = 1.0 / temperature
        self.rows = None
        self._previous = None
        self._logps: list[torch.Tensor] = []
        self._log_sum_sq: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        z = scores.float()
        logp = torch.log_softmax(z if self.inv_temperature == 1.0 else z * self.inv_temperature, dim=-1)
        if self._previous is not None:
            self._logps.append(self._previous.gather(1, input_ids[:, -1:]).squeeze(1))
        # log sum pi^2 = 2 log ||pi||_2: two passes (exp, norm) where logsumexp(2 log pi) takes four.
        self._log_sum_sq.append(2 * torch.log(torch.linalg.vector_norm(logp.exp(), dim=-1)))
        self._previous = logp
        self.rows = scores.shape[0]
        return scores

    @property
    def steps(self) -> int:
        return len(self._log_sum_sq)

    def finish(self, completion_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``(logps, log_sum_sq)`` as ``[B, T]`` aligned with the right-padded ``completion_ids [B, T]``.

        Returns None when what was recorded cannot be aligned with ``completion_ids`` (another row
        count, or completions longer than the decoding steps seen).
        """
        B, T = completion_ids.shape
        K = self.steps
        if K == 0 or self.rows != B or K > T:
            return None
        last = self._previous.gather(1, completion_ids[:, K - 1 : K].to(self._previous.device)).squeeze(1)
        logps = torch.stack([*self._logps, last], dim=1)
        log_sum_sq = torch.stack(self._log_sum_sq, dim=1)
        pad = T - K
        if pad:
            logps = torch.nn.functional.pad(logps, (0, pad))
            log_sum_sq = torch.nn.functional.pad(log_sum_sq, (0, pad))
        return logps.to(completion_ids.device), log_sum_sq.to(completion_ids.device)


@contextlib.contextmanager
def collecting_while_generating(model: torch.nn.Module, collector: RolloutStatsCollector):
    """Within the block, ``model.generate`` also runs ``collector`` (TRL's generation code calls it unchanged)."""
    had_own = "generate" in model.__dict__
    original = model.generate

    def generate(*args, **kwargs):
        processors = LogitsProcessorList(kwargs.pop("logits_processor", None) or [])
        return original(*args, logits_processor=LogitsProcessorList([collector, *processors]), **kwargs)

    model.generate = generate
    try:
        yield collector
    finally:
        if had_own:
            model.generate = original
        else:
            del model.generate
