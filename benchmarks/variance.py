"""Gradient variance of the advantage estimators, in the LM head's and in a LoRA adapter's parameter space.

    python -m benchmarks.variance            # embedded SmolLM2-135M, generated math prompts, horizons 64 and 256
    python -m benchmarks.variance --task count --pool 12 --horizons 256 512 1024   # long answers, LM head only
    python -m benchmarks.variance --quick    # tiny random Llama, a cheap synthetic reward (CI, seconds)
    python -m benchmarks.variance --task count --pool 12 --horizons 256 512 1024 --fallbacks \
        --stem variance_fallbacks_count12    # OTB's tail fallbacks: variance, squared bias and MSE of each candidate

Prompts. Candidates are tried in a fixed order (math: the first 64 generated training prompts; count: one per
``--count-targets``) until ``--prompts`` (default 12) of them have pool rewards that vary at each horizon. Each
prompt's pool is sampled once, seeded by (``--seed``, prompt index), and cached in ``--cache`` (default
``.cache/variance``) with its seed and settings, so a run can stop (``--time-limit`` minutes: no new pool after
that) and the same command resumes it later; ``--sample-only`` only fills the cache. The LoRA space's Gram matrices
are cached the same way. ``--study`` adds the estimator study (the tail rule off, two OTB variants, the variance
split by share of active members).

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

In the LoRA adapter's space (``--spaces lora``; r=16, alpha=32, every linear layer of the body, as in
``examples/recipes/cpu_smollm2_lora.yaml``, at its initialisation, where B = 0 and only the B matrices get gradient)
there is no closed form: the gradient of log pi(y_t) with respect to every adapter weight is computed for every pool
token, by per-example gradients (each token's loss in its own copy of the sequence, truncated after that token; the
per-copy weight gradient is sum_pos grad_out^T input, read by hooks). These are projected by a fixed CountSketch to
``--sketch-dim`` coordinates (unbiased for inner products, relative error about sqrt(2 / dim) on a squared norm:
0.6% at 2^16; ``--sketch-dim 0`` keeps them exact), and K = S S^T. The cost is quadratic in the completion length,
which is why the long-answer run stays in the LM head.

Tasks. ``math``: the generated math prompts, accuracy reward, temperature 1. ``count``: "List the numbers from 1 to
n, separated by commas." for n in ``--count-targets``, with the assistant turn started as "1, 2, 3," (``COUNT_PREFIX``),
sampled at temperature 0.7 (at 1.0 the embedded model does not count); the answer needs about 4 to 5 tokens per
number (n = 200: ~900 tokens), and the reward is the share of 1..n listed in order before the first mistake, halved
if the list does not end at n: a long answer whose reward is decided by where its first error falls.

Reported per space, horizon, N and estimator (mean over prompts; 95% percentile bootstrap intervals, two schemes:
``*_ci`` resamples prompts, then groups within each resampled prompt; ``*_ci_groups`` keeps the prompts and
resamples groups; the scale a is re-estimated in every resample). Per N, paired tests of OTB against GRPO and OGB:
every estimator sees the same groups and the same resamples, and the interval of the per-resample difference of
rescaled variances says whether they differ at 95%:
- ``var``: E||g - E g||^2, the variance around the estimator's own mean;
- ``mse``: E||g - g_ref||^2 against the pool reference g_ref = (1/M) sum_j (R_j - mean_k R_k) S_j, the policy
  gradient of the pool's empirical distribution (RLOO on groups drawn from it is unbiased for it);
- ``var_scaled``: a^2 var, with a = <E g, g_ref> / ||E g||^2 (over all prompts) the scalar that best matches the
  reference: it puts estimators whose self-including baselines shrink the gradient (by ~(N-1)/N) on an equal
  footing. Estimators: grpo (unscaled), grpo_std, rloo, opo, ogb, otb, otb_loo.
- ``bias_sq``: ||E g - g_ref||^2, from each prompt's G groups. The plug-in ||g_bar - g_ref||^2 (``bias_sq_plugin``)
  is inflated by the variance of g_bar, Var(g) / G in expectation; ``bias_sq`` subtracts its unbiased estimate
  var / (G - 1) (``squared_bias``), so that mse = var G / (G - 1) + bias_sq exactly (checked at every row). The
  bias's interval is the resamples' spread around the corrected estimate (each resample's corrected value is
  unbiased for the plug-in of the full sample, its world's truth, so the resamples are shifted by plug-in minus
  corrected). On ramble at N=4 the plug-in overstated unscaled GRPO's squared bias by 61% of its exact value
  (0.405 over 0.668) and put RLOO's at 1.0 instead of 0 (``calibration`` in each JSON).
  The pool reference inflates it too: the pool's masked scores of one position do not average to 0, so a baseline
  built from the other members only, unbiased in truth, looks biased against g_ref (``position_centring``). With
  ``--fallbacks`` every number is also given in the score-centred pool (``centred`` in each horizon's entry: each
  token's score less its position's pool mean), where such baselines are exactly unbiased; on ramble at N=4 it
  brings reference OTB's squared bias from 6.11 to 0.299.

``--fallbacks`` measures OTB's tail options instead of the shipped estimators: every tail of ``FALLBACK_TAILS`` (the
reference ``zero``, the legacy ``none``, the shift-invariant ``group_mean``, ``sequence_baseline``,
``last_baseline``, ``zero_advantage``), without and with leave-one-out, beside unscaled GRPO, RLOO and OGB; each
pair (candidate, reference OTB) and (candidate, GRPO) gets paired intervals of the difference in var, bias_sq and
mse (``paired[...]["metrics"]``). A tail the installed core does not accept yet is computed by this script's
reference ``otb_fallback_advantages`` (``meta.fallbacks.implementation`` says which); where the core has it, the two
are compared on the analysed groups (``fallback_checks``). It first calibrates the bias (``calibration``, in both
the pool and the score-centred pool): RLOO's must cover 0 and unscaled GRPO's must cover ||g_ref||^2 / N^2, GRPO's
exact (1 - 1/N) rescaling.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from benchmarks.common import command, pyplot, save_figure, write_json  # noqa: E402
from trl_otb import compute_advantages, sum_pi_squared  # noqa: E402

VARIANCE_ESTIMATORS = {
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
    sum_sq = sum_pi_squared(logits, temperature)
    top = z.topk(min(top_k, z.shape[-1]), dim=-1).indices
    return h, log_z, logp_y, sum_sq, top


def completion_records(comp, lengths, h, log_z, logp_y, sum_sq, top) -> list[dict]:
    """One dict per completion, every per-token tensor cut to the completion's length (the pool's format)."""
    fields = {"ids": comp, "h": h, "log_z": log_z, "logp_y": logp_y, "sum_sq": sum_sq, "top": top}
    return [{name: x[i, :k] for name, x in fields.items()} for i, k in enumerate(lengths.tolist())]


def sample_pool(model, tokenizer, prompts, pool_size, horizon, batch_size, temperature=1.0, top_k=64):
    """Sample ``pool_size`` completions per prompt and collect the head statistics of every completion token.

    Returns (pools, prompt_ids): per prompt, a list of completion dicts and the prompt's token ids."""
    tokenizer.padding_side = "left"
    pools, prompt_ids = [], []
    eos = tokenizer.eos_token_id
    for p_index, prompt in enumerate(prompts):
        # A final assistant message is a prefix the completion continues (the count task starts the list).
        prefill = prompt[-1]["role"] == "assistant"
        text = tokenizer.apply_chat_template(
            prompt, tokenize=False, add_generation_prompt=not prefill, continue_final_message=prefill
        )
        enc = tokenizer([text], return_tensors="pt", add_special_tokens=False)
        prompt_ids.append(enc["input_ids"][0])
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
            first = torch.where(
                is_eos.any(1), is_eos.int().argmax(1), torch.full((n,), comp.shape[1], dtype=torch.long)
            )
            lengths = torch.clamp(first + 1, max=comp.shape[1])
            mask = torch.arange(comp.shape[1])[None, :] < lengths[:, None]
            comp = torch.where(mask, comp, torch.full_like(comp, tokenizer.pad_token_id))
            input_ids = torch.cat([enc["input_ids"].expand(n, -1), comp], dim=1)
            attention_mask = torch.cat([enc["attention_mask"].expand(n, -1), mask.long()], dim=1)
            # Chunks of at most 4096 tokens: the full-vocabulary logits of a chunk are the largest tensor held.
            step = max(1, min(8, 4096 // input_ids.shape[1]))
            stats = [
                head_statistics(
                    model,
                    input_ids[i : i + step],
                    attention_mask[i : i + step],
                    comp[i : i + step],
                    temperature,
                    top_k,
                )
                for i in range(0, n, step)
            ]
            completions += completion_records(comp, lengths, *(torch.cat(parts) for parts in zip(*stats)))
        pools.append(completions)
        print(
            f"  pool {p_index + 1}/{len(prompts)} sampled, lengths {[len(c['ids']) for c in completions]}", flush=True
        )
    return pools, prompt_ids


def pool_seed(seed: int, prompt_index: int) -> int:
    """The sampling seed of one prompt's pool: fixed by (seed, prompt index), whatever was sampled before it."""
    return seed * 1_000_003 + prompt_index


def load_or_sample_pool(
    model, tokenizer, prompt, prompt_index, cache_dir, key, pool_size, horizon, batch_size, temperature, top_k, seed
):
    """One prompt's pool, from ``cache_dir`` if it was sampled before, else sampled (seeded by ``pool_seed``) and
    saved there. Returns (data, cached): data holds ``records``, ``prompt_ids``, ``prompt``, ``seed``,
    ``sample_seconds`` and the sampling settings."""
    path = Path(cache_dir) / f"{key}-p{prompt_index:03d}.pt"
    settings = {"pool": pool_size, "horizon": horizon, "temperature": temperature, "top_k": top_k}
    if path.exists():
        data = torch.load(path, weights_only=False)
        if data["prompt"] != prompt or data["settings"] != settings:
            raise ValueError(
                f"{path} holds a pool for another prompt or other settings ({data['settings']}); use another --cache "
                "folder or delete the file."
            )
        return data, True
    seed_p = pool_seed(seed, prompt_index)
    torch.manual_seed(seed_p)
    start = time.perf_counter()
    pools, prompt_ids = sample_pool(model, tokenizer, [prompt], pool_size, horizon, batch_size, temperature, top_k)
    data = {
        "records": pools[0],
        "prompt_ids": prompt_ids[0],
        "prompt": prompt,
        "seed": seed_p,
        "settings": settings,
        "sample_seconds": time.perf_counter() - start,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save(data, tmp)
    os.replace(tmp, path)  # a run stopped mid-write leaves no half file behind
    return data, False


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


# ----------------------------------------------------------------------------------------------------------------
# Estimators as coefficient vectors over pool tokens
# ----------------------------------------------------------------------------------------------------------------


def _contiguous_groups(x, group_ids):
    """x [B, ...] viewed as [G, N, ...]: the groups that group_coefficients builds are contiguous and equal-sized."""
    N = int((group_ids == group_ids[0]).sum())
    if not torch.equal(group_ids, torch.arange(len(group_ids)) // N):
        raise ValueError("the study variants take contiguous, equal-sized groups (as group_coefficients builds them)")
    return x.view(-1, N, *x.shape[1:])


def otb_carry_advantages(rewards, proxy, mask, group_ids, eps=1e-8):
    """Study variant: OTB whose finished members keep their final energy in the baseline,
    B_t = sum_i R_i W_t^(i) / (sum_i W_t^(i) + eps) with W_t^(i) = sum_{j <= min(t, L_i)} w_j^(i) (no m_t factor).
    Where every member is active it is OTB; past a member's end its final energy stays in the sums, so the longest
    member is never alone (no tail rule needed). Member i's baseline uses its own prefix and the other members' data,
    self-included as in OTB."""
    m = mask.double()
    W = _contiguous_groups(torch.cumsum(proxy.double() * m, dim=1), group_ids)  # [G, N, T]; constant past the end
    R = _contiguous_groups(rewards.double(), group_ids)[..., None]  # [G, N, 1]
    B = (R * W).sum(1, keepdim=True) / (W.sum(1, keepdim=True) + eps)
    return ((R - B) * _contiguous_groups(m, group_ids)).reshape(m.shape)


def otb_tail_last_advantages(rewards, proxy, mask, group_ids, eps=1e-8):
    """Study variant: OTB (self-included) whose lone longest member keeps the last baseline computed while at least
    two members were active, instead of 0 (tail="zero") or its own reward (tail="none"). A member alone from its
    first token (a group of one valid member) gets 0, as in OTB."""
    m = _contiguous_groups(mask.double(), group_ids)
    W = torch.cumsum(_contiguous_groups(proxy.double(), group_ids) * m, dim=2) * m
    R = _contiguous_groups(rewards.double(), group_ids)[..., None]
    B = (R * W).sum(1) / (W.sum(1) + eps)  # [G, T]
    multi = m.sum(1) >= 2
    T = B.shape[1]
    last = torch.where(multi, torch.arange(T), torch.full_like(multi, -1, dtype=torch.long)).cummax(1).values
    B_last = torch.where(last >= 0, B.gather(1, last.clamp(min=0)), torch.zeros_like(B))
    B = torch.where(multi, B, B_last)
    return ((R - B[:, None, :]) * m).reshape(mask.shape)


FALLBACK_TAILS = ("zero", "none", "group_mean", "sequence_baseline", "last_baseline", "zero_advantage")
"""OTB's ``tail`` options compared by --fallbacks: the reference and the legacy rule, then the shift-invariant
fallbacks (``SHIFT_INVARIANT_TAILS``) for the positions where a group cannot estimate B_t."""
SHIFT_INVARIANT_TAILS = FALLBACK_TAILS[2:]


def otb_fallback_advantages(rewards, proxy, mask, group_ids, *, tail, leave_one_out=False, eps=1e-8):
    """The shift-invariant fallbacks of OTB, written out here as the benchmark's own reference (fp64, contiguous
    equal-sized groups): what ``compute_advantages("otb", ..., tail=tail, leave_one_out=...)`` is specified to give
    for ``tail`` in ``SHIFT_INVARIANT_TAILS``. The core's implementation, where it has these options, is measured
    and checked against this one (``fallback_estimators``, ``check_fallbacks``).

    Rewards are centred within each group first (R_i - mean of the group's valid members), so A does not move when a
    constant is added to every reward. Where at least two members are active (under leave-one-out: where another
    member is active) the baseline is OTB's B_t (B_t^(-i)). Where member i is alone (leave-one-out: no other member
    active), the fallback:
    - ``group_mean``: the group's mean reward (0 once centred: A = R_i - mean); leave-one-out: the other members'
      mean (A = R_i - mean_{j != i} R_j, RLOO's advantage);
    - ``sequence_baseline``: OGB's b = sum_j R_j W_j / (sum_j W_j + eps), W_j member j's total energy; leave-one-out:
      over the other members;
    - ``last_baseline``: the last B_t computed while two or more members were active; leave-one-out: the last
      B_t^(-i) computed while another member was active;
    - ``zero_advantage``: A = 0.
    A group with one valid member (finite reward, non-empty mask) gets A = 0, invalid rows too."""
    if tail not in SHIFT_INVARIANT_TAILS:
        raise ValueError(f"tail must be one of {SHIFT_INVARIANT_TAILS}, got {tail!r}")
    m = _contiguous_groups(mask.double(), group_ids)  # [G, N, T]
    w = _contiguous_groups(proxy.double(), group_ids) * m
    R = _contiguous_groups(rewards.double(), group_ids)  # [G, N]
    valid = (m.sum(2) > 0) & torch.isfinite(R)
    m = m * valid[..., None]
    W = torch.cumsum(w, dim=2) * m  # realized energy, 0 off the mask
    total = (w * valid[..., None]).sum(2)  # [G, N] each member's total energy
    n_valid = valid.sum(1, keepdim=True).double()  # [G, 1]
    R = torch.where(valid, R, torch.zeros_like(R))
    Rc = (R - R.sum(1, keepdim=True) / n_valid.clamp(min=1)) * valid  # centred: sum_i Rc_i = 0
    active = m.sum(1)  # [G, T] members active at each position
    num, den = (Rc[..., None] * W).sum(1), W.sum(1)  # [G, T]
    T = m.shape[2]
    positions = torch.arange(T)

    def last_where(cond, values):
        """values at the last position (<= t) where cond held, for every t; 0 where it never did."""
        last = torch.where(cond, positions, torch.full_like(cond, -1, dtype=torch.long)).cummax(-1).values
        return torch.where(last >= 0, values.gather(-1, last.clamp(min=0)), torch.zeros_like(values))

    def divide(a, b):
        return a / torch.where(b == 0, torch.ones_like(b), b)

    if not leave_one_out:
        B = divide(num, den + eps)[:, None, :].expand_as(m)  # [G, N, T]
        alone = (active == 1)[:, None, :].expand_as(m)
        if tail == "group_mean":
            F = torch.zeros_like(B)
        elif tail == "sequence_baseline":
            F = divide((Rc * total).sum(1), total.sum(1) + eps)[:, None, None].expand_as(m)
        else:  # last_baseline (zero_advantage needs none)
            F = last_where(active >= 2, divide(num, den + eps))[:, None, :].expand_as(m)
    else:
        others = active[:, None, :] - m  # [G, N, T] other members active
        B = divide(num[:, None, :] - Rc[..., None] * W, den[:, None, :] - W + eps)
        alone = others == 0
        if tail == "group_mean":
            F = (-Rc / (n_valid - 1).clamp(min=1))[..., None].expand_as(m)  # sum_i Rc_i = 0
        elif tail == "sequence_baseline":
            num_s = (Rc * total).sum(1, keepdim=True) - Rc * total
            den_s = total.sum(1, keepdim=True) - total
            F = divide(num_s, den_s + eps)[..., None].expand_as(m)
        else:
            F = last_where((others > 0) & (m > 0), B)
    A = Rc[..., None] - torch.where(alone, F, B)
    if tail == "zero_advantage":
        A = torch.where(alone, torch.zeros_like(A), A)
    A = A * m * (n_valid >= 2)[..., None]
    return A.reshape(mask.shape)


def core_tails() -> tuple:
    """The ``tail`` options the installed trl_otb core accepts."""
    from trl_otb.core.otb import TAILS

    return tuple(TAILS)


def fallback_name(tail: str, leave_one_out: bool) -> str:
    """The grid's estimator names: ``otb`` / ``otb_loo`` for the reference tail (as elsewhere in this script),
    ``otb_<tail>`` / ``otb_<tail>_loo`` for the others."""
    base = "otb" if tail == "zero" else f"otb_{tail}"
    return f"{base}_loo" if leave_one_out else base


def fallback_estimators(tails=None) -> tuple[dict, dict]:
    """(estimators, implementation): OTB with every tail of ``FALLBACK_TAILS``, without and with leave-one-out,
    then unscaled GRPO, RLOO and OGB. A tail the installed core accepts is measured through ``compute_advantages``
    (``implementation[name] = "core"``); one it does not yet accept through ``otb_fallback_advantages``
    (``"benchmarks/variance.py reference"``)."""
    tails = core_tails() if tails is None else tails
    estimators, implementation = {}, {}
    for loo in (False, True):
        for tail in FALLBACK_TAILS:
            name = fallback_name(tail, loo)
            if tail in tails:
                estimators[name] = ("otb", {"tail": tail, "leave_one_out": loo})
                implementation[name] = "core"
            else:
                estimators[name] = (otb_fallback_advantages, {"tail": tail, "leave_one_out": loo})
                implementation[name] = "benchmarks/variance.py reference"
    for name in ("grpo", "rloo", "ogb"):
        estimators[name] = VARIANCE_ESTIMATORS[name]
        implementation[name] = "core"
    return estimators, implementation


def fallback_pairs(estimators) -> tuple:
    """Every candidate against reference OTB and against unscaled GRPO, and the shift-invariant OTB candidates and
    OGB against each other (a minus b, on the same groups)."""
    invariant = [n for n in estimators if n.startswith("otb_") and n.removesuffix("_loo")[4:] in SHIFT_INVARIANT_TAILS]
    invariant.append("ogb")
    among = tuple((a, b) for i, a in enumerate(invariant) for b in invariant[i + 1 :] if b in estimators)
    return tuple((a, b) for b in ("otb", "grpo") for a in estimators if a != b) + among


def _advantages(spec, rewards, proxy, mask, group_ids):
    name, options = spec
    fn = name if callable(name) else (lambda *a, **o: compute_advantages(name, *a, **o))
    return fn(rewards, proxy, mask, group_ids, **options).double()


def check_fallbacks(rewards, proxy, mask, Ns, num_groups, generator) -> dict:
    """Largest absolute differences on the groups the analysis draws (``generator`` seeded as for it):
    ``last_baseline_vs_otb_tail_last`` (the grid's ``otb_last_baseline`` against the study variant
    ``otb_tail_last``: the same rule up to OTB's eps), ``shift_<name>`` (advantages with every reward + 1 minus
    without; 0 for the shift-invariant tails), and ``core_vs_reference_<name>`` (the core against
    ``otb_fallback_advantages``, for the new tails the core already accepts)."""
    grid, implementation = fallback_estimators()
    M = rewards.numel()
    out = {}

    def record(key, a, b):
        out[key] = max(out.get(key, 0.0), float((a - b).abs().max()))

    for N in Ns:
        groups = draw_groups(M, N, num_groups, generator)
        flat = groups.flatten()
        args = (rewards[flat], proxy[flat], mask[flat], torch.arange(num_groups).repeat_interleave(N))
        shifted = (args[0] + 1, *args[1:])
        for name, spec in grid.items():
            adv = _advantages(spec, *args)
            record(f"shift_{name}", _advantages(spec, *shifted), adv)
            if name == "otb_last_baseline":
                record("last_baseline_vs_otb_tail_last", adv, otb_tail_last_advantages(*args))
            if implementation[name] == "core" and spec[1].get("tail") in SHIFT_INVARIANT_TAILS:
                record(f"core_vs_reference_{name}", adv, otb_fallback_advantages(*args, **spec[1]))
    return out


STUDY_ESTIMATORS = {
    "otb_tail_none": ("otb", {"tail": "none"}),
    "otb_carry": (otb_carry_advantages, {}),
    "otb_tail_last": (otb_tail_last_advantages, {}),
}
"""Added by --study: the tail rule off, and two variants that the decomposition may point to."""
STUDY_PAIRS = (("otb_tail_none", "otb"), ("otb_carry", "otb"), ("otb_tail_last", "otb"), ("otb_loo", "otb"))
DECOMPOSED = ("grpo", "ogb", "otb", "otb_tail_none", "otb_loo", "otb_carry", "otb_tail_last")
SHARE_BINS = ("alone", "half or less", "over half", "all")
"""Token bins by the number k of group members still active at the token's position: k = 1, 1 < k <= N/2,
N/2 < k < N, k = N."""


def share_bin(k, N):
    """Bin index (into SHARE_BINS) of tokens at positions where k of the N group members are active."""
    return torch.where(k == 1, 0, torch.where(k == N, 3, torch.where(2 * k <= N, 1, 2)))


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


def group_advantages(estimator, groups, rewards, proxy, mask, estimators=None):
    """[G * N, T] advantages of every group's members (fp64), rows in group order."""
    name, options = (estimators or VARIANCE_ESTIMATORS)[estimator]
    G, N = groups.shape
    flat = groups.flatten()
    group_ids = torch.arange(G).repeat_interleave(N)
    args = (rewards[flat], proxy[flat], mask[flat], group_ids)
    adv = name(*args, **options) if callable(name) else compute_advantages(name, *args, **options)
    return adv.double()


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


def _cell_terms(C, KC, c_ref, K_c_ref, ref_sq):
    """The per-group terms of one (N, estimator) cell: C [G, n] coefficient rows, KC = C K, c_ref, K c_ref."""
    c_bar = C.mean(0)
    return {
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
    centred=False,
):  # fmt: skip
    """Per estimator and N: per-group ||g||^2, <g, g_bar>, <g, g_ref> terms and the groups' Gram matrix
    <g_k, g_l>, for the bootstrap. With ``centred``, also ``("centred", N, est)``: the same terms in the
    score-centred pool (``position_centring``).

    For the estimators in ``decompose`` and N in ``decompose_Ns``, also ``("bins", N, est)``: per SHARE_BINS bin,
    the variance of the part of g made of the tokens in that bin (E||g_bin - E g_bin||^2 over these groups) and the bin's share of tokens."""
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
            out[(N, est)] = _cell_terms(C, KC, c_ref, K_ref, ref_sq)
            if centred:
                C_c, D = centre(C)
                out[("centred", N, est)] = _cell_terms(C_c, KC - D @ EK, c_ref_c, K_ref_c, ref_sq_c)
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


PAIRS = (("otb", "grpo"), ("otb", "ogb"))
"""The paired comparisons reported per cell: (a, b) gives the rescaled variance of a minus that of b."""


def _cell_arrays(per_prompt, key):
    """Per prompt, stacked: A [P, G] = ||g||^2 - 2 <g, g_bar>, Mse [P, G] = ||g||^2 - 2 <g, g_ref>, and the
    per-prompt constants ||g_bar||^2, <g_bar, g_ref>, ||g_ref||^2 [P]: var_p = mean_g A + ||g_bar||^2."""
    cells = [pp[key] for pp in per_prompt]
    sizes = {len(c["sq"]) for c in cells}
    if len(sizes) != 1:
        raise ValueError(f"every prompt needs the same number of groups per N, got {sorted(sizes)}")
    A = torch.stack([c["sq"] - 2 * c["dot_bar"] for c in cells]).double()
    Mse = torch.stack([c["sq"] - 2 * c["dot_ref"] for c in cells]).double()
    const = {k: torch.tensor([c[k] for c in cells], dtype=torch.float64) for k in ("bar_sq", "bar_ref", "ref_sq")}
    return A, Mse, const


def _resampled(A, Mse, const, ip, ig):
    """var, mse, scale and rescaled variance for every resample: prompts ip [B, P], groups ig [B, P, G]."""
    var = (A[ip[..., None], ig].mean(-1) + const["bar_sq"][ip]).mean(-1)
    mse = (Mse[ip[..., None], ig].mean(-1) + const["ref_sq"][ip]).mean(-1)
    scale = const["bar_ref"][ip].sum(-1) / const["bar_sq"][ip].sum(-1)
    return {"var": var, "mse": mse, "scale": scale, "var_scaled": scale**2 * var}


def _bias_arrays(per_prompt, key):
    """Per prompt, stacked: the groups' Gram matrices Q [P, G, G], ||g||^2 and <g, g_ref> [P, G], ||g_ref||^2 [P];
    None when the cells carry no Gram matrix (cells made before it was recorded)."""
    cells = [pp[key] for pp in per_prompt]
    if not all("gram" in c for c in cells):
        return None
    return (
        torch.stack([c["gram"] for c in cells]).double(),
        torch.stack([c["sq"] for c in cells]).double(),
        torch.stack([c["dot_ref"] for c in cells]).double(),
        torch.tensor([c["ref_sq"] for c in cells], dtype=torch.float64),
    )


def squared_bias(Q, sq, dot_ref, ref_sq, ip, ig):
    """(bias_sq, plug-in) for every resample: prompts ip [B, P], groups ig [B, P, G]; means over the resampled
    prompts.

    Per prompt, with g_bar the mean of its G resampled groups, the plug-in ||g_bar - g_ref||^2 estimates
    ||E g - g_ref||^2 + Var(g) / G: the mean of G draws still varies. The corrected estimate subtracts the unbiased
    estimate of Var(g) / G, that is (mean_k ||g_k||^2 - ||g_bar||^2) / (G - 1) (the groups are i.i.d. draws from the
    pool), so its expectation is the squared bias itself, and mse = var * G / (G - 1) + bias_sq exactly, where
    var = mean_k ||g_k - g_bar||^2 is the variance reported beside it."""
    boot, P = ip.shape
    G = sq.shape[1]
    counts = torch.zeros(boot, P, G, dtype=torch.float64).scatter_add_(
        2, ig, torch.ones(ig.shape, dtype=torch.float64)
    )
    quad = torch.zeros(boot, P, dtype=torch.float64)
    for p in range(Q.shape[0]):  # ||sum_k g_k||^2 = c^T Q c, prompt by prompt (Q[ip] would be [B, P, G, G])
        sel = ip == p
        if sel.any():
            c = counts[sel]
            quad[sel] = ((c @ Q[p]) * c).sum(1)
    bar_sq = quad / G**2
    mean_sq = sq[ip[..., None], ig].mean(-1)
    plugin = bar_sq - 2 * dot_ref[ip[..., None], ig].mean(-1) + ref_sq[ip]
    bias = plugin - (mean_sq - bar_sq) / (G - 1)
    return bias.mean(-1), plugin.mean(-1)


def _ci(x):
    return torch.quantile(x, torch.tensor([0.025, 0.975], dtype=x.dtype)).tolist()


def bootstrap_indices(P, G, boot, generator, over_prompts=True):
    """Resampling indices: prompts [boot, P] (with replacement, or every prompt once) and groups within each
    resampled prompt [boot, P, G] (with replacement)."""
    if over_prompts:
        ip = torch.randint(P, (boot, P), generator=generator)
    else:
        ip = torch.arange(P).expand(boot, P)
    return ip, torch.randint(G, (boot, P, G), generator=generator)


def paired_test(a, b, ratio=True):
    """Rescaled variance (or another statistic: the first entry is the full sample's, the rest its resamples) of
    estimator a minus b, resample by resample (the same prompts and groups for both): the difference, its 95%
    percentile interval, the ratio a / b with its interval (unless ``ratio`` is False: a squared bias near 0 has
    no useful ratio), and whether the difference's interval excludes 0."""
    d = a - b
    lo, hi = _ci(d[1:])
    out = {"diff": float(d[0]), "diff_ci": [lo, hi]}
    if ratio:
        r = a / b
        out.update(ratio=float(r[0]), ratio_ci=_ci(r[1:]))
    return {
        **out,
        "significant": bool(lo > 0 or hi < 0),
        "p_boot": float(min(1.0, 2 * min((d[1:] <= 0).double().mean(), (d[1:] >= 0).double().mean()))),
    }


def summarise(per_prompt, Ns, boot, generator, estimators=None, pairs=PAIRS):
    """Means over prompts with 95% bootstrap intervals, and paired tests between estimators.

    Two resampling schemes, each of ``boot`` resamples: ``ci`` resamples prompts, then groups within each resampled
    prompt (two levels: the prompts are a sample too); ``ci_groups`` keeps the prompts and resamples only the groups
    (the interval of these prompts' mean). The scale a is re-estimated in every resample. Within one N every
    estimator sees the same groups (drawn once per prompt and N) and the same resampling indices, so a paired test
    is the distribution of the per-resample difference. Returns (table, paired)."""
    estimators = list(estimators or VARIANCE_ESTIMATORS)
    P = len(per_prompt)
    table, paired = {}, {}
    for N in Ns:
        G = len(per_prompt[0][(N, estimators[0])]["sq"])
        schemes = {
            "": bootstrap_indices(P, G, boot, generator, over_prompts=True),
            "_groups": bootstrap_indices(P, G, boot, generator, over_prompts=False),
        }
        draws = {}
        for est in estimators:
            A, Mse, const = _cell_arrays(per_prompt, (N, est))
            bias_arrays = _bias_arrays(per_prompt, (N, est))
            full_ip, full_ig = torch.arange(P)[None, :], torch.arange(G).expand(1, P, G)
            full = _resampled(A, Mse, const, full_ip, full_ig)
            if bias_arrays is not None:
                full["bias_sq"], full["bias_sq_plugin"] = squared_bias(*bias_arrays, full_ip, full_ig)
            row = {"N": N, "estimator": est, "prompts": P, "groups_per_prompt": G}
            for name in ("var", "mse", "scale", "var_scaled", "bias_sq", "bias_sq_plugin"):
                if name in full:
                    row[name] = float(full[name][0])
            for suffix, (ip, ig) in schemes.items():
                res = _resampled(A, Mse, const, ip, ig)
                if bias_arrays is not None:
                    # A resample's corrected estimate is unbiased for the resampled world's squared bias, which is
                    # the full sample's plug-in: shifted by (plug-in - corrected), the resamples spread around the
                    # corrected estimate as it spreads around the true squared bias (else the interval would keep
                    # the var / (G - 1) inflation that the correction removed).
                    res["bias_sq"], _ = squared_bias(*bias_arrays, ip, ig)
                    res["bias_sq"] -= full["bias_sq_plugin"][0] - full["bias_sq"][0]
                for name in ("var", "mse", "var_scaled", "bias_sq"):
                    if name in res:
                        draws[(est, suffix, name)] = torch.cat([full[name][:1], res[name]])
                        row[f"{name}_ci{suffix}"] = _ci(res[name])
            row["ref_sq_norm"] = float(const["ref_sq"].mean())
            if bias_arrays is not None:
                # mse = var G / (G - 1) + bias_sq, exactly (squared_bias): a check of the algebra, not of the data.
                row["var_unbiased"] = row["var"] * G / (G - 1)
                gap = row["mse"] - row["var_unbiased"] - row["bias_sq"]
                if abs(gap) > 1e-6 * max(abs(row["mse"]), 1e-12):
                    raise AssertionError(f"N={N}/{est}: mse - var G/(G-1) - bias_sq = {gap:.3g}, not 0")
            table[f"N={N}/{est}"] = row
        for a, b in pairs:
            if a in estimators and b in estimators:
                test = paired_test(draws[(a, "", "var_scaled")], draws[(b, "", "var_scaled")])
                test["groups_only"] = paired_test(
                    draws[(a, "_groups", "var_scaled")], draws[(b, "_groups", "var_scaled")]
                )
                if (a, "", "bias_sq") in draws and (b, "", "bias_sq") in draws:
                    test["metrics"] = {
                        name: {
                            **paired_test(draws[(a, "", name)], draws[(b, "", name)], ratio=name != "bias_sq"),
                            "groups_only": paired_test(
                                draws[(a, "_groups", name)], draws[(b, "_groups", name)], ratio=name != "bias_sq"
                            ),
                        }
                        for name in ("var", "bias_sq", "mse")
                    }
                paired[f"N={N}/{a}-{b}"] = {"N": N, "a": a, "b": b, **test}
    return table, paired


def decomposition_summary(per_prompt, table, Ns, decompose):
    """Per N and estimator, mean over prompts of each SHARE_BINS bin's variance, raw and rescaled by the estimator's
    a^2 (from ``table``), with the bin's mean share of tokens; ``cross`` is the total minus the bins' sum (the
    covariance between bins)."""
    out = {}
    for N in Ns:
        for est in decompose:
            rows = [pp[("bins", N, est)] for pp in per_prompt]
            scale2 = table[f"N={N}/{est}"]["scale"] ** 2
            entry = {}
            for name in SHARE_BINS:
                var = sum(r[name]["var"] for r in rows) / len(rows)
                share = sum(r[name]["token_share"] for r in rows) / len(rows)
                entry[name] = {"var": var, "var_scaled": scale2 * var, "token_share": share}
            total = table[f"N={N}/{est}"]["var_scaled"]
            entry["total_var_scaled"] = total
            entry["cross_var_scaled"] = total - sum(entry[name]["var_scaled"] for name in SHARE_BINS)
            out[f"N={N}/{est}"] = entry
    return out


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


def calibration(table, Ns) -> list[dict]:
    """Per N, the two checks the squared bias must pass before it says anything about the other estimators, on the
    groups-only interval (these prompts' pools are the distribution, g_ref their exact policy gradient):
    - RLOO is unbiased for g_ref: its interval covers 0;
    - unscaled GRPO is exactly the (1 - 1/N) rescaling, E g_grpo = (1 - 1/N) g_ref (E[(R_i - mean R) S_i] =
      (1 - 1/N) Cov(R, S) for i.i.d. members), so its squared bias is ||g_ref||^2 / N^2: its interval covers that,
      and its scale a = <E g, g_ref> / ||E g||^2 is near N / (N - 1);
    and how much the plug-in ||g_bar - g_ref||^2 was inflated (by var / (G - 1), ``squared_bias``)."""
    out = []
    for N in Ns:
        rloo, grpo = table.get(f"N={N}/rloo"), table.get(f"N={N}/grpo")
        if rloo is None or grpo is None or "bias_sq" not in rloo:
            continue
        expected = grpo["ref_sq_norm"] / N**2
        lo, hi = rloo["bias_sq_ci_groups"]
        glo, ghi = grpo["bias_sq_ci_groups"]
        out.append(
            {
                "N": N,
                "rloo_bias_sq": rloo["bias_sq"],
                "rloo_bias_sq_ci_groups": [lo, hi],
                "rloo_bias_sq_ci": rloo["bias_sq_ci"],
                "rloo_covers_0": bool(lo <= 0 <= hi),
                "rloo_bias_sq_plugin": rloo["bias_sq_plugin"],
                "rloo_mse": rloo["mse"],
                "grpo_bias_sq": grpo["bias_sq"],
                "grpo_bias_sq_expected": expected,
                "grpo_bias_sq_ci_groups": [glo, ghi],
                "grpo_bias_sq_ci": grpo["bias_sq_ci"],
                "grpo_covers_expected": bool(glo <= expected <= ghi),
                "grpo_bias_sq_plugin": grpo["bias_sq_plugin"],
                "grpo_scale": grpo["scale"],
                "grpo_scale_expected": N / (N - 1),
                "ref_sq_norm": grpo["ref_sq_norm"],
                "plugin_inflation": {
                    est: table[f"N={N}/{est}"]["bias_sq_plugin"] - table[f"N={N}/{est}"]["bias_sq"]
                    for est in ("rloo", "grpo", "otb")
                    if f"N={N}/{est}" in table
                },
            }
        )
    return out


# ----------------------------------------------------------------------------------------------------------------
# Models, prompts, rewards
# ----------------------------------------------------------------------------------------------------------------


COUNT_PREFIX = "1, 2, 3,"
"""The count task's answer starts with this (as the start of the assistant turn): unprompted, the embedded model
often answers "The numbers from 1 to 120 are 1, 2, ..., 20." and stops, which is not a long answer."""


def count_reward(text: str, n: int) -> float:
    """Share of 1..n listed in order (the longest run 1, 2, 3, ... in the text, so a preamble such as "from 1 to
    100:" does not count against it), halved unless the run reaches n and nothing follows it."""
    import re

    numbers = [int(x) for x in re.findall(r"\d+", text)]
    best, complete = 0, False
    for start in (i for i, x in enumerate(numbers) if x == 1):
        run = 0
        while start + run < len(numbers) and run < n and numbers[start + run] == run + 1:
            run += 1
        if run > best:
            best, complete = run, run == n and start + run == len(numbers)
    return best / n * (1.0 if complete else 0.5)


def setup(quick: bool, num_prompts: int, seed: int, task: str = "math", count_targets=(120, 160, 200)):
    """(model, tokenizer, candidate prompts, reward_fn(completion_ids, texts, prompt_index) -> list[float]).

    ``num_prompts`` is the length of the candidate list (math, quick); a fixed list, so that prompt i is the same
    prompt in every invocation."""
    if quick:
        from trl_otb.testing import build_tiny_model, build_tiny_tokenizer

        tokenizer = build_tiny_tokenizer()
        model = build_tiny_model(len(tokenizer), tokenizer.eos_token_id)
        prompts = [[{"role": "user", "content": f"what is {i} + {i % 3}?"}] for i in range(num_prompts)]

        def reward(ids, texts, p):  # synthetic, varies within groups: parity of length and first token
            return [float((len(x) + (int(x[0]) if len(x) else 0) + p) % 2) for x in ids]

        return model, tokenizer, prompts, reward
    if task in STUDY_TASKS:
        return study_setup(task, num_prompts, seed)
    from trl_otb.demo.data import load_math_dataset
    from trl_otb.demo.models import load_model_and_tokenizer
    from trl_otb.demo.rewards import accuracy_reward

    model, tokenizer = load_model_and_tokenizer(dtype=torch.float32)
    if task == "count":
        targets = list(count_targets)
        prompts = [
            [
                {"role": "user", "content": f"List the numbers from 1 to {n}, separated by commas."},
                {"role": "assistant", "content": COUNT_PREFIX},
            ]
            for n in targets
        ]

        def reward(ids, texts, p):
            return [count_reward(COUNT_PREFIX + t, targets[p]) for t in texts]

        return model, tokenizer, prompts, reward
    data = load_math_dataset(split="train", num_train=num_prompts, seed=seed)
    prompts = [row["prompt"] for row in data]
    answers = [row["answer"] for row in data]

    def reward(ids, texts, p):
        return [float(r or 0.0) for r in accuracy_reward(texts, [answers[p]] * len(texts))]

    return model, tokenizer, prompts, reward


STUDY_TASKS = {"study-ramble": "ramble", "study-copy": "copy"}
"""The training study's tasks (``study_task.py``), on its warm-started policy of ``--seed``."""


def study_setup(task: str, num_prompts: int, seed: int):
    """The training study's policy of ``seed`` and the first ``num_prompts`` of its training patterns."""
    from benchmarks import study_task

    spec = study_task.TASKS[STUDY_TASKS[task]]
    model, tokenizer = study_task.warm_start(seed, Path(".cache/training_study"))
    patterns = study_task.split_patterns(seed)[0][:num_prompts]

    def reward(ids, texts, p):
        return [spec.score(t, patterns[p]) for t in texts]

    return model, tokenizer, [spec.prompt(p) for p in patterns], reward


SPACE_LABELS = {"lm_head": "LM head", "lora": "LoRA adapter"}
PLOTTED = (*VARIANCE_ESTIMATORS, "otb_group_mean", "otb_sequence_baseline", "otb_last_baseline", "otb_zero_advantage")
"""The estimators the figure draws, where a run measured them."""


def plot(results, Ns, horizons, path):
    """One row per parameter space: rescaled variance against N at each horizon, and at N=4 against horizon."""
    import matplotlib.ticker

    spaces = list(results)
    cols = len(horizons) + 1
    fig, grid = pyplot().subplots(len(spaces), cols, figsize=(4.2 * cols, 3.8 * len(spaces)), squeeze=False)
    for axes, space in zip(grid, spaces):
        label = f"rescaled variance ({SPACE_LABELS.get(space, space)})"
        for ax, h in zip(axes, horizons):
            table = results[space].get(str(h), {}).get("table")
            if not table:
                ax.set_title(f"horizon {h}: not measured in this space")
                ax.axis("off")
                continue
            for est in [e for e in dict.fromkeys(r["estimator"] for r in table.values()) if e in PLOTTED]:
                y = [table[f"N={N}/{est}"]["var_scaled"] for N in Ns]
                lo = [table[f"N={N}/{est}"]["var_scaled_ci"][0] for N in Ns]
                hi = [table[f"N={N}/{est}"]["var_scaled_ci"][1] for N in Ns]
                style = dict(lw=2.5, color="black") if est == "otb" else {}
                line = ax.plot(Ns, y, marker="o", label=est, **style)[0]
                ax.fill_between(Ns, lo, hi, color=line.get_color(), alpha=0.12)
            ax.set(xscale="log", yscale="log", xlabel="group size N", title=f"horizon {h}")
            ax.set_xticks(Ns, [str(n) for n in Ns])
            ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
            ax.set_ylabel(label)
        ax = axes[-1]
        N4 = 4 if 4 in Ns else Ns[0]
        for est in PLOTTED:
            ys = [
                results[space]
                .get(str(h), {})
                .get("table", {})
                .get(f"N={N4}/{est}", {})
                .get("var_scaled", float("nan"))
                for h in horizons
            ]
            if all(math.isnan(y) for y in ys):
                continue
            ax.plot(horizons, ys, marker="o", label=est, **(dict(lw=2.5, color="black") if est == "otb" else {}))
        ax.set(xscale="log", xlabel="horizon (max completion tokens)", title=f"N={N4}")
        ax.set_xticks(horizons, [str(h) for h in horizons])
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_ylabel(label)
        ax.legend(fontsize=7)
    save_figure(fig, path)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny random model, synthetic reward (CI)")
    parser.add_argument("--task", default="math", choices=["math", "count", *STUDY_TASKS])
    parser.add_argument(
        "--spaces",
        nargs="+",
        default=None,
        choices=list(SPACE_LABELS),
        help="parameter spaces (default: both for math, lm_head for count)",
    )
    parser.add_argument(
        "--prompts", type=int, default=None, help="prompts kept per horizon (rewards vary in the pool; default 12)"
    )
    parser.add_argument(
        "--candidates",
        type=int,
        default=None,
        help="math: size of the fixed candidate list, tried in order until --prompts are kept (default 64)",
    )
    parser.add_argument(
        "--count-targets",
        type=int,
        nargs="+",
        default=list(range(100, 240, 10)),
        help="n of the count task, one candidate prompt each, tried in order (default 100, 110, ..., 230)",
    )
    parser.add_argument("--pool", type=int, default=None, help="completions per prompt (default 16, quick 12)")
    parser.add_argument("--horizons", type=int, nargs="+", default=None, help="default 64 256 (quick 8 24)")
    parser.add_argument(
        "--sample-horizon",
        type=int,
        default=None,
        help="horizon the pools are sampled at (default the largest of --horizons; a pool serves every horizon up to "
        "its own, cut to the first h tokens)",
    )
    parser.add_argument("--Ns", type=int, nargs="+", default=None, help="group sizes (default 2 4 8 16)")
    parser.add_argument("--groups", type=int, default=None, help="random groups per prompt and N (default 100)")
    parser.add_argument("--bootstrap", type=int, default=2000)
    parser.add_argument("--temperature", type=float, default=None, help="sampling temperature (math 1.0, count 0.7)")
    parser.add_argument("--batch-size", type=int, default=32, help="completions per generate call")
    parser.add_argument("--top-k", type=int, default=64, help="per-token top-k kept in the vocabulary subset")
    parser.add_argument(
        "--sketch-dim", type=int, default=None, help="LoRA gradient sketch size (default 65536, quick 0 = exact)"
    )
    parser.add_argument(
        "--lora-horizons",
        type=int,
        nargs="+",
        default=None,
        help="horizons analysed in the LoRA space (default: the shortest; the cost is quadratic in it)",
    )
    parser.add_argument(
        "--cache",
        default=None,
        help="folder of the sampled pools and adapter Gram matrices (default .cache/variance; quick: OUT/pools_quick)",
    )
    parser.add_argument(
        "--time-limit",
        type=float,
        default=None,
        help="minutes after which no new pool (or adapter Gram matrix) is computed; the run then analyses what is "
        "cached and says what is missing, and the same command later resumes",
    )
    parser.add_argument("--sample-only", action="store_true", help="sample and cache the pools, analyse nothing")
    parser.add_argument(
        "--study",
        action="store_true",
        help="also the tail rule off and two OTB variants (paired against OTB), and the variance by share of active "
        "members (the estimator study of docs/benchmarks_details.md)",
    )
    parser.add_argument(
        "--fallbacks",
        action="store_true",
        help="the candidate grid instead of the shipped estimators: OTB with every tail of FALLBACK_TAILS, without "
        "and with leave-one-out, unscaled GRPO, RLOO and OGB, each with variance, squared bias and MSE, paired "
        "against reference OTB and GRPO, the calibration of the squared bias (RLOO 0, GRPO ||g_ref||^2 / N^2)",
    )
    parser.add_argument(
        "--decompose-Ns", type=int, nargs="+", default=[4], help="group sizes of the --study split (default 4)"
    )
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument("--stem", default=None, help="output file name (default variance, variance_count, ..._quick)")
    parser.add_argument("--replot", action="store_true", help="only redraw the PNG from the JSON in --out")
    return parser.parse_args(argv)


@dataclass
class Plan:
    """The settings of one invocation, with the defaults of ``--quick`` and of the task filled in."""

    spaces: list[str]
    horizons: list[int]
    lora_horizons: list[int]
    sample_horizon: int
    temperature: float
    sketch_dim: int
    target: int
    candidates: int
    pool_size: int
    Ns: list[int]
    num_groups: int
    cache: Path
    key: str
    deadline: float


def output_stem(args) -> str:
    if args.stem:
        return args.stem
    return "variance_quick" if args.quick else ("variance" if args.task == "math" else f"variance_{args.task}")


def plan(args) -> Plan:
    """The settings of ``args``, and the cache key of its pools: ``{task}-M{pool}-h{horizon}-T{temp}-k{topk}-s{seed}``
    (a pool file adds ``-p{prompt index}``)."""
    q = args.quick
    study = STUDY_TASKS.get(args.task)
    if study and not args.horizons:  # the task's own completion length
        from benchmarks import study_task

        args.horizons = [study_task.TASKS[study].max_completion_length]
    horizons = sorted(args.horizons or ([8, 24] if q else [64, 256]))
    sample_horizon = args.sample_horizon or max(horizons)
    if sample_horizon < max(horizons):
        raise SystemExit(f"--sample-horizon {sample_horizon} is below the largest horizon {max(horizons)}")
    temperature = args.temperature or (0.7 if args.task == "count" and not q else 1.0)
    pool_size = args.pool or (12 if q else 16)
    candidates = len(args.count_targets) if args.task == "count" and not q else (args.candidates or (6 if q else 64))
    # Prompt i of a task is the same prompt in every invocation (a cached pool is checked against it on load), so
    # candidates can be appended (more --count-targets, a larger --candidates) without resampling the others.
    task_tag = "quick" if q else args.task
    return Plan(
        spaces=args.spaces or (["lm_head", "lora"] if args.task == "math" else ["lm_head"]),
        horizons=horizons,
        lora_horizons=sorted(args.lora_horizons or [min(horizons)]),
        sample_horizon=sample_horizon,
        temperature=temperature,
        sketch_dim=args.sketch_dim if args.sketch_dim is not None else (0 if q else 2**16),
        target=args.prompts or (3 if q else 12),
        candidates=candidates,
        pool_size=pool_size,
        Ns=args.Ns or ([2, 4, 8] if q else [2, 4, 8, 16]),
        num_groups=args.groups or (64 if q else 100),
        cache=Path(args.cache or (Path(args.out) / "pools_quick" if q else ".cache/variance")),
        key=f"{task_tag}-M{pool_size}-h{sample_horizon}-T{temperature:g}-k{args.top_k}-s{args.seed}",
        deadline=time.perf_counter() + 60 * args.time_limit if args.time_limit else float("inf"),
    )


@dataclass
class Pools:
    """The candidates' pools (``data`` by prompt index, as ``load_or_sample_pool`` returns them), their rewards at
    each horizon, the prompts kept at each horizon, and why fewer than the target were kept (None: enough)."""

    data: dict = field(default_factory=dict)
    rewards: dict = field(default_factory=dict)  # (prompt, horizon) -> rewards of the pool cut at the horizon
    kept: dict = field(default_factory=dict)  # horizon -> prompt indices
    missing: str | None = None


def collect_pools(model, tokenizer, prompts, reward_fn, args, run: Plan) -> Pools:
    """Candidates in a fixed order, until every horizon has ``run.target`` prompts whose pool rewards vary there;
    each pool from the cache or sampled (no new one past the time limit)."""
    pools = Pools(kept={h: [] for h in run.horizons})
    kept, missing = pools.kept, None
    for p, prompt in enumerate(prompts):
        if all(len(kept[h]) >= run.target for h in run.horizons):
            break
        path = run.cache / f"{run.key}-p{p:03d}.pt"
        if not path.exists() and time.perf_counter() > run.deadline:
            missing = f"time limit reached before candidate {p} was sampled"
            break
        data, was_cached = load_or_sample_pool(
            model, tokenizer, prompt, p, run.cache, run.key, run.pool_size, run.sample_horizon, args.batch_size,
            run.temperature, args.top_k, args.seed,
        )  # fmt: skip
        pools.data[p] = data
        for h in run.horizons:
            ids = [c["ids"][:h] for c in data["records"]]
            texts = tokenizer.batch_decode(ids, skip_special_tokens=True)
            pools.rewards[(p, h)] = reward_fn([x.tolist() for x in ids], texts, p)
            if len(kept[h]) < run.target and len(set(pools.rewards[(p, h)])) > 1:
                kept[h].append(p)
        how = "cached" if was_cached else f"sampled in {data['sample_seconds']:.0f} s"
        print(
            f"candidate {p}: {how}, kept at "
            f"{[h for h in run.horizons if p in kept[h]]}; kept so far {[len(kept[h]) for h in run.horizons]}",
            flush=True,
        )
    short = {h: len(kept[h]) for h in run.horizons if len(kept[h]) < run.target}
    if short and missing is None:
        missing = f"the {len(prompts)} candidates gave fewer than {run.target} prompts with varying rewards"
    if short:
        print(f"WARNING: {missing}: prompts kept per horizon {short} (target {run.target})", flush=True)
        pools.missing = missing
    return pools


@dataclass
class Analysis:
    """What the estimators are compared on: the estimators, the paired comparisons, the decomposed estimators."""

    estimators: dict
    pairs: tuple
    decompose: tuple
    fallbacks: bool = False
    implementation: dict = field(default_factory=dict)  # --fallbacks: estimator -> "core" or the script's reference

    @classmethod
    def of(cls, study: bool, fallbacks: bool = False) -> Analysis:
        if not fallbacks:
            return cls(
                estimators={**VARIANCE_ESTIMATORS, **(STUDY_ESTIMATORS if study else {})},
                pairs=PAIRS + (STUDY_PAIRS if study else ()),
                decompose=DECOMPOSED if study else (),
            )
        grid, implementation = fallback_estimators()
        estimators = {**grid, **(STUDY_ESTIMATORS if study else {})}
        pairs = tuple(dict.fromkeys(PAIRS + fallback_pairs(grid) + (STUDY_PAIRS if study else ())))
        decompose = tuple(e for e in DECOMPOSED if e in estimators) if study else ()
        return cls(estimators, pairs, decompose, True, implementation)


def analyse_horizon(h, pools: Pools, head_weight, adapter, args, run: Plan, analysis: Analysis, lora_s: dict):
    """Per space, the per-prompt cells (``analyse_prompt``) of every prompt kept at horizon ``h``, and what the
    summary reports beside them: the prompts used, mean lengths, tail bounds, seconds, adapter Grams missing."""
    spaces = run.spaces
    per_prompt = {space: [] for space in spaces}
    bounds, subset_sizes, mean_len, kept_rows, lora_missing = [], [], [], [], []
    t_head = t_lora = 0.0
    fallback_checks = {}
    generator = torch.Generator()
    for p in pools.kept[h]:
        comps, rewards = pools.data[p]["records"], pools.rewards[(p, h)]
        R, proxy, mask = prompt_tensors(comps, rewards, h)
        grams = {}
        t0 = time.perf_counter()
        if "lm_head" in spaces:
            cut = [{k: v[:h] for k, v in c.items()} for c in comps]
            grams["lm_head"], bound, subset = token_gram(cut, head_weight, run.temperature)
            bounds.append(bound)
            subset_sizes.append(subset)
        t1 = time.perf_counter()
        if "lora" in spaces and h in run.lora_horizons:
            gram_path = run.cache / f"{run.key}-p{p:03d}-lora-h{h}-d{run.sketch_dim}.pt"
            if gram_path.exists() or time.perf_counter() < run.deadline:
                lora = cached_lora_gram(
                    adapter, pools.data[p], run.cache, run.key, p, h, run.sketch_dim, run.temperature
                )
                grams["lora"] = lora["K"]
                lora_s[p] = lora["seconds"]
            else:
                lora_missing.append(p)
        t2 = time.perf_counter()
        for space, K in grams.items():
            # The same random groups in every space and for every estimator: seeded by (seed, prompt, horizon).
            generator.manual_seed(pool_seed(args.seed, p) * 7919 + h)
            per_prompt[space].append(
                analyse_prompt(
                    K, R, proxy, mask, run.Ns, run.num_groups, generator, analysis.estimators, analysis.decompose,
                    args.decompose_Ns, centred=analysis.fallbacks,
                )
            )  # fmt: skip
        if analysis.fallbacks:
            generator.manual_seed(pool_seed(args.seed, p) * 7919 + h)  # the groups analysed above, drawn again
            for name, value in check_fallbacks(R, proxy, mask, run.Ns, run.num_groups, generator).items():
                fallback_checks[name] = max(fallback_checks.get(name, 0.0), value)
        t3 = time.perf_counter()
        t_head += (t1 - t0) + (t3 - t2) * ("lm_head" in grams) / max(len(grams), 1)
        t_lora += (t2 - t1) + (t3 - t2) * ("lora" in grams) / max(len(grams), 1)
        kept_rows.append({"prompt": p, "mean_reward": sum(rewards) / len(rewards), "seed": pools.data[p]["seed"]})
        mean_len.append(float(mask.sum(1).float().mean()))
    return {
        "per_prompt": per_prompt,
        "bounds": bounds,
        "subset_sizes": subset_sizes,
        "mean_len": mean_len,
        "kept_rows": kept_rows,
        "lora_missing": lora_missing,
        "seconds": {"lm_head": t_head, "lora": t_lora},
        "fallback_checks": fallback_checks,
    }


def summarise_space(space, h, cells: dict, args, run: Plan, analysis: Analysis) -> dict:
    """The JSON entry of one space at horizon ``h``: the bootstrap table, the paired tests, the decomposition."""
    rows = cells["per_prompt"][space]
    generator = torch.Generator().manual_seed(args.seed * 31 + h)
    table, paired = (
        summarise(rows, run.Ns, args.bootstrap, generator, list(analysis.estimators), analysis.pairs)
        if rows
        else ({}, {})
    )
    decomposition = (
        decomposition_summary(rows, table, [n for n in run.Ns if n in args.decompose_Ns], analysis.decompose)
        if rows and analysis.decompose
        else None
    )
    centred = None
    if rows and analysis.fallbacks:
        # The same analysis in the score-centred pool (position_centring), with its own resampling seed so that
        # the pool reference's numbers do not depend on whether this runs.
        view = [{key[1:]: cell for key, cell in pp.items() if key[0] == "centred"} for pp in rows]
        table_c, paired_c = summarise(
            view, run.Ns, args.bootstrap, torch.Generator().manual_seed(args.seed * 31 + h + 17),
            list(analysis.estimators), analysis.pairs,
        )  # fmt: skip
        centred = {"table": table_c, "paired": paired_c, "calibration": calibration(table_c, run.Ns)}
    answer = matching_n(table, run.Ns) if table and 4 in run.Ns else None
    lora_missing = cells["lora_missing"]
    mean_len = cells["mean_len"]
    return {
        "horizon": h,
        "prompts_kept": [r for r in cells["kept_rows"] if space != "lora" or r["prompt"] not in lora_missing],
        "prompts_target": run.target,
        "mean_completion_tokens": sum(mean_len) / max(len(mean_len), 1),
        "tail_bound_max": max(cells["bounds"], default=0.0) if space == "lm_head" else 0.0,
        "vocab_subset_sizes": cells["subset_sizes"] if space == "lm_head" else [],
        "grpo_N_matching_otb_N4": answer,
        "grpo_std_N_matching_otb_N4": matching_n(table, run.Ns, "grpo_std")
        if answer is not None and f"N={run.Ns[0]}/grpo_std" in table
        else None,
        "table": table,
        "paired": paired,
        "decomposition": decomposition,
        "missing": (f"adapter Gram matrices of prompts {lora_missing} (time limit)" if lora_missing else None)
        if space == "lora"
        else None,
        **(
            {
                "calibration": calibration(table, run.Ns),
                "fallback_checks": cells["fallback_checks"],
                "centred": centred,
            }
            if analysis.fallbacks and table
            else {}
        ),
    }


def print_summary(space, h, res: dict, prompts: int) -> None:
    print(f"{space}, horizon {h}: {prompts} prompts, mean length {res['mean_completion_tokens']:.1f}")
    for k, row in res["table"].items():
        print(
            f"  {k:16s} var {row['var']:.4g}  mse {row['mse']:.4g}  scale {row['scale']:.3f}  "
            f"var_scaled {row['var_scaled']:.4g} [{row['var_scaled_ci'][0]:.4g}, {row['var_scaled_ci'][1]:.4g}]"
        )
    for k, t in res["paired"].items():
        print(
            f"  {k:16s} diff {t['diff']:.4g} [{t['diff_ci'][0]:.4g}, {t['diff_ci'][1]:.4g}] ratio "
            f"{t['ratio']:.3f} [{t['ratio_ci'][0]:.3f}, {t['ratio_ci'][1]:.3f}]"
            f"{'  significant' if t['significant'] else ''}"
        )
    print(f"  GRPO N matching OTB at N=4 (rescaled variance): {res['grpo_N_matching_otb_N4']}")


def run_meta(args, run: Plan, pools: Pools, lora_s: dict, analysis_s: dict, start: float) -> dict:
    q = args.quick
    return {
        "command": args.command,
        "model": "tiny random Llama"
        if q
        else f"the training study's warm-started 2-layer Llama (seed {args.seed})"
        if args.task in STUDY_TASKS
        else "embedded SmolLM2-135M-Instruct",
        "task": "synthetic" if q else args.task,
        "count_targets": args.count_targets if args.task == "count" and not q else None,
        "spaces": run.spaces,
        "temperature": run.temperature,
        "prompts_target": run.target,
        "candidates": run.candidates,
        "candidates_tried": len(pools.data),
        "pool": run.pool_size,
        "sample_horizon": run.sample_horizon,
        "seed": args.seed,
        "cache_key": run.key,
        "Ns": run.Ns,
        "groups_per_prompt": run.num_groups,
        "bootstrap": args.bootstrap,
        "intervals": "95% percentile bootstrap; `*_ci`: prompts resampled, then groups within each (two levels); "
        "`*_ci_groups`: prompts fixed, groups resampled; the scale a is re-estimated in every resample",
        "top_k": args.top_k,
        "lora": {
            "r": 16,
            "alpha": 32,
            "target_modules": "all-linear",
            "sketch_dim": run.sketch_dim,
            "horizons": run.lora_horizons,
        }
        if "lora" in run.spaces
        else None,
        "missing": pools.missing,
        "cost": {
            "sample_seconds_per_pool": {str(p): d["sample_seconds"] for p, d in pools.data.items()},
            "adapter_gram_seconds_per_prompt": {str(p): t for p, t in lora_s.items()},
            "analysis_seconds": analysis_s,
            "note": "sampling and adapter-gradient seconds were measured when each was computed (possibly by an "
            "earlier invocation); analysis seconds are this invocation's",
        },
        "total_seconds": time.perf_counter() - start,
    }


def replot(args) -> None:
    """Redraw the PNG from the JSON in ``--out``."""
    out, stem = Path(args.out), output_stem(args)
    data = json.loads((out / f"{stem}.json").read_text())
    horizons = sorted(int(h) for h in next(iter(data["results"].values())))
    plot(data["results"], data["meta"]["Ns"], horizons, out / f"{stem}.png")


def main(argv=None):
    args = parse_args(argv)
    # The command that reproduces this run: its own arguments when another script calls main(argv).
    args.command = command("variance.py", argv)
    if args.replot:
        return replot(args)
    torch.set_num_threads(args.threads)
    run = plan(args)
    start = time.perf_counter()
    model, tokenizer, prompts, reward_fn = setup(args.quick, run.candidates, args.seed, args.task, args.count_targets)
    model.eval()
    pools = collect_pools(model, tokenizer, prompts, reward_fn, args, run)
    if args.sample_only:
        print(f"pools cached in {run.cache} ({time.perf_counter() - start:.0f} s)")
        return

    analysis = Analysis.of(args.study, args.fallbacks)
    head_weight = model.get_output_embeddings().weight.detach()
    adapter = None
    if "lora" in run.spaces:
        adapter = attach_adapter(model)
        adapter.eval()
    results = {space: {} for space in run.spaces}
    analysis_s = {space: {} for space in run.spaces}
    lora_s = {}  # prompt -> seconds its adapter Gram matrix took
    for h in run.horizons:
        cells = analyse_horizon(h, pools, head_weight, adapter, args, run, analysis, lora_s)
        for space in run.spaces:
            if space == "lora" and h not in run.lora_horizons:
                continue
            analysis_s[space][str(h)] = cells["seconds"][space]
            results[space][str(h)] = summarise_space(space, h, cells, args, run, analysis)
            print_summary(space, h, results[space][str(h)], len(cells["per_prompt"][space]))
    out, stem = Path(args.out), output_stem(args)
    meta = run_meta(args, run, pools, lora_s, analysis_s, start)
    if analysis.fallbacks:
        meta["fallbacks"] = {
            "tails": list(FALLBACK_TAILS),
            "implementation": analysis.implementation,
            "core_tails": list(core_tails()),
            "bias": "bias_sq = ||E g - g_ref||^2 per prompt, the plug-in ||g_bar - g_ref||^2 less the unbiased "
            "Var(g) / G (squared_bias); bias_sq_plugin is the uncorrected one; mse = var G / (G - 1) + bias_sq",
        }
    write_json(out / f"{stem}.json", {"meta": meta, "results": results})
    plot(results, run.Ns, run.horizons, out / f"{stem}.png")
    print(f"wrote {out / stem}.json and .png ({meta['total_seconds']:.0f} s)")


if __name__ == "__main__":
    main()
