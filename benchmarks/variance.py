"""Gradient variance of the advantage estimators, exactly, in the output-projection (LM head) parameter space.

    python benchmarks/variance.py            # embedded SmolLM2-135M, generated math prompts, horizons 64 and 256
    python benchmarks/variance.py --quick    # tiny random Llama, a cheap synthetic reward (CI, seconds)

Method. For each prompt, a pool of M completions is sampled once (temperature 1) at the longest horizon and scored
with the accuracy reward; a shorter horizon h uses the same completions cut to their first h tokens (exactly what
sampling with max_completion_length=h gives) and scores them again. Only prompts whose rewards differ within the
pool at that horizon are kept. Many groups of N completions are drawn i.i.d. (with replacement) from each pool; each estimator
turns a group into token advantages A_t^(i) and a gradient estimate g = (1/N) sum_i sum_t A_t^(i) s_t^(i).

In the LM head's weight space the score of token t is exactly s_t = (e_{y_t} - pi_t) h_t^T (h_t: the head's
input, pi_t: the sampling distribution), so every gradient is a coefficient vector c over the pool's tokens,
g = sum_t c_t (e_{y_t} - pi_t) h_t^T, and every inner product is c^T K c' with the token Gram matrix

    K_ab = <e_{y_a} - pi_a, e_{y_b} - pi_b> <h_a, h_b>,
    <e_{y_a} - pi_a, e_{y_b} - pi_b> = [y_a = y_b] - pi_b(y_a) - pi_a(y_b) + <pi_a, pi_b>.

No V x H gradient is ever formed. The probabilities are exact on a vocabulary subset S (every sampled token of the
pool plus each position's top-k); the only term left out is the part of <pi_a, pi_b> outside S, bounded by
min(m_a r_b, m_b r_a) (m: largest probability outside S, r: mass outside S), reported as ``tail_bound``.

Reported per horizon, N and estimator (mean over prompts, 95% bootstrap CIs over prompts and groups):
- ``var``: E||g - E g||^2, the variance around the estimator's own mean;
- ``mse``: E||g - g_ref||^2 against the pool reference g_ref = (1/M) sum_j (R_j - mean_k R_k) S_j, the policy
  gradient of the pool's empirical distribution (RLOO on groups drawn from it is unbiased for it);
- ``var_scaled``: a^2 var, with a = <E g, g_ref> / ||E g||^2 (over all prompts) the scalar that best matches the
  reference: it puts estimators whose self-including baselines shrink the gradient (by ~(N-1)/N) on an equal
  footing. Estimators: grpo (unscaled), grpo_std, rloo, opo, ogb, otb, otb_loo.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from trl_otb.baselines import compute_advantages  # noqa: E402

HERE = Path(__file__).resolve().parent
ESTIMATORS = {
    "grpo": ("grpo", {"scale": "none"}),
    "grpo_std": ("grpo", {"scale": "group"}),
    "rloo": ("rloo", {}),
    "opo": ("opo", {}),
    "ogb": ("ogb", {}),
    "otb": ("otb", {}),
    "otb_loo": ("otb", {"leave_one_out": True}),
}


# ----------------------------------------------------------------------------------------------------------------
# Pool: completions, rewards, and per-token head inputs / probabilities
# ----------------------------------------------------------------------------------------------------------------


def head_statistics(model, input_ids, attention_mask, completion_ids, temperature=1.0, top_k=64):
    """Per completion token: head input h [B, L, H], log Z [B, L], log pi(y) [B, L], sum pi^2 [B, L], top-k ids.

    One no-grad forward; the head input is captured by a hook on the output embedding, so it is exactly what the
    head multiplies, whatever the architecture's final norm.
    """
    L = completion_ids.shape[1]
    captured = {}
    head = model.get_output_embeddings()
    hook = head.register_forward_hook(lambda m, a, o: captured.__setitem__("h", a[0]))
    try:
        with torch.no_grad():
            logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, -L - 1 : -1].float()
    finally:
        hook.remove()
    h = captured["h"][:, -L - 1 : -1].float()
    z = logits / temperature
    log_z = torch.logsumexp(z, dim=-1)
    logp_y = z.gather(-1, completion_ids[..., None]).squeeze(-1) - log_z
    sum_sq = torch.exp(torch.logsumexp(2 * z, dim=-1) - 2 * log_z)
    top = z.topk(min(top_k, z.shape[-1]), dim=-1).indices
    return h, log_z, logp_y, sum_sq, top


def sample_pool(model, tokenizer, prompts, pool_size, horizon, batch_size, temperature=1.0, top_k=64):
    """Sample ``pool_size`` completions per prompt and collect the head statistics of every completion token."""
    tokenizer.padding_side = "left"
    pools = []
    eos = tokenizer.eos_token_id
    for p_index, prompt in enumerate(prompts):
        text = tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
        enc = tokenizer([text], return_tensors="pt", add_special_tokens=False)
        completions = []
        for start in range(0, pool_size, batch_size):
            n = min(batch_size, pool_size - start)
            with torch.no_grad():
                out = model.generate(
                    **enc,
                    do_sample=True,
                    temperature=temperature,
                    top_k=0,
                    top_p=1.0,
                    max_new_tokens=horizon,
                    num_return_sequences=n,
                    pad_token_id=tokenizer.pad_token_id,
                    eos_token_id=eos,
                )
            comp = out[:, enc["input_ids"].shape[1] :]
            # TRL's completion mask: every token up to and including the first EOS.
            is_eos = comp == eos
            first = torch.where(is_eos.any(1), is_eos.int().argmax(1), torch.full_like(is_eos[:, 0], comp.shape[1]))
            lengths = torch.clamp(first + 1, max=comp.shape[1])
            mask = torch.arange(comp.shape[1])[None, :] < lengths[:, None]
            comp = torch.where(mask, comp, torch.full_like(comp, tokenizer.pad_token_id))
            input_ids = torch.cat([enc["input_ids"].expand(n, -1), comp], dim=1)
            attention_mask = torch.cat([enc["attention_mask"].expand(n, -1), mask.long()], dim=1)
            # Chunks of 8 sequences: the full-vocabulary logits of a chunk are the largest tensor held.
            stats = [
                head_statistics(
                    model, input_ids[i : i + 8], attention_mask[i : i + 8], comp[i : i + 8], temperature, top_k
                )
                for i in range(0, n, 8)
            ]
            h, log_z, logp_y, sum_sq, top = (torch.cat(parts) for parts in zip(*stats))
            for i in range(n):
                k = int(lengths[i])
                completions.append(
                    {
                        "ids": comp[i, :k],
                        "h": h[i, :k],
                        "log_z": log_z[i, :k],
                        "logp_y": logp_y[i, :k],
                        "sum_sq": sum_sq[i, :k],
                        "top": top[i, :k],
                    }
                )
        pools.append(completions)
        print(
            f"  pool {p_index + 1}/{len(prompts)} sampled, lengths {[len(c['ids']) for c in completions]}", flush=True
        )
    return pools


def token_gram(completions, head_weight, temperature=1.0):
    """K [n, n] (fp64) over all tokens of one pool, the token order (completion, position), and the tail bound."""
    ids = torch.cat([c["ids"] for c in completions])
    h = torch.cat([c["h"] for c in completions]).double()
    log_z = torch.cat([c["log_z"] for c in completions])
    top = torch.cat([c["top"] for c in completions])
    subset = torch.unique(torch.cat([ids, top.flatten()]))
    # Exact probabilities on the subset: head rows of S times h, normalised by the full-vocabulary log Z.
    p_s = torch.exp((h.float() @ head_weight[subset].float().T) / temperature - log_z[:, None]).double()
    col = torch.searchsorted(subset, ids)
    p_at_y = p_s[:, col]  # [a, b] = pi_a(y_b)
    same = (ids[:, None] == ids[None, :]).double()
    prob_gram = same - p_at_y - p_at_y.T + p_s @ p_s.T
    tail_mass = (1 - p_s.sum(1)).clamp(min=0)
    # Largest probability outside S is at most the k-th largest (the top-k are in S).
    kth = torch.exp((h.float() * head_weight[top[:, -1]].float()).sum(-1) / temperature - log_z).double()
    bound = torch.minimum(kth[:, None] * tail_mass[None, :], tail_mass[:, None] * kth[None, :])
    K = prob_gram * (h @ h.T)
    return K, float(bound.max()), int(subset.numel())


# ----------------------------------------------------------------------------------------------------------------
# Estimators as coefficient vectors over pool tokens
# ----------------------------------------------------------------------------------------------------------------


def group_coefficients(estimator, groups, rewards, proxy, mask, offsets, n_tokens):
    """C [G, n]: coefficient of each pool token in g = (1/N) sum_i sum_t A_t^(i) s_t^(i), for every group."""
    name, options = ESTIMATORS[estimator]
    G, N = groups.shape
    flat = groups.flatten()
    adv = compute_advantages(
        name, rewards[flat], proxy[flat], mask[flat], torch.arange(G).repeat_interleave(N), **options
    ).double()
    T = mask.shape[1]
    C = torch.zeros(G, n_tokens + 1, dtype=torch.float64)
    token = offsets[flat][:, None] + torch.arange(T)[None, :]
    token = torch.where(mask[flat], token, torch.full_like(token, n_tokens))  # padding -> a dropped column
    rows = torch.arange(G).repeat_interleave(N)[:, None].expand(-1, T)
    C.index_put_((rows.reshape(-1), token.reshape(-1)), (adv / N).reshape(-1), accumulate=True)
    return C[:, :n_tokens]


def reference_coefficients(rewards, mask, offsets, n_tokens):
    """Pool policy gradient (1/M) sum_j (R_j - mean_k R_k) S_j: what RLOO on groups drawn from the pool estimates."""
    M = rewards.numel()
    coef = (rewards - rewards.mean()) / M
    c = torch.zeros(n_tokens, dtype=torch.float64)
    for j in range(M):
        k = int(mask[j].sum())
        c[offsets[j] : offsets[j] + k] = coef[j]
    return c


def draw_groups(M, N, count, generator):
    """Groups of N i.i.d. draws from the pool (with replacement): sampling from the pool's empirical distribution,
    so a group's variance does not shrink as N approaches M (drawing without replacement would)."""
    return torch.randint(M, (count, N), generator=generator)


