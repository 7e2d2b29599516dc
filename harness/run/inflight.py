"""The pair in flight, named where a crash can still say it, and the step it is in (`enter_step`); how far the sweep
got (`PROGRESS`), whether its results file holds a row of it yet (`UNWRITTEN`) and, once its last row is written,
whether the run's report is (`REPORT_DUE`), for the line after an interrupt; Ctrl-C held while the CLI starts
(`interrupts_held`), and noted while a report is written or the gate runs (`interrupts_noted`); a signal handler set
where one can be (`install_handler`).

A backend that segfaults (or aborts, or dies of any fatal signal) outside ``--isolate`` takes the whole process
with it: no Python code runs after the signal, so no handler can print which backend on which case died. What
does run is `faulthandler` (enabled by the CLI), which writes the Python stack to stderr from C (after a plain
line naming --isolate and --resume: treebench.harness.sweep.crash), one line per frame::

    Fatal Python error: Segmentation fault

    Current thread 0x... (most recent call first):
      File ".../backends/....py", line 88 in prepare
      ...
      File ".../harness/run/inflight.py", line 54 in treebench crashed running backend segfaults on case
        B2-L37-full:2:2-same-bfloat16-...: rerun with --isolate to make a crash an error row and go on
      File ".../harness/run/runner.py", line 150 in run_cases

`call_in_flight` makes that happen: it runs each pair through a copy of a one-line function whose code object is
renamed to that sentence, so the frame name faulthandler prints is the pair itself. Renaming a code object costs
microseconds, nothing is written per pair, and the line is there whatever stderr is (a terminal, a CI log, a
file).

Start-up imports torch, whose C++ start-up imports numpy and drops an exception raised there: a
KeyboardInterrupt inside it was lost (the run went on), or left numpy half-imported (error rows, an ImportError
later). So the console entry holds SIGINT from its first line (`hold_interrupts`): a Ctrl-C is only recorded,
and `interrupts_held` raises it as a KeyboardInterrupt once the imports are done, where the CLI says it stopped
while starting.

A run's report loads pandas and matplotlib (the gate numpy and scipy), whose start-up drops an exception raised
there alike: a Ctrl-C then becomes an ImportError ("initialization failed"), or is lost, and one raised in a
weakref callback or a `__del__` while the page is made is only printed ("Exception ignored in ..."). So a run's
report, `treebench report` and `treebench gate` do that work inside `interrupts_noted`: a Ctrl-C raises
KeyboardInterrupt as ever, stopping the work at once, and is also noted, and the block's end raises it again
wherever it was lost or turned into another exception. SIGTERM alike: the CLI's handler raises its stop and
records it in `STOP_REQUESTED`, which the runner raises after the pair in flight, `interrupts_noted` at its
block's end and the CLI once the command ends (`stops_raised`), wherever the first raise was lost.

A backend may raise KeyboardInterrupt itself (a library's misuse of it). The runner wraps SIGINT's handler
(`sigints_noted`) so that `signal_stop` tells a Ctrl-C's from that one, which is the pair's error row;
a Ctrl-C a backend swallowed stops the sweep after its pair (SIGINT_CAME).
"""

from __future__ import annotations

import contextlib
import faulthandler
import io
import os
import shlex
import signal
import sys
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

from treebench.harness.store.outputs import ENV_NOTE, Output, will_write

R = TypeVar("R")

ISOLATE_HINT = "rerun with --isolate to make a crash an error row and go on"
# (pairs finished, pairs this process runs) of the sweep in progress, set by the runner; None before
# it starts. The CLI's line after Ctrl-C says it where no results file holds the rows (check without --out),
# and, at 0 pairs finished, that the results file got no row of this run (`unwritten_note`).
PROGRESS: list[tuple[int, int] | None] = [None]
# The results file of the run or check in progress as it was before any row of it: (path, None for a default
# path not made yet; size in bytes, None where there is no file), set by the CLI (`mark_unwritten`); None
# where no run or check is in progress, or rows are written elsewhere (a --gpus launch's ranks).
UNWRITTEN: list[tuple[Path | None, int | None] | None] = [None]
# The report of a run whose sweep is over: (its results file, the report as `will_write` noted it, the flags
# besides --out that a --resume needs to write that report), set by the CLI (`report_due`); None before the
# sweep is over, and in a command that writes no report.
REPORT_DUE: list[tuple[Path, Output, str] | None] = [None]
# The stop a signal handler raised (the CLI's SIGTERM), recorded too, since code in its way can lose the raise
# (a backend's own except, a weakref callback or a `__del__`, where Python only prints it): raised again by the
# runner after the pair in flight and at the end of `stops_raised`; None where none came.
STOP_REQUESTED: list[BaseException | None] = [None]
# Whether a SIGINT came to the runner's handler (`sigints_noted`) in the sweep in progress: a KeyboardInterrupt
# is then a Ctrl-C's (`signal_stop`), and the runner raises one after the pair in flight where a backend swallowed it.
SIGINT_CAME: list[bool] = [False]
_WRAPPED: list = []   # while the runner notes SIGINTs: [the handler it wraps]
# Whether the CLI's command has begun (set with its SIGTERM handler): the console entry's SIGTERM handler, in place
# before and after it, says "while starting" before (143), and that the command had ended after (its own code).
COMMAND_BEGUN: list[bool] = [False]
CRASH_REPORT_OURS: list[bool] = [False]   # whether `enable_crash_report` turned faulthandler on (not pytest)
# Hears each step a pair enters (`enter_step`); None but in an --isolate worker, where it tells the parent.
STEP_LISTENER: list[Callable[[str], None] | None] = [None]
_HELD: list = []   # while SIGINT is held: [the handler the hold replaced, whether a SIGINT came]


