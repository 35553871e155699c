"""Rebuild every committed study summary from its compacted run records, and say where one differs.

    python -m research.rebuild            # rebuild into a temporary folder and compare; exit 1 on a difference

Each summary in ``SUMMARIES`` is rebuilt by its study's own ``--summary`` command from the records of
``records.jsonl.gz`` (expanded into a temporary results folder, beside copies of the study's other results, which
some summaries read). Every value must be equal but ``meta.command`` (the command line that wrote the file). The
summaries that are measurements rather than summaries of runs (the variance tool's JSON, the step costs, the group
signal) are their own records: there is nothing to rebuild them from.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from research.records import expand

ROOT = Path(__file__).resolve().parent.parent
TRAINING = "research.harness.training_study"
# The first study's summary quotes its precondition (the variance tool on its two tasks); its pilots predate it.
VARIANCE_CHECK = ("variance_study_copy", "variance_study_ramble")
REAL_MODEL_RESULTS = tuple(p.stem for p in (ROOT / "research" / "real_model" / "results").glob("*.json"))
REAL_MODEL = "research.harness.real_model_study"
STUDY1 = ("training_study",)  # study 2's plan quotes the first study's run costs
STUDY2 = ("training_study2",)
RATES = ("training_study2_learning_rates",)  # written from the three pilots, after them
STUDY2_PILOT = (TRAINING, "--study", "2", "--pilot", "--task")
STUDY2_INPUTS = ("training_study2", "training_study2_learning_rates")


@dataclass(frozen=True)
class Summary:
    folder: str  # research/<folder>/: its records.jsonl.gz and results/<stem>.json
    stem: str
    command: tuple[str, ...]  # the module and its arguments, without --out
    records: tuple[str, ...] = ()  # other studies whose run records it reads
    inputs: tuple[str, ...] = ()  # other studies' results (stems) it reads
    without: tuple[str, ...] = ()  # its study's results (stems) that did not exist yet when it was written

    @property
    def committed(self) -> Path:
        return ROOT / "research" / self.folder / "results" / f"{self.stem}.json"


PILOT1 = (TRAINING, "--pilot", "1e-4", "2e-4", "5e-4", "1e-3", "2e-3", "--summary")
PILOT1_SHORT = (TRAINING, "--pilot", "2e-4", "5e-4", "1e-3", "2e-3", "--pilot-cell", "short", "--summary")
SUMMARIES = [
    Summary("training_study1", "training_study", (TRAINING, "--summary"), inputs=VARIANCE_CHECK),
    Summary("training_study1", "training_study_pilot_long", PILOT1),
    Summary("training_study1", "training_study_pilot_short", PILOT1_SHORT),
    *(
        Summary(
            "training_study2",
            f"training_study2_pilot_{task}",
            (*STUDY2_PILOT, task, "--summary"),
            inputs=STUDY1,
            without=RATES,
        )
        for task in ("ramble", "long_right", "copy")
    ),
    Summary("training_study2", "training_study2_learning_rates", (TRAINING, "--study", "2", "--record-rates")),
    Summary("training_study2", "training_study2", (TRAINING, "--study", "2", "--summary"), inputs=STUDY1),
    Summary(
        "training_study3",
        "training_study3",
        (TRAINING, "--study", "3", "--summary"),
        records=STUDY2,
        inputs=STUDY2_INPUTS,
    ),
    Summary("real_model", "real_model_study_pilot", (REAL_MODEL, "--design", "far", "--pilot", "--summary")),
    Summary("real_model", "real_model_study_reach_pilot", (REAL_MODEL, "--pilot", "--summary")),
    Summary("real_model", "real_model_study_reach", (REAL_MODEL, "--summary")),
    Summary("real_model", "real_model_study_reach_rate", (REAL_MODEL, "--rate-follow-up", "--summary")),
    Summary("estimator_study", "training_study4", (TRAINING, "--study", "4", "--summary"), inputs=RATES),
    Summary("estimator_study", "first_batches", ("research.harness.first_batches", "--summary")),
    Summary(
        "first_step",
        "real_model_mechanism",
        ("research.harness.real_model_mechanism", "--summary"),
        records=("real_model",),
        inputs=REAL_MODEL_RESULTS,
    ),
]


def differences(rebuilt, committed, path: str = "") -> list[str]:
    """Where two JSON values differ (``meta.command`` aside): one line per differing value, key or length."""
    if isinstance(rebuilt, dict) and isinstance(committed, dict):
        out = []
        for key in sorted(set(rebuilt) | set(committed)):
            where = f"{path}.{key}" if path else key
            if where == "meta.command":
                continue
            if key not in rebuilt or key not in committed:
                out.append(f"{where}: only in the {'rebuilt' if key in rebuilt else 'committed'} summary")
            else:
                out += differences(rebuilt[key], committed[key], where)
        return out
    if isinstance(rebuilt, list) and isinstance(committed, list):
        if len(rebuilt) != len(committed):
            return [f"{path}: {len(rebuilt)} items rebuilt, {len(committed)} committed"]
        return [d for i, (a, b) in enumerate(zip(rebuilt, committed)) for d in differences(a, b, f"{path}[{i}]")]
    if rebuilt != committed or type(rebuilt) is not type(committed):
        return [f"{path}: rebuilt {rebuilt!r}, committed {committed!r}"]
    return []


def prepare(summary: Summary, results: Path) -> None:
    """The results folder ``summary``'s command reads: its study's run records and committed results, and those of
    other studies it names."""
    for folder in (summary.folder, *summary.records):
        records = ROOT / "research" / folder / "records.jsonl.gz"
        if records.exists():
            expand(records, results)
    paths = [*(ROOT / "research" / summary.folder / "results").glob("*.json")]
    paths += [p for stem in summary.inputs for p in (ROOT / "research").glob(f"*/results/{stem}.json")]
    for path in paths:
        if path.stem not in summary.without:
            shutil.copy(path, results / path.name)


def rebuild(summary: Summary, work: Path) -> dict:
    """``summary`` rebuilt by its command in a results folder of its own below ``work`` (see ``prepare``), from which
    the committed copy is removed first, so the file read back is the one the command wrote."""
    results = work / summary.stem
    results.mkdir(parents=True)
    prepare(summary, results)
    (results / f"{summary.stem}.json").unlink(missing_ok=True)
    done = subprocess.run(
        [sys.executable, "-m", *summary.command, "--out", str(results)], cwd=ROOT, capture_output=True, text=True
    )
    if done.returncode:
        raise RuntimeError(f"{' '.join(summary.command)} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads((results / f"{summary.stem}.json").read_text())


def rebuild_all(work: Path) -> dict[str, dict]:
    """Every summary of ``SUMMARIES`` rebuilt below ``work``, by stem."""
    return {summary.stem: rebuild(summary, work) for summary in SUMMARIES}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m research.rebuild", description=__doc__.splitlines()[0])
    parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as work:
        rebuilt = rebuild_all(Path(work))
    problems = []
    for summary in SUMMARIES:
        found = differences(rebuilt[summary.stem], json.loads(summary.committed.read_text()))
        problems += [f"{summary.folder}/{summary.stem}: {d}" for d in found]
        print(f"{summary.folder}/{summary.stem}: {'equal' if not found else f'{len(found)} differences'}")
    for problem in problems[:50]:
        print(problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
