"""benchmarks/variance.py: its head statistics and Gram-matrix algebra against brute-force autograd, the adapter
gradients and their sketch, the paired bootstrap, the pool cache and resuming, and the study variants. The other
benchmark scripts: the other files of tests/benchmarks/."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from trl_otb.testing import load_script

ROOT = Path(__file__).resolve().parents[2]
variance = load_script(ROOT / "benchmarks" / "variance.py")


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
    stats = variance.head_statistics(tiny_model, input_ids, attention_mask, comp, 1.0, top_k)
    return variance.completion_records(comp, lengths, *stats)


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


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_head_statistics_follow_the_definitions(tiny_model, temperature):
    """log Z, log pi(y) and sum_v pi(v)^2 of every completion token, against the softmax in fp64."""
    tiny_model.eval()
    input_ids, attention_mask, comp, lengths = tiny_pool(tiny_model)
    h, log_z, logp_y, sum_sq, top = variance.head_statistics(
        tiny_model, input_ids, attention_mask, comp, temperature, 8
    )
    L = comp.shape[1]
    with torch.no_grad():
        z = tiny_model(input_ids=input_ids, attention_mask=attention_mask).logits[:, -L - 1 : -1].double()
    z = z / temperature
    pi = torch.softmax(z, dim=-1)
    assert sum_sq.dtype == torch.float32 and h.shape[:2] == comp.shape and top.shape == (*comp.shape, 8)
    assert torch.allclose(sum_sq.double(), pi.square().sum(-1), rtol=1e-5, atol=0)
    assert torch.allclose(log_z.double(), torch.logsumexp(z, dim=-1), rtol=1e-5, atol=1e-5)
    assert torch.allclose(logp_y.double(), pi.log().gather(-1, comp[..., None]).squeeze(-1), rtol=1e-5, atol=1e-5)
    assert torch.allclose(z.gather(-1, top), z.topk(8, dim=-1).values, atol=1e-5)  # the 8 largest, ties aside


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


def test_sample_pool_keeps_completions_that_reach_the_horizon(tiny_model, tiny_tokenizer):
    """A completion ends at its first EOS (kept) or at the horizon; one without EOS keeps all its tokens."""
    tiny_model.eval()
    horizon = 30
    prompts = [[{"role": "user", "content": "what is 1 + 1?"}]]
    torch.manual_seed(0)
    pools, prompt_ids = variance.sample_pool(tiny_model, tiny_tokenizer, prompts, 24, horizon, 24)
    eos = tiny_tokenizer.eos_token_id
    lengths = [len(c["ids"]) for c in pools[0]]
    assert horizon in lengths, "no completion reached the horizon: the test needs one"
    assert any(n < horizon for n in lengths), "no completion ended early: the test needs one"
    for c in pools[0]:
        ids = c["ids"].tolist()
        assert eos not in ids[:-1] and (ids[-1] == eos or len(ids) == horizon)
        assert all(len(v) == len(ids) for k, v in c.items())
    assert prompt_ids[0].dim() == 1 and len(prompt_ids[0]) > 0


def adapter_with_nonzero_b(model, seed=0):
    """The script's LoRA adapter with random B matrices, so that A's gradients are not zero as at init."""
    adapter = variance.attach_adapter(model)
    g = torch.Generator().manual_seed(seed)
    for name, param in adapter.named_parameters():
        if "lora_B" in name:
            param.data = torch.randn(param.shape, generator=g) * 0.1
    adapter.eval()
    return adapter


def brute_force_adapter_gradients(adapter, input_ids, comp, lengths, prompt_len):
    """[n, P]: d log pi(y_t) / d (every trainable Linear weight), one autograd call per token, in module order."""
    weights = [m.weight for m in adapter.modules() if isinstance(m, torch.nn.Linear) and m.weight.requires_grad]
    rows = []
    for i, k in enumerate(lengths.tolist()):
        logits = adapter(input_ids=input_ids[i : i + 1, : prompt_len + k]).logits[0, prompt_len - 1 : -1]
        logp = torch.log_softmax(logits.float(), dim=-1).gather(-1, comp[i, :k, None]).squeeze(-1)
        for t in range(k):
            grads = torch.autograd.grad(logp[t], weights, retain_graph=True)
            rows.append(torch.cat([g.flatten() for g in grads]))
    return torch.stack(rows)


def test_adapter_token_gradients_equal_brute_force_autograd(tiny_model):
    adapter = adapter_with_nonzero_b(tiny_model)
    input_ids, _, comp, lengths = tiny_pool(tiny_model)
    prompt = input_ids[0, :5]
    comps = [comp[i, :k] for i, k in enumerate(lengths.tolist())]
    # chunk=3 splits completions into several chunks, so the truncation of later copies is exercised
    exact = torch.cat(variance.adapter_token_gradients(adapter, prompt, comps, sketch_dim=0, chunk=3))
    brute = brute_force_adapter_gradients(adapter, input_ids, comp, lengths, 5)
    assert exact.shape == brute.shape
    assert brute.abs().max() > 0
    assert torch.allclose(exact, brute, atol=1e-5, rtol=1e-4)
    # The trainable weights were left without accumulated gradients.
    assert all(p.grad is None for p in adapter.parameters())


def test_adapter_gradient_sketch_preserves_gradient_norms(tiny_model):
    """CountSketch is unbiased for inner products; at 2^16 coordinates ||g||^2 is within ~0.6% (std) of exact."""
    adapter = adapter_with_nonzero_b(tiny_model)
    input_ids, _, comp, lengths = tiny_pool(tiny_model)
    comps = [comp[i, :k] for i, k in enumerate(lengths.tolist())]
    exact = torch.cat(variance.adapter_token_gradients(adapter, input_ids[0, :5], comps, sketch_dim=0)).double()
    sketch = torch.cat(variance.adapter_token_gradients(adapter, input_ids[0, :5], comps, sketch_dim=2**16)).double()
    assert sketch.shape == (exact.shape[0], 2**16)
    for seed in range(5):
        c = torch.randn(exact.shape[0], generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
        g_exact, g_sketch = c @ exact, c @ sketch
        assert (g_sketch @ g_sketch).item() == pytest.approx((g_exact @ g_exact).item(), rel=0.05)


def test_adapter_gradients_need_trainable_linear_weights(tiny_model):
    for p in tiny_model.parameters():
        p.requires_grad_(False)
    with pytest.raises(ValueError, match="attach an adapter"):
        variance.adapter_token_gradients(tiny_model, torch.tensor([3, 4]), [torch.tensor([5])])


def test_count_reward():
    assert variance.count_reward("1, 2, 3", 3) == 1.0
    assert variance.count_reward("Sure, from 1 to 3: 1, 2, 3", 3) == 1.0  # a preamble does not count against it
    assert variance.count_reward("1, 2, 3, 4", 3) == 0.5  # overshoot: halved
    assert variance.count_reward("1, 2, 4", 3) == pytest.approx(1 / 3)
    assert variance.count_reward("no numbers", 3) == 0.0


# ----------------------------------------------------------------------------------------------------------------
# Variance: the paired bootstrap and the pool cache
# ----------------------------------------------------------------------------------------------------------------


def synthetic_cells(group_values, bar_sq=1.0, bar_ref=1.0, ref_sq=1.0):
    """One analyse_prompt-like cell whose per-group var terms ||g||^2 - 2 <g, g_bar> are ``group_values``."""
    sq = torch.as_tensor(group_values, dtype=torch.float64)
    return {
        "sq": sq,
        "dot_bar": torch.zeros_like(sq),
        "dot_ref": torch.zeros_like(sq),
        "bar_sq": bar_sq,
        "bar_ref": bar_ref,
        "ref_sq": ref_sq,
    }


def test_summarise_full_sample_values_follow_the_definitions():
    g = torch.Generator().manual_seed(0)
    per_prompt = []
    for p in range(3):
        cell = {}
        for est in ("otb", "grpo"):
            c = synthetic_cells(torch.rand(20, generator=g) * 10, bar_sq=1.0 + p, bar_ref=2.0 + p, ref_sq=3.0)
            c["dot_bar"] = torch.rand(20, generator=g)
            c["dot_ref"] = torch.rand(20, generator=g)
            cell[(4, est)] = c
        per_prompt.append(cell)
    table, paired = variance.summarise(per_prompt, [4], 50, g, estimators=["otb", "grpo"])
    for est in ("otb", "grpo"):
        cells = [pp[(4, est)] for pp in per_prompt]
        var = sum(float((c["sq"] - 2 * c["dot_bar"]).mean()) + c["bar_sq"] for c in cells) / 3
        mse = sum(float((c["sq"] - 2 * c["dot_ref"]).mean()) + c["ref_sq"] for c in cells) / 3
        scale = sum(c["bar_ref"] for c in cells) / sum(c["bar_sq"] for c in cells)
        row = table[f"N=4/{est}"]
        assert row["var"] == pytest.approx(var) and row["mse"] == pytest.approx(mse)
        assert row["scale"] == pytest.approx(scale) and row["var_scaled"] == pytest.approx(scale**2 * var)
        for key in ("var_scaled_ci", "var_scaled_ci_groups", "var_ci", "mse_ci"):
            lo, hi = row[key]
            assert lo <= hi
    test = paired["N=4/otb-grpo"]
    assert test["diff"] == pytest.approx(table["N=4/otb"]["var_scaled"] - table["N=4/grpo"]["var_scaled"])
    assert test["ratio"] == pytest.approx(table["N=4/otb"]["var_scaled"] / table["N=4/grpo"]["var_scaled"])


def test_paired_bootstrap_detects_a_small_shift_on_the_same_groups():
    """b's per-group values spread widely; a = b - 1 on every group. The marginal intervals overlap almost entirely,
    but the paired difference (the same prompts and groups in every resample) is -1 with an interval excluding 0."""
    g = torch.Generator().manual_seed(1)
    per_prompt = []
    for p in range(4):
        base = 50 + 20 * p + 10 * torch.randn(100, generator=g, dtype=torch.float64)
        per_prompt.append({(4, "grpo"): synthetic_cells(base), (4, "otb"): synthetic_cells(base - 1.0)})
    table, paired = variance.summarise(per_prompt, [4], 400, g, estimators=["otb", "grpo"])
    a_lo, a_hi = table["N=4/otb"]["var_scaled_ci"]
    b_lo, b_hi = table["N=4/grpo"]["var_scaled_ci"]
    assert a_hi > b_lo and b_hi > a_lo, "the marginal intervals should overlap (the point of pairing)"
    test = paired["N=4/otb-grpo"]
    assert test["diff"] == pytest.approx(-1.0)
    assert test["diff_ci"][0] == pytest.approx(-1.0) and test["diff_ci"][1] == pytest.approx(-1.0)
    assert test["significant"] and test["p_boot"] == 0.0 and test["ratio"] < 1
    assert test["groups_only"]["significant"]
    # Prompts that differ a lot make the two-level interval wider than the groups-only one.
    row = table["N=4/grpo"]
    assert (
        row["var_scaled_ci"][1] - row["var_scaled_ci"][0]
        > row["var_scaled_ci_groups"][1] - row["var_scaled_ci_groups"][0]
    )


def test_paired_bootstrap_finds_no_difference_between_equal_estimators():
    g = torch.Generator().manual_seed(2)
    per_prompt = []
    for _ in range(3):
        a, b = (10 + torch.randn(100, generator=g, dtype=torch.float64) for _ in range(2))
        per_prompt.append({(4, "grpo"): synthetic_cells(a), (4, "otb"): synthetic_cells(b)})
    _, paired = variance.summarise(per_prompt, [4], 400, g, estimators=["otb", "grpo"])
    test = paired["N=4/otb-grpo"]
    lo, hi = test["diff_ci"]
    assert lo < 0 < hi and not test["significant"] and test["p_boot"] > 0.05


def test_pool_cache_reuses_and_reproduces_pools(tiny_model, tiny_tokenizer, tmp_path):
    """A pool is sampled once and then read back; sampling the same prompt index again in an empty cache gives the
    same completions (seeded per prompt), so an interrupted run resumes to the same pools; a cached file for another
    prompt is refused."""
    tiny_model.eval()
    prompt = [{"role": "user", "content": "what is 2 + 2?"}]
    args = dict(pool_size=6, horizon=10, batch_size=6, temperature=1.0, top_k=8, seed=3)
    first, cached = variance.load_or_sample_pool(tiny_model, tiny_tokenizer, prompt, 5, tmp_path / "a", "k", **args)
    assert not cached and first["seed"] == variance.pool_seed(3, 5) and (tmp_path / "a" / "k-p005.pt").exists()
    torch.manual_seed(12345)  # the global RNG state before a call does not matter
    again, cached = variance.load_or_sample_pool(tiny_model, tiny_tokenizer, prompt, 5, tmp_path / "a", "k", **args)
    assert cached
    fresh, cached = variance.load_or_sample_pool(tiny_model, tiny_tokenizer, prompt, 5, tmp_path / "b", "k", **args)
    assert not cached
    for other in (again, fresh):
        assert len(other["records"]) == len(first["records"]) == 6
        for x, y in zip(first["records"], other["records"]):
            assert torch.equal(x["ids"], y["ids"]) and torch.allclose(x["h"], y["h"])
    with pytest.raises(ValueError, match="another prompt"):
        variance.load_or_sample_pool(
            tiny_model, tiny_tokenizer, [{"role": "user", "content": "other"}], 5, tmp_path / "a", "k", **args
        )


def test_variance_run_resumes_from_the_cache(tmp_path, monkeypatch):
    """A run cut short (the pools of the first candidates only) and resumed gives the JSON of an uninterrupted run."""
    threads = torch.get_num_threads()

    def run(out, cache, *extra):
        argv = ["variance.py", "--quick", "--groups", "16", "--bootstrap", "50", "--Ns", "2", "4"]
        argv += ["--out", str(out), "--cache", str(cache), *extra]
        monkeypatch.setattr(sys, "argv", argv)
        variance.main()
        return (
            json.loads((out / "variance_quick.json").read_text()) if (out / "variance_quick.json").exists() else None
        )

    try:
        assert run(tmp_path / "part", tmp_path / "c1", "--sample-only", "--prompts", "1") is None
        first_pools = sorted(p.name for p in (tmp_path / "c1").iterdir())
        resumed = run(tmp_path / "resumed", tmp_path / "c1")
        whole = run(tmp_path / "whole", tmp_path / "c2")
    finally:
        torch.set_num_threads(threads)
    assert first_pools and len(first_pools) < resumed["meta"]["candidates_tried"]
    assert resumed["results"] == whole["results"]
    res = resumed["results"]["lm_head"]["24"]
    assert len(res["prompts_kept"]) == 3 and set(res["paired"]) == {
        f"N={n}/otb-{b}" for n in (2, 4) for b in ("grpo", "ogb")
    }


def test_study_variants_obey_their_definitions():
    """The two study variants: OTB where every member is active, GRPO with equal weights and lengths, and their own
    rule past a member's end."""
    from trl_otb import grpo_advantages, otb_advantages

    g = torch.Generator().manual_seed(0)
    G, N, T = 5, 4, 9
    B = G * N
    group_ids = torch.arange(B) // N
    rewards = torch.rand(B, generator=g, dtype=torch.float64)
    proxy = 0.1 + torch.rand(B, T, generator=g, dtype=torch.float64)
    full = torch.ones(B, T)
    for fn in (variance.otb_carry_advantages, variance.otb_tail_last_advantages):
        # Equal lengths: OTB exactly; equal weights too: unscaled GRPO.
        assert torch.allclose(
            fn(rewards, proxy, full, group_ids), otb_advantages(rewards, proxy, full, group_ids).double()
        )
        ones = torch.ones(B, T, dtype=torch.float64)
        assert torch.allclose(
            fn(rewards, ones, full, group_ids), grpo_advantages(rewards, ones, full, group_ids).double()
        )
    lengths = torch.randint(1, T - 2, (B,), generator=g)
    lengths[::N] = T  # one member of each group is the longest ...
    lengths[1::N] = T - 3  # ... strictly, past T - 3
    mask = (torch.arange(T)[None, :] < lengths[:, None]).float()
    w = proxy * mask
    W_carry = torch.cumsum(w, 1)  # finished members keep their final energy
    adv = variance.otb_carry_advantages(rewards, proxy, mask, group_ids)
    baseline = rewards[:, None] - adv  # valid where mask is 1
    for grp in range(G):
        rows = slice(grp * N, (grp + 1) * N)
        expected = (rewards[rows, None] * W_carry[rows]).sum(0) / W_carry[rows].sum(0)
        assert torch.allclose(baseline[rows][mask[rows].bool()], expected.expand(N, T)[mask[rows].bool()])
    adv = variance.otb_tail_last_advantages(rewards, proxy, mask, group_ids)
    none = otb_advantages(rewards, proxy, mask, group_ids, tail="none").double()
    active = mask.view(G, N, T).sum(1).repeat_interleave(N, 0)
    multi = (active >= 2) & mask.bool()
    assert torch.allclose(adv[multi], none[multi])
    for grp in range(G):
        i = grp * N  # the lone longest member: past T - 3 its baseline is the one at position T - 4
        b_last = rewards[i] - none[i, T - 4]
        assert torch.allclose(rewards[i] - adv[i, T - 3 :], b_last.expand(3))
    assert torch.all(adv[mask == 0] == 0)