def analyse_prompt(K, rewards, proxy, mask, Ns, num_groups, generator):
    """Per estimator and N: per-group ||g||^2, <g, g_bar>, <g, g_ref> terms, for the bootstrap."""
    M = rewards.numel()
    lengths = mask.sum(1)
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)[:-1]])
    n = int(lengths.sum())
    c_ref = reference_coefficients(rewards.double(), mask, offsets, n)
    K_ref = K @ c_ref
    ref_sq = float(c_ref @ K_ref)
    out = {}
    for N in Ns:
        groups = draw_groups(M, N, num_groups, generator)
        for est in ESTIMATORS:
            C = group_coefficients(est, groups, rewards, proxy, mask, offsets, n)
            KC = C @ K  # [G, n]
            sq = (KC * C).sum(1)  # ||g||^2
            c_bar = C.mean(0)
            out[(N, est)] = {
                "sq": sq,
                "dot_bar": KC @ c_bar,
                "dot_ref": KC @ c_ref,
                "bar_sq": float(c_bar @ K @ c_bar),
                "bar_ref": float(c_bar @ K_ref),
                "ref_sq": ref_sq,
            }
    return out


def prompt_tensors(completions, rewards, horizon):
    """Rewards [M], proxy [M, T], mask [M, T] for one pool cut at ``horizon`` tokens."""
    M = len(completions)
    T = max(min(len(c["ids"]), horizon) for c in completions)
    proxy = torch.zeros(M, T)
    mask = torch.zeros(M, T, dtype=torch.bool)
    for j, c in enumerate(completions):
        k = min(len(c["ids"]), horizon)
        p = torch.exp(c["logp_y"][:k])
        proxy[j, :k] = (1 - 2 * p + c["sum_sq"][:k]).clamp(0, 2)  # w_t = ||e_y - pi||^2
        mask[j, :k] = True
    return torch.tensor(rewards, dtype=torch.float32), proxy, mask


