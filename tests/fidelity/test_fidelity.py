"""trl_otb/fidelity: exact per-token score norms (exact.py), the proxies (proxies.py), the statistics (stats.py), the
report and its plot (report.py), the command (cli.py), and the LoRA / QLoRA paths (peft.py). The check during training:
tests/test_trainer_fidelity.py; the 4-bit CPU guard itself: tests/test_bnb.py."""

import json
import math
import sys

import pytest
import torch

from trl_otb.bnb import packed_4bit_layers
from trl_otb.fidelity import (
    CANDIDATE_PROXIES,
    FidelityReport,
    fidelity_check,
    fidelity_metrics,
    plot_reports,
    prepare_peft_model,
    run_fidelity_check,
    sample_completions,
    spearman,
    token_statistics,
)
from trl_otb.testing import arm_4bit_cpu_repack
from trl_otb.testing import load_qlora as _load_qlora

PROMPTS = ["hi", "count: 1 2 3"]
TEMPERATURE = 0.7


def _batch(model, tokenizer, num_samples=2, max_new_tokens=6):
    return sample_completions(
        model, tokenizer, PROMPTS, num_samples=num_samples, max_new_tokens=max_new_tokens, temperature=TEMPERATURE
    )


def _per_token_reference(model, batch):
    """||grad log pi(y_t)||^2 with one backward per token through the padded batch (no batching tricks)."""
    ids, attn, cmask = batch["input_ids"], batch["attention_mask"], batch["completion_mask"].bool()
    C = cmask.shape[1]
    params = [p for p in model.parameters() if p.requires_grad]
    model.eval()
    logits = model(input_ids=ids, attention_mask=attn).logits[:, -C - 1 : -1].float() / TEMPERATURE
    logps = torch.log_softmax(logits, -1).gather(-1, ids[:, -C:, None]).squeeze(-1)
    ref = torch.zeros(cmask.shape)
    for b, t in cmask.nonzero().tolist():
        grads = torch.autograd.grad(logps[b, t], params, retain_graph=True, allow_unused=True)
        ref[b, t] = sum(g.double().pow(2).sum() for g in grads if g is not None).float()
    return ref


def _lora(model, **kwargs):
    from peft import LoraConfig, get_peft_model

    # init_lora_weights=False: B != 0, so that lora_A has a gradient too.
    config = LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", lora_dropout=0.0, init_lora_weights=False)
    return get_peft_model(model, config, **kwargs)


@pytest.mark.parametrize("path", ["full", "lora"])
def test_exact_norms_match_one_backward_per_token(tiny_model, tiny_tokenizer, path):
    model = _lora(tiny_model) if path == "lora" else tiny_model
    batch = _batch(model, tiny_tokenizer)
    assert batch["completion_mask"].sum() >= 4
    # chunk_size=3 exercises several batched chunks per row.
    stats = token_statistics(
        model, batch["input_ids"], batch["attention_mask"], batch["completion_mask"], TEMPERATURE, chunk_size=3
    )
    ref = _per_token_reference(model, batch)
    mask = batch["completion_mask"].bool()
    assert torch.equal(stats.mask, mask)
    assert (stats.exact[mask] > 0).all()
    assert (stats.exact[~mask] == 0).all()
    torch.testing.assert_close(stats.exact, ref, rtol=1e-4, atol=1e-6)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert stats.num_trainable_params == trainable
    if path == "lora":
        assert trainable < sum(p.numel() for p in model.parameters()) / 2


def test_logit_head_and_hidden_proxies_are_the_gradient_norms_they_claim(tiny_model, tiny_tokenizer):
    batch = _batch(tiny_model, tiny_tokenizer)
    stats = token_statistics(
        tiny_model, batch["input_ids"], batch["attention_mask"], batch["completion_mask"], TEMPERATURE
    )
    ids, C = batch["input_ids"], batch["completion_mask"].shape[1]
    captured = {}
    hook = tiny_model.lm_head.register_forward_hook(lambda m, args, out: captured.__setitem__("h", args[0]))
    z = tiny_model(input_ids=ids, attention_mask=batch["attention_mask"]).logits.float() / TEMPERATURE
    hook.remove()
    h, S = captured["h"], ids.shape[1]
    y = ids[:, -C:]
    z = z[:, -C - 1 : -1]
    pi = torch.softmax(z, -1)
    logit_ref = (torch.nn.functional.one_hot(y, pi.shape[-1]) - pi).pow(2).sum(-1)
    for (b, t), logit in zip(stats.mask.nonzero().tolist(), stats.proxies["logit"][stats.mask]):
        torch.testing.assert_close(logit, logit_ref[b, t].detach(), rtol=1e-5, atol=1e-6)
        logp = torch.log_softmax(z[b, t], -1)[y[b, t]]
        g_head, g_h = torch.autograd.grad(logp, [tiny_model.lm_head.weight, h], retain_graph=True)
        torch.testing.assert_close(stats.proxies["head"][b, t], g_head.pow(2).sum(), rtol=1e-4, atol=1e-7)
        g_h = g_h[b, S - C - 1 + t]
        torch.testing.assert_close(stats.proxies["hidden"][b, t], g_h.pow(2).sum(), rtol=1e-4, atol=1e-7)
    assert (stats.proxies["uniform"][stats.mask] == 1).all()


