"""One vLLM training run in a process of its own, for tests/integration/test_vllm.py (run with the vLLM venv's Python).

    python tests/helpers/vllm_worker.py SPEC_JSON OUT_JSON

SPEC_JSON: {"model_dir", "output_dir", "vllm_mode": "colocate"|"server", "server_url", "trainer": "otb"|"grpo",
"is_mode": one of TRL's vllm_importance_sampling_mode values or "off", "sync": "adapter"|"first_only",
"max_steps", "learning_rate"}.

The run trains with TRL's vLLM generation (the CPU weight-sync adapter of trl_otb.testing.vllm_cpu
installed) and, for
every generation batch, recomputes independently what the trainer should have produced from the same rollout:
vLLM's sampling log-probs as vLLM returned them, an fp64 full-softmax pass of the trainer's model (pi(y_t), the
proxy ||e_y - pi||^2 and sum pi^2), the importance ratio, and ``otb_advantages`` from those. It also counts the model
forwards inside each generation batch, and measures how far the trainer has moved from the initial checkpoint and how
far vLLM's samples are from that checkpoint (which weights vLLM holds). Everything measured goes to OUT_JSON;
tests/integration/test_vllm.py asserts on it.

The reward is the suite's RecordingReward with distinct rewards in every group (``distinct=True``), so that every
batch has non-zero advantages and every optimizer step moves the trainer: with tied groups a step can train nothing,
and a control that needs the trainer to move would then see nothing.

A process of its own because a colocated engine leaves torch.distributed initialised and RANK/WORLD_SIZE set.
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

from trl_otb.testing import vllm_cpu

os.environ.update(vllm_cpu.CPU_ENV)

# Narrow clip bounds, so that the bfloat16 engine (TRL's colocate LLM(...) passes no dtype, and vLLM runs fp32 models
# in bf16 on CPU) against the fp32 trainer gives ratios both inside and outside them: every branch of each mode runs.
CLIP = {"token": (0.99, 1.01), "sequence": (0.97, 1.03)}
BOUNDARY = 1e-5
"""How close (relative) to a clip bound an unclipped ratio must lie for TRL's fp32 masking decision to differ."""


def build_trainer(spec):
    from trl import GRPOTrainer

    from trl_otb import OTBTrainer
    from trl_otb.testing import RecordingReward, make_args, prompts_dataset

    is_mode = spec["is_mode"]
    overrides = dict(
        use_vllm=True,
        vllm_mode=spec["vllm_mode"],
        max_steps=spec.get("max_steps", 3),
        learning_rate=spec.get("learning_rate", 0.05),
        vllm_importance_sampling_correction=is_mode != "off",
    )
    if spec["vllm_mode"] == "server":
        overrides["vllm_server_base_url"] = spec["server_url"]
    if is_mode != "off":
        clip_min, clip_max = CLIP[is_mode.split("_")[0]]
        overrides.update(
            vllm_importance_sampling_mode=is_mode,
            vllm_importance_sampling_clip_min=clip_min,
            vllm_importance_sampling_clip_max=clip_max,
        )
    if spec["trainer"] == "grpo":
        overrides["advantage_estimator"] = "grpo"
    args = make_args(Path(spec["output_dir"]), **overrides)
    reward = RecordingReward(distinct=True)
    cls = OTBTrainer if spec["trainer"] == "otb" else GRPOTrainer
    trainer = cls(spec["model_dir"], reward_funcs=reward, args=args, train_dataset=prompts_dataset())
    return trainer, reward