def horizon_token_index(completions, horizon):
    """Indices, in the full pool's token order, of the tokens within the first ``horizon`` of each completion."""
    index, offset = [], 0
    for c in completions:
        L = len(c["ids"])
        index.append(torch.arange(offset, offset + min(L, horizon)))
        offset += L
    return torch.cat(index)


# ----------------------------------------------------------------------------------------------------------------
# Statistics
# ----------------------------------------------------------------------------------------------------------------


def summarise(per_prompt, Ns, boot, generator):
    """Means over prompts with two-level bootstrap CIs (prompts, then groups within each prompt)."""
    P = len(per_prompt)
    table = {}
    for N in Ns:
        for est in ESTIMATORS:
            cells = [pp[(N, est)] for pp in per_prompt]
            num = sum(c["bar_ref"] for c in cells)
            den = sum(c["bar_sq"] for c in cells)
            scale = num / den if den > 0 else float("nan")

            def stats(idx_prompts, idx_groups, cells=cells):
                var = mse = 0.0
                for p, g in zip(idx_prompts, idx_groups):
                    c = cells[p]
                    sq, db, dr = c["sq"][g], c["dot_bar"][g], c["dot_ref"][g]
                    var += float((sq - 2 * db).mean()) + c["bar_sq"]
                    mse += float((sq - 2 * dr).mean()) + c["ref_sq"]
                k = len(idx_prompts)
                return var / k, mse / k

            full = stats(range(P), [torch.arange(len(c["sq"])) for c in cells])
            samples = []
            for _ in range(boot):
                ps = torch.randint(P, (P,), generator=generator).tolist()
                gs = [torch.randint(len(cells[p]["sq"]), (len(cells[p]["sq"]),), generator=generator) for p in ps]
                samples.append(stats(ps, gs))
            v = torch.tensor(samples)
            lo, hi = torch.quantile(v, 0.025, dim=0).tolist(), torch.quantile(v, 0.975, dim=0).tolist()
            ref_norm = sum(c["ref_sq"] for c in cells) / P
            table[f"N={N}/{est}"] = {
                "N": N,
                "estimator": est,
                "var": full[0],
                "var_ci": [lo[0], hi[0]],
                "mse": full[1],
                "mse_ci": [lo[1], hi[1]],
                "scale": scale,
                "var_scaled": scale**2 * full[0],
                "var_scaled_ci": [scale**2 * lo[0], scale**2 * hi[0]],
                "ref_sq_norm": ref_norm,
            }
    return table


