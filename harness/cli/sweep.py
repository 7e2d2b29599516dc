"""The sweep subcommands of the `treebench` CLI: run, check and merge, with the
backend loading and summary printing they share.

treebench.harness.cli.main owns argument parsing and exit codes and wires these in; the sweep
itself (shards, torchrun ranks, --resume, isolation) is treebench.harness.sweep.execute. Exit
codes: 0 success; 1 a failed row (mismatch or error), a nondeterministic row
under --determinism, or torchrun ranks whose rows could not be merged; bad
input raises ConfigError (the CLI's exit 2).
"""

from __future__ import annotations

import logging
import os
import re
import statistics
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

from treebench.harness.errors import ConfigError
from treebench.harness.store.rows import new_run_id

log = logging.getLogger("treebench.harness.cli.main")

FAILED = ("mismatch", "error")


# ---- backends and paths --------------------------------------------------------------


def load_one(spec: str):
    """A backend instance from a registry name, pkg.mod:Class or path/file.py:Class.

    Raises:
        ConfigError: unknown or unloadable backend (also when loading its module raised).
    """
    from treebench.harness.adapter.contract import load_backend
    from treebench.harness.run.isolate import SPEC_ATTR

    try:
        backend = load_backend(spec)
    except ConfigError:
        raise
    except Exception as e:  # noqa: BLE001 -- a user's module that fails to import is bad input
        raise ConfigError(f"--backend {spec!r}: loading it raised {type(e).__name__}: {e}") from None
    try:
        setattr(backend, SPEC_ATTR, spec)  # how an --isolate worker loads it again
    except AttributeError:
        pass  # __slots__: the worker gets the pickled instance instead
    return backend


def resolve_backends(spec: str | None) -> list:
    """Backends for `run`: None -> every available built-in; "all" -> every built-in;
    else a comma-separated list of names or class specs.

    Raises:
        ConfigError: an empty list, an unknown or unloadable backend, or two backends
            of one name.
    """
    import treebench.backends  # noqa: F401  (registers the built-in adapters)
    from treebench.harness.adapter.contract import REGISTRY

    if spec is None:
        found = [REGISTRY[n]() for n in sorted(REGISTRY)]
        return [b for b in found if availability_of(b) is None]
    if spec.strip() == "all":
        return [REGISTRY[n]() for n in sorted(REGISTRY)]
    names = list(dict.fromkeys(s.strip() for s in spec.split(",") if s.strip()))
    if not names:
        raise ConfigError("--backends is empty: give names such as torch_sdpa,reference, or all")
    from treebench.harness.adapter.contract import check_unique_names

    loaded = [load_one(n) for n in names]
    check_unique_names(loaded)      # before anything is written (the dry run refuses it too)
    return loaded


def availability_of(backend) -> str | None:
    """backend.availability(), with an exception turned into the reason."""
    try:
        return backend.availability()
    except Exception as e:  # noqa: BLE001
        return f"availability() raised {type(e).__name__}: {e}"


def _stamp() -> str:
    """UTC time plus a random token: runs started in the same second (job-array shards)
    get different default output files."""
    return new_run_id()


def safe_name(name: str, path: Path | None = None) -> str:
    """`name` made safe for a default file name: only [A-Za-z0-9._-] (others become "_"), no
    leading dots; else the suite file's stem, made safe the same way; else "suite"."""
    for candidate in (name, path.stem if path is not None else ""):
        cleaned = re.sub(r"[^A-Za-z0-9._-]+", "_", str(candidate or "")).lstrip("._-")
        if cleaned:
            return cleaned
    return "suite"


def _suite_name(suite) -> str:
    return safe_name(suite.name, getattr(suite, "path", None))


def _nonempty(value: str | None, option: str) -> str | None:
    """Raises ConfigError for an option given as an empty string (it would silently mean the default)."""
    if value is not None and not value.strip():
        raise ConfigError(f"{option} is empty: give a value, or leave the option out for its default")
    return value


def _check_suite_arg(suite: str) -> None:
    """Raises ConfigError when --suite names a directory."""
    if not suite.strip():
        raise ConfigError("--suite is empty: give a suite name such as smoke or a TOML file path")
    if Path(suite).is_dir():
        raise ConfigError(f"--suite {suite}: is a directory; give a suite TOML file (e.g. {Path(suite) / 'NAME.toml'}) "
                          "or a suite name")


