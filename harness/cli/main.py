"""The `treebench` command line: run | check | selftest | merge | rm | list | tree | tree-search | plan |
gate | report.

One module per subcommand (or a `common.Command` in a module that holds several),
each with ``add_arguments(parser)`` and ``run(args) -> int``; `COMMANDS` below names
them, and a subcommand's module is imported only when that subcommand runs, so
`treebench --help` imports neither torch nor the harness; `treebench COMMAND --help` imports
the command's module alone, which builds its parser without torch.

Exit codes: 0 success; 1 a result failed (a row mismatched or errored, or the
gate found a regression); 2 bad input (malformed tree, unknown backend,
unreadable suite, bad --out, bad arguments), reported as ONE line on stderr,
``treebench: error: ...``, never a traceback; 3 nothing ran: a run or check in
which every pair was skipped (backend unavailable here, case unsupported), which
proves nothing, unless --allow-skip; 130 interrupted (Ctrl-C), 143 terminated
(SIGTERM), both with the --resume hint (and the run_id of the rows a run or a
check --out wrote, which `rm --run-id` takes), or where no rows are written (a
check without --out, a dry run) saying that nothing was, after how many pairs, or in a
command that writes no rows (gate, report, rm, tree-search, ...) whether each file it
writes was written (each is written whole or not at all: treebench.harness.store.outputs); 139 (or 128 + another fatal
signal) a crash, after a line naming the backend and case in flight; 141 stdout closed (a pipe's reader
exited) before the output was written, except for run and check, which keep the exit code of their rows,
and gate and selftest, which keep their verdict's (selftest runs on to it: cli.selftest; a stdout closed
before the command began, `>&-`, is /dev/null: the command's own code). Result files are only ever appended to (except by `rm`); a results file that a run or
check created is removed again when it stops (an interrupt, an error) before its first row.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import errno
import importlib
import logging
import signal
import sys
from pathlib import Path

from treebench.harness.cli import (HELP_OPTIONS, PROG, TOP_OPTIONS, Parser, StdoutError, asks_help,
                                   closed_stdout_to_devnull, escape_unencodable, join_option_values, one_line,
                                   stdout_errors, stdout_to_devnull)
from treebench.harness.errors import ConfigError, ResultsWriteError

FULL_DISK = (errno.ENOSPC, errno.EDQUOT)   # a write that found no space: one line, exit 2

OK, FAILED, BAD_INPUT, INTERRUPTED = 0, 1, 2, 130   # exit codes (130: 128 + SIGINT, the shell's convention)
TERMINATED, BROKEN_PIPE = 143, 141                  # 128 + SIGTERM, 128 + SIGPIPE

_RUN = "correctness then timing for every case x backend; appends rows, writes a report"
_GATE = "compare two result sets: exit 1 on a significant slowdown, a correctness loss or a new failure"
_REPORT = "write an HTML report from result files"
ROW_COMMANDS = ("run", "check", "merge")   # the subcommands that write result rows
# subcommand -> (module of treebench.harness.cli[:its Command], help, extra parser settings)
COMMANDS: dict[str, tuple[str, str, dict]] = {
    "run": ("run", _RUN, {"description": _RUN[:1].upper() + _RUN[1:] + "."}),
    "check": ("check", "correctness only for one backend: exit 0 pass, 1 mismatch/error, 2 bad input, 3 nothing ran",
              {}),
    "selftest": ("selftest", "the check's power: mutants of a dense backend it must kill, variants it must pass", {}),
    "merge": ("results:MERGE", ("append result files (e.g. --shard job outputs) to OUT, dropping duplicates "
                               "(same case, backend, env, timer and L2 state)"), {}),
    "rm": ("results:RM", "remove the rows of a results file that match --run-id, --backend and --env", {}),
    "list": ("show:LIST", "backends with availability and reasons", {}),
    "tree": ("show:TREE", "print a token tree: drawing, parents, depths, mask", {}),
    "tree-search": ("speculate:TREE_SEARCH",
                    "the tree of each size maximising expected accepted tokens (Sequoia DP)", {}),
    "plan": ("speculate:PLAN", "best tree per backend, B and L for accepted tokens per ms, from stored results", {}),
    "gate": ("gate", _GATE, {"description": _GATE}),
    "report": ("report", _REPORT, {"description": _REPORT}),
}
_handler: logging.Handler | None = None  # the handler main() installed on the "treebench" logger
_AT_EXIT = [False]   # whether main() has registered `_exit_ignores_interrupts`'s atexit call


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread so that a run stops as on Ctrl-C (backends' exceptions
    are error rows; a KeyboardInterrupt is not caught by the runner)."""


