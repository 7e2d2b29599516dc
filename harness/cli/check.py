"""`treebench check`: correctness only, for one backend; exit 0 when every case that ran
passed, 1 on a mismatch or an error row (or, under --isolate without --suite, a backend that
could not be loaded: `_not_loaded`), 2 on bad input, 3 when no case ran (backend
unavailable, every case skipped) unless --allow-skip."""

from __future__ import annotations

import logging
from dataclasses import replace

from treebench.harness.cli import emit
from treebench.harness.cli.common import (
    CONSOLE,
    CREATED_OUT,
    DRY_RUN_WRITES_NOTHING,
    NOTHING_WRITTEN,
    OUTCOME,
    add_sweep_options,
    check_suite_arg,
    claim_results,
    dry_run_code,
    exit_code,
    spelling_used,
    nonempty,
    note_run_ids,
    plural,
    print_plan,
    print_summary,
    report_nothing_ran,
    stamp,
    sweep_options,
)
from treebench.harness.errors import ConfigError

log = logging.getLogger(__name__)


DESCRIPTION = ("Correctness only, for one backend: every case of the suite (default: the backend's default check, "
               "built from its capabilities, then a coverage table) against the reference, nothing timed. Exit 0 "
               "when every case that ran passed, 1 when any mismatched or errored, 2 on bad input, 3 when no case "
               "ran (backend unavailable here, every case skipped) unless --allow-skip.")


def add_arguments(p) -> None:
    """The description and options of `treebench check`."""
    p.description = DESCRIPTION
    p.add_argument("--suite", default=None,
                   help="a suite shipped with treebench (check, check_p64, smoke, ..., findings/NAME) or a TOML file path; "
                        "default: the backend's default check, built from its capabilities, with a coverage table")
    p.add_argument("--deep", action="store_true",
                   help="the default check with more values on every axis (tree sizes, page sizes, seeds)")
    p.add_argument("--backend", "--backends", dest="backend", required=True,
                   help="one backend: registry name, package.module:Class, path/file.py:Class, or path/file.py "
                        "(the one backend class the file defines)")
    p.add_argument("--out", default=None, help="also append the rows to this results JSONL")
    add_sweep_options(p, timed=False)


def run(args) -> int:
    """`treebench check`: correctness only for one backend; exit 0 iff every case that ran passed.

    Raises:
        ConfigError: bad arguments, suite, backend or --out.
    """
    from treebench.harness.model.suites import load_suite
    from treebench.harness.run.inflight import mark_unwritten
    from treebench.harness.sweep.crash import crash_advice, crash_lines
    from treebench.harness.store.paths import check_writable
    from treebench.harness.sweep.execute import execute, shard_is_empty
    from treebench.harness.sweep.imports import UnloadedBackend, load_backends
    from treebench.harness.sweep.shard import shared_run_id

    if args.dry_run or args.out is None:   # what the line after Ctrl-C says: no rows to keep
        NOTHING_WRITTEN[0] = (DRY_RUN_WRITES_NOTHING if args.dry_run else
                              "check without --out keeps no rows: nothing was written; give --out FILE to keep them")
    else:
        mark_unwritten(args.out)   # Ctrl-C before the first row: nothing written, --out left as it was
    if args.suite is not None:
        check_suite_arg(args.suite)
        if args.deep:
            raise ConfigError("--deep deepens the default check; leave out --suite (or drop --deep)")
    nonempty(args.out, "--out")
    nonempty(args.shard, "--shard")
    opts = sweep_options(args, "check")
    option = spelling_used(getattr(args, "argv", None), ("--backend", "--backends"))   # as typed: errors name it
    if "," in args.backend or args.backend.strip() == "all":
        raise ConfigError(f"check {option} {args.backend}: check takes one backend; run one check per "
                          "backend, or `treebench run --backends a,b` for several")
    # --isolate: a file or module is loaded first in a worker; one whose loading ends that process is error rows
    backend = load_backends([args.backend], option, opts.run.isolate, opts.run.case_timeout_s,
                            warn=args.suite is not None)[0]
    if args.suite is None and isinstance(backend, UnloadedBackend):   # no capabilities: no default check
        return _not_loaded(backend, option, args.out)
    built = None
    if args.suite is None:
        suite, built = _default_suite(backend, args.deep)
        opts = replace(opts, run=replace(opts.run, check_axes=built.check_axes))
    else:
        suite = load_suite(args.suite)
    if shard_is_empty(suite.cases, opts) and not args.dry_run:   # no pair: no results file or env file
        if args.out:
            check_writable(args.out, create=False)   # bad input all the same
        log.warning("no case of %s falls to --shard %s (%s): nothing was checked or written", suite.title,
                    args.shard, plural(len(suite.cases), "case"))
        return 0
    run_id = shared_run_id() or stamp()   # the id the rows carry, named by an interrupt (rm --run-id takes it)
    opts = replace(opts, run=replace(opts.run, run_id=run_id, suite=suite.name))
    out = claim_results(args.out, run_id, args.dry_run) if args.out else None
    with crash_advice(None if opts.run.isolate or args.dry_run else crash_lines(out, run_id)):
        result = execute(suite.cases, [backend], replace(opts, out=out and out.absolute(), shown=out),   # as run does
                         CONSOLE)   # a crash: a line naming --isolate
    CREATED_OUT[0] = None   # the sweep is over: its file holds what it wrote, kept whatever follows
    if args.dry_run:
        print_plan(suite, [backend], result, recorded=out is not None)   # without --out no row is kept
        return dry_run_code(result, args.allow_skip)
    if not result.primary:
        return 0
    rows = result.rows
    if not rows:
        log.warning("no case to run here (--shard): nothing was checked")
    note_run_ids(rows)   # a --resume's: the runs its rows are in, named by a failed write to stdout, as run does
    OUTCOME[0] = code = exit_code(result, args.determinism, args.allow_skip)  # kept if stdout closes early
    if args.resume and out is not None and (left := result.nothing_left(out, "case")):
        log.info("%s", left)   # the exit code is the stored rows': 0 where they all passed
    shown = [{**r, "median_us": None} for r in rows]   # check times nothing: a run's timed row --resume took shows none
    print_summary(shown, f"treebench check: {suite.title}, backend {rows[0]['backend'] if rows else args.backend}")
    if built is not None:
        _print_coverage(rows, built.coverage, args.shard)
    report_nothing_ran(rows, args.allow_skip)
    return code