def matching_n(table, Ns, target_est="grpo", at_est="otb", at_n=4, key="var_scaled"):
    """The N (log-log interpolation) at which ``target_est`` has the ``key`` of ``at_est`` at N=``at_n``."""
    goal = table[f"N={at_n}/{at_est}"][key]
    pts = [(N, table[f"N={N}/{target_est}"][key]) for N in Ns]
    for (n0, v0), (n1, v1) in zip(pts, pts[1:]):
        if (v0 - goal) * (v1 - goal) <= 0 and v0 != v1 and v0 > 0 and v1 > 0 and goal > 0:
            t = (math.log(goal) - math.log(v0)) / (math.log(v1) - math.log(v0))
            return math.exp(math.log(n0) + t * (math.log(n1) - math.log(n0)))
    if pts and goal >= pts[0][1]:
        return f"<= {pts[0][0]}"
    return f"> {pts[-1][0]}"


# ----------------------------------------------------------------------------------------------------------------
# Models, prompts, rewards
# ----------------------------------------------------------------------------------------------------------------


def setup(quick: bool, num_prompts: int, seed: int):
    """(model, tokenizer, prompts, reward_fn(completion_ids, texts, prompt_index) -> list[float])."""
    if quick:
        sys.path.insert(0, str(HERE.parent / "tests"))
        from conftest import build_tiny_model, build_tiny_tokenizer

        tokenizer = build_tiny_tokenizer()
        model = build_tiny_model(len(tokenizer), tokenizer.eos_token_id)
        prompts = [[{"role": "user", "content": f"what is {i} + {i % 3}?"}] for i in range(num_prompts)]

        def reward(ids, texts, p):  # synthetic, varies within groups: parity of length and first token
            return [float((len(x) + (int(x[0]) if len(x) else 0) + p) % 2) for x in ids]

        return model, tokenizer, prompts, reward
    from trl_otb.data import load_math_dataset
    from trl_otb.models import load_model_and_tokenizer
    from trl_otb.rewards import accuracy_reward

    model, tokenizer = load_model_and_tokenizer(dtype=torch.float32)
    data = load_math_dataset(split="train", num_train=num_prompts, seed=seed)
    prompts = [row["prompt"] for row in data]
    answers = [row["answer"] for row in data]

    def reward(ids, texts, p):
        return [float(r or 0.0) for r in accuracy_reward(texts, [answers[p]] * len(texts))]

    return model, tokenizer, prompts, reward


