"""The env fingerprint: the machine and software a run measured on, one file per env beside the results.

A run writes ``env-<env_id>.json`` beside its results file (`env_beside`: taken back when it
stops before its first row, where it was not there before and no other rows or run there need
it); every row names its env by ``env`` (`validate.missing_env_line` names an env whose file was not
copied along), and readers refuse a fingerprint field no run could have written
(`validate.fingerprint_problem`). `env_id_of` hashes the fingerprint's stable fields: two runs with
the same env_id measured on the same GPU, driver, CPU, thread settings and software, so their
timings compare. The peak bandwidth and the dense bf16 matrix rate are measured
by the caller (`treebench.harness.timing.bandwidth.measure_peak_bandwidth`,
`measure_matrix_rate`) and handed in: the store records measurements, it never takes them.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import json
import logging
import os
import platform
import re
import socket
import subprocess
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from treebench.harness.errors import ConfigError
from treebench.harness.store.lock import other_writer_beside
from treebench.harness.store.outputs import ENV_NOTE
from treebench.harness.store.rows import find_row
from treebench.harness.store.validate import fingerprint_problem

if TYPE_CHECKING:
    import torch  # imported where used: readers of env files (gate, report, merge) need no torch

VOLATILE_ENV_FIELDS = ("env_id", "peak_bw_bytes_per_s", "peak_matmul_tflops")  # left out of env_id's hash
PACKAGES = {  # env field -> distribution name, looked up without importing it
    "torch": "torch", "triton": "triton", "xformers": "xformers", "flashinfer": "flashinfer-python",
}
ENV_FILE_RE = re.compile(r"env-.*\.json")  # env fingerprint files beside the results
REPO_ROOT = Path(__file__).resolve().parents[2]
CPUINFO = Path("/proc/cpuinfo")

log = logging.getLogger(__name__)


def _version(dist: str) -> str | None:
    """Installed version of a distribution, or None (never imports it)."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _git_head(short: bool = False, timeout_s: float = 10) -> tuple[str, bool] | None:
    """(HEAD, whether tracked files have changes) of the repository holding this harness, HEAD
    abbreviated when `short`; None outside git (or git missing, or slower than `timeout_s`)."""
    try:
        head = subprocess.run(["git", "rev-parse", *(["--short"] if short else []), "HEAD"], cwd=REPO_ROOT,
                              capture_output=True, text=True, timeout=timeout_s, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO_ROOT,
                               capture_output=True, text=True, timeout=timeout_s, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return (head, bool(dirty)) if head else None


def _git_commit() -> str | None:
    """HEAD of the repository holding this harness, '+dirty' when it has changes; None outside git."""
    found = _git_head()
    return None if found is None else found[0] + ("+dirty" if found[1] else "")


def version_line() -> str:
    """'treebench VERSION' (the installed distribution's, else the checkout's pyproject.toml),
    plus the git commit (and ', modified' for uncommitted changes to tracked files) when
    treebench runs from a git checkout: what `treebench --version` prints. Raises nothing (git
    missing or slower than 5 s: no commit)."""
    version = _version("treebench")
    if version is None:   # a checkout on PYTHONPATH: pyproject.toml says
        import tomllib

        try:
            version = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["version"]
        except (OSError, KeyError, tomllib.TOMLDecodeError):
            version = "(version unknown)"
    found = _git_head(short=True, timeout_s=5)
    return f"treebench {version}" + ("" if found is None else f" (git {found[0]}{', modified' if found[1] else ''})")


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
    import torch
    if device.type != "cuda" or not torch.cuda.is_available():
        return {"gpu_name": None, "sm_count": None, "driver": None, "cuda": torch.version.cuda}
    props = torch.cuda.get_device_properties(device)
    return {"gpu_name": props.name, "sm_count": props.multi_processor_count,
            "driver": _nvidia_driver(), "cuda": torch.version.cuda}


def env_id_of(env: dict) -> str:
    """Short (12 hex) hash of an env fingerprint's stable fields."""
    stable = {k: v for k, v in env.items() if k not in VOLATILE_ENV_FIELDS}
    return hashlib.sha1(json.dumps(stable, sort_keys=True).encode()).hexdigest()[:12]


def _cpu_model() -> str | None:
    """The CPU's model name from /proc/cpuinfo ('model name'), else platform.processor(); None when neither says."""
    try:
        for line in CPUINFO.read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and value.strip():
                return value.strip()
    except OSError:
        pass
    return platform.processor() or None


def _cpu_fields() -> dict:
    """cpu_model, cpu_count (logical CPUs), torch_threads (torch's intra-op threads now) and
    omp_num_threads ($OMP_NUM_THREADS as set, None when unset)."""
    import torch
    return {"cpu_model": _cpu_model(), "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS")}


