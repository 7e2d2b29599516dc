"""Result rows: their schema, appending them, reading them, and what a row's fields say.

Layout (after asv's ``results/<machine>/<commit>-<env>.json``): a run appends one JSON object per line to
its results file (schema 2, fields in docs/architecture.md "Result rows and files") and writes its env
fingerprint beside it (`treebench.harness.store.env`). Reports and the gate read only the store.

Rows are appended with one ``os.write`` of one whole line on an ``O_APPEND`` descriptor, then fsync'd: a
killed run loses at most the row in flight. A write that fails part-way (a full disk, an I/O error) is
undone: the file is cut back to the rows it held. The one other truncation: a file that ends in a torn row
(a SIGKILL mid-write ends a write of more than a page short) is cut back to its last newline before the next
append, once those bytes are kept in the side file ``<out>.torn`` (`treebench.harness.store.torn`). A row is
identified by ``row_key``: (case_id, backend, env).
``row_l2_flushed`` reads a row's L2 state, older rows (no ``l2_flushed``) included. ``find_row`` names the
file and line of a row, for the readers' one-line messages (``row_places`` gives every row with its place).
The readers here read each results file's lines as UTF-8 (``file_lines``), and list each folder, inside
``reading``: one that cannot be is one ConfigError line with the OS's reason. Run ids, made and checked,
are in `treebench.harness.store.names`.

Schema history (asv's ``api_version`` and ``update_to_2``): ``read_rows`` upgrades
every older row with `migrate_row`, so old files stay readable, and refuses a row
of a newer schema than this code knows.

- 1: the first layout.
- 2: rows record the backend's ``mask_kind`` ("tree" or "causal"), so readers
  need no backend registry to tell a causal baseline from a tree backend, and
  the CPU's ``wall`` timer records ``cpu_threads``, the intra-op threads it timed under.
  Fields added since within schema 2, optional to readers (absent in older rows, read with ``row.get``, so
  no migration; what each holds: docs/architecture.md): ``l2_flushed``, ``kernel``, ``lse_max_abs_err``,
  ``failed_step`` (the step of a check or run a failure was found in), ``suite`` (the name of the suite swept).
"""

from __future__ import annotations

import codecs
import contextlib
import gc
import json
import logging
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NamedTuple

from treebench.harness.errors import ConfigError, ResultsWriteError, led_by, said_by
from treebench.harness.store.names import check_path_name, listed_results
from treebench.harness.store.torn import settle_tail, write_synced

log = logging.getLogger(__name__)

SCHEMA = 2  # version of the row layout written now; read_rows migrates older rows and refuses newer ones
ROW_FIELDS = (
    "schema", "run_id", "env", "timestamp", "suite", "backend", "mask_kind", "case", "case_id", "context_lens",
    "tree_sizes", "status", "reason", "failed_step", "max_abs_err", "max_rel_err", "mismatch_frac", "atol", "rtol",
    "worst", "nonfinite", "lse_max_abs_err", "kernel", "timer", "timer_fallback", "l2_flushed", "cpu_threads",
    "median_us", "p25_us", "p75_us", "cv", "n_samples", "samples_us", "flops", "bytes", "tflops", "tb_per_s",
    "pct_peak_bw", "deterministic", "check_axes")
STATUSES = ("pass", "mismatch", "error", "skipped")
# Schema-1 rows carry no mask_kind: these built-in backends solve the causal task, every other
# backend is taken as "tree". This table is the migration's only guess.
CAUSAL_BACKENDS_V1 = frozenset({"triton_causal", "causal_baseline"})


def append_row(path: str | Path, row: dict, named: Path | None = None) -> None:
    """Appends `row` as one JSON line to `path`, whole or not at all.

    One ``os.write`` of the whole line on an ``O_APPEND`` fd, then fsync (`_append`). A file
    that ends in a torn row is cut back to its last newline first, the torn bytes kept in
    ``<path>.torn``; a whole last row without its newline gets one (`torn.settle_tail`, whose line
    names the file as `named`, `path` as the user gave it, where given).

    Raises:
        ConfigError: the path cannot be opened for appending (a directory, no permission).
        ResultsWriteError: an OSError once the file is open (ENOSPC or EDQUOT: a full disk; EIO;
            EROFS); the file is cut back to the rows it held before, and the error's filename is `path`.
    """
    line = (json.dumps(row, sort_keys=False, allow_nan=True) + "\n").encode()
    _append(Path(path), line, "give --out a writable file path", named=named)


