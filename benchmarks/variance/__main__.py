"""``python -m benchmarks.variance``: the command line of ``cli.py``."""

from benchmarks.variance.cli import main

main()
