"""The pair in flight, named where a crash can still say it; and how far the sweep got
(`PROGRESS`), for the line after an interrupt.

A backend that segfaults (or aborts, or dies of any fatal signal) outside
``--isolate`` takes the whole process with it: no Python code runs after the
signal, so no handler can print which backend on which case died. What does run
is `faulthandler` (enabled by the CLI), which writes the Python stack to stderr
from C, one line per frame::

    Fatal Python error: Segmentation fault

    Current thread 0x... (most recent call first):
      File ".../backends/....py", line 88 in prepare
      ...
      File ".../harness/run/inflight.py", line 54 in treebench crashed running backend segfaults on case
        B2-L37-full:2:2-same-bfloat16-...: rerun with --isolate to make a crash an error row and go on
      File ".../harness/run/runner.py", line 150 in run_cases

`call_in_flight` makes that happen: it runs each pair through a copy of a
one-line function whose code object is renamed to that sentence, so the frame
name faulthandler prints is the pair itself. Renaming a code object costs
microseconds, nothing is written per pair, and the line is there whatever
stderr is (a terminal, a CI log, a file).
"""

from __future__ import annotations

import faulthandler
import io
import sys
import types
from collections.abc import Callable
from typing import TypeVar

R = TypeVar("R")

ISOLATE_HINT = "rerun with --isolate to make a crash an error row and go on"
# (pairs finished, pairs this process runs) of the sweep in progress, set by the runner; None before
# it starts. The CLI's line after Ctrl-C says it where no results file holds the rows (check without --out),
# and, at 0 pairs finished, that the results file got no row of this run.
PROGRESS: list[tuple[int, int] | None] = [None]


def crash_label(backend: str, case_id: str) -> str:
    """The frame name faulthandler prints for a pair that crashed: backend, case and the hint."""
    return f"treebench crashed running backend {backend} on case {case_id}: {ISOLATE_HINT}"


def _call(fn, *args):
    return fn(*args)


def call_in_flight(backend: str, case_id: str, fn: Callable[..., R], *args) -> R:
    """`fn(*args)`, called from a frame named `crash_label(backend, case_id)`.

    Returns:
        What `fn` returns; its exceptions propagate unchanged.
    """
    label = crash_label(backend, case_id)
    code = _call.__code__.replace(co_name=label, co_qualname=label)
    return types.FunctionType(code, _call.__globals__)(fn, *args)


def enable_crash_report() -> bool:
    """Turns on faulthandler on stderr (a fatal signal prints the Python stack, in-flight pair
    included), unless it is on already (pytest turns it on) or stderr has no file descriptor.

    Returns:
        True when faulthandler is on afterwards.
    """
    if faulthandler.is_enabled():
        return True
    try:
        faulthandler.enable(file=sys.stderr)
    except (AttributeError, ValueError, io.UnsupportedOperation, RuntimeError):
        return False
    return True
