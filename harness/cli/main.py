"""The `treebench` command line: run | check | list | tree | merge | gate | report.

Exit codes: 0 success; 1 a result failed (a row mismatched or errored, or the
gate found a regression); 2 bad input (malformed tree, unknown backend,
unreadable suite, bad --out, bad arguments), reported as ONE line on stderr,
``treebench: error: ...``, never a traceback. Result files are only ever
appended to. `gate` and `report` live in treebench.harness.analyze.gate and treebench.harness.analyze.report
(each exposes ``add_arguments(parser)`` and ``run(args) -> int``) and are
imported only when their subcommand runs. `run`, `check` and `merge` live in
treebench.harness.cli.sweep; they hand the sweep to treebench.harness.sweep.execute (shards, torchrun
ranks, --resume, isolation), and `run --gpus N` relaunches the command line
under torchrun (treebench.harness.sweep.shard.launch_torchrun).
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import math
import sys

from rich.console import Console
from rich.markup import escape
from rich.logging import RichHandler
from rich.table import Table

from treebench.harness.cli.sweep import FAILED, availability_of, cmd_check, cmd_merge, cmd_run, load_one, resolve_backends  # noqa: F401
from treebench.harness.errors import ConfigError
from treebench.harness.speculation import commands as speculation_commands  # tree-search, plan
from treebench.harness.timing.modes import MODES

log = logging.getLogger(__name__)

PROG = "treebench"
LAZY_COMMANDS = {"gate": "compare two result sets: exit 1 on a significant slowdown or a correctness loss",
                 "report": "write an HTML report from result files"}
_handler: logging.Handler | None = None  # the handler main() installed on the "harness" logger
TIMERS = MODES
L2_STATES = ("cold", "warm")  # run --l2: cold flushes the L2 before every timed call (flush_l2), warm does not


class Parser(argparse.ArgumentParser):
    """ArgumentParser whose errors are one ConfigError line (exit 2), not usage + message."""

    def error(self, message: str):  # type: ignore[override]
        where = self.prog.removeprefix(PROG).strip()
        raise ConfigError(f"{where + ': ' if where else ''}{message} (see {self.prog} --help)")


def _setup_logging(quiet: bool, console: Console) -> None:
    """One rich handler on the "harness" logger, on `console` (stderr), INFO or WARNING."""
    global _handler
    logger = logging.getLogger("treebench")
    if _handler is not None:
        logger.removeHandler(_handler)
    _handler = RichHandler(console=console, show_time=False, show_path=False, markup=False)
    logger.addHandler(_handler)
    logger.setLevel(logging.WARNING if quiet else logging.INFO)


# ---- subcommands ----------------------------------------------------------------------


def cmd_list(args, console: Console) -> int:
    """`treebench list`: every registered backend with its availability and reason
    (for an available backend, its optional `note()`: which path it takes here)."""
    import treebench.backends  # noqa: F401
    from treebench.harness.adapter.contract import REGISTRY

    table = Table(title="treebench backends")
    for col in ("backend", "available", "mask", "devices", "reason"):
        table.add_column(col, overflow="fold")   # narrow pipes wrap a long reason, never cut it
    for name in sorted(REGISTRY):
        b = REGISTRY[name]()
        reason = availability_of(b)
        devices = ",".join(getattr(getattr(b, "capabilities", None), "devices", ()) or ())
        note = getattr(b, "note", None)
        detail = reason or (_safe_note(note) if callable(note) else "")
        table.add_row(name, "no" if reason else "yes", getattr(b, "mask_kind", "tree"), devices,
                      escape(detail))   # install hints hold brackets: treebench[gpu]
    Console().print(table)
    return 0


def _safe_note(note) -> str:
    """A backend's note() for `treebench list`; a raising note() becomes its error."""
    try:
        return str(note() or "")
    except Exception as e:  # noqa: BLE001 -- a listing never fails on one backend
        return f"note() raised {type(e).__name__}: {e}"


def _fallback_summary(tree) -> dict:
    """parents / depths / mask when treebench.harness.model.trees has no tree_summary."""
    return {"spec": tree.spec, "size": tree.size, "parents": list(tree.parents), "depths": list(tree.depths),
            "ancestor_mask": ["".join("1" if v else "0" for v in row) for row in tree.ancestor_mask.tolist()]}


def cmd_tree(args, console: Console) -> int:
    """`treebench tree SPEC [--json]`: drawing, parents, depths and mask of a tree."""
    from treebench.harness.model import trees

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
        module = importlib.import_module(f"treebench.harness.analyze.{command}")
    except ImportError as e:
        raise ConfigError(f"`{PROG} {command}` is not available: cannot import harness.{command} ({e})") from None
    add, run = getattr(module, "add_arguments", None), getattr(module, "run", None)
    if not (callable(add) and callable(run)):
        raise ConfigError(f"`{PROG} {command}` is not available: harness.{command} lacks add_arguments/run")
    parser = Parser(prog=f"{PROG} {command}", description=LAZY_COMMANDS[command])
    add(parser)
    return int(run(parser.parse_args(extra)))


# ---- parser and entry point -----------------------------------------------------------


def _positive_seconds(text: str) -> float:
    """argparse type: a finite number of seconds > 0."""
    try:
        v = float(text)
    except ValueError:
        v = float("nan")
    if not (v > 0 and math.isfinite(v)):
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of seconds, e.g. 600")
    return v


def _gpu_count(text: str) -> int:
    """argparse type: an integer >= 1."""
    try:
        v = int(text)
    except ValueError:
        v = 0
    if v < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a GPU count; give an integer >= 1, e.g. --gpus 2")
    return v


