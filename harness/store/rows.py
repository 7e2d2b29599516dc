"""The results store: JSONL result rows plus one env fingerprint per run.

Layout (after asv's ``results/<machine>/<commit>-<env>.json``): a run appends
one JSON object per line to its results file (schema 1, fields in
docs/architecture.md "Result rows and files") and writes its env fingerprint
beside it as ``env-<env_id>.json``. Reports and the gate read only the store.

Rows are appended with one ``os.write`` of one whole line on an ``O_APPEND``
descriptor, then fsync'd: a killed run loses at most the row in flight, and
existing files are never truncated. A row is identified by ``row_key``:
(case_id, backend, env); ``stored_keys`` gives the keys a ``--resume`` skips.
``row_l2_flushed`` reads a row's L2 state, older rows (no ``l2_flushed``) included.
"""

from __future__ import annotations

from collections.abc import Callable

import errno
import hashlib
import importlib.metadata
import json
import logging
import os
import platform
import socket
import re
import subprocess
import tempfile
from pathlib import Path

import torch

from treebench.harness.errors import ConfigError

log = logging.getLogger(__name__)

SCHEMA = 1  # version of the row layout; read_rows refuses others
ROW_FIELDS = (
    "schema", "run_id", "env", "timestamp", "backend", "case", "case_id",
    "context_lens", "tree_sizes", "status", "reason",
    "max_abs_err", "max_rel_err", "mismatch_frac", "atol", "rtol", "worst", "nonfinite",
    "timer", "timer_fallback", "l2_flushed", "median_us", "p25_us", "p75_us", "cv", "n_samples", "samples_us",
    "flops", "bytes", "tflops", "tb_per_s", "pct_peak_bw",
    "deterministic", "check_axes",
)
STATUSES = ("pass", "mismatch", "error", "skipped")
VOLATILE_ENV_FIELDS = ("env_id", "peak_bw_bytes_per_s")  # left out of env_id's hash
PACKAGES = {  # env field -> distribution name, looked up without importing it
    "torch": "torch", "triton": "triton", "xformers": "xformers", "flashinfer": "flashinfer-python",
}
ENV_FILE_RE = re.compile(r"env-.*\.json")  # env fingerprint files beside the results
REPO_ROOT = Path(__file__).resolve().parents[2]


def append_row(path: str | Path, row: dict) -> None:
    """Appends `row` as one JSON line to `path`, atomically with respect to a crash.

    One ``os.write`` of the whole line on an ``O_APPEND`` fd, then fsync. If the
    file ends in a torn line (a run killed mid-write by something other than
    this function), a newline is written first so the new row stays whole.

    Raises:
        ConfigError: the path cannot be opened for appending (a directory, no permission).
    """
    path = Path(path)
    line = (json.dumps(row, sort_keys=False, allow_nan=True) + "\n").encode()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    except OSError as e:
        raise ConfigError(f"results file {path}: cannot append ({e.strerror}); "
                          "give --out a writable file path") from None
    try:
        if _ends_torn(path):
            line = b"\n" + line
        os.write(fd, line)
        _fsync(fd)
    finally:
        os.close(fd)


def append_rows(path: str | Path, rows: list[dict]) -> None:
    """Appends many rows with one buffered write and one fsync (merges of thousands of rows).

    A kill mid-write leaves at most one torn last line, which read_rows skips and
    the next append closes with a newline; whole rows already in the file are untouched.

    Raises:
        ConfigError: the path cannot be opened for appending.
    """
    if not rows:
        return
    path = Path(path)
    blob = "".join(json.dumps(r, sort_keys=False, allow_nan=True) + "\n" for r in rows).encode()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    except OSError as e:
        raise ConfigError(f"results file {path}: cannot append ({e.strerror}); give a writable file path") from None
    try:
        view = memoryview(b"\n" + blob if _ends_torn(path) else blob)
        while view:
            view = view[os.write(fd, view):]
        _fsync(fd)
    finally:
        os.close(fd)


def _fsync(fd: int) -> None:
    """os.fsync, ignoring EINVAL/ENOTSUP from files that cannot be synced (a pipe, /dev/null)."""
    try:
        os.fsync(fd)
    except OSError as e:
        if e.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EROFS):
            raise


def row_key(row: dict, with_run: bool = False) -> tuple:
    """A row's identity: (case_id, backend, env), with run_id first when `with_run`."""
    key = (row.get("case_id"), row.get("backend"), row.get("env"))
    return (row.get("run_id"), *key) if with_run else key


def row_l2_flushed(row: dict) -> bool | None:
    """Whether an L2 flush ran before every timing sample of `row`; None for a row without timing.

    Rows written before the field existed (no ``l2_flushed``) were timed with the
    harness default: flushed on a GPU timer, not flushed on the CPU's ``wall`` timer.
    """
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


def stored_keys(paths, env_id: str | None,
                keep: Callable[[dict], bool] | None = None) -> set[tuple[str | None, str | None]]:
    """(case_id, backend) of the rows in `paths` (missing files count as empty) measured in env
    `env_id`, and, when `keep` is given, for which keep(row) is true.

    Raises:
        ConfigError: a file holds rows of another schema.
    """
    existing = [p for p in map(Path, paths) if p.exists()]
    return {(r.get("case_id"), r.get("backend")) for r in read_rows(existing)
            if r.get("env") == env_id and (keep is None or keep(r))}


