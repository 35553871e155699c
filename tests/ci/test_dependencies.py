"""Every version range in setup.cfg is tested at both ends: `make test` installs the newest versions it allows, and
`make test-lowest` every direct dependency at its lower bound, from pip constraints that .ci/dependencies.py generates
from setup.cfg. These tests check the generator against setuptools' own reading of setup.cfg, so that a dependency or
a bound added there reaches the lowest lane without anyone editing a constraints file."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version
from setuptools.config.setupcfg import read_configuration

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("ci_dependencies", ROOT / ".ci" / "dependencies.py")
dependencies = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(dependencies)

MAKEFILE = (ROOT / "Makefile").read_text()
# The extras that .venv and .venv-lowest install (the Makefile's EXTRAS).
LANE_EXTRAS = re.search(r"^EXTRAS := (.+)$", MAKEFILE, re.MULTILINE).group(1).split()


def setuptools_requirements(extras) -> list[Requirement]:
    """install_requires and ``extras``, as setuptools (and so pip) reads setup.cfg."""
    options = read_configuration(ROOT / "setup.cfg")["options"]
    lines = options["install_requires"] + [line for extra in extras for line in options["extras_require"][extra]]
    return [Requirement(line) for line in lines]


def test_the_lowest_lane_installs_every_extra_but_vllm_from_the_generated_constraints():
    extras = set(read_configuration(ROOT / "setup.cfg")["options"]["extras_require"])
    assert set(LANE_EXTRAS) == extras - {"vllm"}  # vllm has its own venv (make test-vllm)
    recipe = MAKEFILE[MAKEFILE.index("$(LOWEST_STAMP):") : MAKEFILE.index("test-lowest:")]
    generate = "$(LOWEST_BIN)/python .ci/dependencies.py constraints $(EXTRAS) > $(LOWEST_VENV)/constraints.txt"
    install = '-c $(LOWEST_VENV)/constraints.txt -e ".[$(subst $(space),$(comma),$(EXTRAS))]"'
    assert generate in recipe and install in recipe
    assert recipe.index(generate) < recipe.index(install)
    lane = MAKEFILE[MAKEFILE.index("test-lowest:") :].split("\n\n")[0]
    assert "versions --lowest $(EXTRAS)" in lane and '-m "not vllm and not zero3" tests' in lane


def test_every_direct_dependency_is_pinned_at_its_lower_bound():
    lines = dependencies.constraints(LANE_EXTRAS)
    pins = dict(line.split("==") for line in lines if not line.startswith("#"))
    expected = {}
    for requirement in setuptools_requirements(LANE_EXTRAS):
        (lower,) = {spec.version for spec in requirement.specifier if spec.operator == ">="}
        name = canonicalize_name(requirement.name)
        assert expected.setdefault(name, lower) == lower, f"{name} declared with two lower bounds"
    assert set(pins) == set(expected) - set(dependencies.NOT_PROBED)
    for name, lower in expected.items():
        if name in dependencies.NOT_PROBED:
            assert f"# {name}>={lower} not probed: {dependencies.NOT_PROBED[name]}" in lines
        else:
            assert pins[name] == lower, name
    assert set(dependencies.NOT_PROBED) == {"torch"}  # the only lower bound this lane cannot install


def write_setup_cfg(tmp_path, install_requires: str, dev: str = "pytest>=8") -> Path:
    path = tmp_path / "setup.cfg"
    path.write_text(
        f"[options]\ninstall_requires =\n    {install_requires}\n\n[options.extras_require]\ndev =\n    {dev}\n"
    )
    return path


def test_a_dependency_without_a_lower_bound_is_refused(tmp_path):
    setup_cfg = write_setup_cfg(tmp_path, "trl<1.17")
    with pytest.raises(SystemExit, match="trl<1.17: no '>=' lower bound"):
        dependencies.constraints(["dev"], setup_cfg)


def test_a_dependency_declared_with_two_lower_bounds_is_refused(tmp_path):
    setup_cfg = write_setup_cfg(tmp_path, "pytest>=7", dev="pytest>=8  # a comment")
    with pytest.raises(SystemExit, match=r"different lower bounds \['7', '8'\]"):
        dependencies.constraints(["dev"], setup_cfg)
    assert dependencies.constraints([], setup_cfg)[1:] == ["pytest==7"]


def test_an_unknown_extra_is_refused(tmp_path):
    with pytest.raises(SystemExit, match=r"no extra \['docs'\]"):
        dependencies.constraints(["docs"], write_setup_cfg(tmp_path, "trl>=1.16.0"))


def test_versions_prints_each_direct_dependency_and_checks_the_lower_bounds():
    """What `make test` and `make test-lowest` print first; with --lowest it fails unless every bound is installed."""
    command = [sys.executable, str(ROOT / ".ci" / "dependencies.py"), "versions", "--lowest", *LANE_EXTRAS]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60)
    printed = dict(line.split()[:2] for line in result.stdout.splitlines())
    pins = dict(line.split("==") for line in dependencies.constraints(LANE_EXTRAS) if not line.startswith("#"))
    assert set(printed) == set(pins) | set(dependencies.NOT_PROBED)
    above = []
    for name, installed in printed.items():
        assert installed == metadata.version(name), name
        if name in pins and Version(installed) != Version(pins[name]):
            above.append(f"{name} {installed}")
    assert result.returncode == (1 if above else 0), result.stderr  # 0 in .venv-lowest, 1 in .venv
    assert all(entry in result.stderr for entry in above)
