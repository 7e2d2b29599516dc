"""The `treebench` command line: run | check | list | tree | gate | report.

Exit codes: 0 success; 1 a result failed (a row mismatched or errored, or the
gate found a regression); 2 bad input (malformed tree, unknown backend,
unreadable suite, bad --out, bad arguments), reported as ONE line on stderr,
``treebench: error: ...``, never a traceback. Result files are only ever
appended to. `gate` and `report` live in harness.gate and harness.report
(each exposes ``add_arguments(parser)`` and ``run(args) -> int``) and are
imported only when their subcommand runs.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import statistics
import sys
from datetime import datetime, timezone
from pathlib import Path

from rich.console import Console
from rich.logging import RichHandler
from rich.table import Table

from harness.errors import ConfigError

log = logging.getLogger(__name__)

PROG = "treebench"
LAZY_COMMANDS = {"gate": "compare two result sets: exit 1 on a significant slowdown or a correctness loss",
                 "report": "write an HTML report from result files"}
FAILED = ("mismatch", "error")
_handler: logging.Handler | None = None  # the handler main() installed on the "harness" logger


class Parser(argparse.ArgumentParser):
    """ArgumentParser whose errors are one ConfigError line (exit 2), not usage + message."""

    def error(self, message: str):  # type: ignore[override]
        where = self.prog.removeprefix(PROG).strip()
        raise ConfigError(f"{where + ': ' if where else ''}{message} (see {self.prog} --help)")


# ---- backends and paths --------------------------------------------------------------


def _load_one(spec: str):
    """A backend instance from a registry name, pkg.mod:Class or path/file.py:Class.

    Raises:
        ConfigError: unknown or unloadable backend (also when loading its module raised).
    """
    from harness.backend import load_backend

    try:
        return load_backend(spec)
    except ConfigError:
        raise
    except Exception as e:  # noqa: BLE001 -- a user's module that fails to import is bad input
        raise ConfigError(f"--backend {spec!r}: loading it raised {type(e).__name__}: {e}") from None


def resolve_backends(spec: str | None) -> list:
    """Backends for `run`: None -> every available built-in; "all" -> every built-in;
    else a comma-separated list of names or class specs.

    Raises:
        ConfigError: an empty list or an unknown or unloadable backend.
    """
    import backends  # noqa: F401  (registers the built-in adapters)
    from harness.backend import REGISTRY

    if spec is None:
        found = [REGISTRY[n]() for n in sorted(REGISTRY)]
        return [b for b in found if _availability(b) is None]
    if spec.strip() == "all":
        return [REGISTRY[n]() for n in sorted(REGISTRY)]
    names = list(dict.fromkeys(s.strip() for s in spec.split(",") if s.strip()))
    if not names:
        raise ConfigError("--backends is empty: give names such as torch_sdpa,reference, or all")
    return [_load_one(n) for n in names]


def _availability(backend) -> str | None:
    try:
        return backend.availability()
    except Exception as e:  # noqa: BLE001
        return f"availability() raised {type(e).__name__}: {e}"


def _stamp() -> str:
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")


def _report_path(path: str | None, suite: str) -> Path:
    """The report path (default reports/local/<suite>-<UTC time>.html), checked before the run.

    Raises:
        ConfigError: the path is a directory or its folder cannot be made.
    """
    p = Path(path) if path else Path("reports/local") / f"{suite}-{_stamp()}.html"
    if p.is_dir():
        raise ConfigError(f"--report {p}: is a directory; give a file path such as {p / 'report.html'}")
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"--report {p}: cannot create its folder ({e.strerror})") from None
    return p


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


def _print_summary(rows: list[dict], title: str, max_lines: int = 20) -> None:
    """Prints the summary table, then one line per failed row (at most `max_lines`)."""
    out = Console()
    out.print(_summary_table(rows, title))
    failed = [r for r in rows if r["status"] in FAILED]
    for r in failed[:max_lines]:
        out.print(f"{r['status']}: {r['backend']} on {r['case_id']}: {r['reason']}", markup=False, highlight=False)
    if len(failed) > max_lines:
        out.print(f"... and {len(failed) - max_lines} more failed rows", markup=False)


def _setup_logging(quiet: bool, console: Console) -> None:
    """One rich handler on the "harness" logger, on `console` (stderr), INFO or WARNING."""
    global _handler
    logger = logging.getLogger("harness")
    if _handler is not None:
        logger.removeHandler(_handler)
    _handler = RichHandler(console=console, show_time=False, show_path=False, markup=False)
    logger.addHandler(_handler)
    logger.setLevel(logging.WARNING if quiet else logging.INFO)


# ---- subcommands ----------------------------------------------------------------------


def _execute(cases, backends, mode: str, out: Path | None, quiet: bool, console: Console) -> list[dict]:
    """Fingerprints the env (written beside `out`), runs, returns rows."""
    from harness.runner import RunConfig, default_device, run_cases
    from harness.store import env_fingerprint, write_env

    device = default_device()
    env = env_fingerprint(device)
    if out is not None:
        write_env(out.parent, env)
    config = RunConfig(mode=mode, store_path=out, env_id=env["env_id"], device=str(device),
                       peak_bytes_per_s=env["peak_bw_bytes_per_s"], quiet=quiet)
    return run_cases(cases, backends, config, console=console)


def cmd_run(args, console: Console) -> int:
    """`treebench run`: correctness then timing; rows, env file, HTML report; exit 1 on any failed row."""
    from harness.store import check_writable, read_envs, read_rows
    from harness.suites import load_suite

    suite = load_suite(args.suite)
    backends = resolve_backends(args.backends)
    out = check_writable(args.out or Path("results/local") / f"{suite.name}-{_stamp()}.jsonl")
    report = _report_path(args.report, suite.name)
    rows = _execute(suite.cases, backends, "run", out, args.quiet, console)
    run_id = rows[0]["run_id"] if rows else None
    stored = [r for r in read_rows([out]) if r["run_id"] == run_id]
    code = 1 if any(r["status"] in FAILED for r in rows) else 0
    try:
        from harness.report import write_report

        write_report(stored, read_envs([out]), report, title=f"treebench {suite.name}")
    except Exception as e:  # noqa: BLE001 -- the rows are safe in the store; say so and fail
        log.error("report not written (%s: %s); the rows are in %s", type(e).__name__, e, out)
        code = 1
    _print_summary(rows, f"treebench run: suite {suite.name}, {len(suite.cases)} cases")
    Console().print(f"rows: {out}\nreport: {report}", markup=False, highlight=False)
    return code


def cmd_check(args, console: Console) -> int:
    """`treebench check`: correctness only for one backend; exit 0 iff every case that ran passed."""
    from harness.store import check_writable
    from harness.suites import load_suite

    suite = load_suite(args.suite)
    backend = _load_one(args.backend)
    out = check_writable(args.out) if args.out else None
    rows = _execute(suite.cases, [backend], "check", out, args.quiet, console)
    ran = [r for r in rows if r["status"] != "skipped"]
    if not ran:
        log.warning("no case ran: %s", rows[0]["reason"] if rows else "the suite is empty")
    _print_summary(rows, f"treebench check: suite {suite.name}, backend {rows[0]['backend'] if rows else args.backend}")
    return 1 if any(r["status"] in FAILED for r in rows) else 0


def cmd_list(args, console: Console) -> int:
    """`treebench list`: every registered backend with its availability and reason."""
    import backends  # noqa: F401
    from harness.backend import REGISTRY

    table = Table(title="treebench backends")
    for col in ("backend", "available", "mask", "devices", "reason"):
        table.add_column(col)
    for name in sorted(REGISTRY):
        b = REGISTRY[name]()
        reason = _availability(b)
        devices = ",".join(getattr(getattr(b, "capabilities", None), "devices", ()) or ())
        table.add_row(name, "no" if reason else "yes", getattr(b, "mask_kind", "tree"), devices, reason or "")
    Console().print(table)
    return 0


def _fallback_summary(tree) -> dict:
    """parents / depths / mask when harness.trees has no tree_summary."""
    return {"spec": tree.spec, "size": tree.size, "parents": list(tree.parents), "depths": list(tree.depths),
            "ancestor_mask": ["".join("1" if v else "0" for v in row) for row in tree.ancestor_mask.tolist()]}


def cmd_tree(args, console: Console) -> int:
    """`treebench tree SPEC [--json]`: drawing, parents, depths and mask of a tree."""
    from harness import trees

    tree = trees.parse_tree(args.spec)
    summary = getattr(trees, "tree_summary", _fallback_summary)(tree)
    if args.json:
        sys.stdout.write(json.dumps(summary) + "\n")
        return 0
    render = getattr(trees, "render_tree", None)
    utf8 = (getattr(sys.stdout, "encoding", None) or "").lower().replace("-", "") == "utf8"
    lines = [render(tree, ascii=not utf8)] if render else [f"tree {tree.spec}: T={tree.size}"]
    lines += [f"parents: {' '.join(map(str, summary['parents']))}",
              f"depths:  {' '.join(map(str, summary['depths']))}", "mask (row i: 1 where node j is i or its ancestor):"]
    lines += [f"  {i:>3} {row}" for i, row in enumerate(summary["ancestor_mask"])]
    sys.stdout.write("\n".join(lines) + "\n")
    return 0


def cmd_lazy(command: str, extra: list[str]) -> int:
    """Runs `gate` or `report` from its own module, importing it only now.

    Raises:
        ConfigError: the module is missing or lacks add_arguments / run; bad arguments.
    """
    try:
        module = importlib.import_module(f"harness.{command}")
    except ImportError as e:
        raise ConfigError(f"`{PROG} {command}` is not available: cannot import harness.{command} ({e})") from None
    add, run = getattr(module, "add_arguments", None), getattr(module, "run", None)
    if not (callable(add) and callable(run)):
        raise ConfigError(f"`{PROG} {command}` is not available: harness.{command} lacks add_arguments/run")
    parser = Parser(prog=f"{PROG} {command}", description=LAZY_COMMANDS[command])
    add(parser)
    return int(run(parser.parse_args(extra)))


# ---- parser and entry point -----------------------------------------------------------


def _add_run(sub) -> None:
    p = sub.add_parser("run", help="correctness then timing for every case x backend; appends rows, writes a report")
    p.add_argument("--suite", default="smoke", help="suite name (suites/NAME.toml) or TOML file (default: smoke)")
    p.add_argument("--backends", default=None,
                   help="comma-separated names, package.module:Class or path/file.py:Class, or 'all' "
                        "(default: every available built-in backend)")
    p.add_argument("--out", default=None,
                   help="results JSONL to append to (default: results/local/<suite>-<UTC time>.jsonl)")
    p.add_argument("--report", default=None, help="HTML report path (default: reports/local/<suite>-<UTC time>.html)")
    p.add_argument("--quiet", action="store_true", help="no progress bar, warnings only")


def _add_check(sub) -> None:
    p = sub.add_parser("check", help="correctness only for one backend: exit 0 pass, 1 mismatch/error, 2 bad input")
    p.add_argument("--suite", default="check", help="suite name or TOML file (default: check)")
    p.add_argument("--backend", required=True, help="registry name, package.module:Class or path/file.py:Class")
    p.add_argument("--out", default=None, help="also append the rows to this results JSONL")
    p.add_argument("--quiet", action="store_true", help="no progress bar, warnings only")


def build_parser() -> Parser:
    """The argparse tree of every subcommand (gate and report take their own arguments lazily)."""
    parser = Parser(prog=PROG, description="Benchmark and validate tree attention over a paged KV cache.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=Parser)
    _add_run(sub)
    _add_check(sub)
    sub.add_parser("list", help="backends with availability and reasons")
    p = sub.add_parser("tree", help="print a token tree: drawing, parents, depths, mask")
    p.add_argument("spec", help="tree spec: chain:4, full:3:2, levels:4,2,1, parents:-1,0,0, [(0,), (1,)], "
                                "eagle:mc_sim_7b_63, ...")
    p.add_argument("--json", action="store_true", help="print the tree summary as JSON")
    for name, text in LAZY_COMMANDS.items():
        sub.add_parser(name, help=text, add_help=False)  # its own parser, built on use
    return parser


COMMANDS = {"run": cmd_run, "check": cmd_check, "list": cmd_list, "tree": cmd_tree}


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `treebench` console script; returns the exit code.

    Any ConfigError (bad input) is one line on stderr and exit 2.
    """
    console = Console(stderr=True)
    try:
        args, extra = build_parser().parse_known_args(argv)
        if args.command in LAZY_COMMANDS:
            _setup_logging(False, console)
            return cmd_lazy(args.command, extra)
        if extra:
            raise ConfigError(f"{args.command}: unrecognized arguments: {' '.join(extra)} "
                              f"(see {PROG} {args.command} --help)")
        _setup_logging(getattr(args, "quiet", False), console)
        return COMMANDS[args.command](args, console)
    except ConfigError as e:
        sys.stderr.write(f"{PROG}: error: {' '.join(str(e).split())}\n")
        return 2
    except SystemExit as e:  # --help
        return e.code if isinstance(e.code, int) else 0
    except KeyboardInterrupt:
        sys.stderr.write(f"{PROG}: interrupted; rows already written are kept\n")
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
