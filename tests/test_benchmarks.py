"""The benchmark scripts: the variance script's Gram-matrix algebra against brute-force autograd, and every
script's ``--quick`` mode end to end (no timing is asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import variance  # noqa: E402


def tiny_pool(tiny_model, M=4, L=7, prompt_len=5, seed=0):
    """Random prompt + M random completions of ragged lengths, and their head statistics (the script's path)."""
    g = torch.Generator().manual_seed(seed)
    V = tiny_model.config.vocab_size
    prompt = torch.randint(3, V, (prompt_len,), generator=g)
    comp = torch.randint(3, V, (M, L), generator=g)
    lengths = torch.tensor([L, L - 2, 3, L - 1])[:M]
    mask = torch.arange(L)[None, :] < lengths[:, None]
    input_ids = torch.cat([prompt.expand(M, -1), comp], dim=1)
    attention_mask = torch.cat([torch.ones(M, prompt_len, dtype=torch.long), mask.long()], dim=1)
    return input_ids, attention_mask, comp, lengths


def pool_dicts(tiny_model, input_ids, attention_mask, comp, lengths, top_k):
    h, log_z, logp_y, sum_sq, top = variance.head_statistics(tiny_model, input_ids, attention_mask, comp, 1.0, top_k)
    return [
        {
            "ids": comp[i, :k],
            "h": h[i, :k],
            "log_z": log_z[i, :k],
            "logp_y": logp_y[i, :k],
            "sum_sq": sum_sq[i, :k],
            "top": top[i, :k],
        }
        for i, k in enumerate(lengths.tolist())
    ]


def per_token_head_gradients(model, input_ids, attention_mask, comp, lengths):
    """[n, V, H]: d log pi(y_t) / d W_head for every completion token, by autograd, in the pool's token order."""
    L = comp.shape[1]
    weight = model.get_output_embeddings().weight
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, -L - 1 : -1]
    logp = torch.log_softmax(logits.double(), dim=-1).gather(-1, comp[..., None]).squeeze(-1)
    grads = []
    for i, k in enumerate(lengths.tolist()):
        for t in range(k):
            (grad,) = torch.autograd.grad(logp[i, t], weight, retain_graph=True)
            grads.append(grad.double())
    return torch.stack(grads)


@pytest.mark.parametrize("top_k", [None, 8], ids=["full-vocab", "top8-subset"])
def test_gram_inner_products_equal_brute_force_head_gradients(tiny_model, top_k):
    tiny_model.eval()
    V = tiny_model.config.vocab_size
    input_ids, attention_mask, comp, lengths = tiny_pool(tiny_model)
    pool = pool_dicts(tiny_model, input_ids, attention_mask, comp, lengths, top_k or V)
    K, bound, _ = variance.token_gram(pool, tiny_model.get_output_embeddings().weight.detach())
    grads = per_token_head_gradients(tiny_model, input_ids, attention_mask, comp, lengths).flatten(1)
    brute = grads @ grads.T
    n = brute.shape[0]
    assert K.shape == (n, n)
    # Exact with the whole vocabulary; with a top-k subset the omitted tail term is within the reported bound.
    tol = 1e-4 if top_k is None else bound * brute.abs().max().item() + 1e-4
    assert torch.allclose(K, brute, atol=tol, rtol=1e-4)
    # And a gradient g = sum_t c_t s_t: its squared norm from K equals the materialised one.
    c = torch.randn(n, dtype=torch.float64)
    g = (c[:, None] * grads).sum(0)
    assert (c @ K @ c).item() == pytest.approx((g @ g).item(), rel=1e-4 if top_k is None else 2e-2)


def test_group_coefficients_reproduce_the_estimators_gradient(tiny_model):
    """g = (1/N) sum_i sum_t A_t^(i) s_t^(i) from coefficient vectors equals the brute-force sum, for OTB."""
    tiny_model.eval()
    V = tiny_model.config.vocab_size
    input_ids, attention_mask, comp, lengths = tiny_pool(tiny_model)
    pool = pool_dicts(tiny_model, input_ids, attention_mask, comp, lengths, V)
    K, _, _ = variance.token_gram(pool, tiny_model.get_output_embeddings().weight.detach())
    rewards = [1.0, 0.0, 1.0, 0.0]
    R, proxy, mask = variance.prompt_tensors(pool, rewards, horizon=100)
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), mask.sum(1).cumsum(0)[:-1]])
    groups = torch.tensor([[0, 1, 2], [3, 1, 0]])
    C = variance.group_coefficients("otb", groups, R, proxy, mask, offsets, int(mask.sum()))
    grads = per_token_head_gradients(tiny_model, input_ids, attention_mask, comp, lengths).flatten(1)
    from trl_otb import otb_advantages

    for row, members in zip(C, groups):
        adv = otb_advantages(R[members], proxy[members], mask[members], torch.zeros(3, dtype=torch.long)).double()
        token_rows = [int(offsets[j]) + t for j in members.tolist() for t in range(int(mask[j].sum()))]
        coef = torch.cat([adv[i, : int(mask[j].sum())] for i, j in enumerate(members.tolist())]) / 3
        g_brute = (coef[:, None] * grads[torch.tensor(token_rows)]).sum(0)
        assert (row @ K @ row).item() == pytest.approx((g_brute @ g_brute).item(), rel=1e-4)


SCRIPTS = ["advantages_speed.py", "overhead.py", "variance.py", "sample_efficiency.py"]


@pytest.mark.slow
@pytest.mark.parametrize("script", SCRIPTS)
def test_quick_mode_writes_json_and_png(script, tmp_path):
    stem = script.removesuffix(".py") + "_quick"
    subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), "--quick", "--out", str(tmp_path)],
        check=True,
        cwd=ROOT,
        capture_output=True,
    )
    data = json.loads((tmp_path / f"{stem}.json").read_text())
    assert data["meta"]["command"].startswith(f"python benchmarks/{script}")
    assert (tmp_path / f"{stem}.png").stat().st_size > 0
