"""Spreading a sweep over GPUs and jobs: --shard, torchrun ranks, per-rank files, merging.

- ``--shard i/n`` keeps the cases whose index in the suite is i mod n (a
  round-robin split, so every shard gets a mix of small and large cases). Each
  case's inputs come from its own seed (treebench.harness.model.cases.Case.rng), so a case's
  result does not depend on which shard or rank ran it.
- Under torchrun (RANK, WORLD_SIZE, LOCAL_RANK set) rank r of w further keeps
  every w-th case of its shard, runs on cuda:LOCAL_RANK, and appends to its own
  file ``<out stem>.rank<r>-of-<w>.jsonl`` beside --out. When done it writes
  ``<out stem>.rank<r>-of-<w>.done``; rank 0 waits for every done marker (no
  process group needed), appends all rank files to --out, then deletes them.
  Rows already in --out are not appended twice (key: run_id, case_id, backend,
  env), so a merge cut short can simply run again.
- ``treebench merge OUT INPUT...`` concatenates result files (Slurm job
  arrays run with --shard), dropping rows whose (case_id, backend, env) is
  already in OUT or earlier inputs, and copies their env files beside OUT.
- ``treebench run --gpus N`` relaunches the same command line under
  ``python -m torch.distributed.run --standalone --nproc-per-node N -m treebench.harness.cli.main``.
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from treebench.harness.errors import ConfigError
from treebench.harness.run.config import wait_s
from treebench.harness.store.merge import merge_results
from treebench.harness.store.names import TORCHRUN_PREFIX, check_run_id, new_run_id

log = logging.getLogger(__name__)

RUN_ID_ENV = "TREEBENCH_RUN_ID"          # shared run id of every rank (set by --gpus; else torchrun's)
POLL_S = 0.2                             # rank 0's poll period while waiting for done markers
_SHARD_RE = re.compile(r"(-?[0-9]+)/(-?[0-9]+)")   # ASCII digits, no '+', '_' or spaces, as every numeric option


@dataclass(frozen=True)
class Shard:
    """Shard `index` of `count`: the cases whose suite index is index mod count."""

    index: int   # i in [0, count)
    count: int   # n >= 1

    def select(self, items: Sequence) -> list:
        """items[index::count]."""
        return list(items[self.index::self.count])


def parse_shard(text: str) -> Shard:
    """'i/n' -> Shard(i, n).

    Raises:
        ConfigError: not two integers in ASCII digits ('1_0/4', '１/4' and '0 /2' included), n < 1, or i outside [0, n).
    """
    if not str(text).strip():
        raise ConfigError("--shard is empty: write INDEX/COUNT with 0 <= INDEX < COUNT, e.g. --shard 0/4")
    m = _SHARD_RE.fullmatch(str(text))
    if not m:
        raise ConfigError(f"--shard {text!r}: write INDEX/COUNT with integers (ASCII digits 0-9, no '+', '_' or spaces), "
                          "e.g. --shard 0/4 (indices start at 0)")
    i, n = int(m.group(1)), int(m.group(2))
    if n < 1 or not 0 <= i < n:
        raise ConfigError(f"--shard {text}: need 0 <= INDEX < COUNT (INDEX is 0-based), "
                          f"e.g. --shard 0/{max(n, 2)}")
    return Shard(i, n)


@dataclass(frozen=True)
class Rank:
    """This process's place in a torchrun launch."""

    rank: int         # RANK: global rank in [0, world)
    world: int        # WORLD_SIZE
    local_rank: int   # LOCAL_RANK: the GPU index on this host

    @property
    def primary(self) -> bool:
        """Rank 0: waits for the others and merges."""
        return self.rank == 0


def _env_int(environ: Mapping[str, str], name: str) -> int:
    try:
        return int(environ[name])
    except (KeyError, ValueError):
        raise ConfigError(f"torchrun environment: {name}={environ.get(name)!r} is not an integer; "
                          "launch with torchrun, or unset RANK/WORLD_SIZE/LOCAL_RANK") from None


