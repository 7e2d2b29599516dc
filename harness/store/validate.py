"""Result rows read for `treebench gate`, `treebench report` and `treebench merge`: every field they
rely on checked (`row_problem`), and (gate, report) a row read twice (a file given twice) kept once;
two measurements under one run id (a reused id) are two rows, both kept; a file that another run is
still writing is warned of (its rows may be partial). Of a pair's rows, readers take the latest
(`latest_rows`): the gate, the report and a resumed run's summary. An env fingerprint beside the rows is
checked as they are (`fingerprint_problem`, which `store.env` reads with), and rows whose env file is not
beside them are named (`missing_env_line`)."""

from __future__ import annotations

import copy
import json
import logging
import math
import re
from collections.abc import Iterable, Sequence
from datetime import datetime, timezone
from functools import lru_cache

from treebench.harness.errors import ConfigError
from treebench.harness.model.cases import CASE_FIELDS, LATER_AXES, Case
from treebench.harness.model.tree_specs import parse_tree
from treebench.harness.store.lock import live_writer
from treebench.harness.store.names import is_run_id
from treebench.harness.store.rows import STATUSES, find_row, read_rows, result_files, timing_key
from treebench.harness.timing.modes import TIMERS

REQUIRED_FIELDS = {"backend": str, "case": dict, "case_id": str, "status": str}
# optional text fields, a string or null (docs/architecture.md "Result rows and files"); `timer` a string on a timed row
STRING_FIELDS = ("suite", "mask_kind", "reason", "failed_step", "kernel", "timer", "timer_fallback")
# case axes the report's tables and plots and the gate's summary group rows by
CASE_FIELDS_REQUIRED: dict[str, type | tuple[type, ...]] = {"batch_size": int, "context_len": (int, str), "tree": str}
# The axes every row's case holds (`Case.axes`): all but LATER_AXES, which it leaves out at their defaults. Every
# schema wrote them so (schema 1 wrote all of Case's fields, as `dataclasses.asdict`; LATER_AXES came after it, left
# out at their defaults from the first), so one without any of them was edited: it is not read as its default.
CASE_FIELDS_WRITTEN = tuple(name for name in CASE_FIELDS if name not in LATER_AXES)
_NUMBER_TYPES = {int, float}   # the types of a number json.loads gives (bool is its own type)
_JSON_KINDS = {dict: "a JSON object", list: "an array", str: "a string", int: "a number", float: "a number",
               bool: "a boolean"}   # what a value json.loads gives is, in JSON's words
_WANTED = {dict: "a JSON object", str: "a string", int: "an integer"}   # what a field's type asks for
# A row's `timestamp`: UTC in ISO 8601, as treebench writes it (milliseconds or, in older rows, seconds,
# and +00:00; Z as well): merge, the gate and the report order a pair's rows by the instant it names
# (`row_time`), not by its text ('12:00:00Z' is earlier than '12:00:00.500+00:00' though its text sorts later).
TIMESTAMP = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,6})?(\+00:00|Z)")
TIMESTAMP_EXAMPLE = "2026-01-31T23:04:02.725+00:00"
CASE_ID = re.compile(r"B[0-9]+-L.*-[0-9a-f]{10}", re.DOTALL)   # the form of Case.case_id: prefix, axes, hash
_EARLIEST = datetime.min.replace(tzinfo=timezone.utc)   # where `row_time` puts a row without a time
log = logging.getLogger(__name__)


def _kind(x: object) -> str:
    """What a JSON value is, in JSON's words: 'null', 'a JSON object', 'an array', 'a string', ..."""
    return "null" if x is None else _JSON_KINDS.get(type(x), type(x).__name__)


def _wanted(want: type | tuple[type, ...]) -> str:
    """str -> 'a string', (int, str) -> 'an integer or a string'."""
    return " or ".join(_WANTED[t] for t in (want if isinstance(want, tuple) else (want,)))


def row_problem(row: dict) -> str | None:
    """What is wrong with a result row's fields (None when gate, report and merge can read it): a
    field absent is 'missing', one present but null or of another type says what it is ('field 'case'
    is null, expected a JSON object'), the case axes the readers group by (CASE_FIELDS_REQUIRED)
    included, every axis a row records (CASE_FIELDS_WRITTEN) there, `case.tree` a tree spec that parses (the
    report draws it) and a `timestamp` given one of the form treebench writes (TIMESTAMP: readers order a pair's
    rows by it). An `env` given is a string: a null one would leave the row out of the gate's env check; a
    `run_id` given one of the form treebench writes (`names.is_run_id`; every run writes one, so null is
    refused). Each of STRING_FIELDS is a string or null, a timed row (`median_us` given) names its `timer`,
    and a `timer` given is one of TIMERS (the timers treebench times with); `cpu_threads` is null or an
    integer >= 1."""
    return (_required_problem(row) or _case_problem(row) or _text_problem(row) or _number_problem(row)
            or _case_id_problem(row))