def test_share_bins_partition_every_groups_gradient():
    """The decomposition by share of active members splits each group's coefficient vector into parts that add up
    to it, and analyse_prompt reports token shares that sum to 1."""
    g = torch.Generator().manual_seed(0)
    M, T = 6, 7
    lengths = torch.tensor([7, 2, 5, 7, 1, 3])
    mask = torch.arange(T)[None, :] < lengths[:, None]
    rewards, proxy = torch.rand(M, generator=g), torch.rand(M, T, generator=g)
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)[:-1]])
    n = int(lengths.sum())
    groups = variance.draw_groups(M, 4, 10, g)
    active = mask[groups.flatten()].view(10, 4, T).sum(1)
    bins = variance.share_bin(active, 4).repeat_interleave(4, dim=0)
    C = variance.group_coefficients("otb", groups, rewards, proxy, mask, offsets, n)
    parts = [
        variance.group_coefficients("otb", groups, rewards, proxy, mask, offsets, n, token_weight=(bins == b).double())
        for b in range(len(variance.SHARE_BINS))
    ]
    assert torch.allclose(sum(parts), C)
    assert variance.share_bin(torch.tensor([1, 2, 3, 4]), 4).tolist() == [0, 1, 2, 3]
    A = torch.randn(n, n, generator=g, dtype=torch.float64)
    out = variance.analyse_prompt(A @ A.T, rewards, proxy, mask, [4], 10, g, decompose=("otb", "grpo"))
    for est in ("otb", "grpo"):
        bins_out = out[("bins", 4, est)]
        assert sum(b["token_share"] for b in bins_out.values()) == pytest.approx(1.0)
        assert all(b["var"] >= 0 for b in bins_out.values())
