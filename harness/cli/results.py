"""The result-store subcommands: `treebench merge` (append result files to one, dropping
duplicates) and `treebench rm` (remove rows by run, backend and env). Two commands in
one module: `MERGE` and `RM` (the cli package holds at most ten modules)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from treebench.harness.cli.common import Command, console, plural
from treebench.harness.errors import ConfigError, said_by
from treebench.harness.store.names import NAME_ROOM, check_path_name
from treebench.harness.store.rows import reading

if TYPE_CHECKING:   # the store's modules are imported where used, not for --help
    from treebench.harness.store.remove import Removed

log = logging.getLogger(__name__)


def _print(text: str) -> None:
    console().print(text, markup=False, highlight=False, soft_wrap=True)


def add_merge_arguments(p) -> None:
    """The description and arguments of `treebench merge`."""
    p.description = ("Append result files (--shard jobs' outputs, torchrun rank files) to OUT without duplicates: "
                     "a row is dropped when OUT (or an input before it) holds one of the same case, backend, env, "
                     "timer and L2 state measured at the same time or later; their env files are copied beside "
                     "OUT. Exit 0, 2 on bad input.")
    p.add_argument("out", metavar="OUT", help="results JSONL to append to (created if missing)")
    p.add_argument("inputs", metavar="INPUT", nargs="+", help="result files or folders of them")


@said_by("merge")   # each refusal led by the command's name, an env file's or a lock's too
def run_merge(args) -> int:
    """`treebench merge OUT INPUT...`: appends the inputs' rows not yet in OUT (key: case_id,
    backend, env, timer, L2 state; a row of a known key measured later is appended too:
    `shard.merge_results`) and copies their env files beside OUT; warns of an input a run is still
    writing (`validate.warn_live_writers`) and of rows whose env file was beside no input
    (`_warn_missing_env`).

    Raises:
        ConfigError: an empty OUT, inputs without result rows, a row that report or gate would
            refuse (names file, line and field), a bad OUT file, an OUT that a run is writing.
    """
    from treebench.harness.store.lock import hold
    from treebench.harness.store.merge import merge_results, merge_row_inputs, read_merge_rows
    from treebench.harness.store.outputs import will_write
    from treebench.harness.store.validate import drop_repeated_rows, warn_live_writers

    if not args.out.strip():
        raise ConfigError("merge OUT is empty: give a results file path such as results/merged.jsonl")
    out = check_path_name(args.out, "merge OUT", NAME_ROOM)
    inputs = [Path(p) for p in args.inputs]
    read = read_merge_rows(inputs)   # checked as report and gate check them, before OUT is touched
    rows = drop_repeated_rows(read, "merge")   # `merge.read_merge_inputs`, its repeats counted below
    warn_live_writers(merge_row_inputs(inputs), "merge")
    if not rows:
        raise ConfigError(f"merge {' '.join(args.inputs)}: no result rows; point it at .jsonl result files "
                          "or folders of them (folders are not searched recursively)")
    will_write(out, "merge OUT", written=f"the rows were merged into {out}")   # for the line after an interrupt
    with hold(out if out.parent.is_dir() else None, "wait for it to finish or merge into another OUT"):
        added = merge_results(out, inputs, rows=rows)  # validates OUT before writing anything
    _warn_missing_env(out, merge_row_inputs(inputs), rows)
    twice = f", {len(read) - len(rows)} of them read twice" if len(read) > len(rows) else ""   # as warned above
    _print(f"merged {plural(len(added), 'row')} into {out} ({plural(len(read) - len(added), 'duplicate')} "
           f"dropped{twice})")
    return 0


def _warn_missing_env(out: Path, inputs: list[Path], rows: list[dict]) -> None:
    """Warns, in one line naming the env id and an input holding its rows, when rows of an env
    whose fingerprint file was beside no input (and is not beside OUT either) went into OUT: the
    gate and `report --against` refuse such rows (`validate.missing_env_line`), as they refused the input's."""
    from treebench.harness.store.env import read_envs
    from treebench.harness.store.validate import missing_env_line

    line = missing_env_line(inputs, rows, read_envs([out]))   # OUT's folder now holds every env file copied
    if line:
        log.warning("merge: %s; none is beside %s either, so gate and report --against refuse its rows there: "
                    "copy it beside %s", line, out, out)


