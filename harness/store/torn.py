"""Torn lines: a result row cut short by a killed writer, and what the next append does with one.

A run appends each row with one ``os.write`` (`rows.append_row`). On Linux a SIGKILL that lands
while a row longer than a page is copied in ends that write short, between two pages, so the file
ends in the first part of a row, with no newline. Readers skip such a line with a warning
(`rows.read_rows`). The next writer, which holds the file's lock (`store.lock`: a run or check,
with or without ``--resume``, and merge), settles the file's end before it appends (`settle_tail`):

- a last line that parses as a whole JSON object but lacks its newline (a file edited by hand) is
  kept, and the newline is written before the new rows;
- any other last line (a torn row) is moved out of the way, never lost: its bytes, and a newline,
  are appended to the side file ``<out>.torn`` beside the results file (`torn_path`) and fsync'd;
  then the results file is cut back to its last newline, and one warning line names both files
  and the byte count.

So a torn row never ends up in the middle of a results file, where every later reader (report,
gate, merge, rm, --resume) would warn of it again. Lines torn before this (in the middle of a file)
are left where they are: readers skip them with a warning.
"""

from __future__ import annotations

import errno
import json
import logging
import os
from pathlib import Path

from treebench.harness.errors import led_by

log = logging.getLogger(__name__)

TORN_SUFFIX = ".torn"   # the side file of `out`: `out` + this, where its torn last lines are kept
CHUNK = 1 << 16          # bytes read at a time, backwards from the end, to find the last line's start


def torn_path(results: Path | str) -> Path:
    """The side file of a results file's torn lines: `r.jsonl` -> `r.jsonl.torn`."""
    return Path(f"{results}{TORN_SUFFIX}")


def is_torn_row(line: bytes) -> bool:
    """A line cut short by a killed writer: the start of a result row (any schema)."""
    return line.startswith(b'{"schema": ')


def settle_tail(path: Path, fd: int, command: str = "", named: Path | None = None) -> bytes:
    """Readies the end of the results file `path`, open on `fd` for appending under its lock, for
    new rows; what to write before them. Its warning line is led by `command`, the command appending,
    and names the file as `named` (default `path`), the path as the user gave it.

    Returns:
        b"\\n" when its last line lacks only its newline (a whole JSON object, or blanks); b"" when
        it is empty or ends in a newline, or once a torn last line is moved to `torn_path(path)`
        and the file cut back to its last newline (with one warning line).

    Raises:
        OSError: reading the file's end, writing or syncing the side file (its name as the
            error's filename), or cutting the file back failed; the results file is then as it was.
    """
    start, last = _last_line(path)
    if not last:
        return b""
    if _whole(last):
        return b"\n"
    side = torn_path(path)
    try:
        side_fd = os.open(side, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            write_synced(side_fd, last + b"\n")
        finally:
            os.close(side_fd)
    except OSError as e:
        raise OSError(e.errno, e.strerror, str(side)) from e
    os.ftruncate(fd, start)
    log.warning("%s%s ended in a torn line (%d bytes, a row cut short by a killed writer): moved to %s before "
                "appending", led_by(command), named or path, len(last), torn_path(named or path))
    return b""


def _last_line(path: Path) -> tuple[int, bytes]:
    """(offset, bytes) of the last line of `path` when it lacks a newline at the end; (size, b"")
    for an empty file or one that ends in a newline."""
    with open(path, "rb") as f:
        size = f.seek(0, os.SEEK_END)
        if size == 0:
            return 0, b""
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return size, b""
        start = size
        while start > 0:   # backwards, a chunk at a time: a torn row may be megabytes long
            begin = max(0, start - CHUNK)
            f.seek(begin)
            newline = f.read(start - begin).rfind(b"\n")
            start = begin if newline < 0 else begin + newline + 1
            if newline >= 0:
                break
        f.seek(start)
        return start, f.read(size - start)


def _whole(line: bytes) -> bool:
    """True for a line that is whole without its newline: blanks, or one JSON object."""
    if not line.strip():
        return True
    try:
        return isinstance(json.loads(line), dict)
    except (ValueError, RecursionError):   # JSONDecodeError, UnicodeDecodeError: cut short
        return False


def write_synced(fd: int, data: bytes) -> None:
    """Writes the whole of `data` to `fd` (one ``os.write``, unless the disk takes only part of it) and
    fsyncs it (`fsync`): the appends of rows (`rows.append_row`) and of torn lines to the side file.

    Raises:
        OSError: the write or the fsync failed; what it wrote before that stays (`rows._append` cuts
            the results file back).
    """
    while data:
        data = data[os.write(fd, data):]
    fsync(fd)


def fsync(fd: int) -> None:
    """os.fsync, ignoring EINVAL/ENOTSUP/EROFS from files that cannot be synced (a pipe, /dev/null).

    Raises:
        OSError: any other error of the fsync (EIO: the data may not be on disk).
    """
    try:
        os.fsync(fd)
    except OSError as e:
        if e.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EROFS):
            raise
