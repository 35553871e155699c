"""The benchmark scripts, run from the repository root as ``python -m benchmarks.<script>`` (docs/benchmarks.md lists
the commands); what they share is in ``benchmarks.common``.

Every script runs offline (the embedded model and data; ``HF_HUB_OFFLINE``) and without the tokenizers' thread pool,
unless the environment says otherwise: the defaults are set here, before a script imports transformers."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
