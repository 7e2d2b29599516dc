"""treebench: benchmark and correctness-validation harness for tree attention over a
paged KV cache.

The one import package of the distribution. Its subpackages are the repository's
top-level folders: `treebench.harness` (the core), `treebench.backends` (adapters),
`treebench.kernels` (our Triton kernels) and `treebench.suites` (suite files).
An install maps those folders into this package (pyproject's package-dir); in a
source checkout this module adds the checkout's root to the package path, so
`PYTHONPATH=. python -m treebench ...` runs the same code without an install.

The curated public API is `treebench.harness`'s, re-exported here on first use:
`from treebench import Backend, Capabilities, register`.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import sys

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if not os.path.isdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), "harness")) \
        and os.path.isfile(os.path.join(_ROOT, "harness", "__init__.py")):
    __path__.append(_ROOT)  # noqa: F821 -- a source checkout: harness/, backends/, ... sit beside treebench/


INTERRUPTED = 130   # 128 + SIGINT, the shell's convention
TERMINATED = 143    # 128 + SIGTERM
_AT_EXIT = [False]  # whether main() has registered SIGTERM's SIG_IGN at the interpreter's exit
# The command's exit code once the CLI has returned it (None before), and whether a SIGTERM came after the
# command had ended but before its code was known here (main() then says so and returns that code).
_ENDED_CODE: list[int | None] = [None]
_ENDED_SIGTERM = [False]


def _terminated(signum, frame) -> None:
    """SIGTERM outside the CLI's command, whose own handler says what it kept. While treebench starts
    (nothing is written yet): one line on stderr, then exit 143 at once: there is nothing to finish or
    undo, and an exception raised in torch's start-up could be lost there, as a Ctrl-C's was. Once the
    command has ended (all it wrote is complete): one line saying so, then exit at once with the command's
    own code, the verdict CI reads (`_ended`); before the CLI has handed that code back, main() does both."""
    inflight = sys.modules.get("treebench.harness.run.inflight")   # not imported yet: starting
    if inflight and inflight.COMMAND_BEGUN[0]:
        if _ENDED_CODE[0] is None:
            _ENDED_SIGTERM[0] = True
            return
        _ended(_ENDED_CODE[0])
        os._exit(_ENDED_CODE[0])
    with contextlib.suppress(Exception):
        sys.stdout.flush()
    with contextlib.suppress(OSError):
        os.write(2, b"treebench: terminated (SIGTERM) while starting; nothing was written\n")
    os._exit(TERMINATED)


def _ended(code: int) -> None:
    """The line of a SIGTERM after the command had ended, naming the command's exit code `code`."""
    with contextlib.suppress(Exception):
        sys.stdout.flush()
    with contextlib.suppress(OSError):
        os.write(2, f"treebench: SIGTERM after the command had ended; exit code {code}, the command's own\n".encode())


def _guard_sigterm() -> None:
    """Sets `_terminated` as SIGTERM's handler until the CLI sets its own, and again after (the CLI puts
    back the handler it found); off the main thread, where none can be set, signals are left alone.
    From the interpreter's exit on, SIGTERM is ignored (atexit): Python's teardown (most of a second
    with torch loaded) puts back the default action, under which a SIGTERM would end the process with
    no line, and the command has ended with its exit code decided."""
    try:
        signal.signal(signal.SIGTERM, _terminated)
    except ValueError:   # not the main thread
        return
    if not _AT_EXIT[0]:
        _AT_EXIT[0] = True
        atexit.register(signal.signal, signal.SIGTERM, signal.SIG_IGN)   # no Python frame: nothing raised in it


def main() -> int:
    """The `treebench` console script: `treebench.harness.cli.main.main` (argv from sys.argv),
    with Ctrl-C during start-up (importing torch and the harness takes seconds) ending in the
    same one line and exit code 130 as Ctrl-C during a run, instead of a traceback. SIGINT is
    held from here until the CLI's imports are done (treebench.harness.run.inflight), so that
    a Ctrl-C cannot be lost inside them or leave a module half-imported. SIGTERM before the
    CLI's command begins ends the process with one line and 143; after it ended, with one line and
    the command's own exit code (`_terminated`).

    Returns:
        the CLI's exit code (0 ok, 1 failed rows or gate, 2 bad input, 130 interrupted);
        130 also when interrupted while importing.
    """
    _ENDED_CODE[0], _ENDED_SIGTERM[0] = None, False
    _guard_sigterm()   # first: importing the harness takes a tenth of a second, torch seconds
    try:
        from treebench.harness.run.inflight import COMMAND_BEGUN, hold_interrupts, release_interrupts
        COMMAND_BEGUN[0] = False
        hold_interrupts()   # released, and a Ctrl-C that came raised, at the end of the CLI's start-up
        try:
            from treebench.harness.cli.main import main as cli_main
        except BaseException:   # an import that failed (or raised KeyboardInterrupt itself) ends the hold
            release_interrupts(raise_held=False)
            raise
    except KeyboardInterrupt:
        sys.stderr.write("treebench: interrupted while starting; nothing was written\n")
        return INTERRUPTED
    code = cli_main()
    _ENDED_CODE[0] = code
    if _ENDED_SIGTERM[0]:   # a SIGTERM came while the CLI returned: said here, as `_terminated` would
        _ended(code)
    return code


def __getattr__(name: str):
    """PEP 562: the public API of treebench.harness, imported on first access."""
    import treebench.harness as api

    if name in api.__all__:
        return getattr(api, name)
    raise AttributeError(f"module 'treebench' has no attribute {name!r}")


def __dir__() -> list[str]:
    import treebench.harness as api

    return sorted(set(globals()) | set(api.__all__))