def _required_problem(row: dict) -> str | None:
    """Which of REQUIRED_FIELDS, the fields every row needs, `row` lacks or holds as another JSON type
    than asked for ('field 'backend' is null, expected a string'), else None."""
    for name, typ in REQUIRED_FIELDS.items():
        if name not in row:
            return f"field {name!r} is missing"
        if not isinstance(row[name], typ):
            return f"field {name!r} is {_kind(row[name])}, expected {_wanted(typ)}"
    return id_problem(row, "backend")


def id_problem(row: dict, name: str) -> str | None:
    """What is wrong with the field `name` of `row`, one of those naming its backend, env file and run
    ("backend", "env", "run_id": `treebench rm` selects rows by them), in `row_problem`'s words; None where
    it is right, or absent and not required (env; run_id, which `rows.run_id_problem` asks of schema-2 rows
    as written). `backend` is a name a backend may have (`name_flaw`), `env` a non-empty string, `run_id` of
    the form treebench writes."""
    if name not in row:
        return f"field {name!r} is missing" if name in REQUIRED_FIELDS else None
    x = row[name]
    if name == "env" and not (isinstance(x, str) and x):   # a null env would escape the gate's env check
        return f"field 'env' is {'an empty string' if x == '' else _kind(x)}, expected the run's env id (a string)"
    if not isinstance(x, str):   # every run writes its id: a null one is an edit (drop_repeated_rows passes it over)
        return f"field {name!r} is {_kind(x)}, expected a string"
    if name == "backend" and not x:   # readers group and name rows by it
        return "field 'backend' is an empty string, expected the backend's name"
    if name == "backend" and (bad := name_flaw(x)) is not None:
        return (f"field 'backend' is {json.dumps(x)}, which holds {json.dumps(bad)}: no backend of "
                "that name loads (a name is printable characters without '/')")
    if name == "run_id" and not is_run_id(x):
        return (f"field 'run_id' is {json.dumps(x)}, expected a run id as treebench writes it (ASCII letters, "
                "digits, '-', '_' and '.', the first a letter or digit, such as 20260131T230402Z-3fa2c1)")
    return None


def name_flaw(name: str) -> str | None:
    """The first character that no backend's `name` may hold ('/', or one str.isprintable refuses: a
    newline, NUL), or None. Loading refuses such a backend and readers such a row. Raises nothing."""
    return next((c for c in name if c == "/" or not c.isprintable()), None)


def _case_problem(row: dict) -> str | None:
    """What is wrong with the status and the case axes of `row`, whose REQUIRED_FIELDS are right."""
    if row["status"] not in STATUSES:
        return f"field 'status' is {row['status']!r}, expected one of {', '.join(STATUSES)}"
    for name, want in CASE_FIELDS_REQUIRED.items():
        if name not in row["case"]:
            return f"field 'case.{name}' is missing"
        v = row["case"][name]
        if isinstance(v, bool) or not isinstance(v, want):
            shown = _kind(v) if isinstance(v, (dict, list)) else json.dumps(v)   # null, true, 1.5, "16"
            return f"field 'case.{name}' is {shown}, expected {_wanted(want)}"
    tree = _tree_problem(row["case"]["tree"])   # the report draws each tree
    if tree:
        return f"field 'case.tree': {tree}"
    if unknown := sorted(set(row["case"]) - set(CASE_FIELDS)):   # rows are written by treebench: a key no
        return (f"field 'case.{unknown[0]}' is no case axis; the axes are "   # axis names is a typo or an edit
                f"{', '.join(CASE_FIELDS)}")
    if missing := [name for name in CASE_FIELDS_WRITTEN if name not in row["case"]]:
        return (f"field 'case.{missing[0]}' is missing; a row's case holds every axis (only "
                f"{', '.join(LATER_AXES)} are left out, at their defaults)")
    problem = _case_id(_case_key(row["case"]))[1]
    return f"field 'case': {problem}" if problem else None


