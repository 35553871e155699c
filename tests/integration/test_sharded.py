"""Sharded engines with 2 CPU processes (torchrun, gloo): FSDP2 and DeepSpeed ZeRO-3.

Each run records, per rank and generation batch, the completions `generate` produced, the batch, the
advantages, rewards and otb/ metrics. A single process then replays the same completions (its
`_generate_single_turn` returns them) with the same configuration and one 12-row batch per step, and
the test compares: advantages and otb/ metrics within 1e-5, final weights within 1e-4. Two processes
sample different completions than one even with the same seed, hence the replay.

FSDP2 runs through accelerate's own FSDP2 preparation, switched on for CPU by the test-only switch in
trl_otb.testing.sharded_cpu; each test asserts that the model really was sharded. ZeRO-3 needs deepspeed, which
lives in its own venv (`make test-sharded`); in a venv without it those tests skip, unless
TRL_OTB_REQUIRE_DEEPSPEED=1 (set by `make test-sharded`) turns the skip into a failure.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from trl_otb import OTBTrainer
from trl_otb.fidelity import TRAINER_KEYS, batch_fidelity
from trl_otb.testing import N, free_port, pad_to, split_group_dataset, split_group_reward
from trl_otb.testing.sharded_cpu import (
    FSDP2_ENV,
    FSDP2_LINEAR_WRAP_ENV,
    ZERO3_ENV,
    RecordingTrainer,
    sharded_config,
)

ROOT = Path(__file__).resolve().parents[2]
HELPERS = ROOT / "tests" / "helpers"
WORKER = HELPERS / "sharded_worker.py"
HAS_DEEPSPEED = importlib.util.find_spec("deepspeed") is not None
if os.environ.get("TRL_OTB_REQUIRE_DEEPSPEED") == "1" and not HAS_DEEPSPEED:
    raise ImportError(
        "TRL_OTB_REQUIRE_DEEPSPEED=1 but deepspeed is not importable: build .venv-ds (make test-sharded)"
    )
needs_deepspeed = pytest.mark.skipif(
    not HAS_DEEPSPEED, reason="DeepSpeed ZeRO-3 tests need deepspeed: run `make test-sharded` (its own venv)"
)
ENGINE_ENV = {"fsdp2": FSDP2_ENV, "zero3": ZERO3_ENV}


def launch(engine: str, mode: str, model_dir: str, out: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2"]
    command += ["--master_addr", "127.0.0.1", "--master_port", str(free_port())]
    command += [str(WORKER), engine, mode, model_dir, str(out)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", **(ENGINE_ENV[engine] if env is None else env)}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    if engine == "zero3":
        env.setdefault("TORCH_EXTENSIONS_DIR", str(ROOT / ".cache" / "torch_extensions"))
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)


def run_ranks(engine: str, mode: str, model_dir: str, out: Path) -> list[dict]:
    result = launch(engine, mode, model_dir, out)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(2)]


class ReplayTrainer(RecordingTrainer):
    """One process; `generate` returns exactly the completions the two ranks generated, in rank order."""

    def _generate_single_turn(self, prompt_ids, *args, **kwargs):
        prompt_lists, completions = self._replay.pop(0)
        assert [list(p) for p in prompt_ids] == prompt_lists, "the replay's prompts differ from the ranks'"
        self._record = {"prompt_id_lists": prompt_lists, "completion_id_lists": completions}
        return completions, None


def replay(ranks: list[dict], mode: str, model_dir: str, out: Path) -> tuple[ReplayTrainer, list[dict]]:
    args = sharded_config(
        str(out / "replay"), mode, use_cpu=True, per_device_train_batch_size=12, otb_fidelity_check_steps=0
    )
    if mode == "nogather":
        args.max_steps = 1
    trainer = ReplayTrainer(model_dir, reward_funcs=split_group_reward, args=args, train_dataset=split_group_dataset())
    trainer.records = []
    trainer._replay = [
        (a["prompt_id_lists"] + b["prompt_id_lists"], a["completion_id_lists"] + b["completion_id_lists"])
        for a, b in zip(ranks[0]["records"], ranks[1]["records"])
    ]
    trainer.train()
    assert trainer._replay == [] and len(trainer.records) == len(ranks[0]["records"])
    return trainer, trainer.records


def advantage_gap(ranks: list[dict], replayed: list[dict]) -> float:
    """Largest |advantage| difference between the two ranks' batches and the replay, over all generation batches."""
    gap = 0.0
    for a, b, single in zip(ranks[0]["records"], ranks[1]["records"], replayed):
        T = max(a["advantages"].size(1), b["advantages"].size(1), single["advantages"].size(1))
        got = torch.cat([pad_to(a["advantages"], T), pad_to(b["advantages"], T)])
        gap = max(gap, (got - pad_to(single["advantages"], T)).abs().max().item())
    return gap