def test_spearman_matches_scipy_with_ties():
    stats = pytest.importorskip("scipy.stats")
    x = torch.tensor([1.0, 2.0, 2.0, 3.0, 5.0, 5.0, 5.0, 0.5])
    y = torch.tensor([0.3, 0.1, 0.9, 0.9, 2.0, 1.0, 3.0, 0.0])
    assert spearman(x, y) == pytest.approx(stats.spearmanr(x.numpy(), y.numpy()).statistic, abs=1e-12)
    assert math.isnan(spearman(torch.ones(5), y[:5]))


def test_metrics_of_the_exact_norms_against_themselves_are_perfect():
    exact = torch.rand(4, 6) + 0.1
    mask = torch.ones(4, 6, dtype=torch.bool)
    mask[1, 4:] = False
    out = fidelity_metrics(
        exact,
        {"logit": 3 * exact, "uniform": torch.ones_like(exact)},
        mask,
        torch.tensor([0.0, 1, 1, 0]),
        torch.zeros(4, dtype=torch.long),
    )
    assert out["logit"].token_spearman == pytest.approx(1.0)
    assert out["logit"].energy_spearman == pytest.approx(1.0)
    assert out["logit"].baseline_rel_diff == pytest.approx(0.0, abs=1e-6)  # OTB's baseline ignores w's scale
    assert math.isnan(out["uniform"].token_spearman)
    assert out["uniform"].baseline_rel_diff > 0


def test_the_baseline_compared_is_the_groups_energy_weighted_baseline_over_all_members():
    """baseline_rel_diff compares Li et al.'s baseline (all members, verl's tail) under each proxy, whatever
    OTBConfig's default estimator is: by hand, B_t = sum_i R_i W_t^i / sum_i W_t^i."""
    exact = torch.tensor([[1.0, 1.0], [3.0, 1.0]])
    proxy = torch.ones(2, 2)
    mask = torch.ones(2, 2, dtype=torch.bool)
    rewards = torch.tensor([1.0, 0.0])
    out = fidelity_metrics(exact, {"uniform": proxy}, mask, rewards, torch.zeros(2, dtype=torch.long))
    exact_baseline = torch.tensor([[1 / 4, 2 / 6], [1 / 4, 2 / 6]])  # W = cumsum: (1, 2) and (3, 4)
    proxy_baseline = torch.full((2, 2), 0.5)  # equal energies: the plain mean
    expected = float((proxy_baseline - exact_baseline).norm() / exact_baseline.norm())
    assert out["uniform"].baseline_rel_diff == pytest.approx(expected, rel=1e-5)


def test_fidelity_check_report(tiny_model, tiny_tokenizer):
    batch = _batch(tiny_model, tiny_tokenizer)
    report = fidelity_check(
        tiny_model, batch["input_ids"], batch["attention_mask"], batch["completion_mask"], TEMPERATURE,
        group_ids=batch["group_ids"],
    )  # fmt: skip
    assert report.path == "full" and report.rewards == "random(seed=0)"
    assert report.num_tokens == int(batch["completion_mask"].sum())
    assert -1 <= report.token_spearman <= 1 and report.baseline_rel_diff >= 0
    assert set(report.proxies) == set(CANDIDATE_PROXIES) == {"logit", "uniform", "length", "head", "hidden"}
    assert report.values["exact"].shape == (report.num_tokens,)
    assert tiny_model.training is False or tiny_model.training is True  # mode restored, never raises
    assert all(p.grad is None for p in tiny_model.parameters())


def test_cli_writes_the_json_schema_and_plot(tiny_model_dir, tmp_path, capsys):
    from trl_otb.cli import main

    out, png = tmp_path / "fidelity.json", tmp_path / "fidelity.png"
    argv = ["fidelity", "--model", tiny_model_dir, "--peft", "all", "--num-prompts", "2", "--num-samples", "2"]
    argv += ["--max-new-tokens", "5", "--output-json", str(out), "--plot", str(png)]
    assert main(argv) == 0
    data = json.loads(out.read_text())
    assert set(data["paths"]) == {"full", "lora", "qlora"}
    for path, entry in data["paths"].items():
        for key in ("token_spearman", "token_pearson", "energy_spearman", "baseline_rel_diff", "num_tokens"):
            assert key in entry, (path, key)
        assert entry["path"] == path and entry["num_tokens"] > 0 and entry["seconds"] > 0
        assert set(entry["proxies"]) >= {"logit", "uniform", "length", "head", "hidden"}
        assert entry["proxies"]["uniform"]["token_spearman"] is None  # NaN (constant proxy) -> null
    assert data["paths"]["full"]["num_trainable_params"] > data["paths"]["lora"]["num_trainable_params"]
    assert png.stat().st_size > 1000
    assert "logit" in capsys.readouterr().out