def append_rows(path: str | Path, rows: list[dict], command: str = "") -> None:
    """Appends many rows with one buffered write and one fsync (merges of thousands of rows), all
    or none of them (`_append`); `command` leads the line of a torn last row set aside (`torn.settle_tail`).

    Raises:
        ConfigError: the path cannot be opened for appending.
        ResultsWriteError: as append_row; none of `rows` is left in the file.
    """
    if rows:
        blob = "".join(json.dumps(r, sort_keys=False, allow_nan=True) + "\n" for r in rows).encode()
        _append(Path(path), blob, "give a writable file path", command)


def _append(path: Path, data: bytes, fix: str, command: str = "", named: Path | None = None) -> None:
    """Appends `data` (whole lines) to `path` and fsyncs it, once its end is settled (`torn.settle_tail`:
    a torn last row moved to ``<path>.torn``, a missing final newline added). A write or fsync that
    fails part-way (a full disk, an I/O error, an interrupt) is undone: the file is cut back to its
    length before, so it never ends in half a row this call wrote.

    Raises:
        ConfigError: `path` cannot be opened for appending; the message ends with `fix`.
        ResultsWriteError: any OSError once it is open (reading its end, setting a torn row aside, the
            write, the fsync), with that errno and `path` as its filename (the side file's where
            that failed), after the file is cut back (where the file system still allows it).
    """
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    except OSError as e:
        raise ConfigError(f"results file {path}: cannot append ({e.strerror}); {fix}") from None
    size = None
    try:
        data = settle_tail(path, fd, command, named) + data   # under the file's lock (store.lock) no one appends
        size = os.fstat(fd).st_size
        write_synced(fd, data)
    except BaseException as e:   # an interrupt too: the rows of this call are all there or none
        if size is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, size)
        if isinstance(e, OSError):
            raise ResultsWriteError(e.errno, e.strerror, e.filename or str(path)) from e
        raise
    finally:
        os.close(fd)


def row_key(row: dict, with_run: bool = False) -> tuple:
    """A row's identity: (case_id, backend, env), with run_id first when `with_run`."""
    key = (row.get("case_id"), row.get("backend"), row.get("env"))
    return (row.get("run_id"), *key) if with_run else key


def row_l2_flushed(row: dict) -> bool | None:
    """Whether an L2 flush ran before every timing sample of `row`; None for a row without timing. Rows
    written before the field existed (no ``l2_flushed``) were timed with the harness default: flushed on a
    GPU timer, not flushed on the CPU's ``wall`` timer."""
    if not row.get("timer"):
        return None
    flushed = row.get("l2_flushed")
    return flushed if isinstance(flushed, bool) else row["timer"] != "wall"


def timing_key(row: dict) -> tuple[str | None, bool | None]:
    """(timer, L2 flushed) of a row: how it was timed; (None, None) for an untimed row."""
    return row.get("timer"), row_l2_flushed(row)


def l2_label(flushed: bool | None) -> str:
    """'L2 flushed', 'warm L2', or '' (no timing) for display."""
    return "" if flushed is None else ("L2 flushed" if flushed else "warm L2")


def timing_label(row: dict) -> str | None:
    """'cuda_graph, L2 flushed' / 'cuda_graph, warm L2' for a timed GPU row, 'wall' for the CPU's
    timer (no L2 to speak of: nothing is ever flushed there); None without timing."""
    flushed = row_l2_flushed(row)
    if flushed is None:
        return None
    return "wall" if row["timer"] == "wall" else f"{row['timer']}, {l2_label(flushed)}"


def migrate_row(row: dict) -> dict:
    """`row` upgraded to the current SCHEMA (a new dict; a current row is returned as it is).

    Schema 1 -> 2: ``mask_kind`` is "causal" for the built-in causal backends
    (CAUSAL_BACKENDS_V1) and "tree" for every other backend, the migration's only guess;
    ``cpu_threads`` is None (not recorded then).

    Raises:
        ValueError: `row` has a schema newer than SCHEMA or not a known one (read_rows names the file).
    """
    schema = row.get("schema")
    if schema == SCHEMA:
        return row
    if schema != 1:
        raise ValueError(f"schema {schema!r}, this treebench reads schemas 1 to {SCHEMA}")
    kind = "causal" if row.get("backend") in CAUSAL_BACKENDS_V1 else "tree"
    return {**row, "schema": 2, "mask_kind": row.get("mask_kind", kind), "cpu_threads": row.get("cpu_threads")}


def is_known_schema(schema: object) -> bool:
    """True for a schema this code reads: 1 (migrated) up to SCHEMA."""
    return isinstance(schema, int) and not isinstance(schema, bool) and 1 <= schema <= SCHEMA


