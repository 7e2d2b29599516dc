"""`treebench gate --baseline A --candidate B`: the regression gate as a command.

Reads both sides' rows and env fingerprints from the store, refuses rows whose env file
is missing and env fingerprints that differ unless `--allow-env-mismatch`, warns of rows that
name no env (no fingerprint to compare), compares them
(`treebench.harness.analyze.gate.compare_runs`) and writes the Markdown summary on
stdout (fit for `$GITHUB_STEP_SUMMARY`), optionally appended to `--summary` and as
JUnit XML to `--junit` (`treebench.harness.analyze.gate_render`). Exit 0 pass, 1 fail
(a significant slowdown, a correctness loss, a mismatch or error on a pair the baseline skipped or
lacks, a missing pair the baseline ran, nothing compared), 2 bad input (a ConfigError, turned into one
line by `treebench.harness.cli.main`), 130 on Ctrl-C (143 on SIGTERM), also one that the gate's
libraries drop or turn into another error (`treebench.harness.run.inflight.interrupts_noted`).
"""

from __future__ import annotations

import argparse
import logging
import math
from collections.abc import Sequence
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING

from treebench.harness.analyze.gate_inputs import (GATE, env_differences, refuse_env_differences,
                                                   refuse_missing_env, refuse_no_rows, refuse_shared_files,
                                                   refuse_shared_runs, warn_rows_without_env)
from treebench.harness.cli import NUMBER, NUMBER_RULE, emit, integer_option, number_option
from treebench.harness.cli.common import OUTCOME, comma_list
from treebench.harness.errors import ConfigError, said_by
from treebench.harness.run.inflight import interrupts_noted
from treebench.harness.store.env import read_envs
from treebench.harness.store.outputs import refuse_data_summary, refuse_foreign_junit, will_write, write_whole
from treebench.harness.store.paths import check_output_path, refuse_input_path
from treebench.harness.store.rows import paused_gc
from treebench.harness.store.validate import read_checked_rows

if TYPE_CHECKING:   # the gate's modules load numpy and scipy: imported where used, not for --help
    from treebench.harness.analyze.gate import GateResult

log = logging.getLogger(__name__)


MAX_PERCENT = 1000   # GateConfig's bound on the threshold (below 10, a 10x slowdown), as a percentage
ACCEPTED = (f"accepted: a fraction above 0 and below 1 (e.g. 0.05) or a percentage above 0% and below "
            f"{MAX_PERCENT}% (e.g. 5%)")


def _fraction(text: str) -> float:
    """'5%' or '0.05' -> 0.05: a fraction in (0, 1) or a percentage in (0%, 1000%), read as the decimal
    written (12.345% -> 0.12345, not 12.345 / 100 rounded twice).

    A bare number >= 1 is ambiguous ('5' could mean 5% or 500%) and is refused; the line suggests
    the percentage form only where that form is itself accepted. Each refusal says what is accepted.

    Raises:
        ConfigError: not a number, not finite, not written in ASCII digits ('1_0', full-width '５',
            which float() reads), not positive, so small that it rounds to 0, a bare number >= 1,
            or a percentage >= 1000%.
    """
    t = text
    percent = t.endswith("%")
    number = t[:-1] if percent else t
    try:
        finite = math.isfinite(float(number))
    except ValueError:
        raise ConfigError(f"gate --threshold {text!r}: not a number; {ACCEPTED}") from None
    if not finite:
        raise ConfigError(f"gate --threshold {text!r}: not a finite number; {ACCEPTED}")
    if not NUMBER.fullmatch(number):   # the rule of every numeric option, % aside
        raise ConfigError(f"gate --threshold {text!r}: write the number in ASCII digits 0-9 with a '.' and "
                          f"exponent if need be {NUMBER_RULE}; {ACCEPTED}")
    value = Decimal(number)
    if value <= 0:
        raise ConfigError(f"gate --threshold {text!r}: must be positive; {ACCEPTED}")
    if percent and value >= MAX_PERCENT:
        raise ConfigError(f"gate --threshold {text!r}: a percentage must be below {MAX_PERCENT}%; {ACCEPTED}")
    if not percent and value >= 1:   # the percentage form suggested only where it is accepted
        hint = f"write {t}% for {t} percent; " if value < MAX_PERCENT else ""
        raise ConfigError(f"gate --threshold {text!r}: a bare number must be a fraction below 1; {hint}{ACCEPTED}")
    fraction = float(value / 100 if percent else value)
    if fraction == 0:
        raise ConfigError(f"gate --threshold {text!r}: too small, it rounds to 0; {ACCEPTED}")
    return fraction


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds `treebench gate`'s arguments to `parser`."""
    parser.add_argument("--baseline", nargs="+", required=True, metavar="RESULTS",
                        help="baseline results: .jsonl files or folders of them (env files beside)")
    parser.add_argument("--candidate", nargs="+", required=True, metavar="RESULTS",
                        help="candidate results: .jsonl files or folders of them")
    parser.add_argument("--threshold", default="5%",
                        help="slower when the median ratio exceeds 1 + this: a fraction below 1 or a percentage "
                             "below 1000%% (default 5%%; 0.05 works too)")
    parser.add_argument("--alpha", type=number_option, default=0.01,
                        help="significance level of the one-sided Mann-Whitney U test (default 0.01)")
    parser.add_argument("--min-samples", type=integer_option, default=5, help="fewer samples: incomparable (default 5)")
    parser.add_argument("--backends", default=None, help="compare only these backends (comma-separated)")
    parser.add_argument("--allow-env-mismatch", action="store_true",
                        help="compare even when GPU, driver or library versions differ")
    parser.add_argument("--allow-missing", action="store_true",
                        help="pass even when the candidate lacks (case, backend) pairs of the baseline (those the "
                             "baseline skipped never fail the gate)")
    parser.add_argument("--junit", metavar="PATH", help="also write JUnit XML here (a .xml path)")
    parser.add_argument("--summary", metavar="PATH",
                        help="also append the Markdown summary here (e.g. $GITHUB_STEP_SUMMARY)")


