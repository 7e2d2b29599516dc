"""What a report table cell shows: numbers formatted for reading and the `Table` the template renders.

Empty cells (None, NaN) print as '' so the template needs no checks, and ratios keep two
significant digits however small they are (0.00031×, never 0.00×).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from treebench.harness.analyze.tables import OTHER_RUN


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
    footnote: str = ""     # shown under the table (what a † in its cells means); '' for none

    def without_empty_columns(self) -> Table:
        """The table less every column whose cells are all ''."""
        keep = [j for j in range(len(self.head)) if any(row[j][0] != "" for row in self.rows)]
        return Table([self.head[j] for j in keep], [[row[j] for j in keep] for row in self.rows], self.footnote)

    def markdown(self) -> str:
        """The table as GitHub Markdown, the cells as the page shows them, then the footnote."""
        lines = ["| " + " | ".join(name for name, _ in self.head) + " |", "|" + "---|" * len(self.head)]
        lines += ["| " + " | ".join(text for text, _ in row) + " |" for row in self.rows]
        return "\n".join(lines + (["", self.footnote] if self.footnote else []))


OTHER_RUN_MARK = "†"       # appended to the ratio cell of a line whose ratio divides by other runs' median


def frame_cells(frame, fmt: dict, right: set, marked: str, denominator: str) -> Table:
    """A table frame (a pandas DataFrame) as cells: column c through fmt[c] (else str), class 'n'
    for the `right` columns; where the frame's OTHER_RUN column is True the `marked` column's cell
    ends in OTHER_RUN_MARK and the footnote says that `denominator` is the median over other runs."""
    flags = list(frame[OTHER_RUN]) if OTHER_RUN in frame else [False] * len(frame)
    frame = frame.drop(columns=[OTHER_RUN], errors="ignore")
    rows = [[(fmt.get(c, str)(v) + (OTHER_RUN_MARK if flag and c == marked else ""), "n" if c in right else "")
             for c, v in zip(frame.columns, rec)] for rec, flag in zip(frame.itertuples(index=False), flags)]
    note = (f"{OTHER_RUN_MARK} the {denominator} is the median over other runs of the case: its own run has none."
            if any(flags) else "")
    return Table([(c, "n" if c in right else "") for c in frame.columns], rows, note)


def kv_table_cells(kv) -> Table:
    """`treebench.harness.analyze.tables.kv_dtype_table`'s frame (a pandas DataFrame) for the page:
    times in µs, the ratio as '0.92×' (a † where the query-dtype time is another run's)."""
    fmt = {"Time (us)": us, "Query-dtype time (us)": us, "Ratio": ratio}
    right = {"Batch Size", "Context Len", "Page Size", "Time (us)", "Query-dtype time (us)", "Ratio"}
    return frame_cells(kv, fmt, right, "Ratio", "query-dtype time")
