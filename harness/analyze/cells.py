"""What a report table cell shows: numbers formatted for reading and the `Table` the template renders.

Empty cells (None, NaN) print as '' so the template needs no checks, and ratios keep two
significant digits however small they are (0.00031×, never 0.00×).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


def missing(x) -> bool:
    """True for None and NaN: a cell with nothing measured."""
    return x is None or (isinstance(x, float) and math.isnan(x))


def num(x, spec: str = ".3g") -> str:
    """A number for the page ('' for None/NaN)."""
    return "" if missing(x) else format(x, spec)


def us(x) -> str:
    """Microseconds with 3-4 significant digits ('' for None/NaN)."""
    return "" if missing(x) else (f"{x:.2f}" if x < 100 else f"{x:.1f}")


def ratio(x) -> str:
    """A ratio such as a speedup: '0.67×', '12.3×', '0.0031×' ('' for None/NaN).

    Two decimals from 0.1 up, two significant digits below, so a tiny ratio never reads 0.00×.
    """
    if missing(x):
        return ""
    return (f"{x:.2f}" if x >= 0.1 else f"{x:.2g}") + "×"


def pct(x) -> str:
    """A percentage: '73%', '2.4%', '0.4%' ('' for None/NaN); two significant digits below 10."""
    return "" if missing(x) else format(x, ".0f" if x >= 10 else ".2g") + "%"


@dataclass(frozen=True)
class Table:
    """A table ready for the template: header (name, css class) and rows of (text, css class)."""

    head: list[tuple[str, str]]
    rows: list[list[tuple[str, str]]]

    def without_empty_columns(self) -> Table:
        """The table less every column whose cells are all ''."""
        keep = [j for j in range(len(self.head)) if any(row[j][0] != "" for row in self.rows)]
        return Table([self.head[j] for j in keep], [[row[j] for j in keep] for row in self.rows])
