"""The estimators compared, as advantage functions of a batch of groups: the ones trl-otb ships
(``VARIANCE_ESTIMATORS``), the estimator study's variants (``--study``), OTB's tail fallbacks (``--fallbacks``), and
the paired comparisons reported between them.

``--fallbacks`` measures OTB's tail options instead of the shipped estimators: every tail of ``FALLBACK_TAILS`` (the
reference ``zero``, the legacy ``none``, the shift-invariant ``group_mean``, ``sequence_baseline``,
``last_baseline``, ``zero_advantage``), without and with leave-one-out, beside unscaled GRPO, RLOO and OGB; each
pair (candidate, reference OTB) and (candidate, GRPO) gets paired intervals of the difference in var, bias_sq and
mse (``paired[...]["metrics"]``). A tail the installed core does not accept yet is computed by this module's
reference ``otb_fallback_advantages`` (``meta.fallbacks.implementation`` says which); where the core has it, the two
are compared on the analysed groups (``fallback_checks``). It first calibrates the bias (``calibration``, in both
the pool and the score-centred pool): RLOO's must cover 0 and unscaled GRPO's must cover ||g_ref||^2 / N^2, GRPO's
exact (1 - 1/N) rescaling.
"""

from __future__ import annotations

import torch

from trl_otb import compute_advantages
from trl_otb.gradcheck.gram import draw_groups

VARIANCE_ESTIMATORS = {
    "grpo": ("grpo", {"scale": "none"}),
    "grpo_std": ("grpo", {"scale": "group"}),
    "rloo": ("rloo", {}),
    "opo": ("opo", {}),
    "ogb": ("ogb", {}),
    "otb": ("otb", {"tail": "zero", "leave_one_out": False}),
    "otb_loo": ("otb", {"tail": "zero", "leave_one_out": True}),
}
"""The estimators trl-otb ships, by their names in the JSON: (the core's estimator, its options). Each names the
options it sets, so that a change of the library's defaults cannot redefine one."""
PAIRS = (("otb", "grpo"), ("otb", "ogb"))
"""The paired comparisons reported per cell: (a, b) gives the rescaled variance of a minus that of b."""


YARDSTICK_ESTIMATORS = {
    "grpo_std": ("grpo", {"scale": "group"}),
    "grpo": ("grpo", {"scale": "none"}),
    "rloo": ("rloo", {}),
    "ogb": ("ogb", {}),
    "otb_default": ("otb", {"tail": "zero_advantage", "leave_one_out": False}),
    "otb": ("otb", {"tail": "zero", "leave_one_out": False}),
    "otb_zero_advantage_loo": ("otb", {"tail": "zero_advantage", "leave_one_out": True}),
}
"""``--yardstick``'s estimators: TRL's GRPO (std-scaled), unscaled GRPO, RLOO, OGB, the 0.2.0 default OTB
(``zero_advantage``, self-inclusive; its JSON key, ``otb_default``, is kept so that the committed results read the
same), the reference OTB (``zero``), leave-one-out OTB with ``zero_advantage``; and
``UNBIASED_OTB`` where the installed core has them (``yardstick_estimators``)."""
UNBIASED_OTB = {
    "otb_others_mean_loo": ("otb", {"tail": "others_mean", "leave_one_out": True, "shrinkage": "none"}),
    "otb_others_mean_loo_ess": ("otb", {"tail": "others_mean", "leave_one_out": True, "shrinkage": "ess"}),
}
"""The exactly unbiased OTB options: leave-one-out with the others' mean at lone positions, and the same shrunk
toward the others' mean by its effective sample size."""


def yardstick_estimators() -> dict:
    """``YARDSTICK_ESTIMATORS`` and each of ``UNBIASED_OTB`` that the installed core accepts."""
    out = dict(YARDSTICK_ESTIMATORS)
    one = (torch.ones(2), torch.ones(2, 1), torch.ones(2, 1), torch.zeros(2, dtype=torch.long))
    for name, (estimator, options) in UNBIASED_OTB.items():
        try:
            compute_advantages(estimator, *one, **options)
        except (TypeError, ValueError):
            continue
        out[name] = (estimator, options)
    return out


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


STUDY_ESTIMATORS = {
    "otb_tail_none": ("otb", {"tail": "none", "leave_one_out": False}),
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
    """The grid's estimator names: ``otb`` / ``otb_loo`` for the reference tail (as elsewhere in this package),
    ``otb_<tail>`` / ``otb_<tail>_loo`` for the others."""
    base = "otb" if tail == "zero" else f"otb_{tail}"
    return f"{base}_loo" if leave_one_out else base


def fallback_estimators(tails=None) -> tuple[dict, dict]:
    """(estimators, implementation): OTB with every tail of ``FALLBACK_TAILS``, without and with leave-one-out,
    then unscaled GRPO, RLOO and OGB. A tail the installed core accepts is measured through ``compute_advantages``
    (``implementation[name] = "core"``); one it does not yet accept through ``otb_fallback_advantages``
    (``"benchmarks/variance reference"``)."""
    tails = core_tails() if tails is None else tails
    estimators, implementation = {}, {}
    for loo in (False, True):
        for tail in FALLBACK_TAILS:
            name = fallback_name(tail, loo)
            if tail in tails:
                # every option named, so that a change of the library's defaults cannot redefine a row
                estimators[name] = ("otb", {"tail": tail, "leave_one_out": loo, "shrinkage": "none"})
                implementation[name] = "core"
            else:
                estimators[name] = (otb_fallback_advantages, {"tail": tail, "leave_one_out": loo})
                implementation[name] = "benchmarks/variance reference"
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
    """[B, T] advantages (fp64) of one estimator ``spec``: (a core estimator's name or a function, its options)."""
    name, options = spec
    fn = name if callable(name) else (lambda *a, **o: compute_advantages(name, *a, **o))
    return fn(rewards, proxy, mask, group_ids, **options).double()


def group_advantages(estimator, groups, rewards, proxy, mask, estimators=None):
    """[G * N, T] advantages of every group's members (fp64), rows in group order."""
    G, N = groups.shape
    flat = groups.flatten()
    spec = (estimators or VARIANCE_ESTIMATORS)[estimator]
    return _advantages(spec, rewards[flat], proxy[flat], mask[flat], torch.arange(G).repeat_interleave(N))


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
                reference = otb_fallback_advantages(
                    *args, tail=spec[1]["tail"], leave_one_out=spec[1]["leave_one_out"]
                )
                record(f"core_vs_reference_{name}", adv, reference)  # the reference has no shrinkage
    return out
