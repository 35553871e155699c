"""A script (a benchmark, an example) imported as a module from its path."""

from __future__ import annotations


def load_script(path):
    """Import a script (e.g. ``benchmarks/variance.py``) as a module from its path, leaving ``sys.path`` alone."""
    import importlib.util
    import sys
    from pathlib import Path

    path = Path(path)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses and pickle find a module's classes through sys.modules
    spec.loader.exec_module(module)
    return module