def _case_id_problem(row: dict) -> str | None:
    """Whether the `case_id` of `row`, whose case is valid, is an id its case gives, where it has the form
    of an id (CASE_ID: readers pair rows by case_id and show their case, so an edited case or id would pair
    rows of other cases). Its case gives two: the id of the case as Case normalises it, and the id of its
    axes as stored (a row written before a tree or context spelling was normalised keeps its id). A
    case_id of another form (a label such as 'c1', which no case gives) is taken as it is."""
    ids = _case_id(_case_key(row["case"]))[0]
    if row["case_id"] not in ids and CASE_ID.fullmatch(row["case_id"]):
        return f"field 'case_id' is {json.dumps(row['case_id'])}, but its case's id is {json.dumps(ids[0])}"
    return None


def _case_key(case: dict) -> tuple:
    """A hashable key for the case dict `case` that tells its values' types apart (1, 1.0 and true
    are three cases to Case: the first valid, the others refused); a list value (never valid)
    is keyed by its JSON text."""
    return tuple(sorted((k, type(v).__name__, json.dumps(v) if isinstance(v, (list, dict)) else v)
                        for k, v in case.items()))


@lru_cache(maxsize=4096)
def _case_id(key: tuple) -> tuple[tuple[str, str], str | None]:
    """((the case's id, the id of its axes as stored), None) for the case whose `_case_key` is `key`,
    validated as a suite's case is (`harness/model/cases.py` Case: every axis in its range, a known
    dtype, layout and mode), or (("", ""), why it is no case). Cached: few distinct cases, many rows."""
    case = {k: (json.loads(v) if t in ("list", "dict") else v) for k, t, v in key}
    try:
        valid = Case(**case)
    except (ConfigError, ValueError, TypeError, RecursionError) as e:
        return ("", ""), str(e) or type(e).__name__
    if all(type(x := getattr(valid, name)) is type(value) and x == value for name, value in case.items()):
        return (valid.case_id, valid.case_id), None
    stored = copy.copy(valid)
    for name, value in case.items():   # the axes unnormalised ('random:8:01'), as an older row hashed them
        object.__setattr__(stored, name, value)
    return (valid.case_id, stored.case_id), None


def _text_problem(row: dict) -> str | None:
    """What is wrong with the timestamp, the ids and the text fields of `row` (STRING_FIELDS): readers
    group, sort and compare rows by them (a list there is unhashable; a timer 5 matches no timer)."""
    stamp = row.get("timestamp")
    if stamp is not None and not _is_timestamp(stamp):
        shown = _kind(stamp) if not isinstance(stamp, str) else json.dumps(stamp)
        return (f"field 'timestamp' is {shown}, expected a UTC time in ISO 8601 as treebench writes it, "
                f"such as {TIMESTAMP_EXAMPLE}")
    if problem := id_problem(row, "env") or id_problem(row, "run_id"):   # the id its env-ID.json names, its run's
        return problem
    for name in STRING_FIELDS:
        if (x := row.get(name)) is not None and not isinstance(x, str):
            return f"field {name!r} is {_kind(x)}, expected a string or null"
    return None


def _number_problem(row: dict) -> str | None:
    """What is wrong with the timings and their timer, the L2 state and the per-request sizes of `row`."""
    for name in ("median_us", "p25_us", "p75_us", "cv"):
        x = row.get(name)
        if x is not None and (isinstance(x, bool) or not isinstance(x, (int, float))):
            return f"field {name!r} is {_kind(x)}, expected a number"
        if x is not None and not (_finite(x) and x >= 0):
            value = "an integer too large for a float" if isinstance(x, int) and not _finite(x) else x
            return f"field {name!r} is {value}, expected a finite number >= 0"
    if row.get("median_us") is not None and not row.get("timer"):   # the gate compares rows timed alike
        what = "missing" if "timer" not in row else "an empty string" if row["timer"] == "" else "null"
        return f"field 'timer' is {what}, expected the timer of a timed row (a string: median_us is given)"
    if row.get("timer") is not None and row["timer"] not in TIMERS:   # a string (_text_problem)
        return f"field 'timer' is {json.dumps(row['timer'])}, expected one of {', '.join(TIMERS)} or null"
    if threads := _threads_problem(row, "cpu_threads", "the torch threads it was timed under"):   # timing.wall
        return threads
    if row.get("l2_flushed") is not None and not isinstance(row["l2_flushed"], bool):
        return f"field 'l2_flushed' is {_kind(row['l2_flushed'])}, expected true or false"
    for name in ("tree_sizes", "context_lens"):   # per request: T_b and L_b (the plan reads them)
        sizes = row.get(name)
        if sizes is not None and not (isinstance(sizes, list) and all(
                isinstance(x, int) and not isinstance(x, bool) and 0 <= x and _finite(x) for x in sizes)):
            return f"field {name!r} must be a list of integers >= 0"
    n = row.get("n_samples")
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 0):
        return f"field 'n_samples' is {json.dumps(n) if isinstance(n, (int, float)) else _kind(n)}, expected an integer >= 0"
    samples = row.get("samples_us")
    if samples == [] and row.get("median_us") is not None:   # the gate's test reads the samples of a timed row
        return "field 'samples_us' is an empty array on a timed row (median_us is given), expected its samples"
    if samples is None:
        return None
    if not isinstance(samples, list) or not (set(map(type, samples)) <= _NUMBER_TYPES or all(   # fast path: JSON's
            isinstance(x, (int, float)) and not isinstance(x, bool) for x in samples)):         # own int and float
        return "field 'samples_us' must be a list of numbers"
    if samples and not (all(map(_finite, samples)) and min(samples) >= 0):
        return "field 'samples_us' holds a value that is not a finite number >= 0"
    return None


