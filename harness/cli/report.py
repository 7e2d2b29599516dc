"""`treebench report`: its command line is treebench.harness.analyze.report's `add_arguments` and `run`
(this module names them where the cli package looks for every subcommand)."""

from treebench.harness.analyze.report import add_arguments, run

__all__ = ["add_arguments", "run"]
