"""Files a command writes besides result rows (a report, a suite, a gate's JUnit XML), and what
the line after an interrupt says of them.

`write_whole` writes a file whole or not at all: the text goes to a temporary file beside it,
which is fsync'd, checked where the caller asks (a suite is read back as `load_suite` reads it),
and renamed over it (`os.replace`, atomic on POSIX), so an interrupt, a failure or a refusal at
any point leaves the file there as it was. A command notes each such file with
`will_write` before its work begins; after Ctrl-C or SIGTERM, `outputs_note` compares each
file with what was there when it was noted and says which were written and which were not.

Before that, the gate refuses a file that is not its kind: `--junit` overwrites only JUnit XML
that the gate wrote (`refuse_foreign_junit`, as `paths.refuse_non_html` does for a report), and
`--summary` appends Markdown to a Markdown, text or suffixless file such as GitHub's
$GITHUB_STEP_SUMMARY, never to a data file treebench reads or writes (`refuse_data_summary`).
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from treebench.harness.errors import ConfigError


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


def write_whole(path: str | Path, data: str | bytes, check: Callable[[Path], None] | None = None) -> None:
    """Writes `data` (str as UTF-8) to `path` whole or not at all (the module docstring): a file
    already there keeps its permissions, a new one gets the umask's; a link is written through
    to its target. On any failure (an interrupt included) the temporary file is removed.

    Args:
        check: called with the temporary file once it is written, before it is renamed: whatever it
            raises leaves `path` as it was (a suite that the suite reader refuses is never written).

    Raises:
        OSError: the temporary file cannot be made, written or renamed (the file is unchanged);
            its filename is `path`.
        Exception: what `check` raised (the file is unchanged).
    """
    target = Path(os.path.realpath(path))
    tmp = target.with_name(f".{target.name}.{secrets.token_hex(4)}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)   # the umask applies
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        if check is not None:
            check(tmp)
        if target.exists():
            os.chmod(tmp, target.stat().st_mode & 0o7777)
        os.replace(tmp, target)
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        if isinstance(e, OSError):          # named by the path asked for, not by the temporary file
            raise OSError(e.errno, e.strerror, str(path)) from e
        raise


JUNIT_MARK = b'<testsuite name="treebench.gate"'   # gate_render.junit_xml's root element, in its first 4 KiB
DATA_SUFFIXES = {   # files treebench reads or writes whose kind Markdown appended to them would break
    ".jsonl": "a results file", ".json": "an env fingerprint or other JSON file", ".toml": "a suite or acceptance file",
    ".html": "a report", ".htm": "a report", ".xml": "an XML file such as the gate's JUnit",
    ".py": "a Python file such as a backend", ".lock": "a results file's lock", ".torn": "a results file's torn rows"}


def _head(path: Path, flag: str, line: bool = False) -> bytes:
    """The first 4 KiB of the file at `path` (line=True: its first line that is not blank, up to
    16 MiB, a result row's samples included), leading white space and byte order mark left out;
    b"" for none there, or for what is no regular file (a device such as /dev/stderr, a pipe: never
    read, it may wait for a writer; writing it says what fails).

    Raises:
        ConfigError: the file cannot be read.
    """
    if not path.is_file():
        return b""
    try:
        with open(path, "rb") as f:
            if not line:
                return f.read(4096).lstrip()
            first = f.readline(1 << 24).removeprefix(b"\xef\xbb\xbf")
            while first and not first.strip():
                first = f.readline(1 << 24)
            return first.strip()
    except OSError as e:
        raise ConfigError(f"{flag} {path}: cannot read it ({e.strerror}); give another path") from None


def refuse_foreign_junit(path: str | Path, flag: str) -> None:
    """Refuses to overwrite an existing file that is not JUnit XML the gate wrote (`JUNIT_MARK`):
    an empty file may be overwritten, any other is left as it is.

    Raises:
        ConfigError: `path` cannot be read, or holds anything else (a build file, another tool's XML).
    """
    p = Path(path)
    head = _head(p, flag)
    if head and JUNIT_MARK not in head:
        raise ConfigError(f"{flag} {p}: exists and was not written by treebench (it is left as it is); give a "
                          "new .xml path, or remove it first")


def refuse_data_summary(path: str | Path, flag: str) -> None:
    """Refuses to append Markdown to an existing, non-empty file that treebench reads or writes as
    data: one whose suffix is in `DATA_SUFFIXES` (in any case), or whose first line is a JSON
    object (a results file by another name). A missing or empty file, or a Markdown, text or
    suffixless one, may be appended to.

    Raises:
        ConfigError: `path` is such a file, or cannot be read.
    """
    p = Path(path)
    first = _head(p, flag, line=True)
    if not first:
        return
    kind = DATA_SUFFIXES.get(p.suffix.lower())
    if kind is None and _is_json_object(first):
        kind = "a results file (its first line is a JSON row)"
    if kind is not None:
        raise ConfigError(f"{flag} {p}: exists and is {kind}; the Markdown summary is appended only to a Markdown, "
                          "text or suffixless file such as $GITHUB_STEP_SUMMARY: give another path")


def _is_json_object(line: bytes) -> bool:
    """True when `line` is a JSON object (a result row, say). Raises nothing."""
    try:
        return isinstance(json.loads(line), dict)
    except (ValueError, RecursionError):   # JSONDecodeError and UnicodeDecodeError are ValueErrors
        return False
