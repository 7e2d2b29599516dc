"""Isolated runs: each (case, backend) pair in a worker subprocess, so that no
backend can take the sweep down.

Protocol (multiprocessing, spawn context, one duplex pipe per worker)::

    parent                                   worker (worker_main)
      start ──────────────────────────────▶  imports, sets its CUDA device
      ◀─────────────── ("ready", pid)
      Task(case axes, backend spec, name,
           device, RunConfig) ────────────▶  builds inputs and reference (cached
                                             per case), runs the backend, compares,
                                             times: treebench.harness.run.pair.run_case_backend
      shared int (read if it dies) ◀──────── the step the pair entered (inflight.enter_step)
      ◀────── ("row", row, context_lost)
      ...
      None ───────────────────────────────▶  exits

The parent waits at most ``case_timeout_s`` for each row (None, or past config.MAX_WAIT_S: no
limit). A worker that does not answer in time is killed (SIGKILL) and the pair becomes an
``error`` row "timed out after Ns"; a worker that dies (os._exit, SIGSEGV, the OOM killer)
becomes an error row naming its exit code or signal (read once it has exited, not
SIGKILLed while it exits); either row's ``failed_step`` is the step the worker was in, read
from the shared int (WORKER_TIMED_OUT or WORKER_DIED where its pair had entered none).
Whatever a backend raises, any BaseException, is its row's
reason, and so is whatever else escapes a task: the worker answers and goes on, back in
the directory it started in (a backend may os.chdir). A worker that catches a
CUDA error that poisons its context (an illegal memory access is sticky: every
later CUDA call in that process fails) sends its row flagged ``context_lost``
and exits. In every case the next pair gets a fresh worker.

A backend travels to its worker as a spec string (a registry name or the
``--backend`` text the CLI loaded it from, kept in the instance's
``treebench_spec`` attribute) or, failing that, as the pickled instance, with the name the
parent's instance has: the error row of a pair whose worker cannot load the backend (failed_step
import) carries that name, as the backend's other rows do, not the spec.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import logging
import multiprocessing
import os
import signal
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from multiprocessing.reduction import ForkingPickler

import torch

from treebench.harness.checking.default_check import FAILED_STEPS, IMPORT, WORKER_DIED, WORKER_TIMED_OUT
from treebench.harness.model.cases import Case
from treebench.harness.run.inflight import STEP_LISTENER
from treebench.harness.run.pair import CaseData, base_row, error_reason, run_case_backend
from treebench.harness.run.config import RunConfig, wait_s
from treebench.harness.run.loading import SPEC_ATTR

log = logging.getLogger(__name__)

START_TIMEOUT_S = 300.0               # imports + CUDA init of a fresh worker (not counted in the case limit)
CLOSE_TIMEOUT_S = 5.0                 # a worker asked to exit gets this long before SIGKILL
EXIT_CONTEXT_LOST = 3                 # exit code of a worker leaving after a sticky CUDA error
PR_SET_PDEATHSIG = 1                  # prctl option (linux/prctl.h): signal sent to us when the parent dies
CONTEXT_LOST_MARKERS = (              # CUDA errors after which a context cannot be used again
    "illegal memory access", "unspecified launch failure", "device-side assert", "misaligned address",
    "illegal instruction", "an illegal address", "cuda error: unknown error", "context is destroyed",
)


@dataclass(frozen=True)
class Task:
    """One pair for a worker."""

    case_axes: dict      # Case fields; the worker rebuilds the Case
    backend: object      # spec string (registry name, pkg.mod:Class, path.py:Class) or a picklable instance
    name: str            # the name the parent's instance has: what the rows the worker makes without one carry
    device: str          # torch device of the pair's inputs
    config: RunConfig    # the run's config, without a store path (the parent appends rows)


def backend_spec(backend) -> object:
    """What a worker needs to rebuild `backend`: its spec string, its registry name, or the instance itself."""
    spec = getattr(backend, SPEC_ATTR, None)
    if isinstance(spec, str):
        return spec
    from treebench.harness.adapter.contract import REGISTRY

    name = getattr(backend, "name", None)
    if isinstance(name, str) and REGISTRY.get(name) is type(backend):
        return name
    return backend


# ---- the worker --------------------------------------------------------------------------


def context_lost(row: dict, device: torch.device) -> bool:
    """True when the worker's CUDA context is unusable after `row`: the error names a sticky CUDA
    fault, or a device synchronize now fails."""
    reason = (row.get("reason") or "").lower() if row.get("status") == "error" else ""
    if any(m in reason for m in CONTEXT_LOST_MARKERS):
        return True
    if device.type != "cuda" or not torch.cuda.is_initialized():
        return False
    try:
        torch.cuda.synchronize(device)
    except Exception:  # noqa: BLE001 -- any failure here means the context is gone
        return True
    return False


class _WorkerState:
    """A worker's caches: backend instances by spec, and the current case's inputs and references."""

    def __init__(self):
        self.backends: dict[str, object] = {}
        self.data: CaseData | None = None

    def backend(self, spec):
        """The instance for `spec` (loaded once per worker)."""
        if not isinstance(spec, str):
            return spec
        if spec not in self.backends:
            from treebench.harness.run.loading import load_backend

            self.backends[spec] = load_backend(spec)
        return self.backends[spec]

    def case_data(self, case: Case) -> CaseData:
        if self.data is None or self.data.case != case:
            self.data = CaseData(case)
        return self.data

    def serve(self, task: Task) -> tuple[dict, bool]:
        """(row, context lost) for one task; never raises for a backend's fault."""
        case, device = Case(**task.case_axes), torch.device(task.device)
        try:
            backend = self.backend(task.backend)
        except BaseException as e:  # noqa: BLE001 -- a backend that cannot load in the worker is its
            # error row (SIGINT is ignored here: no KeyboardInterrupt is a Ctrl-C's)
            row = _error_row(task.name, case, task.config,
                             "loading the backend in the worker: " + error_reason(e), IMPORT)
            return row, False
        row = run_case_backend(backend, case, self.case_data(case), None, device, task.config)
        lost = context_lost(row, device)
        if lost and row["status"] != "error":  # the fault surfaced only at the check's synchronize
            row.update(status="error", reason="the device failed after the backend ran (an asynchronous CUDA fault)")
        if lost:
            row["reason"] += " (CUDA context lost: the worker exits, the next case gets a fresh one)"
        return row, lost


