"""HTML report (SKELETON: a plain table; the report work item replaces it and
keeps `write_report`'s signature)."""

from __future__ import annotations

import html
from pathlib import Path


def write_report(rows: list[dict], envs: dict[str, dict], path: str | Path, title: str = "treebench") -> Path:
    """Writes a self-contained HTML report of `rows` to `path` and returns it."""
    cols = ["backend", "case_id", "status", "median_us", "max_abs_err", "reason"]
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(r.get(c, '')))}</td>" for c in cols) + "</tr>"
                   for r in rows)
    head = "".join(f"<th>{c}</th>" for c in cols)
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(f"<!doctype html><meta charset=utf-8><title>{html.escape(title)}</title>"
                 f"<table><tr>{head}</tr>{body}</table>")
    return p
