"""The blocks of OTB's tail fallbacks (``python -m benchmarks.variance --fallbacks``): every candidate's variance,
squared bias and MSE in one cell, the MSE over reference OTB's across cells, the calibration of the squared bias,
and the squared bias three ways."""

from __future__ import annotations

from research.report.tables import Context, markdown_table, num
from research.report.variance import estimator_names


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
    are those of the score-centred pool (benchmarks.variance's ``position_centring``)."""
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
    for est in estimator_names(table):
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
    names = estimator_names(cells[0][2]["table"])

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
        for est in estimator_names(table)
    ]
    header = ["estimator", "plug-in, pool reference", "corrected, pool reference", "corrected, score-centred pool"]
    lines = [f"**{label}, N={N}**: squared bias three ways (95% intervals over groups, these prompts fixed):", ""]
    return "\n".join(lines + markdown_table(header, ["---", "---:", "---:", "---:"], rows))
