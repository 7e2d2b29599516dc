"""`treebench report RESULTS... -o reports/NAME.html`: the HTML report as a command.

Reads the rows and env fingerprints of RESULTS from the store (one file named twice, in any
spelling or through a link, is one input, as gate and merge take it: its rows kept once with
their warning, its name once in the default -o, the title and the page), checks the output path
(an .html file that is not one of the inputs), optionally runs the gate against
`--against`'s baseline results (refusing what `treebench gate` refuses:
`treebench.harness.analyze.gate_inputs`), and writes the page with
`treebench.harness.analyze.report.write_report`; prints the page's path. Exit 0, 2
on bad input (a ConfigError, turned into one line by `treebench.harness.cli.main`), or 130
on Ctrl-C (143 on SIGTERM), also one that the report's libraries drop or turn into another error
(`treebench.harness.run.inflight.interrupts_noted`).
"""

from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from treebench.harness.analyze.gate_inputs import (REPORT, env_differences, env_field_differences,
                                                   refuse_env_differences, refuse_missing_env, refuse_no_rows,
                                                   refuse_shared_files, refuse_shared_runs, warn_rows_without_env)
from treebench.harness.analyze.roles import DEFAULT_BASELINES, DEFAULT_OWN, OWN_KERNELS
from treebench.harness.cli import stdout_errors
from treebench.harness.errors import ConfigError, said_by
from treebench.harness.run.inflight import interrupts_noted
from treebench.harness.store.outputs import will_write
from treebench.harness.store.names import check_path_name, distinct_paths, kept_report
from treebench.harness.store.paths import check_html_path, check_output_path
from treebench.harness.store.validate import missing_env_line, read_checked_rows
from treebench.harness.store.env import read_envs

if TYPE_CHECKING:   # the report's modules load pandas and matplotlib: imported where used, not for --help
    from treebench.harness.analyze.gate import GateResult

log = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds `treebench report`'s arguments to `parser`."""
    parser.add_argument("results", nargs="*", metavar="RESULTS", help=".jsonl results files or folders of them")
    parser.add_argument("-o", "--output", default=None,
                        help="output .html (default reports/local/<first results name>.html)")
    parser.add_argument("--title", default=None, help="page title (default: treebench + the results' names)")
    parser.add_argument("--baseline-backend", default=None,
                        help=f"speedups are against this backend (default: first of {', '.join(DEFAULT_BASELINES)})")
    parser.add_argument("--own", default=None, metavar="NAME",
                        help=f"the backend the first table and its headline are about, against the best peer per "
                             f"cell (default {DEFAULT_OWN}, where present); treebench's own kernels "
                             f"({', '.join(OWN_KERNELS)}) are never its peers")
    parser.add_argument("--causal-backend", default=None,
                        help="the tree-mask overhead is against this backend (default causal_baseline, where "
                             "present; a name given here must have rows)")
    parser.add_argument("--against", nargs="+", metavar="BASELINE", default=None,
                        help="also run the gate against these baseline results and show its verdicts")
    parser.add_argument("--allow-env-mismatch", action="store_true",
                        help="with --against: compare across envs, and rows whose env file is missing")
    parser.add_argument("--acceptance", default=None, metavar="MODEL",
                        help="an acceptance model, a shipped model's name (illustrative-geometric) or a TOML/JSON "
                             "file: adds a speculation section, expected accepted tokens "
                             "against verify time per backend and the best tree per (B, L) (see `treebench plan`)")
    parser.add_argument("--step-us", default=None, metavar="US",
                        help="with --acceptance: the rest of the step in µs, 2000 or a+b*tokens (default 0); refused "
                             "where, with the verify µs, it is not a finite number at some B and T")


@said_by("report")   # each refusal led by the command's name; --against's by that flag too (`_gate`)
def run(args: argparse.Namespace) -> int:
    """Writes the report (`_write`), then warns of the rows it lacks and prints its path; returns 0.
    The report's libraries (pandas, matplotlib) load and the page is made inside
    `inflight.interrupts_noted`, so that a Ctrl-C they drop or turn into another error still
    stops the command before the path is printed.

    Raises:
        ConfigError: as `_write`; the CLI exits 2, and a report already at -o is left as it is.
        KeyboardInterrupt: Ctrl-C while the report is read or written, also one that its libraries
            dropped or turned into another error; the CLI exits 130.
    """
    with interrupts_noted():
        path, warnings = _write(args)
    for text in warnings:   # also on the page; a gap must not pass unseen
        log.warning("report: %s", text)
    with stdout_errors():
        sys.stdout.write(f"{path}\n")  # the command's output: where the report is
    return 0


