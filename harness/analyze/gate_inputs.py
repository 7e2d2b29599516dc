"""What the gate refuses to compare, wherever it runs (`treebench gate`, `treebench report --against`).

A side without rows has nothing to compare (`refuse_no_rows`), and a comparison whose two sides
share a results file or a run passes whatever was measured: a run compared with itself has no
regression to find (`refuse_shared_files`, `refuse_shared_runs`).
Without ``--allow-env-mismatch``, rows whose env fingerprint file is not beside them
(`refuse_missing_env`) and fingerprints that differ (`refuse_env_differences`) are refused
too (`env_differences` finds them). Rows that name no env at all (written by hand or by another
tool) have no fingerprint to compare: they are compared, with one warning per side naming the first
of them (`warn_rows_without_env`), with or without ``--allow-env-mismatch``. Each refusal is a ConfigError of one line that
names the command and its flags (`Sides`), so both commands say it in the same words; the CLI
turns it into exit 2 before anything is written.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from treebench.harness.errors import ConfigError, said_by
from treebench.harness.store.env import field_differences
from treebench.harness.store.rows import find_row, result_files
from treebench.harness.store.validate import missing_env_line

ENV_FIELDS = ("gpu_name", "sm_count", "driver", "cuda", "torch", "triton", "xformers", "flashinfer")
# compared too when every env of both runs is a CPU's (no gpu_name): a CPU run's times follow the
# processor and torch's intra-op threads (GPU-timed rows do not)
CPU_ENV_FIELDS = ("cpu_model", "cpu_count", "torch_threads", "omp_num_threads", "triton_interpret")
SAME_RUN = "the gate would compare a run with itself and pass: give the baseline's and a new run's results"


@dataclass(frozen=True)
class Sides:
    """How a command names the two sides it compares, for its one-line refusals."""

    command: str     # "gate", "report"
    baseline: str    # the baseline's option, e.g. "--baseline"
    candidate: str   # the candidate's option or argument, e.g. "--candidate"


@dataclass(frozen=True)
class EnvDifference:
    """One env field (ENV_FIELDS) whose values differ between the two runs' fingerprints."""

    field: str       # e.g. "driver"
    baseline: str    # the baseline's value(s), ", "-joined when its rows span several envs
    candidate: str   # the candidate's value(s), likewise


GATE = Sides("gate", "--baseline", "--candidate")
REPORT = Sides("report", "--against", "RESULTS")
log = logging.getLogger(__name__)


def refuse_no_rows(rows: Sequence[dict], paths: Sequence[str | Path], flag: str, sides: Sides,
                   backends: Collection[str] | None = None) -> None:
    """Refuses a side that holds no result rows (none of `backends`, when given): the gate would
    compare nothing with it and pass.

    Args:
        flag: the side's option or argument (`sides.baseline` or `sides.candidate`).

    Raises:
        ConfigError: `rows` is empty; names the side's paths.
    """
    if not rows:
        what = f" for backends {', '.join(sorted(backends))}" if backends else ""
        raise ConfigError(f"{sides.command} {flag} {' '.join(map(str, paths))}: no result rows{what}; point it at "
                          "a run's .jsonl file or folder (folders are not searched recursively)")


def refuse_shared_files(baseline: Sequence[str | Path], candidate: Sequence[str | Path], sides: Sides) -> None:
    """Refuses a results file that both sides read (named twice, or inside a folder named on the
    other side, or a link to it).

    Raises:
        ConfigError: a file on both sides, or a path that does not exist (as reading it would: its line, and
            a warning of a folder's entry, led by the side, `gate --baseline: results path ...`).
    """
    def identity(f: Path) -> tuple[int, int]:
        st = f.stat()
        return st.st_dev, st.st_ino              # a link or a second spelling of one file is the same file
    base_side, cand_side = f"{sides.command} {sides.baseline}", f"{sides.command} {sides.candidate}"
    with said_by(base_side):
        base = {identity(f) for f in result_files(baseline, base_side)}
    with said_by(cand_side):
        shared = [f for f in result_files(candidate, cand_side) if identity(f) in base]
    if shared:
        more = f" (and {len(shared) - 1} more)" if len(shared) > 1 else ""
        raise ConfigError(f"{sides.command}: {sides.baseline} and {sides.candidate} both read {shared[0]}{more}; "
                          f"{SAME_RUN}")


