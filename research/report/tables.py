"""What every generated block shares: where the JSON files are and the path from the page being rendered to the
repository root (``Context``), the Markdown table, and the number format."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BENCHMARK_RESULTS = ROOT / "benchmarks" / "results"


def results_folders() -> list[Path]:
    """Where the JSON files are: the user benchmarks' (benchmarks/results/) and each study's (research/*/results/)."""
    return [BENCHMARK_RESULTS, *sorted((ROOT / "research").glob("*/results"))]


@dataclass
class Context:
    """Where the JSON files are (``results``: one folder, as in the tests; None: every folder of
    ``results_folders``), and the path from the page being rendered to the repository root."""

    results: Path | None = None
    to_root: str = "../"

    def path(self, stem: str) -> Path:
        """The JSON file of ``stem``: the first folder that has it (the first folder if none does)."""
        folders = [self.results] if self.results is not None else results_folders()
        return next(
            (f / f"{stem}.json" for f in folders if (f / f"{stem}.json").exists()), folders[0] / f"{stem}.json"
        )

    def has(self, stem: str) -> bool:
        return self.path(stem).exists()

    def load(self, stem: str) -> dict:
        path = self.path(stem)
        if not path.exists():
            raise FileNotFoundError(f"{path} is missing: run the command that writes it (its study's README)")
        return json.loads(path.read_text())

    def link(self, stem: str) -> str:
        path = self.path(stem)
        rel = path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else path.name
        return f"[{stem}.json]({self.to_root}{rel})"


def markdown_table(header: list[str], align: list[str], rows) -> list[str]:
    """The lines of a Markdown table: header cells, each column's alignment (``---`` or ``---:``), rows of cells."""
    return [
        "| " + " | ".join(header) + " |",
        "|" + "".join(f"{a}|" for a in align),
        *("| " + " | ".join(row) + " |" for row in rows),
    ]


def num(x: float) -> str:
    return f"{x:.0f}" if abs(x) >= 100 else f"{x:.3g}"


def auc_difference(t: dict | None) -> str:
    """A paired auc difference: mean (95% interval), marked when the interval excludes 0 (over 2 seeds or more: one
    seed's interval is a point); '-' when absent."""
    if t is None:
        return "-"
    lo, hi = t["ci"]
    mark = "" if t["seeds"] < 2 else " **higher**" if lo > 0 else " **lower**" if hi < 0 else ""
    return f"{t['mean']:+.3f} ({lo:+.3f} to {hi:+.3f}){mark}"
