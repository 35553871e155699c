"""``python -m research.harness.training_study``: the command line of ``cli.py``."""

from research.harness.training_study.cli import main

main()
