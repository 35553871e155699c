"""Each parameter space's token Gram matrix K, and every gradient as a coefficient vector over a pool's tokens.

A group's policy-gradient estimate is g = (1/N) sum_i sum_t A_t^(i) s_t^(i), with s_t = grad log pi(y_t | x, y_<t) in
the parameters measured. Every gradient here is a coefficient vector c over the pool's tokens, g = sum_a c_a s_a, and
every inner product is c^T K c' with the token Gram matrix K_ab = <s_a, s_b>. No gradient is ever formed.

- **The LM head** (``token_gram``): s_t = (e_{y_t} - pi_t) h_t^T exactly (h_t the head's input, pi_t the sampling
  distribution), so K_ab = <e_{y_a} - pi_a, e_{y_b} - pi_b> <h_a, h_b> with
  <e_{y_a} - pi_a, e_{y_b} - pi_b> = [y_a = y_b] - pi_b(y_a) - pi_a(y_b) + <pi_a, pi_b>. The probabilities are exact
  on a vocabulary subset S (every sampled token plus each position's top-k); the part of <pi_a, pi_b> outside S is
  bounded by min(m_a r_b, m_b r_a) (m: largest probability outside S, r: mass outside S), returned as the bound.
- **Any set of ``nn.Linear`` weights** (``linear_token_gradients``: a LoRA adapter, the last decoder block): no
  closed form; each token's gradient is taken exactly (one forward, a batched backward per chunk of tokens) and
  projected by a fixed CountSketch (unbiased for inner products; relative error about sqrt(2 / dim) on a squared
  norm). The backward's cost grows with the completion length times the depth it reaches.
"""

from __future__ import annotations

import contextlib

import torch

from ..core import sum_pi_squared

__all__ = [
    "coordinate_sample",
    "draw_groups",
    "group_coefficients",
    "head_coordinates",
    "head_statistics",
    "linear_token_gradients",
    "position_centring",
    "reference_coefficients",
    "token_gram",
]


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
    sum_sq = sum_pi_squared(logits, temperature)
    top = z.topk(min(top_k, z.shape[-1]), dim=-1).indices
    return h, log_z, logp_y, sum_sq, top


def draw_groups(M, N, count, generator):
    """Groups of N i.i.d. draws from the pool (with replacement): sampling from the pool's empirical distribution,
    so a group's variance does not shrink as N approaches M (drawing without replacement would)."""
    return torch.randint(M, (count, N), generator=generator)


def coordinate_sample(ids, vocab_size, hidden, budget, generator):
    """Coordinates (rows [D], columns [D]) of the LM head's [V, H] weight and their weights [D] (inverse inclusion
    rates): all V·H when that is at most ``budget``; else half the budget uniform over the rows of the tokens in
    ``ids`` (where a pool's gradient concentrates) and half over the other rows."""
    if vocab_size * hidden <= budget:
        rows = torch.arange(vocab_size).repeat_interleave(hidden)
        return rows, torch.arange(hidden).repeat(vocab_size), torch.ones(vocab_size * hidden, dtype=torch.float64)
    seen = torch.unique(ids)
    rest = torch.ones(vocab_size, dtype=torch.bool)
    rest[seen] = False
    rest = rest.nonzero().squeeze(1)
    half = budget // 2
    r1 = seen[torch.randint(len(seen), (half,), generator=generator)]
    r2 = rest[torch.randint(len(rest), (budget - half,), generator=generator)]
    cols = torch.randint(hidden, (budget,), generator=generator)
    w = torch.cat(
        [
            torch.full((half,), len(seen) * hidden / half, dtype=torch.float64),
            torch.full((budget - half,), len(rest) * hidden / (budget - half), dtype=torch.float64),
        ]
    )
    return torch.cat([r1, r2]), cols, w


def head_coordinates(completions, head_weight, temperature, budget, generator):
    """F [n, D] (fp64) with F_ak the LM-head score of pool token a at sampled coordinate k,
    (1[y_a = v_k] - pi_a(v_k)) h_a[j_k], and the coordinates' weights [D]: a gradient with token coefficients c has
    coordinates c @ F (``gradients.token_gram``'s parametrisation)."""
    ids = torch.cat([c["ids"] for c in completions])
    h = torch.cat([c["h"] for c in completions]).double()
    log_z = torch.cat([c["log_z"] for c in completions]).double()
    V, H = head_weight.shape
    rows, cols, w = coordinate_sample(ids.cpu(), V, H, budget, generator)  # a CPU generator's draws
    rows, cols = rows.to(h.device), cols.to(h.device)
    pi = torch.exp(h @ head_weight[rows].double().T / temperature - log_z[:, None])  # [n, D]
    F = ((ids[:, None] == rows[None, :]).double() - pi) * h[:, cols]
    return F, w


