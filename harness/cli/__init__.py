"""The `treebench` command line, one module per subcommand (see treebench.harness.cli.main.main).

Here: how every subcommand's parser reads a command line. An option that takes one value or one
list (`--out FILE`, `gate --baseline A B`) is refused when given twice (argparse would keep the
last silently: `--baseline a --baseline b` would drop a), before any other error of the command
line that argparse finds after it (a required option missing); options documented to accumulate say so
with `action="append"` or `"extend"` (`rm --backend`, `tree-search --acceptance`).
"""

from __future__ import annotations

import argparse

from treebench.harness.errors import ConfigError

PROG = "treebench"
TOP_OPTIONS = ("-h", "--help", "--version")   # the only options before the command
HELP_OPTIONS = ("-h", "--help")   # `treebench COMMAND --help` prints the usage without loading torch
VALUE_OPTIONS_DASHED = ("--shard", "--threshold")  # values that may start with "-": --shard -1/2, gate --threshold -5% get a clear error


class StoreOnce(argparse.Action):
    """argparse's "store" (the action of an option without one), which also records each
    spelling it was given under in `parser.given`, for `Parser.parse_known_args` to refuse a repeat."""

    def __call__(self, parser, namespace, values, option_string=None):
        if option_string is not None:   # a positional is stored once
            parser.given.setdefault(self, []).append(option_string)
        setattr(namespace, self.dest, values)


class Parser(argparse.ArgumentParser):
    """ArgumentParser whose errors are one ConfigError line (exit 2), not usage + message, and
    whose one-value options (StoreOnce) may each be given once."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.given: dict[argparse.Action, list[str]] = {}   # a StoreOnce option -> the spellings given
        self.register("action", None, StoreOnce)
        self.register("action", "store", StoreOnce)

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[override]
        """argparse's, then a ConfigError for a StoreOnce option given more than once."""
        self.given = {}
        parsed = super().parse_known_args(args, namespace)
        self._refuse_repeats()
        return parsed

    def _refuse_repeats(self) -> None:
        """A ConfigError for the first StoreOnce option read more than once so far."""
        for action, used in self.given.items():
            if len(used) > 1:
                names = " / ".join(action.option_strings)
                raise ConfigError(f"{names} given {len(used)} times; give it once{_hint(action, used[0])}")

    def error(self, message: str):  # type: ignore[override]
        """argparse's error (a missing required option, a bad value, ...) as one ConfigError line; an
        option already read twice is refused first (`gate --baseline a --baseline b` says so before
        that --candidate is missing): mending the other error alone would meet the repeat next."""
        self._refuse_repeats()
        where = self.prog.removeprefix(PROG).strip()
        raise ConfigError(f"{where + ': ' if where else ''}{message} (see {self.prog} --help)")


def _hint(action: argparse.Action, spelling: str) -> str:
    """How to give several values, where the option takes them."""
    if action.nargs in ("+", "*"):
        return f" (list every value after one {spelling}: {spelling} A B)"
    return " (comma-separate several backends)" if "--backends" in action.option_strings else ""


def join_option_values(argv: list[str]) -> list[str]:
    """`--shard -1/2` -> `--shard=-1/2` (and `gate --threshold -5%` alike), so argparse takes the
    value (and parse_shard or the gate explains what is wrong) instead of reading it as an
    option and saying "expected one argument"."""
    out: list[str] = []
    it = iter(range(len(argv)))
    for i in it:
        a = argv[i]
        if a == "--":
            out.extend(argv[i:])
            break
        if a in VALUE_OPTIONS_DASHED and i + 1 < len(argv) and argv[i + 1].startswith("-") \
                and not argv[i + 1].startswith("--"):
            out.append(f"{a}={argv[i + 1]}")
            next(it, None)
        else:
            out.append(a)
    return out


def asks_help(argv: list[str]) -> bool:
    """Whether the command line asks for a usage (-h or --help before any `--`): no work, no torch."""
    given = argv[:argv.index("--")] if "--" in argv else argv
    return any(a in HELP_OPTIONS for a in given)
