"""``python -m benchmarks.training_study``: the command line of ``cli.py``."""

from benchmarks.training_study.cli import main

main()
