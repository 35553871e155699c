"""Does OTB train better? A pre-registered, multi-seed training study with paired intervals.

    python -m research.harness.training_study --quick              # tiny: 1 seed, 2 steps per arm, seconds (the tests)
    python -m research.harness.training_study --variance-check     # the precondition: the variance benchmark per task
    python -m research.harness.training_study                      # every (cell, arm, seed) not yet run, then the summary
    python -m research.harness.training_study --cells long --seeds 10 11 12   # extend a cell with more seeds
    python -m research.harness.training_study --summary            # rebuild the summary from the finished runs only
    python -m research.harness.training_study --pilot 1e-4 2e-4 5e-4 1e-3 2e-3                  # how the learning rates
    python -m research.harness.training_study --pilot 2e-4 5e-4 1e-3 2e-3 --pilot-cell short    # were chosen

    python -m research.harness.training_study --study 2 ...    # the second study (issue 26): study2.py
    python -m research.harness.training_study --study 3 ...    # the third (why study 2's candidates lost in long): study3.py
    python -m research.harness.training_study --study 4 ...    # the estimator study: study4.py

The options of the three studies; ``main`` hands ``--study 2`` to study2.py, ``--study 3`` to study3.py and the first
study to study1.py.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from research.harness.training_study.preregistration import PILOT
from research.harness.training_study.preregistration2 import PILOT_CELL
from research.harness.training_study.study1 import main1, parse_study1
from research.harness.training_study.study2 import main2, parse_study2
from research.harness.training_study.study3 import main3, parse_study3
from research.harness.training_study.study4 import main4, parse_study4


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m research.harness.training_study", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--study", type=int, choices=[1, 2, 3, 4], default=1, help="the study: 1 (default) to 4 (the estimator study)"
    )
    parser.add_argument("--quick", action="store_true", help="1 seed, 2 steps per arm (the tests)")
    parser.add_argument("--cells", nargs="+", default=None, help="cells to run (default: all)")
    parser.add_argument("--arms", nargs="+", default=None, help="arms to run (default: all of the study)")
    parser.add_argument("--seeds", nargs="+", type=int, default=None, help="default: the pre-registered 10")
    parser.add_argument("--jobs", type=int, default=2, help="runs in parallel (processes)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per run")
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument("--cache", default=".cache/training_study", help="warm-started weights")
    parser.add_argument("--summary", action="store_true", help="only rebuild the summary from finished runs")
    parser.add_argument("--variance-check", action="store_true", help="only the precondition (benchmarks.variance)")
    parser.add_argument("--warm-start-only", action="store_true", help="make the seeds' warm-started policies only")
    parser.add_argument(
        "--pilot",
        type=float,
        nargs="*",
        default=None,
        metavar="LR",
        help="the learning-rate pilot. Study 1: --pilot-cell at each LR, for grpo_N4 on seed 100 (PREREGISTRATION's "
        "cell_notes). Study 2: no LR (the pre-registered grid), --task and --arms",
    )
    parser.add_argument("--pilot-cell", default=PILOT["cell"], help="the cell of study 1's --pilot (default: long)")
    parser.add_argument("--task", default=None, choices=list(PILOT_CELL), help="study 2's --pilot: the task")
    parser.add_argument("--record-rates", action="store_true", help="study 2: the pilots' chosen rates -> rates file")
    parser.add_argument("--plan", action="store_true", help="study 2: the runs and their estimated CPU time")
    parser.add_argument("--tune", action="store_true", help="studies 3 and 4: the tuning runs (every arm and rate)")
    args = parser.parse_args(argv)
    args.out = Path(args.out)
    named = args.arms is not None
    parse = {1: parse_study1, 2: parse_study2, 3: parse_study3, 4: parse_study4}[args.study]
    args = parse(args, parser)
    if args.study in (2, 3):
        _leave_out_removed_arms(args, parser, named)
    return args


FROZEN_COMMIT = "68759ff"
"""Where the finished studies 1-3 run exactly as registered (their READMEs): the library has since removed options
some of their arms used."""


def _leave_out_removed_arms(args, parser, named: bool) -> None:
    """Studies 2 and 3 without the arms whose ``otb_tail`` the library removed (``REMOVED_TAILS``): named with
    --arms, refused, saying where they run; by default, left out with a printed line."""
    from research.harness.training_study.preregistration2 import STUDY2
    from trl_otb.core import REMOVED_TAILS

    removed = {arm: STUDY2["arms"][arm].get("otb_tail") for arm in args.arms}
    removed = {arm: tail for arm, tail in removed.items() if tail in REMOVED_TAILS}
    if not removed:
        return
    where = f"run them at the study's frozen commit {FROZEN_COMMIT} (git worktree add ../trl-otb-{FROZEN_COMMIT} {FROZEN_COMMIT})"
    if named:
        parser.error(f"arms {sorted(removed)} use otb_tail values the library removed ({removed}); {where}")
    print(f"left out {sorted(removed)}: their otb_tail values were removed from the library; {where}", flush=True)
    args.arms = [a for a in args.arms if a not in removed]


def main(argv=None):
    args = parse_args(argv)
    return {1: main1, 2: main2, 3: main3, 4: main4}[args.study](args)
