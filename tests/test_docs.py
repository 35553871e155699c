"""The generated parts of the docs stay in sync with the code, and the claims of the docs stay true."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from research import report
from trl_otb.config import otb_fields_markdown

ROOT = Path(__file__).resolve().parent.parent


def test_api_doc_has_the_current_otbconfig_table():
    doc = (ROOT / "docs" / "api.md").read_text()
    assert otb_fields_markdown() in doc, "docs/api.md: paste trl_otb.config.otb_fields_markdown() into the table"


def test_troubleshooting_catalogue_lists_every_error_message():
    result = subprocess.run(
        [sys.executable, str(ROOT / "docs" / "make_troubleshooting.py"), "--check"], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_readme_shows_both_commands_and_every_otb_field():
    readme = (ROOT / "README.md").read_text()
    assert "make demo" in readme and "make test" in readme
    for line in otb_fields_markdown().splitlines()[2:]:
        field = line.split("`")[1]
        assert f"`{field}`" in readme, f"README's OTBConfig table lacks {field}"


# --- the README's first screen and the benchmark numbers ------------------------------------------------------------


def markdown_section(text: str, heading: str) -> str:
    """The body of the section that starts with ``heading`` (a whole heading line), up to the next one as deep."""
    level = heading.split(" ", 1)[0]
    match = re.search(rf"^{re.escape(heading)}\n(.*?)(?=^{level} |\Z)", text, re.S | re.M)
    assert match, f"no section {heading!r}"
    return match[1]


def test_every_generated_benchmark_number_matches_its_json():
    """README.md, docs/benchmarks.md, docs/faq.md and every README under research/: each generated table equals what
    research/report/ makes from the JSON results, and the prose of every page quotes no number that its generated
    blocks do not show."""
    result = subprocess.run(
        [sys.executable, "-m", "research.report", "--check"], cwd=ROOT, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_number_check_catches_a_hand_edited_or_stray_number():
    readme = (ROOT / "README.md").read_text()
    assert report.page_problems("README.md", readme) == []  # precondition: the committed README passes
    table = markdown_section(readme, "# trl-otb")
    quoted = re.search(r"\| (-0\.\d{3}) to \+\d\.\d{3} \|", table)
    assert quoted, "the README's studies table no longer shows a range of auc differences"
    edited = readme.replace(quoted[0], quoted[0].replace(quoted[1], f"{float(quoted[1]) - 0.001:.3f}"))
    assert any("differ from the JSON" in p for p in report.page_problems("README.md", edited))
    stray = readme.replace("## Install\n", "## Install\n\nOTB is 0.42x GRPO's on everything.\n")
    assert any("0.42" in p for p in report.page_problems("README.md", stray))


SENTENCE_END = re.compile(r"(?<=[.!?:])\s+(?=[A-Z*`(\[])")


def first_screen_prose(readme: str) -> str:
    """The README before "## Install", without its generated blocks, headings and code."""
    first = readme[: readme.index("## Install")]
    first = re.sub(r"<!-- report:.*?<!-- /report -->", " ", first, flags=re.S)
    first = re.sub(r"```.*?```", " ", first, flags=re.S)
    return "\n".join(line for line in first.splitlines() if not line.startswith("#"))


def test_readme_first_screen_is_short_plain_and_has_the_studies_table_install_and_quick_start():
    """What it is, should I use it (with one generated table: the studies), install and the quick start; at most 250
    words before Install, table included, and no sentence over 45 words."""
    readme = (ROOT / "README.md").read_text()
    first = readme[: readme.index("## Install")]
    assert "## Should I use OTB?" in first and first.count("<!-- report: ") == 1
    assert "<!-- report: studies -->" in first
    words = len(re.sub(r"<!--.*?-->", " ", first, flags=re.S).split())  # every token, table cells and pipes too
    assert words <= 250, f"{words} words before Install"
    prose = first_screen_prose(readme)
    sentences = [s for block in prose.split("\n\n") for s in SENTENCE_END.split(" ".join(block.split()))]
    long = [s for s in sentences if len(s.split()) > 45]
    assert sentences and long == [], long
    assert re.search(r"^pip install \.", markdown_section(readme, "## Install"), re.M)
    assert "```python" in markdown_section(readme, "## Quick start")


def test_the_first_screen_check_catches_a_long_sentence():
    readme = (ROOT / "README.md").read_text()
    padded = readme.replace("## Should I use OTB?\n", "## Should I use OTB?\n\n" + "word " * 46 + "end.\n", 1)
    prose = first_screen_prose(padded)
    sentences = [s for block in prose.split("\n\n") for s in SENTENCE_END.split(" ".join(block.split()))]
    assert any(len(s.split()) > 45 for s in sentences)


def readme_quick_starts() -> list[str]:
    """The code of the README's quick starts: the Hub one (GPU), then the CPU one (offline, as written)."""
    blocks = re.findall(
        r"```python\n(.*?)```", markdown_section((ROOT / "README.md").read_text(), "## Quick start"), re.S
    )
    assert len(blocks) == 2, "the quick start should show the Hub snippet, then the CPU one"
    return blocks


