"""Removing rows from a results file (as asv's ``asv rm``), atomically.

A row is removed when it matches ANY of the given values: its ``run_id`` is one
of `run_ids`, OR its ``backend`` one of `backends`, OR its ``env`` one of
`env_ids` (a union: ``run_ids=("r1",), backends=("b",)`` removes every row of
run r1 and every row of backend b). Values are compared exactly; there are no
patterns. Every value given must name at least one row: one that names none is
a typo, refused before anything is removed (not even the rows the other values name).

The file is rewritten whole: the kept lines, byte for byte, go to a temporary
file in the same folder, which is fsync'd and then renamed over the original
(`os.replace`, atomic on POSIX), so a failure at any point leaves the original
as it was. A line that is not a JSON row (one torn by a killed writer) matches
nothing and is kept as it is, with a warning naming file and line (as report,
merge and --resume give). Env fingerprint files beside the results are left
alone: other files may name the same env. Do not remove rows from a file
that a run is still appending to: rows appended during the rewrite are lost.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from pathlib import Path

from treebench.harness.errors import ConfigError
from treebench.harness.store.outputs import write_whole
from treebench.harness.store.paths import check_results_file

log = logging.getLogger(__name__)


def remove_rows(path: str | Path, *, run_ids: Iterable[str] = (), backends: Iterable[str] = (),
                env_ids: Iterable[str] = ()) -> int:
    """Removes from the results file `path` every row whose run_id, backend or env is one of the
    values given (any one matching is enough); other lines are kept byte for byte, each torn or
    malformed one with a warning naming its line.

    Args:
        path: one results file (.jsonl).
        run_ids, backends, env_ids: exact values of the rows' ``run_id``, ``backend`` and
            ``env`` fields; a single string counts as one value.

    Returns:
        How many rows were removed (at least one).

    Raises:
        ConfigError: no value given at all, a value that names no row of the file, `path` is missing,
            not a regular file, not a .jsonl file, holds something other than result rows, or cannot be
            rewritten (the file is then unchanged).
    """
    path = Path(path)
    wanted = {"run_id": _values(run_ids), "backend": _values(backends), "env": _values(env_ids)}
    if not any(wanted.values()):
        raise ConfigError(f"rm {path}: no run id, backend or env id given; name the rows to remove")
    if not path.exists():
        raise ConfigError(f"rm {path}: not found; give an existing .jsonl results file")
    if not path.is_file() or path.suffix != ".jsonl":
        raise ConfigError(f"rm {path}: not a .jsonl results file; give one results file, not a folder")
    check_results_file(path, "rm", "fix or remove that line first", fields=False)   # rm may remove a bad row
    lines = path.read_bytes().splitlines(keepends=True)
    rows = [_row(line) for line in lines]
    _refuse_unmatched(path, wanted, [r for r in rows if r is not None])
    kept = [line for line, row in zip(lines, rows) if not _matches(row, wanted)]
    try:
        write_whole(path, b"".join(kept))
    except OSError as e:
        raise ConfigError(f"rm {path}: cannot rewrite it ({e.strerror}); the file is unchanged") from None
    for n, (line, row) in enumerate(zip(lines, rows), start=1):   # after any refusal: that stays one line
        if row is None and line.strip():
            log.warning("%s:%d: skipping a torn or malformed result line (kept in the file as it is)", path, n)
    return len(lines) - len(kept)


def _refuse_unmatched(path: Path, wanted: dict[str, frozenset[str]], rows: list[dict]) -> None:
    """Raises ConfigError naming the first value of `wanted` that no row holds, with the values the
    file does hold for that field (at most 5)."""
    for field, values in wanted.items():
        held = {str(r[field]) for r in rows if r.get(field) is not None}
        for v in sorted(values - held):
            shown = ", ".join(sorted(held)[:5]) + (", ..." if len(held) > 5 else "") or "none"
            raise ConfigError(f"rm {path}: no row has {field} {v!r} ({field}s here: {shown}); nothing removed: "
                              "check the value")


def _values(given: Iterable[str]) -> frozenset[str]:
    """The values of one filter as a set (a lone string is one value, not its characters)."""
    return frozenset([given] if isinstance(given, str) else given)


def _row(line: bytes) -> dict | None:
    """The line's JSON row, or None for a line that is not one (a torn line: kept as it is)."""
    try:
        row = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    return row if isinstance(row, dict) else None


def _matches(row: dict | None, wanted: dict[str, frozenset[str]]) -> bool:
    """True when `row` is a row one of whose fields holds one of its wanted values."""
    return row is not None and any(row.get(field) in values for field, values in wanted.items())