def crash_label(backend: str, case_id: str) -> str:
    """The frame name faulthandler prints for a pair that crashed: backend, case and the hint."""
    return f"treebench crashed running backend {backend} on case {case_id}: {ISOLATE_HINT}"


def _call(fn, *args):
    return fn(*args)


def call_in_flight(backend: str, case_id: str, fn: Callable[..., R], *args) -> R:
    """`fn(*args)` (its result; its exceptions unchanged), called from a frame named `crash_label(backend, case_id)`."""
    label = crash_label(backend, case_id)
    code = _call.__code__.replace(co_name=label, co_qualname=label)
    return types.FunctionType(code, _call.__globals__)(fn, *args)


def enter_step(row: dict, step: str) -> None:
    """Sets `row`'s `failed_step` to `step` (checking.default_check.FAILED_STEPS), the step its pair now
    enters: an exception the caller makes an error row keeps it, and STEP_LISTENER hears it (an --isolate
    worker's parent names it in the row of a worker that dies or times out there: run.isolate)."""
    row["failed_step"] = step
    if STEP_LISTENER[0] is not None:
        STEP_LISTENER[0](step)


def mark_unwritten(path: str | Path | None) -> None:
    """Records the results file `path` (None: a default path not made yet) and its size now in UNWRITTEN: as it was
    before the run or check in progress wrote to it."""
    UNWRITTEN[0], ENV_NOTE[0] = (None if path is None else Path(path), _size(path)), ""


def _size(path: str | Path | None) -> int | None:
    """The size in bytes of the file at `path`; None for no path or no file there."""
    try:
        return None if path is None else os.stat(path).st_size
    except OSError:
        return None


def unwritten_note(shown: Path | None = None) -> str | None:
    """What the line after an interrupt says of the results file of a run or check that no row of
    it has reached (UNWRITTEN; PROGRESS at no pair finished, or the runner not started): "nothing was
    written" where there is no file, "PATH is left as it was" (`shown`, as given; + `outputs.ENV_NOTE`) where it
    has the size it had then.

    Returns:
        That note; None where no run or check is in progress, or the file changed or got a row.
    """
    if UNWRITTEN[0] is None or (PROGRESS[0] is not None and PROGRESS[0][0] > 0):
        return None
    path, size = UNWRITTEN[0]
    if _size(path) != size:
        return None
    return "nothing was written" if size is None else f"{shown or path} is left as it was{ENV_NOTE[0]}"


def pairs_done() -> str:
    """' after N of M pairs' of the sweep in progress (PROGRESS), '' before its runner started."""
    from treebench.harness.run.progress import plural   # loads rich: not at start-up

    return "" if (done := PROGRESS[0]) is None else f" after {done[0]} of {plural(done[1], 'pair')}"


def kept_rows(out: Path, run_ids: tuple[str, ...], then: str, held: Path | None = None, flags: str = "") -> str:
    """Where the rows written so far are kept and how to finish or remove them: " in HELD, run_id A, B; THEN the
    same command with FLAGS --out OUT --resume, or remove them with treebench rm HELD --run-id A B" (no run id: no
    such clause; `flags`: " --isolate" or ""); `held` (default `out`) holds the rows: a rank's file not merged yet."""
    rank_file = held not in (None, out)
    resume = f"{then} the same command with{flags} --out {shlex.quote(str(out))} --resume" + (
        f" (it merges {held} into {out}; unset RANK and WORLD_SIZE first where no torchrun launched this command)"
        if rank_file else "")
    where = f"{held} (--out {out}'s rank file, not merged yet)" if rank_file else out
    if not run_ids:
        return f" in {where}; {resume}"
    return (f" in {where}, run_id {', '.join(run_ids)}; {resume}, or remove them with treebench rm "
            f"{shlex.quote(str(held or out))} --run-id {' '.join(run_ids)}")


