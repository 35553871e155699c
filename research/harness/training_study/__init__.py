"""The training studies, ``python -m research.harness.training_study`` (its options and commands: ``cli.py``): does OTB
train better?

Two studies live here. The first (PREREGISTRATION, results in training_study/ and training_study.json) is closed
and kept as it ran. The second (STUDY2, results in training_study2/ and training_study2.json) asks which OTB
should be the default: the shift-invariant OTB candidates, with and without TRL's group std scaling, each arm at
its own tuned learning rate, on ramble, ramble with every reward - 0.5, a task where long answers are the right
ones (study_task's long_right), the copy control and a high learning rate; study2.py has its commands.

The question: at the same number of generated completion tokens, does training with OTB at N=4 reach a better
held-out policy than the GRPO a user runs today, unscaled GRPO, OGB, or GRPO at N=16 (the paper's "N=4 matches a
large group"), and does it avoid collapse? The policy is a small Llama made from scratch on CPU
(``study_task.py``: a seeded random initialisation and a seeded supervised warm start), because a machine without
the Hub has no pretrained weights and the embedded SmolLM2 costs too much per step for 10 seeds of 5 arms.

    preregistration.py    the first study's pre-registration, its quick mode and its learning-rate pilot
    preregistration2.py   the second study's: its candidates, arms, cells, learning-rate, decision and cost rules
    runs.py               one run (an arm of a cell, trained from a seed's warm start) and the job loop
    analysis.py           what both studies compute from the run records: metrics, intervals, the figure
    study1.py             the first study: its jobs, its summary, its precondition (the variance check)
    study2.py             the second study: its plan, learning rates, jobs and cost plan
    summary2.py           the second study's summary: offset check, paired comparisons, decision rule, rates
    cli.py                the options of both studies, ``main``

The names below are the package's face, for the tests.
"""

from research.harness.training_study.analysis import (
    auc,
    collapsed,
    paired_bootstrap,
    run_metrics,
    score_at,
    wilson,
)
from research.harness.training_study.cli import main
from research.harness.training_study.preregistration import PREREGISTRATION
from research.harness.training_study.preregistration2 import CANDIDATES, QUICK2, STUDY2, offset_invariant
from research.harness.training_study.runs import run_path
from research.harness.training_study.study2 import cost_plan, pilot_cells2, study2_plan
from research.harness.training_study.summary2 import choose_rates, decide_default, offset_check

__all__ = [
    "CANDIDATES",
    "PREREGISTRATION",
    "QUICK2",
    "STUDY2",
    "auc",
    "choose_rates",
    "collapsed",
    "cost_plan",
    "decide_default",
    "main",
    "offset_check",
    "offset_invariant",
    "paired_bootstrap",
    "pilot_cells2",
    "run_metrics",
    "run_path",
    "score_at",
    "study2_plan",
    "wilson",
]
