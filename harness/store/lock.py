"""One writer per results file: an exclusive lock held for a whole run.

Two runs appending to one ``--out`` would interleave their rows (and their
``--resume`` views of it) without a word. A run therefore holds
``fcntl.flock(LOCK_EX | LOCK_NB)`` on a sidecar ``<out>.lock`` holding its pid (and, on a
second line, the run id a run's default results file ``<suite>-<run id>.jsonl`` is named after:
`naming_run_id`), from before its first write to after its last; a second writer finds it
taken and is refused before it writes anything. The kernel drops the lock when the
holder exits, however it exits (SIGKILL, a segfault), so a stale sidecar never
blocks anyone: the next run takes it over.

The sidecar, not the results file, is locked: `rm` and `merge` replace the
results file (and take the same lock while they do), and its pid must be readable.
The holder deletes the sidecar on release; since a process may open the sidecar
just before that, a lock is only taken once the path still names the file that
was locked (same inode).

Under torchrun every rank locks its own rank file, and rank 0 also ``--out``
(treebench.harness.sweep.execute), so ranks never lock each other out. On
platforms without fcntl (Windows) nothing is locked.

`abandoned` tells a sidecar whose writer is gone (treebench.harness.sweep.crash removes the empty
default results file of such a writer, told from a user's own by its name or `naming_run_id`);
`live_writer` one whose writer is still at work (gate and report, reading the file meanwhile, warn
that its rows may be partial). `other_writer_beside` tells, from
the sidecars' pids and without locking anything (a probe holding a lock for a moment would refuse a
run starting then), whether another run is writing a results file in the same folder: the env file
they share is not taken back then.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from treebench.harness.errors import ConfigError

try:
    import fcntl
except ImportError:  # pragma: no cover -- Windows
    fcntl = None  # type: ignore[assignment]


def lock_path(results: Path) -> Path:
    """The sidecar of a results file: `rows.jsonl` -> `rows.jsonl.lock`."""
    return Path(f"{results}.lock")


def _holder(fd: int) -> str:
    """The pid written in a held sidecar ('unknown pid' when it is empty or unreadable)."""
    try:
        pid = _pid(os.pread(fd, 256, 0).decode("ascii", "replace"))
    except OSError:
        pid = None
    return f"pid {pid}" if pid is not None else "unknown pid"


def _pid(text: str) -> int | None:
    """The pid on the first line of a sidecar's `text`; None where that line holds none (yet)."""
    first = text.splitlines()[0].strip() if text.strip() else ""
    return int(first) if first.isdigit() else None


OUT_HINT = "wait for it to finish or choose another --out"   # what a refused run or check can do


def _take(path: Path, hint: str = OUT_HINT, shown: Path | str | None = None) -> int:
    """A file descriptor of `path` under an exclusive flock, `path` still naming it (hint: the
    refusal's advice; shown: the results file as the user named it, for the refusal).

    Raises:
        ConfigError: another process holds the lock.
    """
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            results = shown if shown is not None else str(path)[: -len(".lock")]
            raise ConfigError(f"results file {results} is being written by another treebench process ({holder}); "
                              f"{hint}") from None
        try:
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)   # the holder released and deleted it between our open and flock: take the new one


@contextlib.contextmanager
def hold(results: Path | str | None, hint: str = OUT_HINT, named_by: str | None = None,
         shown: Path | str | None = None) -> Iterator[None]:
    """Holds the write lock of `results` (nothing when None or where fcntl is missing); hint:
    the advice the refusal ends with (`rm` and `merge`, which take no --out, give their own);
    `named_by`: the run id a run's default results file is named after, written on the sidecar's
    second line, where a rerun finds it if the run dies holding the lock (`naming_run_id`); `shown`:
    `results` as the user named it, for the refusal.

    Raises:
        ConfigError: another process is writing `results` (one line: the file, its pid,
            what to do), or the sidecar cannot be created beside it.
    """
    if results is None or fcntl is None:
        yield
        return
    path = lock_path(Path(results))
    try:
        fd = _take(path, hint, shown)
    except OSError as e:
        raise ConfigError(f"results file {results}: cannot create its lock file {path} ({e.strerror})") from None
    try:
        os.ftruncate(fd, 0)
        text = f"{os.getpid()}\n" + (f"{named_by}\n" if named_by else "")
        os.pwrite(fd, text.encode(), 0)
        yield
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)
        os.close(fd)   # releases the flock


