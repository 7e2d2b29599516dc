"""The `treebench` command line, one module per subcommand (see treebench.harness.cli.main.main).

Here: how every subcommand's parser reads a command line. An option that takes one value or one
list (`--out FILE`, `gate --baseline A B`) and a flag (`--json`, `--dry-run`) are refused when given
twice (argparse would keep the last silently: `--baseline a --baseline b` would drop a), and so are
-h / --help and --version (argparse would print at the first and exit 0, the repeat unread); options
documented to accumulate say so with `action="append"` or `"extend"` (`rm --backend`,
`tree-search --acceptance`); no flag counts (there is no `-vv`). Options are spelled out in full in
every subcommand: an abbreviation (`--sui` for `--suite`) is refused in one line naming the option
it may stand for (argparse would take an unambiguous prefix, which `run --gpus` would pass on to
its ranks, and which `spelling_used` could not name).

Every numeric option reads its number by one rule (`read_number`): ASCII digits 0-9, with a '-' sign
(a range check then names it) and, for a number that need not be whole, a '.' and an exponent; no '+'
sign, no '_' between digits, no full-width or other digits and no surrounding whitespace, which Python's
int() and float() take (`--gpus +1`, `--case-timeout 1_000`, `--gpus ２`, `--case-timeout ' 5'`).
A refusal is one line saying so (`NUMBER_RULE`), exit 2. Options whose value is a small grammar of
numbers (`--shard I/N`, `gate --threshold 5%`, `--step-us a+b*tokens`, whose terms may have spaces
between them) read theirs alike. Seconds are positive (`positive_seconds`), and a case time limit at least
MIN_CASE_TIMEOUT_S (`case_timeout`, `run.config`: the harness's own work on a pair counts in it).

Also here, as light as the parsers: `StdoutError`, what a failed write to standard output becomes
(`stdout_errors`), so that main() names standard output and not a file treebench writes, and `emit`,
which writes it in pieces so that a reader gone mid-output is noticed, `escape_unencodable` and
`closed_stdout_to_devnull`, which main() calls first, so that no output meets an encoding that lacks one of
its characters, or a standard output closed before the command began (`>&-`), with a traceback,
`stdout_to_devnull`, where output goes once its reader has left, and `one_line`, the line main() makes of a
refusal.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import math
import os
import re
import sys
from collections.abc import Callable, Iterator

from treebench.harness.errors import ConfigError
from treebench.harness.run.config import MAX_THREADS, MAX_WAIT_S, MIN_CASE_TIMEOUT_S

PROG = "treebench"
TOP_OPTIONS = ("-h", "--help", "--version")   # the only options before the command
HELP_OPTIONS = ("-h", "--help")   # `treebench COMMAND --help` prints the usage without loading torch
VALUE_OPTIONS_DASHED = ("--shard", "--threshold")  # values that may start with "-": --shard -1/2, gate --threshold -5% get a clear error
INTEGER = re.compile(r"-?[0-9]+")   # a whole number as every numeric option is written
NUMBER = re.compile(r"-?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")   # any other number likewise
NUMBER_RULE = "(ASCII digits 0-9, no '+', '_' or spaces)"   # what a line refusing another spelling says


def read_number(text: str, integer: bool = False) -> float:
    """`text` as float() reads it (int() where `integer`), when it is written as INTEGER or NUMBER take it;
    'inf' and 'nan' too, as float() reads them (the caller says why it refuses them).

    Raises:
        ValueError: any other text, '1_000', '１０' and ' 5' (which int() and float() read) included; an
            integer of more digits than int() reads (4300).
    """
    if not integer and text.lower().lstrip("+-") in ("inf", "infinity", "nan"):
        return float(text)
    if not (INTEGER if integer else NUMBER).fullmatch(text):
        raise ValueError(f"{text!r} is not a number {NUMBER_RULE}")
    return int(text) if integer else float(text)


def integer_option(text: str) -> int:
    """argparse type: an integer (`read_number`); its range is checked where it is used."""
    try:
        return int(read_number(text, integer=True))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer {NUMBER_RULE}") from None


def number_option(text: str) -> float:
    """argparse type: a number (`read_number`); its range is checked where it is used."""
    try:
        return read_number(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number {NUMBER_RULE}") from None


def positive_seconds(text: str) -> float:
    """argparse type: seconds > 0 (`read_number`); past MAX_WAIT_S (1e999, which float() reads as inf, too): no limit."""
    v = float("nan")
    with contextlib.suppress(ValueError):
        v = read_number(text)
    if not (v > 0 and (math.isfinite(v) or NUMBER.fullmatch(text))):   # 'inf': the message names what is no limit
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of seconds {NUMBER_RULE}, e.g. 600"
                                         + (f"; any past {MAX_WAIT_S:.0f} is no limit" if v > 0 else ""))
    return v


def case_timeout(text: str) -> float:
    """argparse type of --case-timeout: `positive_seconds`, at least MIN_CASE_TIMEOUT_S (`run.config`: the
    harness's own work on a pair counts in the limit, so a shorter one would time every pair out)."""
    v = positive_seconds(text)
    if v < MIN_CASE_TIMEOUT_S:
        raise argparse.ArgumentTypeError(f"{text!r} is under the least case time limit, {MIN_CASE_TIMEOUT_S:g} s: the "
                                         "harness's own work on a pair counts in it (inputs, reference, comparison, "
                                         f"timing); give at least {MIN_CASE_TIMEOUT_S:g}, e.g. 600")
    return v


def one_line(message: str, longest: int = 240) -> str:
    """`message` as the one line of a refusal, its ends stripped: each run of white space that holds a
    line break, a tab or other white space one space, a run of plain spaces kept as it is (a value quoted
    in the line, a suite name '   ', reads as given); every word longer than `longest` characters cut to
    its two ends around "…[N characters]…": a 10,000-character tree spec echoed back would bury the fix."""
    keep = longest // 2 - 20
    parts = re.split(r"(\s+)", message.strip())   # word, white space, word, ...
    return "".join(((p if not p.strip(" ") else " ") if i % 2 else p if len(p) <= longest else
                    f"{p[:keep]}…[{len(p) - 2 * keep} characters]…{p[-keep:]}") for i, p in enumerate(parts))


def count_option(what: str, option: str, most: int | None = None, why: str = "") -> Callable[[str], int]:
    """argparse type of `option`, a count of `what` ("thread", "GPU"): an integer >= 1 (`read_number`),
    and at most `most` where given (`why` says what a larger count does); anything else refused with one
    line naming it."""
    def count(text: str) -> int:
        try:
            v = int(read_number(text, integer=True))
        except ValueError:
            v = 0
        if v < 1:
            raise argparse.ArgumentTypeError(f"{text!r} is not a {what} count; give an integer >= 1 {NUMBER_RULE}, "
                                             f"e.g. {option} 2")
        if most is not None and v > most:
            raise argparse.ArgumentTypeError(f"{text!r} is more than {most} {what}s, the most taken ({why}); "
                                             f"give an integer from 1 to {most}, e.g. {option} 2")
        return v
    return count


# --threads of run, check and selftest: torch threads, at most MAX_THREADS (`run.config`)
thread_count = count_option("thread", "--threads", MAX_THREADS, "far more crash torch's thread pool")


WRITE_CHUNK = 1 << 16   # characters per write to stdout: one pipe buffer


class StdoutError(OSError):
    """Standard output could not be written (`> /dev/full`, a full disk under a redirect, an I/O
    error), as OSError(errno, strerror): main() says so in one line naming standard output, exit 2.
    A pipe whose reader left stays a BrokenPipeError (main() keeps its own exit code for it)."""


@contextlib.contextmanager
def stdout_errors(stream=None) -> Iterator[None]:
    """Raises an OSError of the block again as StdoutError when `stream` (default: sys.stdout) is
    standard output; a BrokenPipeError, and any error of another stream (stderr), pass as they are."""
    try:
        yield
    except OSError as e:
        if isinstance(e, (BrokenPipeError, StdoutError)) or (stream is not None and stream is not sys.stdout):
            raise
        raise StdoutError(e.errno, e.strerror) from e


def emit(text: str, stream=None) -> None:
    """Writes `text` to stdout (or `stream`) in WRITE_CHUNK pieces, each flushed. A pipe whose reader
    leaves mid-output (`treebench tree random:1000:1 | head -1`) then raises BrokenPipeError: one large
    write comes back short without an error, and Python's buffer drops the rest silently, so the command
    would exit 0 (CPython 3.11, Linux). Any other failed write to stdout is StdoutError (`stdout_errors`)."""
    stream = sys.stdout if stream is None else stream
    with stdout_errors(stream):
        for i in range(0, len(text), WRITE_CHUNK):
            stream.write(text[i:i + WRITE_CHUNK])
            stream.flush()


def escape_unencodable() -> None:
    """Sets standard output and standard error to write a character their encoding lacks as a backslash
    escape (`PYTHONIOENCODING=ascii`: gate's ❌ as \\u274c, `--help`'s µs as \\xb5s, a results path's é as
    \\xe9), as Python's stderr does by default, instead of raising UnicodeEncodeError mid-output (a traceback,
    exit 1, which reads as a failed gate). A stream that cannot be reconfigured is left as it is."""
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper):   # not a stream put in place of it (a StringIO: nothing to encode)
            with contextlib.suppress(ValueError, OSError):
                stream.reconfigure(errors="backslashreplace")