@contextlib.contextmanager
def reading(path: Path, what: str = "results file", done: str = "read", fix: str = "make it readable"
            ) -> Iterator[None]:
    """The block reads `path`; an OSError in it (no permission, EIO, a folder where a file was expected) is
    raised again as ConfigError, one line: '{what} {path}: cannot be {done} ({the OS's reason}); {fix}'.

    Raises:
        ConfigError: for an OSError of the block; other exceptions pass as they are.
    """
    try:
        yield
    except OSError as e:
        raise ConfigError(f"{what} {path}: cannot be {done} ({e.strerror or e}); {fix}") from None


def result_files(paths, command: str = "") -> list[Path]:
    """Expands folders into their *.jsonl files (sorted; `names.listed_results`, its warnings led by the `command`
    reading); keeps files as given. Raises ConfigError for a path that is missing, not a file or folder, named as
    the file system refuses (`check_path_name`), or that cannot be looked at (a folder on its way not searchable),
    and for a folder that cannot be listed (`reading`: glob would find no file in it and say nothing)."""
    out: list[Path] = []
    for p in map(Path, [paths] if isinstance(paths, (str, Path)) else paths):
        with reading(check_path_name(p, "results path"), "results path"):
            if p.is_dir():
                with reading(p, "results folder", "listed"):
                    out.extend(listed_results(p, command))   # a folder named *.jsonl skipped, with a warning
            elif p.is_file():
                out.append(p)
            elif p.exists():
                raise ConfigError(f"results path {p}: is not a regular file (a device, pipe or socket); give a "
                                  ".jsonl results file or a folder of them")
            else:
                raise ConfigError(f"results path {p}: not found; give a .jsonl results file or a folder of them")
    return out