def _threads_problem(record: dict, name: str, meaning: str, null: bool = True) -> str | None:
    """What is wrong with the thread count `record[name]`, where given: it is an integer >= 1 (torch runs
    under one thread at least; a JSON true is no count), or null where `null`. `meaning` says what it counts."""
    x = record.get(name)
    if name not in record or (x is None and null) or (type(x) is int and x >= 1):
        return None
    shown = json.dumps(x) if isinstance(x, (int, float)) else _kind(x)
    return f"field {name!r} is {shown}, expected an integer >= 1 ({meaning}){' or null' if null else ''}"


def fingerprint_problem(env: dict) -> str | None:
    """What is wrong with a field of the env fingerprint `env` (an env file's object, `store.env`) that
    no run of treebench's could have written, else None: `torch_threads`, where given, is an integer >= 1
    (`torch.get_num_threads()` as the run began; env files written before it was recorded lack it)."""
    return _threads_problem(env, "torch_threads", "torch's intra-op threads as the run began", null=False)


def _finite(x: float) -> bool:
    """math.isfinite, False (not OverflowError) for an integer too large for a float (JSON's 1e400
    is an infinity, its 10**400 written out an int)."""
    try:
        return math.isfinite(x)
    except OverflowError:
        return False


@lru_cache(maxsize=4096)
def _tree_problem(spec: str) -> str | None:
    """Why the tree spec `spec` of a row's case does not parse (`tree_specs.parse_tree`), or None."""
    try:
        parse_tree(spec)
    except (ConfigError, ValueError, TypeError, RecursionError) as e:
        return str(e) or type(e).__name__
    return None


def _is_timestamp(stamp: object) -> bool:
    """Whether `stamp` is a timestamp of the form TIMESTAMP naming a real time (no 31st of February)."""
    if not isinstance(stamp, str) or not TIMESTAMP.fullmatch(stamp):
        return False
    try:
        datetime.fromisoformat(stamp)
    except ValueError:
        return False
    return True


def row_time(row: dict) -> tuple[datetime, str]:
    """The order of `row` among rows of its pair by when it was written: (its `timestamp` as a UTC
    instant, ""), so `Z` and `+00:00`, seconds and milliseconds compare as the times they name. A row
    without a timestamp comes first; one whose timestamp does not parse (which validation refuses)
    comes after it, among such rows in the order of their text, and before every row with a time.
    Raises nothing (a naive time is read as UTC)."""
    stamp = row.get("timestamp")
    try:
        instant = datetime.fromisoformat(stamp) if isinstance(stamp, str) else None
    except ValueError:
        instant = None
    if instant is None:
        return _EARLIEST, str(stamp or "")
    return (instant if instant.tzinfo else instant.replace(tzinfo=timezone.utc)), ""


def read_checked_rows(paths: Sequence[str], command: str) -> list[dict]:
    """`validated_rows(paths, command)`; a row read twice (a file or folder given twice) is
    kept once, with a warning (`drop_repeated_rows`); one warning per file that another run is
    still writing (`warn_live_writers`).

    Raises:
        ConfigError: as validated_rows.
    """
    rows = drop_repeated_rows(validated_rows(paths, command), command)
    warn_live_writers(paths, command)
    return rows