def _add_sweep_options(p) -> None:
    """Options run and check share: isolation, determinism, memory check, resume, sharding."""
    p.add_argument("--isolate", action="store_true",
                   help="run each case x backend in a worker subprocess: a crash, hang or lost CUDA context "
                        "becomes an error row and a fresh worker runs the next case")
    p.add_argument("--case-timeout", type=_positive_seconds, default=None, metavar="SECONDS",
                   help="per case x backend time limit under --isolate (implies it); a hung worker is killed")
    p.add_argument("--determinism", action="store_true",
                   help="call each prepared callable twice and compare bitwise; nondeterministic rows exit 1")
    p.add_argument("--no-memory-check", action="store_true",
                   help="run pairs even when their predicted device memory exceeds the free memory")
    p.add_argument("--resume", action="store_true",
                   help="skip case x backend pairs already stored in --out for this env, whatever their status "
                        "(error rows too; needs --out); run times again the rows stored untimed or with another "
                        "--timer or --l2")
    p.add_argument("--shard", default=None, metavar="I/N",
                   help="run only the cases whose suite index is I mod N, I 0-based (0 <= I < N; cluster job arrays); "
                        "merge the files with `treebench merge`")
    p.add_argument("--merge-timeout", type=_positive_seconds, default=24 * 3600.0, metavar="SECONDS",
                   help="under torchrun: how long rank 0 waits for the other ranks before giving up the merge")
    p.add_argument("--dry-run", action="store_true", help="count the pairs this invocation would run, run nothing")
    p.add_argument("--quiet", action="store_true", help="no progress bar, warnings only")


def _add_run(sub) -> None:
    text = "correctness then timing for every case x backend; appends rows, writes a report"
    p = sub.add_parser("run", help=text, description=text[:1].upper() + text[1:] + ".",
                       allow_abbrev=False)  # --gpus relaunches the command line: options must be spelled out
    p.add_argument("--suite", default="smoke",
                   help="a suite shipped with treebench (smoke, check, check_p64, seed, random, targets) or a TOML file "
                        "path (default: smoke)")
    p.add_argument("--backends", "--backend", dest="backends", default=None,
                   help="comma-separated names, package.module:Class or path/file.py:Class, or 'all' "
                        "(default: every available built-in backend)")
    p.add_argument("--out", default=None,
                   help="results JSONL to append to (default: results/local/<suite>-<UTC time>.jsonl)")
    p.add_argument("--report", default=None, help="HTML report path (default: reports/local/<suite>-<UTC time>.html)")
    p.add_argument("--gpus", type=_gpu_count, default=None, metavar="N",
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
    _add_sweep_options(p)


def _add_check(sub) -> None:
    p = sub.add_parser("check", help="correctness only for one backend: exit 0 pass, 1 mismatch/error, 2 bad input")
    p.add_argument("--suite", default="check",
                   help="a suite shipped with treebench (smoke, check, check_p64, seed, random, targets) or a TOML file "
                        "path (default: check)")
    p.add_argument("--backend", "--backends", dest="backend", required=True,
                   help="one backend: registry name, package.module:Class or path/file.py:Class")
    p.add_argument("--out", default=None, help="also append the rows to this results JSONL")
    _add_sweep_options(p)


def _add_merge(sub) -> None:
    p = sub.add_parser("merge", help="append result files (e.g. --shard job outputs) to OUT, dropping duplicates (same case, backend, env, timer and L2 state)")
    p.add_argument("out", metavar="OUT", help="results JSONL to append to (created if missing)")
    p.add_argument("inputs", metavar="INPUT", nargs="+", help="result files or folders of them")


VALUE_OPTIONS_DASHED = ("--shard", "--threshold")  # values that may start with "-": --shard -1/2, gate --threshold -5% get a clear error


def _join_option_values(argv: list[str]) -> list[str]:
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


def build_parser() -> Parser:
    """The argparse tree of every subcommand (gate and report take their own arguments lazily)."""
    parser = Parser(prog=PROG, description="Benchmark and validate tree attention over a paged KV cache.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=Parser)
    _add_run(sub)
    _add_check(sub)
    _add_merge(sub)
    sub.add_parser("list", help="backends with availability and reasons")
    p = sub.add_parser("tree", help="print a token tree: drawing, parents, depths, mask")
    p.add_argument("spec", help="tree spec: chain:4, full:3:2, levels:4,2,1, parents:-1,0,0, [(0,), (1,)], "
                                "eagle:mc_sim_7b_63, ...")
    p.add_argument("--json", action="store_true", help="print the tree summary as JSON")
    speculation_commands.add_tree_search_parser(sub)
    speculation_commands.add_plan_parser(sub)
    for name, text in LAZY_COMMANDS.items():
        sub.add_parser(name, help=text, add_help=False)  # its own parser, built on use
    return parser


COMMANDS = {"run": cmd_run, "check": cmd_check, "list": cmd_list, "tree": cmd_tree, "merge": cmd_merge}
COMMANDS.update({"tree-search": lambda args, console: speculation_commands.run_tree_search(args),
                 "plan": lambda args, console: speculation_commands.run_plan(args)})


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `treebench` console script; returns the exit code.

    Any ConfigError (bad input) is one line on stderr and exit 2.
    """
    console = Console(stderr=True)
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args, extra = build_parser().parse_known_args(_join_option_values(argv))
        args.argv = argv  # `run --gpus` relaunches this command line
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
        from treebench.harness.cli.sweep import ACTIVE_OUT
        out = ACTIVE_OUT[0]
        where = (f" in {out}; to finish, run the same command with --out {out} --resume"
                 if out is not None else "")
        sys.stderr.write(f"{PROG}: interrupted; rows already written are kept{where}\n")
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