def check_split_batches(ranks: list[dict]) -> None:
    """The batches the replay compares really split a group across ranks, with unequal completion widths."""
    assert all(r["engagement"]["world_size"] == 2 for r in ranks)
    every_prompt = sorted({str(x["prompt"]) for x in split_group_dataset()})
    for a, b in zip(ranks[0]["records"], ranks[1]["records"]):
        prompts = a["prompts"] + b["prompts"]
        assert len(prompts) == 3 * N and sorted(set(prompts)) == every_prompt
        assert len(set(prompts[N : 2 * N])) == 1 and prompts[N : 2 * N] == a["prompts"][-2:] + b["prompts"][:2]
    widths = [max(rec["completion_ids"].size(1) for rec in r["records"]) for r in ranks]
    assert widths[0] <= 5 < widths[1]


def check_exact(ranks: list[dict], mode: str, model_dir: str, out: Path) -> None:
    check_split_batches(ranks)
    # Precondition of every agreement below: each rank trained on non-zero advantages.
    assert all(rec["advantages"].abs().sum() > 0 for r in ranks for rec in r["records"])
    trainer, replayed = replay(ranks, mode, model_dir, out)
    gaps = {"advantages": advantage_gap(ranks, replayed), "metrics": 0.0}
    assert gaps["advantages"] <= 1e-5
    for records in (ranks[0]["records"], ranks[1]["records"]):
        for rec, single in zip(records, replayed):
            names = {k for k in rec["metrics"] if not k.startswith("otb/fidelity/")}
            assert names == set(single["metrics"]) and "otb/total_power" in names
            for name in names:
                gaps["metrics"] = max(gaps["metrics"], abs(rec["metrics"][name] - single["metrics"][name]))
                assert rec["metrics"][name] == pytest.approx(single["metrics"][name], rel=1e-5, abs=1e-5), name
    weights = ranks[0]["weights"]
    single_weights = dict(trainer.model.named_parameters())
    assert weights.keys() == single_weights.keys()
    initial = dict(AutoModelForCausalLM.from_pretrained(model_dir).named_parameters())
    moved = max((weights[k] - initial[k]).abs().max().item() for k in weights)
    assert moved > 1e-3  # training changed the weights, so agreeing means something
    gaps["weights"] = max((weights[k] - single_weights[k].detach()).abs().max().item() for k in weights)
    assert gaps["weights"] <= 1e-4
    print(f"{ranks[0]['engagement']['distributed_type']} {mode}: largest difference to the replay", gaps)


def check_fidelity(ranks: list[dict], model_dir: str) -> None:
    """The in-training fidelity check ran under sharding and equals the check on the plain initial model."""
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    local = []
    for rank, r in enumerate(ranks):
        rec = r["records"][0]  # step 0: the weights are the initial ones
        values = batch_fidelity(
            model, rec, rec["completion_mask"], rec["rewards"], 2, 0.7, first_row=rank * 6, num_generations=N
        )
        local.append(values)
    expected = torch.tensor(local).nanmean(0).tolist()
    assert any(v == v and v != 0 for v in expected[:4])  # something finite was measured
    for r in ranks:
        logged = r["records"][0]["metrics"]
        for key, value in zip(TRAINER_KEYS, expected):
            if key == "seconds_per_token":
                continue  # a timing
            assert logged[f"otb/fidelity/{key}"] == pytest.approx(value, rel=1e-4, abs=1e-5, nan_ok=True), key
        assert all(f"otb/fidelity/{k}" in rec["metrics"] for rec in r["records"] for k in TRAINER_KEYS)


