"""matplotlib for the experiments' figures, which are files only."""

from __future__ import annotations

from typing import Any


def pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend (no display), loaded on first use: it takes a few
    tenths of a second, which importing an experiment's module does not pay."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