def _not_loaded(backend, option: str, out: str | None) -> int:
    """The default check of a backend whose loading ended or hung the worker it was loaded in first under
    --isolate (`imports.UnloadedBackend`): the check is built from the capabilities the backend declares,
    and it declared none, so no case is checked or written (with --suite its cases are error rows, as
    in `run`); one line says why, and the exit code is 1, as on error rows (its dry run's too).

    Raises:
        ConfigError: --out cannot be written (bad input all the same).
    """
    from treebench.harness.store.paths import check_writable

    if out:
        check_writable(out, create=False)
    log.error("%s %r could not be loaded: %s; the default check is built from the capabilities the backend "
              "declares, so no case of it could be built: nothing was checked or written", option, backend.name,
              backend.reason)
    return 1


def _default_suite(backend, deep: bool):
    """(a Suite of the backend's default check, the DefaultCheck it came from)."""
    from treebench.harness.checking.default_check import default_check
    from treebench.harness.model.suites import Suite

    built = default_check(backend, deep)
    name = "the deep default check" if deep else "the default check"   # as --help and the docs call it
    return Suite(name, "built from the backend's capabilities", (), built.cases, None), built


def _print_coverage(rows: list[dict], planned: dict, shard: str | None = None) -> None:
    """The coverage table after the summary: per axis the values that ran, those that errored,
    and those skipped with why; then the re-prepare and repeat steps, where some row reached them.
    Under --shard `shard`, of this shard's cases alone (a line says so): `treebench report` of the
    shards' merged --out files gives the whole check's.
    None when every case was skipped for one reason (the backend unavailable here): the line
    after it (`report_nothing_ran`) gives that reason once."""
    from treebench.harness.checking.default_check import check_steps
    from treebench.harness.model.coverage import coverage_from_rows, coverage_lines

    if rows and len({(r.get("status"), r.get("reason")) for r in rows}) == 1 and rows[0].get("status") == "skipped":
        return
    if shard:   # an axis none of this shard's cases varies: which of its values ran is not known here
        named = {axis for r in rows for axis in (r.get("check_axes") or {})}
        planned = {axis: e for axis, e in planned.items() if axis in named or axis == "device"}
    lines = coverage_lines(coverage_from_rows(rows, base=planned) | check_steps(rows))
    if shard and lines:
        lines.insert(0, f"--shard {shard}: the coverage of this shard's {plural(len(rows), 'case')} alone, on the "
                        "axes they vary; `treebench report` of the shards' merged --out files covers the whole check")
    emit("".join(f"{line}\n" for line in lines))
