"""Removing rows from a results file (as asv's ``asv rm``), atomically.

A row is removed when it matches ANY of the given values: its ``run_id`` is one
of `run_ids`, OR its ``backend`` one of `backends`, OR its ``env`` one of
`env_ids` (a union: ``run_ids=("r1",), backends=("b",)`` removes every row of
run r1 and every row of backend b). Values are compared exactly; there are no
patterns.

The file is rewritten whole: the kept lines, byte for byte, go to a temporary
file in the same folder, which is fsync'd and then renamed over the original
(`os.replace`, atomic on POSIX), so a failure at any point leaves the original
as it was. A line that is not a JSON row (one torn by a killed writer) matches
nothing and is kept as it is. Env fingerprint files beside the results are
left alone: other files may name the same env. Do not remove rows from a file
that a run is still appending to: rows appended during the rewrite are lost.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

from treebench.harness.errors import ConfigError
from treebench.harness.store.paths import check_results_file


def remove_rows(path: str | Path, *, run_ids: Iterable[str] = (), backends: Iterable[str] = (),
                env_ids: Iterable[str] = ()) -> int:
    """Removes from the results file `path` every row whose run_id, backend or env is one of the
    values given (any one matching is enough); other lines are kept byte for byte.

    Args:
        path: one results file (.jsonl).
        run_ids, backends, env_ids: exact values of the rows' ``run_id``, ``backend`` and
            ``env`` fields; a single string counts as one value.

    Returns:
        How many rows were removed (0: the file is left untouched).

    Raises:
        ConfigError: no value given at all, `path` is missing, not a regular file, not a .jsonl
            file, holds something other than result rows, or cannot be rewritten (then it is unchanged).
    """
    path = Path(path)
    wanted = {"run_id": _values(run_ids), "backend": _values(backends), "env": _values(env_ids)}
    if not any(wanted.values()):
        raise ConfigError(f"rm {path}: no run id, backend or env id given; name the rows to remove")
    if not path.exists():
        raise ConfigError(f"rm {path}: not found; give an existing .jsonl results file")
    if not path.is_file() or path.suffix != ".jsonl":
        raise ConfigError(f"rm {path}: not a .jsonl results file; give one results file, not a folder")
    check_results_file(path, "rm")
    lines = path.read_bytes().splitlines(keepends=True)
    kept = [line for line in lines if not _matches(line, wanted)]
    if len(kept) < len(lines):
        try:
            _replace(path, b"".join(kept))
        except OSError as e:
            raise ConfigError(f"rm {path}: cannot rewrite it ({e.strerror}); the file is unchanged") from None
    return len(lines) - len(kept)


def _values(given: Iterable[str]) -> frozenset[str]:
    """The values of one filter as a set (a lone string is one value, not its characters)."""
    return frozenset([given] if isinstance(given, str) else given)


def _matches(line: bytes, wanted: dict[str, frozenset[str]]) -> bool:
    """True when the line is a JSON row one of whose fields holds one of its wanted values."""
    try:
        row = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return False                     # a torn line: kept as it is
    return isinstance(row, dict) and any(row.get(field) in values for field, values in wanted.items())


def _replace(path: Path, data: bytes) -> None:
    """Writes `data` to a temporary file beside `path`, fsyncs it and renames it over `path`;
    on any failure the temporary file is removed and `path` is unchanged."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, path.stat().st_mode & 0o7777)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
