"""`treebench run`: correctness then timing for every case x backend; appends rows to
--out, writes the env file beside it and an HTML report; exit 1 on any failed row, 3 when
no pair ran (every backend unavailable or every case skipped) unless --allow-skip.

The sweep itself (shards, torchrun ranks, --resume, isolation) is
treebench.harness.sweep.execute; `run --gpus N` relaunches the command line under
torchrun (treebench.harness.sweep.shard.launch_torchrun).
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shlex
from dataclasses import replace
from pathlib import Path

from treebench.harness.cli import count_option
from treebench.harness.cli.common import (
    CONSOLE,
    CREATED_OUT,
    DRY_RUN_WRITES_NOTHING,
    L2_STATES,
    NOTHING_WRITTEN,
    OUTCOME,
    TIMERS,
    add_suite_argument,
    add_sweep_options,
    check_suite_arg,
    claim_results,
    comma_list,
    console,
    dry_run_code,
    exit_code,
    spelling_used,
    nonempty,
    note_run_ids,
    nothing_ran,
    plural,
    print_plan,
    print_summary,
    report_nothing_ran,
    stamp,
    sweep_options,
)
from treebench.harness.errors import ConfigError

log = logging.getLogger(__name__)


DEFAULT_REPORT = "run's default --report"   # how errors name a report path that no --report gave
SAFE_NAME_MAX = 64   # characters of a suite's name in a default file name: <name>-<run_id>.jsonl stays short


def safe_name(name: str, path: Path | None = None) -> str:
    """`name` as a default file name holds it (README, "default file names"): each run of characters
    other than ASCII letters, digits, '.', '_' and '-' becomes one '_' ('a/../x' -> 'a_.._x',
    'x\\0y' -> 'x_y'), and '.', '_' and '-' at either end are dropped ('a/' -> 'a'); a name that
    leaves nothing ('..', '/') gives way to the suite file's stem, mapped the same way, else to
    "suite". A name longer than SAFE_NAME_MAX is cut to its start and the first 8 hex digits of the
    SHA-1 of the name in full, so that two long names that start alike still name different files."""
    for candidate in (name, path.stem if path is not None else ""):
        cleaned = re.sub(r"[^A-Za-z0-9._-]+", "_", str(candidate or "")).strip("._-")
        if len(cleaned) > SAFE_NAME_MAX:
            digest = hashlib.sha1(str(candidate).encode("utf-8", "replace")).hexdigest()[:8]
            cleaned = f"{cleaned[:SAFE_NAME_MAX - 9].rstrip('._-')}-{digest}"
        if cleaned:
            return cleaned
    return "suite"


def suite_name(suite) -> str:
    """The suite's name, safe for a default file name."""
    return safe_name(suite.name, getattr(suite, "path", None))


def default_out(name: str, run_id: str) -> Path:
    """The default results file of a run of the suite named `name` (`suite_name`) under `run_id`."""
    return Path("results/local") / f"{name}-{run_id}.jsonl"


def drop_leftovers(name: str, suite, keep: Path) -> None:
    """Removes the empty default results files of suite `suite`'s runs that crashed before their first
    row (`crash.drop_crash_leftovers`), one info line each; never `keep`, this run's."""
    from treebench.harness.sweep.crash import drop_crash_leftovers

    for left in drop_crash_leftovers(keep.parent, name, keep):
        log.info("removed %s: the empty results file of a run of suite %s that crashed before its first row",
                 left, suite.name)


def warn_backends_that_ran_nothing(rows: list[dict]) -> None:
    """One warning per backend whose every row was skipped, with the first row's reason
    (an unavailable backend otherwise shows only a count of skipped rows)."""
    by_backend: dict[str, list[dict]] = {}
    for r in rows:
        by_backend.setdefault(r["backend"], []).append(r)
    for name, rs in by_backend.items():
        if all(r["status"] == "skipped" for r in rs):
            log.warning("%s: no case ran: %s", name, rs[0].get("reason") or "skipped")


def _warn_wall_timer(args) -> None:
    """One warning, unless --quiet or --dry-run, where a CUDA timer is asked for and the sweep runs on the CPU,
    whose only timer is the wall clock (each row says so in timer_fallback too)."""
    from treebench.harness.run.runner import default_device
    from treebench.harness.timing.modes import WALL

    if args.timer != "auto" and not (args.quiet or args.dry_run) and default_device().type != "cuda":
        log.warning("--timer %s needs a CUDA device and this run has none: its rows are timed with the %s timer "
                    "(the CPU's wall clock)", args.timer, WALL)