def _write(args: argparse.Namespace) -> tuple[Path, list[str]]:
    """Writes the report of RESULTS to -o, whole or not at all; returns its path and the warnings of
    the rows it lacks.

    Raises:
        ConfigError: no RESULTS (all taken by --against: the line says so), missing results, no
            rows, bad --baseline-backend or --own, a --causal-backend without rows, or, with
            --against, what `treebench gate` refuses (a baseline without rows, a results file or a
            run on both sides; without --allow-env-mismatch, a missing env file or env fingerprints
            that differ).
    """
    if not args.results:   # nargs="*": `report --against A B` reads both as baselines, and says so
        raise ConfigError(
            f"report: no RESULTS: --against took every file after it ({' '.join(args.against)}); put the results "
            "files before --against, or end its list with --" if args.against else
            "report: give the results files (RESULTS), e.g. treebench report results/local/RUN.jsonl")
    sources = distinct_paths(args.results)   # a file named twice is one input, as gate and merge read it
    flag = "report -o" if args.output is not None else "report's default -o"
    out = check_output_path(args.output if args.output is not None else _default_output(sources), flag)
    check_html_path(out, flag, "reports/NAME.html")   # .html in lower case, no other file overwritten
    will_write(out, "the report")      # for the line after an interrupt, the libraries' loading included
    from treebench.harness.analyze.headline import missing_row_warnings   # pandas and matplotlib load here
    from treebench.harness.analyze.report import write_report

    rows, envs = read_checked_rows(args.results, "report"), read_envs(args.results)
    if not rows:
        raise ConfigError(f"report {' '.join(args.results)}: no result rows; give a run's .jsonl file or "
                          "folder (folders are not searched recursively)")
    causal = args.causal_backend or "causal_baseline"
    present = sorted({r["backend"] for r in rows})
    if args.step_us is not None and args.acceptance is None:
        raise ConfigError("report --step-us needs --acceptance MODEL (the step cost is used by the speculation "
                          "section)")
    if args.causal_backend is not None and causal not in present:
        raise ConfigError(f"report --causal-backend {causal!r}: no rows of it here; backends here: {', '.join(present)}")
    gate = _gate(args, rows, envs) if args.against else None
    sections = [_speculation(args, rows)] if args.acceptance is not None else []
    title = args.title or "treebench — " + ", ".join(Path(p).name for p in sources)
    path = write_report(rows, envs, out, title, baseline=args.baseline_backend, causal_backend=causal,
                        gate=gate, sources=sources, sections=sections, own=args.own, flag=flag)
    return path, [text for _, text in missing_row_warnings(rows)]


def _default_output(results: list[str]) -> Path:
    """The report's path without -o: reports/local/<first results name>.html, or where a report made from
    other results is there, the first free <name>-2.html, -3, ... (`names.kept_report`, as `run --resume`
    names its report), with a warning that names both.

    Raises:
        ConfigError: the first results path has a name the file system refuses (`names.check_path_name`).
    """
    check_path_name(results[0], "results path")   # before a report name made from it is refused in its stead
    path, why = kept_report(results, "this report")
    if why:
        log.warning("report: %s", why)
    return path


def _speculation(args: argparse.Namespace, rows: list[dict]) -> str:
    """The speculation section for --acceptance (and --step-us).

    Raises:
        ConfigError: an unreadable or invalid acceptance model, or a bad --step-us.
    """
    from treebench.harness.speculation.acceptance import load_model
    from treebench.harness.speculation.cost import parse_step_us
    from treebench.harness.speculation.plan import speculation_section

    step = parse_step_us(args.step_us) if args.step_us is not None else None
    return speculation_section(rows, load_model(args.acceptance), step)


def _gate(args: argparse.Namespace, rows: list[dict], envs: dict[str, dict]) -> GateResult:
    """GateResult of these rows against --against's baseline results, refused as `treebench gate`
    refuses them (`treebench.harness.analyze.gate_inputs`): a results file or a run on both sides,
    and, without --allow-env-mismatch, rows whose env file is missing or env fingerprints that
    differ. With --allow-env-mismatch, rows whose env file is missing are compared and a line on
    the terminal and in the gate section says so (the env fingerprints compared are those found),
    and the env fields that differ go in `env_fields`, which the page lists at its top. Rows naming
    no env are compared with a warning on the terminal (`warn_rows_without_env`).

    Raises:
        ConfigError: unreadable baseline results, a baseline without rows, a file or run on both sides, or, without
            --allow-env-mismatch, a missing env file or env fingerprints that differ.
    """
    from treebench.harness.analyze.gate import GateConfig, compare_runs

    refuse_shared_files(args.against, args.results, REPORT)
    base_rows = read_checked_rows(args.against, "report --against")
    with said_by("report --against"):
        base_envs = read_envs(args.against)
    refuse_no_rows(base_rows, args.against, REPORT.baseline, REPORT)
    refuse_shared_runs(base_rows, rows, REPORT)
    if not args.allow_env_mismatch:
        refuse_missing_env(args.against, base_rows, base_envs, REPORT.baseline, REPORT)
        refuse_missing_env(args.results, rows, envs, REPORT.candidate, REPORT)
    found = (base_envs, envs, _with_env_file(base_rows, base_envs), _with_env_file(rows, envs))
    notes = env_differences(*found)
    if not args.allow_env_mismatch:
        refuse_env_differences(notes, REPORT)
    warn_rows_without_env(args.against, base_rows, REPORT.baseline, REPORT)
    warn_rows_without_env(args.results, rows, REPORT.candidate, REPORT)
    missing = []
    for side, paths, side_rows, side_envs in (("baseline", args.against, base_rows, base_envs),
                                              ("candidate", args.results, rows, envs)):
        line = missing_env_line(paths, side_rows, side_envs)
        if line:
            missing.append(f"{side}: {line}; its rows were compared without their env fingerprint")
            log.warning("report --against: %s", missing[-1])
    return replace(compare_runs(base_rows, rows, GateConfig(), notes), env_missing=tuple(missing),
                   env_fields=tuple(env_field_differences(*found)))


def _with_env_file(rows: list[dict], envs: dict[str, dict]) -> list[dict]:
    """`rows` but those naming an env whose fingerprint file is missing (`missing_env_line` names it)."""
    return [r for r in rows if not r.get("env") or r["env"] in envs]