def report_due(out: str | Path, report: str | Path, resume_flags: str = "", shown: str | Path | None = None) -> None:
    """Notes in REPORT_DUE that every row of the run in progress is in `out` and that its report
    `report` comes next, named `shown` in the line (default `report`); `resume_flags` (" --report PATH"
    or "") are what a --resume needs besides --out to write that report."""
    REPORT_DUE[0] = (Path(out), will_write(report, "the report", shown=shown), resume_flags)


def report_note() -> str | None:
    """What the line after an interrupt says once the run's sweep is over (REPORT_DUE): " after this
    run's last row; its rows are kept in OUT; the report R was written", or, not written, "...; the
    report R was not written; to write it, run treebench report OUT -o R, or the same command with
    --out OUT --resume".

    Returns:
        That note; None before the sweep is over (REPORT_DUE unset).
    """
    if REPORT_DUE[0] is None:
        return None
    out, report, flags = REPORT_DUE[0]
    kept = f" after this run's last row; its rows are kept in {out}"
    if report.changed():
        return f"{kept}; {report.written}"
    quoted = shlex.quote(str(out))
    return (f"{kept}; {report.unchanged}; to write it, run treebench report {quoted} -o {shlex.quote(str(report.shown))}, "
            f"or the same command with --out {quoted}{flags} --resume")


def enable_crash_report() -> bool:
    """Turns on faulthandler on stderr (a fatal signal prints the Python stack, in-flight pair
    included), unless it is on already (pytest turns it on) or stderr has no file descriptor;
    CRASH_REPORT_OURS says whether it was turned on here.

    Returns:
        True when faulthandler is on afterwards.
    """
    if faulthandler.is_enabled():
        return True
    try:
        faulthandler.enable(file=sys.stderr)
    except (AttributeError, ValueError, io.UnsupportedOperation, RuntimeError):
        return False
    CRASH_REPORT_OURS[0] = True
    return True


def install_handler(signum: int, handler) -> tuple[bool, object]:
    """`signal.signal(signum, handler)` where a handler can be set: (True, the handler it replaced, None for one
    set outside Python); a signal ignored (SIG_IGN: SIGINT under a non-interactive shell's `&`) stays ignored, and off
    the main thread (an embedding application) none can be set: (False, None). Raises nothing of its own."""
    try:
        return (False, None) if signal.getsignal(signum) == signal.SIG_IGN else (True, signal.signal(signum, handler))
    except ValueError:   # not the main thread
        return False, None


def hold_interrupts() -> bool:
    """Holds SIGINT: from now until `release_interrupts`, a Ctrl-C only records that it came.
    Nothing changes when it is held already, or off the main thread (no handler can be set there).

    Returns:
        True when SIGINT is held afterwards.
    """
    if _HELD:
        return True
    installed, previous = install_handler(signal.SIGINT, _record)
    if not installed:
        return False
    _HELD[:] = [previous, False]
    return True


def _restore_sigint(previous) -> None:
    """Puts back a SIGINT handler that `signal.signal` returned: Python's own where it was None
    (a handler set outside Python). Raises ValueError off the main thread."""
    signal.signal(signal.SIGINT, signal.default_int_handler if previous is None else previous)


def _record(signum, frame) -> None:
    """The SIGINT handler while held: notes that a Ctrl-C came."""
    if _HELD:
        _HELD[1] = True


def release_interrupts(raise_held: bool = True) -> None:
    """Ends the hold, if any: puts back the SIGINT handler it replaced (Python's own where none
    was set from Python), so that a later Ctrl-C acts as ever.

    Raises:
        KeyboardInterrupt: a SIGINT came while held (and `raise_held`).
    """
    if not _HELD:
        return
    try:
        _restore_sigint(_HELD[0])
    finally:
        came = _HELD[1]
        _HELD.clear()
    if came and raise_held:
        raise KeyboardInterrupt


@contextlib.contextmanager
def interrupts_held() -> Iterator[None]:
    """SIGINT held for the with-block (`hold_interrupts`; a hold already in place, the console
    entry's, goes on), released at its end whoever began it. A Ctrl-C that came meanwhile is
    raised there; an exception leaving the block puts the handler back and goes on unchanged.

    Raises:
        KeyboardInterrupt: a SIGINT came while held, and the block ended without an exception.
    """
    hold_interrupts()
    try:
        yield
    except BaseException:
        release_interrupts(raise_held=False)
        raise
    release_interrupts()