def test_plots_without_matplotlib_say_how_to_install_it(monkeypatch, tmp_path):
    from trl_otb.cli import main

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # what an install without the plots extra sees
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)
    report = FidelityReport("full", 1, 1, 1, 1.0, "given", 0.0, 0.0, {}, {"exact": torch.ones(1)})
    with pytest.raises(ImportError, match=r"pip install 'trl-otb\[plots\]'"):
        plot_reports({"full": report}, str(tmp_path / "never.png"))
    # The command checks before loading any model: a path that does not exist is never reached.
    argv = ["fidelity", "--model", str(tmp_path / "no-model"), "--plot", str(tmp_path / "never.png")]
    with pytest.raises(SystemExit, match=r"pip install 'trl-otb\[plots\]' \(or pass no plot option"):
        main(argv)
    assert not (tmp_path / "never.png").exists()


def test_a_path_whose_extra_is_missing_fails_at_start_naming_the_extra(monkeypatch, tmp_path):
    import importlib.util

    from trl_otb.cli import main

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "bitsandbytes" else find_spec(name, *a)
    )
    out = tmp_path / "never.json"
    # The default --peft all includes qlora: refused before any model is loaded (this path does not exist).
    with pytest.raises(
        SystemExit,
        match=r"qlora path needs bitsandbytes.*pip install 'trl-otb\[quantization\]'.*--peft none or --peft lora",
    ):
        main(["fidelity", "--model", str(tmp_path / "no-model"), "--output-json", str(out)])
    assert not out.exists()


def test_an_unloadable_model_is_answered_in_one_line_with_this_commands_flag(tmp_path):
    from trl_otb.cli import main

    with pytest.raises(SystemExit) as info:
        main(["fidelity", "--model", str(tmp_path / "no-model"), "--peft", "none"])
    message = str(info.value.code)
    assert message.startswith("trl-otb fidelity: Could not load the model") and "\n" not in message
    assert "`--model embedded`" in message and "--model_name_or_path" not in message


def test_the_json_keeps_the_paths_that_finished_when_a_later_one_fails(tiny_model_dir, tmp_path, monkeypatch):
    from trl_otb.cli import main
    from trl_otb.fidelity import cli

    def lora_breaks(model, tokenizer, prompts, *, peft, **kwargs):
        if peft == "lora":
            raise RuntimeError("out of memory")
        return run_fidelity_check(model, tokenizer, prompts, peft=peft, **kwargs)

    monkeypatch.setattr(cli, "run_fidelity_check", lora_breaks)
    out = tmp_path / "fidelity.json"
    argv = ["fidelity", "--model", tiny_model_dir, "--peft", "all", "--num-prompts", "1", "--num-samples", "2"]
    with pytest.raises(RuntimeError, match="out of memory"):
        main([*argv, "--max-new-tokens", "4", "--output-json", str(out)])
    data = json.loads(out.read_text())
    assert set(data["paths"]) == {"full"} and data["failed"] == "lora"


# --------------------------------------------------------------------------- QLoRA and PEFT paths


def test_fidelity_on_qlora_runs_and_guards(tiny_4bit_dir, tiny_tokenizer):
    model = _load_qlora(tiny_4bit_dir)
    assert arm_4bit_cpu_repack(model) > 0  # the trap armed: unguarded, the check's generation would repack
    report = run_fidelity_check(
        model, tiny_tokenizer, PROMPTS, num_samples=2, max_new_tokens=4, peft="qlora", seed=1, lora_r=4
    )
    assert report.path == "qlora" and report.num_tokens > 0
    assert math.isfinite(report.token_spearman) or report.num_tokens < 2
    assert packed_4bit_layers(model) == []


def test_peft_path_must_match_the_model(tiny_model):
    with pytest.raises(ValueError, match="4-bit"):
        prepare_peft_model(tiny_model, "qlora")
    with pytest.raises(ValueError, match="peft must be"):
        prepare_peft_model(tiny_model, "dora")


@pytest.mark.slow
def test_fidelity_on_smollm2_lora(smollm2_dir):
    from trl_otb.demo.models import load_model_and_tokenizer

    model, tokenizer = load_model_and_tokenizer(smollm2_dir, dtype=torch.float32)
    report = run_fidelity_check(model, tokenizer, ["What is 2 + 3?"], num_samples=2, max_new_tokens=4, peft="lora")
    assert report.num_tokens > 0 and report.num_trainable_params > 0
    assert report.values["exact"].min() > 0
