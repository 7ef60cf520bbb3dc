"""Tables of an experiment: one list of dicts -> a CSV file and a Markdown table."""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def write_csv(rows: Sequence[dict[str, Any]], path: str | Path) -> Path:
    """``rows`` (same keys, in the first row's order) as CSV at ``path``; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    columns = list(rows[0]) if rows else []
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    return path


def markdown_table(
    rows: Sequence[dict[str, Any]], columns: Sequence[str] | None = None, digits: int = 3
) -> str:
    """A GitHub Markdown table of ``rows``; floats shown with ``digits`` significant digits."""
    columns = list(columns or (rows[0] if rows else []))

    def cell(value: Any) -> str:
        if value is None:
            return "-"
        if isinstance(value, float):
            return f"{value:,.{digits}g}" if abs(value) < 1e5 else f"{value:,.0f}"
        if isinstance(value, int) and not isinstance(value, bool):
            return f"{value:,}"
        return str(value)

    numeric = [all(isinstance(r.get(c), (int, float)) for r in rows) for c in columns]
    lines = [
        "| " + " | ".join(columns) + " |",
        "| " + " | ".join("---:" if n else "---" for n in numeric) + " |",
    ]
    lines += ["| " + " | ".join(cell(r.get(c)) for c in columns) + " |" for r in rows]
    return "\n".join(lines)