def _backend_filter(text: str | None) -> set[str] | None:
    """--backends -> the set of names, None when not given.

    Raises:
        ConfigError: given but names nothing ('' or only commas), an empty name or one given twice.
    """
    if text is None:
        return None
    names = set(comma_list(text, "gate --backends"))
    if not names:
        raise ConfigError(f"gate --backends {text!r}: names no backend; give comma-separated names, "
                          "e.g. triton_tree,xformers_tree, or leave it out to compare every backend")
    return names


def _load(paths: Sequence[str], flag: str) -> tuple[list[dict], dict[str, dict]]:
    """Rows and env fingerprints of one side.

    Raises:
        ConfigError: a path is missing, or it holds no rows; an env file beside it cannot be read (each line
            led by `gate FLAG`).
    """
    rows = read_checked_rows(paths, f"gate {flag}")
    refuse_no_rows(rows, paths, flag, GATE)
    with said_by(f"gate {flag}"):   # an env file beside it that cannot be read
        return rows, read_envs(paths)


def _only(rows: list[dict], backends: set[str], paths: Sequence[str], flag: str) -> list[dict]:
    """`rows` of `backends`. A side left with none is no bad input (`--backends` names backends with
    rows on either side): its pairs are new or missing on the other side, none is compared and the
    gate fails; one warning names that side and the backends it does hold. Raises nothing."""
    kept = [r for r in rows if r["backend"] in backends]
    if not kept:
        log.warning("gate %s %s holds no rows of backends %s (it has: %s): no pair of them can be compared",
                    flag, " ".join(paths), ", ".join(sorted(backends)), ", ".join(sorted({r["backend"] for r in rows})))
    return kept


@said_by("gate")   # each refusal led by the command's name; a side's by its flag too (`_load`)
def run(args: argparse.Namespace) -> int:
    """Runs the gate and writes its files (`_compare`), then prints the Markdown summary; returns 0
    (pass) or 1 (fail: `GateResult.failed`). The gate's libraries (numpy, scipy) load and its files
    are written inside `inflight.interrupts_noted`, so that a Ctrl-C they drop or turn into another
    error still stops the command before the summary is printed. The verdict is the exit code also
    where stdout is closed before the summary is out (`| head -0`: common.OUTCOME, which main() keeps),
    and its counts reach stderr all the same: a CI gate never turns a regression into a pass.

    Raises:
        ConfigError: as `_compare` (the CLI exits 2).
        KeyboardInterrupt: Ctrl-C while the gate runs, also one that its libraries dropped or turned
            into another error (the CLI exits 130).
    """
    with interrupts_noted():
        result, text = _compare(args)
    OUTCOME[0] = code = 1 if result.failed else 0   # the verdict, whether or not stdout is still read
    try:
        emit(text)
    finally:   # on stderr even where stdout is gone
        if result.comparable == 0:
            log.warning("gate: no (case, backend) pair could be compared; failing")
        log.info("gate: %s", result.counts_text())
    return code


