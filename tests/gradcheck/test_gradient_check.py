"""``trl-otb gradient-check``: on the tiny model its table, keys, spaces, resume and refusals; its calibration on a
pool whose answer is known; on the embedded model (slow) ``--quick`` end to end, offline, as a user runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
import yaml

from trl_otb import OTBConfig, OTBTrainer
from trl_otb.cli import main
from trl_otb.gradcheck import gradient_check
from trl_otb.gradcheck.analysis import estimators_for, prompt_cells, summarise
from trl_otb.gradcheck.cli import format_report
from trl_otb.testing.tiny import save_tiny_checkpoint, tiny_model_and_tokenizer
from trl_otb.testing.trainer_setup import make_args, prompts_dataset

KEYS = ("cos", "scale", "snr", "eps_star", "kappa", "signal_kept")
ESTIMATORS = ("otb_default", "grpo_std", "grpo", "rloo", "ogb", "otb_self_inclusive", "otb_others_mean_loo")
# the default is leave-one-out OTB with ESS shrinkage, so its named twin (otb_others_mean_loo_ess) has no row


def varied_reward(completions, completion_ids, **kwargs):
    """Differs within most pools of the tiny model: the completion's length mod 5 plus its first token's parity."""
    return [float(len(ids) % 5 + ids[0] % 2) for ids in completion_ids]


def tied_reward(completions, **kwargs):
    return [1.0 for _ in completions]


def check(tmp_path, reward=varied_reward, **kwargs):
    model, tokenizer = tiny_model_and_tokenizer()
    options = dict(prompts=4, pool_size=8, num_groups=16, bootstrap=50, progress=False, kappa_dim=256)
    return gradient_check(model, reward, prompts_dataset(), make_args(tmp_path), processing_class=tokenizer,
                          **(options | kwargs))  # fmt: skip


def test_the_report_has_every_estimator_and_key_and_reads_against_both_grpos(tmp_path):
    report = check(tmp_path, out=tmp_path / "gc")
    assert tuple(report["rows"]) == ESTIMATORS  # make_args' estimator is the default OTB: no `yours` row
    for row in report["rows"].values():
        assert all(key in row and f"{key}_ci" in row for key in KEYS)
    assert report["meta"]["params"] == "head" and report["meta"]["batch_groups"] == 2  # 8 rows / N=4
    assert {"otb_default-grpo", "otb_default-grpo_std"} <= set(report["paired"])
    assert "unscaled GRPO's" in report["reading"] and "TRL's GRPO's" in report["reading"]
    assert json.loads((tmp_path / "gc" / "gradient_check.json").read_text())["rows"].keys() == report["rows"].keys()
    table = format_report(report)
    assert all(name in table for name in ESTIMATORS) and "calibration:" in table


def test_unscaled_grpo_is_rloo_times_one_minus_one_over_n_group_by_group(tmp_path):
    """R_i - mean(R) = (1 - 1/N)(R_i - mean of the others): the same cos and eps_star, and 3/4 of RLOO's scale."""
    rows = check(tmp_path)["rows"]
    assert rows["grpo"]["eps_star"] == pytest.approx(rows["rloo"]["eps_star"], rel=1e-6)
    assert rows["grpo"]["cos"] == pytest.approx(rows["rloo"]["cos"], rel=1e-6)
    assert rows["grpo"]["scale"] == pytest.approx(rows["rloo"]["scale"] * 3 / 4, rel=1e-6)


def test_a_rerun_resumes_and_more_prompts_extend_the_check(tmp_path):
    out = tmp_path / "gc"
    first = check(tmp_path, out=out)
    pools = sorted((out / "pools").glob("p*.pt"))
    assert len(pools) == 8  # precondition: each of the 4 prompts has its pool and its head gradients
    stamps = [p.stat().st_mtime_ns for p in pools]
    again = check(tmp_path, out=out)
    assert again["rows"] == first["rows"]  # read back, not drawn again
    assert [p.stat().st_mtime_ns for p in pools] == stamps
    more = check(tmp_path, out=out, prompts=6)
    assert len(list((out / "pools").glob("p????.pt"))) == 6 and more["meta"]["prompts"] == 6
    block = check(tmp_path, out=out, params="last-block", sketch_dim=0)  # the same pools, another space
    assert [p.stat().st_mtime_ns for p in pools] == stamps  # no pool drawn again
    assert len(list((out / "pools").glob("p*-last-block-*.pt"))) == 4
    assert block["meta"]["informative_prompts"] == first["meta"]["informative_prompts"]
    with pytest.raises(ValueError, match="other settings"):
        check(tmp_path, out=out, pool_size=12)