def _on_sigterm(signum, frame) -> None:
    """Raises Terminated now and also records it (`inflight.STOP_REQUESTED`), in case the first
    raise is lost (a backend's compiler or worker pool catches it, or it lands in a weakref callback
    or a `__del__`, where Python only prints it): the runner raises it after the pair in flight,
    and `inflight.stops_raised` once the report is made or the command ends."""
    from treebench.harness.run.inflight import STOP_REQUESTED

    STOP_REQUESTED[0] = stop = Terminated()
    raise stop


class _Version(argparse.Action):
    """--version: prints treebench.harness.store.env.version_line() (git is asked only then) and exits 0."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, help="print the version (and git commit) and exit")

    def __call__(self, parser, namespace, values, option_string=None):
        from treebench.harness.store.env import version_line

        with stdout_errors():   # `--version > /dev/full`: one line naming standard output, exit 2
            sys.stdout.write(version_line() + "\n")
            sys.stdout.flush()
        raise SystemExit(OK)


def command(name: str):
    """The subcommand `name`: an object with add_arguments(parser) and run(args) -> int (imported now)."""
    module, _, attr = COMMANDS[name][0].partition(":")
    found = importlib.import_module(f"treebench.harness.cli.{module}")
    return getattr(found, attr) if attr else found


def build_parser(full: bool = True) -> Parser:
    """The argparse tree of every subcommand, with their arguments (full) or bare (to read which
    subcommand the command line names without importing any)."""
    parser = Parser(prog=PROG, description="Benchmark and validate tree attention over a paged KV cache.")
    parser.add_argument("--version", action=_Version)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=Parser)
    for name, (_, text, settings) in COMMANDS.items():
        if full:
            command(name).add_arguments(sub.add_parser(name, help=text, **settings))
        else:
            sub.add_parser(name, help=text, add_help=False)  # its arguments are read when it runs
    return parser


def command_parser(name: str) -> Parser:
    """The parser of subcommand `name` alone (prog "treebench NAME"), its module imported now."""
    parser = Parser(prog=f"{PROG} {name}", **COMMANDS[name][2])
    command(name).add_arguments(parser)
    return parser


def _setup_logging(quiet: bool) -> None:
    """One handler on the "treebench" logger, INFO or WARNING: rich's on the shared stderr
    console on a terminal, else plain "LEVEL message" lines (never padded or wrapped)."""
    from rich.logging import RichHandler
    from treebench.harness.cli.common import CONSOLE

    global _handler
    logger = logging.getLogger("treebench")
    if _handler is not None:
        logger.removeHandler(_handler)
    if CONSOLE.is_terminal:
        _handler = RichHandler(console=CONSOLE, show_time=False, show_path=False, markup=False)
    else:
        _handler = logging.StreamHandler()   # sys.stderr as it is at each record
        _handler.setFormatter(logging.Formatter("%(levelname)-8s %(message)s"))
    logger.addHandler(_handler)
    logger.setLevel(logging.WARNING if quiet else logging.INFO)


def _exit_ignores_interrupts() -> None:
    """From the interpreter's exit on, SIGINT is ignored (registered once, at exit: atexit). The command has
    ended, with its line said; Python's teardown (seconds with torch loaded) puts back the default action,
    under which a Ctrl-C then would end the process without a line and with 130 whatever it had done."""
    if not _AT_EXIT[0]:
        _AT_EXIT[0] = True
        atexit.register(signal.signal, signal.SIGINT, signal.SIG_IGN)   # no Python frame: nothing raised in it


def _parse(argv: list[str]) -> tuple[str, argparse.Namespace]:
    """The subcommand `argv` names and its arguments, read by that subcommand's parser alone. A
    subcommand whose arguments default `argv` (run, check) gets the command line there.

    Raises:
        ConfigError: no or an unknown subcommand, an option before it other than TOP_OPTIONS,
            --version with another argument, --version or -h / --help given twice (before the command
            or after it), bad or unrecognized arguments.
    """
    joined = join_option_values(argv)
    first = next((i for i, a in enumerate(joined) if not a.startswith("-")), len(joined))   # the command's place
    unknown = [a for a in joined[:first] if a.split("=", 1)[0] not in TOP_OPTIONS]
    if unknown:
        build_parser(full=False).refuse_abbreviated(unknown[:1])   # `--vers` names --version, which goes here
        where, option = joined[first] if first < len(joined) else "COMMAND", unknown[0].split("=", 1)[0]
        if where in COMMANDS and option not in command_parser(where)._option_string_actions:   # no such option there
            raise ConfigError(f"unrecognized option {unknown[0]} before the command, and {PROG} {where} takes no "
                              f"{option} either; see {PROG} {where} --help")
        raise ConfigError(f"unrecognized option {unknown[0]} before the command (options go after it: "
                          f"{PROG} {where} {unknown[0]}; see {PROG} --help)")
    build_parser(full=False).refuse_repeated_exits(joined[:first])   # --version, -h twice: argparse would exit 0
    other = [a for a in joined if a != "--version" and a not in HELP_OPTIONS]
    if "--version" in joined[:first] and other:   # argparse would print the version and drop the rest unread
        raise ConfigError(f"--version takes no other argument, got {other[0]!r}: run {PROG} --version alone")
    name = build_parser(full=False).parse_known_args(joined)[0].command
    args, extra = command_parser(name).parse_known_args(joined[joined.index(name) + 1:])
    if extra:
        raise ConfigError(f"{name}: unrecognized arguments: {' '.join(extra)} (see {PROG} {name} --help)")
    if hasattr(args, "argv"):
        args.argv = argv  # `run --gpus` relaunches this command line
    return name, args


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `treebench` console script; returns the exit code.

    Any ConfigError (bad input), a write that finds the disk full, any failed append of rows (ResultsWriteError),
    a failed write to standard output (StdoutError: `> /dev/full`; the line names standard output, `_stdout_failed`),
    and a path too long or a link loop no check found (`names.os_error_problem`), is one line on stderr and exit 2.
    Ctrl-C and SIGTERM end with one line (the --resume hint when rows were being written), exit 130 / 143, also
    after a SIGTERM whose raise was lost (`inflight.stops_raised`); a SIGTERM before the command begins or after it
    ended is the console entry's (`treebench.main`: one line; 143 before, the command's own code after); a Ctrl-C
    while the start-up imports load torch is held until they end (`interrupts_held`); one after the command ended,
    while Python exits, is ignored (`_exit_ignores_interrupts`). A closed stdout (`treebench list | head -3`) sends
    the rest of the output to /dev/null and exits with the code the command had decided on (run, check: their rows';
    gate: its verdict's; selftest runs on to its verdict: cli.selftest), else 141; one closed before the command
    began (`>&-`) is /dev/null from the start.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    escape_unencodable()   # `PYTHONIOENCODING=ascii`: gate's ❌, --help's µs escaped, never a traceback
    closed_stdout_to_devnull()   # `>&-`: output dropped, the command's own exit code (no AttributeError)
    _exit_ignores_interrupts()
    try:   # these imports load torch: seconds of start-up, with Ctrl-C held until their end
        from treebench.harness.run.inflight import (COMMAND_BEGUN, PROGRESS, REPORT_DUE, STOP_REQUESTED, UNWRITTEN,
                                                    enable_crash_report, install_handler, interrupts_held,
                                                    stops_raised)
        with interrupts_held():
            if argv and argv[0] not in TOP_OPTIONS and not asks_help(argv):   # a subcommand loads torch: here
                importlib.import_module("torch")
            from treebench.harness.cli.common import ACTIVE_OUT, ACTIVE_RUN_IDS, CREATED_OUT, NOTHING_WRITTEN, OUTCOME
            from treebench.harness.store.outputs import OUTPUTS
            enable_crash_report()   # a segfault prints the stack, whose frames name the pair in flight
    except KeyboardInterrupt:
        sys.stderr.write(f"{PROG}: interrupted while starting; nothing was written\n")
        return INTERRUPTED
    OUTCOME[0] = ACTIVE_OUT[0] = CREATED_OUT[0] = NOTHING_WRITTEN[0] = None
    ACTIVE_RUN_IDS[0] = ()
    PROGRESS[0] = UNWRITTEN[0] = REPORT_DUE[0] = STOP_REQUESTED[0] = None
    OUTPUTS.clear()
    installed, previous = install_handler(signal.SIGTERM, _on_sigterm)
    COMMAND_BEGUN[0] = True   # a SIGTERM after the command, under the console entry's handler, says it had ended
    name = None
    try:
        with stops_raised():   # a SIGTERM whose Terminated was lost on the way ends the command all the same
            name, args = _parse(argv)
            _setup_logging(getattr(args, "quiet", False))
            code = int(command(name).run(args))
            with stdout_errors():
                sys.stdout.flush()   # what is still buffered: a reader gone by now is a closed stdout too
        return code
    except ConfigError as e:
        sys.stderr.write(f"{PROG}: error: {one_line(str(e))}\n")
        return BAD_INPUT
    except SystemExit as e:  # --help
        return e.code if isinstance(e.code, int) else OK
    except BrokenPipeError:
        stdout_to_devnull()
        return OUTCOME[0] if OUTCOME[0] is not None else BROKEN_PIPE
    except KeyboardInterrupt as e:   # a Ctrl-C after a SIGTERM whose raise was lost: terminated all the same
        return _interrupted(isinstance(e, Terminated) or STOP_REQUESTED[0] is not None, name)
    except OSError as e:
        from treebench.harness.store.names import os_error_problem   # a path's name the checks before missed

        if isinstance(e, StdoutError):
            return _stdout_failed(e, name)
        if e.errno in FULL_DISK or isinstance(e, ResultsWriteError):
            return _not_written(e)
        if (problem := os_error_problem(e)) is None:
            raise
        sys.stderr.write(f"{PROG}: error: {one_line(f'{e.filename}: {problem}')}\n")
        return BAD_INPUT
    finally:
        _drop_unwritten_out()   # an error or a crash of the sweep: a file it created and left empty goes
        STOP_REQUESTED[0] = None
        if installed and previous is not None:   # None: a handler set outside Python, not to be put back
            install_handler(signal.SIGTERM, previous)


def _drop_unwritten_out() -> Path | None:
    """Removes the results file the run or check created (CREATED_OUT) when the sweep stopped
    before its first row reached it (the file is still empty), and then each folder made for it
    (CREATED_FOLDERS) that is empty; returns the file, else None. A file that was there before the
    run, or that holds anything, is left as it is, and so is a folder that was. Raises nothing."""
    from treebench.harness.cli.common import CREATED_FOLDERS, CREATED_OUT
    from treebench.harness.store.paths import remove_empty_folders

    path, CREATED_OUT[0] = CREATED_OUT[0], None
    made, CREATED_FOLDERS[:] = list(CREATED_FOLDERS), []
    try:
        if path is None or path.stat().st_size:
            return None
        path.unlink()
    except OSError:
        return None
    remove_empty_folders(made)
    return path


def _removed(out: Path) -> str:
    """What the line says of the results file `_drop_unwritten_out` removed (`out`, as given) and its env file."""
    from treebench.harness.store.outputs import ENV_NOTE

    return f"before any row was written: the empty results file {out} it had created is removed{ENV_NOTE[0]}"


def _interrupted(terminated: bool, name: str | None) -> int:
    """The one line after Ctrl-C or SIGTERM in subcommand `name`, with the --resume hint while rows
    were being written (run, check --out), the run_id those rows carry and the `treebench rm` that
    removes them; or, stopped before the first row, that the results file it had created is
    removed, or else that nothing was written or the results file is left as it was
    (`unwritten_note`); or, a run stopped after its last row, whether its report was written
    and how to write it (`report_note`); or, where no rows are written (check without --out, a
    dry run), that nothing was, after how many pairs; or, in a command that writes no rows (not ROW_COMMANDS),
    whether each file it writes was written (`outputs_note`); or, stopped before the subcommand
    was known (`name` None), that nothing was written."""
    from treebench.harness.cli.common import ACTIVE_OUT, ACTIVE_RUN_IDS, NOTHING_WRITTEN
    from treebench.harness.run.inflight import kept_rows, pairs_done, report_note, unwritten_note
    from treebench.harness.store.outputs import outputs_note
    from treebench.harness.sweep.shard import rows_file

    out, run_ids, removed = ACTIVE_OUT[0], ACTIVE_RUN_IDS[0], _drop_unwritten_out()
    where = "" if out is None else kept_rows(out, run_ids, "to finish, run", rows_file(out))
    what = "terminated (SIGTERM)" if terminated else "interrupted"
    if removed:
        line = f"{what} {_removed(out or removed)}"
    elif name == "run" and (due := report_note()):
        line = f"{what}{due}"
    elif out is None and NOTHING_WRITTEN[0]:
        line = f"{what}{pairs_done()}; {NOTHING_WRITTEN[0]}"
    elif name in ("run", "check") and (unwritten := unwritten_note(out)):
        line = f"{what} before this run's first row; {unwritten}"
    elif name is None:
        line = f"{what} while starting; nothing was written"
    elif name not in ROW_COMMANDS:
        line = f"{what}{outputs_note()}"
    else:   # no results file claimed yet (run and check load their suite and backends first): nothing written
        line = f"{what}; rows already written are kept{where}" if out is not None else f"{what}; nothing was written"
    with contextlib.suppress(OSError):
        sys.stderr.write(f"{PROG}: {line}\n")
    return TERMINATED if terminated else INTERRUPTED


def _stdout_failed(e: OSError, name: str | None) -> int:
    """The one line when standard output cannot be written (StdoutError: `> /dev/full`, a full disk under a
    redirect, EIO), exit 2 as any failed write: it names standard output and the error. A run or check --out
    that got past its sweep (OUTCOME decided) has every row in its results file, so the line says so and no
    --resume; the files a command writes are named as written or not (`outputs_note`: a report, rm's rewrite).
    A sweep it stopped part-way is said as any failed write is (`_not_written`). What is left of stdout's
    buffer goes to /dev/null, so Python's flush at exit neither fails again nor prints."""
    from treebench.harness.cli.common import ACTIVE_OUT, ACTIVE_RUN_IDS, OUTCOME
    from treebench.harness.store.outputs import outputs_note

    stdout_to_devnull()
    out, run_id = ACTIVE_OUT[0], ", ".join(ACTIVE_RUN_IDS[0])
    if out is not None and OUTCOME[0] is None:
        return _not_written(e, "standard output")
    rows = "" if out is None else (f"; every row of this {name} is in {out}{f', run_id {run_id}' if run_id else ''}: "
                                   "the results file is complete, only what was printed is lost")
    with contextlib.suppress(OSError):
        sys.stderr.write(f"{PROG}: error: could not write standard output: {e.strerror or e}{rows}{outputs_note()}\n")
    return BAD_INPUT


def _not_written(e: OSError, what: str | None = None) -> int:
    """The one line when a write finds no space (ENOSPC, EDQUOT: free space) or rows fail to append (ResultsWriteError:
    EIO, EROFS, ...): the file (`what`, else the error's, else --out), the error, that the rows before are kept (the
    failed row is cut off: store.rows), from a run or check --out with their run_id, --resume and `treebench rm`;
    before its first row, what became of --out."""
    from treebench.harness.cli.common import ACTIVE_OUT, ACTIVE_RUN_IDS
    from treebench.harness.run.inflight import PROGRESS, kept_rows  # PROGRESS: (rows written, pairs) of the run
    from treebench.harness.store.outputs import ENV_NOTE
    from treebench.harness.sweep.shard import rows_file

    out, removed, what = ACTIVE_OUT[0], _drop_unwritten_out(), what or e.filename or ACTIVE_OUT[0] or "a file"
    what = out if out is not None and what == str(out.absolute()) else what   # --out named as given
    then = "free space, then run" if e.errno in FULL_DISK else f"once {what} can be written, run"
    where = ("; what was written before is kept" if out is None else
             f"; stopped {_removed(out)}; {then} the same command again" if removed else
             f"; stopped before this run's first row: {out} is left as it was{ENV_NOTE[0]}; {then} the same command "
             "again"
             if PROGRESS[0] is not None and PROGRESS[0][0] == 0 else
             "; rows already written are kept" + kept_rows(out, ACTIVE_RUN_IDS[0], then, rows_file(out)))
    with contextlib.suppress(OSError):
        sys.stderr.write(f"{PROG}: error: could not write {what}: {e.strerror or e}{where}\n")
    return BAD_INPUT


if __name__ == "__main__":
    raise SystemExit(main())
