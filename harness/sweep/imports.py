"""The user's backends (a file or a module: `loading.from_user_code`) loaded for a `run` or `check`.

Under --isolate each is loaded first in a worker process, the prober: one whose loading ends that
process (os._exit, sys.exit, a crash such as SIGSEGV) or hangs it becomes `UnloadedBackend`, whose
every pair is an ``error`` row with ``failed_step`` "import" (nothing of it runs), and the sweep
goes on with the other backends; a dry run counts those pairs as errors to come, not as pairs to run
(treebench.harness.run.runner.plan_pairs). `check` without --suite has no pair of it: its default
check is built from the capabilities the backend declares, so one line says the backend could not
be loaded, nothing is written, and it exits 1 (treebench.harness.cli.check). The rest are then
loaded in this process as without --isolate.

Protocol (multiprocessing, spawn context, as treebench.harness.run.isolate's workers)::

    parent                                   prober (probe_main)
      start(specs, output file) ────────────▶  its stdout and stderr go to the output file;
                                               imports the harness and the built-in backends
      ◀──────────────────────────── ("ready",)
                                               load_backend(spec), one spec after the other
      ◀────────── ("loaded", i, None | reason)  reason: its loading called sys.exit or os._exit
      ...                                      exits after the last

A prober that dies (a signal, an exit) or stays silent past the time limit (START_TIMEOUT_S for its
start, then --case-timeout, none where that is past run.config.MAX_WAIT_S, else START_TIMEOUT_S, per
spec) is blamed on the spec it was loading, with the last line it wrote; a fresh prober loads the
specs after that one. A spec whose loading raised (a missing file, no backend class) is loaded again
here, where that is bad input (exit 2).

Outside --isolate, a backend whose loading calls os._exit or sys.exit is bad input
(`loading._as_its_own_program`), and one that crashes this process gets a line naming it and
--isolate before faulthandler's stack (treebench.harness.sweep.crash.crash_advice).
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import signal
import tempfile
import time
from collections.abc import Sequence
from multiprocessing.connection import Connection, wait
from pathlib import Path

from treebench.harness.run.config import wait_s
from treebench.harness.run.isolate import CLOSE_TIMEOUT_S, START_TIMEOUT_S, describe_exit, die_with_parent
from treebench.harness.run.loading import (ExitAtLoad, from_user_code, load_backend, load_one, registered_backends,
                                           resolve_backends)
from treebench.harness.run.pair import ImportFailed
from treebench.harness.sweep.crash import crash_advice

log = logging.getLogger(__name__)

OUTPUT_TAIL_CHARS = 200   # of the prober's last line of output, quoted in the reason of a spec that ended it


class UnloadedBackend:
    """Stands in for the backend `spec` named, whose loading ended or hung the prober (`reason`):
    named by the spec as given; every pair an error row (`availability` gives ImportFailed)."""

    def __init__(self, spec: str, reason: str) -> None:
        self.name, self.reason = spec, reason

    def availability(self) -> ImportFailed:
        return ImportFailed(self.reason)

    def supports(self, case) -> None:
        return None

    def prepare(self, inputs):
        raise RuntimeError(self.reason)


# ---- the prober --------------------------------------------------------------------------


def probe_main(conn: Connection, specs: list[str], output: str, parent_pid: int) -> None:
    """A prober: its output into the file `output`, then ("ready",), then ("loaded", i, reason) for
    each of `specs` in turn, `reason` None unless loading it called sys.exit or os._exit."""
    die_with_parent(parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # the parent decides when it stops
    fd = os.open(output, os.O_WRONLY | os.O_APPEND)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    registered_backends()   # the built-in adapters imported first: their import is not a spec's
    conn.send(("ready",))
    for i, spec in enumerate(specs):
        reason = None
        try:
            load_backend(spec)
        except ExitAtLoad as e:
            reason = e.detail
        except BaseException:  # noqa: BLE001 -- loaded again in the parent, which reports it as bad input
            pass
        conn.send(("loaded", i, reason))
    conn.close()


# ---- the parent --------------------------------------------------------------------------


def _last_line(output: Path) -> str:
    """' (its last output: LINE)' for the prober's output file's last non-empty line, else ''."""
    try:
        with open(output, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - 4 * OUTPUT_TAIL_CHARS))
            lines = [ln.strip() for ln in f.read().decode(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return f" (its last output: {lines[-1][-OUTPUT_TAIL_CHARS:]})" if lines else ""


def _probe_some(specs: list[str], case_timeout_s: float | None, output: Path,
                dead: dict[str, str]) -> int | None:
    """Loads `specs` in one prober, adding to `dead` each whose loading exited (and the one that ended
    or hung the prober); returns how many specs it got through (the rest go to a fresh prober), None
    where the prober did not start."""
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe(duplex=True)
    proc = ctx.Process(target=probe_main, args=(child, specs, str(output), os.getpid()),
                       name="treebench-prober", daemon=True)
    proc.start()
    child.close()   # the parent keeps one end: a dead prober reads as EOF
    try:
        if not wait([parent, proc.sentinel], START_TIMEOUT_S) or not parent.poll():
            return None
        parent.recv()
        for i, spec in enumerate(specs):
            limit = case_timeout_s or START_TIMEOUT_S
            ready = wait([parent, proc.sentinel], wait_s(limit))   # past MAX_WAIT_S: no limit
            with contextlib.suppress(EOFError, OSError):
                if parent in ready:
                    _, _, reason = parent.recv()
                    if reason:
                        dead[spec] = reason
                    continue
            if ready:   # died: its exit status, once it has exited
                proc.join(CLOSE_TIMEOUT_S)
                how = "ended the worker process it was loaded in with " + describe_exit(proc.exitcode)
            else:
                which = "--case-timeout" if case_timeout_s else "a worker's start-up limit"
                how = f"did not end within {limit:g}s ({which}) in the worker process it was loaded in, which was killed"
            dead[spec] = f"loading it {how}{_last_line(output)}"
            return i + 1
        return len(specs)
    except (EOFError, OSError):
        return None
    finally:
        parent.close()
        if proc.is_alive():
            proc.kill()
        proc.join()


def probe(specs: Sequence[str], case_timeout_s: float | None = None) -> dict[str, str]:
    """spec -> why, for each of `specs` whose loading in a prober ended or hung it (or called sys.exit
    or os._exit); a prober that does not start leaves the specs it had not loaded to this process
    (a warning says so). Raises nothing of its own."""
    dead: dict[str, str] = {}
    left, t0 = list(dict.fromkeys(specs)), time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="treebench-prober-") as folder:
        output = Path(folder) / "output.txt"
        while left:
            output.write_bytes(b"")
            done = _probe_some(left, case_timeout_s, output, dead)
            if done is None:
                log.warning("could not load %s in a worker process first (it did not start%s); loading %s here",
                            ", ".join(left), _last_line(output), "them" if len(left) > 1 else "it")
                break
            left = left[done:]
    log.debug("loaded %d backend(s) in a worker process first in %.2f s", len(specs), time.perf_counter() - t0)
    return dead


def _crash_line(spec: str) -> str:
    """The line before faulthandler's stack when loading `spec` crashes this process."""
    return (f"treebench: loading backend {spec} crashed the process (the stack below shows where); nothing was "
            "written; rerun with --isolate to make its pairs error rows and go on with the other backends")


def load_backends(names: Sequence[str] | None, option: str, isolate: bool,
                  case_timeout_s: float | None = None, warn: bool = True) -> list:
    """`loading.resolve_backends(names, option)`, each of the user's backends among `names` loaded
    first in a prober where `isolate` (one whose loading ended or hung it: an UnloadedBackend, with a
    warning naming it and saying its pairs are error rows, unless not `warn`: the caller says what
    becomes of it), and loaded here under the line that names it if it crashes this process.

    Raises:
        ConfigError: as resolve_backends.
    """
    mine = [n for n in names or () if from_user_code(n)]
    dead = probe(mine, case_timeout_s) if isolate and mine else {}
    for spec, why in dead.items() if warn else ():
        log.warning("%s %r: %s; its pairs are error rows (failed_step %s)", option, spec, why, ImportFailed.step)

    def load(spec: str, opt: str):
        if spec in dead:
            return UnloadedBackend(spec, dead[spec])
        with crash_advice([_crash_line(spec)] if spec in mine else None):
            return load_one(spec, opt)

    return resolve_backends(names, option, load)
