"""Removing rows from a results file (as asv's ``asv rm``), atomically.

Filters of different kinds combine with AND, values of one kind with OR: a row is
removed when its ``run_id`` is one of `run_ids` (if any are given) AND its
``backend`` one of `backends` (if any) AND its ``env`` one of `env_ids` (if any):
``run_ids=("r1", "r2"), backends=("b",)`` removes backend b's rows of runs r1 and
r2, and nothing else. Values are compared exactly; there are no patterns. Every
value given must name at least one row, and at least one row the other kinds
select; and some row must match every filter. Anything else is a typo, refused
before anything is removed (not even the rows the other values name).

The file is rewritten whole: the kept lines, byte for byte, go to a temporary
file in the same folder, which is fsync'd and then renamed over the original
(`os.replace`, atomic on POSIX), so a failure at any point leaves the original
as it was. A line that is not a JSON row (one torn by a killed writer) matches
nothing and is kept as it is, with a warning naming file and line (as report,
merge and --resume give). A row the readers refuse (`validate.row_problem`: a field no run of treebench's
writes, such as a null run_id or a run_id that is a number) is refused as they refuse it, in one line naming
file, line and field, and nothing is removed (`paths.check_results_file`): rm selects rows by fields the
readers check, and reads none that they would refuse. Env fingerprint files beside the results are left
alone: other files may name the same env. A file whose mode keeps it from being written is
refused, as `run --resume` and `merge` refuse it, though its folder would let it be replaced.
Do not remove rows from a file that a run is still appending to: rows appended during the
rewrite are lost.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from pathlib import Path

from treebench.harness.errors import ConfigError
from treebench.harness.store.outputs import write_whole
from treebench.harness.store.paths import check_results_file, write_problem
from treebench.harness.store.rows import reading

log = logging.getLogger(__name__)

OPTIONS = {"run_id": "--run-id", "backend": "--backend", "env": "--env"}   # row field -> the rm option selecting by it


def remove_rows(path: str | Path, *, run_ids: Iterable[str] = (), backends: Iterable[str] = (),
                env_ids: Iterable[str] = ()) -> int:
    """Removes from the results file `path` every row that matches each kind of filter given (its
    run_id one of `run_ids`, and its backend one of `backends`, and its env one of `env_ids`; a kind
    given no value does not filter); other lines are kept byte for byte, each torn or malformed one
    with a warning naming its line.

    Args:
        path: one results file (.jsonl).
        run_ids, backends, env_ids: exact values of the rows' ``run_id``, ``backend`` and
            ``env`` fields; a single string counts as one value.

    Returns:
        How many rows were removed (at least one).

    Raises:
        ConfigError: no value given at all; a file holding no row; a value that names no row of the file,
            or no row that the
            other kinds select; filters that no row matches together; `path` is missing, not a regular
            file, not a .jsonl file, cannot be read, holds something other than result rows or a row the
            readers refuse (`validate.row_problem`, a line that is not UTF-8: naming it), cannot be
            written (a read-only file: its folder would let it be replaced, its mode says no), or cannot
            be rewritten (the file is then unchanged).
    """
    path = Path(path)
    wanted = _wanted(run_ids, backends, env_ids)
    if not wanted:
        raise ConfigError(f"rm {path}: no run id, backend or env id given; name the rows to remove")
    if (why := not_results_file(path)) is not None:
        raise ConfigError(f"rm {path}: {why}")
    check_results_file(path, "rm", "fix or remove that line first", "nothing removed: edit or delete that line")
    if problem := write_problem(path):   # a read-only file: replacing it would get round its mode
        raise ConfigError(f"rm {path}: cannot write there ({problem}); nothing removed: make it writable first")
    with reading(path, "rm"):   # check_results_file read it: an error now is the disk's (EIO)
        lines = path.read_bytes().splitlines(keepends=True)
    rows = [_row(line) for line in lines]
    if all(row is None for row in rows):   # no filter can name a row here: not a typo of one
        torn = " (only torn or malformed lines)" if any(line.strip() for line in lines) else ""
        raise ConfigError(f"rm {path}: the file holds no result rows{torn}; nothing to remove")
    _refuse_unmatched(path, wanted, [r for r in rows if r is not None])
    kept = [line for line, row in zip(lines, rows) if not _matches(row, wanted)]
    try:
        write_whole(path, b"".join(kept))
    except OSError as e:
        raise ConfigError(f"rm {path}: cannot rewrite it ({e.strerror}); the file is unchanged") from None
    for n, (line, row) in enumerate(zip(lines, rows), start=1):   # after any refusal: that stays one line
        if row is None and line.strip():
            log.warning("rm %s:%d: skipping a torn or malformed result line (kept in the file as it is)", path, n)
    return len(lines) - len(kept)


def not_results_file(path: Path) -> str | None:
    """Why rm cannot edit `path`, in words that fit what is there, with the fix: a folder, nothing, a file
    that is not a regular file (a FIFO, a device), or a regular file of another suffix; None for a regular
    .jsonl file. Raises OSError where a folder on its way cannot be searched."""
    if path.is_dir():
        return "is a directory; give the results .jsonl file to remove rows from"
    if not path.exists():
        return "no such results file; give an existing .jsonl results file"
    if not path.is_file():
        return "is not a regular file (a FIFO, a device or a socket); give a .jsonl results file"
    if path.suffix != ".jsonl":
        kind = f"a {path.suffix} file" if path.suffix else "a file without a suffix"
        return f"is {kind}, not a .jsonl results file; give a .jsonl results file"
    return None


def describe(*, run_ids: Iterable[str] = (), backends: Iterable[str] = (), env_ids: Iterable[str] = ()) -> str:
    """The rows the filters select, in words: ``run_id 'r1' or 'r2' and backend 'b'`` (the kinds in
    this order, each kind's values sorted; a kind given no value is left out)."""
    return _words(_wanted(run_ids, backends, env_ids))


def _wanted(run_ids: Iterable[str], backends: Iterable[str], env_ids: Iterable[str]) -> dict[str, frozenset[str]]:
    """Row field -> the values given for it, for each kind given at least one value."""
    given = {"run_id": _values(run_ids), "backend": _values(backends), "env": _values(env_ids)}
    return {field: values for field, values in given.items() if values}


def _words(wanted: dict[str, frozenset[str]]) -> str:
    """`wanted` in words: each kind's values joined by "or", the kinds by "and"."""
    return " and ".join(f"{field} " + " or ".join(map(repr, sorted(values))) for field, values in wanted.items())


def _refuse_unmatched(path: Path, wanted: dict[str, frozenset[str]], rows: list[dict]) -> None:
    """Raises ConfigError (nothing removed) naming the first value of `wanted` that no row holds;
    else the filters, when no row matches them all; else the first value that no row the other
    kinds select holds. Each names the values those rows do hold for that field (at most 5)."""
    for field, values in wanted.items():
        _refuse_missing(path, field, values, rows, None)
    if not any(_matches(r, wanted) for r in rows):
        raise ConfigError(f"rm {path}: no row has {_words(wanted)} (each value names rows, but no row matches "
                          "them all); nothing removed: check the filters")
    for field, values in wanted.items():
        others = {f: v for f, v in wanted.items() if f != field}
        if others:
            _refuse_missing(path, field, values, [r for r in rows if _matches(r, others)], others)


def _refuse_missing(path: Path, field: str, values: frozenset[str], rows: list[dict],
                    within: dict[str, frozenset[str]] | None) -> None:
    """Raises ConfigError naming the first of `values` that no row of `rows` holds in `field`;
    `within`: the filters that selected `rows` (None: every row of the file)."""
    held = _held(rows, field)
    for v in sorted(values - held):
        if not held and within is None:
            raise ConfigError(f"rm {path}: {_none_carry(field, v, rows)}")
        shown = ", ".join(sorted(held)[:5]) + (", ..." if len(held) > 5 else "") or "none"
        where = (f"no row has {field} {v!r} ({field}s here: {shown})" if within is None else
                 f"no row with {_words(within)} has {field} {v!r} ({field}s of those rows: {shown})")
        raise ConfigError(f"rm {path}: {where}; nothing removed: check the value")


def _held(rows: list[dict], field: str) -> set[str]:
    """The values `rows` hold in `field` (a row without it holds none)."""
    return {v for r in rows if (v := _field(r, field)) is not None}


def _none_carry(field: str, value: str, rows: list[dict]) -> str:
    """Why `value` of `field` selects nothing when no row of the file carries `field` at all (rows
    written without it, e.g. without a run_id), and the options that select them instead, each
    with the values the rows hold (at most 3)."""
    others = [f"{OPTIONS[f]} ({f}s here: {', '.join(sorted(held)[:3])}{', ...' if len(held) > 3 else ''})"
              for f in OPTIONS if f != field and (held := _held(rows, f))]
    instead = f" and select rows by {' or '.join(others)}" if others else ""
    return (f"no row has {field} {value!r}: the rows of this file carry no {field}; nothing removed: "
            f"leave out {OPTIONS[field]}{instead}")


def _values(given: Iterable[str]) -> frozenset[str]:
    """The values of one filter as a set (a lone string is one value, not its characters)."""
    return frozenset([given] if isinstance(given, str) else given)


def _field(row: dict, field: str) -> str | None:
    """The row's `field` (run_id, backend, env: a string in every row read, `validate.row_problem`), else None."""
    return row.get(field)


def _row(line: bytes) -> dict | None:
    """The line's JSON row, or None for a line that is not one (a torn line: kept as it is)."""
    try:
        row = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    return row if isinstance(row, dict) else None


def _matches(row: dict | None, wanted: dict[str, frozenset[str]]) -> bool:
    """True when `row` is a row whose field holds one of its wanted values, for every field of `wanted`."""
    return row is not None and all(_field(row, field) in values for field, values in wanted.items())
