"""Timing: one function returning raw per-call samples in microseconds.

Timers (recorded in each result row as `timer`):

- ``cuda_graph`` (default on a GPU): `fn` is captured in a CUDA graph, 32
  calls per graph, each between its own pair of CUDA events recorded inside
  the graph. What it measures: device time of the call's kernels, with the
  host's launch work and the graph's own launch removed.
- ``cuda_event``: CUDA events around each eager `fn()` call. Device time of one
  call; host launch gaps show only when the host falls behind the device.
- ``host_inclusive``: `time.perf_counter` around `fn()` plus a device
  synchronize. Shows launch overhead (Python, planning, many small launches).
- ``wall``: the CPU's only timer, `perf_counter` around `fn()`.

- ``cuda_graph_loop`` (warm L2 only): k back-to-back calls captured in one CUDA
  graph, CUDA events around each replay, a sample is the replay's time / k
  (k sized so one replay lasts >= 2 ms, at most 2000 calls). This is the
  method of `triton.testing.do_bench_cudagraph` (how published peer figures are
  usually taken), with
  shorter replays and their median instead of 10 replays of ~100 ms: no event
  sits between two calls, so a call's launch latency overlaps the previous
  call's tail, and the graph launch is amortised over k calls. Asking for it
  with `flush_l2=True` is a ConfigError: a flush between calls would be inside
  the measured region.

``auto`` picks ``cuda_graph`` on a GPU, falling back to ``cuda_event`` with the
reason recorded when the callable cannot be captured, and ``wall`` on the CPU.

L2 flush and graph replay (`flush_l2=True`, the default on a GPU): the graph
holds 32 x [flush, start event, fn, end event]. The flush zeroes a 256 MiB
buffer (5x the H200's 50 MiB L2) *outside* the measured region, so every call
starts with a cold L2, and the events enclose the call alone: neither the
flush nor the graph launch is in a sample. The events are created with
`external=True`, which makes their records event-record nodes of the graph;
the host replays the graph, synchronizes and reads the 32 samples, until the
budget is met. Where events cannot be recorded inside a graph, the timer
falls back to events around whole replays of a one-call graph (each after a
flush, queued behind a short `torch.cuda._sleep` cushion), which adds the
graph's launch latency (~3 us on an H200) to every sample. With
`flush_l2=False` the graph is the same without the flush (warm L2). Rows record
which it was as `l2_flushed` (always False for `wall`: the CPU never flushes).

Warmup and repetitions are set by time (`warmup_ms`, `rep_ms`) within
[`min_reps`, `max_reps`] samples. Every sample is kept; statistics live in
`treebench.harness.timing.stats`. The `Timing` record and the budget are in
`treebench.harness.timing.budget`, the CPU's wall timer in `treebench.harness.timing.wall`,
the peak-bandwidth measurement in `treebench.harness.timing.bandwidth`.
"""

from __future__ import annotations

import logging
import math
import statistics
import warnings
from collections.abc import Callable
from functools import cache
from time import perf_counter
from typing import cast

import torch
from treebench.harness.errors import ConfigError
from treebench.harness.timing.budget import Budget, Timing, make_budget, warmup
from treebench.harness.timing.modes import MODES
from treebench.harness.timing.wall import time_wall

log = logging.getLogger(__name__)

FLUSH_BYTES = 256 * 2**20          # L2 flush buffer: 256 MiB, >= 5x the L2 of any current GPU
CALLS_PER_GRAPH = 32               # timed calls captured in one graph, each between its own events
MIN_REPLAY_US = 50.0               # fallback without in-graph events, flush_l2=False: a replay lasts >= this
MAX_CALLS_PER_GRAPH = 64           # ... and holds at most this many calls
LOOP_REPLAY_US = 2000.0            # cuda_graph_loop: one replay of k back-to-back calls lasts >= this
MAX_LOOP_CALLS = 2000              # ... and holds at most this many calls
CUSHION_MS = 2.0                   # device sleep queued before the timed loop


