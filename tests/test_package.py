"""The package as a whole: trl_otb.core loads with torch alone, the library (trl_otb outside demo/ and testing/, its
command-line entry points included) imports neither the demo nor the test helpers, and no module of the package
imports itself back through others (docs/architecture.md, "The layout"); no test module imports another; and the wheel
ships the library and the demo, not the test helpers."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest


def test_the_core_imports_torch_only():
    """trl_otb.core (and the top-level names that come from it) load without TRL, transformers or accelerate."""
    code = (
        "import sys, trl_otb, trl_otb.core; "
        "print(sorted(m for m in ('trl', 'transformers', 'accelerate', 'datasets') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# The library's entry points: like the trainer, they import no demo and no test helper, but they may load plotting.
ENTRY_POINTS = ("trl_otb.cli", "trl_otb.fidelity.cli")
DEMO_AND_HELPERS = ("trl_otb.demo", "trl_otb.testing")

LIBRARY_IMPORTS = f"""
import importlib, sys
from pathlib import Path

import pytest

def loaded(*prefixes):
    return sorted(name for name in sys.modules if name.startswith(prefixes))

import trl_otb, trl_otb.trainer
print(loaded(*{DEMO_AND_HELPERS}, *{ENTRY_POINTS}, "trl_otb.plotting", "matplotlib"))
print(loaded("trl_otb.card", "trl_otb.bnb", "trl_otb.fidelity.training"))
root = Path(trl_otb.__file__).parent
modules = [".".join(("trl_otb", *path.relative_to(root).with_suffix("").parts)) for path in root.rglob("*.py")]
library = [name.removesuffix(".__init__") for name in sorted(modules) if not name.startswith({DEMO_AND_HELPERS})]
for name in library:
    importlib.import_module(name)
print(len(library), loaded(*{DEMO_AND_HELPERS}, "tests"))
"""


def test_the_library_imports_neither_the_demo_nor_the_test_helpers():
    """Every module of trl_otb outside demo/ and testing/ (the entry points too) loads no trl_otb.demo or
    trl_otb.testing module, nor anything from tests/; ``trl_otb.trainer`` loads neither the commands nor plotting
    (matplotlib)."""
    result = subprocess.run([sys.executable, "-c", LIBRARY_IMPORTS], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    by_trainer, trainers_own, library = result.stdout.splitlines()
    assert by_trainer == "[]"
    assert trainers_own == "['trl_otb.bnb', 'trl_otb.card', 'trl_otb.fidelity.training']"  # the import did happen
    count, demo_or_helpers = library.split(" ", 1)
    assert int(count) >= 20 and demo_or_helpers == "[]", library


def _package_imports() -> dict[str, set[str]]:
    """trl_otb module -> the trl_otb modules it imports anywhere in its source (function bodies too)."""
    import trl_otb

    root = Path(trl_otb.__file__).parent
    names = {}
    for path in root.rglob("*.py"):
        parts = ("trl_otb", *path.relative_to(root).with_suffix("").parts)
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = (path, parts[-1] == "__init__")
    graph = {}
    for name, (path, is_package) in names.items():
        package = name if is_package else name.rpartition(".")[0]
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
                module = ".".join([*base, *([node.module] if node.module else [])])
                if not name.startswith(module + "."):  # a parent package is loaded before its modules anyway
                    found.add(module)
                found.update(f"{module}.{alias.name}" for alias in node.names)
        graph[name] = {other for other in found if other in names and other != name}
    return graph


# What the library may not import: the demo, the test helpers, and the folders beside the package.
FORBIDDEN_FOR_THE_LIBRARY = (*DEMO_AND_HELPERS, "benchmarks", "research", "tests", "examples")


def _imported_names(path: Path, package: str) -> set[str]:
    """Every module name ``path`` imports anywhere (function bodies too), relative imports resolved in ``package``."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return found


def _library_imports_of_forbidden() -> dict[str, list[str]]:
    """Library module -> the forbidden modules it imports (an empty dict when the library is clean)."""
    import trl_otb

    root = Path(trl_otb.__file__).parent
    bad = {}
    for path in sorted(root.rglob("*.py")):
        parts = ("trl_otb", *path.relative_to(root).with_suffix("").parts)
        name = ".".join(parts)
        if name.startswith(DEMO_AND_HELPERS):
            continue
        package = ".".join(parts[:-1])
        hits = sorted(
            m
            for m in _imported_names(path, package)
            if any(m == f or m.startswith(f + ".") for f in FORBIDDEN_FOR_THE_LIBRARY)
        )
        if hits:
            bad[name] = hits
    return bad


def test_no_library_module_imports_the_demo_the_helpers_or_the_folders_beside_it(tmp_path):
    """By their source (AST), imports inside functions included: trl_otb outside demo/ and testing/ never imports
    trl_otb.demo, trl_otb.testing, benchmarks, research, tests or examples."""
    assert _library_imports_of_forbidden() == {}
    planted = tmp_path / "planted.py"
    planted.write_text("def f():\n    from ..demo.models import resolve_model\n    import research.harness\n")
    assert _imported_names(planted, "trl_otb.fidelity") >= {"trl_otb.demo.models", "research.harness"}


