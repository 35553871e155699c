"""The generated blocks of README.md and the docs, ``python -m research.report`` (what it does and the blocks'
syntax: ``pages.py``): every benchmark table and quoted number, made from the JSON files in benchmarks/results/.

    tables.py      what every block shares: ``Context`` (where the JSON files are), the Markdown table, numbers
    cost.py        the estimator's speed, the trainer's overhead, the GPU's tables
    variance.py    the gradient-variance tables, and the verdict across the current cells
    fallbacks.py   OTB's tail fallbacks: variance, squared bias and MSE, the bias's calibration
    training.py    the training runs: the earlier small run and the pre-registered study
    pages.py       the pages, the block kinds (``BLOCKS``), rendering and the checks; ``main``

The names below are the package's face, for the tests.
"""

from research.report.fallbacks import fallbacks_bias, fallbacks_calibration, fallbacks_overview, fallbacks_table
from research.report.pages import main, page_problems
from research.report.tables import Context
from research.report.training import ARM_LABELS

__all__ = [
    "ARM_LABELS",
    "Context",
    "fallbacks_bias",
    "fallbacks_calibration",
    "fallbacks_overview",
    "fallbacks_table",
    "main",
    "page_problems",
]