def _note_sigint(signum, frame) -> None:
    """The runner's SIGINT handler: notes that a SIGINT came, then acts as the handler it wraps."""
    SIGINT_CAME[0] = True
    (_WRAPPED[0] if _WRAPPED else signal.default_int_handler)(signum, frame)


@contextlib.contextmanager
def sigints_noted() -> Iterator[None]:
    """The with-block with SIGINT's handler wrapped so that each SIGINT is also noted in SIGINT_CAME
    (reset here), for `signal_stop`. A handler that is not a Python function (ignored, the default
    action, one set outside Python) is left as it is, and so is every handler off the main thread."""
    SIGINT_CAME[0] = False
    wrapped = signal.getsignal(signal.SIGINT)
    if not callable(wrapped) or wrapped is _note_sigint or not install_handler(signal.SIGINT, _note_sigint)[0]:
        yield
        return
    _WRAPPED[:] = [wrapped]
    try:
        yield
    finally:
        _WRAPPED.clear()
        with contextlib.suppress(ValueError):
            signal.signal(signal.SIGINT, wrapped)


def signal_stop(e: BaseException) -> bool:
    """Whether `e`, raised in a backend's call, stops the sweep: a KeyboardInterrupt that a signal may have
    raised (a Ctrl-C, SIGTERM's stop). One that no signal can have raised is the backend's error row: no
    SIGINT came while `sigints_noted` noted them, or SIGINT raises nothing here (ignored, as in an isolated
    worker, or its default action); under any other SIGINT handler it is taken as a Ctrl-C, as ever."""
    if not isinstance(e, KeyboardInterrupt):
        return False
    if STOP_REQUESTED[0] is not None or SIGINT_CAME[0]:
        return True
    handler = signal.getsignal(signal.SIGINT)
    return not (handler is _note_sigint or handler in (signal.SIG_IGN, signal.SIG_DFL))


def raise_stop(cause: BaseException | None = None) -> None:
    """Raises the stop a signal handler recorded (STOP_REQUESTED), if any, chained to `cause`."""
    stop = STOP_REQUESTED[0]
    if stop is not None:
        raise stop from cause


@contextlib.contextmanager
def stops_raised() -> Iterator[None]:
    """The with-block, and at its end the stop a signal handler recorded (STOP_REQUESTED) raised again
    where the raise in the block was lost: dropped by code that catches it, raised in a weakref callback
    or a `__del__` (where Python only prints it: such a stop is no longer printed), or turned into
    another error (the stop is chained to it).

    Raises:
        BaseException: the recorded stop (the CLI's Terminated), when one came.
    """
    def unraisable(args) -> None:
        if STOP_REQUESTED[0] is None or args.exc_value is not STOP_REQUESTED[0]:
            hook(args)

    hook, sys.unraisablehook = sys.unraisablehook, unraisable
    try:
        yield
    except Exception as e:
        raise_stop(e)
        raise
    finally:
        sys.unraisablehook = hook
    raise_stop()


@contextlib.contextmanager
def interrupts_noted() -> Iterator[None]:
    """A SIGINT in the with-block raises KeyboardInterrupt as Python's own handler does, and is
    noted: the block's end raises KeyboardInterrupt when one came, whatever became of the first
    (caught and dropped, turned into an ImportError, raised in a weakref callback or a `__del__`,
    where Python only prints it: such a KeyboardInterrupt is no longer printed). A SIGTERM's stop
    lost in the block is raised at its end alike (`stops_raised`). Off the main thread (no handler
    can be set there) the block runs as it is.

    Raises:
        KeyboardInterrupt: a SIGINT came in the block (chained to the exception leaving it, if any),
            or the stop a SIGTERM's handler recorded (STOP_REQUESTED).
    """
    came: list[bool] = []

    def note(signum, frame) -> None:
        came.append(True)
        raise KeyboardInterrupt

    def unraisable(args) -> None:   # a KeyboardInterrupt that Python could not raise is noted already
        if not (came and isinstance(args.exc_value, KeyboardInterrupt)):
            hook(args)

    with stops_raised():
        installed, previous = install_handler(signal.SIGINT, note)
        if not installed:
            yield
            return
        hook, sys.unraisablehook = sys.unraisablehook, unraisable
        try:
            yield
        except BaseException as e:
            if came and not isinstance(e, KeyboardInterrupt):
                raise KeyboardInterrupt from e
            raise
        finally:
            _restore_sigint(previous)
            sys.unraisablehook = hook
        if came:
            raise KeyboardInterrupt