def assert_engaged(engine: str, evidence: list[dict]) -> None:
    """Every rank's evidence (trl_otb.testing.sharded_cpu.engagement) shows ``engine`` sharding the LM head."""
    for e in evidence:
        if engine == "fsdp2":
            assert e["distributed_type"] == "DistributedType.FSDP"
            assert e["head_is_dtensor"] and e["head_local_rows"] < e["head_rows"]
        else:
            assert e["distributed_type"] == "DistributedType.DEEPSPEED" and e["is_ds_engine"] and e["zero_stage"] == 3
            assert e["head_local_numel"] == 0 and e["head_ds_numel"] > 0


# The same end-to-end checks under each engine: FSDP2 in the main venv, ZeRO-3 in .venv-ds (`make test-sharded`).
ENGINES = [
    pytest.param("fsdp2", marks=pytest.mark.multiprocess),
    pytest.param("zero3", marks=[pytest.mark.zero3, needs_deepspeed]),
]


@pytest.mark.parametrize("engine", ENGINES)
def test_on_policy_is_exact_and_fidelity_check_runs(engine, tiny_model_dir, tmp_path):
    ranks = run_ranks(engine, "onpolicy", tiny_model_dir, tmp_path)
    assert_engaged(engine, [r["engagement"] for r in ranks])
    check_exact(ranks, "onpolicy", tiny_model_dir, tmp_path)
    check_fidelity(ranks, tiny_model_dir)


@pytest.mark.parametrize("engine", ENGINES)
def test_two_iterations_is_exact(engine, tiny_model_dir, tmp_path):
    ranks = run_ranks(engine, "iter2", tiny_model_dir, tmp_path)
    assert_engaged(engine, [r["engagement"] for r in ranks])
    assert len(ranks[0]["records"]) == 2  # 4 optimizer steps on 2 generation batches
    check_exact(ranks, "iter2", tiny_model_dir, tmp_path)


# --------------------------------------------------------------------------- FSDP2 only


@pytest.mark.multiprocess
def test_replay_comparison_catches_groups_that_were_not_gathered(tiny_model_dir, tmp_path):
    ranks = run_ranks("fsdp2", "nogather", tiny_model_dir, tmp_path)
    assert_engaged("fsdp2", [r["engagement"] for r in ranks])
    check_split_batches(ranks)
    # Precondition: without the gather each rank groups its own 6 rows as 4 + 2, which cuts the batch's 2nd and 3rd
    # groups in halves; halves get other baselines than the whole group only where its rewards do not all tie.
    batch = [r["records"][0] for r in ranks]
    rewards = split_group_reward(
        sum((b["prompts"] for b in batch), []), sum((b["completion_id_lists"] for b in batch), [])
    )
    cut = [rewards[g * N : (g + 1) * N] for g in (1, 2)]
    assert any(None not in group and len(set(group)) > 1 for group in cut), (
        f"precondition failed: the groups the missing gather cuts have no reward spread ({cut})"
    )
    _, replayed = replay(ranks, "nogather", tiny_model_dir, tmp_path)
    gap = advantage_gap(ranks, replayed)
    print(f"gather disabled: advantages differ from the replay by {gap}")
    assert gap > 0.1


# bf16 rounds to 8 significant bits (relative error up to 2^-9 per rounding) and the logits pass through every
# layer in bf16, under FSDP2 as in one process, with different batch shapes: w_t (in [0, 2)) differs from the
# single-process replay by 0.019 at most here, the advantages by 0.002.
BF16_PROXY_ATOL = 0.05
BF16_ADVANTAGE_ATOL = 0.01


