"""The runner: every case x backend through availability -> supports -> prepare
-> compare -> time, one result row each, appended to the store as it finishes.

One pair at a time goes through treebench.harness.run.pair.run_case_backend (inputs and
reference built once per case, the memory fit, the determinism check, a
backend's exception as an ``error`` row); this module expands the pairs, picks each pair's device, appends the rows and shows the
progress. With ``RunConfig.isolate`` every pair runs in a worker subprocess
(treebench.harness.run.isolate) under a per-case time limit, so a crash, a hang or a lost
CUDA context is an error row too. Pairs in ``RunConfig.skip`` (rows a
``--resume`` found already stored) are not run at all. `plan_pairs` foresees, running nothing, what
the runner will do with each pair: what --dry-run counts.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import NamedTuple

import torch
from rich.console import Console

from treebench.harness.model.cases import Case
from treebench.harness.adapter.contract import check_unique_names
from treebench.harness.run.config import RunConfig
from treebench.harness.run.inflight import (PROGRESS, SIGINT_CAME, STOP_REQUESTED, call_in_flight, signal_stop,
                                            sigints_noted)
from treebench.harness.run.memory import fit_reason
from treebench.harness.run.pair import AvailabilityRaised, CaseData, ImportFailed, availabilities, run_case_backend
from treebench.harness.run.costs import after_last_pair_s, pair_seconds
from treebench.harness.run.progress import REPORT_NEXT, progress
from treebench.harness.store.names import new_run_id
from treebench.harness.store.rows import append_row, row_l2_flushed

log = logging.getLogger(__name__)


def default_device() -> torch.device:
    """cuda when torch sees a GPU, else cpu."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def row_satisfies(row: dict, mode: str, timing_mode: str = "auto", flush_l2: bool = True) -> bool:
    """True when a stored row makes a --resume skip its (case_id, backend) pair in `mode`.

    check: any row. run: a skipped/error row, or a row with timings (pass/mismatch with
    median_us set) taken as `timing_mode` and `flush_l2` would take them (`timed_as`);
    an untimed pass/mismatch row (written by `check`) or one timed otherwise is run again.
    """
    if mode != "run":
        return True
    status = row.get("status")
    if status in ("skipped", "error"):
        return True
    return status in ("pass", "mismatch") and row.get("median_us") is not None and timed_as(row, timing_mode, flush_l2)


def timed_as(row: dict, timing_mode: str, flush_l2: bool) -> bool:
    """True when a timed row is what `time_callable(mode=timing_mode, flush_l2=flush_l2)` gives here.

    A GPU row needs the same L2 state (`row_l2_flushed`: rows without the field were flushed)
    and a timer of that mode: "auto" and "cuda_graph" both give cuda_graph, "cuda_graph_loop"
    gives itself, and each gives cuda_event with timer_fallback set when the capture failed;
    "cuda_event" and "host_inclusive" give themselves. A CPU row (timer "wall", never flushed)
    matches any mode and L2 request: the CPU has that one timer; so does a row that names no
    timer (nothing to tell by).
    """
    timer = row.get("timer")
    if timer in (None, "wall"):
        return True
    if row_l2_flushed(row) != bool(flush_l2):
        return False
    if timer == "cuda_event" and row.get("timer_fallback"):          # a capture failed: either graph timer's fallback
        return timing_mode in ("auto", "cuda_graph", "cuda_graph_loop")
    if timer == "cuda_graph":
        return timing_mode in ("auto", "cuda_graph")
    return timer == timing_mode


def device_for(backend, runner_device: torch.device) -> torch.device:
    """The device a backend's inputs live on: its own preference, else the
    runner's when its capabilities allow it, else its first listed device."""
    pref = getattr(backend, "device", None)
    if pref:
        return torch.device(pref)
    devices = getattr(getattr(backend, "capabilities", None), "devices", None)
    if devices and runner_device.type not in devices:
        return torch.device(devices[0])
    return runner_device