def test_readme_quick_start_trains(tiny_model_dir, tmp_path, monkeypatch):
    """The README's (Hub) quick start as written, except for three substitutions made here: its Hub model id is the
    tiny model, its Hub dataset is a few local prompts, and OTBConfig gets CPU settings and one step of a small batch."""
    import datasets

    import trl_otb

    code = readme_quick_starts()[0]
    model_ids = re.findall(r'model="([\w.-]+/[\w.-]+)"', code)
    assert len(model_ids) == 1, "the quick start should name one Hub model"
    code = code.replace(f'"{model_ids[0]}"', repr(tiny_model_dir))

    asked = []

    def local_dataset(path, *args, **kwargs):
        asked.append((path, kwargs.get("split")))
        return datasets.Dataset.from_dict({"prompt": [f"Summarise: the number {i} is small." for i in range(8)]})

    made, OTBConfig = [], trl_otb.OTBConfig

    def cpu_config(**kwargs):
        made.append(kwargs)
        cpu = dict(use_cpu=True, bf16=False, gradient_checkpointing=False, max_steps=1, per_device_train_batch_size=4,
                   max_completion_length=8, report_to="none", save_strategy="no", logging_steps=1)  # fmt: skip
        return OTBConfig(**{**kwargs, **cpu})

    monkeypatch.setattr(datasets, "load_dataset", local_dataset)
    monkeypatch.setattr(trl_otb, "OTBConfig", cpu_config)
    monkeypatch.chdir(tmp_path)
    namespace = {}
    exec(compile(code, "README.md quick start", "exec"), namespace)

    assert asked and asked[0][1] == "train", "the quick start did not load its dataset through load_dataset"
    assert made and made[0]["num_generations"] == 4  # the README's own settings reached OTBConfig
    trainer = namespace["trainer"]
    assert trainer.state.global_step == 1
    logged = next(entry for entry in trainer.state.log_history if "otb/advantage_std" in entry)
    assert logged["otb/proxy_mean"] > 0  # the logit proxy, not a fallback: OTB's advantages were formed


@pytest.mark.slow
def test_readme_cpu_quick_start_runs_as_written(smollm2_dir, tmp_path, monkeypatch):
    """The README's CPU quick start, exactly as written (only its working directory is a temporary one): it trains
    the embedded SmolLM2 on CPU, offline, for its two steps, with OTB's advantages (the logit proxy, not a fallback).
    ``smollm2_dir`` converts the embedded model first, so that the snippet's own ``embedded_model_path()`` finds it
    in the cache."""
    code = readme_quick_starts()[1]
    assert "use_cpu=True" in code and "bf16=False" in code and "load_dataset" not in code
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    namespace = {}
    exec(compile(code, "README.md CPU quick start", "exec"), namespace)

    trainer = namespace["trainer"]
    assert trainer.state.global_step == 2
    logged = [entry for entry in trainer.state.log_history if "otb/advantage_std" in entry]
    assert len(logged) == 2 and all(entry["otb/proxy_mean"] > 0 for entry in logged)


def test_readme_says_what_is_copied_rederived_and_pinned():
    """Every GRPOTrainer method OTBTrainer overrides, and every trl_otb function that compat.py says mirrors or
    replaces a TRL line, is named in the README's section; the section names the check that pins them."""
    from trl import GRPOTrainer

    from trl_otb import OTBTrainer

    section = markdown_section((ROOT / "README.md").read_text(), "## What comes from TRL: copied, re-derived, pinned")
    overrides = [name for name in vars(OTBTrainer) if callable(getattr(GRPOTrainer, name, None))]
    assert "_generate_and_score_completions" in overrides  # precondition: the override list is read correctly
    for name in overrides:
        assert f"`{name}`" in section, f"the README does not say that OTBTrainer overrides {name}"
    compat_source = (ROOT / "trl_otb" / "compat.py").read_text()
    mirrors = re.findall(r"# (?:Mirrored|Replaced) by (?:OTBTrainer\.|trainer\.)?(\w+)", compat_source)
    assert len(mirrors) >= 4, "compat.py no longer names the functions that mirror TRL's lines"
    for name in mirrors:
        assert re.search(rf"`[\w.]*\b{name}`", section), (
            f"the README does not name {name}, which re-derives a TRL line"
        )
    assert "compat.REQUIRED" in section and "tests/test_compat.py" in section