def env_fingerprint(device: str | torch.device, peak_bw_bytes_per_s: float | None = None,
                    peak_matmul_tflops: float | None = None) -> dict:
    """The machine and software a run measured on.

    Args:
        device: the torch device the run uses ("cpu", "cuda", "cuda:1").
        peak_bw_bytes_per_s: the copy bandwidth the caller measured, bytes/s
            (`treebench.harness.timing.bandwidth.measure_peak_bandwidth`); None when not
            measured (the CPU). Recorded as given: nothing is measured here.
        peak_matmul_tflops: the dense bf16 matrix rate the caller measured, TFLOP/s
            (`treebench.harness.timing.bandwidth.measure_matrix_rate`); None when not measured
            (the CPU). Recorded as given.

    Returns:
        dict with env_id, gpu_name, sm_count, driver, cuda, python, torch, triton,
        xformers, flashinfer (versions from importlib.metadata, None when absent),
        git_commit, hostname, platform, cpu_model, cpu_count, torch_threads,
        omp_num_threads, triton_interpret (TRITON_INTERPRET on: Triton kernels ran in the CPU
        interpreter), peak_bw_bytes_per_s, peak_matmul_tflops. env_id hashes all
        fields but the measured peaks.
    """
    import torch

    from treebench.harness.model.paged import triton_interpret

    device = torch.device(device)
    env = {**_gpu_fields(device), "python": platform.python_version()}
    env.update({field: _version(dist) for field, dist in PACKAGES.items()})
    env.update(git_commit=_git_commit(), hostname=socket.gethostname(), platform=platform.platform())
    # The CPU model and the thread settings change timings (host-side launch work on a GPU,
    # every call on the CPU), so they are stable fields: they count in env_id's hash.
    env.update(_cpu_fields())
    # Triton's CPU interpreter runs a kernel 10^3-10^4x slower than compiled: its timings are of
    # another machine, so the setting counts in env_id's hash (gate refuses to compare across it).
    env["triton_interpret"] = triton_interpret()
    env["peak_bw_bytes_per_s"] = peak_bw_bytes_per_s
    env["peak_matmul_tflops"] = peak_matmul_tflops
    return {"env_id": env_id_of(env), **env}


def write_env(directory: str | Path, env: dict) -> Path:
    """Writes `env` as <directory>/env-<env_id>.json (kept as it is when it exists and holds this
    fingerprint; written again, with a warning, when it holds none: `_rewritable`) and returns the path.

    Raises:
        ConfigError: the file cannot be written there, or something other than a file holds its name
            (one line; the CLI exits 2).
    """
    path = Path(directory) / f"env-{env['env_id']}.json"
    _refuse_non_file(path)
    if not path.exists() or _rewritable(path, env):
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


def _refuse_non_file(path: Path, prefix: str = "") -> None:
    """Refuses a folder (or another non-regular file) that holds the env file's name `path`.

    Raises:
        ConfigError: one line, `prefix` first, naming it and the fix.
    """
    if os.path.lexists(path) and not path.is_file():
        raise ConfigError(f"{prefix}env file {path}: {'a folder' if path.is_dir() else 'not a regular file'}, "
                          "where the env fingerprint of the rows beside it goes; remove it, or give an --out in "
                          "another folder")


def _rewritable(path: Path, env: dict) -> bool:
    """True, with a warning, when the env file at `path` is there but holds no fingerprint of `env`'s id:
    not JSON, not an object with an env_id, a field no run writes (`read_fingerprint`), another env_id than
    its name's, or fields that are not those the id hashes (`env_id_of`: `{"env_id": ID}` alone, fields
    missing or changed). Its name is the env id, which hashes what the file should hold, so `env` written over it
    is what it should have held. False for the fingerprint of `env` (its measured peaks may differ:
    the first ones are kept), and for a file that cannot be read (left for the reader to name).
    Raises nothing."""
    try:
        problem = read_fingerprint(path)
    except OSError:
        return False
    if isinstance(problem, dict):
        if problem["env_id"] != env["env_id"]:
            problem = f"env_id {problem['env_id']!r} inside, not {env['env_id']!r} as its name says"
        elif env_id_of(problem) != env_id_of(env):
            problem = f"its fields are not those env id {env['env_id']} hashes (some missing or changed)"
        else:
            return False
    log.warning("env file %s: %s; written again from this run's fingerprint of the same env id", path, problem)
    return True


def read_fingerprint(path: Path) -> dict | str:
    """The env fingerprint in the env file at `path`, or why it holds none: 'not JSON
    (JSONDecodeError: ...)', 'no env_id field, so not a treebench env fingerprint', or a field that no
    run could have written (`validate.fingerprint_problem`: "field 'torch_threads' is 0, expected ...").

    Raises:
        OSError: the file cannot be read.
    """
    try:
        env = json.loads(path.read_bytes())
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
        detail = str(e).splitlines()[0] if str(e) else ""
        return f"not JSON ({type(e).__name__}{': ' + detail[:120] if detail else ''})"
    if not isinstance(env, dict) or "env_id" not in env:
        return "no env_id field, so not a treebench env fingerprint"
    return fingerprint_problem(env) or env


