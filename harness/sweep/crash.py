"""The plain line that a crash of a sweep run in the process gets: rerun with --isolate, and how to
finish the run with --resume.

A backend that segfaults outside ``--isolate`` ends the process at once: no Python code runs after
the signal, so no handler can print a line. faulthandler (turned on by the CLI:
treebench.harness.run.inflight.enable_crash_report) writes the Python stack from C, whose frames
name the pair in flight (`inflight.call_in_flight`). While the sweep runs, faulthandler writes into
a pipe instead of stderr; a small helper process started with the sweep (plain Python, no imports
of ours) passes what comes through the pipe on to stderr, after the line it was given; given two, it
picks at the crash by the size of the file the rows go to (--out, or under torchrun this rank's file):
the rows kept there, the --resume that finishes the run and the `treebench rm` that removes them, or,
where the file is still empty or as it was, that no row was written yet and the rerun::

    parent (the sweep)                          helper (HELPER)
      faulthandler -> pipe  ───  a crash's stack ──▶  stderr: LINE (kept / none), then the stack
      end of the sweep: pipe closed ───────────────▶  exits, having written nothing

The helper runs in its own session, so a Ctrl-C or a signal to the process group reaches the sweep
alone; it exits when the pipe closes, which the kernel does for a process that dies however it dies.
Where no helper can be started, or faulthandler is not the CLI's (under pytest), the stack goes to
stderr as before.

A crash before the run's first row leaves its results file empty, with the lock sidecar that names
the dead process (treebench.harness.store.lock) and the env file beside it. Rerun with that
``--out`` (with or without --resume), the run appends to the empty file and takes the lock over;
rerun without ``--out``, the run gets a new default file, so `drop_crash_leftovers` removes the
empty default files of the suite's crashed runs (and their sidecars, and what their torchrun launch
left beside them where it holds no row) first: a file named after a fresh run id, or after the run
id its sidecar (or a sidecar of its launch's rank files) records as naming it (one from
$TREEBENCH_RUN_ID or torchrun's). The env file is kept: every results file of the folder shares
it, and the rerun writes it again.
"""

from __future__ import annotations

import contextlib
import faulthandler
import glob
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from treebench.harness.errors import ConfigError
from treebench.harness.run.inflight import CRASH_REPORT_OURS, kept_rows
from treebench.harness.store.lock import abandoned, hold, lock_path, naming_run_id
from treebench.harness.store.names import RUN_ID_STAMP
from treebench.harness.sweep.shard import appends_to, rank_files

# stdin: the pipe faulthandler writes into; argv: the line written once, before the first bytes passed on, or
# (LINE_KEPT, LINE_NONE, PATH, SIZE): LINE_NONE where the results file PATH is still empty or has the SIZE it had
# at the start (-1: none), decided when the first bytes come, that is at the crash.
HELPER = ("import os, sys\n"
          "def line(a):\n"
          "    try:\n"
          "        size = os.stat(a[2]).st_size\n"
          "    except (OSError, IndexError):\n"
          "        size = -1\n"
          "    kept = len(a) < 4 or size > 0 and str(size) != a[3]\n"
          "    return os.fsencode(a[0] if kept else a[1]) + b'\\n'\n"
          "head = True\n"
          "while chunk := os.read(0, 65536):\n"
          "    data, head = (line(sys.argv[1:]) if head else b'') + chunk, False\n"
          "    while data:\n"
          "        data = data[os.write(2, data):]\n")
HELPER_EXIT_S = 5.0   # the sweep's end waits this long for the helper to exit


def crash_line(out: Path | None, run_id: str, written: bool = True, held: Path | None = None) -> str:
    """The line before a crash's stack: --isolate, and with a results file `out` either the rows kept
    in `held` under `run_id`, the --resume that finishes the run and the `treebench rm` that removes
    them (`written`: `inflight.kept_rows`), or that no row was written to `held` yet and the command
    that reruns it. `held`, default `out`, is the file the crashed process appends to: under torchrun
    its rank file (`shard.rank_path`), whose rerun takes --resume too, since the launch's other ranks
    may have written rows."""
    line = ("treebench: a backend crashed the process (the stack below names it and its case); rerun with "
            "--isolate to make a crash an error row and go on")
    if out is None:
        return line
    if written:
        return f"{line}: rows already written are kept{kept_rows(out, (run_id,), 'to finish, run', held, ' --isolate')}"
    rerun = f"run the same command with --isolate --out {shlex.quote(str(out))}"
    if held in (None, out):
        return f"{line}: no row was written yet to {out}; {rerun}"
    return (f"{line}: no row was written yet to {held} (--out {out}'s rank file); {rerun} --resume (it skips the "
            f"pairs whose rows the other ranks wrote, and merges those into {out}; unset RANK and WORLD_SIZE first "
            "where no torchrun launched this command)")


def crash_lines(out: Path | None, run_id: str) -> list[str]:
    """The helper's arguments (HELPER): crash_line's line, or with a results file `out` both of its lines for
    the file this process appends to (`shard.appends_to`: under torchrun its rank file), that file and its size
    now (-1: no file), for the helper to pick one at the crash."""
    if out is None:
        return [crash_line(None, run_id)]
    held = appends_to(out)
    try:
        size = os.stat(held).st_size
    except OSError:
        size = -1
    return [crash_line(out, run_id, held=held), crash_line(out, run_id, written=False, held=held),
            os.path.abspath(held), str(size)]


