"""One `treebench run` / `check` invocation end to end: which cases this process
runs (--shard, torchrun rank), which pairs it skips (--resume), where its rows
go (--out, or its rank file), the env fingerprint, treebench.harness.run.runner.run_cases,
and under torchrun the done marker, rank 0's wait and merge (treebench.harness.sweep.shard).

The CLI parses arguments into SweepOptions and prints the SweepResult; this
module holds the logic so that it can be tested without a command line.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import shlex
from dataclasses import dataclass, field, replace
from pathlib import Path

from rich.console import Console

from treebench.harness.errors import ConfigError
from treebench.harness.run.costs import estimate, interpreted_triton
from treebench.harness.run.progress import format_duration, plural
from treebench.harness.run.config import RunConfig, wait_s
from treebench.harness.run.runner import default_device, plan_pairs, row_satisfies, run_cases
from treebench.harness.store.names import new_run_id
from treebench.harness.timing.bandwidth import measure_matrix_rate, measure_peak_bandwidth
from treebench.harness.sweep.shard import (
    Rank,
    Shard,
    clear_done,
    done_path,
    mark_done,
    merge_ranks,
    others,
    rank_device,
    rank_files,
    rank_path,
    run_id_origin,
    shared_run_id,
    torchrun_rank,
    wait_for_ranks,
)
from treebench.harness.store.env import check_envs_beside, env_beside, env_fingerprint
from treebench.harness.store.rows import read_rows, row_places
from treebench.harness.sweep.resume import check_same_suite, every_row, stored_keys, warn_other_envs, with_stored
from treebench.harness.store.lock import hold_all

log = logging.getLogger(__name__)

DEFAULT_MERGE_TIMEOUT_S = 24 * 3600.0   # rank 0 waits this long for the other ranks' done markers


@dataclass(frozen=True)
class SweepOptions:
    """One `run` / `check` request: the run request plus what only a sweep has.

    Raises:
        ConfigError: --resume without --out.
    """

    run: RunConfig = field(default_factory=RunConfig)  # mode, timer, L2, isolation, ...; the sweep fills in store, ids, device
    out: Path | None = None              # results JSONL; needed for --resume and under torchrun
    resume: bool = False                 # skip (case, backend) pairs already stored in `out` for this env
    shard: Shard | None = None           # --shard i/n
    merge_timeout_s: float = DEFAULT_MERGE_TIMEOUT_S  # torchrun rank 0's wait for the other ranks
    dry_run: bool = False                # plan only: count the pairs, run nothing, write nothing
    gpus: int | None = None              # run --gpus N: N > 1 relaunches under torchrun (the dry run's estimate
                                         # names the ranks' start-up as not included)
    shown: Path | None = None            # `out` as given, for the lines and the reads before any pair
    out_named_by: str | None = None      # the run id in --out's name where it is the run's default file
                                         # (<suite>-<run id>.jsonl): recorded in its (and its rank files') lock
                                         # sidecar (store.lock.hold), so that a rerun removes them if this run
                                         # crashes before its first row

    def __post_init__(self) -> None:
        if self.resume and self.out is None:
            raise ConfigError("--resume needs --out: the results file whose rows are skipped")

    @property
    def named(self) -> Path | None:
        """--out as given."""
        return self.out if self.shown is None else self.shown


@dataclass
class SweepResult:
    """What an invocation did."""

    rows: list[dict] = field(default_factory=list)   # rows to summarise: this run's (all ranks' on rank 0)
    planned: int = 0                                 # pairs this process was to run (after shard, rank, resume)
    resumed: int | None = 0                          # pairs skipped as already stored (None: dry run without --resume)
    will_skip: int = 0                               # planned pairs that will be skipped rows (unavailable/unsupported,
                                                     # or predicted out of memory)
    will_skip_memory: int = 0                        # ... of them for the memory prediction
    will_error: int = 0                              # planned pairs that will be error rows before they run
    failing: str = ""                                # ... whose backends and why: 'a.py: cannot be loaded; ...'
    primary: bool = True                             # False on torchrun ranks > 0 (they report nothing)
    missing_ranks: list[int] = field(default_factory=list)  # ranks rank 0 gave up waiting for
    store_path: Path | None = None                   # where this process appended its rows
    env_id: str | None = None
    stored_note: str = ""                            # --dry-run without --resume: what --out already holds
    estimate: str = ""                               # --dry-run: how long the pairs should take, and from what;
                                                     # "" where no pair is to run
    earlier_rows: int = 0                            # RunConfig.report, primary: rows --out held before this run
                                                     # wrote, counted under its lock (after the rank files a killed
                                                     # launch left are merged in; not a run that appends after)
    report_rows: list[dict] | None = None            # RunConfig.report, primary, --resume: every row of --out, read
                                                     # under its lock, for the report (None: report `rows`)

    def nothing_left(self, out: Path, unit: str = "pair") -> str | None:
        """A --resume's line where every pair of this process was stored already, outside torchrun (whose
        other ranks may have run some): 'nothing to run: all 12 pairs already stored in OUT', `unit` naming
        what is counted (a one-backend check's pairs are its cases); None where a pair ran or none was stored."""
        if self.planned or not self.resumed or torchrun_rank() is not None:
            return None
        return f"nothing to run: all {plural(self.resumed, unit)} already stored in {out}"


def _check_options(opts: SweepOptions, rank: Rank | None) -> None:
    """Raises ConfigError for what the torchrun environment rules out."""
    if rank is not None and opts.out is None:
        raise ConfigError("under torchrun give --out: ranks write <out>.rank<i>-of-<n>.jsonl and rank 0 merges them")


def shard_is_empty(cases, opts: SweepOptions) -> bool:
    """True when --shard selects none of `cases` (--shard 5/7 of 2 cases): no process of the command
    runs a pair (torchrun ranks split the shard's cases), so it writes nothing: no --out, env file
    or report."""
    return opts.shard is not None and not opts.shard.select(cases)


def select_cases(cases, shard: Shard | None, rank: Rank | None) -> list:
    """The cases of this process: --shard's, then every WORLD_SIZE-th of those for this rank."""
    cases = shard.select(cases) if shard else list(cases)
    return Shard(rank.rank, rank.world).select(cases) if rank else cases


def _stored(opts: SweepOptions):
    """The predicate a stored row must meet to count as done (`runner.row_satisfies`): run mode
    re-runs untimed check rows and rows timed with another timer or L2 state."""
    run = opts.run
    return functools.partial(row_satisfies, mode=run.mode, timing_mode=run.timing_mode, flush_l2=run.flush_l2)


def _resume_skip(opts: SweepOptions, env_id: str, rank: Rank | None) -> frozenset:
    """(case_id, backend) pairs stored in --out or its leftover rank files for this env (`_stored`).

    Outside torchrun the leftover rank files of a killed launch are merged into
    --out first; under torchrun rank 0 merges them with this launch's at the end.
    """
    if not opts.resume:
        return frozenset()
    named = opts.named   # read before the first pair: as given, as the lines name it
    assert named is not None  # SweepOptions: --resume needs --out
    if rank is None and not opts.dry_run and rank_files(named):
        log.info("merged %d rows left in rank files into %s", len(merge_ranks(named)), named)
    return frozenset(stored_keys([named, *rank_files(named)], env_id, keep=_stored(opts)))


def _config(opts: SweepOptions, env: dict, device: str, rank: Rank | None, skip: frozenset,
            quiet: bool) -> RunConfig:
    """The run request with what this process found: store (--out, or under torchrun its rank file; and
    its name as given, for the lines), run and env ids, device, bandwidth, skips, and on rank 0 of a
    launch of 2 ranks or more the wait for the others that follows its last pair."""
    store, named = ((rank_path(p, rank) if rank and p else p) for p in (opts.out, opts.named))
    wait = f"waiting for {others(rank)}" if others(rank) else ""   # rank 0 of 2 or more
    return replace(opts.run, store_path=store, run_id=opts.run.run_id or shared_run_id() or new_run_id(), env_id=env["env_id"],
                   device=device, peak_bytes_per_s=env["peak_bw_bytes_per_s"], quiet=quiet, skip=skip, wait_note=wait,
                   store_named=named)


def execute(cases, backends, opts: SweepOptions, console: Console | None = None) -> SweepResult:
    """Runs this process's share of cases x backends and returns what to report.

    Raises:
        ConfigError: torchrun without --out, bad torchrun environment, an unreadable or foreign
            results file, an env file beside --out that report, gate and merge could not read (`env.check_envs_beside`), a --resume into a file of another suite's rows (`resume.check_same_suite`),
            a results file another process is writing (treebench.harness.store.lock).
    """
    rank = torchrun_rank()
    _check_options(opts, rank)
    written = [] if opts.dry_run else _written(opts, rank)
    shown = {opts.out: opts.named} if opts.out is not None else {}   # the refusal names --out as given
    with hold_all(written, dict.fromkeys(written, opts.out_named_by), shown):   # one writer per file, before any write
        return _execute(cases, backends, opts, rank, console)


def _written(opts: SweepOptions, rank: Rank | None) -> list[Path]:
    """The results files this process appends to: --out, or under torchrun its rank file (and
    --out on rank 0, which merges into it), so that ranks never lock each other out."""
    if opts.out is None:
        return []
    if rank is None:
        return [opts.out]
    return [rank_path(opts.out, rank)] + ([opts.out] if rank.primary else [])


def _execute(cases, backends, opts: SweepOptions, rank: Rank | None, console: Console | None) -> SweepResult:
    """`execute` once this process holds the locks of the files it writes."""
    named = opts.named   # --out as given: what the reads before the first pair (no backend has moved yet) name
    if opts.resume and named is not None:   # before any write: a file of another suite's rows is refused
        check_same_suite(named, opts.run.suite, {c.case_id for c in cases}, warn=rank is None or rank.primary,
                         leftovers=[] if rank else rank_files(named))   # merged in first
    device = rank_device(rank) if rank else str(default_device())
    mine = select_cases(cases, opts.shard, rank)
    env = env_fingerprint(device, measure_peak_bandwidth(device), peak_matmul_tflops=measure_matrix_rate(device))
    if named is not None:   # before any pair: an env file report, gate and merge could not read
        check_envs_beside(named, env["env_id"])
    if opts.run.isolate:
        _release_cached(device)  # the probes' buffers would count against the workers' free memory
    skip = _resume_skip(opts, env["env_id"], rank)
    names = [getattr(b, "name", type(b).__name__) for b in backends]
    if opts.resume and named is not None and (rank is None or rank.primary):   # rows another env measured
        warn_other_envs([named, *rank_files(named)], env, {(c.case_id, n) for c in select_cases(
            cases, opts.shard, None) for n in names}, _stored(opts))
    planned = sum((c.case_id, n) not in skip for c in mine for n in names)
    result = SweepResult(planned=planned, resumed=len(mine) * len(names) - planned,
                         primary=rank is None or rank.primary, env_id=env["env_id"])
    if opts.dry_run:
        found = str(named) if named is not None and Path(named).is_file() else None   # no file: no rows
        stored = read_rows([named]) if found else []   # before a backend's supports() runs
        plan = plan_pairs(mine, backends, skip, opts.run, device)
        to_run, result.will_skip, result.will_skip_memory = plan.to_run, plan.skipped, plan.for_memory
        result.will_error, result.failing = plan.failed, "; ".join(f"{n}: {why}" for n, why in plan.failing.items())
        if to_run:   # nothing to run (all stored, or all to be skipped): no time to estimate, no pace to scale
            result.estimate = estimate([c for c, _ in to_run], opts.run.mode, device, stored, env["env_id"], found,
                                       [n for _, n in to_run], isolate=opts.run.isolate, ranks=opts.gpus or 1,
                                       interpreted=interpreted_triton(backends))
        if not opts.resume:   # `resumed` counts what --resume skips: without it, say what --out holds
            runs = {(c.case_id, n) for c, n in to_run}
            result.resumed, result.stored_note = None, _stored_note(opts, stored, env["env_id"], mine, names, runs,
                                                                    bool(plan.failed))
        return result
    config = _config(opts, env, device, rank, skip, opts.run.quiet or not result.primary)
    store = config.store_path
    reports = result.primary and opts.out is not None and opts.run.report   # the summary's report line, the report
    earlier = _row_count(named) if reports and named is not None else 0
    with _env_written(opts, env, rank):   # taken back when stopped before the first row
        if rank:
            assert opts.out is not None  # _check_options: torchrun needs --out
            clear_done(opts.out, rank)
        if result.primary and named is not None:
            _warn_reused_run_id(named, config.run_id, _measured_again(opts, cases, names, skip, env["env_id"]))
        result.rows, result.store_path = run_cases(mine, backends, config, console=console), store
    if rank:
        _finish_rank(opts, rank, config.run_id, result)
    if opts.resume and result.primary:
        assert opts.out is not None  # SweepOptions: --resume needs --out
        shard_cases = select_cases(cases, opts.shard, None)  # rank 0 reports every rank's cases
        result.rows = with_stored(opts.out, env["env_id"], shard_cases, names, result.rows, _stored(opts))
    if reports and opts.out is not None:
        result.earlier_rows = earlier
        result.report_rows = every_row(opts.out, named) if opts.resume else None   # all of --out's, as `report OUT`
    return result


def _env_written(opts: SweepOptions, env: dict, rank: Rank | None):
    """The env file beside --out (named as given) for the rows this process appends to it or its rank
    file (`env.env_beside`), removed again when the sweep stops before its first row, outside torchrun
    (a rank's may serve the rows of another); nothing without --out.

    Raises:
        ConfigError: the env file cannot be written.
    """
    if opts.named is None:
        return contextlib.nullcontext()
    return env_beside(rank_path(opts.named, rank) if rank else opts.named, env, undo=rank is None)   # as given


def _row_count(out: Path) -> int:
    """Rows `out` holds (0 where there is no file or it cannot be read: the summary only)."""
    try:
        return len(read_rows([out])) if Path(out).is_file() else 0
    except (ConfigError, OSError):
        return 0


def _stored_note(opts: SweepOptions, stored: list[dict], env_id: str, cases, names: list[str],
                 to_run: set[tuple[str, str]], errors: bool = False) -> str:
    """What --out already holds of this sweep's pairs, without --resume: how many of this env, of
    the pairs to run (`to_run`: (case_id, backend); they run again) and of those to be recorded as
    skipped (or as errors, where some pairs will be: `errors`), or, when none, that its rows are
    another env's (--resume would not skip them)."""
    wanted = {(c.case_id, n) for c in cases for n in names}
    done = _stored(opts)
    here = {k for r in stored if (k := (r.get("case_id"), r.get("backend"))) in wanted
            and r.get("env") == env_id and done(r)}
    if here:
        again, recorded = len(here & to_run), len(here - to_run)   # pairs that run, pairs recorded as skipped
        parts = [f"{again} of the {plural(len(to_run), 'pair')} to run (they run again)"] if again else []
        kinds = "skipped or as errors" if errors else "skipped"
        parts += [f"{recorded} of those to be recorded as {kinds} (recorded again)"] if recorded else []
        return f"already stored in {opts.named} for this env: {' and '.join(parts)}; add --resume to skip them"
    other = {r.get("env") for r in stored if (r.get("case_id"), r.get("backend")) in wanted and r.get("env") != env_id}
    if other:
        return (f"none stored for this env ({env_id}); {opts.named} holds pairs of this sweep from "
                f"{len(other)} other env(s) ({', '.join(sorted(map(str, other))[:3])}), which --resume does not skip "
                "(an env id covers the machine, the package versions and the git commit)")
    return ""


def _measured_again(opts: SweepOptions, cases, names: list[str], skip: frozenset, env_id: str):
    """Under --resume, the test of a stored row whose pair the sweep measures again: of env `env_id`,
    its (case_id, backend) among the shard's `cases` (every rank's) x `names` and not in `skip` (an
    untimed `check` row, or one timed another way, that `_stored` does not take as done); else None."""
    if not opts.resume:
        return None
    again = {(c.case_id, n) for c in select_cases(cases, opts.shard, None) for n in names} - skip
    return lambda row: row.get("env") == env_id and (row.get("case_id"), row.get("backend")) in again


def _warn_reused_run_id(out: Path, run_id: str, again=None) -> None:
    """Warns (one line) when rows of `out` already carry `run_id`, the id of a run that does not
    continue them: a $TREEBENCH_RUN_ID or torchrun --rdzv-id used again (a job run twice, a torchrun
    restart). Under --resume (`again`, from `_measured_again`) only the rows of pairs it measures
    again count: the rows it skips are the run it continues. Either way the id then names rows of
    two runs, so `rm --run-id` removes both; gate and report read both rows of a pair
    (`store.validate.drop_repeated_rows`), the gate comparing the later. A warning, not a refusal: a
    restart of a torchrun launch meets it too, and shards run one after another under one id mean to
    share it. Rank files are not read: this launch's ranks write them, and rank 0 merges them after."""
    places = row_places([out], containing=run_id) if out.is_file() else ()
    n = sum(p.row.get("run_id") == run_id and (again is None or again(p.row)) for p in places)
    if not n:
        return
    source, fix = run_id_origin() if shared_run_id() == run_id else ("", "give this run another id")
    named = f"run id {run_id}{f' ({source})' if source else ''} already names {plural(n, 'row')} in {out}"
    if again is not None:
        log.warning("%s that --resume does not skip (untimed rows of `treebench check`, or rows timed with another "
                    "--timer or --l2): this run measures those pairs again under the same id, so `treebench rm %s "
                    "--run-id %s` removes the rows of both, and gate and report read both (the gate compares the "
                    "later); to keep them apart, %s", named, shlex.quote(str(out)), run_id, fix)
        return
    log.warning("%s, written before this run started: its rows get the same id, so `treebench rm %s --run-id %s` "
                "removes both runs' rows, and gate and report read both runs' rows of a pair (the gate compares the "
                "later); %s, or add --resume to continue that run", named, shlex.quote(str(out)), run_id, fix)


def _release_cached(device: str) -> None:
    """Returns the caching allocator's unused blocks on a CUDA device to the driver."""
    import torch

    if str(device).startswith("cuda"):
        torch.cuda.empty_cache()


def _finish_rank(opts: SweepOptions, rank: Rank, run_id: str, result: SweepResult) -> None:
    """Marks this rank done; on rank 0 waits for all ranks and merges their files into --out."""
    assert opts.out is not None  # _check_options: torchrun needs --out
    mark_done(opts.out, rank, run_id, len(result.rows))
    if not rank.primary:
        log.info("rank %d of %d: %d rows in %s", rank.rank, rank.world, len(result.rows), result.store_path)
        return
    shared = shared_run_id()
    _say_waiting(opts, rank, wait_for_ranks(opts.out, rank.world, shared, 0.0))
    missing = wait_for_ranks(opts.out, rank.world, shared, opts.merge_timeout_s)
    if missing:
        result.missing_ranks = missing
        log.error("ranks %s not done after %gs: nothing merged; the rows stay in %s; merge them later with "
                  "`treebench merge %s <rank files>`", missing, opts.merge_timeout_s,
                  ", ".join(map(str, rank_files(opts.out))), shlex.quote(str(opts.named)))
        return
    result.rows = merge_ranks(opts.out)
    result.store_path = opts.out
    log.info("merged %d rows from %d ranks into %s", len(result.rows), rank.world, opts.named)


def _say_waiting(opts: SweepOptions, rank: Rank, missing: list[int]) -> None:
    """Rank 0's one line before it waits for the ranks `missing` (none: no line): their done markers,
    --merge-timeout, where this rank's rows are, and how to stop where no other rank runs: RANK and
    WORLD_SIZE left in a shell (inside a torchrun or PyTorchJob pod) make a plain command wait for
    ranks that never start. A warning, not progress: --quiet shows it too (a silent wait of up to
    --merge-timeout would look like a hang)."""
    if not missing:
        return
    shown = opts.named or opts.out
    assert shown is not None  # _check_options: torchrun needs --out
    markers = [str(done_path(shown, Rank(r, rank.world, r))) for r in missing]
    limit, one = wait_s(opts.merge_timeout_s), len(missing) == 1
    log.warning("rank 0 of %d: waiting for %s %s to finish (%s %s) to merge their rows into %s, %s; this rank's "
                "rows are in %s. No other rank running (RANK and WORLD_SIZE set where no torchrun launched this "
                "command)? Stop it (Ctrl-C), unset RANK and WORLD_SIZE, and run it again with --resume", rank.world,
                "rank" if one else "ranks", ", ".join(map(str, missing)),
                "its done marker" if one else "their done markers",
                ", ".join(markers[:3] + ["…"] * (len(markers) > 3)),
                shown, f"for up to {format_duration(limit)} (--merge-timeout)" if limit is not None else
                "with no limit (--merge-timeout)", rank_path(shown, rank))
