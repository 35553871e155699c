"""Print the Markdown tables of docs/benchmarks.md from the JSON files the benchmark scripts wrote.

python benchmarks/report.py [--results benchmarks/results]
"""

from __future__ import annotations

import argparse
import json
from functools import partial
from pathlib import Path


def load(results: Path, stem: str):
    path = results / f"{stem}.json"
    return json.loads(path.read_text()) if path.exists() else None


def markdown_table(header: list[str], align: list[str], rows) -> list[str]:
    """The lines of a Markdown table: header cells, each column's alignment (``---`` or ``---:``), rows of cells."""
    return [
        "| " + " | ".join(header) + " |",
        "|" + "".join(f"{a}|" for a in align),
        *("| " + " | ".join(row) + " |" for row in rows),
    ]


def speed_table(data) -> str:
    names = [k for k in data["results"][0]["median_s"] if k != "floor"]
    rows = [
        [
            f"{r['tokens'] / 1e6:.2f}M",
            f"{r['median_s']['floor'] * 1e3:.1f}",
            *(f"{r['median_s'][n] * 1e3:.1f} ({r['ratio_to_floor'][n]:.2f})" for n in names),
            f"{r['ns_per_token']['otb']:.0f}",
        ]
        for r in data["results"]
    ]
    header = ["tokens", "floor ms", *(f"{n} ms (x floor)" for n in names), "OTB ns/token"]
    return "\n".join(markdown_table(header, ["---:"] * len(header), rows))


def overhead_table(data) -> str:
    header = [
        "config",
        "GRPO step CPU s",
        "OTB step CPU s",
        "OTB/GRPO CPU per pair",
        "median",
        "wall median",
        "peak RSS MB GRPO / OTB",
        "RSS ratio",
    ]
    rows = []
    for name, s in data["summary"].items():
        cpu, wall, rss = s["step_cpu_s"], s["step_wall_s"], s["peak_rss_mb"]
        rows.append(
            [
                name,
                f"{cpu['grpo']:.3f}",
                f"{cpu['otb']:.3f}",
                ", ".join(f"{x:.2f}" for x in cpu["pair_ratios"]),
                f"**{cpu['median_ratio']:.2f}**",
                f"{wall['median_ratio']:.2f}",
                f"{rss['grpo']:.0f} / {rss['otb']:.0f}",
                f"{rss['median_ratio']:.3f}",
            ]
        )
    align = ["---", "---:", "---:", "---", "---:", "---:", "---", "---:"]
    return "\n".join(markdown_table(header, align, rows))


def num(x: float) -> str:
    return f"{x:.0f}" if abs(x) >= 100 else f"{x:.3g}"


SPACES = {"lm_head": "LM head", "lora": "LoRA adapter"}


def variance_table(data) -> str:
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
        Ns = sorted({row["N"] for row in table.values()})
        ests = list(dict.fromkeys(row["estimator"] for row in table.values()))
        bound = f", tail bound {res['tail_bound_max']:.1e}" if res["tail_bound_max"] else ""
        paired = res.get("paired")
        ci = "95% CI over prompts and groups (two-level bootstrap)" if paired is not None else "95% CI"
        out.append(
            f"**{space}, horizon {h}** ({len(res['prompts_kept'])} prompts, mean completion "
            f"{res['mean_completion_tokens']:.0f} tokens{bound}). Rescaled variance a^2 Var, {ci} in brackets:"
        )
        out.append("")
        out += per_n_table(ests, Ns, partial(rescaled_cell, table))
        out.append("")
        out.append(f"{space}, horizon {h}, raw variance / MSE to the pool reference / scale a:")
        out.append("")
        out += per_n_table(ests, Ns, partial(raw_cell, table))
        if paired:
            main = {k: t for k, t in paired.items() if t["a"] == "otb"}
            study = {k: t for k, t in paired.items() if t["a"] != "otb"}
            out += ["", *paired_table(space, h, main, Ns)]
            if study:
                out += ["", *study_table(space, h, study, Ns)]
        if res.get("decomposition"):
            out += ["", *decomposition_table(space, h, res["decomposition"], 4 if 4 in Ns else Ns[0])]
        match = res.get("grpo_N_matching_otb_N4")
        if match is not None:
            fmt = f"{match:.1f}" if isinstance(match, float) else match
            out.append("")
            out.append(f"GRPO (unscaled) reaches OTB's N=4 rescaled variance at N = {fmt} (log-log interpolation).")
        out.append("")
    return out


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


def paired_table(space: str, h, paired: dict, Ns) -> list[str]:
    """Per N, OTB minus each other estimator on the same groups: difference and ratio with their 95% intervals
    (prompts and groups resampled together for both), and whether the difference's interval excludes 0."""
    others = list(dict.fromkeys(t["b"] for t in paired.values()))
    out = [
        f"{space}, horizon {h}, paired (same groups, same resamples), rescaled variance of OTB minus / over "
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
            verdict = ("**yes**, lower" if t["diff"] < 0 else "**yes**, higher") if t["significant"] else "no"
            cells += [f"{num(t['diff'])} ({num(lo)} to {num(hi)})", f"{t['ratio']:.2f} ({rlo:.2f}-{rhi:.2f})", verdict]
        rows.append(cells)
    header = ["N", *(f"OTB {op} {o}" if op else "differ?" for o in others for op in ("-", "/", ""))]
    return out + markdown_table(header, ["---"] + ["---:", "---:", "---"] * len(others), rows)


def study_table(space: str, h, paired: dict, Ns) -> list[str]:
    """Each study estimator against OTB on the same groups: ratio of rescaled variances (95% CI), and whether the
    difference's interval excludes 0."""
    names = list(dict.fromkeys(t["a"] for t in paired.values()))
    out = [
        f"{space}, horizon {h}, estimator study, paired against OTB: rescaled variance ratio to OTB (95% CI over "
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


def decomposition_table(space: str, h, decomposition: dict, N: int) -> list[str]:
    """Rescaled variance of the part of g made of the tokens where 1, at most half, over half, or all of the N
    members are active (token share in brackets), the covariance between parts, and the total."""
    rows = {k.split("/", 1)[1]: v for k, v in decomposition.items() if k.startswith(f"N={N}/")}
    if not rows:
        return []
    bins = [b for b in next(iter(rows.values())) if b not in ("total_var_scaled", "cross_var_scaled")]
    out = [
        f"{space}, horizon {h}, N={N}: rescaled variance of the gradient's part from tokens where k of the N "
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


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", default="benchmarks/results")
    args = parser.parse_args()
    results = Path(args.results)
    sections = [
        ("advantages_speed", speed_table),
        ("overhead_tiny", overhead_table),
        ("overhead_smollm2", overhead_table),
        ("overhead_smollm2_after_f73f862", overhead_table),
        ("variance", variance_table),
        ("variance_count", variance_table),
        ("variance_math12_h64", variance_table),
        ("variance_math12", variance_table),
        ("variance_math12_h256", variance_table),
        ("variance_count12_h256", variance_table),
        ("variance_count12_h512", variance_table),
        ("variance_count12", variance_table),
        ("sample_efficiency_embedded_math", efficiency_table),
    ]
    for stem, fn in sections:
        data = load(results, stem)
        if data is None:
            continue
        print(f"### {stem}\n\n`{data['meta']['command'].strip()}`\n")
        print(fn(data))
        print()


if __name__ == "__main__":
    main()