def _log_row(row: dict, warned: set) -> None:
    """One INFO line for a mismatch or an error row, none (DEBUG) for the rest; for the rows of a backend that could
    not be loaded (failed_step import) one warning per backend and reason, none where `warned` holds them already
    (`pair.ImportFailed`: the warning of sweep.imports named it as it was loaded), then none."""
    if row.get("failed_step") == ImportFailed.step:
        if (row["backend"], row["reason"]) not in warned:   # its pair's worker could not load it: --isolate
            warned.add((row["backend"], row["reason"]))
            log.warning("%s: %s; each pair whose worker cannot load it is an error row (failed_step %s)",
                        row["backend"], row["reason"], ImportFailed.step)
        return
    level = logging.INFO if row["status"] in ("mismatch", "error") else logging.DEBUG
    log.log(level, "%s on %s: %s%s", row["backend"], row["case_id"], row["status"],
            f" ({row['reason']})" if row["reason"] else "")


def _name(backend) -> str:
    return getattr(backend, "name", type(backend).__name__)


def _pairs(cases: Sequence[Case], backends: Sequence, skip: frozenset) -> list[tuple[Case, object]]:
    """(case, backend) pairs to run, case-major, without the (case_id, backend) pairs in `skip`."""
    return [(c, b) for c in cases for b in backends if (c.case_id, _name(b)) not in skip]


class PairPlan(NamedTuple):
    """What the runner will do with the pairs of a sweep, foreseen without running one (--dry-run)."""

    to_run: list        # (case, backend name) of each pair that will run
    skipped: int        # pairs it will record as skipped: backend unavailable here, case not supported, or (with
                        # RunConfig.check_memory) predicted not to fit the device's free memory now
    for_memory: int     # ... of them for the memory prediction
    failed: int         # pairs it will record as errors before they run: those of the backends in `failing`
    failing: dict       # backend name -> why every pair of it is an error row: "cannot be loaded" (a file whose
                        # loading ended its worker: pair.ImportFailed), else the reason its availability() raised


def plan_pairs(cases: Sequence[Case], backends: Sequence, skip: frozenset, run: RunConfig, device: str) -> PairPlan:
    """The PairPlan of `cases` x `backends` less the (case_id, backend name) pairs in `skip`, as `run_cases`
    will treat them: skipped for a backend unavailable here (`pair.availabilities`), a case not supported,
    or a case predicted not to fit (`memory.fit_reason`, counting a case's inputs and reference for its
    first pair only, as the runner builds them once per case); errors for a backend whose availability
    raised (`pair.AvailabilityRaised`, ImportFailed among them). What --dry-run reports and times.

    Raises:
        KeyboardInterrupt / the stop of a signal (`inflight.signal_stop`): a Ctrl-C or SIGTERM meanwhile.
    """
    down = availabilities(backends)
    twice = run.determinism or run.mode == "check"
    failing = {_name(b): "cannot be loaded" if isinstance(why, ImportFailed) else str(why)
               for b in backends if isinstance(why := down[id(b)], AvailabilityRaised)}

    def declined(b, c) -> bool:    # unavailable, or a case not supported
        return bool(down[id(b)]) or _asked(lambda: b.supports(c), False)

    def too_big(b, c, built: bool) -> bool:
        return _asked(lambda: fit_reason(c, b, device_for(b, torch.device(device)), run.mode, twice, built, built),
                      None) is not None
    to_run, skipped, for_memory, failed = [], 0, 0, 0
    for c in cases:
        built = False
        for b in backends:
            if (c.case_id, _name(b)) in skip:
                continue
            if _name(b) in failing:
                failed += 1
            elif declined(b, c):
                skipped += 1
            elif run.check_memory and too_big(b, c, built):
                skipped, for_memory = skipped + 1, for_memory + 1
            else:
                built = True
                to_run.append((c, _name(b)))
    return PairPlan(to_run, skipped, for_memory, failed, failing)


def _asked(hook, otherwise):
    """What the backend's hook `hook()` returns as a skip reason, or `otherwise` where it raises (its
    error row comes later, not a skip) or returns no reason string (supports(): an error row too).

    Raises:
        KeyboardInterrupt / the stop of a signal (`inflight.signal_stop`).
    """
    try:
        reason = hook()
    except BaseException as e:  # noqa: BLE001 -- a raising supports() or workspace_bytes() is the runner's to report
        if signal_stop(e):
            raise
        return otherwise
    return reason if isinstance(reason, str) and reason else otherwise


