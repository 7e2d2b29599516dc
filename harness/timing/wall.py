"""The CPU's timer, ``wall``: `time.perf_counter` around each `fn()` call, under one torch thread.

Nothing is flushed between calls (there is no L2 flush on the CPU), so its rows
say ``l2_flushed: false``.

Threads: with torch's default intra-op thread count (one per core), a timed op
fans out to worker threads that compete with everything else on the machine;
on a 2-core machine the samples then fall into the scheduler's ~8 ms time
slices (torch_sdpa read 5441 us under the default against 210 us with
OMP_NUM_THREADS=1). So the samples are taken with `torch.set_num_threads(
CPU_TIMING_THREADS)`, restored afterwards, and the Timing records the count
used (the row's ``cpu_threads``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from time import perf_counter

import torch
from treebench.harness.timing.budget import Budget, Timing, warmup
from treebench.harness.timing.modes import WALL

CPU_TIMING_THREADS = 1   # torch intra-op threads while the wall timer warms up and samples


@contextmanager
def torch_threads(n: int) -> Iterator[int]:
    """Runs the block with torch's intra-op thread count set to `n`; the previous count is
    restored afterwards, also when the block raises. Yields `n`.

    Raises:
        ValueError: n < 1.
    """
    if not (isinstance(n, int) and n >= 1):
        raise ValueError(f"torch threads {n!r}: must be an integer >= 1")
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield n
    finally:
        torch.set_num_threads(before)


def time_wall(fn: Callable, budget: Budget, reason: str | None, threads: int = CPU_TIMING_THREADS) -> Timing:
    """perf_counter around each call, microseconds; warmup and reps by time, all under `threads`
    torch intra-op threads (`torch_threads`). Nothing is flushed between calls (budget.flush_l2
    is a GPU option), so the Timing says l2_flushed=False and records cpu_threads=threads.

    Args:
        reason: why the requested timer was not used (a CUDA timer asked for on the CPU), or None.

    Raises:
        ValueError: threads < 1.
    """
    with torch_threads(threads):
        calls, iter_ms = warmup(fn, budget.warmup_ms, sync=lambda: None)
        samples = []
        for _ in range(budget.reps(iter_ms)):
            t0 = perf_counter()
            fn()
            samples.append((perf_counter() - t0) * 1e6)
    return Timing(samples, WALL, reason, l2_flushed=False, warmup_calls=calls, cpu_threads=threads)
