"""What a check covered: per axis, the values that ran and those skipped, with why.

A coverage record is a plain dict, as JSON keeps it:

    {axis: {"ran": [value, ...], "skipped": {value: reason}}}      # values as strings

treebench.harness.checking.default_check builds one from a backend's capabilities
before anything runs; `coverage_from_rows` rebuilds it from result rows (each
default-check row carries `check_axes`, {axis: value}), which is what the CLI and
the HTML report show: a value ran when any of its rows was not skipped.
"""

from __future__ import annotations

from collections.abc import Iterable


def new_coverage() -> dict:
    """An empty coverage record."""
    return {}


def note(coverage: dict, axis: str, value: str, reason: str | None) -> None:
    """Records that `value` of `axis` ran (reason None) or was skipped for `reason`;
    a value that ran once counts as ran."""
    entry = coverage.setdefault(axis, {"ran": [], "skipped": {}})
    if reason is None:
        entry["skipped"].pop(value, None)
        if value not in entry["ran"]:
            entry["ran"].append(value)
    elif value not in entry["ran"]:
        entry["skipped"].setdefault(value, reason)


NO_CASE_RAN = "no case ran (every case was skipped)"


def coverage_from_rows(rows: Iterable[dict], base: dict | None = None) -> dict:
    """The coverage record of default-check rows (those with `check_axes`); {} when none has it.
    Each axis's values that ran are in `ordered` order.

    Args:
        rows: result rows.
        base: a record to start from (the builder's: it holds axes no row carries, such
            as the device); the rows' statuses then decide each value they name. When
            every row was skipped, what `base` planned to run on the axes no row names
            (the device, the second prepare, the repeated calls) is skipped too, "no case ran".
    """
    rows = list(rows)
    coverage: dict[str, dict] = {axis: {"ran": list(e["ran"]), "skipped": dict(e["skipped"])}
                                 for axis, e in (base or {}).items()}
    row_axes = {axis for r in rows for axis in (r.get("check_axes") or {})}
    if rows and all(r.get("status") == "skipped" for r in rows):
        for axis in set(coverage) - row_axes:
            entry = coverage[axis]
            for value in entry.pop("ran"):
                entry["skipped"].setdefault(value, NO_CASE_RAN)
            entry["ran"] = []
    axes_seen: dict[tuple[str, str], str | None] = {}
    for r in rows:
        for axis, value in (r.get("check_axes") or {}).items():
            key = (axis, str(value))
            if r.get("status") == "skipped":
                axes_seen.setdefault(key, r.get("reason") or "skipped")
            else:
                axes_seen[key] = None
    for (axis, value), reason in axes_seen.items():
        entry = coverage.setdefault(axis, {"ran": [], "skipped": {}})
        if reason is not None and value in entry["ran"]:        # planned to run, yet its rows were skipped
            entry["ran"].remove(value)
        note(coverage, axis, value, reason)
    for e in coverage.values():
        e["ran"] = ordered(e["ran"])
    return coverage


def coverage_by_backend(rows: Iterable[dict]) -> dict[str, dict]:
    """backend -> `coverage_from_rows` of its rows, for the backends with default-check rows."""
    rows = list(rows)
    names = dict.fromkeys(str(r.get("backend")) for r in rows if r.get("check_axes"))
    return {n: coverage_from_rows(r for r in rows if r.get("backend") == n) for n in names}


def ordered(values: list[str]) -> list[str]:
    """`values` in numeric order when every one is an integer (tree sizes, page sizes), else as given."""
    return sorted(values, key=int) if values and all(v.lstrip("-").isdigit() for v in values) else list(values)


def coverage_lines(coverage: dict) -> list[str]:
    """The record as plain text: one 'axis: ran v1, v2' line per axis, then one indented
    'skipped v: reason' line per skipped value."""
    if not coverage:
        return []
    width = max(len(a) for a in coverage)
    lines = ["coverage (values that ran; skipped values with the reason):"]
    for axis, e in coverage.items():
        lines.append(f"  {axis:<{width}}  ran {', '.join(e['ran']) or '(none)'}")
        lines += [f"  {'':<{width}}  skipped {v}: {why}" for v, why in e["skipped"].items()]
    return lines