def time_callable(fn: Callable[[], torch.Tensor], *, device: torch.device | str = "cpu",
                  mode: str = "auto", warmup_ms: float | None = None, rep_ms: float | None = None,
                  min_reps: int = 10, max_reps: int = 1000, flush_l2: bool = True) -> Timing:
    """Runs `fn` repeatedly and returns raw per-call samples in microseconds.

    Args:
        fn: zero-argument callable launching the work (a backend's prepared callable).
        device: where `fn` runs; a CUDA device enables the CUDA timers.
        mode: "auto" | "cuda_graph" | "cuda_event" | "host_inclusive" | "cuda_graph_loop"
            (module docstring; cuda_graph_loop needs flush_l2=False).
            A CUDA timer asked for on the CPU falls back to "wall" with the reason.
        warmup_ms: untimed warmup, milliseconds (default 25 on a GPU, 5 on the CPU).
        rep_ms: time budget for the samples, milliseconds (default 100 GPU, 20 CPU).
        min_reps, max_reps: bounds on the number of samples.
        flush_l2: zero a 256 MiB buffer before each sample, outside the measured
            region (GPU only; ignored on the CPU, whose Timing says l2_flushed=False).
            On the CPU the calls run under one torch intra-op thread
            (`treebench.harness.timing.wall.CPU_TIMING_THREADS`), restored afterwards.

    Returns:
        Timing with every sample kept (no outlier dropping).

    Raises:
        ConfigError: unknown mode, cuda_graph_loop with flush_l2=True, bad budget, or a CUDA device
            torch cannot see.
    """
    if mode not in MODES:
        raise ConfigError(f"timing mode={mode!r}: use one of {', '.join(MODES)}")
    if mode == "cuda_graph_loop" and flush_l2:
        raise ConfigError("timing mode='cuda_graph_loop' times back-to-back calls, so it needs a warm L2 "
                          "(flush_l2=False; treebench run --l2 warm)")
    dev = torch.device(device)
    budget = make_budget(dev, warmup_ms, rep_ms, min_reps, max_reps, flush_l2)
    if dev.type != "cuda":
        reason = None if mode == "auto" else f"timer {mode!r} needs a CUDA device; {dev.type} has only the wall timer"
        return time_wall(fn, budget, reason)
    if not torch.cuda.is_available():
        raise ConfigError(f"timing device={dev}: torch sees no CUDA GPU; time on device='cpu'")
    with torch.cuda.device(dev):
        if mode == "host_inclusive":
            return _time_host_inclusive(fn, budget)
        if mode == "cuda_event":
            return _time_events(fn, budget)
        return _time_graph_or_fallback(fn, budget, _time_loop if mode == "cuda_graph_loop" else _time_graph)


# ---- GPU helpers -------------------------------------------------------------------------

@cache
def _flush_buffer(index: int) -> torch.Tensor:
    """The L2 flush buffer of CUDA device `index` (allocated once, kept for the process)."""
    return torch.empty(FLUSH_BYTES, dtype=torch.int8, device=torch.device("cuda", index))


def _flusher(budget: Budget) -> Callable[[], object]:
    """A callable that flushes the L2 (a 256 MiB write), or does nothing when flush_l2 is off."""
    if not budget.flush_l2:
        return lambda: None
    buf = _flush_buffer(torch.cuda.current_device())
    return buf.zero_


@cache
def _sleep_cycles_per_ms(index: int) -> float:
    """Clock cycles of `torch.cuda._sleep` per millisecond on device `index`, measured once."""
    cycles = 1_000_000
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(cycles)  # first call loads the kernel
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    end.synchronize()
    return cycles / max(start.elapsed_time(end), 1e-3)


def _cushion() -> None:
    """Queues CUSHION_MS of device sleep so the host can enqueue the timed loop ahead of the device."""
    if hasattr(torch.cuda, "_sleep"):
        torch.cuda._sleep(int(CUSHION_MS * _sleep_cycles_per_ms(torch.cuda.current_device())))


def event_loop(step: Callable[[], object], flush: Callable[[], object], reps: int) -> list[float]:
    """`reps` samples of `step` between CUDA events, each after a flush; one sync at the end.

    Returns:
        Elapsed device time of each step, microseconds.
    """
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(reps)]
    torch.cuda.synchronize()
    _cushion()
    for start, end in events:
        flush()                  # outside the measured region
        start.record()
        step()
        end.record()
    torch.cuda.synchronize()
    return [start.elapsed_time(end) * 1e3 for start, end in events]  # ms -> us


