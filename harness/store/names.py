"""The names of the files treebench reads and writes: those it picks, and what a file system
takes in those it is given; and the run ids that go into them.

- picked (`default_report`, `kept_report`, `unused_path`; `distinct_paths`, a path given twice
  taken once): the report of a results file is
  reports/local/<its stem>.html unless a path is given, so a run's default
  results/local/<suite>-<run_id>.jsonl and its report share their name; where a report made from
  other results is there, the first free <stem>-2.html, -3, ... (`kept_report`), so that report is
  kept; a default name that an earlier run's file holds gets a free one beside it (`unused_path`).
- read (`listed_results`): a results folder's *.jsonl files, a folder or FIFO so named skipped with a warning;
- given (`path_problem`, `check_path_name`): a name longer than the file system takes (its
  NAME_MAX per name, PATH_MAX in all), one that leaves no room for the names treebench gives
  the files it keeps beside a file it writes (`NAME_ROOM`), or a symbolic link loop, found
  before anything is read or written and said in one line; the same OSError met later is said
  in the same words (`os_error_problem`, which the command line's last resort uses).
- run ids (a row's ``run_id``, and part of a run's default file names): `new_run_id` makes one;
  `check_run_id` checks one given from outside ($TREEBENCH_RUN_ID, torchrun's rendezvous id);
  `is_run_id` tells whether a row's could have been written by treebench, one of those or
  TORCHRUN_PREFIX followed by torchrun's.
"""

from __future__ import annotations

import errno
import html
import logging
import os
import re
import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path

from treebench.harness.errors import ConfigError, led_by

log = logging.getLogger(__name__)

REPORTS = Path("reports/local")   # where reports go unless a path is given
# Bytes a written file's name leaves for the names treebench derives from it: the lock sidecar
# X.jsonl.lock (+5), the side file of torn rows X.jsonl.torn (+5), a torchrun rank's
# X.rank<r>-of-<w>.jsonl.lock (+20 for 3-digit ranks), a file written whole's .X.<8 hex>.tmp (+14),
# a free name X-<n>.html (+3) written whole (+14).
NAME_ROOM = 32
NAME_MAX, PATH_MAX = 255, 4096    # POSIX's values (bytes), where the file system does not say (os.pathconf)
RUN_ID_MAX = 100   # characters of a run id given from outside (new_run_id's are 23)
RUN_ID_RE = re.compile(rf"[A-Za-z0-9][A-Za-z0-9._-]{{0,{RUN_ID_MAX - 1}}}")   # a run id given from outside
RUN_ID_STAMP = r"[0-9]{8}T[0-9]{6}Z-[0-9a-f]{6}"   # what new_run_id makes, as a regular expression
TORCHRUN_PREFIX = "torchrun-"   # + torchrun's rendezvous id ($TORCHELASTIC_RUN_ID): the run id of a torchrun launch


def new_run_id() -> str:
    """A fresh run id (a row's ``run_id``): UTC time to the second plus 6 random hex digits,
    e.g. ``20260101T120000Z-3fa2c1``; runs started in the same second still differ."""
    return datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ") + "-" + uuid.uuid4().hex[:6]


def check_run_id(run_id: str, source: str, fix: str) -> str:
    """`run_id` when RUN_ID_RE takes it: it goes into default file names and into the
    `treebench rm --run-id` a line prints, so no '/', space or leading '-' or '.'.

    Raises:
        ConfigError: one line naming `source` (where the id came from), the characters allowed
            and `fix` (how to give another).
    """
    if not RUN_ID_RE.fullmatch(run_id):
        raise ConfigError(f"{source} {run_id!r}: a run id may hold only ASCII letters, digits, '-', '_' and '.' "
                          f"(at most {RUN_ID_MAX}, the first a letter or digit), as it goes into file names and "
                          f"commands; {fix}")
    return run_id


def is_run_id(text: str) -> bool:
    """Whether `text` has the form of a run id treebench writes in a row: one RUN_ID_RE takes (`new_run_id`'s,
    or one `check_run_id` let in), or TORCHRUN_PREFIX and torchrun's rendezvous id, which RUN_ID_RE takes.
    Raises nothing."""
    return bool(RUN_ID_RE.fullmatch(text) or (text.startswith(TORCHRUN_PREFIX)
                                              and RUN_ID_RE.fullmatch(text.removeprefix(TORCHRUN_PREFIX))))


