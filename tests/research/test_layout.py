"""The repository's layers: the library, then benchmarks/, then research/; imports point down only, files stay small
enough to read, and no results folder grows into a notebook."""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LAYERS = ("trl_otb", "benchmarks", "research")  # each may import those before it, never one after it
LIMITS = {"trl_otb": 400, "benchmarks": 600, "research": 600}


def imported_tops(path: Path) -> set[str]:
    """The top-level packages a module imports (absolute imports; relative ones stay in its own package)."""
    tops = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            tops |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            tops.add(node.module.split(".")[0])
    return tops


def upward_imports(root: Path = ROOT) -> list[str]:
    """'module -> package' for every import of a higher layer (or of tests/ or examples/) by a lower one."""
    found = []
    for i, layer in enumerate(LAYERS):
        forbidden = {*LAYERS[i + 1 :], "tests", "examples"}
        for path in sorted((root / layer).rglob("*.py")):
            found += [f"{path.relative_to(root)} -> {top}" for top in sorted(imported_tops(path) & forbidden)]
    return found


def test_imports_point_down_the_layers_only(tmp_path):
    assert upward_imports() == []
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "x.py").write_text("from research.report import pages\n")
    for layer in ("trl_otb", "research"):
        (tmp_path / layer).mkdir()
    assert upward_imports(tmp_path) == ["benchmarks/x.py -> research"]  # a planted upward import is caught


def test_no_module_is_over_its_layers_line_limit():
    long = [
        f"{path.relative_to(ROOT)}: {n} lines (limit {limit})"
        for layer, limit in LIMITS.items()
        for path in sorted((ROOT / layer).rglob("*.py"))
        if (n := len(path.read_text().splitlines())) > limit
    ]
    assert long == []


def test_research_pages_are_under_600_lines():
    pages = sorted((ROOT / "research").rglob("*.md"))
    assert len(pages) >= 8  # the index and one README per study
    assert [p.name for p in pages if len(p.read_text().splitlines()) > 600] == []


def test_no_results_folder_holds_more_than_150_tracked_files():
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    counts: dict[str, int] = {}
    for line in tracked.splitlines():
        parts = line.split("/")
        if "results" in parts[:-1]:
            folder = "/".join(parts[: parts.index("results") + 1])
            counts[folder] = counts.get(folder, 0) + 1
    assert counts, "git ls-files lists no results folder"  # the precondition: the scan sees the results
    assert {f: n for f, n in counts.items() if n > 150} == {}


def test_every_study_folder_has_its_readme_results_and_an_index_line():
    index = (ROOT / "research" / "README.md").read_text()
    studies = sorted(p.parent for p in (ROOT / "research").glob("*/results"))
    assert len(studies) >= 7
    for study in studies:
        readme = (study / "README.md").read_text()
        for part in ("The question", "Commands", "The result", "What it changed"):
            assert part in readme, f"{study.name}/README.md: no '{part}'"
        assert f"]({study.name}/README.md)" in index, f"research/README.md does not index {study.name}"