def refuse_shared_runs(base_rows: Sequence[dict], cand_rows: Sequence[dict], sides: Sides) -> None:
    """Refuses rows of one run on both sides (a copy of a results file, or one merged into both):
    rows carry their run's `run_id`.

    Raises:
        ConfigError: a run_id in both sides' rows.
    """
    shared = {str(r["run_id"]) for r in base_rows if r.get("run_id") is not None} & \
        {str(r["run_id"]) for r in cand_rows if r.get("run_id") is not None}
    if shared:
        more = f" (and {len(shared) - 1} more runs)" if len(shared) > 1 else ""
        raise ConfigError(f"{sides.command}: run {min(shared)} is in both {sides.baseline} and "
                          f"{sides.candidate}{more}; {SAME_RUN}")


def refuse_missing_env(paths: Sequence[str | Path], rows: Sequence[dict], envs: dict[str, dict], flag: str,
                       sides: Sides) -> None:
    """Refuses rows whose env fingerprint file (env-<id>.json) is not beside them: comparing
    fingerprints would report as a difference what is only a file not copied along.

    Args:
        flag: the side's option or argument (`sides.baseline` or `sides.candidate`).

    Raises:
        ConfigError: names the first missing env id and a results file whose rows carry it.
    """
    line = missing_env_line(paths, rows, envs)
    if line:
        raise ConfigError(f"{sides.command} {flag}: {line}; copy it there, or pass --allow-env-mismatch to "
                          "compare without it")


def warn_rows_without_env(paths: Sequence[str | Path], rows: Sequence[dict], flag: str, sides: Sides) -> str | None:
    """Warns, in one line naming the results file and line of the first, of `rows` that carry no env
    id: the env check (`refuse_missing_env`, `env_differences`) has no fingerprint of theirs to compare,
    so a run on another GPU or other software would pass it unseen. Returns the line, None when
    every row names its env.

    Args:
        flag: the side's option or argument (`sides.baseline` or `sides.candidate`).

    Raises:
        ConfigError: as result_files, for a path that does not exist.
    """
    backends = {r["backend"] for r in rows if not r.get("env")}
    if not backends:
        return None
    n = sum(not r.get("env") for r in rows)
    first = find_row(paths, lambda r: not r.get("env") and r.get("backend") in backends)
    where = f" (the first at {first.path}:{first.line})" if first else ""
    which = "1 row carries no env id" if n == 1 else f"{n} rows carry no env id"
    line = (f"{sides.command} {flag}: {which}{where}; {'its' if n == 1 else 'their'} GPU and software are not "
            "compared with the other side's (rows that treebench writes name their env file)")
    log.warning("%s", line)
    return line


def refuse_env_differences(notes: Sequence[str], sides: Sides) -> None:
    """Refuses env fingerprints that differ (`notes`: `env_differences`).

    Raises:
        ConfigError: `notes` is not empty.
    """
    if notes:
        raise ConfigError(f"{sides.command}: env fingerprints differ ({'; '.join(notes)}); compare runs from the "
                          "same GPU and software, or pass --allow-env-mismatch")


def env_field_differences(base_envs: dict[str, dict], cand_envs: dict[str, dict],
                          base_rows: Sequence[dict], cand_rows: Sequence[dict]) -> list[EnvDifference]:
    """The env fields (ENV_FIELDS, in that order, then CPU_ENV_FIELDS when every env of both sides
    is a CPU's) whose values differ between the fingerprints of the envs `base_rows` and
    `cand_rows` name (`env.field_differences`); envs without a fingerprint in `*_envs` are left out."""
    base, cand = ([envs[i] for i in sorted(cast("set[str]", {r.get("env") for r in rows if r.get("env")})) if i in envs]
                  for envs, rows in ((base_envs, base_rows), (cand_envs, cand_rows)))
    on_cpu = bool(base and cand) and not any(e.get("gpu_name") for e in base + cand)
    fields = ENV_FIELDS + (CPU_ENV_FIELDS if on_cpu else ())
    return [EnvDifference(*d) for d in field_differences(fields, base, cand)]


def env_differences(base_envs: dict[str, dict], cand_envs: dict[str, dict],
                    base_rows: Sequence[dict], cand_rows: Sequence[dict]) -> list[str]:
    """One line per env field (ENV_FIELDS) whose values differ between the runs' fingerprints
    (`env_field_differences`), 'field: baseline -> candidate'.

    A row whose env fingerprint file is missing counts as a difference.
    """
    notes = []
    for envs, rows, name in ((base_envs, base_rows, "baseline"), (cand_envs, cand_rows, "candidate")):
        ids = sorted(cast("set[str]", {r.get("env") for r in rows if r.get("env")}))
        notes += [f"{name} env fingerprint env-{i}.json not found beside its results" for i in ids if i not in envs]
    fields = env_field_differences(base_envs, cand_envs, base_rows, cand_rows)
    return notes + [f"{d.field}: {d.baseline} -> {d.candidate}" for d in fields]