@contextlib.contextmanager
def paused_gc() -> Iterator[None]:
    """Python's cyclic garbage collector off inside the block (restored after): rows hold no cycles, and its
    passes over json.loads' containers were a third of the time to read 10^5 rows (refcounting frees them)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


_WARNED: set[tuple[str, int]] = set()   # (absolute file, line) of torn lines already warned about


def read_rows(paths, require_rows: bool = False, command: str = "") -> list[dict]:
    """Reads result rows from JSONL files (or folders of them), in file order.

    A line that is not valid JSON (a torn line left by a killed run) is skipped
    with a warning naming file and line. Rows of an older schema are upgraded
    with `migrate_row`.

    Args:
        require_rows: when no complete row is read but a torn line is, raise (one line) instead
            of warning and returning nothing.
        command: the command reading, which leads each line said (`errors.said_by`): 'gate --baseline'.

    Raises:
        ConfigError: a path does not exist, a file cannot be read or a folder listed (`reading`: the
            OS's reason), a line is not UTF-8 (`file_lines`) or not a JSON result row, a row has a schema
            this code does not know (a newer one: upgrade treebench), or (with `require_rows`) the only result
            lines are torn.
    """
    with said_by(command), paused_gc():
        rows, torn = _read_lines(result_files(paths, command))
        if require_rows and torn and not rows:
            f, n, size = torn[0]
            raise ConfigError(f"results file {f}:{n}: a torn result line ({size} characters, cut short by a killed "
                              f"writer) and no complete row{f' ({len(torn)} torn lines)' if len(torn) > 1 else ''}; "
                              "rerun the run, or give a file that holds rows")
    for f, n, _ in torn:
        if (key := (os.path.abspath(f), n)) not in _WARNED:   # files are often read twice (validate, then use)
            _WARNED.add(key)
            log.warning("%s%s:%d: skipping a torn or malformed result line", led_by(command), f, n)
    return rows


def _read_lines(files: list[Path]) -> tuple[list[dict], list[tuple[Path, int, int]]]:
    """(rows, torn lines as (file, line, characters)) of `files`, as read_rows reads them.

    Raises:
        ConfigError: as read_rows, for a file that cannot be read or a line that is not a JSON result row.
    """
    rows: list[dict] = []
    torn: list[tuple[Path, int, int]] = []   # (file, line, characters) of torn lines
    for f in files:
        for n, line in file_lines(f):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except (json.JSONDecodeError, RecursionError):
                if not line.lstrip().startswith("{"):  # a torn row still starts with "{"
                    raise ConfigError(f"results file {f}:{n}: not a JSON result row; {f} is not a treebench "
                                      "results file (give .jsonl files written by treebench run)") from None
                torn.append((f, n, len(line)))
                continue
            rows.append(_checked_row(row, f, n))
    return rows, torn


def file_lines(f: Path) -> Iterator[tuple[int, str]]:
    """(1-based line number, text) of each line of results file `f`, as UTF-8 (a Windows editor's BOM dropped).
    Raises ConfigError as `reading`, or naming f:n and the byte for a line that is not UTF-8 (treebench writes
    UTF-8: such a byte is an edit or corruption, refused, not read as U+FFFD, which would name another backend)."""
    with reading(f), open(f, "rb") as fh:
        for n, raw in enumerate(fh, start=1):
            try:
                text = raw.decode("utf-8-sig" if n == 1 else "utf-8")
            except UnicodeDecodeError:
                text = None
            if text is None or text.startswith("\ufeff"):   # decoded once: a large file's lines are many
                raise ConfigError(f"results file {f}:{n}: {utf8_problem(raw, n)}; treebench writes UTF-8: edit or "
                                  "delete that line")
            yield n, text


def utf8_problem(raw: bytes, n: int) -> str | None:
    """Why line `n` (1-based) of a results file, `raw`, is not UTF-8 as `file_lines` decodes it ('byte 0xff at
    column 12 is not UTF-8 text'), or begins with a byte-order mark where only the file's first line may (an
    editor's BOM, dropped there; JSON reads none elsewhere), else None. treebench writes rows as ASCII JSON: such
    a byte is an edit."""
    if (raw[len(codecs.BOM_UTF8):] if n == 1 and raw.startswith(codecs.BOM_UTF8) else raw).startswith(codecs.BOM_UTF8):
        return f"a byte-order mark (U+FEFF) at the start of line {n}, where JSON reads none (only one before a file's first line is dropped)"
    try:
        raw.decode("utf-8-sig" if n == 1 else "utf-8")
    except UnicodeDecodeError as e:
        return f"byte 0x{raw[e.start]:02x} at column {e.start + 1} is not UTF-8 text"
    return None


def _checked_row(row: object, f: Path, n: int) -> dict:
    """Row `n` of file `f` at the current schema (migrated when older).

    Raises:
        ConfigError: not a JSON object or no schema field (not a treebench results file), or a
            schema this code does not know (a newer one: upgrade treebench).
    """
    if not isinstance(row, dict) or "schema" not in row:   # a JSON file of something else
        what = "has no schema field" if isinstance(row, dict) else "is not a JSON object"
        raise ConfigError(f"results file {f}: not a treebench results file (line {n} {what}); give .jsonl "
                          "files written by treebench run")
    got = row["schema"]
    if not isinstance(got, int) or isinstance(got, bool) or got < 1:
        raise ConfigError(f"results file {f}:{n}: schema {got!r}, this treebench reads schemas 1 to {SCHEMA}")
    if got > SCHEMA:
        raise ConfigError(f"results file {f}:{n}: schema {got}, newer than this treebench reads ({SCHEMA}); "
                          "upgrade treebench to read it")
    if (problem := run_id_problem(row)) is not None:
        raise ConfigError(f"results file {f}:{n}: {problem}; edit or delete that line")
    return migrate_row(row)


def run_id_problem(row: dict) -> str | None:
    """'field 'run_id' is missing' for a row of schema 2 on, as written (before `migrate_row`), that lacks
    it, as `validate.row_problem` names a null one: every such row treebench writes names its run (rm and
    the repeat check select rows by it); schema-1 rows, some written by hand, may lack it. Else None."""
    return "field 'run_id' is missing" if row.get("schema") != 1 and "run_id" not in row else None


class RowPlace(NamedTuple):
    """Where a row is: its results file and 1-based line, and the row as read_rows gives it."""

    path: Path   # the results file
    line: int    # 1-based line number in it
    row: dict    # the row, migrated to SCHEMA


def find_row(paths, match: Callable[[dict], bool], containing: str | None = None) -> RowPlace | None:
    """The first row of `paths` (`row_places(paths, containing)`) for which match(row) is true, else
    None; what a reader names in its message (the file of a bad row, of a row of a missing env).

    Raises:
        ConfigError: as row_places.
    """
    return next((place for place in row_places(paths, containing) if match(place.row)), None)


def row_places(paths, containing: str | None = None) -> Iterator[RowPlace]:
    """Every row of `paths` (files, or folders of them, in read_rows' order) with its file and line.
    Torn lines and rows of an unknown schema are passed over, as read_rows refuses or skips them;
    only lines holding the text `containing` (when given) are parsed: a cheap filter for a rare
    value in a large file.

    Raises:
        ConfigError: as result_files, for a path that does not exist; a file that cannot be read (`reading`).
    """
    for f in result_files(paths):
        for n, line in file_lines(f):
            if containing is not None and containing not in line:
                continue
            try:
                row = json.loads(line)
            except (json.JSONDecodeError, RecursionError):   # a torn line: read_rows skipped it
                continue
            if isinstance(row, dict) and is_known_schema(row.get("schema")):
                yield RowPlace(f, n, migrate_row(row))