def torchrun_rank(environ: Mapping[str, str] = os.environ) -> Rank | None:
    """The Rank from torchrun's RANK, WORLD_SIZE and LOCAL_RANK, or None outside torchrun (no WORLD_SIZE).

    Raises:
        ConfigError: malformed or inconsistent values.
    """
    if "WORLD_SIZE" not in environ:
        return None
    rank, world = _env_int(environ, "RANK"), _env_int(environ, "WORLD_SIZE")
    local = _env_int(environ, "LOCAL_RANK") if "LOCAL_RANK" in environ else rank
    if world < 1 or not 0 <= rank < world or local < 0:
        raise ConfigError(f"torchrun environment: RANK={rank}, WORLD_SIZE={world}, LOCAL_RANK={local}: "
                          "need 0 <= RANK < WORLD_SIZE and LOCAL_RANK >= 0")
    return Rank(rank, world, local)


def rank_device(rank: Rank) -> str:
    """cuda:LOCAL_RANK (made the current device) when torch sees a GPU, else cpu.

    Raises:
        ConfigError: LOCAL_RANK is not a visible GPU.
    """
    import torch

    if not torch.cuda.is_available():
        return "cpu"
    if rank.local_rank >= torch.cuda.device_count():
        raise ConfigError(f"torchrun LOCAL_RANK={rank.local_rank}: torch sees only {torch.cuda.device_count()} "
                          "GPU(s); use --nproc-per-node <= that number")
    torch.cuda.set_device(rank.local_rank)
    return f"cuda:{rank.local_rank}"


def shared_run_id(environ: Mapping[str, str] = os.environ) -> str | None:
    """The run id every rank of one launch agrees on: $TREEBENCH_RUN_ID, else torchrun's run id, else None.

    Raises:
        ConfigError: either holds what a run id may not (`treebench.harness.store.names.check_run_id`).
    """
    if environ.get(RUN_ID_ENV):
        return check_run_id(environ[RUN_ID_ENV], f"${RUN_ID_ENV}",
                            f"set it to one such as {new_run_id()}, or unset it for a fresh one")
    elastic = environ.get("TORCHELASTIC_RUN_ID", "")
    if not elastic or elastic == "none":
        return None
    check_run_id(elastic, "$TORCHELASTIC_RUN_ID (torchrun --rdzv-id)",
                 f"give torchrun --rdzv-id one such as {new_run_id()}, or set ${RUN_ID_ENV} to one")
    return TORCHRUN_PREFIX + elastic


def run_id_origin(environ: Mapping[str, str] = os.environ) -> tuple[str, str]:
    """(where `shared_run_id` takes the run id from, how to give the next launch another one):
    $TREEBENCH_RUN_ID when it is set, else torchrun's $TORCHELASTIC_RUN_ID."""
    if environ.get(RUN_ID_ENV):
        return f"${RUN_ID_ENV}", f"unset ${RUN_ID_ENV} (or set a new one) for a run of its own"
    return ("$TORCHELASTIC_RUN_ID (torchrun --rdzv-id)",
            f"give torchrun another --rdzv-id (or set ${RUN_ID_ENV}) for a run of its own")


# ---- per-rank files and the barrier ----------------------------------------------------------


def _stem(out: Path) -> Path:
    return out.with_suffix("") if out.suffix == ".jsonl" else out


def others(rank: Rank | None) -> str:
    """The ranks that rank 0 of a launch of 2 or more waits for, as its progress names them: 'rank 1',
    'ranks 1-3'; '' for any other rank, outside torchrun and in a launch of one rank."""
    if rank is None or not rank.primary or rank.world < 2:
        return ""
    return "rank 1" if rank.world == 2 else f"ranks 1-{rank.world - 1}"


def rank_path(out: Path, rank: Rank) -> Path:
    """<out stem>.rank<r>-of-<w>.jsonl beside `out`."""
    return Path(f"{_stem(Path(out))}.rank{rank.rank}-of-{rank.world}.jsonl")


def done_path(out: Path, rank: Rank) -> Path:
    """<out stem>.rank<r>-of-<w>.done beside `out`."""
    return Path(f"{_stem(Path(out))}.rank{rank.rank}-of-{rank.world}.done")


def appends_to(out: Path, environ: Mapping[str, str] = os.environ) -> Path:
    """The file this process appends its rows of the results file `out` to: under torchrun its rank file
    (`rank_path`), else `out`. Raises nothing (a malformed torchrun environment, refused before any row: `out`)."""
    try:
        rank = torchrun_rank(environ)
    except ConfigError:
        return out
    return rank_path(out, rank) if rank is not None else out