def check_envs_beside(results: str | Path, env_id: str, what: str = "--out") -> None:
    """Refuses, before a run or check writes anything, the env files beside `results` that report, gate
    and merge could not read (`read_envs` reads every one in that folder), but for env-<env_id>.json,
    which the run writes again where it holds no fingerprint (`write_env`); that one is refused only
    where something other than a file holds its name (a folder), which write_env cannot replace.

    Raises:
        ConfigError: one line naming the file, what is wrong with it and the fix.
    """
    own = Path(results).parent / f"env-{env_id}.json"
    _refuse_non_file(own, f"{what} {results}: ")
    for f in _env_files(Path(results)):
        if f.name == own.name:
            continue
        try:
            problem = read_fingerprint(f)
        except OSError as e:
            problem = f"cannot be read ({e.strerror})"
        if isinstance(problem, str):
            raise ConfigError(f"{what} {results}: env file {f} beside it: {problem}; report, gate and merge read "
                              "every env file there: remove or repair it, or give an --out in another folder")


@contextlib.contextmanager
def env_beside(results: str | Path, env: dict, undo: bool = True, repair: bool = True) -> Iterator[Path]:
    """`write_env` beside the results file `results`, for the rows the with-block appends to it. When
    the block raises (an interrupt, an error) while `results` has the size it had before the block (no
    row reached it) and the env file was written here (nothing was there before), the env file is
    removed again: a run stopped before its first row leaves no fingerprint of rows that do not exist.
    It is kept where another run may need it (`_env_needed`): results files in its folder share it.
    `outputs.ENV_NOTE` says which, naming it as `results` is given (made absolute here).

    Args:
        undo: False keeps the env file in every case (torchrun ranks: another rank's rows may need it).
        repair: False (merge, which writes nothing when stopped) removes it also where rows already in
            its folder named its env before the block (their env file was missing then, and is again);
            it is kept only for rows that came since and for another writer there.

    Raises:
        ConfigError: as write_env; whatever the block raises, unchanged.
    """
    given = Path(results)
    results = given.absolute()   # a backend's os.chdir in the block moves nothing
    there, size = (results.parent / f"env-{env['env_id']}.json").exists(), _size(results)
    named_before = not there and not repair and _rows_name(results, env["env_id"])
    path = write_env(given.parent, env).absolute()   # its messages name it as given
    try:
        yield path
    except BaseException:
        if undo and not there and _size(results) == size:   # no row reached it: the env file it wrote goes
            if not (why := _env_needed(results, env["env_id"], rows=not named_before)):
                with contextlib.suppress(OSError):
                    path.unlink()
            state = f"kept: {why}" if why else "removed" if not path.exists() else "kept"
            ENV_NOTE[0] = f"; the env file {given.parent / path.name} it had written beside it is {state}"
        raise


def _env_needed(results: Path, env_id: str, rows: bool = True) -> str:
    """Why the env file of `env_id` beside `results` may serve rows other than this run's ('' if not): a
    row of a results file in that folder names `env_id` (`rows`; `_rows_name`: another run's, written since
    this run wrote the file), or another process is writing a results file there
    (`lock.other_writer_beside`: a run whose rows may name it). Raises nothing."""
    if rows and _rows_name(results, env_id):
        return "rows in that folder name its env"
    return "another run is writing a results file in that folder" if other_writer_beside(results) else ""


def _rows_name(results: Path, env_id: str) -> bool:
    """True when a row of a results file in the folder of `results` names `env_id`, or when the
    folder cannot be read. Raises nothing."""
    try:
        return find_row(results.parent, lambda r: r.get("env") == env_id, containing=env_id) is not None
    except (ConfigError, OSError):
        return True


def _size(path: Path) -> int | None:
    """The size in bytes of the file at `path`; None where there is none."""
    try:
        return path.stat().st_size
    except OSError:
        return None


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
        ConfigError: an env file cannot be read, is not valid JSON, has no env_id or a field no run could
            have written (`read_fingerprint`).
    """
    envs: dict[str, dict] = {}
    for f in dict.fromkeys(_env_files(paths)):
        try:
            env = read_fingerprint(f)
        except OSError as e:
            raise ConfigError(f"env file {f}: cannot be read ({e.strerror}); make it readable") from None
        if isinstance(env, str):
            raise ConfigError(f"env file {f}: {env}; remove or repair it (a run on the machine it describes "
                              "writes it again beside its results)")
        envs[env["env_id"]] = env
    return envs


def field_differences(fields: Iterable[str], before: Sequence[dict],
                      after: Sequence[dict]) -> list[tuple[str, str, str]]:
    """(field, values before, values after) for each of `fields`, in order, whose values (as text, 'none'
    for one absent or null, sorted, ", "-joined) differ between the fingerprints `before` and `after`; none
    while a side has none. What `--resume` warns of (sweep.resume.env_changes) and the gate refuses
    (analyze.gate_inputs), both in these words. Raises nothing."""
    out = []
    for f in fields:
        b, a = ({"none" if e.get(f) is None else str(e.get(f)) for e in side} for side in (before, after))
        if b and a and b != a:
            out.append((f, ", ".join(sorted(b)), ", ".join(sorted(a))))
    return out

