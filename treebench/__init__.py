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

import os
import sys

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if not os.path.isdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), "harness")) \
        and os.path.isfile(os.path.join(_ROOT, "harness", "__init__.py")):
    __path__.append(_ROOT)  # noqa: F821 -- a source checkout: harness/, backends/, ... sit beside treebench/


INTERRUPTED = 130   # 128 + SIGINT, the shell's convention


def main() -> int:
    """The `treebench` console script: `treebench.harness.cli.main.main` (argv from sys.argv),
    with Ctrl-C during start-up (importing torch and the harness takes seconds) ending in the
    same one line and exit code 130 as Ctrl-C during a run, instead of a traceback. SIGINT is
    held from here until the CLI's imports are done (treebench.harness.run.inflight), so that
    a Ctrl-C cannot be lost inside them or leave a module half-imported.

    Returns:
        the CLI's exit code (0 ok, 1 failed rows or gate, 2 bad input, 130 interrupted);
        130 also when interrupted while importing.
    """
    try:
        from treebench.harness.run.inflight import hold_interrupts, release_interrupts
        hold_interrupts()   # released, and a Ctrl-C that came raised, at the end of the CLI's start-up
        try:
            from treebench.harness.cli.main import main as cli_main
        except BaseException:   # an import that failed (or raised KeyboardInterrupt itself) ends the hold
            release_interrupts(raise_held=False)
            raise
    except KeyboardInterrupt:
        sys.stderr.write("treebench: interrupted while starting; nothing was written\n")
        return INTERRUPTED
    return cli_main()


def __getattr__(name: str):
    """PEP 562: the public API of treebench.harness, imported on first access."""
    import treebench.harness as api

    if name in api.__all__:
        return getattr(api, name)
    raise AttributeError(f"module 'treebench' has no attribute {name!r}")


def __dir__() -> list[str]:
    import treebench.harness as api

    return sorted(set(globals()) | set(api.__all__))