def add_arguments(p) -> None:
    """The options of `treebench run`."""
    add_suite_argument(p, "smoke")
    p.add_argument("--backends", "--backend", dest="backends", default=None,
                   help="comma-separated names, package.module:Class, path/file.py:Class or path/file.py (its one "
                        "backend class), or 'all' alone "
                        "(every built-in backend; default: every available built-in backend)")
    p.add_argument("--out", default=None,
                   help="results JSONL to append to (default: results/local/<suite>-<run_id>.jsonl)")
    p.add_argument("--report", default=None,
                   help="HTML report path (default: reports/local/<suite>-<run_id>.html, or <suite>-<run_id>-2.html, "
                        "-3, ... where an earlier run's is; with --resume, named after --out: "
                        "reports/local/<--out's name>.html, the first run's report for a default --out, or "
                        "<--out's name>-2.html, -3, ... where a report of other results is)")
    p.add_argument("--gpus", type=count_option("GPU", "--gpus"), default=None, metavar="N",
                   help="spread the cases over N GPUs: relaunches this command under torchrun, one rank per GPU")
    p.add_argument("--timer", choices=TIMERS, default="auto",
                   help="auto (default) and cuda_graph: device time of each call inside a CUDA graph (CUDA events if "
                        "the call cannot be captured); cuda_event: CUDA events around each eager call; host_inclusive: "
                        "host clock around call + synchronize, launch overhead included; cuda_graph_loop (needs --l2 "
                        "warm): a CUDA graph of back-to-back calls timed as a whole, as triton's do_bench_cudagraph "
                        "does; the CPU has only a wall clock")
    p.add_argument("--l2", choices=L2_STATES, default="cold",
                   help="cold (default): flush the L2 before every timed call, as a model's other layers evict it; "
                        "warm: no flush, the call finds what the previous one left in the L2 (a GPU setting: "
                        "on the CPU nothing is flushed either way, and rows say l2_flushed false)")
    add_sweep_options(p)


def _report_path(path: str | None, suite: str, out: str | Path | None = None, stamp_text: str | None = None,
                 probe: bool = True, resume: bool = False) -> Path:
    """The report path, checked before the run, its folder left for the report's writer to make
    (`paths.check_html_writable`); probe=False (a dry run) checks what it can without writing. The
    default is reports/local/<suite>-<run_id>.html, or, when a file is there
    (the report of an earlier run under this run id), the first free <suite>-<run_id>-<n>.html: that
    report is kept, and a warning names both. With `resume` the default is the report named after
    the results file `out` (`names.default_report`), as the run that --resume finishes named it where
    its --out was the default: the resumed run's report replaces it, unless that report was made
    from other results (`names.kept_report`: then the first free <name>-<n>.html, with a warning).

    Raises:
        ConfigError: not an .html/.htm path, an existing file that is not HTML, the --out file,
            a directory, a name the file system refuses, or a folder that cannot be made or written.
    """
    from treebench.harness.store.names import REPORTS, kept_report, unused_path
    from treebench.harness.store.paths import check_html_writable

    run_id = stamp_text or stamp()
    default = REPORTS / f"{suite}-{run_id}.html"
    if path:
        p = Path(path)
    elif resume and out is not None:
        p, why = kept_report([out], "this run's report")
        if why and probe:
            log.warning("%s", why)
    else:
        p = unused_path(default)
        if p != default and probe:
            log.warning("%s is the report of an earlier run under run id %s, and is kept: this run's report is %s",
                        default, run_id, p)
    if out is not None and os.path.realpath(p) == os.path.realpath(out):   # realpath: a link loop raises nothing
        raise ConfigError(f"--report {p}: is the --out results file; give a separate .html path")
    flag, fix = ("--report", "give a writable .html path") if path else (   # a default path: the user gave none
        DEFAULT_REPORT, "give --report or run from a writable folder")
    return check_html_writable(p, flag, f"reports/local/{suite}.html", probe=probe, fix=fix)


def _write_report(rows: list[dict], out: Path, report: Path, title: str, shown: Path | None = None,
                  report_shown: Path | None = None, flag: str = "--report") -> int:
    """Writes the HTML report from `rows` and the env files beside `out`; returns 0, or on failure (one
    line naming the results file as `shown`, default `out`) the exit code it gives: 2 where the report
    cannot be written (a ConfigError: a full disk, a file in place of its folder), as any failed write,
    else 1. The lines name it as `report_shown` (default `report`), the path as the user gave it, after
    `flag`, the option that gave it (or DEFAULT_REPORT).

    Raises:
        KeyboardInterrupt: Ctrl-C (or SIGTERM's Terminated) while the report's libraries load or the
            page is made, also one that they dropped or turned into another error (`inflight.interrupts_noted`).
    """
    from treebench.harness.run.inflight import interrupts_noted
    from treebench.harness.store.env import read_envs

    try:
        with interrupts_noted():
            from treebench.harness.analyze.report import write_report

            write_report(rows, read_envs([out]), report, title=title, sources=[str(out)],
                         shown=[str(shown or out)], named=report_shown, flag=flag)
        return 0
    except ConfigError as e:   # the path: the one line says what is wrong with it
        log.error("report not written: %s; the rows are in %s", e, shown or out)
        return 2   # bad input, as main() gives a ConfigError
    except Exception as e:  # noqa: BLE001 -- the rows are safe in the store; say so and fail
        log.error("report not written (%s: %s); the rows are in %s", type(e).__name__, e, shown or out)
        return 1