def default_report(results: str | Path) -> Path:
    """The report of the results file `results` unless a path is given: reports/local/<its stem>.html
    (`treebench report`'s, and a resumed run's, whose results file is named after the run it
    resumes). Raises nothing."""
    return REPORTS / f"{Path(results).stem}.html"


def kept_report(sources: Sequence[str | Path], whose: str) -> tuple[Path, str]:
    """The report of the results `sources` unless a path is given, with the warning that goes with
    it ('' when none): `default_report(sources[0])`, or where a report made from other results is
    there (`report_results` names other files, or none: a report made before it recorded them, or
    a page treebench did not write), the first <stem>-2.html, <stem>-3.html, ... that is free or
    made from `sources` (`unused_path`), so that report is kept, as the warning says; `whose`
    names the new report in it ("this report"). Raises nothing."""
    mine = _once([os.path.realpath(s) for s in sources])   # as its tags record them; a link loop raises nothing
    there = default_report(sources[0])
    found = unused_path(there, reuse=lambda p: _once(report_results(p) or []) == mine)   # a file named twice: once
    if found == there:
        return found, ""
    if report_results(there) is None:
        return found, f"{there} does not record which results file it was made from, so it is kept: {whose} is {found}"
    return found, (f"{there} is the report of other results than {', '.join(map(str, sources))}, and is kept: "
                   f"{whose} is {found}")


def distinct_paths(paths: Sequence[str]) -> list[str]:
    """`paths` with each file or folder once, as first spelled: a later path naming one already
    given (the same path, another spelling of it such as ./r/x.jsonl, a symbolic or hard link to
    it; the same inode) is left out, as readers keep a row read twice once
    (`validate.drop_repeated_rows`). Raises nothing (a path that cannot be looked at is kept by
    its resolved spelling: reading it says what is wrong)."""
    seen: set[object] = set()
    kept = []
    for text in paths:
        try:
            st = os.stat(text)
            key: object = (st.st_dev, st.st_ino)
        except (OSError, ValueError):
            key = os.path.realpath(text)
        if key not in seen:
            seen.add(key)
            kept.append(text)
    return kept


_SKIPPED: set[str] = set()   # folders and other non-files named *.jsonl inside a results folder already warned about


def listed_results(folder: Path, command: str = "") -> list[Path]:
    """The results files of the results folder `folder`: its entries named *.jsonl, sorted, but for a
    folder so named (left by a path such as x.jsonl/../y.jsonl), which is skipped as every other
    folder in it is (folders are not searched recursively), and for one that is no regular file (a
    FIFO, whose read would wait for a writer; a socket; a device), each skipped with one warning naming
    it, once per process (readers list a folder more than once), led by the `command` reading. A link is
    followed. Raises OSError where `folder` cannot be listed."""
    found = []
    for entry in sorted(os.scandir(folder), key=lambda e: e.name):
        if not entry.name.endswith(".jsonl"):
            continue
        if entry.is_file() or not os.path.exists(entry.path):   # through a link; a dangling one is named when read
            found.append(folder / entry.name)
            continue
        what = ("a folder, not a results file; skipped (folders are not searched recursively)" if entry.is_dir()
                else "not a regular file (a FIFO, socket or device); skipped")
        if (where := os.path.realpath(entry.path)) not in _SKIPPED:
            _SKIPPED.add(where)
            log.warning("%sresults folder %s: %s is %s", led_by(command), folder, entry.path, what)
    return found


def _once(paths: list[str]) -> list[str]:
    """`paths` with each one once, in order of first appearance. Raises nothing."""
    return list(dict.fromkeys(paths))