def rows_file(out: Path, environ: Mapping[str, str] = os.environ) -> Path:
    """The file that holds this process's rows of the results file `out` now: under torchrun its rank file, while
    there (rank 0 deletes it once merged into `out`); else `out` (`appends_to`). Raises nothing."""
    held = appends_to(out, environ)
    return held if held.exists() else out


def rank_files(out: Path) -> list[Path]:
    """Rank files of `out` left on disk (any world size), e.g. by a killed launch; sorted."""
    out = Path(out)
    return sorted(out.parent.glob(f"{_stem(out).name}.rank*-of-*.jsonl"))


def clear_done(out: Path, rank: Rank) -> None:
    """Removes this rank's done marker left by an earlier launch (called before it starts)."""
    done_path(out, rank).unlink(missing_ok=True)


def mark_done(out: Path, rank: Rank, run_id: str, n_rows: int) -> None:
    """Writes this rank's done marker atomically (temp file + rename)."""
    path = done_path(out, rank)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp.write_text(json.dumps({"rank": rank.rank, "world": rank.world, "run_id": run_id, "rows": n_rows}) + "\n")
    os.replace(tmp, path)


def _is_done(path: Path, run_id: str | None) -> bool:
    """The marker exists (and names `run_id` when the launch has a shared one)."""
    try:
        marker = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return False
    return run_id is None or marker.get("run_id") == run_id


def wait_for_ranks(out: Path, world: int, run_id: str | None, timeout_s: float) -> list[int]:
    """Waits until every rank of `world` has its done marker; returns the ranks still missing at the timeout
    (`timeout_s` past run.config.MAX_WAIT_S, as --case-timeout: no limit, it waits for them all)."""
    limit = wait_s(timeout_s)
    deadline = None if limit is None else time.monotonic() + limit
    while True:
        missing = [r for r in range(world) if not _is_done(done_path(out, Rank(r, world, r)), run_id)]
        if not missing or deadline is not None and time.monotonic() >= deadline:
            return missing
        time.sleep(POLL_S)


def merge_ranks(out: Path) -> list[dict]:
    """Appends the rows of every rank file of `out` (any world size: leftovers of a killed launch
    too) not already in it (key: run_id, case_id, backend, env, timer and L2 state, as `merge_results`
    keeps rows), then deletes the rank files and done markers; returns the rows appended. Call it only
    when no rank is writing.

    Raises:
        ConfigError: a rank file holds a row `treebench merge` would refuse (names file, line and
            field); `out` and the rank files are left as they were.
    """
    out = Path(out)
    added = merge_results(out, rank_files(out), with_run=True)
    for path in [*rank_files(out), *out.parent.glob(f"{_stem(out).name}.rank*-of-*.done")]:
        path.unlink(missing_ok=True)
    return added


# ---- launching torchrun ---------------------------------------------------------------------


def strip_option(argv: Sequence[str], option: str) -> list[str]:
    """`argv` without `option VALUE` / `option=VALUE`."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == option:
            skip = True
        elif not a.startswith(option + "="):
            out.append(a)
    return out


def torchrun_command(nproc: int, argv: Sequence[str]) -> list[str]:
    """python -m torch.distributed.run --standalone --nproc-per-node N -m treebench.harness.cli.main ARGV."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
            "-m", "treebench", *argv]


def launch_torchrun(nproc: int, argv: Sequence[str], run_id: str | None = None) -> int:
    """Runs `argv` (a `treebench run ...` command line without --gpus) on `nproc` ranks; returns
    torchrun's exit code. Every rank gets the same $TREEBENCH_RUN_ID (`run_id`, else the one set
    already, else a fresh one), so its rows share one run id,
    and an equal share of the CPU threads (torchrun's default, OMP_NUM_THREADS=1, would slow the
    host-side input building) unless OMP_NUM_THREADS is set already."""
    env = {**os.environ, RUN_ID_ENV: run_id or os.environ.get(RUN_ID_ENV) or new_run_id()}
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    cmd = torchrun_command(nproc, argv)
    log.info("launching %d ranks: %s", nproc, " ".join(cmd))
    return subprocess.run(cmd, env=env, check=False).returncode
