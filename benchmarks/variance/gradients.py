"""Each parameter space's token Gram matrix K, and every estimator's gradient as a coefficient vector over the pool's
tokens: the inner products the statistics need, group by group, without forming a gradient.

In the LM head's weight space the score of token t is exactly s_t = (e_{y_t} - pi_t) h_t^T (h_t: the head's
input, pi_t: the sampling distribution), so every gradient is a coefficient vector c over the pool's tokens,
g = sum_t c_t (e_{y_t} - pi_t) h_t^T, and every inner product is c^T K c' with the token Gram matrix

    K_ab = <e_{y_a} - pi_a, e_{y_b} - pi_b> <h_a, h_b>,
    <e_{y_a} - pi_a, e_{y_b} - pi_b> = [y_a = y_b] - pi_b(y_a) - pi_a(y_b) + <pi_a, pi_b>.

No V x H gradient is ever formed. The probabilities are exact on a vocabulary subset S (every sampled token of the
pool plus each position's top-k); the only term left out is the part of <pi_a, pi_b> outside S, bounded by
min(m_a r_b, m_b r_a) (m: largest probability outside S, r: mass outside S), reported as ``tail_bound``.

In the LoRA adapter's space (``--spaces lora``; r=16, alpha=32, every linear layer of the body, as in
``examples/recipes/cpu_smollm2_lora.yaml``, at its initialisation, where B = 0 and only the B matrices get gradient)
there is no closed form: the gradient of log pi(y_t) with respect to every adapter weight is computed for every pool
token, by per-example gradients (each token's loss in its own copy of the sequence, truncated after that token; the
per-copy weight gradient is sum_pos grad_out^T input, read by hooks). These are projected by a fixed CountSketch to
``--sketch-dim`` coordinates (unbiased for inner products, relative error about sqrt(2 / dim) on a squared norm:
0.6% at 2^16; ``--sketch-dim 0`` keeps them exact), and K = S S^T. The cost is quadratic in the completion length,
which is why the long-answer run stays in the LM head.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch

from benchmarks.variance.estimators import SHARE_BINS, VARIANCE_ESTIMATORS, group_advantages, share_bin
from benchmarks.variance.sampling import draw_groups


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
    # In place, one [n, n] temporary at a time: at 16k tokens each [n, n] fp64 matrix is 2 GB.
    K = p_s @ p_s.T  # <pi_a, pi_b> on the subset
    p_at_y = p_s[:, col]  # [a, b] = pi_a(y_b)
    K.sub_(p_at_y).sub_(p_at_y.T)
    del p_at_y
    K.add_(ids[:, None] == ids[None, :])
    K.mul_(h @ h.T)
    tail_mass = (1 - p_s.sum(1)).clamp(min=0)
    # Largest probability outside S is at most the k-th largest (the top-k are in S).
    kth = torch.exp((h.float() * head_weight[top[:, -1]].float()).sum(-1) / temperature - log_z).double()
    bound = max(
        float(
            torch.minimum(
                kth[i : i + 1024, None] * tail_mass[None, :], tail_mass[i : i + 1024, None] * kth[None, :]
            ).max()
        )
        for i in range(0, len(kth), 1024)
    )
    return K, bound, int(subset.numel())


def attach_adapter(model, r=16, alpha=32):
    """The LoRA adapter of ``examples/recipes/cpu_smollm2_lora.yaml`` (every linear layer of the body), at init."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=r, lora_alpha=alpha, lora_dropout=0.0, target_modules="all-linear", task_type="CAUSAL_LM")
    return get_peft_model(model, config)