def instrument(trainer, reward, spec, records, initial):
    """Wrap the trainer's generation batch and vLLM's generate to record and check each batch.

    ``initial``: the model as loaded from the checkpoint (the weights of the first sync), never trained.
    """
    import torch

    from trl_otb import otb_advantages
    from trl_otb.testing import N, independent_ratio, independent_rollout_stats

    engine_outputs = []
    generate = trainer.vllm_generation.generate

    def recording_generate(*args, **kwargs):
        out = generate(*args, **kwargs)
        engine_outputs.append((out[1], out[2]))  # completion ids and per-token logprobs, as vLLM returned them
        return out

    trainer.vllm_generation.generate = recording_generate

    forwards = {"counting": False, "n": 0}

    def count(module, args, kwargs):
        if forwards["counting"]:
            forwards["n"] += 1

    trainer.model.register_forward_pre_hook(count, with_kwargs=True)
    score = trainer._generate_and_score_completions

    def checked(inputs):
        forwards.update(counting=True, n=0)
        try:
            batch = score(inputs)
        finally:
            forwards["counting"] = False
        record = {"forwards": forwards["n"], "old_logps_from_trl": batch.get("old_per_token_logps") is not None}
        ids, logprobs = engine_outputs[-1]
        mask = batch["completion_mask"].double()
        sampling = torch.zeros(mask.shape, dtype=torch.float64)
        for i, (row_ids, row_lp) in enumerate(zip(ids, logprobs)):
            assert batch["completion_ids"][i, : len(row_ids)].tolist() == list(row_ids)
            sampling[i, : len(row_lp)] = torch.tensor([lp[0] for lp in row_lp], dtype=torch.float64)
        p_token, sum_sq, proxy = independent_rollout_stats(trainer.model, batch, trainer.temperature)
        log_ratio = (torch.log(p_token) - sampling) * mask
        seq_log_ratio = log_ratio.sum(1)
        # The same batch under the initial weights: how far the trainer has moved, and whether vLLM sampled from them.
        p_initial, _, _ = independent_rollout_stats(initial, batch, trainer.temperature)
        moved = (torch.log(p_token) - torch.log(p_initial)) * mask
        to_initial = (torch.log(p_initial) - sampling) * mask
        initial_params = dict(initial.named_parameters())
        record.update(
            step=trainer.state.global_step,
            rewards=list(reward.calls[-1]),
            seq_log_ratio=seq_log_ratio.tolist(),
            token_log_ratio_abs_max=log_ratio.abs().max().item(),
            token_log_ratio_abs_mean=(log_ratio.abs().sum() / mask.sum()).item(),
            seq_moved_from_initial=moved.sum(1).tolist(),
            param_moved_from_initial_max=max(
                (param.detach() - initial_params[name]).abs().max().item()
                for name, param in trainer.model.named_parameters()
            ),
            seq_log_ratio_to_initial=to_initial.sum(1).tolist(),
            token_log_ratio_to_initial_abs_max=to_initial.abs().max().item(),
            proxy_identity_err=(proxy - (1 - 2 * p_token + sum_sq)).abs().max().item(),
        )
        rewards = torch.tensor(reward.calls[-1], dtype=torch.float32)
        group_ids = torch.arange(len(rewards)) // N
        active = batch["completion_mask"]
        is_weights = None
        if spec["is_mode"] != "off":
            clip_min, clip_max = CLIP[spec["is_mode"].split("_")[0]]
            ratio = independent_ratio(torch.log(p_token), sampling, mask, spec["is_mode"], clip_min, clip_max)
            trl_ratio = batch["importance_sampling_ratio"].double()
            # A masked mode drops a ratio outside [clip_min, clip_max]: where the unclipped ratio lies within rounding
            # of a bound, TRL's fp32 and this fp64 recomputation may decide it differently. Such a token follows
            # TRL's decision (its drop changes the group's energies); a differing decision anywhere else is an error.
            flips = ((ratio > 0) != (trl_ratio > 0)) & (mask.bool() if ratio.size(1) > 1 else True)
            if flips.any():
                level = spec["is_mode"].split("_")[0]
                unclipped = independent_ratio(torch.log(p_token), sampling, mask, f"{level}_truncate", 0.0, math.inf)
                margin = torch.minimum((unclipped / clip_min - 1).abs(), (unclipped / clip_max - 1).abs())
                record["mask_flips"] = int(flips.sum())
                record["mask_flips_off_boundary"] = int((flips & (margin > BOUNDARY)).sum())
                ratio = torch.where(flips, trl_ratio, ratio)
            record["ratio_err"] = (trl_ratio - ratio).abs().max().item()
            on = ratio.expand_as(mask)[mask.bool()] if ratio.size(1) > 1 else ratio[:, 0]
            record["ratio_inside"] = int(((on > clip_min) & (on < clip_max)).sum())
            record["ratio_outside"] = int(((on <= clip_min) | (on >= clip_max)).sum())
            is_weights = ratio.float()
            active = active * (ratio > 0).to(active.dtype)
        if spec["trainer"] == "otb":
            tail = trainer.args.otb_tail
            expected = otb_advantages(rewards, proxy.float(), active, group_ids, is_weights=is_weights, tail=tail)
            record["advantage_err"] = (batch["advantages"] - expected).abs().max().item()
            record["advantage_abs_max"] = expected.abs().max().item()
            if is_weights is not None:
                on_policy = otb_advantages(rewards, proxy.float(), active, group_ids, tail=tail)
                record["advantage_is_effect"] = (expected - on_policy).abs().max().item()
        records.append(record)
        return batch

    trainer._generate_and_score_completions = checked


def main(spec_path, out_path):
    import torch

    spec = json.loads(Path(spec_path).read_text())
    vllm_cpu.install()
    if spec.get("sync", "adapter") == "first_only":
        vllm_cpu.skip_syncs_after_first()
    from transformers import AutoModelForCausalLM

    trainer, reward = build_trainer(spec)
    initial = AutoModelForCausalLM.from_pretrained(spec["model_dir"], dtype=trainer.model.dtype).eval()
    initial.requires_grad_(False)
    records = []
    instrument(trainer, reward, spec, records, initial)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    changed = [n for n, p in trainer.model.named_parameters() if not torch.equal(before[n], p.detach())]
    result = {
        "records": records,
        "syncs": vllm_cpu.SYNCS,
        "skipped_syncs": vllm_cpu.SKIPPED,
        "n_params": len(before),
        "params_changed": len(changed),
        "log_history": trainer.state.log_history,
    }
    if spec.get("sync") == "first_only" and spec["vllm_mode"] == "colocate":
        # TRL's own sync against this CPU engine: the error the adapter exists for, where vLLM's CPU backend replaced
        # linear weights by kernel-layout copies (empty parameters without a weight_loader are left in their place).
        engine_model = trainer.vllm_generation.llm.llm_engine.model_executor.driver_worker.model_runner.model
        result["engine_repacked_weights"] = [n for n, p in engine_model.named_parameters() if p.numel() == 0]
        try:
            vllm_cpu.ORIGINALS["sync_weights"](trainer.vllm_generation)
            result["trl_sync_error"] = None
        except Exception as error:  # noqa: BLE001 - recorded for the test to read
            result["trl_sync_error"] = f"{type(error).__name__}: {error}"
    Path(out_path).write_text(json.dumps(result))


if __name__ == "__main__":
    main(*sys.argv[1:3])