def linear_token_gradients(model, layers, prompt_ids, completions, sketch_dim=2**16, temperature=1.0, chunk=8,
                           seed=0, kappa_dim=0):  # fmt: skip
    """Per completion, S [T, D]: the gradient of log pi(y_t) w.r.t. the weights of ``layers`` (``nn.Linear``
    modules of ``model``, a causal LM), one row per token; with ``kappa_dim`` > 0 also X [T, kappa_dim], the exact
    gradient on that many coordinates drawn uniformly from the weights (each weighted numel / kappa_dim). Returns
    (list of S, list of X or None, coordinate weights [kappa_dim] or None).

    One forward per completion; token t's gradient of a layer's weight is sum_pos delta_t[pos]^T x[pos], with x the
    layer's input (read by a hook) and delta_t = d log pi(y_t) / d(layer output), for ``chunk`` tokens at a time by
    one batched backward (``torch.autograd.grad(..., is_grads_batched=True)``). It reaches back only as far as the
    first of ``layers`` (other parameters are frozen meanwhile), so the last block costs little more than a
    forward. With ``sketch_dim`` > 0 each gradient is projected by a fixed CountSketch (coordinate i of the flattened
    weights goes to bucket b_i with sign s_i, so <Sx, Sy> is unbiased for <x, y>); with 0 the rows are exact.
    """
    if not layers:
        raise ValueError("No nn.Linear weights to measure: pass the layers whose gradient to take.")
    device = layers[0].weight.device
    sizes = [m.weight.numel() for m in layers]
    generator = torch.Generator().manual_seed(seed)
    if sketch_dim:
        buckets = [torch.randint(sketch_dim, (n,), generator=generator).to(device) for n in sizes]
        signs = [(torch.randint(0, 2, (n,), generator=generator).float() * 2 - 1).to(device) for n in sizes]
    starts = [0, *torch.tensor(sizes).cumsum(0).tolist()]
    dim = sketch_dim or starts[-1]
    picks = None
    if kappa_dim:
        flat = torch.randint(starts[-1], (kappa_dim,), generator=generator)
        layer_of = torch.searchsorted(torch.tensor(starts[1:]), flat, right=True)
        picks = [((flat[layer_of == i] - starts[i]).to(device), (layer_of == i).nonzero().squeeze(1).to(device))
                 for i in range(len(layers))]  # fmt: skip
    captured = {}

    def forward_hook(index):
        def hook(module, args, out):
            captured[index] = (args[0].detach(), out)

        return hook

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    body, head = base.get_decoder(), base.get_output_embeddings()
    handles = [m.register_forward_hook(forward_hook(i)) for i, m in enumerate(layers)]
    out, out_x = [], []
    with _only_trainable([m.weight for m in layers], model):
        try:
            for comp in completions:
                T, Lp = len(comp), len(prompt_ids)
                seq = torch.cat([prompt_ids, comp])[None]
                h = body(input_ids=seq[:, :-1]).last_hidden_state[0, Lp - 1 :]
                logp = torch.log_softmax(head(h).float() / temperature, dim=-1).gather(1, comp[:, None])[:, 0]
                outputs = [captured[i][1] for i in range(len(layers))]
                S, X = torch.zeros(T, dim, device=device), torch.zeros(T, kappa_dim, device=device)
                for t0 in range(0, T, chunk):
                    k = min(T, t0 + chunk) - t0
                    select = torch.zeros(k, T, device=logp.device)
                    select[torch.arange(k), t0 + torch.arange(k)] = 1.0
                    deltas = torch.autograd.grad(logp, outputs, select, retain_graph=True, is_grads_batched=True)
                    for i, delta in enumerate(deltas):  # delta [k, 1, L, out], x [1, L, in]
                        x = captured[i][0][0].float()
                        per_token = torch.einsum("klo,li->koi", delta[:, 0].float(), x).flatten(1)
                        if sketch_dim:
                            S[t0 : t0 + k].index_add_(1, buckets[i], per_token * signs[i])
                        else:
                            S[t0 : t0 + k, starts[i] : starts[i + 1]] = per_token
                        if picks is not None:
                            X[t0 : t0 + k, picks[i][1]] = per_token[:, picks[i][0]]
                captured.clear()
                out.append(S.cpu())
                out_x.append(X.cpu())
        finally:
            for handle in handles:
                handle.remove()
    coord_weight = torch.full((kappa_dim,), starts[-1] / max(kappa_dim, 1), dtype=torch.float64)
    return out, (out_x if kappa_dim else None), (coord_weight if kappa_dim else None)


@contextlib.contextmanager
def _only_trainable(weights, model):
    """Gradient for ``weights`` alone while the block runs (so backward stops where they end); flags restored."""
    keep = {id(w) for w in weights}
    flags = [(p, p.requires_grad) for p in model.parameters()]
    try:
        for p, _ in flags:
            p.requires_grad_(id(p) in keep)
        yield
    finally:
        for p, flag in flags:
            p.requires_grad_(flag)


def group_coefficients(adv, groups, mask, offsets, n_tokens):
    """C [G, n]: the coefficient of each pool token in g = (1/N) sum_i sum_t A_t^(i) s_t^(i), for every group:
    ``adv`` [G * N, T] the advantages of the groups' members (rows in group order), ``groups`` [G, N] pool indices,
    ``mask`` [M, T] the pool's completion mask, ``offsets`` [M] each completion's first token in the pool's order."""
    G, N = groups.shape
    flat = groups.flatten()
    T = mask.shape[1]
    C = torch.zeros(G, n_tokens + 1, dtype=torch.float64)
    token = offsets[flat][:, None] + torch.arange(T)[None, :]
    token = torch.where(mask[flat], token, torch.full_like(token, n_tokens))  # padding -> a dropped column
    rows = torch.arange(G).repeat_interleave(N)[:, None].expand(-1, T)
    C.index_put_((rows.reshape(-1), token.reshape(-1)), (adv.double() / N).reshape(-1), accumulate=True)
    return C[:, :n_tokens]