@pytest.mark.multiprocess
def test_proxy_under_fsdp2_bf16_is_formed_in_one_precision(tiny_model_dir, tmp_path):
    """FSDP2 with bf16 mixed precision, as examples/accelerate_configs/fsdp2.yaml trains on GPUs. accelerate <= 1.15
    casts the model's outputs to bf16 there (its policy sets output_dtype), so the log-probs TRL's rollout pass
    returns are bf16 while the fused head computed them, and sum pi^2, in fp32: the proxy must be formed from the
    fused head's pair, not from a bf16 log pi and an fp32 sum pi^2. accelerate 1.16 no longer casts."""
    ranks = run_ranks("fsdp2", "bf16", tiny_model_dir, tmp_path)
    assert_engaged("fsdp2", [r["engagement"] for r in ranks])
    check_split_batches(ranks)
    for r in ranks:  # mixed precision was on: the layers ran with bf16 weights, and the proxy came from TRL's pass
        assert r["engagement"]["param_dtype"] == torch.bfloat16
        assert r["compute_dtypes"] == [("torch.bfloat16", "torch.bfloat16")]
        (rec,) = r["records"]
        assert rec["from_rollout_pass"]
        received = r["engagement"]["output_dtype"] or torch.float32  # bf16 under accelerate <= 1.15
        assert rec["trl_logps"].dtype == received
        assert rec["input_dtypes"] == (torch.float32, torch.float32)

    _, (single,) = replay(ranks, "bf16", tiny_model_dir, tmp_path)
    assert single["from_rollout_pass"] and single["input_dtypes"] == (torch.float32, torch.float32)
    a, b = (r["records"][0] for r in ranks)
    T = max(a["proxy"].size(1), b["proxy"].size(1), single["proxy"].size(1))
    mask = torch.cat([pad_to(a["completion_mask"], T), pad_to(b["completion_mask"], T)]).bool()
    got = torch.cat([pad_to(a["proxy"], T), pad_to(b["proxy"], T)])
    proxy_gap = (got - pad_to(single["proxy"], T))[mask].abs().max().item()
    advantage_gap_ = advantage_gap(ranks, [single])
    print(f"FSDP2 bf16, TRL received {a['trl_logps'].dtype}: proxy gap {proxy_gap}, advantage gap {advantage_gap_}")
    assert proxy_gap <= BF16_PROXY_ATOL and advantage_gap_ <= BF16_ADVANTAGE_ATOL
    assert got[mask].std() > 0.1  # the proxy varies across tokens, so agreeing means something


@pytest.mark.multiprocess
def test_trl_fused_head_does_not_average_the_gradient_of_an_lm_head_unit(tiny_model_dir, tmp_path):
    """TRL 1.16 bug (it hits GRPOTrainer too): with lm_head its own FSDP2 unit, the fused head's
    `weight.full_tensor()` gives each rank's shard of lm_head's gradient from that rank's data only.
    When this test fails because the gradient is the average, TRL fixed it: drop the refusal in
    trl_otb.sharding and the paragraph in docs/training.md."""
    result = launch("fsdp2", "lmhead", tiny_model_dir, tmp_path, env={})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    assert all(r["head_is_unit"] for r in ranks)
    from trl.trainer.utils import add_fused_lm_head

    own = []
    for r in ranks:
        model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
        add_fused_lm_head(model, temperature=0.7)
        model(input_ids=r["input_ids"], labels=r["input_ids"], fused_lm_head=True).log_probs.sum().backward()
        own.append(model.lm_head.weight.grad)
    average = (own[0] + own[1]) / 2
    half = (own[0].size(0) + 1) // 2
    each_own_rows = torch.cat([own[0][:half], own[1][half:]])
    print(
        "lm_head unit: gradient differs from the average by",
        max((r["grad"] - average).abs().max().item() for r in ranks),
    )
    for r in ranks:
        assert (r["grad"] - average).abs().max() > 1e-3
        assert torch.allclose(r["grad"], each_own_rows, atol=1e-6)