@contextlib.contextmanager
def hold_all(paths, named_by: dict | None = None, shown: dict | None = None) -> Iterator[None]:
    """Holds the write locks of every distinct path of `paths` (None entries skipped), in order;
    `named_by`: path -> the run id that names it, `shown`: path -> its name as given (`hold`).

    Raises:
        ConfigError: as `hold`; the locks already taken are released.
    """
    with contextlib.ExitStack() as stack:
        for p in dict.fromkeys(Path(p) for p in paths if p is not None):
            stack.enter_context(hold(p, named_by=(named_by or {}).get(p), shown=(shown or {}).get(p)))
        yield


def other_writer_beside(results: Path | str) -> bool:
    """True when a process may be writing another results file in the folder of `results`: a
    sidecar there (not `results`'s own) names a live process, or no pid yet (a lock being taken).
    False where fcntl is missing (nothing is locked). Raises nothing.

    A sidecar left by a killed holder names a dead process and does not count; one whose pid was
    reused since counts, which keeps what it protects a while longer, never less.
    """
    if fcntl is None:
        return False
    own = lock_path(Path(results)).name
    for sidecar in Path(results).parent.glob("*.jsonl.lock"):
        try:
            text = sidecar.read_text(encoding="ascii", errors="replace").strip()
        except OSError:
            continue            # released (deleted) since the folder was listed
        if sidecar.name != own and ((pid := _pid(text)) is None or _alive(pid)):
            return True
    return False


def live_writer(results: Path | str) -> int | None:
    """The pid of another process that holds, or last held, the lock of `results`, where that process
    is alive: a run or check still appending to it (a reader then sees the rows written so far).
    None where there is no sidecar, it names no pid yet, its process is gone or is this one, or fcntl
    is missing. Raises nothing."""
    pid = _sidecar_pid(results)
    return pid if pid is not None and pid != os.getpid() and _alive(pid) else None


def abandoned(results: Path | str) -> bool:
    """True when the sidecar of `results` was left by a writer that is gone: it names a pid that no
    process has (a run killed by a signal or a crash skips the release that deletes it). False where
    there is none, it names no pid yet (a lock being taken), or fcntl is missing. Raises nothing."""
    pid = _sidecar_pid(results)
    return pid is not None and not _alive(pid)


def naming_run_id(results: Path | str) -> str | None:
    """The run id the lock sidecar of `results` records on its second line (`hold`'s `named_by`): the
    run whose default results file `results` is (or a torchrun rank's file of); None where none is
    recorded, there is no sidecar, or fcntl is missing. Raises nothing."""
    lines = _sidecar_text(results).splitlines()
    return (lines[1].strip() or None) if len(lines) > 1 else None


def _sidecar_pid(results: Path | str) -> int | None:
    """The pid the lock sidecar of `results` names; None where there is none, it names no pid (yet),
    or fcntl is missing (nothing is locked then). Raises nothing."""
    return _pid(_sidecar_text(results))


def _sidecar_text(results: Path | str) -> str:
    """What the lock sidecar of `results` holds; "" where there is none or fcntl is missing. Raises nothing."""
    if fcntl is None:
        return ""
    try:
        return lock_path(Path(results)).read_text(encoding="ascii", errors="replace")
    except OSError:
        return ""


def _alive(pid: int) -> bool:
    """True when process `pid` exists (another user's included). Raises nothing."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (OSError, OverflowError):
        return True             # PermissionError: it exists, under another user
    return True
