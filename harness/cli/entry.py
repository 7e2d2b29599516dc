"""The `treebench` console script: `treebench.harness.cli.main.main`, with Ctrl-C during start-up
(importing torch and the harness takes seconds) ending in the same one line and
exit code 130 as Ctrl-C during a run, instead of a traceback."""

from __future__ import annotations

import sys

INTERRUPTED = 130   # 128 + SIGINT, the shell's convention


def main() -> int:
    """Runs `treebench` (argv from sys.argv).

    Returns:
        treebench.harness.cli.main.main's exit code (0 ok, 1 failed rows or gate, 2 bad input,
        130 interrupted); 130 also when interrupted while importing.
    """
    try:
        from treebench.harness.cli.main import main as cli_main
    except KeyboardInterrupt:
        sys.stderr.write("treebench: interrupted while starting; nothing was written\n")
        return INTERRUPTED
    return cli_main()


if __name__ == "__main__":
    raise SystemExit(main())
