"""The ``trl-otb`` command. Each subcommand lives in its own module, which registers it.

A module listed in :data:`SUBCOMMANDS` defines ``add_subcommand(subparsers)``: it adds its parser
and sets ``func(args) -> int`` as the parser's default. ``main`` only dispatches.
"""

from __future__ import annotations

import argparse
import importlib

SUBCOMMANDS = ("trl_otb.fidelity.cli", "trl_otb.gradcheck.cli")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="trl-otb", description="Optimal Token Baseline (OTB) tools for TRL.")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in SUBCOMMANDS:
        importlib.import_module(module).add_subcommand(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run ``trl-otb COMMAND ...``; ``argv`` defaults to ``sys.argv[1:]``. Returns the exit status."""
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
