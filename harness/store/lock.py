"""One writer per results file: an exclusive lock held for a whole run.

Two runs appending to one ``--out`` would interleave their rows (and their
``--resume`` views of it) without a word. A run therefore holds
``fcntl.flock(LOCK_EX | LOCK_NB)`` on a sidecar ``<out>.lock`` holding its pid,
from before its first write to after its last; a second writer finds it taken
and is refused before it writes anything. The kernel drops the lock when the
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
results file of such a writer); `live_writer` one whose writer is still at work (gate and report,
reading the file meanwhile, warn that its rows may be partial). `other_writer_beside` tells, from
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
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        text = ""
    return f"pid {text}" if text.isdigit() else "unknown pid"


OUT_HINT = "wait for it to finish or choose another --out"   # what a refused run or check can do


def _take(path: Path, hint: str = OUT_HINT) -> int:
    """A file descriptor of `path` under an exclusive flock, `path` still naming it (hint: the
    refusal's advice).

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
            results = str(path)[: -len(".lock")]
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
def hold(results: Path | str | None, hint: str = OUT_HINT) -> Iterator[None]:
    """Holds the write lock of `results` (nothing when None or where fcntl is missing); hint:
    the advice the refusal ends with (`rm` and `merge`, which take no --out, give their own).

    Raises:
        ConfigError: another process is writing `results` (one line: the file, its pid,
            what to do), or the sidecar cannot be created beside it.
    """
    if results is None or fcntl is None:
        yield
        return
    path = lock_path(Path(results))
    try:
        fd = _take(path, hint)
    except OSError as e:
        raise ConfigError(f"results file {results}: cannot create its lock file {path} ({e.strerror})") from None
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)
        os.close(fd)   # releases the flock


@contextlib.contextmanager
def hold_all(paths) -> Iterator[None]:
    """Holds the write locks of every distinct path of `paths` (None entries skipped), in order.

    Raises:
        ConfigError: as `hold`; the locks already taken are released.
    """
    with contextlib.ExitStack() as stack:
        for p in dict.fromkeys(Path(p) for p in paths if p is not None):
            stack.enter_context(hold(p))
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
        if sidecar.name != own and (not text.isdigit() or _alive(int(text))):
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


def _sidecar_pid(results: Path | str) -> int | None:
    """The pid the lock sidecar of `results` names; None where there is none, it names no pid (yet),
    or fcntl is missing (nothing is locked then). Raises nothing."""
    if fcntl is None:
        return None
    try:
        text = lock_path(Path(results)).read_text(encoding="ascii", errors="replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _alive(pid: int) -> bool:
    """True when process `pid` exists (another user's included). Raises nothing."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (OSError, OverflowError):
        return True             # PermissionError: it exists, under another user
    return True