def _check_gpus(n: int) -> None:
    """Raises ConfigError when `--gpus n` cannot be honoured: under torchrun already, no CUDA GPU
    visible, or fewer than n."""
    import torch
    from treebench.harness.sweep.shard import torchrun_rank

    if torchrun_rank() is not None:
        raise ConfigError("--gpus: already running under torchrun; drop --gpus (torchrun chose the ranks)")
    found = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if found == 0:
        raise ConfigError(f"--gpus {n}: needs CUDA GPUs, and torch sees none here (no CUDA device, or a CPU-only "
                          "torch build); drop --gpus to run on the CPU")
    if n > found:
        raise ConfigError(f"--gpus {n}: torch sees {found} CUDA GPU(s); ask for at most {found}")


def _check_ranks_share_out(rank, out: str | None) -> None:
    """Raises ConfigError for a run without --out under torchrun's RANK and WORLD_SIZE (2 ranks or more) with no run id
    that the ranks share (`shard.shared_run_id`): each would name a default results file of its own, and rank 0 would
    wait for rank files that never come; the environment of a shell inside a torchrun or PyTorchJob pod, too."""
    from treebench.harness.sweep.shard import shared_run_id

    if rank is not None and rank.world > 1 and out is None and shared_run_id() is None:
        raise ConfigError(f"under torchrun (RANK={rank.rank}, WORLD_SIZE={rank.world}) give --out: ranks write "
                          "<out>.rank<i>-of-<n>.jsonl and rank 0 merges them (the default file is named after a run "
                          "id, and no $TREEBENCH_RUN_ID or torchrun's run id gives one to every rank); where no "
                          "torchrun launched this command, unset RANK and WORLD_SIZE")


def run_stamp() -> str:
    """This run's id, also the stamp of its default file names: the id the ranks of a torchrun
    launch share (`shard.shared_run_id`, checked to be file-name safe), else a fresh one
    (`common.stamp`).

    Raises:
        ConfigError: a shared run id holding what a run id may not.
    """
    from treebench.harness.sweep.shard import shared_run_id

    return shared_run_id() or stamp()


def _launch_gpus(args, suite) -> int:
    """`run --gpus N` (N > 1): relaunches this command line under torchrun, with --out and --report
    filled in so that every rank uses the same files; returns torchrun's exit code."""
    from treebench.harness.run.inflight import UNWRITTEN
    from treebench.harness.store.paths import DEFAULT_OUT, check_writable
    from treebench.harness.sweep.shard import launch_torchrun, strip_option

    argv = strip_option(args.argv, "--gpus")
    name = suite_name(suite)
    stamp_text = run_stamp()
    out = args.out or str(default_out(name, stamp_text))
    report = _report_path(args.report, name, out, stamp_text, resume=args.resume)
    check_writable(out, create=False, what="--out" if args.out else DEFAULT_OUT)
    if args.out is None:  # every rank must append to the same file
        drop_leftovers(name, suite, Path(out))   # the ranks are given --out: they leave the default's leftovers
        argv += ["--out", out]
    if args.report is None:
        argv += ["--report", str(report)]
    UNWRITTEN[0] = None   # the ranks write the rows: the line after Ctrl-C says they are kept
    return launch_torchrun(args.gpus, argv, run_id=stamp_text)


