"""``python -m research.report``: the command line of ``pages.py``."""

import sys

from research.report.pages import main

sys.exit(main())