def adapter_token_gradients(model, prompt_ids, completions, sketch_dim=2**16, temperature=1.0, chunk=16, seed=0):
    """Per completion, S [T, D]: the gradient of log pi(y_t) w.r.t. every trainable Linear weight, one row per token.

    ``model`` is a causal LM whose trainable weights are all in ``nn.Linear`` modules (a PEFT LoRA model). Token t's
    gradient is a per-example gradient: the sequence is copied once per token of a chunk, copy j scores only its own
    token, and the weight gradient of copy j is sum_pos grad_out[j, pos]^T input[j, pos] (hooks read both). With
    ``sketch_dim`` > 0 each gradient is projected by a fixed CountSketch (coordinate i of the flattened weights goes
    to bucket b_i with sign s_i, so <Sx, Sy> is unbiased for <x, y>); with 0 the rows are the exact gradients.
    """
    layers = [m for m in model.modules() if isinstance(m, torch.nn.Linear) and m.weight.requires_grad]
    if not layers:
        raise ValueError("The model has no trainable nn.Linear weights: attach an adapter first (attach_adapter).")
    sizes = [m.weight.numel() for m in layers]
    generator = torch.Generator().manual_seed(seed)
    if sketch_dim:
        buckets = [torch.randint(sketch_dim, (n,), generator=generator) for n in sizes]
        signs = [torch.randint(0, 2, (n,), generator=generator).float() * 2 - 1 for n in sizes]
    starts = [0, *torch.tensor(sizes).cumsum(0).tolist()]
    dim = sketch_dim or starts[-1]
    state = {}

    def forward_hook(index):
        def hook(module, args, out):
            x = args[0].detach()

            def on_grad(grad_out):
                per_copy = torch.einsum("blo,bli->boi", grad_out.float(), x.float()).flatten(1)  # [k, numel]
                if sketch_dim:
                    state["S"].index_add_(1, buckets[index], per_copy * signs[index])
                else:
                    state["S"][:, starts[index] : starts[index + 1]] += per_copy

            out.register_hook(on_grad)

        return hook

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    body, head = base.get_decoder(), base.get_output_embeddings()
    handles = [m.register_forward_hook(forward_hook(i)) for i, m in enumerate(layers)]
    out = []
    try:
        for comp in completions:
            T, Lp = len(comp), len(prompt_ids)
            seq = torch.cat([prompt_ids, comp])
            rows = []
            for t0 in range(0, T, chunk):
                t1 = min(T, t0 + chunk)
                k = t1 - t0
                state["S"] = torch.zeros(k, dim)
                # Copy j predicts completion token t0 + j from position Lp + t0 + j - 1; later positions are cut.
                hidden = body(input_ids=seq[: Lp + t1 - 1].expand(k, -1)).last_hidden_state
                h = hidden[torch.arange(k), Lp + torch.arange(t0, t1) - 1]
                logp = torch.log_softmax(head(h).float() / temperature, dim=-1).gather(1, comp[t0:t1, None])
                logp.sum().backward()
                model.zero_grad(set_to_none=True)
                rows.append(state.pop("S"))
            out.append(torch.cat(rows))
    finally:
        for handle in handles:
            handle.remove()
    return out


def cached_lora_gram(adapter, data, cache_dir, key, prompt_index, horizon, sketch_dim, temperature):
    """K = S S^T of one prompt's adapter gradients at ``horizon`` (fp64), from the cache or computed and cached."""
    path = Path(cache_dir) / f"{key}-p{prompt_index:03d}-lora-h{horizon}-d{sketch_dim}.pt"
    if path.exists():
        return torch.load(path, weights_only=False)
    ids = [c["ids"][:horizon] for c in data["records"]]
    start = time.perf_counter()
    S = torch.cat(adapter_token_gradients(adapter, data["prompt_ids"], ids, sketch_dim, temperature)).double()
    out = {"K": S @ S.T, "seconds": time.perf_counter() - start}
    tmp = path.with_suffix(".tmp")
    torch.save(out, tmp)
    os.replace(tmp, path)
    return out


def group_coefficients(
    estimator, groups, rewards, proxy, mask, offsets, n_tokens, estimators=None, token_weight=None, adv=None
):
    """C [G, n]: coefficient of each pool token in g = (1/N) sum_i sum_t A_t^(i) s_t^(i), for every group.

    ``token_weight`` [G * N, T] multiplies each token's coefficient (a 0/1 filter keeps part of the gradient);
    ``adv`` reuses advantages already computed for these groups."""
    G, N = groups.shape
    flat = groups.flatten()
    if adv is None:
        adv = group_advantages(estimator, groups, rewards, proxy, mask, estimators)
    if token_weight is not None:
        adv = adv * token_weight
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


def position_centring(mask, K):
    """What ``analyse_prompt(..., centred=True)`` needs to move to the score-centred pool: the position of every
    pool token [n], the sum of K's rows over each position's tokens [T, n], and a function that centres
    coefficient rows: C [G, n] -> (C - D[:, pos], D) with D [G, T] each position's mean coefficient.

    In the pool, the masked scores of one position do not average to 0 (sum_j m_t^(j) s_t^(j) != 0: a finite
    sample), although their expectation does (E[s_t | prefix] = 0). A baseline b whose mean differs from the mean
    reward then looks biased against g_ref by sum_t (E R - E b_t) E_pool[m_t s_t], a term with expectation 0 over
    pools whose square is positive: the finite pool inflates the squared bias of exactly the baselines that are
    unbiased in truth (any baseline built from the other members only). Centring every token's score on its
    position's mean over the pool's active completions, s~_t = s_t - mean_j s_t^(j), makes the pool obey the
    identity: there a baseline independent of the member is exactly unbiased, g_ref~ does not depend on how the
    reward is centred, and GRPO's bias is still exactly ||g_ref~||^2 / N^2. sum_a c_a s~_a = sum_a c~_a s_a with
    c~ the coefficients less their position's mean, so the original K serves."""
    lengths = mask.sum(1).tolist()
    pos = torch.cat([torch.arange(int(L)) for L in lengths])
    T = mask.shape[1]
    n_t = mask.sum(0).double().clamp(min=1)
    EK = torch.zeros(T, K.shape[1], dtype=K.dtype).index_add_(0, pos, K)

    def centre(C):
        D = torch.zeros(C.shape[0], T, dtype=C.dtype).index_add_(1, pos, C) / n_t
        return C - D[:, pos], D

    return pos, EK, centre


