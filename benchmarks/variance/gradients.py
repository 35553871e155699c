"""The variance tool's gradients: every estimator's gradient as a coefficient vector over the pool's tokens, and
the inner products the statistics need, group by group, without forming a gradient. The token Gram matrices of the
two spaces (the LM head's, exact up to a bounded tail; a LoRA adapter's, by CountSketched per-token gradients) are
the library's (``trl_otb.gradcheck.gram``, where the method is written down).

In the LoRA adapter's space (``--spaces lora``) the adapter is r=16, alpha=32 on every linear layer of the body, as
in ``examples/recipes/cpu_smollm2_lora.yaml``, at its initialisation (B = 0: only the B matrices get gradient);
``--sketch-dim`` sets the CountSketch's dimension (0 keeps the gradients exact). The cost is quadratic in the
completion length, which is why the long-answer run stays in the LM head.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch

from benchmarks.variance.estimators import SHARE_BINS, VARIANCE_ESTIMATORS, group_advantages, share_bin
from trl_otb.gradcheck import gram
from trl_otb.gradcheck.gram import (
    draw_groups,
    linear_token_gradients,
    position_centring,
    reference_coefficients,
)


def attach_adapter(model, r=16, alpha=32):
    """The LoRA adapter of ``examples/recipes/cpu_smollm2_lora.yaml`` (every linear layer of the body), at init."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=r, lora_alpha=alpha, lora_dropout=0.0, target_modules="all-linear", task_type="CAUSAL_LM")
    return get_peft_model(model, config)


def adapter_token_gradients(model, prompt_ids, completions, sketch_dim=2**16, temperature=1.0, chunk=16, seed=0):
    """Per completion, S [T, D]: the gradient of log pi(y_t) w.r.t. every trainable Linear weight (a PEFT LoRA
    model's adapter), one row per token (``trl_otb.gradcheck.gram.linear_token_gradients``)."""
    layers = [m for m in model.modules() if isinstance(m, torch.nn.Linear) and m.weight.requires_grad]
    if not layers:
        raise ValueError("The model has no trainable nn.Linear weights: attach an adapter first (attach_adapter).")
    return linear_token_gradients(model, layers, prompt_ids, completions, sketch_dim, temperature, chunk, seed)[0]


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
    """C [G, n]: coefficient of each pool token in g = (1/N) sum_i sum_t A_t^(i) s_t^(i), for every group
    (``trl_otb.gradcheck.gram.group_coefficients``). ``token_weight`` [G * N, T] multiplies each token's coefficient
    (a 0/1 filter keeps part of the gradient); ``adv`` reuses advantages already computed for these groups."""
    if adv is None:
        adv = group_advantages(estimator, groups, rewards, proxy, mask, estimators)
    if token_weight is not None:
        adv = adv * token_weight
    return gram.group_coefficients(adv, groups, mask, offsets, n_tokens)


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
