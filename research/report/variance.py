"""The gradient-variance blocks: each cell's tables (rescaled and raw variance, OTB paired against the others, the
estimator study and its decomposition), the 3-prompt runs' tables, and the verdict across the current cells
(``CELLS``) with the sentence that says it."""

from __future__ import annotations

from functools import partial

from research.report.tables import Context, markdown_table, num

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
# JSON are the estimator study's variants (python -m benchmarks.variance --study).
SHIPPED = ("grpo", "grpo_std", "rloo", "opo", "ogb", "otb", "otb_loo")


SPACES = {"lm_head": "LM head", "lora": "LoRA adapter"}


def _cell(ctx: Context, stem: str, horizon: str, space: str = "lm_head") -> dict:
    return ctx.load(stem)["results"][space][str(horizon)]


def estimator_names(table: dict, only=None) -> list[str]:
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
        Ns, ests = _Ns(table), estimator_names(table)
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
    names = SHIPPED if which == "shipped" else [n for n in estimator_names(res["table"]) if n not in SHIPPED]
    ci = "95% CI over prompts and groups"
    lines = [variance_caption(res, _label(task, horizon), ci, f"; {ctx.link(stem)}"), ""]
    return "\n".join(
        lines
        + per_n_table(estimator_names(res["table"], names), _Ns(res["table"]), partial(rescaled_cell, res["table"]))
    )


def variance_raw(ctx: Context, task: str, stem: str, horizon: str) -> str:
    res = _cell(ctx, stem, horizon)
    table = res["table"]
    lines = [f"{_label(task, horizon)}, raw variance / MSE to the pool reference / scale a:", ""]
    return "\n".join(lines + per_n_table(estimator_names(table), _Ns(table), partial(raw_cell, table)))


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
