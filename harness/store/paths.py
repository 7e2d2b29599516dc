"""Every check of a path treebench writes to, made before anything is written.

- results files (`check_writable`, `check_writable_made`, `check_results_file`, `refused_lines`): a .jsonl path
  that holds nothing but result rows, whose folder takes the env fingerprint beside it;
- outputs of the readers (`check_output_path`, `check_html_path`, `refuse_non_html`,
  `refuse_input_path`): a report or gate summary never lands on a folder, on a
  file that is not its kind, or on the results being read;
- every path checked here first by its name (`names.check_path_name`): one the file system would
  refuse (too long, a symbolic link loop), or too long to leave room for the files kept beside it.

The names treebench picks for a file (a default report, a free name beside a taken one) are
`treebench.harness.store.names`'.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

from treebench.harness.errors import ConfigError
from treebench.harness.store.env import ENV_FILE_RE
from treebench.harness.store.names import NAME_ROOM, check_path_name
from treebench.harness.store.rows import (SCHEMA, is_known_schema, migrate_row, reading, run_id_problem,
                                         utf8_problem)
from treebench.harness.store.torn import is_torn_row
from treebench.harness.store.validate import row_problem

HTML_SUFFIXES = (".html", ".htm")   # what a report path may end in: lower case, as a results file's .jsonl
DEFAULT_OUT = "run's default --out"   # how errors name a results path that no --out gave


def folder_problem(path: Path) -> str:
    """Why `path`'s folder cannot be made, where the cause is on disk: "X is a file, not a folder"
    for the nearest existing ancestor X that is no folder (mkdir alone says "File exists"); else
    "". Raises nothing."""
    for parent in path.parents:
        if parent.exists():
            return "" if parent.is_dir() else f"{parent} is a file, not a folder"
    return ""


def write_problem(path: Path) -> str:
    """Why writing the file `path` (its folders made first) would fail, as far as can be told without
    writing anything (a dry run): `folder_problem`, an existing file or the nearest existing folder
    that permissions keep from being written; else "" (a read-only file system, or one such as /proc
    that takes no new files, shows only when written). Raises nothing."""
    if problem := folder_problem(path):
        return problem
    if path.exists():
        return "" if os.access(path, os.W_OK) else "permission denied"
    there = next((d for d in path.parents if d.exists()), None)
    return "" if there is None or os.access(there, os.W_OK | os.X_OK) else f"folder {there} is not writable"


def check_writable(path: str | Path, create: bool = True, what: str = "--out") -> Path:
    """Validates a results path before a run, creating parent folders and the
    file (empty, or left as it is when it exists: never truncated); `check_writable_made`
    without the folders it made. Raises as `check_writable_made`."""
    return check_writable_made(path, create, what)[0]


def check_writable_made(path: str | Path, create: bool = True, what: str = "--out") -> tuple[Path, list[Path]]:
    """`check_writable`, returning the path and the folders made for it: `missing_folders(path)`
    beforehand, deepest first ([] for create=False); a refused path leaves none of them behind.

    Args:
        create: False checks only what can be checked without writing (a dry run).
        what: how the message names the path (the option or argument it came from).

    Raises:
        ConfigError: `path`'s name is one the file system refuses (`names.check_path_name`), or
            it is a directory, does not end in .jsonl, holds something other than result rows,
            cannot be opened for appending, or lies in a folder where the env fingerprint beside
            it cannot be written.
    """
    path = Path(path)
    if not str(path).strip():
        raise ConfigError(f"{what} is empty: give a results file path such as results/local/run.jsonl")
    check_path_name(path, what, NAME_ROOM)
    _reachable(path, what)
    if path.is_dir():
        raise ConfigError(f"{what} {path}: is a directory; give a file path such as {path / 'run.jsonl'}")
    if path.exists() and not path.is_file():
        raise ConfigError(f"{what} {path}: is not a regular file (a device, pipe or socket); "
                          "give a results file path such as results/local/run.jsonl")
    if ENV_FILE_RE.fullmatch(path.name):
        raise ConfigError(f"{what} {path}: is an env fingerprint file, not a results file; "
                          "give a .jsonl results path")
    check_results_file(path, what)
    if path.suffix != ".jsonl":
        raise ConfigError(f"{what} {path}: give a .jsonl path{lower_case(path, ('.jsonl',))} (folders are read "
                          "for *.jsonl files only)")
    if not create:
        if problem := write_problem(path):
            raise ConfigError(f"{what} {path}: cannot write there ({problem}); {_writable_advice(what)}")
        return path, []
    made = missing_folders(path)
    try:
        _create_results(path, what)
    except ConfigError:
        remove_empty_folders(made)   # a refused path leaves no folder made for it
        raise
    return path, made


def _writable_advice(what: str) -> str:
    """What to do about a results path that cannot be written: give another, through --out where
    the path was the default (`DEFAULT_OUT`, relative to the working folder). Raises nothing."""
    return "give --out or run from a writable folder" if what == DEFAULT_OUT else "give a writable file path"


def _create_results(path: Path, what: str) -> None:
    """Makes the folder of the results file `path`, proves the env fingerprint can be written
    there, and creates the file (empty) unless it exists.

    Raises:
        ConfigError: the folder cannot be made or written, or the file cannot be opened for appending.
    """
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"{what} {path}: cannot write there ({folder_problem(path) or e.strerror}); "
                          f"{_writable_advice(what)}") from None
    try:   # the env fingerprint goes beside it: a real probe (os.access says yes to root on an immutable folder)
        with tempfile.NamedTemporaryFile(dir=path.parent, prefix=".treebench-probe-"):
            pass
    except OSError as e:   # EACCES, EPERM, EROFS: not writable; else say what failed (/proc takes no file: ENOENT)
        why = ("its folder {} is not writable" if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS)
               else "cannot create a file in its folder {}").format(path.parent)
        raise ConfigError(f"{what} {path}: {why} ({e.strerror}), and the env fingerprint (env-*.json) is written "
                          "beside the results; choose another folder") from None
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644))
    except OSError as e:
        raise ConfigError(f"{what} {path}: cannot write there ({e.strerror}); {_writable_advice(what)}") from None


UNREADABLE = "line {n} is not a result row that treebench can read ({problem})"   # a row the readers refuse


def check_results_file(path: str | Path, what: str) -> None:
    """Refuses an existing file that holds anything but result rows of a schema this code reads (1 to
    SCHEMA), each with the fields report, gate and merge read, in UTF-8 as they decode it (`refused_lines`);
    a missing or empty file passes. `what` names the path ("--out", "merge OUT").

    Raises:
        ConfigError: `path` holds something else (a suite, a report, a config, rows of another
            schema, a row with a missing or mistyped field): appending to it would damage it,
            reading it would mislead; or it cannot be read (`rows.reading`: no read permission, EIO).
    """
    for n, problem in refused_lines(path, what, "give a new path or a .jsonl results file"):
        raise ConfigError(f"{what} {path}: {UNREADABLE.format(n=n, problem=problem)}; give a new path, or edit or "
                          f"delete that line ({path}:{n})")   # no rm --run-id: it removes the run's good rows too


def refused_lines(path: str | Path, what: str, advice: str) -> Iterator[tuple[int, str]]:
    """(line number, why) for each line of the results file `path` that report, gate and merge refuse, as it
    is read: a row whose fields they refuse (`validate.row_problem`) or a line that is not UTF-8 as they
    decode it (`rows.file_lines`); blank lines and rows torn by a killed writer pass, a missing file holds
    none. `treebench rm` reads them all (it may be what removes such a row); `check_results_file` the first.

    Raises:
        ConfigError: as `check_results_file`, for a line that is no result row of a schema this code reads
            (ending in `advice`: a command that edits the file in place has no use for a new path), and a
            file that cannot be read (`what` names the path).
    """
    path = Path(path)
    with reading(path, what, fix="make it readable: treebench reads the rows a results file holds before it writes "
                                 "to it"):   # a write-only file, a folder on its way that cannot be searched
        try:
            fh = open(path, "rb")  # noqa: SIM115 -- entered below, once it is known to open
        except (FileNotFoundError, NotADirectoryError):
            return  # missing: the open for appending creates it, or says why it cannot
    with reading(path, what), fh:
        for n, raw in enumerate(fh, start=1):
            line = raw.strip()
            if not line:
                continue
            torn = False
            try:
                row = json.loads(line)
            except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
                row, torn = None, is_torn_row(line)   # a torn row: readers skip it
            if not torn and (not isinstance(row, dict) or not is_known_schema(row.get("schema"))):
                got = ("not a result row" if not isinstance(row, dict) else "no schema field" if "schema" not in row
                       else f"schema {row['schema']!r}")
                raise ConfigError(f"{what} {path}: not a treebench results file (line {n}: {got}; "
                                  f"JSON rows of schema 1 to {SCHEMA} expected); {advice}")
            problem = utf8_problem(raw, n) or (None if torn else run_id_problem(row) or row_problem(migrate_row(row)))
            if problem:
                yield n, problem


def check_html_path(path: str | Path, flag: str, example: str) -> Path:
    """Checks a report path: an .html/.htm file path, not a directory, not an existing non-HTML file.

    Args:
        flag: how the message names the path (the option it came from).
        example: a path the message suggests, e.g. "reports/NAME.html".

    Raises:
        ConfigError: `path`'s name is one the file system refuses (`names.check_path_name`), or it
            is a directory, does not end in .html/.htm, or exists and is not a treebench report
            (`refuse_non_html`).
    """
    p = check_path_name(path, flag, NAME_ROOM)
    _reachable(p, flag)
    if p.is_dir():
        raise ConfigError(f"{flag} {p}: is a directory; give a file path such as {p / 'report.html'}")
    if p.suffix not in HTML_SUFFIXES:
        raise ConfigError(f"{flag} {p}: give an .html path{lower_case(p, HTML_SUFFIXES)}, e.g. {example}")
    refuse_non_html(p, flag)
    return p


def lower_case(path: Path, suffixes: Sequence[str]) -> str:
    """' (in lower case: NAME)' where `path` ends in one of `suffixes` written in another case, else
    '': an output's suffix is matched as written, in lower case (a folder is read for its *.jsonl
    files, a match Linux makes case by case, so x.JSONL would be passed over; a report's .html
    follows the same rule). Raises nothing."""
    low = path.suffix.lower()
    return f" (in lower case: {path.with_suffix(low).name})" if low in suffixes and path.suffix != low else ""


def check_html_writable(path: str | Path, flag: str, example: str, probe: bool = True,
                        fix: str = "give a writable .html path") -> Path:
    """`check_html_path`, then (probe=True) proves with a real write that the report can be written
    there, leaving nothing behind: folders it lacks are made for the probe and removed again (the
    report's writer makes them), so a run stopped before its report leaves no empty folder.

    Args:
        flag: how the message names the path (the option it came from).
        example: a path the message suggests, e.g. "reports/local/smoke.html".
        probe: False checks only what can be checked without writing (a dry run).
        fix: what the message says to do about a path that cannot be written.

    Raises:
        ConfigError: everything `check_html_path` refuses, a folder that cannot be made, or a
            path that cannot be written (permission, read-only file system).
    """
    p = check_html_path(path, flag, example)
    if not probe:
        if problem := write_problem(p):
            raise ConfigError(f"{flag} {p}: cannot write there ({problem}); {fix}")
        return p
    made = missing_folders(p)
    try:
        try:
            p.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ConfigError(f"{flag} {p}: cannot create its folder ({folder_problem(p) or e.strerror}); {fix}") from None
        _probe_html(p, flag, fix)
    finally:
        remove_empty_folders(made)
    return p


def missing_folders(path: str | Path) -> list[Path]:
    """The folders above the file `path` that are not there yet, deepest first: those that making
    its folder creates, for `remove_empty_folders` to take away again. Raises nothing."""
    p = Path(path)
    return [d for d in (p.parent, *p.parent.parents) if not d.exists()]


def remove_empty_folders(folders: Sequence[Path]) -> None:
    """Removes each of `folders` (deepest first, as `missing_folders` lists them) that is empty;
    a folder that holds anything, and those above it, are left as they are. Raises nothing."""
    for d in folders:
        with contextlib.suppress(OSError):
            d.rmdir()


def _probe_html(p: Path, flag: str, fix: str) -> None:
    """Proves that `p`, in an existing folder, can be written: permissions, then a real write
    (os.access says yes to root on read-only file systems such as /sys); a refusal ends with `fix`.

    Raises:
        ConfigError: `p` or its folder cannot be written.
    """
    if not os.access(p.parent, os.W_OK | os.X_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise ConfigError(f"{flag} {p}: cannot write there (permission denied); {fix}")
    try:
        if p.exists():
            with open(p, "ab"):
                pass
        else:
            with tempfile.NamedTemporaryFile(dir=p.parent, prefix=".treebench-probe-", suffix=".html"):
                pass
    except OSError as e:
        raise ConfigError(f"{flag} {p}: cannot write there ({e.strerror}); {fix}") from None


# How a report's first 4 KiB show that treebench wrote it: the generator meta tag of
# harness/analyze/templates/report.html.j2, or (reports written before it had one) the
# template's first style rule.
REPORT_MARKS = (b'<meta name="generator" content="treebench">', b":root { --fg:#1f2328; --muted:#59636e;")


def refuse_non_html(path: str | Path, flag: str) -> None:
    """Refuses to overwrite an existing file that is not a treebench report (`REPORT_MARKS`):
    an empty file may be overwritten, any other page is left as it is.

    Raises:
        ConfigError: `path` exists and is not a regular file, cannot be read, does not start
            with markup, or is an HTML page treebench did not write.
    """
    p = Path(path)
    if not p.exists():
        return
    if not p.is_file():
        raise ConfigError(f"{flag} {p}: is not a regular file; give an .html file path")
    try:
        with open(p, "rb") as f:
            head = f.read(4096).lstrip()
    except OSError as e:
        raise ConfigError(f"{flag} {p}: cannot read it ({e.strerror}); give a writable .html path") from None
    if head and not head.startswith(b"<"):
        raise ConfigError(f"{flag} {p}: exists and is not an HTML file; give a new .html path")
    if head and not any(mark in head for mark in REPORT_MARKS):
        raise ConfigError(f"{flag} {p}: exists and was not written by treebench (it is left as it is); give a "
                          "new .html path, or remove it first")


def _reachable(path: Path, what: str) -> None:
    """Refuses a path that a folder above it keeps from being looked up (no search permission):
    pathlib's is_dir and exists raise there rather than answer; and one with a '..' after a folder
    that is not there (`a/new/../x.jsonl`), which the file system resolves only once that folder is
    made: making it would leave an empty folder the path never uses (one named *.jsonl would then be
    read as a results file). The path is refused rather than normalised: where that folder is a
    link, '..' means its target's parent, which no rewriting of the text can know before it is made,
    and the shell and every other tool refuse such a path too. Raises ConfigError; nothing else."""
    try:
        os.stat(path)
    except PermissionError as e:
        raise ConfigError(f"{what} {path}: cannot be reached ({e.strerror}: a folder above it cannot be "
                          "searched); choose another path or fix its permissions") from None
    except (OSError, ValueError):   # missing, or a name the checks after this one refuse
        pass
    parts = path.parts
    for i in (i for i, part in enumerate(parts) if part == ".." and i):
        if not os.path.lexists(above := Path(*parts[:i])):   # making it to leave it would strand an empty folder
            raise ConfigError(f"{what} {path}: its '..' leaves {above}, which does not exist (the file system goes "
                              f"up only from a folder that is there); write the path without it: "
                              f"{os.path.normpath(path)}")


def check_output_path(path: str | Path, flag: str) -> Path:
    """Checks up front that `path` can be written (nothing is created); returns it as a Path.

    Raises:
        ConfigError: `path` is an empty string (an option given as ''), a name the file system
            refuses (`names.check_path_name`), a folder, an existing
            file that cannot be written, or lies under a non-folder or an unwritable folder.
    """
    if isinstance(path, str) and not path.strip():
        raise ConfigError(f"{flag} is empty: give a file path (or leave {flag.split()[-1]} out)")
    p = check_path_name(path, flag, NAME_ROOM)
    _reachable(p, flag)
    if p.is_dir():
        raise ConfigError(f"{flag} {p}: is a folder; give a file path")
    if p.exists():
        if not os.access(p, os.W_OK):
            raise ConfigError(f"{flag} {p}: file is not writable; choose another path or fix its permissions")
        return p
    parent = p.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise ConfigError(f"{flag} {p}: {parent} is not a folder; choose another path")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(f"{flag} {p}: folder {parent} is not writable; choose another path")
    return p


def refuse_input_path(path: str | Path, flag: str, inputs: Sequence[str | Path]) -> None:
    """Refuses an output path that would overwrite or pollute the results being read.

    Raises:
        ConfigError: `path` is one of the input files, or a results (.jsonl) or env
            (env-*.json) file in an input folder or beside an input file (it would be
            overwritten, or read as results next time).
    """
    out = Path(os.path.realpath(path))
    for given in inputs:
        p = Path(os.path.realpath(given))   # a link loop raises nothing here: reading it says what it is
        folder = p if os.path.isdir(p) else p.parent   # isdir: a name too long raises nothing here
        read_there = out.suffix == ".jsonl" or ENV_FILE_RE.fullmatch(out.name) is not None
        if out == p or (out.parent == folder and read_there):
            raise ConfigError(f"{flag} {path}: is one of the results being compared, or would be read "
                              f"with them ({given}); write it somewhere else")
