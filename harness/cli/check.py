"""`treebench check`: correctness only, for one backend; exit 0 when every case that ran
passed, 1 on a mismatch or an error row, 2 on bad input, 3 when no case ran (backend
unavailable, every case skipped) unless --allow-skip."""

from __future__ import annotations

import logging
from dataclasses import replace

from treebench.harness.cli.common import (
    ACTIVE_OUT,
    CONSOLE,
    OUTCOME,
    add_suite_argument,
    add_sweep_options,
    check_suite_arg,
    exit_code,
    given_once,
    nonempty,
    print_plan,
    print_summary,
    report_nothing_ran,
    sweep_options,
)
from treebench.harness.errors import ConfigError

log = logging.getLogger(__name__)


def add_arguments(p) -> None:
    """The options of `treebench check`."""
    add_suite_argument(p, "check")
    p.add_argument("--backend", "--backends", dest="backend", required=True,
                   help="one backend: registry name, package.module:Class or path/file.py:Class")
    p.add_argument("--out", default=None, help="also append the rows to this results JSONL")
    add_sweep_options(p)


def run(args) -> int:
    """`treebench check`: correctness only for one backend; exit 0 iff every case that ran passed.

    Raises:
        ConfigError: bad arguments, suite, backend or --out.
    """
    from treebench.harness.model.suites import load_suite
    from treebench.harness.run.loading import load_one
    from treebench.harness.store.rows import check_writable
    from treebench.harness.sweep.execute import execute

    check_suite_arg(args.suite)
    nonempty(args.out, "--out")
    nonempty(args.shard, "--shard")
    opts = sweep_options(args, "check")
    given_once(getattr(args, "argv", None), ("--backend", "--backends"))
    if "," in args.backend or args.backend.strip() == "all":
        raise ConfigError(f"check --backend {args.backend}: check takes one backend; run one check per "
                          "backend, or `treebench run --backends a,b` for several")
    suite = load_suite(args.suite)
    backend = load_one(args.backend)
    out = check_writable(args.out, not args.dry_run) if args.out else None
    ACTIVE_OUT[0] = None if args.dry_run else out
    result = execute(suite.cases, [backend], replace(opts, out=out), CONSOLE)
    if args.dry_run:
        print_plan(suite, [backend], result)
        return 0
    if not result.primary:
        return 0
    rows = result.rows
    if not rows:
        log.warning("no case to run here (--shard): nothing was checked")
    OUTCOME[0] = code = exit_code(result, args.determinism, args.allow_skip)  # kept if stdout closes early
    print_summary(rows, f"treebench check: suite {suite.name}, backend {rows[0]['backend'] if rows else args.backend}")
    report_nothing_ran(rows, args.allow_skip)
    return code