def die_with_parent(parent_pid: int) -> None:
    """Linux: asks the kernel to SIGKILL this worker when its parent dies (a SIGKILLed sweep must
    not leave a hung worker holding a GPU); exits at once if the parent is already gone."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        return  # not Linux: the worker still exits on EOF when idle
    if os.getppid() != parent_pid:
        os._exit(1)


def _failed_row(task: Task, e: BaseException) -> dict:
    """The error row of a task whose serving raised `e` (no backend exception gets this far:
    run_case_backend makes those rows; this is the worker's own failure around it)."""
    return _error_row(task.name, Case(**task.case_axes), task.config,
                      "the isolated worker failed: " + error_reason(e))


def _restore_cwd(cwd: str) -> None:
    """Changes back to `cwd` when a backend changed the worker's working directory (os.chdir in
    prepare): the next task's backend spec (path/file.py:Class) is relative to the sweep's. Raises nothing."""
    try:
        if os.getcwd() == cwd:
            return
    except OSError:   # the directory it moved to is gone
        pass
    with contextlib.suppress(OSError):
        os.chdir(cwd)


def _report_steps(step: ctypes.c_int) -> None:
    """Makes each step a pair enters (`inflight.enter_step`) the value of the shared int `step`, its
    index in FAILED_STEPS (-1 for one not there), which the parent reads if this worker dies."""
    def heard(name: str) -> None:
        step.value = FAILED_STEPS.index(name) if name in FAILED_STEPS else -1
    STEP_LISTENER[0] = heard


def worker_main(conn: Connection, device: str, log_level: int, parent_pid: int | None = None,
                step: ctypes.c_int | None = None) -> None:
    """A worker's loop: answer each Task with ("row", row, context_lost) until None or EOF; the
    step its pair is in goes into the shared int `step` (`_report_steps`), where one is given.

    Ignores SIGINT (the parent decides when workers stop), dies with its parent,
    and exits with EXIT_CONTEXT_LOST right after reporting a lost CUDA context.
    """
    if parent_pid is not None:
        die_with_parent(parent_pid)
    if step is not None:
        _report_steps(step)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(level=log_level, format="treebench worker %(process)d: %(levelname)s %(message)s")
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is not None:
        torch.cuda.set_device(dev)
    conn.send(("ready", os.getpid()))
    state, cwd = _WorkerState(), os.getcwd()
    while True:
        try:
            task = conn.recv()
        except (EOFError, OSError):
            return
        if task is None:
            return
        try:
            row, lost = state.serve(task)
        except BaseException as e:  # noqa: BLE001 -- whatever escaped is the pair's error row, not a dead worker
            row, lost = _failed_row(task, e), False
        finally:
            _restore_cwd(cwd)
        conn.send(("row", row, lost))
        if lost:
            conn.close()
            os._exit(EXIT_CONTEXT_LOST)  # skip atexit/CUDA teardown, which can hang on a poisoned context


# ---- the parent ----------------------------------------------------------------------------


def _error_row(name: str, case: Case, config: RunConfig, reason: str, step: str | None = None) -> dict:
    """An error row for backend `name` on `case`, made without running it; `step` its `failed_step`."""
    row = base_row(name, case, config)
    row.update(status="error", reason=reason, failed_step=step, timestamp=datetime.now(timezone.utc).isoformat(timespec="milliseconds"))
    return row


def describe_exit(exitcode: int | None) -> str:
    """'exit code 3', 'signal SIGSEGV (-11)' or 'an unknown exit status' for a dead worker."""
    if exitcode is None:
        return "an unknown exit status"
    if exitcode < 0:
        try:
            return f"signal {signal.Signals(-exitcode).name} ({exitcode})"
        except ValueError:
            return f"signal {-exitcode}"
    return f"exit code {exitcode}"


class WorkerStartError(RuntimeError):
    """A fresh worker died or hung before saying it was ready."""


class WorkerPool:
    """One worker subprocess at a time, restarted after a hang, a crash or a lost CUDA context.

    Attributes:
        started: workers started so far (1 + restarts).
    """

    def __init__(self, device: torch.device | str, case_timeout_s: float | None = None,
                 start_timeout_s: float = START_TIMEOUT_S):
        self.device = str(device)
        self.case_timeout_s = case_timeout_s
        self.start_timeout_s = start_timeout_s
        self.started = 0
        self._ctx = multiprocessing.get_context("spawn")
        self._proc: BaseProcess | None = None
        self._conn: Connection | None = None
        self._step = self._ctx.Value("i", -1, lock=False)   # the FAILED_STEPS index of the worker's step; -1: none

    # -- lifecycle --
    def _start(self) -> None:
        """Starts a worker and waits for its ready message.

        Raises:
            WorkerStartError: it died or stayed silent for start_timeout_s.
        """
        parent, child = self._ctx.Pipe(duplex=True)
        proc = self._ctx.Process(target=worker_main, args=(child, self.device, logging.WARNING, os.getpid(), self._step),
                                 name="treebench-worker", daemon=True)
        proc.start()
        child.close()  # the parent keeps one end, so a dead worker reads as EOF
        self._proc, self._conn = proc, parent
        self.started += 1
        if not wait([parent, proc.sentinel], wait_s(self.start_timeout_s)) or not parent.poll():
            code = self._kill()
            raise WorkerStartError(f"the worker did not start ({describe_exit(code)})")
        try:
            parent.recv()
        except (EOFError, OSError):
            raise WorkerStartError(f"the worker died while starting ({describe_exit(self._kill())})") from None

    def _kill(self) -> int | None:
        """SIGKILLs and reaps the current worker; returns its exit code."""
        proc, self._proc = self._proc, None
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        if proc is None:
            return None
        if proc.is_alive():
            proc.kill()
        proc.join()
        return proc.exitcode

    def close(self) -> None:
        """Asks the worker to exit, SIGKILLs it after CLOSE_TIMEOUT_S."""
        if self._proc is None:
            return
        assert self._conn is not None  # set with _proc
        try:
            self._conn.send(None)
        except (OSError, ValueError):
            pass
        self._proc.join(CLOSE_TIMEOUT_S)
        self._kill()

    # -- one pair --
    def run(self, backend, case: Case, device: torch.device | str, config: RunConfig) -> dict:
        """The row of `backend` on `case`, run in the worker; never raises for the backend's fault.

        Returns:
            The worker's row, or an error row: "timed out after Ns ..." (the worker
            was killed), "the worker died with signal SIGSEGV (-11) ..." or "... exit
            code N ...", "cannot send the backend to a worker ...".
        """
        spec, name = backend_spec(backend), getattr(backend, "name", type(backend).__name__)
        try:  # pickled here, before any worker starts: Connection.recv() unpickles it there
            payload = ForkingPickler.dumps(Task(case.axes, spec, name, str(device), replace(config, store_path=None)))
        except Exception as e:  # noqa: BLE001 -- pickling a user's instance can fail in many ways
            return _error_row(name, case, config,
                              f"cannot send the backend to a worker ({error_reason(e)}); "
                              "load it as --backend path/file.py:Class or package.module:Class")
        self._step.value = -1   # no step yet: the worker sets it as the pair enters each
        try:
            self._send(payload)
        except (WorkerStartError, OSError) as e:
            return _error_row(name, case, config, f"isolated worker: {e}")
        return self._answer(name, case, config)

    def _send(self, payload: bytes | memoryview) -> None:
        """Sends one pickled Task, starting a worker if none runs; a worker found dead is replaced once.

        Raises:
            WorkerStartError: a fresh worker did not start.
            OSError: the fresh worker's pipe failed too.
        """
        for attempt in range(2):
            if self._proc is None:
                self._start()
            assert self._conn is not None  # set with _proc
            try:
                self._conn.send_bytes(payload)
                return
            except OSError:
                self._kill()
                if attempt:
                    raise

    def _answer(self, name: str, case: Case, config: RunConfig) -> dict:
        """Waits for the row within the case time limit; turns a hang or a death into an error row."""
        assert self._conn is not None and self._proc is not None  # _send started a worker
        ready = wait([self._conn, self._proc.sentinel], wait_s(self.case_timeout_s))
        if self._conn in ready:
            try:
                _, row, lost = self._conn.recv()
            except (EOFError, OSError):   # died before answering: reported below, with the exit status
                self._proc.join(CLOSE_TIMEOUT_S)   # its pipe closes before it exits: not SIGKILLed mid-exit
            else:
                if lost:
                    self._kill()
                return row
        if not ready:
            self._kill()
            log.warning("%s on %s: timed out after %gs; worker killed", name, case.case_id, self.case_timeout_s)
            return _error_row(name, case, config,
                              f"timed out after {self.case_timeout_s:g}s (--case-timeout); the worker was killed",
                              self._step_in(WORKER_TIMED_OUT))
        how = describe_exit(self._kill())
        return _error_row(name, case, config,
                          f"the worker died with {how} while running the backend; a fresh worker runs the next case",
                          self._step_in(WORKER_DIED))

    def _step_in(self, none: str) -> str:
        """The step the worker's pair was in (`inflight.enter_step`), or `none` where it had entered none."""
        i = self._step.value
        return FAILED_STEPS[i] if 0 <= i < len(FAILED_STEPS) else none