def _ends_torn(path: Path) -> bool:
    """True when the file is non-empty and its last byte is not a newline."""
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        if f.tell() == 0:
            return False
        f.seek(-1, os.SEEK_END)
        return f.read(1) != b"\n"


def check_writable(path: str | Path, create: bool = True, what: str = "--out") -> Path:
    """Validates a results path before a run, creating parent folders and the
    file (empty, or left as it is when it exists: never truncated).

    Args:
        create: False checks only what can be checked without writing (a dry run).
        what: how the message names the path (the option or argument it came from).

    Raises:
        ConfigError: `path` is a directory, does not end in .jsonl, holds something other
            than result rows, cannot be opened for appending, or lies in a folder where the
            env fingerprint beside it cannot be written.
    """
    path = Path(path)
    if not str(path).strip():
        raise ConfigError(f"{what} is empty: give a results file path such as results/local/run.jsonl")
    if path.is_dir():
        raise ConfigError(f"{what} {path}: is a directory; give a file path such as {path / 'run.jsonl'}")
    if path.exists() and not path.is_file():
        raise ConfigError(f"{what} {path}: is not a regular file (a device, pipe or socket); "
                          "give a results file path such as results/local/run.jsonl")
    if ENV_FILE_RE.fullmatch(path.name):
        raise ConfigError(f"{what} {path}: is an env fingerprint file, not a results file; "
                          "give a .jsonl results path")
    check_results_file(path, what)
    if path.suffix != ".jsonl":
        raise ConfigError(f"{what} {path}: give a .jsonl path (folders are read for *.jsonl files only)")
    if not create:
        return path
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"{what} {path}: cannot write there ({e.strerror}); give a writable file path") from None
    try:   # the env fingerprint goes beside it: a real probe (os.access says yes to root on an immutable folder)
        with tempfile.NamedTemporaryFile(dir=path.parent, prefix=".treebench-probe-"):
            pass
    except OSError as e:
        raise ConfigError(f"{what} {path}: its folder {path.parent} is not writable ({e.strerror}), and the env "
                          "fingerprint (env-*.json) is written beside the results; choose another folder") from None
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644))
    except OSError as e:
        raise ConfigError(f"{what} {path}: cannot write there ({e.strerror}); give a writable file path") from None
    return path


def _is_torn_row(line: bytes) -> bool:
    """A line cut short by a killed writer: the start of a schema-1 row."""
    return line.startswith(b'{"schema": 1')


def check_results_file(path: str | Path, what: str) -> None:
    """Refuses an existing file that holds anything but schema-1 result rows (blank lines and rows
    torn by a killed writer allowed); a missing or empty file passes.

    Raises:
        ConfigError: `path` holds something else (a suite, a report, a config, rows of another
            schema): appending to it would damage it, reading it would mislead.
    """
    path = Path(path)
    try:
        fh = open(path, "rb")
    except OSError:
        return  # missing or unreadable: the open for appending reports it
    with fh:
        for n, raw in enumerate(fh, start=1):
            line = raw.strip()
            if not line:
                continue
            try:
                row = json.loads(line)
            except (json.JSONDecodeError, UnicodeDecodeError):
                if _is_torn_row(line):
                    continue
                row = None
            if not isinstance(row, dict) or row.get("schema") != SCHEMA:
                got = f"schema {row.get('schema')!r}" if isinstance(row, dict) else "not a result row"
                raise ConfigError(f"{what} {path}: not a treebench results file (line {n}: {got}; "
                                  f"schema-{SCHEMA} JSON rows expected); give a new path or a .jsonl results file")


def _result_files(paths) -> list[Path]:
    """Expands folders into their *.jsonl files (sorted); keeps files as given."""
    out: list[Path] = []
    for p in map(Path, [paths] if isinstance(paths, (str, Path)) else paths):
        if p.is_dir():
            out.extend(sorted(p.glob("*.jsonl")))
        elif p.is_file():
            out.append(p)
        elif p.exists():
            raise ConfigError(f"results path {p}: is not a regular file (a device, pipe or socket); give a .jsonl "
                              "results file or a folder of them")
        else:
            raise ConfigError(f"results path {p}: not found; give a .jsonl results file or a folder of them")
    return out


_WARNED: set[tuple[str, int]] = set()   # (file, line) of torn lines already warned about