def warn_live_writers(paths: Sequence[str], command: str) -> None:
    """One warning for each results file of `paths` whose lock names a live process
    (`lock.live_writer`): a run or check still appending to it, so the rows read may be partial
    (pairs still to come; a pair's latest row may change). Raises ConfigError as `result_files`."""
    for f in result_files(paths):
        if (pid := live_writer(f)) is not None:
            log.warning("%s: results file %s is still being written by another treebench process (pid %d): its "
                        "rows may be partial; read it again once that run ends", command, f, pid)


def validated_rows(paths: Sequence[str], command: str, require_rows: bool = True) -> list[dict]:
    """`treebench.harness.store.rows.read_rows(paths, require_rows)` (torn lines skipped with a warning),
    each row checked by `row_problem`.

    Raises:
        ConfigError: as read_rows (with `require_rows`, its only lines torn, too), or a row lacks a
            required field (names file, line and field).
    """
    rows = read_rows(paths, require_rows=require_rows, command=command)   # its lines led by `command`, as these are
    if all(row_problem(r) is None for r in rows):
        return rows
    bad = find_row(paths, lambda r: row_problem(r) is not None)   # where it is, for the message
    if bad is None:
        raise ConfigError(f"{command}: a result row lacks one of {', '.join(REQUIRED_FIELDS)}")
    need = (f": every row needs {', '.join(REQUIRED_FIELDS)} (case a JSON object), as `treebench run` writes"
            if _required_problem(bad.row) else "")   # the list only where one of those fields is what is wrong
    raise ConfigError(f"{command}: results file {bad.path}:{bad.line}: {row_problem(bad.row)}; edit or delete that "
                      f"line{need}")


def drop_repeated_rows(rows: list[dict], command: str) -> list[dict]:
    """`rows` without a second copy of a row already seen, identified by `repeat_key`: run_id, env,
    case_id, backend, how it was timed and its timestamp; warns how many were dropped. Rows of one pair
    that one run id names twice, measured apart (a `check` and then a `run --resume` under one
    $TREEBENCH_RUN_ID, or a job run twice under it), are two measurements: both are kept. Rows without
    a run_id are all kept (nothing tells them apart)."""
    seen: set[tuple] = set()
    kept = []
    for r in rows:
        key = repeat_key(r)
        if r.get("run_id") is not None and key in seen:
            continue
        seen.add(key)
        kept.append(r)
    if len(kept) < len(rows):
        log.warning("%s: %d repeated rows dropped, one of each kept (the same row read twice: a results file given "
                    "twice, or a row copied into another file that is read too)", command, len(rows) - len(kept))
    return kept


def repeat_key(row: dict) -> tuple:
    """What makes two rows one row read twice: (run_id, env, case_id, backend, timer, L2 flushed,
    timestamp); a run appends one row per pair, so two measurements differ in one of them at least."""
    return (row.get("run_id"), row.get("env"), row["case_id"], row["backend"], *timing_key(row), row.get("timestamp"))


def latest_rows(rows: Iterable[dict], by_timing: bool = False) -> dict[tuple, dict]:
    """(case_id, backend) -> the row with the latest timestamp (`row_time`; file order breaks ties); with
    `by_timing`, (case_id, backend, timer, L2 flushed) -> the latest such row: the row of a pair that
    the gate compares, a report shows and a resumed run keeps. Raises KeyError for a row without
    case_id or backend."""
    out: dict[tuple, dict] = {}
    for r in rows:
        key = (r["case_id"], r["backend"], *(timing_key(r) if by_timing else ()))
        if key not in out or row_time(r) >= row_time(out[key]):
            out[key] = r
    return out


def missing_env_line(paths, rows, envs: dict[str, dict]) -> str | None:
    """One line naming the first env id of `rows` whose env file is not among `envs` (env-<id>.json
    not beside the rows) and a results file of `paths` holding a row of it (`find_row`), with how
    many more env ids lack theirs; None when none does. A file not copied along is no fingerprint
    difference: the gate and `report --against` refuse it in these words; with --allow-env-mismatch the report notes it.

    Raises:
        ConfigError: as result_files, for a path that does not exist.
    """
    missing = sorted({r["env"] for r in rows if r.get("env")} - envs.keys())
    if not missing:
        return None
    env_id, more = missing[0], f" (and {len(missing) - 1} more env ids)" if len(missing) > 1 else ""
    found = find_row(paths, lambda r: r.get("env") == env_id, containing=env_id)
    holder = found.path if found else result_files(paths)[0]
    return (f"the env file for env id {env_id} is missing next to {holder}{more} (env-{env_id}.json, "
            "which the run wrote beside its rows)")