def test_the_last_block_and_a_lora_adapter_are_spaces_too(tmp_path):
    from peft import LoraConfig

    block = check(tmp_path, params="last-block", sketch_dim=0)
    assert block["meta"]["params"] == "last-block" and all(k in block["rows"]["grpo"] for k in KEYS)
    lora = check(tmp_path, peft_config=LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    assert lora["meta"]["params"] == "adapter" and all(k in lora["rows"]["grpo"] for k in KEYS)


def test_bad_input_gets_a_clear_answer(tmp_path):
    with pytest.raises(ValueError, match="none can be compared"):
        check(tmp_path, reward=tied_reward)
    with pytest.raises(ValueError, match="at least 2 prompts"):
        check(tmp_path, prompts=1)
    with pytest.raises(ValueError, match="at least num_generations"):
        check(tmp_path, pool_size=2)
    with pytest.raises(ValueError, match="needs a PEFT adapter"):
        check(tmp_path, params="adapter")
    with pytest.raises(ValueError, match="The dataset has 16 prompts; prompts=40 needs that many"):
        check(tmp_path, prompts=40)


def test_a_per_sequence_loss_is_warned_about(tmp_path):
    model, tokenizer = tiny_model_and_tokenizer()
    assert make_args(tmp_path).loss_type != "grpo"  # precondition: the tests' default loss is not the warned one
    with pytest.warns(UserWarning, match="loss_type='grpo'"):
        gradient_check(model, varied_reward, prompts_dataset(), make_args(tmp_path, loss_type="grpo"),
                       processing_class=tokenizer, prompts=3, pool_size=8, num_groups=16, bootstrap=50,
                       progress=False, kappa_dim=256)  # fmt: skip


def test_a_streamed_dataset_is_read_in_order(tmp_path):
    model, tokenizer = tiny_model_and_tokenizer()
    streamed = prompts_dataset().to_iterable_dataset()
    report = gradient_check(model, varied_reward, streamed, make_args(tmp_path), processing_class=tokenizer, prompts=3,
                            pool_size=8, num_groups=16, bootstrap=50, progress=False, kappa_dim=256)  # fmt: skip
    assert report["meta"]["prompts"] == 3 and "grpo" in report["rows"]


def test_a_launch_with_several_processes_is_refused(tmp_path, monkeypatch):
    import types

    from trl_otb.gradcheck import cli

    real = cli.check_trainer

    def two_processes(*args, **kwargs):
        trainer = real(*args, **kwargs)
        assert trainer.accelerator.num_processes == 1  # precondition: the test itself runs in one process
        trainer.accelerator = types.SimpleNamespace(num_processes=2)
        return trainer

    monkeypatch.setattr(cli, "check_trainer", two_processes)
    with pytest.raises(ValueError, match="runs in one process"):
        check(tmp_path)


def test_a_config_the_trainer_refuses_is_refused_with_the_trainers_message(tmp_path):
    from trl import GRPOConfig

    model, tokenizer = tiny_model_and_tokenizer()
    args = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none")
    with pytest.raises(TypeError) as trainer_error:
        OTBTrainer(model, varied_reward, args=args, train_dataset=prompts_dataset(), processing_class=tokenizer)
    with pytest.raises(TypeError) as check_error:
        gradient_check(model, varied_reward, prompts_dataset(), args, processing_class=tokenizer, progress=False)
    assert str(check_error.value) == str(trainer_error.value)


def test_your_estimator_gets_its_own_row_when_it_is_none_of_the_listed():
    assert "yours" not in estimators_for(OTBConfig(output_dir="x", use_cpu=True, bf16=False))
    mine = estimators_for(OTBConfig(output_dir="x", use_cpu=True, bf16=False, otb_tail="zero"))
    assert mine["yours"] == ("otb", {"eps": 1e-8, "tail": "zero", "leave_one_out": True, "shrinkage": "none"})
    plain = estimators_for(OTBConfig(output_dir="x", use_cpu=True, bf16=False, otb_shrinkage="none"))
    assert "yours" not in plain  # plain leave-one-out is a named row (otb_others_mean_loo)


def test_the_default_row_is_otbconfigs_default_and_a_named_twin_of_it_is_not_repeated():
    estimators = estimators_for()
    configured = OTBConfig(output_dir="x", use_cpu=True, bf16=False).estimator_options()
    assert estimators["otb_default"] == ("otb", {k: v for k, v in configured.items() if k != "align"})
    options = {k: v for k, v in estimators["otb_default"][1].items() if k != "eps"}
    assert options == {"tail": "others_mean", "leave_one_out": True, "shrinkage": "ess"}  # precondition: the twin
    assert "otb_others_mean_loo_ess" not in estimators and tuple(estimators) == ESTIMATORS


def _known_pool(M=12, T=6, D=40, seed=0):
    """A pool whose answer is known: random scores, uneven lengths, rewards that differ; K = F F^T exactly."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, T + 1, (M,), generator=g)
    mask = torch.arange(T)[None, :] < lengths[:, None]
    F = torch.randn(int(lengths.sum()), D, generator=g, dtype=torch.float64)
    pool = {"rewards": torch.randint(0, 4, (M,), generator=g).double(), "proxy": torch.rand(M, T, generator=g) * 2,
            "mask": mask}  # fmt: skip
    return pool, {"K": F @ F.T, "F": F, "w": torch.ones(D, dtype=torch.float64)}


def test_the_check_is_calibrated_where_the_answer_is_known():
    """In the score-centred pool unscaled GRPO's mean is exactly (1 - 1/N) g and RLOO's exactly g: cos 1, scales
    3/4 and 1 (precondition: the pools' rewards differ), and so are the leave-one-out OTBs' (the default among
    them); Li et al.'s self-inclusive OTB's mean leans off g."""
    estimators = estimators_for()
    cells = []
    for seed in range(12):
        pool, space = _known_pool(seed=seed)
        assert pool["rewards"].unique().numel() > 1
        cells.append(prompt_cells(space, pool, 4, 600, torch.Generator().manual_seed(seed), estimators))
    rows, _ = summarise(cells, estimators, batch=4, boot=200, seed=0)
    for name, scale in (("grpo", 0.75), ("rloo", 1.0), ("otb_others_mean_loo", 1.0), ("otb_default", 1.0)):
        lo, hi = rows[name]["scale_ci"]
        assert lo < scale < hi and abs(rows[name]["scale"] - scale) < 0.03, (name, rows[name]["scale"])
        assert rows[name]["cos"] > 0.995, (name, rows[name]["cos"])
    assert rows["otb_self_inclusive"]["cos_ci"][1] < 0.99  # biased in direction, and the check sees it


def test_the_command_takes_a_tiny_model_a_lora_adapter_and_a_yaml_recipe(tmp_path, capsys):
    model_dir = save_tiny_checkpoint(tmp_path / "tiny")
    data = tmp_path / "prompts.jsonl"
    prompts_dataset().to_json(data)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({
        "model_name_or_path": model_dir, "use_peft": True, "lora_r": 4, "lora_alpha": 8, "num_generations": 4,
        "per_device_train_batch_size": 8, "max_completion_length": 12, "temperature": 0.7,
        "reward_funcs": ["tests.gradcheck.test_gradient_check.varied_reward"], "dataset_level": "add1",
    }))  # fmt: skip
    out = tmp_path / "gc"
    with pytest.warns(UserWarning, match="dataset_level"):
        status = main(["gradient-check", "--config", str(recipe), "--dataset", str(data),
                       "--prompts", "3", "--pool", "8", "--groups", "16", "--bootstrap", "50", "--out", str(out),
                       "--no-progress", "--plot"])  # fmt: skip
    assert status == 0
    report = json.loads((out / "gradient_check.json").read_text())
    assert report["meta"]["params"] == "adapter" and all("eps_star" in r for r in report["rows"].values())
    assert (out / "gradient_check.png").exists() and "otb_default" in capsys.readouterr().out


@pytest.mark.slow
def test_quick_on_the_embedded_model_end_to_end_offline(tmp_path):
    """What the issue's 'done when' runs: ``trl-otb gradient-check --quick --out DIR``, offline."""
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    cmd = [sys.executable, "-m", "trl_otb.cli", "gradient-check", "--quick", "--out", str(tmp_path), "--no-progress"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((tmp_path / "gradient_check.json").read_text())
    assert set(ESTIMATORS) <= set(report["rows"])
    assert all("cos" in row and "eps_star" in row for row in report["rows"].values())
    assert report["rows"]["grpo_std"]["cos"] >= 0.99
    assert "On this setup" in done.stdout


@pytest.mark.parametrize("space", ["last-block", "adapter"])
def test_per_token_gradients_are_each_tokens_own_exactly(space):
    """Against one autograd call per token: every row is that token's gradient, and the kappa coordinates are
    entries of it."""
    from peft import LoraConfig, get_peft_model

    from trl_otb.gradcheck.gram import linear_token_gradients
    from trl_otb.gradcheck.pools import measured_layers

    model, _ = tiny_model_and_tokenizer()
    if space == "adapter":
        model = get_peft_model(
            model, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", init_lora_weights=False)
        )
    layers = measured_layers(model, space)
    prompt, comp = torch.tensor([3, 5, 7, 2]), torch.tensor([9, 4, 11, 6, 8])
    (S,), (X,), _ = linear_token_gradients(model, layers, prompt, [comp], sketch_dim=0, chunk=2, kappa_dim=64)
    base = model.get_base_model() if space == "adapter" else model
    logits = base(input_ids=torch.cat([prompt, comp])[None]).logits[0, len(prompt) - 1 : -1].float()
    logp = torch.log_softmax(logits, -1).gather(1, comp[:, None])[:, 0]
    for t in range(len(comp)):
        grads = torch.autograd.grad(logp[t], [m.weight for m in layers], retain_graph=True, allow_unused=True)
        exact = torch.cat([torch.zeros(m.weight.numel()) if g is None else g.flatten() for g, m in zip(grads, layers)])
        assert exact.abs().max() > 0  # precondition: the token has a gradient here
        torch.testing.assert_close(S[t], exact, rtol=1e-4, atol=1e-6)
        nearest = (exact[None, :] - X[t][:, None]).abs().min(1).values
        assert nearest.max() <= 1e-5 * exact.abs().max()


def test_the_check_leaves_no_scratch_directory_behind_even_when_it_refuses(tmp_path, monkeypatch):
    import tempfile

    scratch_root = tmp_path / "tmp"
    scratch_root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch_root))
    seen = []
    real = tempfile.TemporaryDirectory

    def recording(*args, **kwargs):
        made = real(*args, **kwargs)
        seen.append(made.name)
        return made

    monkeypatch.setattr(tempfile, "TemporaryDirectory", recording)
    check(tmp_path)
    with pytest.raises(ValueError, match="Every one of the"):
        check(tmp_path, reward=tied_reward)
    assert len(seen) == 2 and all(name.startswith(str(scratch_root)) for name in seen)  # precondition: both used one
    assert list(scratch_root.iterdir()) == []


def test_without_a_config_the_check_takes_otbconfigs_defaults_and_on_cpu_its_cpu_settings():
    model, tokenizer = tiny_model_and_tokenizer()
    report = gradient_check(model, varied_reward, prompts_dataset(), None, processing_class=tokenizer, prompts=3,
                            pool_size=8, num_groups=8, bootstrap=20, progress=False, kappa_dim=128)  # fmt: skip
    defaults = OTBConfig(output_dir="x", use_cpu=True, bf16=False)
    assert report["meta"]["num_generations"] == defaults.num_generations
    assert report["meta"]["max_completion_length"] == defaults.max_completion_length
    assert "yours" not in report["rows"]  # the default estimator is the report's otb_default row
