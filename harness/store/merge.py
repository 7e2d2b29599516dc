"""Merging result files: rows of many inputs appended to one results file, each measurement once,
their env fingerprints copied beside it (`treebench merge`, and rank 0 after a torchrun launch)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from pathlib import Path

from treebench.harness.errors import ConfigError
from treebench.harness.store.env import ENV_FILE_RE, env_beside, read_envs
from treebench.harness.store.paths import check_writable, check_writable_made, remove_empty_folders
from treebench.harness.store.rows import append_rows, read_rows, row_key, timing_key
from treebench.harness.store.validate import drop_repeated_rows, row_time, validated_rows


def merge_row_inputs(inputs: Sequence[Path]) -> list[Path]:
    """The inputs that hold rows: env-*.json files (env fingerprints, merged separately) are left
    out; every other file is read as a results file (`read_merge_inputs`, which names a path the file
    system refuses: os.path.isfile raises nothing for it here)."""
    return [p for p in map(Path, inputs) if not (os.path.isfile(p) and ENV_FILE_RE.fullmatch(p.name))]


def read_merge_inputs(inputs: Sequence[Path], require_rows: bool = True) -> list[dict]:
    """The rows of `inputs` (env files left out), read and checked as `treebench report` reads its
    inputs (`validated_rows`: torn lines skipped with a warning, every field the readers need
    checked), so merge never writes a row that report or gate would refuse; a row read twice (a file
    named twice, also by another spelling or a link) is kept once, with a warning (`drop_repeated_rows`).

    Args:
        require_rows: False takes inputs that hold only torn lines as holding no rows (a torchrun
            rank killed in its first row), where True refuses them.

    Raises:
        ConfigError: a missing input, a file that is not a treebench results file, (`require_rows`)
            inputs holding only torn lines, a row of an unknown schema or with a bad field (names
            file, line, field).
    """
    return drop_repeated_rows(read_merge_rows(inputs, require_rows), "merge")


def read_merge_rows(inputs: Sequence[Path], require_rows: bool = True) -> list[dict]:
    """`read_merge_inputs` before a row read twice is dropped: every row of `inputs` (env files left out),
    read and checked (`validated_rows`), so that `treebench merge` can count the repeats it drops.

    Raises:
        ConfigError: as `read_merge_inputs`.
    """
    return validated_rows(merge_row_inputs(inputs), "merge", require_rows=require_rows)


def merge_results(out: Path, inputs: Sequence[Path], with_run: bool = False,
                  rows: Sequence[dict] | None = None) -> list[dict]:
    """Appends to `out` every row of `inputs` unless `out` or an earlier input already holds
    a row of the same key measured at the same time or later (its `timestamp`, as the instant it
    names: `validate.row_time`).

    Key: (case_id, backend, env), with run_id first when `with_run`, plus how the row was
    timed (timer and L2 state, `timing_key`): rows of one pair timed differently (say
    `--l2 cold` and `--l2 warm`) are different measurements, and both are kept. A row of a
    known key measured later (a re-run that now crashes or mismatches, say) is appended
    too, because readers take a pair's latest row (`validate.latest_rows`): keeping only the
    first would let an older pass hide it. Merging the same rows again adds nothing. Every input
    is read and validated before anything is written; env files beside the
    inputs are copied beside `out`. Stopped part-way (an interrupt, a failed write), it leaves `out`
    as it was: no row appended, no env file added, `out` and its folders removed where it made them.
    `rows`: the inputs' rows when the caller has already read them (as `read_merge_inputs(inputs)`
    reads them, as `treebench merge` does), so they are read once; without them the inputs are read with the same
    checks (`read_merge_inputs(inputs, require_rows=False)`:
    torchrun's rank files, where a rank killed in its first row leaves nothing but a torn line).

    Returns:
        The rows appended, in input order.

    Raises:
        ConfigError: a missing input, a row of another schema or with a bad field (names file, line
            and field), an unwritable `out`.
    """
    out = Path(out)
    if any(Path(p).resolve() == out.resolve() for p in inputs):
        raise ConfigError(f"merge: {out} is both the output and an input; give a new output file")
    if any(Path(p).is_dir() and out.resolve().parent == Path(p).resolve() for p in inputs):
        raise ConfigError(f"merge: {out} lies in the input folder {out.parent}, so its rows would be read "
                          "twice from then on; write it to another folder")
    check_writable(out, create=False, what="merge OUT")   # also: a .jsonl path
    incoming = read_merge_inputs(inputs, require_rows=False) if rows is None else rows
    envs = read_envs(list(inputs))
    created = not os.path.lexists(out)
    made = check_writable_made(out, what="merge OUT")[1]  # created (empty) only once every input was read
    try:
        return _append_new(out, incoming, envs, with_run)
    except BaseException:   # an interrupt, a failed write: OUT as it was (`_append_new`), or gone if made here
        if created:
            with contextlib.suppress(OSError):
                out.unlink()
            remove_empty_folders(made)
        raise


def _append_new(out: Path, incoming: Sequence[dict], envs: dict[str, dict], with_run: bool) -> list[dict]:
    """`merge_results` once OUT is there: appends the rows of `incoming` that are new to it, all or
    none (`rows.append_rows`), after the env files of `envs` beside it, each taken back if the rows
    are not appended where it was not there before (`env.env_beside`)."""
    seen: dict[tuple, tuple] = {}              # key -> latest time held (`row_time`)
    for r in read_rows([out], command="merge") if out.exists() else []:
        key, ts = (*row_key(r, with_run), *timing_key(r)), row_time(r)
        seen[key] = max(seen.get(key, ts), ts)
    added = []
    for row in incoming:
        key, ts = (*row_key(row, with_run), *timing_key(row)), row_time(row)
        if key not in seen or ts > seen[key]:
            seen[key] = ts
            added.append(row)
    with contextlib.ExitStack() as written:   # env files first: a folder refusing them leaves OUT's rows as they were
        for env in envs.values():
            written.enter_context(env_beside(out, env, repair=False))   # stopped: no env file it copied stays
        append_rows(out, added, command="merge")
    return added
