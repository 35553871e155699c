"""Groups split across processes: two real processes (torchrun, gloo) train one step, and the
advantages and otb/ metrics each rank used equal a single-process computation on the
concatenation of their completions."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from trl_otb import otb_advantages
from trl_otb.core import otb_diagnostics
from trl_otb.testing import N, free_port, independent_rollout_stats, pad_to
from trl_otb.testing import split_group_reward as reward

ROOT = Path(__file__).resolve().parents[2]
WORKER = ROOT / "tests" / "helpers" / "multiprocess_worker.py"


@pytest.fixture(scope="module")
def two_ranks(tiny_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("multiprocess")
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2"]
    command += ["--master_addr", "127.0.0.1", "--master_port", str(free_port())]
    command += [str(WORKER), tiny_model_dir, str(out)]
    env = {**os.environ, "ACCELERATE_USE_CPU": "1", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return [torch.load(out / f"rank{r}.pt") for r in range(2)]


@pytest.mark.multiprocess
def test_split_groups_get_single_process_advantages_and_metrics(two_ranks, tiny_model_dir):
    assert all(r["world_size"] == 2 for r in two_ranks)
    prompts = two_ranks[0]["prompts"] + two_ranks[1]["prompts"]
    assert len(prompts) == 3 * N
    # Groups are N consecutive rows of the concatenation; the middle one has 2 rows on each rank.
    for g in range(3):
        assert len(set(prompts[g * N : (g + 1) * N])) == 1
    assert prompts[N : 2 * N] == two_ranks[0]["prompts"][-2:] + two_ranks[1]["prompts"][:2]
    assert sum("unscorable" in p for p in prompts) == N
    widths = [r["completion_ids"].size(1) for r in two_ranks]
    assert widths[0] <= 5 < widths[1]  # uneven completion lengths across ranks

    # Independent recomputation: proxy from a plain full-softmax forward of the initial model (the batch
    # was generated before the optimizer step), rewards from the same function, one process.
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    T = max(widths)
    proxies, masks, rewards = [], [], []
    for rank in two_ranks:
        _, _, proxy = independent_rollout_stats(model, rank, temperature=0.7)
        proxies.append(pad_to(proxy.float(), T))
        masks.append(pad_to(rank["completion_mask"].float(), T))
        ids = [row[m.bool()].tolist() for row, m in zip(rank["completion_ids"], rank["completion_mask"])]
        rewards += reward(rank["prompts"], ids)
    proxy, mask = torch.cat(proxies), torch.cat(masks)
    rewards = torch.tensor([float("nan") if r is None else r for r in rewards])
    group_ids = torch.arange(len(rewards)) // N
    options = two_ranks[0]["otb_options"]
    expected = otb_advantages(rewards, proxy, mask, group_ids, **options)

    got = torch.cat([pad_to(r["advantages"], T) for r in two_ranks])
    unscorable = torch.tensor(["unscorable" in p for p in prompts])
    assert (got[~unscorable].abs().sum(1) > 0).all()  # precondition: every scorable row has advantages to compare
    assert torch.allclose(got, expected, atol=1e-5)
    assert (got[unscorable] == 0).all()

    # a leave-one-out baseline is read against the other members' mean (the trainer's rule)
    diagnostics = otb_diagnostics(rewards, expected, proxy, mask, group_ids, leave_one_out=options["leave_one_out"])
    for rank in two_ranks:
        logged = {k.removeprefix("otb/"): v for k, v in rank["metrics"].items()}
        assert logged.pop("infinite_rewards") == 0.0  # the trainer's own count; every reward here is finite
        assert logged.pop("nan_rewards") == 0.0
        assert logged.pop("nonfinite_grad_norm", 0.0) == 0.0  # logged at optimizer steps, if the worker took one
        assert logged.keys() == diagnostics.keys()
        for name, value in diagnostics.items():
            assert logged[name] == pytest.approx(value, rel=1e-4, abs=1e-5), name