def add_rm_arguments(p) -> None:
    """The arguments of `treebench rm`: a results file and at least one filter."""
    p.add_argument("results", metavar="RESULTS", help="results JSONL to remove rows from")
    p.description = ("Remove rows from a results file, atomically. A row is removed when it matches every option "
                     "given, each by one of its values: --run-id A B --backend x removes backend x's rows of runs "
                     "A and B.")
    p.add_argument("--run-id", dest="run_ids", action="extend", nargs="+", default=[], metavar="ID",
                   help="only rows of one of these runs (repeatable)")
    p.add_argument("--backend", dest="backends", action="extend", nargs="+", default=[], metavar="NAME",
                   help="only rows of one of these backends (repeatable)")
    p.add_argument("--env", dest="env_ids", action="extend", nargs="+", default=[], metavar="ENV",
                   help="only rows of one of these env fingerprints (repeatable)")


@said_by("rm")   # each refusal led by the command's name, a lock's too
def run_rm(args) -> int:
    """`treebench rm RESULTS --run-id ID... --backend NAME... --env ENV...`: removes the rows that
    match every option given, each with one of its values (treebench.harness.store.remove.remove_rows),
    and says how many and which, and how many of them the readers refuse (rm is how such a row is taken out).

    Raises:
        ConfigError: no filter (rm never empties a file by default), an empty value or one given
            twice, a value that names no row or none the other options select, options no row
            matches together, a row the readers refuse that the options do not select (nothing is
            removed then), a missing file, one that cannot be read, or one named as the file system
            refuses (`names.check_path_name`), a file a run is writing.
    """
    filters = {"--run-id": args.run_ids, "--backend": args.backends, "--env": args.env_ids}
    if not any(filters.values()):
        raise ConfigError("rm: give at least one of --run-id, --backend, --env: rm removes only the rows "
                          "they select")
    for option, values in filters.items():
        if any(not v.strip() for v in values):
            raise ConfigError(f"rm: {option} is empty: give a value")
        twice = next((v for i, v in enumerate(values) if v in values[:i]), None)
        if twice is not None:   # as every other list of names refuses it (common.comma_list)
            raise ConfigError(f"rm: {option} {twice!r} given twice; give each value once")
    from treebench.harness.store.lock import hold
    from treebench.harness.store.outputs import will_write
    from treebench.harness.store.remove import describe, not_results_file, remove_rows

    path = check_path_name(args.results, "rm", NAME_ROOM)   # rm rewrites it: a temporary file beside it
    with reading(path, "rm"):   # a folder on its way that cannot be searched
        if (why := not_results_file(path)) is not None:   # before its lock is taken
            raise ConfigError(f"rm {path}: {why}")

    will_write(path, "rm", written=f"the rows were removed from {path}",   # for the line after an interrupt
               unchanged=f"no row was removed: {path} is left as it was")
    given = {"run_ids": tuple(args.run_ids), "backends": tuple(args.backends), "env_ids": tuple(args.env_ids)}
    with hold(path, "wait for it to finish, then remove the rows"):   # not while a run appends to it
        removed = remove_rows(path, **given)
    _print(f"removed {plural(removed.rows, 'row')} from {path} ({describe(**given)}){_refused_note(removed)}")
    return 0


def _refused_note(removed: Removed) -> str:
    """The summary's note of the removed rows that gate, report and merge refuse (`remove.Removed.refused`),
    by line (at most 5), where there are any: rm took them out, and the user is told."""
    lines = removed.refused
    if not lines:
        return ""
    which = "it" if removed.rows == 1 else "all of them" if len(lines) == removed.rows else f"{len(lines)} of them"
    shown = ", ".join(map(str, lines[:5])) + (", ..." if len(lines) > 5 else "")
    kind = "was a row" if len(lines) == 1 else "were rows"
    return f"; {which} {kind} that gate, report and merge refuse (line{'s' if len(lines) > 1 else ''} {shown})"


MERGE = Command(add_merge_arguments, run_merge)
RM = Command(add_rm_arguments, run_rm)