def plot(results, Ns, horizons, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    fig, axes = plt.subplots(1, len(horizons) + 1, figsize=(4.2 * (len(horizons) + 1), 3.8))
    for ax, h in zip(axes, horizons):
        table = results[str(h)]["table"]
        if not table:
            continue
        for est in ESTIMATORS:
            y = [table[f"N={N}/{est}"]["var_scaled"] for N in Ns]
            lo = [table[f"N={N}/{est}"]["var_scaled_ci"][0] for N in Ns]
            hi = [table[f"N={N}/{est}"]["var_scaled_ci"][1] for N in Ns]
            style = dict(lw=2.5, color="black") if est == "otb" else {}
            line = ax.plot(Ns, y, marker="o", label=est, **style)[0]
            ax.fill_between(Ns, lo, hi, color=line.get_color(), alpha=0.12)
        ax.set(xscale="log", yscale="log", xlabel="group size N", title=f"horizon {h}")
        ax.set_xticks(Ns, [str(n) for n in Ns])
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_ylabel("rescaled variance (LM head)")
    ax = axes[-1]
    N4 = 4 if 4 in Ns else Ns[0]
    for est in ESTIMATORS:
        ys = [results[str(h)]["table"].get(f"N={N4}/{est}", {}).get("var_scaled", float("nan")) for h in horizons]
        ax.plot(horizons, ys, marker="o", label=est, **(dict(lw=2.5, color="black") if est == "otb" else {}))
    ax.set(xscale="log", xlabel="horizon (max completion tokens)", title=f"N={N4}")
    ax.set_xticks(horizons, [str(h) for h in horizons])
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_ylabel("rescaled variance (LM head)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny random model, synthetic reward (CI)")
    parser.add_argument("--prompts", type=int, default=None, help="candidate prompts (default 3, quick 3)")
    parser.add_argument("--pool", type=int, default=None, help="completions per prompt (default 16, quick 12)")
    parser.add_argument("--horizons", type=int, nargs="+", default=None, help="default 64 256 (quick 8 24)")
    parser.add_argument("--Ns", type=int, nargs="+", default=None, help="group sizes (default 2 4 8 16)")
    parser.add_argument("--groups", type=int, default=None, help="random groups per prompt and N (default 100)")
    parser.add_argument("--bootstrap", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=32, help="completions per generate call")
    parser.add_argument("--top-k", type=int, default=64, help="per-token top-k kept in the vocabulary subset")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument("--replot", action="store_true", help="only redraw the PNG from the JSON in --out")
    args = parser.parse_args()
    if args.replot:
        stem = Path(args.out) / ("variance_quick" if args.quick else "variance")
        data = json.loads(stem.with_suffix(".json").read_text())
        horizons = sorted(int(h) for h in data["results"])
        plot(data["results"], data["meta"]["Ns"], horizons, stem.with_suffix(".png"))
        return
    torch.set_num_threads(args.threads)
    q = args.quick
    num_prompts = args.prompts or 3
    pool_size = args.pool or (12 if q else 16)
    horizons = sorted(args.horizons or ([8, 24] if q else [64, 256]))
    Ns = args.Ns or ([2, 4, 8] if q else [2, 4, 8, 16])
    num_groups = args.groups or (64 if q else 100)
    torch.manual_seed(args.seed)
    generator = torch.Generator().manual_seed(args.seed)

    start = time.perf_counter()
    model, tokenizer, prompts, reward_fn = setup(q, num_prompts, args.seed)
    model.eval()
    head_weight = model.get_output_embeddings().weight.detach()
    pools = sample_pool(model, tokenizer, prompts, pool_size, max(horizons), args.batch_size, top_k=args.top_k)
    sampled_s = time.perf_counter() - start
    results = {}
    for h in horizons:
        per_prompt, kept, bounds, subset_sizes, mean_len = [], [], [], [], []
        for p, comps in enumerate(pools):
            ids = [c["ids"][:h] for c in comps]
            texts = tokenizer.batch_decode(ids, skip_special_tokens=True)
            rewards = reward_fn([x.tolist() for x in ids], texts, p)
            if len(set(rewards)) < 2:
                continue
            cut = [{k: v[:h] for k, v in c.items()} for c in comps]
            K, bound, subset = token_gram(cut, head_weight)
            R, proxy, mask = prompt_tensors(comps, rewards, h)
            per_prompt.append(analyse_prompt(K, R, proxy, mask, Ns, num_groups, generator))
            kept.append({"prompt": p, "mean_reward": sum(rewards) / len(rewards)})
            bounds.append(bound)
            subset_sizes.append(subset)
            mean_len.append(float(mask.sum(1).float().mean()))
        table = summarise(per_prompt, Ns, args.bootstrap, generator) if per_prompt else {}
        answer = matching_n(table, Ns) if table and 4 in Ns else None
        results[str(h)] = {
            "horizon": h,
            "prompts_kept": kept,
            "mean_completion_tokens": sum(mean_len) / max(len(mean_len), 1),
            "tail_bound_max": max(bounds, default=0.0),
            "vocab_subset_sizes": subset_sizes,
            "grpo_N_matching_otb_N4": answer,
            "grpo_std_N_matching_otb_N4": matching_n(table, Ns, "grpo_std") if answer is not None else None,
            "table": table,
        }
        print(f"horizon {h}: {len(kept)} prompts kept, mean length {results[str(h)]['mean_completion_tokens']:.1f}")
        for key, row in table.items():
            print(
                f"  {key:16s} var {row['var']:.4g}  mse {row['mse']:.4g}  scale {row['scale']:.3f}  "
                f"var_scaled {row['var_scaled']:.4g} [{row['var_scaled_ci'][0]:.4g}, {row['var_scaled_ci'][1]:.4g}]"
            )
        print(f"  GRPO N matching OTB at N=4 (rescaled variance): {answer}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = "variance_quick" if q else "variance"
    meta = {
        "command": " ".join(["python benchmarks/variance.py", *sys.argv[1:]]),
        "model": "tiny random Llama" if q else "embedded SmolLM2-135M-Instruct",
        "prompts_sampled": num_prompts,
        "pool": pool_size,
        "Ns": Ns,
        "groups_per_prompt": num_groups,
        "bootstrap": args.bootstrap,
        "top_k": args.top_k,
        "sampling_seconds": sampled_s,
        "total_seconds": time.perf_counter() - start,
    }
    (out / f"{stem}.json").write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    plot(results, Ns, horizons, out / f"{stem}.png")
    print(f"wrote {out / stem}.json and .png ({meta['total_seconds']:.0f} s)")


if __name__ == "__main__":
    main()
