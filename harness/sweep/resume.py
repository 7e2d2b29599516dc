"""Which results file a `--resume` may continue: one that holds rows of the suite it sweeps, or none
yet (a warning says that the run starts anew). A file whose every row is of another suite is refused
before anything is written, since resuming would append this suite's rows to that run's. The pairs it
skips are those stored for this env (`stored_keys`). What a resumed run reports: its summary the latest
stored row of each of its sweep's pairs beside the rows it ran (`with_stored`), its report every row of
the file (`every_row`), as `treebench report OUT` shows them. Stored rows of the sweep's pairs that
another env measured (another package version, git commit, machine) are not skipped: `warn_other_envs`
says so in one line, naming what differs.

A row is of the suite when it records the suite's name (its ``suite`` field:
treebench.harness.store.rows), or, recording none (written before rows did), when its ``case_id``
is one of the suite's cases. A file holding rows of several suites (written by runs
without --resume) continues any of them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from pathlib import Path

from treebench.harness.errors import ConfigError
from treebench.harness.run.progress import plural
from treebench.harness.store.env import VOLATILE_ENV_FIELDS, field_differences, read_envs
from treebench.harness.store.rows import read_rows, row_key
from treebench.harness.store.validate import latest_rows, read_checked_rows

log = logging.getLogger(__name__)


def of_suite(row: dict, suite: str, case_ids: Collection[str]) -> bool:
    """Whether `row` is of suite `suite`, whose cases have the ids `case_ids`: by the suite name it
    records, else (an older row, recording none) by its case_id."""
    named = row.get("suite")
    return named == suite if named is not None else row.get("case_id") in case_ids


def called(suite: str) -> str:
    """How a line names a suite recorded by `suite`: 'suite smoke', or one built in code as it is named
    ('the default check': treebench.harness.model.suites.Suite.title)."""
    return suite if suite.startswith("the ") else f"suite {suite}"


def check_same_suite(out: Path, suite: str | None, case_ids: Collection[str], warn: bool = True,
                     leftovers: Collection[Path] = ()) -> None:
    """Refuses a `--resume` of suite `suite` (its cases' ids `case_ids`) into the results file `out`
    when `out` and `leftovers` (the rank files of a stopped torchrun launch, merged into it next) hold
    rows and none is of that suite; nothing to check for no suite name (a sweep not started from a
    suite). Where none of them holds a row, a warning (where `warn`: one process of a torchrun says it)
    that there is nothing to resume: the run starts anew. Every line names `out` as it is given (--out
    as the user gave it, read before the first pair) and is led by --resume.

    Raises:
        ConfigError: every row of `out` is of another suite (its name, where the rows record it), or
            `out` is not a results file (`read_rows`).
    """
    rows = read_rows([p for p in (out, *leftovers) if p.is_file()], command="--resume")
    if not rows and warn:
        log.warning("--resume: nothing to resume in %s (no rows there): starting a new run", out)
    if suite is None or not rows or any(of_suite(r, suite, case_ids) for r in rows):
        return
    names = sorted({str(r["suite"]) for r in rows if r.get("suite") is not None})
    fix = (f"resuming would add {called(suite)}'s rows to that run's file: resume it with its own suite, or give "
           f"{called(suite)} another --out")
    if names:
        older = " (and older rows that record none)" if any(r.get("suite") is None for r in rows) else ""
        raise ConfigError(f"--resume --out {out}: its rows are of {', '.join(map(called, names))}{older}, not of "
                          f"{called(suite)}; {fix}")
    raise ConfigError(f"--resume --out {out}: none of its {len(rows)} rows is of a case of {called(suite)} (they are "
                      f"another suite's, written before rows recorded their suite); {fix}")


def stored_keys(paths, env_id: str | None,
                keep: Callable[[dict], bool] | None = None) -> set[tuple[str | None, str | None]]:
    """(case_id, backend) of the rows in `paths` (missing files count as empty) measured in env
    `env_id`, and, when `keep` is given, for which keep(row) is true.

    Raises:
        ConfigError: a file holds rows of another schema.
    """
    existing = [p for p in map(Path, paths) if p.exists()]
    return {(r.get("case_id"), r.get("backend")) for r in read_rows(existing, command="--resume")
            if r.get("env") == env_id and (keep is None or keep(r))}


def env_changes(env: dict, stored: dict[str, dict | None], out: Path) -> list[str]:
    """What differs between this run's fingerprint `env` and those of the stored env ids `stored`
    (id -> its fingerprint, None where no env file of it is beside `out`): 'field: stored -> now' for
    each stable field (VOLATILE_ENV_FIELDS left out; git_commit in), in `env`'s order (`env.field_differences`),
    then each env file not found. Raises nothing."""
    found = [e for e in stored.values() if e is not None]
    fields = [f for f in env if f not in VOLATILE_ENV_FIELDS]
    notes = [f"{f}: {was} -> {now}" for f, was, now in field_differences(fields, found, [env])]
    return notes + [f"env-{i}.json not found beside {out}" for i, e in sorted(stored.items()) if e is None]


def warn_other_envs(paths: list[Path], env: dict, pairs: Collection[tuple[str, str]], done) -> None:
    """One warning where rows of the sweep's `pairs` ((case_id, backend)) stored in `paths` (--out first, as
    given: the line names it) that `done` accepts were measured in another env than `env`, for pairs stored
    for none in this env: --resume runs those pairs again. Names how many rows, and what differs (`env_changes`).

    Raises:
        ConfigError: a file of `paths` holds rows of a newer schema (`rows.read_rows`); an env file
            that cannot be read only drops the fields from the line.
    """
    rows = [r for r in read_rows([p for p in paths if Path(p).is_file()], command="--resume")
            if (r.get("case_id"), r.get("backend")) in pairs and done(r)]
    here = {row_key(r)[:2] for r in rows if r.get("env") == env["env_id"]}
    other = [r for r in rows if r.get("env") != env["env_id"] and row_key(r)[:2] not in here]
    if not other:
        return
    try:
        envs = read_envs([paths[0]])
    except ConfigError:   # an env file that cannot be read: the count alone
        envs = {}
    ids = {str(r["env"]) for r in other if r.get("env")}
    notes = env_changes(env, {i: envs.get(i) for i in ids}, paths[0])
    notes += [f"{plural(n, 'row')} naming no env"] if (n := sum(not r.get("env") for r in other)) else []
    log.warning("--resume: %s of this sweep's pairs in %s %s measured in another env (%s), so %s not skipped: "
                "%s run again", plural(len(other), "stored row"), paths[0], "was" if len(other) == 1 else "were",
                "; ".join(notes) or "its env file differs", "it is" if len(other) == 1 else "they are",
                "its pair is" if len(other) == 1 else "their pairs are")


def with_stored(out: Path, env_id: str, cases, names: list[str], rows: list[dict], done) -> list[dict]:
    """Rows of every (case, backend) of the sweep for this env: those stored before that `done`
    accepts (each pair's latest, as report and gate take it: `store.validate.latest_rows`) plus `rows`."""
    wanted = {(c.case_id, n) for c in cases for n in names} - {row_key(r)[:2] for r in rows}
    stored = [r for r in (read_rows([out], command="--resume") if Path(out).exists() else [])
              if r.get("env") == env_id and (r.get("case_id"), r.get("backend")) in wanted and done(r)]
    return list(latest_rows(stored).values()) + rows


def every_row(out: Path, shown: Path | None = None) -> list[dict] | None:
    """Every row of `out` as `treebench report OUT` reads them (`validate.read_checked_rows`): other backends',
    other envs' and `check` rows too, for the report of a run that resumed into it. None, with a warning naming
    the row, where a row would be refused: that run's report is then of its sweep's pairs alone. `out` is read
    where it is (absolute: a backend may have moved the working directory); the line names it as `shown`,
    --out as the user gave it."""
    try:
        return read_checked_rows([str(out)], "run --resume")   # this run's own lock draws no live-writer warning
    except ConfigError as e:
        said = str(e).replace(str(out), str(shown or out))
        log.warning("%s; this run's report shows only the pairs of its sweep", said)
        return None