def _with_run_id(config: RunConfig) -> RunConfig:
    """`config`, with a fresh run id when it has none (RunConfig validated itself when built)."""
    return config if config.run_id else replace(config, run_id=new_run_id())


def run_cases(cases: Sequence[Case], backends: Sequence, config: RunConfig = RunConfig(),
              console: Console | None = None) -> list[dict]:
    """Runs every case x backend and returns the rows (also appended to config.store_path).

    Args:
        cases: the suite's cases.
        backends: adapter instances (treebench.harness.adapter.contract.Backend or any object with
            name, availability(), supports(case), prepare(inputs)). Isolated runs
            send each to its worker as treebench.harness.run.isolate.backend_spec says.
        config: mode, store path, run and env ids, device, peak bandwidth,
            determinism, memory check, isolation and time limit, pairs to skip.
        console: rich console (stderr) for the progress bar, or its plain lines off a terminal
            (treebench.harness.run.progress); shared with logging by the CLI.

    Returns:
        One row per (case, backend) not in config.skip, in order, each with every ROW_FIELDS key.

    Raises:
        ConfigError: config.store_path cannot be appended to, or two backends share a name.
        KeyboardInterrupt: a Ctrl-C (SIGINT), also one a backend swallowed (raised after its pair); a
            KeyboardInterrupt that a backend raised with no SIGINT is its error row (`inflight.signal_stop`).
    """
    config = _with_run_id(config)
    check_unique_names(backends)
    with sigints_noted():   # a KeyboardInterrupt without a SIGINT is the backend's error row
        return _run_pairs(cases, backends, config, console)


def _run_pairs(cases: Sequence[Case], backends: Sequence, config: RunConfig, console: Console | None) -> list[dict]:
    """`run_cases` once its config has a run id and its backends unique names."""
    device = torch.device(config.device) if config.device else default_device()
    avail = availabilities(backends)
    warned = {(_name(b), why) for b in backends if isinstance(why := avail[id(b)], ImportFailed)}   # sweep.imports'
    todo = _pairs(cases, backends, config.skip)
    pool = None
    if config.isolate:
        from treebench.harness.run.isolate import WorkerPool

        pool = WorkerPool(device, config.case_timeout_s)
    rows: list[dict] = []
    t0 = time.perf_counter()
    PROGRESS[0] = (0, len(todo))
    try:
        costs = pair_seconds([(c, device_for(b, device).type) for c, b in todo], config.mode, [_name(b) for _, b in todo])
        after_s = after_last_pair_s(config.report, device.type)  # the summary, and the report if one follows
        then = REPORT_NEXT if config.report else ""                 # a summary alone: as good as done
        if config.wait_note:   # a wait for other processes first, of no known length: said alone, no seconds
            after_s, then = 0.0, config.wait_note
        with progress(len(todo), config.quiet, console, [_name(b) for _, b in todo], costs, after_s, then) as shown:
            data: CaseData | None = None
            for case, backend in todo:
                data = data if data is not None and data.case is case else CaseData(case)
                shown.start(_name(backend), case.case_id)
                pair_device = device_for(backend, device)
                if pool is not None and avail[id(backend)] is None:
                    row = pool.run(backend, case, pair_device, config)
                else:
                    row = call_in_flight(_name(backend), case.case_id, run_case_backend,   # a crash names it
                                         backend, case, data, avail[id(backend)], pair_device, config)
                if config.store_path is not None:
                    append_row(config.store_path, row, config.store_named)
                rows.append(row)
                PROGRESS[0] = (len(rows), len(todo))
                _log_row(row, warned)
                shown.finish(row)
                if STOP_REQUESTED[0] is not None:   # a signal whose exception was lost (a backend swallowed it)
                    stop, STOP_REQUESTED[0] = STOP_REQUESTED[0], None   # raised once: the next run starts clean
                    raise stop
                if SIGINT_CAME[0]:   # a Ctrl-C whose KeyboardInterrupt a backend swallowed
                    raise KeyboardInterrupt
    finally:
        if pool is not None:
            pool.close()
    log.debug("ran %d rows in %.1f s (%d pairs skipped as stored)", len(rows), time.perf_counter() - t0,
              len(cases) * len(backends) - len(todo))
    return rows