def _compare(args: argparse.Namespace) -> tuple[GateResult, str]:
    """The gate's result and its Markdown summary, appended to --summary and, as JUnit XML, written
    to --junit.

    Raises:
        ConfigError: bad flags (a --backends naming nothing, or a backend in neither side's
            rows), unreadable results, a results file on both sides, a --summary or --junit that
            cannot be written, a --junit file the gate did not write, a --summary that is a data
            file (`outputs.refuse_data_summary`), or, without --allow-env-mismatch, an env file
            missing beside its rows or env fingerprints that differ.
    """
    from treebench.harness.analyze.gate import GateConfig, compare_runs   # numpy: not for --help
    from treebench.harness.analyze.gate_render import markdown

    config = GateConfig(_fraction(str(args.threshold)), args.alpha, args.min_samples,
                        bool(getattr(args, "allow_missing", False)))
    if args.junit and Path(args.junit).suffix.lower() != ".xml":   # it overwrites: never a stray file
        raise ConfigError(f"gate --junit {args.junit}: must end in .xml (it is overwritten)")
    for flag, path in (("gate --summary", args.summary), ("gate --junit", args.junit)):
        if path is not None:                # '' too: check_output_path refuses it
            check_output_path(path, flag)
            refuse_input_path(path, flag, [*args.baseline, *args.candidate])
    if args.junit:                          # overwritten: only JUnit XML the gate wrote
        refuse_foreign_junit(args.junit, "gate --junit")
    if args.summary:                        # appended to: never a results file, suite, report, ...
        refuse_data_summary(args.summary, "gate --summary")
    if args.summary and args.junit and Path(args.summary).resolve() == Path(args.junit).resolve():
        raise ConfigError(f"gate --summary and --junit are the same file {args.junit}; give two paths")
    if args.summary:                        # for the line after an interrupt
        will_write(args.summary, "--summary", written=f"the summary was appended to --summary {args.summary}",
                   unchanged=f"nothing was appended to --summary {args.summary}")
    if args.junit:
        will_write(args.junit, "--junit")
    backends = _backend_filter(args.backends)
    refuse_shared_files(args.baseline, args.candidate, GATE)
    base_rows, base_envs = _load(args.baseline, "--baseline")
    cand_rows, cand_envs = _load(args.candidate, "--candidate")
    refuse_shared_runs(base_rows, cand_rows, GATE)
    if backends is not None:
        present = {r["backend"] for r in base_rows + cand_rows}
        unknown = sorted(backends - present)
        if unknown:
            raise ConfigError(f"gate --backends: {', '.join(unknown)} in neither side's rows; backends there: "
                              f"{', '.join(sorted(present))}")
        base_rows = _only(base_rows, backends, args.baseline, "--baseline")
        cand_rows = _only(cand_rows, backends, args.candidate, "--candidate")
    if not args.allow_env_mismatch:
        refuse_missing_env(args.baseline, base_rows, base_envs, GATE.baseline, GATE)
        refuse_missing_env(args.candidate, cand_rows, cand_envs, GATE.candidate, GATE)
    notes = env_differences(base_envs, cand_envs, base_rows, cand_rows)
    if not args.allow_env_mismatch:
        refuse_env_differences(notes, GATE)
    warn_rows_without_env(args.baseline, base_rows, GATE.baseline, GATE)
    warn_rows_without_env(args.candidate, cand_rows, GATE.candidate, GATE)
    with paused_gc():   # 10^5 rows a side: the collector's passes over them would be a third of the gate's time
        result = compare_runs(base_rows, cand_rows, config, notes)
        text = markdown(result, " ".join(args.baseline), " ".join(args.candidate))
    _write(args, text, result)
    return result, text


def _write(args: argparse.Namespace, text: str, result) -> None:
    """Appends the Markdown summary `text` to --summary and writes `result`'s JUnit XML to --junit
    (whole or not at all), each where given; their folders are made.

    Raises:
        ConfigError: either file cannot be written.
    """
    path = args.summary   # the file being written: a failed flush or close (`/dev/full`) names no filename
    try:
        if args.summary:
            Path(args.summary).parent.mkdir(parents=True, exist_ok=True)   # as --junit's
            with open(args.summary, "a", encoding="utf-8") as f:
                f.write(text)
        path = args.junit
        if args.junit:
            Path(args.junit).parent.mkdir(parents=True, exist_ok=True)
            from treebench.harness.analyze.gate_render import junit_xml
            write_whole(args.junit, junit_xml(result))
    except OSError as e:
        raise ConfigError(f"gate: cannot write {e.filename or path}: {e.strerror or e}; choose another path") from None