def _heading_anchors(path: Path) -> set[str]:
    """GitHub's anchors for the headings of a Markdown file (lower case, punctuation dropped, spaces to hyphens)."""
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    return {
        re.sub(r"[^\w\- ]", "", m[1].strip().lower()).replace(" ", "-") for m in re.finditer(r"^#+ (.*)$", text, re.M)
    }


def test_local_links_in_readme_and_docs_resolve():
    """Sections moved between the benchmark pages keep every relative link and anchor pointing somewhere."""
    broken, checked = [], 0
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if target.startswith(("http://", "https://")):
                continue
            path, _, anchor = target.partition("#")
            resolved = (page.parent / path).resolve() if path else page
            checked += 1
            if not resolved.exists():
                broken.append(f"{page.name}: {target} (no such file)")
            elif anchor and resolved.suffix == ".md" and anchor not in _heading_anchors(resolved):
                broken.append(f"{page.name}: {target} (no such heading)")
    assert checked > 10 and not broken, broken


def orphaned_results(results: Path, places: list[Path], device_page: Path) -> list[str]:
    """The files under ``results`` that nothing names. A JSON (or log) is referenced when its file name appears in
    one of ``places``; a device result (``results/device/``) only when ``device_page`` names it; a plot counts with
    the JSON its script wrote beside it (same stem); the run records under ``results/<folder>/`` count with a
    summary built from them, ``results/<folder>.json`` or ``results/<folder>_<what>.json`` (a pilot's, a design's)."""
    text = "\n".join(path.read_text() for path in places)
    device_text = device_page.read_text()

    def named(path: Path) -> bool:
        return path.name in (device_text if path.parent.name == "device" else text)

    orphans = []
    for path in sorted(p for p in results.rglob("*") if p.is_file()):
        parts = path.relative_to(results).parts
        if len(parts) > 1 and parts[0] != "device":
            referenced = any(named(summary) for summary in results.glob(f"{parts[0]}*.json"))
        else:
            referenced = named(path) or (path.suffix == ".png" and named(path.with_suffix(".json")))
        if not referenced:
            orphans.append(str(path.relative_to(results)))
    return orphans


def test_every_result_file_is_referenced(tmp_path):
    """Every file in benchmarks/results/ is named by the README, a docs page or a benchmark script (device results
    by docs/benchmarks.md): a result nothing quotes is removed, or moved to the research folder of its study. A stray
    file is caught."""
    places = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "benchmarks").rglob("*.py"))]
    places.append(ROOT / "benchmarks" / "device_run.sh")
    results, device_page = ROOT / "benchmarks" / "results", ROOT / "docs" / "benchmarks.md"
    assert orphaned_results(results, places, device_page) == []
    fake = tmp_path / "results"
    (fake / "device").mkdir(parents=True)
    for folder in ("study/cell", "piloted/cell", "lone/cell"):
        (fake / folder).mkdir(parents=True)
    for name in (
        "a.json",
        "a.png",
        "study.json",
        "study/cell/arm-s0.json",
        "piloted_pilot.json",  # a folder's records may be summarised by <folder>_<what>.json
        "piloted/cell/arm-s0.json",
        "lone/cell/arm-s0.json",  # no summary names them
        "stray_after_abc123.json",
        "device/x.json",
    ):
        (fake / name).write_text("{}")
    (tmp_path / "index.md").write_text("a.json study.json x.json piloted_pilot.json")
    assert orphaned_results(fake, [tmp_path / "index.md"], device_page) == [
        "device/x.json",
        "lone/cell/arm-s0.json",
        "stray_after_abc123.json",
    ]


def _study(paired: dict, collapsed: dict | None = None) -> dict:
    """A training-study summary with one cell: OTB's paired differences (mean, interval) per other arm."""
    arms = {a: {"runs": 10, "collapse_rate": (collapsed or {}).get(a, 0) / 10} for a in ("otb_N4", *paired)}
    return {
        "preregistration": {"cells": {"long": {"task": "ramble", "learning_rate": 1e-3}}},
        "cells": {
            "long": {
                "arms": arms,
                "paired": {
                    f"otb_N4-{arm}": {
                        k: {"mean": m, "ci": ci, "differ": not ci[0] <= 0 <= ci[1], "seeds": 10}
                        for k, (m, ci) in metrics.items()
                    }
                    for arm, metrics in paired.items()
                },
            }
        },
    }


