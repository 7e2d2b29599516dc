"""What a check covered: per axis, the values that ran and those skipped, with why.

A coverage record is a plain dict, as JSON keeps it:

    {axis: {"ran": [value, ...], "skipped": {value: reason}}}      # values as strings
    # and "errored": [value, ...] in an axis some of whose values only errored,
    # "reprepare_errored": [value, ...] (values of "ran") in one some of whose values only reached that

A value ran when one of its cases' outputs was compared with the reference (a pass or a
mismatch, or an error at the check's re-prepare step: its first batch was compared, and the
value is also under "reprepare_errored" when that is as far as its cases got); a value whose
cases all raised before a comparison errored, and is no coverage. Rows written before
`failed_step` existed (no such key) cannot say where they raised: their errors count as errored.

treebench.harness.checking.default_check builds one from a backend's capabilities
before anything runs; `coverage_from_rows` rebuilds it from result rows (each
default-check row carries `check_axes`, {axis: value}), which is what the CLI and
the HTML report show.
"""

from __future__ import annotations

import re
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
RE_PREPARE = "re-prepare"   # a check row's `failed_step` on its second batch (checking.default_check.FAILED_STEPS)
# A row's outcome rank: its output compared (pass, mismatch), its first batch compared and its second
# raised (an error at RE_PREPARE), its backend raised before any comparison.
COMPARED, REPREPARE_ERRORED, ERRORED = 3, 2, 1
_FLAGS = ("errored", "reprepare_errored")   # the lists an entry has only where some value is in them


def _outcome(row: dict) -> tuple[int, str | None]:
    """(rank, skip reason) of a row: COMPARED, REPREPARE_ERRORED, ERRORED, or 0 with the reason it was skipped."""
    status = row.get("status")
    if status == "skipped":
        return 0, row.get("reason") or "skipped"
    if status in ("pass", "mismatch"):
        return COMPARED, None
    return (REPREPARE_ERRORED if row.get("failed_step") == RE_PREPARE else ERRORED), None


def coverage_from_rows(rows: Iterable[dict], base: dict | None = None) -> dict:
    """The coverage record of default-check rows (those with `check_axes`); {} when none has it.
    A value ran when one of its rows was compared with the reference (pass or mismatch, or an error
    at the re-prepare step, after its first batch was compared: a value no row got past that is also
    under "reprepare_errored"); a value whose rows all errored before any comparison is under
    "errored" (each a list, in entries that have one). Each axis's values are in `ordered` order.

    Args:
        rows: result rows.
        base: a record to start from (the builder's: it holds axes no row carries, such
            as the device); the rows' outcomes then decide each value they name. When no row
            was compared, what `base` planned to run on the axes no row names is errored when a
            row errored, else skipped, "no case ran"; when no row got past the re-prepare step, it
            ran and is under "reprepare_errored". A value `base` planned to run on an axis the rows
            name, which no row names (a case of another --shard), is left out: no case of it ran.
    """
    rows = list(rows)
    coverage: dict[str, dict] = {axis: {"ran": list(e["ran"]), "skipped": dict(e["skipped"]),
                                        **{k: list(e[k]) for k in _FLAGS if e.get(k)}}
                                 for axis, e in (base or {}).items()}
    row_axes = {axis for r in rows for axis in (r.get("check_axes") or {})}
    best = max((_outcome(r)[0] for r in rows), default=COMPARED)
    if best == REPREPARE_ERRORED:
        for axis in set(coverage) - row_axes:
            if coverage[axis]["ran"]:
                coverage[axis]["reprepare_errored"] = list(coverage[axis]["ran"])
    elif best < COMPARED:
        for axis in set(coverage) - row_axes:
            entry = coverage[axis]
            for value in entry.pop("ran"):
                if best == ERRORED:
                    entry.setdefault("errored", []).append(value)
                else:
                    entry["skipped"].setdefault(value, NO_CASE_RAN)
            entry["ran"] = []
    seen: dict[tuple[str, str], tuple[int, str | None]] = {}
    for r in rows:
        for axis, value in (r.get("check_axes") or {}).items():
            key, now = (axis, str(value)), _outcome(r)
            if key not in seen or now[0] > seen[key][0]:     # the first skip reason, else the best outcome
                seen[key] = now
    for axis in row_axes & set(coverage):   # the planned values no row stands for: none of their cases ran
        entry = coverage[axis]
        for kind in ("ran", *(k for k in _FLAGS if k in entry)):
            entry[kind] = [v for v in entry[kind] if (axis, v) in seen]
            if kind != "ran" and not entry[kind]:
                del entry[kind]
    for (axis, value), (rank, reason) in seen.items():
        entry = coverage.setdefault(axis, {"ran": [], "skipped": {}})
        for kind in ("ran", *_FLAGS):
            if value in entry.get(kind, ()):
                entry[kind].remove(value)
        entry["skipped"].pop(value, None)
        if rank >= REPREPARE_ERRORED:
            entry["ran"].append(value)
        if rank == REPREPARE_ERRORED:
            entry.setdefault("reprepare_errored", []).append(value)
        elif rank == ERRORED:
            entry.setdefault("errored", []).append(value)
        elif not rank:
            entry["skipped"][value] = reason
    for e in coverage.values():
        for kind in ("ran", *(k for k in _FLAGS if k in e)):
            e[kind] = ordered(e[kind])
    return coverage


def coverage_by_backend(rows: Iterable[dict]) -> dict[str, dict]:
    """backend -> `coverage_from_rows` of its rows, for the backends with default-check rows."""
    rows = list(rows)
    names = dict.fromkeys(str(r.get("backend")) for r in rows if r.get("check_axes"))
    return {n: coverage_from_rows(r for r in rows if r.get("backend") == n) for n in names}


def ordered(values: list[str]) -> list[str]:
    """`values` in numeric order when every one is an integer in ASCII digits 0-9 (tree sizes, page sizes), else
    as given: a row's check_axes may hold any text, and str.isdigit() takes '²', which int() fails on."""
    numeric = values and all(re.fullmatch(r"-?[0-9]{1,4300}", v) for v in values)   # int() reads <= 4300 digits
    return sorted(values, key=int) if numeric else list(values)


def coverage_lines(coverage: dict) -> list[str]:
    """The record as plain text: one 'axis: ran v1, v2' line per axis, then indented lines: 're-prepare
    errored on v1, v2 (...)' ('on all' for every value that ran) when some values that ran got no further,
    'errored v1, v2' when some values errored, and one 'skipped v: reason' per skipped value."""
    if not coverage:
        return []
    width = max(len(a) for a in coverage)
    lines = ["coverage (values that ran: output compared with the reference; values that errored; skipped values with the reason):"]
    for axis, e in coverage.items():
        lines.append(f"  {axis:<{width}}  ran {', '.join(e['ran']) or '(none)'}")
        if e.get("reprepare_errored"):
            which = "all" if e["reprepare_errored"] == e["ran"] else ", ".join(e["reprepare_errored"])
            lines.append(f"  {'':<{width}}  re-prepare errored on {which} (first batch compared, second batch raised)")
        if e.get("errored"):
            lines.append(f"  {'':<{width}}  errored {', '.join(e['errored'])}")
        lines += [f"  {'':<{width}}  skipped {v}: {why}" for v, why in e["skipped"].items()]
    return lines