@pytest.mark.multiprocess
def test_otb_refuses_an_lm_head_unit_before_the_first_step(tiny_model_dir, tmp_path):
    result = launch("fsdp2", "refuse", tiny_model_dir, tmp_path, env=FSDP2_LINEAR_WRAP_ENV)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    for r in range(2):
        refused = torch.load(tmp_path / f"refuse{r}.pt")
        assert refused["step"] == 0
        assert "LM head is its own FSDP2 unit" in refused["message"] and "LlamaDecoderLayer" in refused["message"]
        assert "PEFT model is not supported under fsdp2" in refused["peft_message"]


def test_fidelity_check_is_refused_under_fsdp1_when_the_trainer_is_built(tiny_model_dir, tmp_path, monkeypatch):
    from trl_otb import sharding

    monkeypatch.setattr(sharding, "engine", lambda accelerator: "fsdp1")
    args = sharded_config(str(tmp_path), "onpolicy", use_cpu=True, per_device_train_batch_size=4)
    with pytest.raises(ValueError, match="not FSDP1"):
        OTBTrainer(tiny_model_dir, reward_funcs=split_group_reward, args=args, train_dataset=split_group_dataset())


def run_example(engine: str, model_dir: str, out: Path) -> dict:
    """examples/math_otb.py through `accelerate launch --num_processes 2` with the shipped config, 2 steps."""
    config_file = {"fsdp2": "fsdp2.yaml", "zero3": "deepspeed_zero3.yaml"}[engine]
    command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file"]
    command += [str(ROOT / "examples" / "accelerate_configs" / config_file), "--num_processes", "2"]
    command += ["--mixed_precision", "no", "--main_process_port", str(free_port())]
    command += [str(HELPERS / "sharded_launch.py"), str(ROOT / "examples" / "math_otb.py")]
    command += ["--model_name_or_path", model_dir, "--output_dir", str(out / "model"), "--max_steps", "2"]
    command += ["--eval_samples", "4", "--num_train", "16", "--per_device_train_batch_size", "4"]
    command += ["--max_completion_length", "8", "--bf16", "false", "--report_to", "none"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", **ENGINE_ENV[engine]}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env["TRL_OTB_TEST_EVIDENCE"] = str(out)
    env.setdefault("TORCH_EXTENSIONS_DIR", str(ROOT / ".cache" / "torch_extensions"))
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300, cwd=out)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    summary = json.loads((out / "model" / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["num_processes"] == 2 and summary["eval_samples"] == 4
    assert result.stdout.count("Held-out pass@1 after training") == 1  # printed by the main process only
    # Evaluation shares the prompts: before and after training, each rank scored 2 of the 4, together all 4.
    rows = [torch.load(out / f"eval_rows{r}.pt") for r in range(2)]
    assert len(rows[0]) == len(rows[1]) == 2
    for mine, theirs in zip(*rows):
        assert len(mine) == len(theirs) == 2 and sorted(mine + theirs) == [0, 1, 2, 3]
    # The saved model is whole (gathered from the shards) and loads. (The tiny model earns no math reward, so its
    # weights do not move here; training under sharding is checked against the replay above.)
    trained = dict(AutoModelForCausalLM.from_pretrained(out / "model").named_parameters())
    initial = dict(AutoModelForCausalLM.from_pretrained(model_dir).named_parameters())
    assert trained.keys() == initial.keys()
    assert all(trained[k].shape == v.shape and torch.isfinite(trained[k]).all() for k, v in initial.items())
    return [torch.load(out / f"engaged{r}.pt") for r in range(2)]


@pytest.mark.parametrize("engine", ENGINES)
def test_math_example_runs_with_two_processes(engine, tiny_model_dir, tmp_path):
    assert_engaged(engine, run_example(engine, tiny_model_dir, tmp_path))
