"""What the subcommands of the `treebench` command line share: the subcommand
interface, the stderr console, the options of run and check and the one function
that turns them into a sweep request, argument checks (comma-separated names among
them), and the summary printed after a sweep.

Bad input raises ConfigError (main() prints it as one line, exit 2).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from rich.console import Console
from rich.table import Table
from rich.text import Text

from treebench.harness.cli import ChunkedFile, case_timeout, positive_seconds, thread_count
from treebench.harness.errors import ConfigError
from treebench.harness.run.config import CPU_CHECK_THREADS, MAX_WAIT_S, MIN_CASE_TIMEOUT_S
from treebench.harness.run.progress import TerminalConsole, plural
from treebench.harness.store.names import check_path_name, new_run_id
from treebench.harness.store.rows import timing_label
from treebench.harness.timing.modes import MODES

OFF_TERMINAL_WIDTH = 100_000      # columns of a console that is not a terminal: lines are never wrapped


class PlainConsole(TerminalConsole):
    """A rich console that prints what it is given: no emoji codes (a case id's `:100:` stays text); its output
    is written in pieces (`emit`); a closed stdout raises BrokenPipeError (main() keeps the rows' exit code)."""

    @property
    def file(self):
        return ChunkedFile(Console.file.fget(self))

    @file.setter   # rich declares Console.file with a setter, which mypy reads as an overload
    def file(self, new_file) -> None:
        Console.file.fset(self, new_file)  # type: ignore[attr-defined]

    def on_broken_pipe(self) -> None:
        raise BrokenPipeError(32, "the reader of the output went away")


def console(stderr: bool = False) -> PlainConsole:
    """A PlainConsole on stdout (or stderr). Off a terminal (a file, a pipe, a CI log) it also
    has no colour and no width: long lines and wide tables are printed whole, never wrapped
    at 80 columns. The stream is looked up at each print (so a redirected sys.stdout counts)."""
    stream = sys.stderr if stderr else sys.stdout
    tty = bool(getattr(stream, "isatty", lambda: False)())
    return PlainConsole(stderr=stderr, emoji=False, highlight=False, soft_wrap=not tty,
                        width=None if tty else OFF_TERMINAL_WIDTH, no_color=not tty or None)


CONSOLE = console(stderr=True)   # progress bars and log records: one console, so neither garbles the other
FAILED = ("mismatch", "error")   # row statuses that make run / check exit 1
NOTHING_RAN = 3                  # exit code of a run / check in which no pair ran (without --allow-skip)
ACTIVE_OUT: list[Path | None] = [None]   # the results file of the run/check in progress (for Ctrl-C)
ACTIVE_RUN_IDS: list[tuple[str, ...]] = [()]  # the run ids its rows carry (for Ctrl-C: rm --run-id takes them)
CREATED_OUT: list[Path | None] = [None]  # ACTIVE_OUT when this run/check created it (removed if it stops before a row)
CREATED_FOLDERS: list[Path] = []         # the folders made for CREATED_OUT, deepest first (removed with it while empty)
NOTHING_WRITTEN: list[str | None] = [None]  # why the run/check in progress writes no rows (for Ctrl-C's line)
DRY_RUN_WRITES_NOTHING = "a dry run writes no rows: nothing was written"   # NOTHING_WRITTEN of --dry-run
OUTCOME: list[int | None] = [None]       # the exit code run/check/gate decided on, kept if stdout closes early
TIMERS = MODES
L2_STATES = ("cold", "warm")  # run --l2: cold flushes the L2 before every timed call (flush_l2), warm does not


class Command(NamedTuple):
    """One subcommand of a module that holds several (a one-command module is itself one:
    module-level `add_arguments` and `run`)."""

    add_arguments: Callable[[argparse.ArgumentParser], None]   # fills the subcommand's parser
    run: Callable[[argparse.Namespace], int]                   # runs it; returns the exit code


# ---- options -------------------------------------------------------------------------------


def add_suite_argument(p, default: str) -> None:
    """--suite, as run and check take it."""
    from treebench.harness.model.suites import available_suites   # not at `treebench --help`
    shipped = available_suites()
    findings = available_suites(findings=True)[len(shipped):]
    p.add_argument("--suite", default=default,
                   help=f"a suite shipped with treebench ({', '.join(shipped)}; peers' bugs kept as suites: "
                        f"{', '.join(findings)}) or a TOML file path (default: {default})")


def add_sweep_options(p, timed: bool = True) -> None:
    """Options run and check share: isolation, determinism, memory check, resume, sharding
    (`timed`: the command times its pairs, as run does and check does not)."""
    p.add_argument("--isolate", action="store_true",
                   help="run each case x backend in a worker subprocess: a crash, hang or lost CUDA context "
                        "becomes an error row and a fresh worker runs the next case")
    p.add_argument("--case-timeout", type=case_timeout, default=None, metavar="SECONDS",
                   help="per case x backend time limit under --isolate (implies it); a hung worker is killed; at "
                        f"least {MIN_CASE_TIMEOUT_S:g} s, as the harness's own work on a pair counts in it (inputs, "
                        "float64 reference, comparison" + (", timing budget" if timed else "") + ": 0.1-0.2 s for "
                        f"the smallest case on a CPU); past {MAX_WAIT_S:.0f} s (24.8 days): no limit")
    p.add_argument("--determinism", action="store_true",
                   help=("call each prepared callable twice and compare bitwise; nondeterministic rows exit 1"
                         if timed else "exit 1 also on a backend declaring deterministic = False whose calls "
                         "differed bitwise (a check always compares its calls bitwise)"))
    p.add_argument("--no-memory-check", action="store_true",
                   help="run pairs even when their predicted device memory exceeds the free memory")
    p.add_argument("--resume", action="store_true",
                   help="skip case x backend pairs already stored in --out for this env, whatever their status "
                        "(error rows too; needs --out)" + ("; run times again the rows stored untimed or with "
                                                            "another --timer or --l2" if timed else ""))
    p.add_argument("--shard", default=None, metavar="I/N",
                   help="run only the cases whose suite index is I mod N, I 0-based (0 <= I < N; cluster job arrays); "
                        "merge the files with `treebench merge`")
    p.add_argument("--merge-timeout", type=positive_seconds, default=None, metavar="SECONDS",
                   help="under torchrun" + (" (--gpus N, N >= 2)" if timed else "") + ": how long rank 0 waits "
                        f"for the other ranks before giving up the merge (default 24 h; past {MAX_WAIT_S:.0f} s: no "
                        "limit); refused elsewhere")
    p.add_argument("--dry-run", action="store_true", help="count the pairs this invocation would run, run nothing")
    p.add_argument("--allow-skip", action="store_true",
                   help=f"exit 0 even when no pair ran (every row skipped: backend unavailable here, case "
                        f"unsupported); without it such a run proves nothing and exits {NOTHING_RAN}")
    p.add_argument("--quiet", action="store_true", help="no progress bar, warnings only")
    add_threads_option(p, "never the timed calls: the CPU's wall timer takes 1 thread" if timed else "")
    p.set_defaults(argv=None)   # main() puts the command line here: `spelling_used` reads it, --gpus relaunches it


def add_threads_option(p, note: str = "") -> None:
    """--threads, as run, check and selftest take it; `note` ends its help."""
    p.add_argument("--threads", type=thread_count, default=None, metavar="N",
                   help="torch intra-op threads of the correctness work: inputs, float64 reference, prepare, the "
                        f"calls compared and the comparisons (default on the CPU: {CPU_CHECK_THREADS}, fastest where "
                        "other work shares the cores; where OMP_NUM_THREADS is set, or on a GPU: torch's count)"
                        + (f"; {note}" if note else ""))


def claim_results(path: str | Path, run_id: str, dry_run: bool, what: str = "--out") -> Path:
    """`check_writable_made(path, what=what)` for the results file of a run or check (a dry run creates nothing),
    kept with the run_id its rows carry for the line after an interrupt or a full disk
    (ACTIVE_OUT, ACTIVE_RUN_IDS: the --resume hint and the `treebench rm --run-id` that removes
    the rows; its size now in inflight.UNWRITTEN), and in CREATED_OUT when this call created the
    file (the folders it made for it in CREATED_FOLDERS): main() removes them again if the sweep stops
    (an interrupt, an error) before its first row; returns the path as given (those two and UNWRITTEN
    hold it absolute). Under torchrun the ranks write rank files first: never marked for removal there.

    Raises:
        ConfigError: as check_writable_made; a malformed torchrun environment.
    """
    from treebench.harness.run.inflight import mark_unwritten
    from treebench.harness.store.paths import check_writable_made
    from treebench.harness.sweep.shard import torchrun_rank

    ours = not os.path.lexists(path) and torchrun_rank() is None   # a dangling link is not ours either
    out, made = check_writable_made(path, not dry_run, what)
    if not dry_run:   # what is removed or looked at later: absolute, wherever a backend's os.chdir went
        ACTIVE_OUT[0], ACTIVE_RUN_IDS[0] = out, (run_id,)
        CREATED_OUT[0], CREATED_FOLDERS[:] = (out.absolute() if ours else None), [m.absolute() for m in made if ours]
        mark_unwritten(out.absolute())
    return out


def sweep_options(args, mode: str, report: bool = False):
    """The sweep request (treebench.harness.sweep.execute.SweepOptions) of run or check, built and
    validated once; its `out` is --out as given (run replaces it with the default path); `report`:
    an HTML report follows the sweep (RunConfig.report, which run's writing of it reads too).

    Raises:
        ConfigError: a bad --shard, --timer cuda_graph_loop with a cold L2, --resume without --out,
            --merge-timeout outside torchrun and `run --gpus N`, N >= 2 (it would do nothing).
    """
    from treebench.harness.run.config import RunConfig, check_threads
    from treebench.harness.run.runner import default_device
    from treebench.harness.sweep.execute import DEFAULT_MERGE_TIMEOUT_S, SweepOptions
    from treebench.harness.sweep.shard import parse_shard, torchrun_rank

    gpus = getattr(args, "gpus", None)
    threads = check_threads(args.threads, default_device().type)
    if args.merge_timeout is not None and torchrun_rank() is None and not (gpus and gpus > 1):
        launch = "`run --gpus N` with N >= 2, or under torchrun" if mode == "run" else "under torchrun"
        raise ConfigError(f"--merge-timeout without a torchrun launch: it sets how long rank 0 waits for the other "
                          f"ranks ({launch}), and does nothing here; leave it out")

    run = RunConfig(mode=mode, quiet=args.quiet, report=report, determinism=args.determinism, threads=threads,
                    check_memory=not args.no_memory_check,
                    isolate=args.isolate or args.case_timeout is not None, case_timeout_s=args.case_timeout,
                    timing_mode=getattr(args, "timer", "auto"),          # run only: check times nothing
                    flush_l2=getattr(args, "l2", "cold") == "cold")
    return SweepOptions(run=run, out=Path(args.out) if args.out else None, resume=args.resume,
                        shard=parse_shard(args.shard) if args.shard else None,
                        merge_timeout_s=DEFAULT_MERGE_TIMEOUT_S if args.merge_timeout is None else args.merge_timeout,
                        dry_run=args.dry_run, gpus=gpus)


# ---- argument checks and names -------------------------------------------------------------


def nonempty(value: str | None, option: str) -> str | None:
    """Raises ConfigError for an option given as an empty string (it would silently mean the default)."""
    if value is not None and not value.strip():
        raise ConfigError(f"{option} is empty: give a value, or leave the option out for its default")
    return value


def comma_list(text: str, option: str) -> list[str]:
    """'a, b' -> ['a', 'b'], the names a comma-separated option gives (--backends); [] when it
    names nothing ('', ' , '), which each caller refuses in its own words.

    Raises:
        ConfigError: an empty name beside a comma ('a,,b', 'a,') or a name given twice ('a,a').
    """
    names = [n.strip() for n in text.split(",")]
    if any(names) and "" in names:
        i = names.index("")
        where = ("before the first comma" if i == 0 else "after the last comma" if i == len(names) - 1
                 else "between commas")
        raise ConfigError(f"{option}: empty name {where} in {text!r}; separate names with single commas, e.g. a,b")
    twice = next((n for i, n in enumerate(names) if n and n in names[:i]), None)
    if twice is not None:
        raise ConfigError(f"{option}: {twice!r} named twice in {text!r}; name each once")
    return [n for n in names if n]


def check_suite_arg(suite: str) -> None:
    """Raises ConfigError when --suite is empty, names a directory or a path the file system refuses."""
    if not suite.strip():
        raise ConfigError("--suite is empty: give a suite name such as smoke or a TOML file path")
    if check_path_name(suite, "--suite").is_dir():
        raise ConfigError(f"--suite {suite}: is a directory; give a suite TOML file (e.g. {Path(suite) / 'NAME.toml'}) "
                          "or a suite name")


def spelling_used(argv, names: tuple[str, ...]) -> str:
    """The spelling of an option (one of `names`) the command line used, which its errors name;
    `names[0]` when none (the parser has refused it given twice: treebench.harness.cli.Parser)."""
    return next((a.split("=", 1)[0] for a in argv or [] if a.split("=", 1)[0] in names), names[0])


def note_run_ids(rows: list[dict]) -> tuple[str, ...]:
    """The run ids `rows` carry, sorted (a --resume's: the earlier runs' its stored rows are in), kept in ACTIVE_RUN_IDS
    unless there are none: what a failed write to stdout and the line after an interrupt name, as `run_id:` does."""
    ids = tuple(sorted({r["run_id"] for r in rows if r.get("run_id")}))
    ACTIVE_RUN_IDS[0] = ids or ACTIVE_RUN_IDS[0]
    return ids


def stamp() -> str:
    """UTC time plus a random token: runs started in the same second (shards) get different default files."""
    return new_run_id()


# ---- after a sweep -------------------------------------------------------------------------


def exit_code(result, determinism: bool, allow_skip: bool = False) -> int:
    """1 when a row failed, a rank's rows could not be merged, or (with --determinism) a row was
    nondeterministic; else NOTHING_RAN when no pair ran (`nothing_ran`) unless `allow_skip`; else 0."""
    bad = any(r["status"] in FAILED for r in result.rows) or result.missing_ranks
    if bad or (determinism and any(r.get("deterministic") is False for r in result.rows)):
        return 1
    return NOTHING_RAN if not allow_skip and nothing_ran(result.rows) else 0


def nothing_ran(rows: list[dict]) -> str | None:
    """Why no pair of `rows` ran (every row skipped), one line naming each backend's first
    reason; None when a pair ran (passed, mismatched or errored) or when there was no pair to
    run here at all (a --shard with no case of the suite: nothing was asked of this process)."""
    if not rows or any(r["status"] != "skipped" for r in rows):
        return None
    first: dict[str, str] = {}
    for r in rows:
        first.setdefault(r["backend"], r.get("reason") or "skipped")
    return "no case ran: " + "; ".join(f"{name}: {why}" for name, why in first.items())


def report_nothing_ran(rows: list[dict], allow_skip: bool) -> bool:
    """Writes the one `nothing_ran` line to stderr (what exit NOTHING_RAN means, or that
    --allow-skip accepted it); True when it did (no pair ran)."""
    why = nothing_ran(rows)
    if why is None:
        return False
    CONSOLE.file.write(f"treebench: {' '.join((why + _nothing_ran_tail(allow_skip)).split())}\n")
    CONSOLE.file.flush()
    return True


def _nothing_ran_tail(allow_skip: bool) -> str:
    """What a sweep in which nothing ran means, after the line that says so."""
    return ("; accepted by --allow-skip" if allow_skip else
            f"; this proves nothing (exit {NOTHING_RAN}): pass --allow-skip to accept a sweep in which nothing ran")


def dry_run_code(result, allow_skip: bool) -> int:
    """The exit code of a --dry-run, as the run itself would end: 1 when a pair will be an error row before it
    runs (`print_plan` names why); NOTHING_RAN (one line on stderr) when every pair it would run is a skipped
    row (backend unavailable, case unsupported or predicted not to fit the free memory) and `allow_skip` is not
    given; else 0 (also when --resume keeps stored rows, which the run counts, and on a torchrun rank past 0,
    whose exit code rank 0 sets)."""
    if result.will_error and result.primary:
        return 1
    if not result.planned or result.will_skip < result.planned or result.resumed or not result.primary:
        return 0
    memory = f"; {result.will_skip_memory} of them predicted not to fit the free memory" if result.will_skip_memory else ""
    CONSOLE.file.write(f"treebench: dry run: every one of the {plural(result.planned, 'pair')} would be skipped "
                       f"(backend unavailable or case unsupported: `treebench list` says why{memory})"
                       f"{_nothing_ran_tail(allow_skip)}\n")
    CONSOLE.file.flush()
    return 0 if allow_skip else NOTHING_RAN


def print_plan(suite, backends, result, recorded: bool = True) -> None:
    """The --dry-run lines: the backend when there is one (named as check's header names it), the pairs this
    process would run, skip, and find errors before they run (which backends, why), each kept as a row where
    `recorded`, those --resume skips (or what --out holds without it), and the time (where a pair is to run)."""
    stored = (f"; {result.stored_note}" if result.stored_note else
              "" if result.resumed is None else f", {result.resumed} already stored (skipped by --resume)")
    memory = (f", or for {result.will_skip_memory} of them predicted not to fit the free memory "
              "(--no-memory-check runs them)" if result.will_skip_memory else "")
    be = "to be recorded as" if recorded else "would be"
    later = ((f", {result.will_skip} {be} skipped (backend unavailable or case unsupported{memory})" if result.will_skip
              else "") + (f", {result.will_error} {be} errors ({result.failing})" if result.will_error else ""))
    what = (f"backend {backends[0].name}, {plural(len(suite.cases), 'case')}" if len(backends) == 1 else
            f"{plural(len(suite.cases), 'case')} x {plural(len(backends), 'backend')}")
    to_run = plural(result.planned - result.will_skip - result.will_error, "pair")
    console().print(f"dry run: {suite.title}, {what}: {to_run} to run here{later}{stored}", markup=False)
    if result.estimate:   # its first line the time, each further one what the time is based on or leaves out
        first, *rest = result.estimate.splitlines()
        console().print(f"estimated time: {first}", *(f"  {line}" for line in rest), sep="\n", markup=False)


def _summary_table(rows: list[dict], title: str) -> Table:
    """Per-backend counts of each status and the median of the passing rows' medians (us): a
    mismatching row is timed and keeps its timing, but its speed is not a result, so neither
    this table nor the report shows it."""
    table = Table(title=Text(title))   # names as written: a '[x]' in a backend or suite name is no markup
    for col in ("backend", "pass", "mismatch", "error", "skipped", "median_us"):
        table.add_column(col, justify="left" if col == "backend" else "right")
    for name in dict.fromkeys(r["backend"] for r in rows):
        mine = [r for r in rows if r["backend"] == name]
        counts = [str(sum(r["status"] == s for r in mine)) for s in ("pass", "mismatch", "error", "skipped")]
        timed = [r["median_us"] for r in mine if r["status"] == "pass" and r.get("median_us") is not None]
        table.add_row(Text(name), *counts, f"{statistics.median(timed):.1f}" if timed else "-")
    return table


def _timer_lines(rows: list[dict]) -> list[str]:
    """What the medians were timed with: 'timer: cuda_graph, L2 flushed' when every timed row
    shares it, else one such line per timer and L2 state with its backends, then why a timer
    other than the one asked for was used (at most 3 reasons); none without timing."""
    by: dict[str, list[str]] = {}
    for r in rows:
        label = timing_label(r) if r.get("median_us") is not None else None
        if label and r["backend"] not in by.setdefault(label, []):
            by[label].append(r["backend"])
    lines = ([f"timer: {next(iter(by))}"] if len(by) == 1 else
             [f"timer: {label} ({', '.join(names)})" for label, names in sorted(by.items())])
    fallbacks = sorted({r["timer_fallback"] for r in rows
                        if r.get("median_us") is not None and r.get("timer_fallback")})
    return lines + [f"timer fallback: {f}" for f in fallbacks[:3]]


def _failed_lines(failed: list[dict]) -> list[tuple[str, int]]:
    """(line, rows it stands for) of each failed row, "error: BACKEND (KERNEL) on CASE: REASON", but the rows of a
    backend that could not be loaded (failed_step import: one reason, given in a warning as it was loaded) are one
    line, "error: BACKEND on N cases: REASON", at the place of the first."""
    from treebench.harness.checking.default_check import IMPORT

    unloaded = Counter((r["backend"], r["reason"]) for r in failed if r.get("failed_step") == IMPORT)
    lines = []
    for r in failed:
        kernel = f" ({r['kernel']})" if r.get("kernel") else ""       # the path it ran, as the backend names it
        if r.get("failed_step") != IMPORT:
            lines.append((f"{r['status']}: {r['backend']}{kernel} on {r['case_id']}: {r['reason']}", 1))
        elif n := unloaded.pop((r["backend"], r["reason"]), 0):
            lines.append((f"{r['status']}: {r['backend']} on {plural(n, 'case')}: {r['reason']}", n))
    return lines


def print_summary(rows: list[dict], title: str, max_lines: int = 20) -> None:
    """Prints the summary table, the timers with their L2 state, then one line per failed row (`_failed_lines`, at
    most `max_lines`)."""
    out = console()
    out.print(_summary_table(rows, title))
    for line in _timer_lines(rows):
        out.print(line, markup=False, highlight=False, soft_wrap=True)
    failed = _failed_lines([r for r in rows if r["status"] in FAILED])
    for line, _ in failed[:max_lines]:
        out.print(line, markup=False, highlight=False, soft_wrap=True)
    if len(failed) > max_lines:
        more = sum(n for _, n in failed[max_lines:])
        out.print(f"... and {plural(more, 'more failed row')}", markup=False, soft_wrap=True)
    nondet = [r for r in rows if r.get("deterministic") is False]
    for name in dict.fromkeys(r["backend"] for r in nondet):
        n = sum(r["backend"] == name for r in nondet)
        out.print(f"nondeterministic: {name} on {plural(n, 'case')}: repeated calls gave bitwise different outputs",
                  markup=False, highlight=False, soft_wrap=True)