@contextlib.contextmanager
def crash_advice(lines: list[str] | None) -> Iterator[None]:
    """The with-block with a crash's stack preceded by one of `lines` (`crash_lines`) on stderr (the
    module's helper), where faulthandler is the CLI's; faulthandler writes to stderr again at its end.
    None: the block as it is (a sweep whose pairs run in workers, or none at all).

    Raises nothing of its own: where the helper cannot start, the block runs as it is.
    """
    if lines is None or not (CRASH_REPORT_OURS[0] and faulthandler.is_enabled()):
        yield
        return
    try:
        read, write = os.pipe()
    except OSError:
        yield
        return
    try:
        helper: subprocess.Popen | None = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", HELPER, *lines], stdin=read, stdout=subprocess.DEVNULL,
            start_new_session=True)
    except (OSError, ValueError):
        helper = None
    finally:
        os.close(read)
    if helper is None:
        os.close(write)
        yield
        return
    try:
        faulthandler.enable(file=write)
        yield
    finally:
        with contextlib.suppress(OSError, ValueError, RuntimeError, AttributeError):   # as enable_crash_report
            faulthandler.enable(file=sys.stderr)
        os.close(write)
        with contextlib.suppress(subprocess.TimeoutExpired):
            helper.wait(HELPER_EXIT_S)


RANK_FILE = re.compile(r"\.rank\d+-of-\d+\.jsonl$")   # a torchrun rank's file (sweep.shard.rank_path)


def drop_crash_leftovers(folder: Path, suite: str, keep: Path | None = None) -> list[Path]:
    """Removes what runs of `suite` that crashed before their first row left in the default results
    `folder`: each default file of the suite (`_default_of`) but `keep` (this run's) that is empty and
    whose run is gone (`_crashed`), with its lock sidecar, under its lock, and with what its torchrun
    launch left beside it where that holds no row either: the ranks' empty files, their sidecars and
    done markers (`_rank_leftovers`). Never a file holding anything, a rank file on its own, one whose
    launch left a rank file holding a row (it waits there for a --resume) or that a live process
    writes, another suite's, or a user's own. Returns the files removed. Raises nothing.
    """
    removed: list[Path] = []
    try:
        paths = sorted(Path(folder).glob(f"{glob.escape(suite)}-*.jsonl"))
    except OSError:
        return removed
    for path in paths:
        if path == keep or RANK_FILE.search(path.name) or not _empty(path):
            continue
        ranks = _rank_leftovers(path)
        if ranks is None or not _default_of(path, suite, ranks) or not _crashed(path, ranks):
            continue
        with contextlib.suppress(ConfigError, OSError), hold(path):   # no one appends meanwhile; its release
            if _empty(path):                                           # deletes the sidecar
                path.unlink()
                removed.append(path)
                _drop_ranks(path, ranks)
    return removed


def _default_of(path: Path, suite: str, ranks: list[Path]) -> bool:
    """Whether `path` is named as a default results file of `suite` (`suite` as in default file names,
    `cli.run.suite_name`): `<suite>-<run id>.jsonl` whose run id is a fresh one (`names.RUN_ID_STAMP`),
    or the one its lock sidecar, or that of a rank file of its launch (`ranks`), records as naming it
    (`lock.naming_run_id`: a run id from $TREEBENCH_RUN_ID or torchrun's). So never suite `tiny-x`'s
    `tiny-x-<id>.jsonl` for suite `tiny` (the sidecar records `<id>`), nor a user's own `--out
    tiny-mine.jsonl` (whose sidecar records none)."""
    if re.fullmatch(rf"{re.escape(suite)}-{RUN_ID_STAMP}\.jsonl", path.name):
        return True
    return any(path.name == f"{suite}-{run_id}.jsonl" for run_id in map(naming_run_id, (path, *ranks)) if run_id)


def _crashed(out: Path, ranks: list[Path]) -> bool:
    """Whether the run that wrote `out` is gone: its lock sidecar names a dead process (`lock.abandoned`)
    or, where it has none (a torchrun rank 0 that torchrun stopped once another rank crashed deletes its
    own on the way out), the sidecar of one of its launch's rank files `ranks` does. Raises nothing."""
    if lock_path(out).exists():
        return abandoned(out)
    return any(abandoned(rank) for rank in ranks)


def _rank_leftovers(out: Path) -> list[Path] | None:
    """The rank files (`shard.rank_path`) a torchrun launch writing `out` left: those on disk and those
    whose lock sidecar alone is there; None where one holds anything or a process that is not gone
    holds its lock (no pid yet, or a live one), or where they cannot be read. Raises nothing."""
    try:
        sidecars = out.parent.glob(f"{glob.escape(out.stem)}.rank*-of-*.jsonl.lock")
        ranks = sorted({*rank_files(out), *(s.with_suffix("") for s in sidecars if RANK_FILE.search(s.stem))})
        for rank in ranks:
            if (rank.exists() and not _empty(rank)) or (lock_path(rank).exists() and not abandoned(rank)):
                return None
    except OSError:   # a folder or file it may not read: left as it is
        return None
    return ranks


def _drop_ranks(out: Path, ranks: list[Path]) -> None:
    """Removes the empty rank files `ranks` of `out`'s launch, each under its lock (whose release
    deletes its sidecar), and the launch's done markers. Raises nothing."""
    for rank in ranks:
        with contextlib.suppress(ConfigError, OSError), hold(rank):
            if _empty(rank):
                rank.unlink()
    with contextlib.suppress(OSError):
        for done in out.parent.glob(f"{glob.escape(out.stem)}.rank*-of-*.done"):
            done.unlink(missing_ok=True)


def _empty(path: Path) -> bool:
    """True for an empty regular file at `path` (not a link). Raises nothing."""
    try:
        return path.is_file() and not path.is_symlink() and path.stat().st_size == 0
    except OSError:
        return False