def _iter_ms(step: Callable[[], object], flush: Callable[[], object], n: int = 5) -> float:
    """Host wall time of one flush + step iteration, ms (used to size the number of samples)."""
    torch.cuda.synchronize()
    t0 = perf_counter()
    for _ in range(n):
        flush()
        step()
    torch.cuda.synchronize()
    return (perf_counter() - t0) * 1e3 / n


# ---- GPU timers --------------------------------------------------------------------------

def _time_events(fn: Callable, budget: Budget, reason: str | None = None) -> Timing:
    """CUDA events around each eager call."""
    calls, _ = warmup(fn, budget.warmup_ms, torch.cuda.synchronize)
    flush = _flusher(budget)
    samples = event_loop(fn, flush, budget.reps(_iter_ms(fn, flush)))
    return Timing(samples, "cuda_event", reason, budget.flush_l2, 1, calls)


def _time_host_inclusive(fn: Callable, budget: Budget) -> Timing:
    """perf_counter around fn() + synchronize; the flush runs (and completes) before t0."""
    calls, iter_ms = warmup(fn, budget.warmup_ms, torch.cuda.synchronize)
    flush, samples = _flusher(budget), []
    for _ in range(budget.reps(iter_ms)):
        flush()
        torch.cuda.synchronize()
        t0 = perf_counter()
        fn()
        torch.cuda.synchronize()
        samples.append((perf_counter() - t0) * 1e6)
    return Timing(samples, "host_inclusive", None, budget.flush_l2, 1, calls)


def _time_graph_or_fallback(fn: Callable, budget: Budget,
                            graph_timer: Callable[[Callable, Budget], Timing]) -> Timing:
    """CUDA-graph timing by `graph_timer` (`_time_graph` or `_time_loop`); on a capture
    failure, CUDA events with the reason."""
    try:
        return graph_timer(fn, budget)
    except Exception as e:  # noqa: BLE001 -- any capture failure means "not capturable"
        reason = f"CUDA graph capture failed: {_root_cause(e)}"
    log.info("%s; timing with CUDA events instead", reason)
    torch.cuda.synchronize()
    return _time_events(fn, budget, reason)


def _root_cause(e: BaseException) -> str:
    """'Type: first line' of the innermost exception in e's context chain."""
    while e.__cause__ or e.__context__:
        e = cast(BaseException, e.__cause__ or e.__context__)  # the loop condition: one is set
    msg = str(e).strip().splitlines()
    return f"{type(e).__name__}: {msg[0] if msg else ''}"[:300]


def _time_graph(fn: Callable, budget: Budget) -> Timing:
    """Times each call inside a CUDA graph of CALLS_PER_GRAPH x [flush, event, fn, event].

    Falls back to events around whole replays (`_time_replays`) when timing
    events cannot be recorded inside a graph here; raises when fn itself
    cannot be captured.
    """
    calls = _warmup_side_stream(fn, budget.warmup_ms)
    flush = _flusher(budget)
    reps = budget.reps(_iter_ms(fn, flush))
    try:
        graph, events = _capture_timed(fn, flush, min(reps, CALLS_PER_GRAPH))
        samples: list[float] = []
        graph.replay()                      # upload; the first replay is not kept
        while len(samples) < reps:
            torch.cuda.synchronize()
            graph.replay()
            torch.cuda.synchronize()
            samples += [start.elapsed_time(end) * 1e3 for start, end in events]  # ms -> us
        if min(samples) <= 0:
            raise RuntimeError("non-positive elapsed time between events inside the graph")
    except Exception as e:  # noqa: BLE001 -- in-graph events unsupported, or fn not capturable
        log.info("timing inside a CUDA graph failed (%s); timing whole replays", _root_cause(e))
        return _time_replays(fn, budget, calls)
    return Timing(samples[:reps], "cuda_graph", None, budget.flush_l2, 1, calls)


