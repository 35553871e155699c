"""A finished study's per-run records, compacted into one file: ``records.jsonl.gz`` in the study's folder.

Each line is ``{"path": P, "record": R}``: R is the JSON a run wrote, P its path below the results folder the study's
code reads (``training_study2/long/grpo_N4-s0.json``). ``expand`` writes them back where the code expects them, so the
study's own ``--summary`` rebuilds its summary from them (tests/research/test_rebuild.py).

    python -m research.records compact benchmarks/results training_study2 research/training_study2/records.jsonl.gz
    python -m research.records compact .cache/estimator_study training_study4 first_batches research/estimator_study/records.jsonl.gz
    python -m research.records expand research/training_study2/records.jsonl.gz /tmp/results
"""

from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path


def compact(results: Path, folder: str | list[str], out: Path) -> int:
    """Every ``*.json`` below ``results/folder`` (each of several folders), sorted by path, as lines of ``out``;
    returns how many."""
    folders = [folder] if isinstance(folder, str) else list(folder)
    paths = []
    for name in folders:
        found = sorted((results / name).rglob("*.json"))
        if not found:
            raise FileNotFoundError(f"no run records below {results / name}")
        paths += found
    paths.sort()
    # mtime=0: the same records give the same bytes, so git sees no change when nothing changed.
    with open(out, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as gz:
        for path in paths:
            line = {"path": path.relative_to(results).as_posix(), "record": json.loads(path.read_text())}
            gz.write((json.dumps(line, sort_keys=True) + "\n").encode())
    return len(paths)


def read(records: Path) -> dict[str, dict]:
    """The records of ``records.jsonl.gz``, by path."""
    with gzip.open(records, "rt") as lines:
        return {row["path"]: row["record"] for row in map(json.loads, lines)}


def expand(records: Path, dest: Path) -> list[Path]:
    """Write each record of ``records`` to ``dest / path``; returns the paths written."""
    written = []
    for rel, record in read(records).items():
        if Path(rel).is_absolute() or ".." in Path(rel).parts:
            raise ValueError(f"{records}: record path {rel!r} leaves the destination folder")
        path = dest / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(record, indent=1))
        written.append(path)
    return written


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m research.records", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    c = sub.add_parser("compact", help="RESULTS/FOLDER/**/*.json (one or more folders) -> OUT")
    c.add_argument("results", type=Path)
    c.add_argument("folder", nargs="+")
    c.add_argument("out", type=Path)
    e = sub.add_parser("expand", help="RECORDS -> DEST/<path>")
    e.add_argument("records", type=Path)
    e.add_argument("dest", type=Path)
    args = parser.parse_args(argv)
    if args.command == "compact":
        print(f"{compact(args.results, args.folder, args.out)} records -> {args.out}")
    else:
        print(f"{len(expand(args.records, args.dest))} records -> {args.dest}")


if __name__ == "__main__":
    main()
