"""matplotlib, an optional extra of trl-otb (``pip install 'trl-otb[plots]'``).

Everything in the project that draws a PNG (the fidelity command, the example's training curves, the benchmarks)
gets pyplot from :func:`pyplot`, so a missing extra always says the same thing: which extra to install.
"""

from __future__ import annotations

__all__ = ["pyplot"]


def pyplot(purpose: str = "Plotting", otherwise: str | None = None):
    """matplotlib's pyplot on the non-interactive Agg backend (files only, no display).

    Without matplotlib, raises ImportError: "<purpose> needs matplotlib, an optional extra: pip install
    'trl-otb[plots]' (<otherwise>)." ``otherwise`` says how to go on without plots, if there is a way.
    """
    try:
        import matplotlib
    except ImportError as err:
        alternative = f" ({otherwise})" if otherwise else ""
        raise ImportError(
            f"{purpose} needs matplotlib, an optional extra: pip install 'trl-otb[plots]'{alternative}."
        ) from err
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
