"""The variance tool's yardstick (benchmarks/variance/yardstick.py), calibrated before use on the exactly solvable toy
(trl_otb/testing/toy.py): sampled groups go through the tool's own cell code (``gradients._cell_terms`` with an
identity Gram, coefficients = the gradients' coordinates) and its estimation, and the estimates are compared with the
toy's exact moments through ``trl_otb.core.yardstick``. Then a --quick run reports the yardstick in its JSON."""

from __future__ import annotations

import json
import math
import sys

import pytest
import torch

from benchmarks import variance
from benchmarks.variance.gradients import _cell_terms
from benchmarks.variance.statistics import summarise
from benchmarks.variance.yardstick import estimate, products, summarise_yardstick
from trl_otb.core import compute_advantages
from trl_otb.core.yardstick import yardstick
from trl_otb.testing.toy import toy_policy

N, B = 4, 4
PROMPTS, GROUPS = 6, 400  # the toy as 6 independent "prompts" of 400 groups each (the tool's layout)


def estimator(name, **options):
    return lambda r, p, m, gid: compute_advantages(name, r.float(), p.float(), m.float(), gid, **options)


ESTIMATORS = {
    "grpo": estimator("grpo", scale="none"),
    "rloo": estimator("rloo"),
    "otb_self_inclusive": estimator("otb", tail="zero_advantage", leave_one_out=False, shrinkage="none"),
}
CALIBRATED = ("grpo", "rloo")


@pytest.fixture(scope="module")
def toy():
    policy = toy_policy(length=3, vocab=3, seed=1)
    return policy, policy.true_gradient()


@pytest.fixture(scope="module")
def exact(toy):
    policy, g = toy
    return {name: policy.exact_moments(ESTIMATORS[name], N) for name in CALIBRATED}