PAPER_CLAIM = re.compile(r"N\s*=\s*4\b[^.]{0,80}?\bmatch\w*[^.]{0,40}?N\s*=\s*(?:16 to )?32\b|\b65\s*%\s*fewer", re.I)
OWN_FINDING = re.compile(r"\bnot\s+reproduc", re.I)


def unqualified_paper_claims(text: str) -> tuple[list[str], int]:
    """The paragraphs (blocks between blank lines) of ``text`` that quote the paper's claim without the project's
    finding, and how many quote it in all."""
    quoting = [" ".join(p.split()) for p in re.split(r"\n[ \t]*\n", text) if PAPER_CLAIM.search(" ".join(p.split()))]
    return [p for p in quoting if not OWN_FINDING.search(p)], len(quoting)


def _package_strings() -> dict[str, str]:
    """Every string constant of trl_otb/ (docstrings, help texts, messages), named by file and line."""
    import ast

    found = {}
    for path in sorted((ROOT / "trl_otb").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                found[f"{path.relative_to(ROOT)}:{node.lineno}"] = node.value
    return found


def test_the_papers_n4_claim_is_quoted_only_beside_the_projects_finding():
    """Every docstring (every string) in trl_otb/ and every Markdown file of docs/ and the README that quotes the
    paper's "N=4 matches N=32" (or "65% fewer") says in the same paragraph that this project's study did not
    reproduce it."""
    claim = "The paper reports OTB at N=4 matching baselines at N=32."
    assert unqualified_paper_claims(f"Intro.\n\n{claim}\n") == ([" ".join(claim.split())], 1)  # the scan sees one
    assert unqualified_paper_claims(f"{claim} This project's study did not reproduce it.") == ([], 1)
    sources = {str(p.relative_to(ROOT)): p.read_text() for p in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]}
    sources.update(_package_strings())
    unqualified, quoted = {}, 0
    for name, text in sources.items():
        bad, count = unqualified_paper_claims(text)
        quoted += count
        if bad:
            unqualified[name] = bad
    assert quoted >= 3, "the scan no longer finds the claim where it is quoted (config.py, faq.md, method.md)"
    assert unqualified == {}, "add the project's finding (docs/benchmarks.md, 'Should I use OTB?') to the paragraph"


def readme_layout(readme: str) -> dict[str, set[str]]:
    """Folder -> the names the README's Layout block lists under it (a line starting with a folder opens it; the
    indented lines below continue it)."""
    block = re.search(r"```\n(.*?)```", markdown_section(readme, "## Layout"), re.S)[1]
    layout, folder = {}, None
    for line in block.splitlines():
        if line and not line[0].isspace():
            folder, line = line.split(maxsplit=1)[0], line[len(line.split(maxsplit=1)[0]) :]
        layout.setdefault(folder, set()).update(w.strip(".,;:()") for w in line.split())
    return layout


def modules_missing_from_layout(readme: str) -> list[str]:
    """The modules of trl_otb/, benchmarks/, research/ and examples/ that the Layout does not list. A module is a .py file other
    than __init__.py, listed by its file name under its folder's line; a package (a folder with __init__.py) below
    the top level is listed as its own folder line, or as ``name/`` under its parent's."""
    layout, missing = readme_layout(readme), []
    for top in ("trl_otb", "benchmarks", "research", "examples"):
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = path.relative_to(ROOT)
            folder = f"{rel.parent.as_posix()}/"
            if path.name != "__init__.py" and path.name not in layout.get(folder, set()):
                missing.append(rel.as_posix())
            if path.name == "__init__.py" and rel.parent.as_posix() != top:
                parent = f"{rel.parent.parent.as_posix()}/"
                if folder not in layout and f"{rel.parent.name}/" not in layout.get(parent, set()):
                    missing.append(folder)
    return missing


def test_readme_layout_lists_every_module():
    readme = (ROOT / "README.md").read_text()
    layout = readme_layout(readme)
    assert "otb.py" in layout["trl_otb/core/"] and "bnb.py" in layout["trl_otb/"]  # the Layout is read as folders
    broken = readme.replace(" spec.py ", " ").replace("trl_otb/fidelity/", "trl_otb/fidelities/")
    assert "trl_otb/core/spec.py" in modules_missing_from_layout(broken)  # a dropped module is found...
    assert "trl_otb/fidelity/" in modules_missing_from_layout(broken)  # ...and a package no line names
    assert modules_missing_from_layout(readme) == [], "list these in the README's Layout"
