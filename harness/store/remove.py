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
merge and --resume give).

A row the readers refuse (`paths.refused_lines`: a field no run of treebench's writes, such as a status
'weird', a run_id 7 or null, or a line that is not UTF-8) is selected by its well-formed fields alone
(`validate.id_problem`; a field holding a byte that is not UTF-8 is no value either): one the filters
select is removed with the rest, and counted apart (`Removed.refused`), so rm is how such a row is taken
out. rm never rewrites a file keeping one: where the filters do not select it, or cannot (the field a
filter matches is malformed: `--run-id` selects no row whose run_id is 7), it is refused in one line
naming file, line and field, with the options its well-formed fields give, and nothing is removed.

Env fingerprint files beside the results are left alone: other files may name the same env. A file
whose mode keeps it from being written is refused, as `run --resume` and `merge` refuse it, though its
folder would let it be replaced. Do not remove rows from a file that a run is still appending to: rows
appended during the rewrite are lost.
"""

from __future__ import annotations

import io
import json
import logging
import shlex
from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple

from treebench.harness.errors import ConfigError
from treebench.harness.store.outputs import write_whole
from treebench.harness.store.paths import UNREADABLE, refused_lines, write_problem
from treebench.harness.store.rows import is_known_schema, reading
from treebench.harness.store.validate import id_problem

log = logging.getLogger(__name__)

OPTIONS = {"run_id": "--run-id", "backend": "--backend", "env": "--env"}   # row field -> the rm option selecting by it


class Removed(NamedTuple):
    """What `remove_rows` took out of a results file."""

    rows: int                  # rows removed, at least one
    refused: tuple[int, ...]   # the lines (1-based) of those rows that the readers refuse, in file order


def remove_rows(path: str | Path, *, run_ids: Iterable[str] = (), backends: Iterable[str] = (),
                env_ids: Iterable[str] = ()) -> Removed:
    """Removes from the results file `path` every row that matches each kind of filter given (its
    run_id one of `run_ids`, and its backend one of `backends`, and its env one of `env_ids`; a kind
    given no value does not filter), a row the readers refuse by its well-formed fields alone; other
    lines are kept byte for byte, each torn one with a warning naming its line.

    Args:
        path: one results file (.jsonl).
        run_ids, backends, env_ids: exact values of the rows' ``run_id``, ``backend`` and
            ``env`` fields; a single string counts as one value.

    Returns:
        How many rows were removed, and the lines of those the readers refuse.

    Raises:
        ConfigError: no value given at all; a file holding no row; a row the readers refuse
            (`paths.refused_lines`) that the filters do not select or cannot (naming its line and
            field); a value that names no row of the file, or no row that the other kinds select;
            filters that no row matches together; `path` is missing, not a regular file, not a .jsonl
            file, cannot be read, holds something other than result rows, cannot be written (a
            read-only file: its folder would let it be replaced, its mode says no), or cannot be
            rewritten (the file is then unchanged).
    """
    path = Path(path)
    wanted = _wanted(run_ids, backends, env_ids)
    if not wanted:
        raise ConfigError(f"rm {path}: no run id, backend or env id given; name the rows to remove")
    if (why := not_results_file(path)) is not None:
        raise ConfigError(f"rm {path}: {why}")
    refused = dict(refused_lines(path, "rm", "fix or remove that line first"))   # line -> why readers refuse it
    if problem := write_problem(path):   # a read-only file: replacing it would get round its mode
        raise ConfigError(f"rm {path}: cannot write there ({problem}); nothing removed: make it writable first")
    with reading(path, "rm"):   # refused_lines read it: an error now is the disk's (EIO)
        lines = io.BytesIO(path.read_bytes()).readlines()   # split at b"\n" alone, as refused_lines numbers them
    rows = [_row(line) for line in lines]
    ids = [None if row is None else _ids(row, checked=n in refused) for n, row in enumerate(rows, start=1)]
    for n, problem in refused.items():   # before the typo checks: a filter meant for this row may name no other
        if not _matches(ids[n - 1], wanted):
            raise ConfigError(_kept_line(path, n, problem, rows[n - 1], wanted))
    if all(i is None for i in ids):   # no filter can name a row here: not a typo of one
        torn = " (only torn or malformed lines)" if any(line.strip() for line in lines) else ""
        raise ConfigError(f"rm {path}: the file holds no result rows{torn}; nothing to remove")
    _refuse_unmatched(path, wanted, [i for i in ids if i is not None])
    kept = [line for line, i in zip(lines, ids) if not _matches(i, wanted)]
    try:
        write_whole(path, b"".join(kept))
    except OSError as e:
        raise ConfigError(f"rm {path}: cannot rewrite it ({e.strerror}); the file is unchanged") from None
    for n, (line, row) in enumerate(zip(lines, rows), start=1):   # after any refusal: that stays one line
        if row is None and line.strip():
            log.warning("rm %s:%d: skipping a torn or malformed result line (kept in the file as it is)", path, n)
    return Removed(len(lines) - len(kept), tuple(refused))   # every refused row is selected by now


def _kept_line(path: Path, n: int, problem: str, row: dict | None, wanted: dict[str, frozenset[str]]) -> str:
    """The refusal of line `n`, which the readers refuse for `problem` and `wanted` does not select (`row`: its
    row, None where it is no whole row, which no filter selects): which option cannot select it, where the field
    it matches is malformed, and the options that do select it (its well-formed fields), else to edit the line."""
    flaws = [(f, flaw) for f in wanted if row is not None and (flaw := _flaw(row, f))]
    if not flaws:
        why = ", which the filters do not select" if row is not None else ""
    else:   # the field the option matches is malformed: the readers' first problem, or another
        field, flaw = flaws[0]
        why = (f", so {OPTIONS[field]} cannot select it" if flaw == problem else
               f", and {OPTIONS[field]} cannot select it ({flaw})")
    own = _ids(row, checked=True) if row is not None else {}
    selects = " ".join(f"{OPTIONS[f]} {shlex.quote(v)}" for f, v in own.items())
    fix = (f"remove it first ({selects} selects it, with every row holding those values) or edit or delete that "
           "line" if selects else "edit or delete that line")
    kept = " (rm rewrites no file that would keep such a row)" if row is not None else ""
    return f"rm {path}: {UNREADABLE.format(n=n, problem=problem)}{why}; nothing removed{kept}: {fix} ({path}:{n})"


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
    """The values `rows` (each a row's `_ids`) hold in `field` (a row without it holds none)."""
    return {v for r in rows if (v := r.get(field)) is not None}


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


def _ids(row: dict, checked: bool) -> dict[str, str]:
    """The fields of `row` that rm selects by (OPTIONS), as filter values are compared with them: each that
    `row` holds; where `checked` (a row the readers refuse), each of those that is well-formed (`_flaw`)."""
    return {f: row[f] for f in OPTIONS if row.get(f) is not None and not (checked and _flaw(row, f))}


def _flaw(row: dict, field: str) -> str | None:
    """What keeps `field` of `row` from selecting it, in the readers' words (`validate.id_problem`: a run_id
    7 is no run's), or that it holds a byte that is not UTF-8 (`_row`); None where it is well-formed or absent."""
    value = row.get(field)
    if isinstance(value, str) and any("\ud800" <= c <= "\udfff" for c in value):
        return f"field {field!r} holds a byte that is not UTF-8 text"
    return id_problem(row, field)


def _row(line: bytes) -> dict | None:
    """The line's JSON row of a schema this code reads, or None for a line that is not one (a torn line:
    kept as it is). A line that is not UTF-8 is read with each such byte as a lone surrogate (PEP 383's
    surrogateescape), which `_flaw` finds: its other fields may still select it."""
    try:
        try:
            row = json.loads(line)
        except UnicodeDecodeError:
            row = json.loads(line.decode("utf-8-sig", "surrogateescape"))
    except (ValueError, RecursionError):   # JSONDecodeError; RecursionError: paths.refused_lines refused it
        return None
    return row if isinstance(row, dict) and is_known_schema(row.get("schema")) else None


def _matches(row: dict | None, wanted: dict[str, frozenset[str]]) -> bool:
    """True when `row` (a row's `_ids`) holds one of its wanted values in every field of `wanted`."""
    return row is not None and all(row.get(field) in values for field, values in wanted.items())
