"""``python -m benchmarks.report``: the command line of ``pages.py``."""

import sys

from benchmarks.report.pages import main

sys.exit(main())
