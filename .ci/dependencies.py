"""The direct dependencies that setup.cfg declares: pip constraints at their lower bounds, and the versions installed.

Usage:
    python .ci/dependencies.py constraints EXTRA ...     pip constraints, `name==X` for each `name>=X` (stdout)
    python .ci/dependencies.py versions [--lowest] EXTRA ...
        the installed version of each direct dependency beside its declared range; with --lowest, fail unless each
        one is at its lower bound (run it with the venv's python)

It reads ``install_requires`` and the named extras of setup.cfg, so that `make test-lowest` installs the oldest
versions the project says it supports and cannot drift from what setup.cfg declares. A dependency without a ``>=``
bound, or declared twice with different lower bounds, is an error. ``NOT_PROBED`` lists the dependencies whose lower
bound cannot be installed on these machines, with the reason: they get a comment instead of a constraint.
"""

from __future__ import annotations

import configparser
import sys
from importlib import metadata
from pathlib import Path

try:
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
    from packaging.version import Version
except ImportError:  # a fresh venv has no packaging, but its pip carries a copy
    from pip._vendor.packaging.requirements import Requirement
    from pip._vendor.packaging.utils import canonicalize_name
    from pip._vendor.packaging.version import Version

SETUP_CFG = Path(__file__).resolve().parent.parent / "setup.cfg"

NOT_PROBED = {
    "torch": "only torch 2.13.0 (the local CPU wheel) installs on these machines; the Makefile installs it first",
}


def declared(extras: list[str], setup_cfg: Path = SETUP_CFG) -> dict[str, list[Requirement]]:
    """Every requirement of install_requires and of ``extras``, by canonical name, in setup.cfg's order."""
    config = configparser.ConfigParser()
    config.read(setup_cfg, encoding="utf-8")
    known = dict(config["options.extras_require"]) if config.has_section("options.extras_require") else {}
    unknown = [e for e in extras if e not in known]
    if unknown:
        raise SystemExit(f"setup.cfg declares no extra {unknown}; its extras are {sorted(known)}")
    found: dict[str, list[Requirement]] = {}
    for block in [config["options"]["install_requires"]] + [known[e] for e in extras]:
        for line in block.splitlines():
            line = line.split("#", 1)[0].strip()
            if line:
                requirement = Requirement(line)
                found.setdefault(canonicalize_name(requirement.name), []).append(requirement)
    return found


def lower_bound(requirements: list[Requirement]) -> str:
    """The one ``>=`` version that every declaration of a dependency agrees on."""
    texts = ", ".join(str(r) for r in requirements)
    if any(r.marker for r in requirements):
        raise SystemExit(f"{texts}: environment markers are not handled here; teach .ci/dependencies.py them")
    bounds = {spec.version for r in requirements for spec in r.specifier if spec.operator == ">="}
    if not bounds:
        raise SystemExit(f"{texts}: no '>=' lower bound in setup.cfg; declare the oldest version that was tested")
    if len(bounds) > 1:
        raise SystemExit(f"{texts}: declared with different lower bounds {sorted(bounds)}; make them agree")
    return bounds.pop()


def constraints(extras: list[str], setup_cfg: Path = SETUP_CFG) -> list[str]:
    """The constraint lines: ``name==X`` per dependency, a comment for each one in NOT_PROBED."""
    lines = [f"# Generated from setup.cfg by .ci/dependencies.py (extras: {', '.join(extras) or 'none'})."]
    for name, requirements in declared(extras, setup_cfg).items():
        version = lower_bound(requirements)
        if name in NOT_PROBED:
            lines.append(f"# {name}>={version} not probed: {NOT_PROBED[name]}")
        else:
            lines.append(f"{name}=={version}")
    return lines


def versions(extras: list[str]) -> tuple[list[str], list[str]]:
    """One line per direct dependency (its installed version and declared range), and the dependencies outside
    NOT_PROBED that are not installed at their lower bound."""
    lines, above = [], []
    for name, requirements in declared(extras).items():
        installed = metadata.version(name)
        specifiers = sorted({str(spec) for r in requirements for spec in r.specifier})
        lines.append(f"{name:<14} {installed:<14} (setup.cfg: {','.join(specifiers)})")
        if name not in NOT_PROBED and Version(installed) != Version(lower_bound(requirements)):
            above.append(f"{name} {installed}")
    return lines, above


if __name__ == "__main__":
    command, args = sys.argv[1], sys.argv[2:]
    if command == "constraints":
        print("\n".join(constraints(args)))
    elif command == "versions":
        lines, above = versions([a for a in args if a != "--lowest"])
        print("\n".join(lines), flush=True)
        if "--lowest" in args and above:
            raise SystemExit("not at the lower bound that setup.cfg declares: " + ", ".join(above))
    else:
        raise SystemExit(__doc__)