def _cell_terms(C, KC, c_ref, K_c_ref, ref_sq, coords=None):
    """The per-group terms of one (N, estimator) cell: C [G, n] coefficient rows, KC = C K, c_ref, K c_ref; with
    ``coords`` (F [n, D], weights [D]: ``yardstick.head_coordinates``), also every group's and the reference's
    gradient on those D coordinates (for ``kappa``)."""
    c_bar = C.mean(0)
    extra = {} if coords is None else {"coords": ((C @ coords[0]).float(), c_ref @ coords[0], coords[1])}
    return {
        **extra,
        "sq": (KC * C).sum(1),  # ||g||^2
        "dot_bar": KC @ c_bar,
        "dot_ref": KC @ c_ref,
        "bar_sq": float(KC.mean(0) @ c_bar),
        "bar_ref": float(c_bar @ K_c_ref),
        "ref_sq": ref_sq,
        "gram": KC @ C.T,  # [G, G] <g_k, g_l>: the squared bias of resampled groups' mean
    }


def analyse_prompt(
    K, rewards, proxy, mask, Ns, num_groups, generator, estimators=None, decompose=(), decompose_Ns=(4,),
    centred=False, coords=None,
):  # fmt: skip
    """Per estimator and N: per-group ||g||^2, <g, g_bar>, <g, g_ref> terms and the groups' Gram matrix
    <g_k, g_l>, for the bootstrap. With ``centred``, also ``("centred", N, est)``: the same terms in the
    score-centred pool (``position_centring``).

    For the estimators in ``decompose`` and N in ``decompose_Ns``, also ``("bins", N, est)``: per SHARE_BINS bin,
    the variance of the part of g made of the tokens in that bin (E||g_bin - E g_bin||^2 over these groups) and the
    bin's share of tokens. ``coords`` (F [n, D], weights [D]) adds each group's gradient on D sampled coordinates
    to the cells the yardstick reads (the centred ones with ``centred``), for ``kappa``."""
    estimators = estimators or VARIANCE_ESTIMATORS
    M = rewards.numel()
    lengths = mask.sum(1)
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)[:-1]])
    n = int(lengths.sum())
    c_ref = reference_coefficients(rewards.double(), mask, offsets, n)
    K_ref = K @ c_ref
    ref_sq = float(c_ref @ K_ref)
    if centred:
        _, EK, centre = position_centring(mask, K)
        c_ref_c, d_ref = centre(c_ref[None])
        c_ref_c = c_ref_c[0]
        K_ref_c = K_ref - (d_ref @ EK)[0]
        ref_sq_c = float(c_ref_c @ K_ref_c)
    out = {}
    for N in Ns:
        groups = draw_groups(M, N, num_groups, generator)
        flat_mask = mask[groups.flatten()]
        # Members active at each position of each group, per member token: k [G * N, T].
        active = flat_mask.view(num_groups, N, -1).sum(1)
        bins = share_bin(active, N).repeat_interleave(N, dim=0)
        for est in estimators:
            adv = group_advantages(est, groups, rewards, proxy, mask, estimators)
            C = group_coefficients(est, groups, rewards, proxy, mask, offsets, n, adv=adv)
            if est in decompose and N in decompose_Ns:
                parts = {}
                for b, name in enumerate(SHARE_BINS):
                    keep = (bins == b).double()
                    Cb = group_coefficients(est, groups, rewards, proxy, mask, offsets, n, adv=adv, token_weight=keep)
                    Db = Cb - Cb.mean(0)
                    parts[name] = {
                        "var": float(((Db @ K) * Db).sum(1).mean()),
                        "token_share": float((keep * flat_mask).sum() / flat_mask.sum()),
                    }
                out[("bins", N, est)] = parts
            KC = C @ K  # [G, n]
            out[(N, est)] = _cell_terms(C, KC, c_ref, K_ref, ref_sq, None if centred else coords)
            if centred:
                C_c, D = centre(C)
                out[("centred", N, est)] = _cell_terms(C_c, KC - D @ EK, c_ref_c, K_ref_c, ref_sq_c, coords)
    return out
