"""Files a command writes besides result rows (a report, a suite, a gate's JUnit XML), and what
the line after an interrupt says of them.

`write_whole` writes a file whole or not at all: the text goes to a temporary file beside it,
which is fsync'd and renamed over it (`os.replace`, atomic on POSIX), so an interrupt or a
failure at any point leaves the file there as it was. A command notes each such file with
`will_write` before its work begins; after Ctrl-C or SIGTERM, `outputs_note` compares each
file with what was there when it was noted and says which were written and which were not.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import NamedTuple


class Output(NamedTuple):
    """A file the command in progress writes (`will_write`)."""

    path: Path
    before: tuple[int, int, int] | None   # its (inode, size, mtime in ns) when noted; None: no file there
    written: str                          # what the line says when it changed: "report -o PATH was written"
    unchanged: str                        # what it says when not: "report -o PATH was not written"
    shown: Path                           # the path as the lines name it (`path` may be made absolute)

    def changed(self) -> bool:
        """True when the file is there and not as it was when noted: it was written. Raises nothing."""
        return _state(self.path) not in (None, self.before)


OUTPUTS: list[Output] = []   # the files the command in progress writes besides rows (main() empties it)
ENV_NOTE: list[str] = [""]   # what the line after a stop before the first row says of the env file (env.env_beside)


def _state(path: Path) -> tuple[int, int, int] | None:
    """(inode, size, mtime in ns) of the file at `path`, None when there is none. Raises nothing."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


def will_write(path: str | Path, label: str, written: str | None = None, unchanged: str | None = None,
               shown: str | Path | None = None) -> Output:
    """Notes, before the work that leads to it, that the command in progress writes `path`.

    Args:
        label: how the command line names it, e.g. "report -o"; the line says "LABEL PATH was
            written", or "LABEL PATH was not written" (with ": the file already there is left as
            it was" when one was).
        written, unchanged: the line's words in place of those.
        shown: PATH as the line names it (the path as given, where `path` was made absolute);
            default `path`.

    Returns:
        The Output noted (also appended to OUTPUTS).
    """
    p, name = Path(path), Path(path if shown is None else shown)
    before = _state(p)
    kept = ": the file already there is left as it was" if before is not None else ""
    OUTPUTS.append(Output(p, before, written or f"{label} {name} was written",
                          unchanged or f"{label} {name} was not written{kept}", name))
    return OUTPUTS[-1]


def outputs_note() -> str:
    """'; report -o PATH was not written: ...' for each file noted by `will_write`, as it is now
    against when it was noted; '' when none was noted. Raises nothing."""
    return "".join(f"; {o.written if o.changed() else o.unchanged}" for o in OUTPUTS)


def write_whole(path: str | Path, data: str | bytes) -> None:
    """Writes `data` (str as UTF-8) to `path` whole or not at all (the module docstring): a file
    already there keeps its permissions, a new one gets the umask's; a link is written through
    to its target. On any failure (an interrupt included) the temporary file is removed.

    Raises:
        OSError: the temporary file cannot be made, written or renamed (the file is unchanged);
            its filename is `path`.
    """
    target = Path(os.path.realpath(path))
    tmp = target.with_name(f".{target.name}.{secrets.token_hex(4)}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)   # the umask applies
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        if target.exists():
            os.chmod(tmp, target.stat().st_mode & 0o7777)
        os.replace(tmp, target)
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        if isinstance(e, OSError):          # named by the path asked for, not by the temporary file
            raise OSError(e.errno, e.strerror, str(path)) from e
        raise