def test_the_package_has_no_import_cycle():
    graph = _package_imports()
    assert "trl_otb.models" in graph["trl_otb.demo.hub"]  # the scan sees imports (and this one)
    assert "trl_otb.models" in graph["trl_otb.fidelity.cli"]  # ...inside functions too
    state, cycles = {}, []

    def visit(module, path):
        state[module] = "open"
        for other in sorted(graph[module]):
            if state.get(other) == "open":
                cycles.append([*path[path.index(other) :], other])
            elif other not in state:
                visit(other, [*path, other])
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert cycles == []


# --- the test suite: shared helpers live in helpers modules and conftest.py, never in a test module ----------------

TESTS = Path(__file__).resolve().parent


def _test_modules_imported(path: Path, source: str) -> list[str]:
    """The test modules (a last name component ``test_*``) that ``source``, the file at ``path`` in tests/, imports."""
    package = list(path.relative_to(TESTS.parent).parent.parts)
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            modules = [module, *(f"{module}.{alias.name}" for alias in node.names)]
        else:
            continue
        found += [m for m in modules if m.rpartition(".")[2].startswith("test_")]
    return found


def test_no_test_module_imports_another():
    """A helper two test files share goes in a helpers module (``tests/core/tensor_helpers.py``) or a conftest.py:
    importing a test module runs its module-level code and hides where the helper lives."""
    probe = TESTS / "core" / "test_estimators.py"
    assert _test_modules_imported(probe, "from .test_otb import t64") == ["tests.core.test_otb"]  # the scan sees one
    assert _test_modules_imported(probe, "from tests.core import test_otb") == ["tests.core.test_otb"]
    assert _test_modules_imported(probe, "from .tensor_helpers import t64") == []
    files = sorted(TESTS.rglob("test_*.py"))
    assert len(files) > 20
    found = {str(f.relative_to(TESTS)): _test_modules_imported(f, f.read_text()) for f in files}
    assert {name: imported for name, imported in found.items() if imported} == {}


# --- what `pip install trl-otb` ships --------------------------------------------------------------------------------

BUILD_WHEEL = """
import sys
from setuptools import build_meta
print(build_meta.build_wheel(sys.argv[1]))
"""


def test_the_wheel_ships_the_library_and_the_demo_but_not_the_test_helpers(tmp_path):
    """The wheel built from setup.cfg holds every module of trl_otb (the demo too: the examples and ``trl-otb
    fidelity`` load its embedded model) except trl_otb.testing, whose accelerate and vLLM switches a user never
    calls (trl_otb/testing/__init__.py says why). Built from a copy of the sources, so the checkout gets no build/."""
    import shutil
    import zipfile

    import setuptools

    if tuple(int(p) for p in setuptools.__version__.split(".")[:2]) < (70, 1):
        pytest.importorskip("wheel", reason="setuptools before 70.1 builds wheels with the wheel package")
    root = TESTS.parent
    source = tmp_path / "source"
    source.mkdir()
    for name in ("setup.cfg", "pyproject.toml", "README.md"):
        shutil.copy(root / name, source / name)
    shutil.copytree(root / "trl_otb", source / "trl_otb", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    result = subprocess.run(
        [sys.executable, "-c", BUILD_WHEEL, str(tmp_path / "dist")],
        cwd=source,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    wheel = tmp_path / "dist" / result.stdout.splitlines()[-1]
    shipped = {name for name in zipfile.ZipFile(wheel).namelist() if not name.startswith("trl_otb-")}
    modules = {path.relative_to(root).as_posix() for path in (root / "trl_otb").rglob("*.py")}
    helpers = {name for name in modules if name.startswith("trl_otb/testing/")}
    assert {"trl_otb/testing/sharded_cpu.py", "trl_otb/testing/vllm_cpu.py", "trl_otb/testing/tiny.py"} <= helpers
    assert {"trl_otb/trainer.py", "trl_otb/core/otb.py", "trl_otb/demo/models.py"} <= modules - helpers
    assert shipped == modules - helpers


def test_python_m_build_makes_an_sdist_and_a_wheel_that_twine_check_passes(tmp_path):
    """What a release uploads: ``python -m build`` (no isolation: the environment's setuptools, so no network) from a
    copy of the sources, then ``twine check --strict`` on both files (metadata, and the README as the long
    description)."""
    import shutil

    pytest.importorskip("build", reason="the dev extra installs build")
    pytest.importorskip("twine", reason="the dev extra installs twine")
    root = TESTS.parent
    source = tmp_path / "source"
    source.mkdir()
    for name in ("setup.cfg", "pyproject.toml", "README.md"):
        shutil.copy(root / name, source / name)
    shutil.copytree(root / "trl_otb", source / "trl_otb", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    dist = tmp_path / "dist"
    command = [sys.executable, "-m", "build", "--no-isolation", "--skip-dependency-check", "--sdist", "--wheel"]
    result = subprocess.run(
        [*command, "--outdir", str(dist), str(source)], capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    built = sorted(p.name for p in dist.iterdir())
    from trl_otb import __version__

    assert built == [f"trl_otb-{__version__}-py3-none-any.whl", f"trl_otb-{__version__}.tar.gz"]
    check = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", *(str(dist / name) for name in built)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert check.returncode == 0, check.stdout[-3000:] + check.stderr[-3000:]
    assert check.stdout.count("PASSED") == 2, check.stdout