def _report_path(path: str | None, suite: str, out: str | Path | None = None, stamp: str | None = None,
                 create: bool = True) -> Path:
    """The report path (default reports/local/<suite>-<UTC time>.html), checked before the run;
    create=False (a dry run) checks what it can without making its folder.

    Raises:
        ConfigError: not an .html/.htm path, an existing file that is not HTML, the --out file,
            a directory, or a folder that cannot be made or written.
    """
    from treebench.harness.store.paths import check_html_path

    p = Path(path) if path else Path("reports/local") / f"{suite}-{stamp or _stamp()}.html"
    check_html_path(p, "--report", f"reports/local/{suite}.html")
    if out is not None and p.resolve() == Path(out).resolve():
        raise ConfigError(f"--report {p}: is the --out results file; give a separate .html path")
    if not create:
        return p
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"--report {p}: cannot create its folder ({e.strerror})") from None
    if not os.access(p.parent, os.W_OK | os.X_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise ConfigError(f"--report {p}: cannot write there (permission denied); give a writable .html path")
    try:  # and a real write probe: os.access says yes to root on read-only file systems (/sys)
        if p.exists():
            with open(p, "ab"):
                pass
        else:
            with tempfile.NamedTemporaryFile(dir=p.parent, prefix=".treebench-probe-", suffix=".html"):
                pass
    except OSError as e:
        raise ConfigError(f"--report {p}: cannot write there ({e.strerror}); give a writable .html path") from None
    return p


ACTIVE_OUT: list[Path | None] = [None]   # the results file of the run/check in progress (for Ctrl-C)


# ---- output -----------------------------------------------------------------------------


def _summary_table(rows: list[dict], title: str) -> Table:
    """Per-backend counts of each status and the median of the timed medians (us)."""
    table = Table(title=title)
    for col in ("backend", "pass", "mismatch", "error", "skipped", "median_us"):
        table.add_column(col, justify="left" if col == "backend" else "right")
    for name in dict.fromkeys(r["backend"] for r in rows):
        mine = [r for r in rows if r["backend"] == name]
        counts = [str(sum(r["status"] == s for r in mine)) for s in ("pass", "mismatch", "error", "skipped")]
        timed = [r["median_us"] for r in mine if r.get("median_us") is not None]
        table.add_row(name, *counts, f"{statistics.median(timed):.1f}" if timed else "-")
    return table


def _timer_lines(rows: list[dict]) -> list[str]:
    """What the medians were timed with: 'timer: cuda_graph, L2 flushed' when every timed row
    shares it, else one such line per timer and L2 state with its backends, then why a timer
    other than the one asked for was used (at most 3 reasons); none without timing."""
    from treebench.harness.store.rows import timing_label

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


def _print_summary(rows: list[dict], title: str, max_lines: int = 20) -> None:
    """Prints the summary table, the timers with their L2 state, then one line per failed row
    (at most `max_lines`)."""
    out = Console()
    out.print(_summary_table(rows, title))
    for line in _timer_lines(rows):
        out.print(line, markup=False, highlight=False, soft_wrap=True)
    failed = [r for r in rows if r["status"] in FAILED]
    for r in failed[:max_lines]:
        out.print(f"{r['status']}: {r['backend']} on {r['case_id']}: {r['reason']}", markup=False, highlight=False, soft_wrap=True)
    if len(failed) > max_lines:
        out.print(f"... and {len(failed) - max_lines} more failed rows", markup=False, soft_wrap=True)
    nondet = [r for r in rows if r.get("deterministic") is False]
    for name in dict.fromkeys(r["backend"] for r in nondet):
        n = sum(r["backend"] == name for r in nondet)
        out.print(f"nondeterministic: {name} on {n} case(s): two calls gave bitwise different outputs",
                  markup=False, highlight=False, soft_wrap=True)


# ---- run, check, merge ------------------------------------------------------------------


def _sweep_options(args, mode: str, out: Path | None):
    """SweepOptions from the run/check arguments."""
    from treebench.harness.sweep.shard import parse_shard
    from treebench.harness.sweep.execute import SweepOptions

    return SweepOptions(mode=mode, out=out, quiet=args.quiet, determinism=args.determinism,
                        check_memory=not args.no_memory_check, isolate=args.isolate,
                        case_timeout_s=args.case_timeout, resume=args.resume,
                        timing_mode=getattr(args, "timer", "auto"),          # run only: check times nothing
                        flush_l2=getattr(args, "l2", "cold") == "cold",
                        shard=parse_shard(args.shard) if args.shard else None,
                        merge_timeout_s=args.merge_timeout, dry_run=args.dry_run)


def _check_shard(text: str | None) -> None:
    """Refuses a bad --shard before any output file or folder is created (ConfigError)."""
    if text:
        from treebench.harness.sweep.shard import parse_shard

        parse_shard(text)


def _exit_code(result, determinism: bool) -> int:
    """1 when a row failed, a rank's rows could not be merged, or (with --determinism) a row was
    nondeterministic; else 0."""
    bad = any(r["status"] in FAILED for r in result.rows) or result.missing_ranks
    return 1 if bad or (determinism and any(r.get("deterministic") is False for r in result.rows)) else 0


def _print_plan(suite, backends, result) -> None:
    """The --dry-run line: how many pairs this process would run and how many --resume skips."""
    Console().print(f"dry run: suite {suite.name}, {len(suite.cases)} cases x {len(backends)} backends: "
                    f"{result.planned} pairs to run here ({result.will_skip} of them skipped rows: backend "
                    f"unavailable or case unsupported), {result.resumed} already stored", markup=False,
                    highlight=False, soft_wrap=True)


def _write_report(rows: list[dict], out: Path, report: Path, title: str) -> bool:
    """Writes the HTML report from `rows` and the env files beside `out`; False (logged) on failure."""
    from treebench.harness.store.env import read_envs

    try:
        from treebench.harness.analyze.report import write_report

        write_report(rows, read_envs([out]), report, title=title)
        return True
    except Exception as e:  # noqa: BLE001 -- the rows are safe in the store; say so and fail
        log.error("report not written (%s: %s); the rows are in %s", type(e).__name__, e, out)
        return False


def _check_gpus(n: int) -> None:
    """Raises ConfigError when `--gpus n` cannot be honoured: under torchrun already, or fewer visible GPUs."""
    import torch

    from treebench.harness.sweep.shard import torchrun_rank

    if torchrun_rank() is not None:
        raise ConfigError("--gpus: already running under torchrun; drop --gpus (torchrun chose the ranks)")
    found = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if n > found:
        raise ConfigError(f"--gpus {n}: torch sees {found} CUDA GPU(s); ask for at most {found}")


def _launch_gpus(args, suite) -> int:
    """`run --gpus N` (N > 1): relaunches this command line under torchrun, with --out and --report
    filled in so that every rank uses the same files; returns torchrun's exit code."""
    from treebench.harness.sweep.shard import launch_torchrun, strip_option

    argv = strip_option(args.argv, "--gpus")
    from treebench.harness.store.paths import check_writable

    name = _suite_name(suite)
    stamp = _stamp()
    out = args.out or str(Path("results/local") / f"{name}-{stamp}.jsonl")
    report = _report_path(args.report, name, out, stamp)
    check_writable(out, create=False)
    if args.out is None:  # every rank must append to the same file
        argv += ["--out", out]
    if args.report is None:
        argv += ["--report", str(report)]
    return launch_torchrun(args.gpus, argv)


def _given_once(argv, names: tuple[str, ...]) -> None:
    """Refuses an option given more than once under its spellings (argparse keeps the last silently).

    Raises:
        ConfigError: two of `names` (or one twice) on the command line.
    """
    n = sum(a in names or a.split("=", 1)[0] in names for a in argv or [])
    if n > 1:
        hint = " (comma-separate several backends)" if "--backends" in names else ""
        raise ConfigError(f"{' / '.join(names)} given {n} times; give it once{hint}")


def cmd_run(args, console: Console) -> int:
    """`treebench run`: correctness then timing; rows, env file, HTML report; exit 1 on any failed row."""
    from treebench.harness.store.paths import check_writable
    from treebench.harness.model.suites import load_suite
    from treebench.harness.sweep.execute import execute

    for names in (("--backends", "--backend"), ("--timer",), ("--l2",)):
        _given_once(getattr(args, "argv", None), names)
    _check_suite_arg(args.suite)
    _nonempty(args.out, "--out")
    _nonempty(args.report, "--report")
    _nonempty(args.shard, "--shard")
    _check_shard(args.shard)
    if args.timer == "cuda_graph_loop" and args.l2 == "cold":
        raise ConfigError("run: --timer cuda_graph_loop times back-to-back calls, so it needs a warm L2: add --l2 warm")
    suite = load_suite(args.suite)
    backends = resolve_backends(args.backends)
    if args.resume and args.out is None:
        raise ConfigError("--resume needs --out: the results file whose rows are skipped")
    if args.gpus:
        _check_gpus(args.gpus)
        if args.gpus > 1 and not args.dry_run:
            return _launch_gpus(args, suite)
    name = _suite_name(suite)
    stamp = _stamp()
    out_path = args.out or Path("results/local") / f"{name}-{stamp}.jsonl"
    report = _report_path(args.report, name, out_path, stamp, create=not args.dry_run)  # before anything is written
    out = check_writable(out_path, not args.dry_run)
    ACTIVE_OUT[0] = None if args.dry_run else out
    if args.dry_run:
        _print_plan(suite, backends, execute(suite.cases, backends, _sweep_options(args, "run", out), console))
        return 0
    assert report is not None
    result = execute(suite.cases, backends, _sweep_options(args, "run", out), console)
    if not result.primary:
        return 0  # torchrun rank > 0: rank 0 merges, reports and sets the exit code
    code = _exit_code(result, args.determinism)
    if not _write_report(result.rows, out, report, f"treebench {suite.name}"):
        code = 1
    _warn_backends_that_ran_nothing(result.rows)
    _print_summary(result.rows, f"treebench run: suite {suite.name}, {len(suite.cases)} cases")
    Console().print(f"rows: {out}\nreport: {report}", markup=False, highlight=False, soft_wrap=True)
    return code


def cmd_check(args, console: Console) -> int:
    """`treebench check`: correctness only for one backend; exit 0 iff every case that ran passed."""
    from treebench.harness.store.paths import check_writable
    from treebench.harness.model.suites import load_suite
    from treebench.harness.sweep.execute import execute

    _check_suite_arg(args.suite)
    _nonempty(args.out, "--out")
    _nonempty(args.shard, "--shard")
    _check_shard(args.shard)
    _given_once(getattr(args, "argv", None), ("--backend", "--backends"))
    if "," in args.backend or args.backend.strip() == "all":
        raise ConfigError(f"check --backend {args.backend}: check takes one backend; run one check per "
                          "backend, or `treebench run --backends a,b` for several")
    suite = load_suite(args.suite)
    backend = load_one(args.backend)
    out = check_writable(args.out, not args.dry_run) if args.out else None
    ACTIVE_OUT[0] = None if args.dry_run else out
    result = execute(suite.cases, [backend], _sweep_options(args, "check", out), console)
    if args.dry_run:
        _print_plan(suite, [backend], result)
        return 0
    if not result.primary:
        return 0
    rows = result.rows
    if not rows:
        log.warning("no case ran: nothing left to run")
    _warn_backends_that_ran_nothing(rows)
    _print_summary(rows, f"treebench check: suite {suite.name}, backend {rows[0]['backend'] if rows else args.backend}")
    return _exit_code(result, args.determinism)


def _warn_backends_that_ran_nothing(rows: list[dict]) -> None:
    """One warning per backend whose every row was skipped, with the first row's reason
    (an unavailable backend otherwise shows only a count of skipped rows); run and check."""
    by_backend: dict[str, list[dict]] = {}
    for r in rows:
        by_backend.setdefault(r["backend"], []).append(r)
    for name, rs in by_backend.items():
        if all(r["status"] == "skipped" for r in rs):
            log.warning("%s: no case ran: %s", name, rs[0].get("reason") or "skipped")


def cmd_merge(args, console: Console) -> int:
    """`treebench merge OUT INPUT...`: appends the inputs' rows not yet in OUT (key: case_id,
    backend, env, timer, L2 state; a row of a known key measured later is appended too:
    `shard.merge_results`) and copies their env files beside OUT."""
    from treebench.harness.store.merge import merge_results, merge_row_inputs
    from treebench.harness.store.rows import read_rows

    if not args.out.strip():
        raise ConfigError("merge OUT is empty: give a results file path such as results/merged.jsonl")
    out = Path(args.out)
    inputs = [Path(p) for p in args.inputs]
    rows = read_rows(merge_row_inputs(inputs))
    if not rows:
        raise ConfigError(f"merge {' '.join(args.inputs)}: no result rows; point it at .jsonl result files "
                          "or folders of them (folders are not searched recursively)")
    added = merge_results(out, inputs, rows=rows)  # validates OUT before writing anything
    Console().print(f"merged {len(added)} rows into {out} ({len(rows) - len(added)} duplicates dropped)",
                    markup=False, highlight=False, soft_wrap=True)
    return 0