def _warmup_side_stream(fn: Callable, warmup_ms: float) -> int:
    """Warms fn up on a side stream before capture (torch.cuda.graph's docs); returns the calls made."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        calls, _ = warmup(fn, warmup_ms, torch.cuda.synchronize)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    return calls


def _capture_timed(fn: Callable, flush: Callable[[], object], k: int):
    """A graph of k x [flush, start event, fn, end event] and its k (start, end) events.

    The events are created `external=True`, so recording them during capture
    adds event-record nodes to the graph; every replay re-records them.
    """
    events = [(torch.cuda.Event(enable_timing=True, external=True),
               torch.cuda.Event(enable_timing=True, external=True)) for _ in range(k)]

    def body() -> None:
        for start, end in events:
            flush()                  # outside the measured region
            start.record()
            fn()
            end.record()
    return capture_graph(body), events


def _time_replays(fn: Callable, budget: Budget, calls: int, k: int | None = None,
                  timer: str = "cuda_graph") -> Timing:
    """Events around whole replays of a graph of k calls (default: 1 with the L2 flush, else
    `_calls_per_graph`); sample = replay / k, recorded as `timer`. Raises if fn cannot be captured."""
    k = k or (1 if budget.flush_l2 else _calls_per_graph(fn))
    graph = capture_graph(_calls(fn, k))
    flush = _flusher(budget)
    warmup(graph.replay, budget.warmup_ms / 2, torch.cuda.synchronize)
    replays = event_loop(graph.replay, flush, budget.reps(_iter_ms(graph.replay, flush)))
    return Timing([r / k for r in replays], timer, None, budget.flush_l2, k, calls)


def _time_loop(fn: Callable, budget: Budget) -> Timing:
    """cuda_graph_loop (warm L2 only, checked by time_callable): `_time_replays` with k
    back-to-back calls per replay, k sized so one replay lasts >= LOOP_REPLAY_US."""
    calls = _warmup_side_stream(fn, budget.warmup_ms)
    return _time_replays(fn, budget, calls, k=_calls_per_graph(fn, LOOP_REPLAY_US, MAX_LOOP_CALLS),
                         timer="cuda_graph_loop")


def _calls(fn: Callable, k: int) -> Callable[[], None]:
    """k calls of fn, each output dropped before the next call (as `do_bench_cudagraph`
    does), so a callable that allocates its output can reuse one block in the graph's pool
    instead of holding k of them."""
    def body() -> None:
        for _ in range(k):
            fn()
    return body


def capture_graph(body: Callable[[], object]) -> torch.cuda.CUDAGraph:
    """A CUDA graph of one call of `body`, captured on the current CUDA device.

    `body` should have run once before (warm-up: compiles, allocator pools).

    Raises:
        RuntimeError (or torch's capture error): `body` cannot be captured, or it
            queued no work on the capturing stream (an empty graph).

    A failed capture leaves torch in capture state: `torch.cuda.graph` does not
    restore the current stream when `capture_end` raises, and the default CUDA
    generator stays in capture mode (any later random op raises "Offset
    increment outside graph capture"). Both are restored here before re-raising,
    the generator with its seed and Philox offset from before the capture.
    """
    stream = torch.cuda.current_stream()
    gen = torch.cuda.default_generators[torch.cuda.current_device()]
    seed, offset = gen.initial_seed(), gen.get_offset()
    graph = torch.cuda.CUDAGraph()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with torch.cuda.graph(graph):
                body()
        if any("Graph is empty" in str(w.message) for w in caught):
            # body ran but queued nothing on the capturing stream (work on another
            # stream, or host-only work): replaying it would time nothing
            raise RuntimeError("the captured graph is empty: the callable launched no work on the current stream")
    except Exception:
        torch.cuda.set_stream(stream)
        fresh = torch.Generator(device=gen.device)
        fresh.manual_seed(seed)
        fresh.set_offset(offset)
        gen.graphsafe_set_state(fresh)
        raise
    return graph


def _calls_per_graph(fn: Callable, replay_us: float = MIN_REPLAY_US, max_calls: int = MAX_CALLS_PER_GRAPH) -> int:
    """k back-to-back calls so that one replay lasts >= replay_us microseconds (at most max_calls)."""
    once = event_loop(fn, lambda: None, 5)
    call_us = max(statistics.median(once), 1e-3)
    return max(1, min(max_calls, math.ceil(replay_us / call_us)))
