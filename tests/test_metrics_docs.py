"""docs/metrics.md documents every `otb/*` key OTBTrainer logs, under the names the trackers get, and the README
links it."""

from __future__ import annotations

import re
from pathlib import Path

from transformers.integrations.integration_utils import rewrite_logs

from trl_otb import OTBTrainer
from trl_otb.core.diagnostics import ADVANTAGE_KEYS, PROXY_KEYS
from trl_otb.fidelity.training import TRAINER_KEYS
from trl_otb.testing import RecordingReward, make_args, prompts_dataset

ROOT = Path(__file__).resolve().parents[1]
METRICS = (ROOT / "docs" / "metrics.md").read_text()
DOCUMENTED = set(re.findall(r"^\| `(otb/[a-z_/]+)` \|", METRICS, flags=re.M))


def test_every_key_the_library_can_log_is_documented():
    keys = {f"otb/{k}" for k in (*ADVANTAGE_KEYS, *PROXY_KEYS)} | {f"otb/fidelity/{k}" for k in TRAINER_KEYS}
    for source in (ROOT / "trl_otb").rglob("*.py"):  # literal names: counts, warnings
        keys |= set(re.findall(r"\botb/[a-z_]+(?:/[a-z_]+)?(?![a-z_/{*])", source.read_text()))
    assert {"otb/nan_rewards", "otb/infinite_rewards", "otb/nonfinite_grad_norm"} <= keys  # precondition
    assert keys - DOCUMENTED == set()
    assert DOCUMENTED - keys == set()  # and nothing documented that is never logged


def test_every_key_a_training_run_logs_is_documented_under_the_trackers_names(tiny_model_dir, tmp_path):
    args = make_args(tmp_path, otb_fidelity_check_steps=1, otb_fidelity_rows=1)
    trainer = OTBTrainer(tiny_model_dir, reward_funcs=RecordingReward(), args=args, train_dataset=prompts_dataset())
    trainer.train()
    logged = {k for entry in trainer.state.log_history for k in entry if k.startswith("otb/")}
    assert {"otb/advantage_mean", "otb/fidelity/token_spearman", "otb/nonfinite_grad_norm"} <= logged  # precondition
    assert logged - DOCUMENTED == set()
    # What tensorboard and wandb receive (transformers' rewrite), as the page says.
    assert {f"train/{k}" for k in logged} <= set(rewrite_logs(trainer.state.log_history[0]))
    assert "`train/otb/<key>`" in METRICS and "`eval/otb/<key>`" in METRICS


def test_the_readme_links_the_metrics_page():
    assert "(docs/metrics.md)" in (ROOT / "README.md").read_text()