def closed_stdout_to_devnull() -> None:
    """Where the command started with file descriptor 1 closed (`treebench gate ... >&-`, for which Python
    leaves sys.stdout None), standard output is /dev/null: what it prints is dropped, as `>&-` asks, and the
    command ends with its own exit code (the gate's verdict's), never with an AttributeError's traceback."""
    if sys.stdout is None:
        sys.stdout = open(os.devnull, "w", encoding="utf-8")   # open until the process exits, as stdout is


def stdout_to_devnull() -> None:
    """Points file descriptor 1 at /dev/null once its reader has gone (a BrokenPipeError): what is left of
    stdout's buffer, and what the command prints after, is dropped there, so that neither a later print nor
    the flush at exit raises BrokenPipeError again (Python would print it and exit 120). Raises nothing."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass


class ChunkedFile:
    """A text stream whose writes go through `emit`; everything else is the stream's."""

    def __init__(self, stream) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        emit(text, self._stream)
        return len(text)

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


class _Once(argparse.Action):
    """An action that records each spelling it is given under in `parser.given` and raises ConfigError
    at its second, after the subcommand as the parser's other error lines (`run: --out given 2 times`;
    before argparse reads on: the repeat is named even where a required option is missing); the rest is
    argparse's action it comes before."""

    def __call__(self, parser, namespace, values, option_string=None):
        if option_string is not None:   # a positional is stored once
            used = parser.given.setdefault(self, [])
            used.append(option_string)
            if len(used) > 1:
                raise _given_twice(parser, self, used)
        super().__call__(parser, namespace, values, option_string)