def run(args) -> int:
    """`treebench run`: correctness then timing; rows, env file, HTML report; exit 1 on any failed row.

    Raises:
        ConfigError: bad arguments, suite, backends or output paths (checked before anything is written).
    """
    from treebench.harness.model.suites import load_suite
    from treebench.harness.run.inflight import mark_unwritten, report_due
    from treebench.harness.run.progress import after_pairs
    from treebench.harness.store.names import default_report
    from treebench.harness.store.paths import DEFAULT_OUT, check_writable
    from treebench.harness.sweep.crash import crash_advice, crash_lines
    from treebench.harness.sweep.execute import execute, shard_is_empty
    from treebench.harness.sweep.imports import load_backends
    from treebench.harness.sweep.shard import others, torchrun_rank

    if args.dry_run:
        NOTHING_WRITTEN[0] = DRY_RUN_WRITES_NOTHING   # what the line after Ctrl-C says
    mark_unwritten(args.out or None)   # Ctrl-C before the first row: nothing written, --out left as it was
    option = spelling_used(getattr(args, "argv", None), ("--backends", "--backend"))   # as typed: errors name it
    check_suite_arg(args.suite)
    nonempty(args.out, "--out")
    nonempty(args.report, "--report")
    nonempty(args.shard, "--shard")
    rank = torchrun_rank()   # a run ends with its report, under torchrun rank 0's: that rank's progress says so
    _check_ranks_share_out(rank, args.out)
    opts = sweep_options(args, "run", report=rank is None or rank.primary)
    suite = load_suite(args.suite)
    backends = load_backends(None if args.backends is None else comma_list(args.backends, option), option,
                             opts.run.isolate, opts.run.case_timeout_s)   # --isolate: user files first in a worker
    if args.gpus:
        _check_gpus(args.gpus)
        if args.gpus > 1 and not args.dry_run:
            return _launch_gpus(args, suite)
    _warn_wall_timer(args)
    name = suite_name(suite)
    stamp_text = run_stamp()
    out_path = args.out or default_out(name, stamp_text)
    opts = replace(opts, run=replace(opts.run, run_id=stamp_text, suite=suite.name),   # the default's run id in its
                   out_named_by=stamp_text if Path(out_path) == default_out(name, stamp_text) else None)   # lock
    report = _report_path(args.report, name, out_path, stamp_text, probe=not args.dry_run,
                          resume=args.resume)   # before anything is written
    if shard_is_empty(suite.cases, opts) and not args.dry_run:   # no pair: no results file, env file or report
        check_writable(out_path, create=False, what="--out" if args.out else DEFAULT_OUT)   # bad input all the same
        log.warning("no case of suite %s falls to --shard %s (%s): nothing was run or written", suite.name,
                    args.shard, plural(len(suite.cases), "case"))
        return 0
    if args.out is None and not args.dry_run and (rank is None or rank.primary):   # a crash before the first
        drop_leftovers(name, suite, Path(out_path))                                 # row left its empty default
    out = claim_results(out_path, stamp_text, args.dry_run, "--out" if args.out else DEFAULT_OUT)
    written_out, written_report = out.absolute(), report.absolute()   # a backend's os.chdir moves neither
    opts = replace(opts, out=written_out, shown=out)   # rows, env file and lock; the lines name them as given
    with crash_advice(None if opts.run.isolate or args.dry_run else crash_lines(out, stamp_text)):
        result = execute(suite.cases, backends, opts, CONSOLE)   # a crash: a line naming --isolate, --resume
    CREATED_OUT[0] = None   # the sweep is over: its file holds what it wrote, kept whatever follows
    if args.dry_run:
        print_plan(suite, backends, result)
        return dry_run_code(result, args.allow_skip)
    if not result.primary:
        return 0  # torchrun rank > 0: rank 0 merges, reports and sets the exit code
    code = exit_code(result, args.determinism, args.allow_skip)
    if args.resume and (left := result.nothing_left(out)):
        log.info("%s", left)
    written = False
    if opts.run.report:
        resume_flags = "" if args.report or report == default_report(out) else f" --report {shlex.quote(str(report))}"
        report_due(out, written_report, resume_flags, report)   # for the line after an interrupt: rows in, report next
        with after_pairs(CONSOLE, args.quiet, said=not others(rank)):   # the last line said rank 0's wait
            shown = result.rows if result.report_rows is None else result.report_rows   # --resume: all of --out's
            failed = _write_report(shown, written_out, written_report, f"treebench {suite.name}", out, report,
                                   "--report" if args.report else DEFAULT_REPORT)
        written, code = not failed, failed or code
    run_ids = ", ".join(note_run_ids(result.rows))   # a --resume's: earlier ones, as a failed write to stdout says
    OUTCOME[0] = code   # the rows decide the exit code, whether or not stdout is still read
    if nothing_ran(result.rows) is None:
        warn_backends_that_ran_nothing(result.rows)
    print_summary(result.rows, f"treebench run: {suite.title}, {plural(len(suite.cases), 'case')}")
    lines = ([f"run_id: {run_ids}"] if run_ids else []) + [f"rows: {out}"]
    if written:   # a report that was not written is not named: the error above says where the rows are
        lines.append(f"report: {report}")
    earlier = result.earlier_rows   # counted while the run held --out: not a run that appended since
    if earlier and written and result.report_rows is not None:
        lines[-1] += f" (every row of {out}, among them {plural(earlier, 'row')} written before this run)"
    elif earlier and written:
        lines[-1] += (f" (this run's rows; {out} holds {plural(earlier, 'row')} of earlier runs: "
                      f"treebench report {shlex.quote(str(out))} -o FILE.html covers them all)")
    console().print("\n".join(lines), markup=False, highlight=False, soft_wrap=True)
    report_nothing_ran(result.rows, args.allow_skip)
    return code