def orthogonal_unit(g, seed=3):
    u = torch.randn(len(g), generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    u -= (u @ g) / (g @ g) * g
    return u / u.norm()


def toy_cells(policy, g, samples: dict, seed=0):
    """The tool's per-prompt cells {(N, name): terms} from sampled one-group gradients: ``samples`` maps a name to a
    function of (groups [G, N]) -> gradients [G, D]. In the toy's coordinates the Gram matrix is the identity."""
    D = len(g)
    eye = torch.eye(D, dtype=torch.float64)
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(PROMPTS):
        groups = policy.sample_groups(GROUPS, N, gen)
        cells = {}
        for name, fn in samples.items():
            C = fn(groups)
            cells[(N, name)] = _cell_terms(C, C @ eye, g, g, float(g @ g), coords=(eye, torch.ones(D)))
        out.append(cells)
    return out


@pytest.fixture(scope="module")
def measured(toy, exact):
    """Yardstick rows of GRPO, RLOO and RLOO with a planted orthogonal bias (as long as its mean),
    on the same groups and resamples; and the tool's rescaled variance of the same cells."""
    policy, g = toy
    u = orthogonal_unit(g) * exact["rloo"][0].norm()
    samples = {name: (lambda groups, est=ESTIMATORS[name]: policy.group_gradients(groups, est)) for name in CALIBRATED}
    samples["planted"] = lambda groups: policy.group_gradients(groups, ESTIMATORS["rloo"]) + u
    cells = toy_cells(policy, g, samples)
    names = list(samples)
    rows, paired = summarise_yardstick(cells, [N], names, B, 1000, torch.Generator().manual_seed(1))
    table, _ = summarise(cells, [N], 200, torch.Generator().manual_seed(2), names, pairs=())
    return rows, paired, table


def covers(row, key, value):
    lo, hi = row[f"{key}_ci"]
    return lo <= value <= hi


def test_grpo_and_rloo_point_along_the_true_gradient_with_their_known_scales(measured, toy, exact):
    rows, _, _ = measured
    _, g = toy
    for name, scale in (("grpo", 1 - 1 / N), ("rloo", 1.0)):
        row = rows[f"N={N}/{name}"]
        truth = yardstick(*exact[name], g, B)
        assert truth["cos"] == pytest.approx(1.0, abs=1e-6) and truth["scale"] == pytest.approx(scale, abs=1e-6)
        assert covers(row, "cos", 1.0) and abs(row["cos"] - 1) < 0.03, row
        assert covers(row, "scale", scale) and abs(row["scale"] - scale) < 0.05 * scale, row
        for key in ("snr", "eps_star", "kappa"):  # against the toy's exact moments
            assert covers(row, key, truth[key]), (name, key, row[key], truth[key])


def test_the_self_inclusive_otbs_direction_bias_is_found_where_its_exact_moments_put_it():
    """On a toy where self-inclusive OTB's mean is far off the true gradient (exact cos 0.953), the estimated cos,
    scale, snr, eps_star and kappa cover the exact values, and the paired difference to GRPO is found."""
    policy = toy_policy(length=3, vocab=3, seed=10, scale=1.5)
    g = policy.true_gradient()
    names = ("grpo", "otb_self_inclusive")
    truth = {name: yardstick(*policy.exact_moments(ESTIMATORS[name], N), g, B) for name in names}
    assert truth["otb_self_inclusive"]["cos"] < 0.96 and truth["grpo"]["cos"] == pytest.approx(1.0, abs=1e-6)
    samples = {name: (lambda groups, est=ESTIMATORS[name]: policy.group_gradients(groups, est)) for name in names}
    rows, paired = summarise_yardstick(
        toy_cells(policy, g, samples, seed=4), [N], list(names), B, 1000, torch.Generator().manual_seed(1)
    )
    for name in names:
        for key in ("cos", "scale", "snr", "eps_star", "kappa"):
            assert covers(rows[f"N={N}/{name}"], key, truth[name][key]), (name, key, rows[f"N={N}/{name}"][key])
    assert paired[f"N={N}/otb_self_inclusive-grpo"]["cos"]["diff_ci"][1] < 0


def test_a_planted_orthogonal_bias_is_caught_by_cos_and_rewarded_by_the_rescaled_variance(measured):
    rows, paired, table = measured
    planted, rloo = rows[f"N={N}/planted"], rows[f"N={N}/rloo"]
    assert covers(planted, "cos", math.cos(math.pi / 4)) and planted["cos_ci"][1] < 0.9  # caught
    assert planted["scale"] == pytest.approx(rloo["scale"], rel=1e-9)  # the same component along g
    assert paired[f"N={N}/planted-grpo"]["eps_star"]["diff_ci"][0] > 0  # worse at the best rescaling
    # The criterion the yardstick replaces: a²·Var, a = <m, g>/||m||², is smaller for the planted bias (a halves
    # when ||m||² doubles) although its variance is RLOO's exactly.
    assert table[f"N={N}/planted"]["var"] == pytest.approx(table[f"N={N}/rloo"]["var"], rel=1e-6)
    assert table[f"N={N}/planted"]["var_scaled"] < 0.3 * table[f"N={N}/rloo"]["var_scaled"]


def test_the_corrected_squared_mean_removes_the_plug_in_inflation(toy, exact):
    """Over many small samples (G = 2 groups), the corrected ||m||² averages to the exact one while the plug-in
    ||g_bar||² is too large by tr Σ / G; <m, g> needs no correction (g is exact), and tr Σ is unbiased."""
    policy, g = toy
    mean, cov = exact["rloo"]
    G, reps = 2, 20000
    grads = policy.group_gradients(
        policy.sample_groups(G * reps, N, torch.Generator().manual_seed(5)), ESTIMATORS["rloo"]
    )
    grads = grads.reshape(reps, G, -1)
    Q = grads @ grads.transpose(1, 2)
    prod = products(
        Q, grads @ g, torch.full((reps,), float(g @ g)), torch.arange(reps)[None], torch.arange(G).expand(1, reps, G)
    )
    m_sq, tr = float(mean @ mean), float(cov.trace())
    assert prod["m_sq"][0] / reps == pytest.approx(m_sq, rel=0.05)
    assert prod["m_sq_plugin"][0] / reps == pytest.approx(m_sq + tr / G, rel=0.05)
    assert tr / G > 0.3 * m_sq  # precondition: the inflation is large here
    assert prod["trace_cov"][0] / reps == pytest.approx(tr, rel=0.05)
    assert prod["m_dot_g"][0] / reps == pytest.approx(float(mean @ g), rel=0.05)


def test_estimate_is_the_library_formula_on_the_corrected_products(toy):
    """One prompt, every group once: the point estimate is yardstick_from_products of the corrected products."""
    policy, g = toy
    grads = policy.group_gradients(policy.sample_groups(50, N, torch.Generator().manual_seed(7)), ESTIMATORS["grpo"])
    Q, dot, ref = (grads @ grads.T)[None], (grads @ g)[None], torch.tensor([float(g @ g)])
    row, _ = estimate(Q, dot, ref, B, torch.zeros(3, 1, dtype=torch.long), torch.randint(50, (3, 1, 50)))
    mean, G = grads.mean(0), 50
    trace = float(((grads - mean) ** 2).sum(1).sum() / (G - 1))
    m_sq = float(mean @ mean) - trace / G
    assert row["cos"] == pytest.approx(float(mean @ g) / math.sqrt(m_sq * float(g @ g)), rel=1e-6)
    assert row["snr"] == pytest.approx(B * m_sq / trace, rel=1e-6)
    assert row["eps_star"] == pytest.approx(1 - float(mean @ g) ** 2 / (float(g @ g) * (m_sq + trace / B)), rel=1e-6)


def test_quick_run_reports_the_yardstick(tmp_path, monkeypatch):
    """--quick --yardstick: every estimator of the yardstick has cos, scale, snr, eps_star and kappa with intervals
    in each horizon's ``yardstick`` entry, B is recorded, GRPO's and RLOO's cos cover 1 (the score-centred pool makes
    them exactly unbiased), and the default OTB is paired against GRPO."""
    threads = torch.get_num_threads()
    argv = ["variance.py", "--quick", "--yardstick", "--Ns", "4", "--groups", "48", "--bootstrap", "300"]
    monkeypatch.setattr(sys, "argv", [*argv, "--batch-groups", "8", "--out", str(tmp_path), "--cache", str(tmp_path)])
    try:
        variance.main()
    finally:
        torch.set_num_threads(threads)
    data = json.loads((tmp_path / "variance_quick.json").read_text())
    assert data["meta"]["yardstick"]["batch_groups"] == 8
    names = set(data["meta"]["yardstick"]["estimators"])
    assert set(variance.estimators.YARDSTICK_ESTIMATORS) <= names
    for res in data["results"]["lm_head"].values():
        y = res["yardstick"]
        assert y["batch_groups"] == 8 and {k.split("/")[1] for k in y["table"]} == names
        for row in y["table"].values():
            for key in ("cos", "scale", "snr", "eps_star", "kappa"):
                assert math.isfinite(row[key]) and row[f"{key}_ci"][0] <= row[f"{key}_ci"][1], key
        for name in ("grpo", "grpo_std", "rloo"):
            assert covers(y["table"][f"N=4/{name}"], "cos", 1.0), name
        assert y["table"]["N=4/grpo"]["cos"] == pytest.approx(y["table"]["N=4/rloo"]["cos"], abs=0.05)
        assert set(y["paired"]["N=4/otb_default-grpo"]) >= {"cos", "eps_star"}
        assert "var_scaled" in res["table"]["N=4/otb_default"]  # today's columns stay