class StoreOnce(_Once, argparse._StoreAction):
    """argparse's "store" (the action of an option without one), given once."""


class StoreTrueOnce(_Once, argparse._StoreTrueAction):
    """argparse's "store_true" (a flag: `--json`), given once."""


class StoreFalseOnce(_Once, argparse._StoreFalseAction):
    """argparse's "store_false", given once."""


class StoreConstOnce(_Once, argparse._StoreConstAction):
    """argparse's "store_const", given once."""


ONCE_ACTIONS = {None: StoreOnce, "store": StoreOnce, "store_true": StoreTrueOnce, "store_false": StoreFalseOnce,
                "store_const": StoreConstOnce}   # argparse's action name -> the one Parser registers in its place


class Parser(argparse.ArgumentParser):
    """ArgumentParser whose errors are one ConfigError line (exit 2), not usage + message, whose
    one-value options and flags (ONCE_ACTIONS) may each be given once, and which takes no
    abbreviated option (allow_abbrev off, and `--sui` named as the abbreviation it is)."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        self.given: dict[argparse.Action, list[str]] = {}   # an option of ONCE_ACTIONS -> the spellings given
        for name, action in ONCE_ACTIONS.items():
            self.register("action", name, action)

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[override]
        """argparse's, after a ConfigError for an abbreviated option (`refuse_abbreviated`) and for one that
        ends the command given twice (`refuse_repeated_exits`); an option of ONCE_ACTIONS given a second
        time raises ConfigError as argparse reaches it (`_Once`)."""
        self.given = {}
        args = sys.argv[1:] if args is None else list(args)
        self.refuse_abbreviated(args)
        self.refuse_repeated_exits(args)
        return super().parse_known_args(args, namespace)

    def _own(self, args: list[str]) -> list[str]:
        """The start of `args` this parser reads itself: up to a `--`, and in a parser of subcommands up
        to the command (its own parser reads the rest)."""
        end = next((i for i, a in enumerate(args)
                    if a == "--" or (self._subparsers is not None and not a.startswith("-"))), len(args))
        return args[:end]

    def refuse_repeated_exits(self, args: list[str]) -> None:
        """Raises ConfigError, as `_Once` does, for an option that takes no value and is not of ONCE_ACTIONS
        (-h / --help, --version: each ends the command as argparse reads it) given more than once (`-h
        --help`, `-hh` alike), read as `refuse_abbreviated` reads: argparse would print at the first and
        exit 0, never reading the repeat."""
        for action in self._actions:
            if action.nargs == 0 and action.option_strings and not isinstance(action, _Once):
                used = [o for a in self._own(args) for o in self._read_as(a) if o in action.option_strings]
                if len(used) > 1:
                    raise _given_twice(self, action, used)

    def _read_as(self, arg: str) -> list[str]:
        """The options argparse reads in `arg`: `--help=x` is --help; `-hh` is -h twice (one-letter options
        that take no value, joined), up to a letter that takes a value (`-ofile`: -o) or is none here."""
        if arg.startswith("--") or not arg.startswith("-") or len(arg) <= 2:
            return [arg.split("=", 1)[0]]
        found = []
        for letter in arg[1:]:
            action = self._option_string_actions.get(f"-{letter}")
            found.append(f"-{letter}")
            if action is None or action.nargs != 0:
                break
        return found

    def refuse_abbreviated(self, args: list[str]) -> None:
        """Raises ConfigError for the first of `args` that is a long option of no action here but the
        start of one or more (`--sui` of --suite, `--sui=seed` alike), naming them. Read up to a `--`,
        and in a parser of subcommands up to the command (its own parser reads the rest)."""
        spelled = [o for o in self._option_string_actions if o.startswith("--")]
        for a in self._own(args):
            name = a.split("=", 1)[0]
            if name.startswith("--") and name not in self._option_string_actions \
                    and (meant := sorted(o for o in spelled if o.startswith(name))):
                raise ConfigError(f"{_where(self)}{name} is abbreviated; spell the option out: "
                                  f"{' or '.join(meant)} (options are never abbreviated; see {self.prog} --help)")

    def print_help(self, file=None) -> None:
        """argparse's, written and flushed at once, a failed write raised (`stdout_errors`): argparse drops
        an OSError of its own write, so `--help > /dev/full` would print nothing and exit 0."""
        stream = sys.stdout if file is None else file
        with stdout_errors(stream):
            stream.write(self.format_help())
            stream.flush()

    def error(self, message: str):  # type: ignore[override]
        """argparse's error (a missing required option, a bad value, ...) as one ConfigError line. An
        option given twice was refused as argparse read it, before any such error (`gate --baseline a
        --baseline b` names the repeat, not the missing --candidate)."""
        raise ConfigError(f"{_where(self)}{message} (see {self.prog} --help)")


def _given_twice(parser: argparse.ArgumentParser, action: argparse.Action, used: list[str]) -> ConfigError:
    """The error of `action` given under each spelling of `used` (`run: --out given 2 times; give it once`)."""
    return ConfigError(f"{_where(parser)}{' / '.join(action.option_strings)} given {len(used)} times; give it once"
                       f"{_hint(action, used[0])}")


def _where(parser: argparse.ArgumentParser) -> str:
    """What starts each error line of `parser`: its subcommand ('run: '), nothing for the top level."""
    where = parser.prog.removeprefix(PROG).strip()
    return f"{where}: " if where else ""


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