def report_results(path: str | Path) -> list[str] | None:
    """The absolute paths of the results files the report `path` was made from, as its
    `<meta name="treebench-results">` tags in its first 16 KiB record them; None when it cannot
    be read or records none (a report made before the tags, or not a report). Raises nothing."""
    try:
        with open(path, "rb") as f:
            head = f.read(16384).decode("utf-8", errors="replace")
    except OSError:
        return None
    found = [html.unescape(m) for m in re.findall(r'<meta name="treebench-results" content="([^"]*)">', head)]
    return found or None


def unused_path(path: str | Path, reuse: Callable[[Path], bool] | None = None) -> Path:
    """`path` when nothing is there, else the first of <stem>-2<suffix>, <stem>-3<suffix>, ... beside
    it where nothing is: a default output name that an earlier run's file already holds (a run id
    used again) gets a name of its own rather than overwriting that file. A name whose file `reuse`
    accepts (a report made from the same results) is taken as if free. Raises nothing."""
    p, n = Path(path), 2
    found = p
    while (os.path.lexists(found)) and not (reuse is not None and reuse(found)):
        found, n = p.with_name(f"{p.stem}-{n}{p.suffix}"), n + 1
    return found


def _limit(path: Path, name: str, default: int) -> int:
    """`os.pathconf(folder, name)` of the nearest existing folder of `path` (the file system the
    name goes to), else `default`. Raises nothing."""
    folder = next((d for d in (path.parent, *path.parent.parents) if os.path.isdir(d)), Path("."))
    try:
        value = os.pathconf(folder, name)
    except (OSError, ValueError, AttributeError):   # AttributeError: no pathconf (Windows)
        return default
    return value if value > 0 else default


def _at_most(limit: int, room: int) -> str:
    """How a message states the longest name taken, `limit` bytes the file system's, less `room`."""
    if not room:
        return f"the file system takes at most {limit}"
    return (f"at most {limit - room} here: the file system takes {limit}, and treebench names the files it keeps "
            f"beside it (its lock, temporary files) with up to {room} more")


def path_problem(path: str | Path, room: int = 0) -> str:
    """Why the file system would refuse `path` by its name, told before anything is opened: the
    path or one of its names longer than it takes (bytes; `room`: what the last name must leave,
    NAME_ROOM for a file treebench writes), or a symbolic link loop on the way; else ''. Raises
    nothing.
    """
    p = Path(path)
    size, longest = len(os.fsencode(str(p))), _limit(p, "PC_PATH_MAX", PATH_MAX) - 1   # PATH_MAX counts the NUL
    if size + room > longest:
        return f"path too long ({size} bytes; {_at_most(longest, room)}); give a shorter path"
    name_max = _limit(p, "PC_NAME_MAX", NAME_MAX)
    for i, part in enumerate(p.parts):
        last = i == len(p.parts) - 1
        n = len(os.fsencode(part))
        if n + (room if last else 0) > name_max:
            what = "file name" if last else "folder name"
            return f"{what} too long ({n} bytes; {_at_most(name_max, room if last else 0)}); give a shorter name"
    try:
        os.stat(p)
    except OSError as e:
        return os_error_problem(e) or ""
    except ValueError:   # a NUL byte: the callers' own checks say so
        return ""
    return ""


def check_path_name(path: str | Path, what: str, room: int = 0) -> Path:
    """`path` as a Path, when the file system takes its name (`path_problem`).

    Args:
        what: how the message names the path (the option or argument it came from).
        room: bytes its file name must leave: NAME_ROOM for a file treebench writes.

    Raises:
        ConfigError: '{what} {path}: {the problem}; {the fix}', one line.
    """
    if problem := path_problem(path, room):
        raise ConfigError(f"{what} {path}: {problem}")
    return Path(path)


def os_error_problem(e: BaseException) -> str | None:
    """What an OSError about a path's name says, in `path_problem`'s words (ELOOP: a symbolic link
    loop; ENAMETOOLONG: too long, also once its links are followed); None for any other error.
    Raises nothing."""
    if isinstance(e, OSError) and e.errno == errno.ELOOP:
        return ("a symbolic link loop (following its links leads back to a link already followed); fix or "
                "remove the links, or give another path")
    if isinstance(e, OSError) and e.errno == errno.ENAMETOOLONG:
        return "name too long for the file system (its folders and links followed); give a shorter path"
    return None
