"""The time budget of one timing and the `Timing` record it produces.

The budget is by time: warm up for `warmup_ms`, then take as many samples as
`rep_ms` holds, clamped to [`min_reps`, `max_reps`]. Every timer, CPU or CUDA,
warms up with `warmup`. `Timing` keeps every sample; statistics live in
`treebench.harness.timing.stats`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from time import perf_counter
from typing import TYPE_CHECKING

from treebench.harness.errors import ConfigError
from treebench.harness.timing.stats import summarize

if TYPE_CHECKING:
    import torch

GPU_BUDGET_MS = (25.0, 100.0)      # default (warmup_ms, rep_ms) on a GPU (triton's do_bench uses 25, 100)
CPU_BUDGET_MS = (5.0, 20.0)        # default on the CPU, where timing is a plumbing check


@dataclass(frozen=True)
class Timing:
    """Raw samples of one timed callable."""

    samples_us: list[float]              # per-call times, microseconds, in measurement order
    timer: str                           # "cuda_graph" | "cuda_event" | "host_inclusive" | "cuda_graph_loop" | "wall"
    fallback_reason: str | None = None   # why the requested timer was not used (None: it was)
    l2_flushed: bool = False             # an L2 flush ran before every sample (never on the CPU: no flush there)
    calls_per_sample: int = 1            # calls averaged into one sample (graph replay of k calls)
    warmup_calls: int = 0                # untimed calls made before the first sample
    cpu_threads: int | None = None       # torch intra-op threads during the samples (wall timer); None on a GPU

    def as_row(self) -> dict:
        """The result row's timing fields (treebench.harness.store.rows, schema 2)."""
        s = summarize(self.samples_us)
        return {"timer": self.timer, "timer_fallback": self.fallback_reason, "l2_flushed": self.l2_flushed,
                "cpu_threads": self.cpu_threads, "median_us": s.median_us, "p25_us": s.p25_us,
                "p75_us": s.p75_us, "cv": s.cv, "n_samples": s.n, "samples_us": [round(x, 4) for x in self.samples_us]}


@dataclass(frozen=True)
class Budget:
    """How long one timing warms up and samples."""

    warmup_ms: float      # time spent warming up before the first sample, milliseconds
    rep_ms: float         # time budget for the samples, milliseconds
    min_reps: int         # at least this many samples, whatever the time
    max_reps: int         # at most this many samples
    flush_l2: bool        # flush the L2 before every sample (GPU only)

    def reps(self, iter_ms: float) -> int:
        """Samples that fit `rep_ms` at `iter_ms` milliseconds per iteration, clamped to [min_reps, max_reps]."""
        n = int(self.rep_ms / max(iter_ms, 1e-6))
        return max(self.min_reps, min(self.max_reps, n))


def make_budget(device: torch.device, warmup_ms: float | None, rep_ms: float | None, min_reps: int,
                max_reps: int, flush_l2: bool) -> Budget:
    """The Budget of `time_callable`'s arguments, None filled with the device's default
    (GPU_BUDGET_MS on CUDA, CPU_BUDGET_MS elsewhere).

    Raises:
        ConfigError: warmup_ms < 0, rep_ms <= 0, min_reps not an integer >= 1, or max_reps
            not an integer >= min_reps (the message names the field).
    """
    w0, r0 = GPU_BUDGET_MS if device.type == "cuda" else CPU_BUDGET_MS
    warmup_ms, rep_ms = (w0 if warmup_ms is None else warmup_ms), (r0 if rep_ms is None else rep_ms)
    if not warmup_ms >= 0:
        raise ConfigError(f"timing warmup_ms={warmup_ms}: must be >= 0")
    if not rep_ms > 0:
        raise ConfigError(f"timing rep_ms={rep_ms}: must be > 0")
    if not (isinstance(min_reps, int) and min_reps >= 1):
        raise ConfigError(f"timing min_reps={min_reps!r}: must be an integer >= 1")
    if not (isinstance(max_reps, int) and max_reps >= min_reps):
        raise ConfigError(f"timing max_reps={max_reps!r}: must be an integer >= min_reps ({min_reps})")
    return Budget(float(warmup_ms), float(rep_ms), min_reps, max_reps, bool(flush_l2))


def warmup(fn: Callable, warmup_ms: float, sync: Callable[[], None]) -> tuple[int, float]:
    """Calls fn, then sync, (at least once) until `warmup_ms` milliseconds have passed.

    Returns:
        (calls made, milliseconds per call including sync).
    """
    calls, t0 = 0, perf_counter()
    while True:
        fn()
        sync()
        calls += 1
        elapsed_ms = (perf_counter() - t0) * 1e3
        if elapsed_ms >= warmup_ms:
            return calls, elapsed_ms / calls