def read_rows(paths) -> list[dict]:
    """Reads result rows from JSONL files (or folders of them), in file order.

    A line that is not valid JSON (a torn line left by a killed run) is skipped
    with a warning naming file and line.

    Raises:
        ConfigError: a path does not exist, or a row has a schema other than 1.
    """
    rows: list[dict] = []
    for f in _result_files(paths):
        with open(f, encoding="utf-8", errors="replace") as fh:
            for n, line in enumerate(fh, start=1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    if not line.lstrip().startswith("{"):  # a torn row still starts with "{"
                        raise ConfigError(f"results file {f}:{n}: not a JSON result row; {f} is not a "
                                          "treebench results file (give .jsonl files written by treebench run)"
                                          ) from None
                    if (str(f), n) not in _WARNED:   # files are often read twice (validate, then use)
                        _WARNED.add((str(f), n))
                        log.warning("%s:%d: skipping a torn or malformed result line", f, n)
                    continue
                if not isinstance(row, dict) or row.get("schema") != SCHEMA:
                    got = row.get("schema") if isinstance(row, dict) else type(row).__name__
                    raise ConfigError(f"results file {f}:{n}: schema {got!r}, this treebench reads schema {SCHEMA}")
                rows.append(row)
    return rows


def _version(dist: str) -> str | None:
    """Installed version of a distribution, or None (never imports it)."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _git_commit() -> str | None:
    """HEAD of the repository holding this harness, '+dirty' when it has changes; None outside git."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True,
                              text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO_ROOT,
                               capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("+dirty" if dirty else "") if head else None


def _nvidia_driver() -> str | None:
    """The NVIDIA driver version from nvidia-smi, or None."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return out.strip().splitlines()[0] if out.strip() else None


def _gpu_fields(device: torch.device) -> dict:
    """gpu_name, sm_count, driver, cuda for a CUDA device; Nones on the CPU."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return {"gpu_name": None, "sm_count": None, "driver": None, "cuda": torch.version.cuda}
    props = torch.cuda.get_device_properties(device)
    return {"gpu_name": props.name, "sm_count": props.multi_processor_count,
            "driver": _nvidia_driver(), "cuda": torch.version.cuda}


def env_id_of(env: dict) -> str:
    """Short (12 hex) hash of an env fingerprint's stable fields."""
    stable = {k: v for k, v in env.items() if k not in VOLATILE_ENV_FIELDS}
    return hashlib.sha1(json.dumps(stable, sort_keys=True).encode()).hexdigest()[:12]


def env_fingerprint(device: str | torch.device, peak_bw_bytes_per_s: float | None = None) -> dict:
    """The machine and software a run measured on.

    Args:
        device: the torch device the run uses ("cpu", "cuda", "cuda:1").
        peak_bw_bytes_per_s: measured copy bandwidth, bytes/s; when None it is
            measured with treebench.harness.timing.timers.measure_peak_bandwidth(device) (None on the CPU).

    Returns:
        dict with env_id, gpu_name, sm_count, driver, cuda, python, torch, triton,
        xformers, flashinfer (versions from importlib.metadata, None when absent),
        git_commit, hostname, platform, peak_bw_bytes_per_s. env_id hashes all
        fields but the measured peak.
    """
    from treebench.harness.timing.timers import measure_peak_bandwidth

    device = torch.device(device)
    env = {**_gpu_fields(device), "python": platform.python_version()}
    env.update({field: _version(dist) for field, dist in PACKAGES.items()})
    env.update(git_commit=_git_commit(), hostname=socket.gethostname(), platform=platform.platform())
    if peak_bw_bytes_per_s is None:
        peak_bw_bytes_per_s = measure_peak_bandwidth(device)
    env["peak_bw_bytes_per_s"] = peak_bw_bytes_per_s
    return {"env_id": env_id_of(env), **env}


def write_env(directory: str | Path, env: dict) -> Path:
    """Writes `env` as <directory>/env-<env_id>.json (kept as it is when it exists) and returns the path.

    Raises:
        ConfigError: the file cannot be written there (one line; the CLI exits 2).
    """
    path = Path(directory) / f"env-{env['env_id']}.json"
    if not path.exists():
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(env, indent=2, sort_keys=True) + "\n")
            os.replace(tmp, path)
        except OSError as e:
            tmp.unlink(missing_ok=True)          # a missing folder or file: nothing to remove
            raise ConfigError(f"env fingerprint {path}: cannot write it ({e.strerror}); the results folder "
                              "must be writable") from None
    return path


def _env_files(paths) -> list[Path]:
    """env-*.json files named in `paths`, beside named .jsonl files, or inside named folders."""
    out: list[Path] = []
    for p in map(Path, [paths] if isinstance(paths, (str, Path)) else paths):
        if p.is_dir():
            out.extend(sorted(p.glob("env-*.json")))
        elif p.suffix == ".json":
            out.append(p)
        else:
            out.extend(sorted(p.parent.glob("env-*.json")))
    return out


def read_envs(paths) -> dict[str, dict]:
    """Env fingerprints by env_id, from env files, folders, or results files (their folder's env files).

    Raises:
        ConfigError: an env file is not valid JSON or has no env_id.
    """
    envs: dict[str, dict] = {}
    for f in dict.fromkeys(_env_files(paths)):
        try:
            env = json.loads(f.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ConfigError(f"env file {f}: unreadable ({e}); delete it or rerun") from None
        if not isinstance(env, dict) or "env_id" not in env:
            raise ConfigError(f"env file {f}: no env_id field; it is not a treebench env fingerprint")
        envs[env["env_id"]] = env
    return envs

