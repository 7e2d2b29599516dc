"""Timing core: the `Timing` record, the time budget and the CPU's wall timer.

`treebench.harness.timing.timers.time_callable` validates its budget here (`_budget`) and
returns a `Timing`; every timer, CPU or CUDA, warms up with `_warmup`. On the
CPU the only timer is ``wall``: `time.perf_counter` around each `fn()` call,
nothing flushed between calls, so its rows say `l2_flushed: false`.

The budget is by time: warm up for `warmup_ms`, then take as many samples as
`rep_ms` holds, clamped to [`min_reps`, `max_reps`]. `Timing` keeps every
sample; statistics live in `treebench.harness.timing.stats`.
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

    def as_row(self) -> dict:
        """The result row's timing fields (architecture.md schema 1)."""
        s = summarize(self.samples_us)
        return {"timer": self.timer, "timer_fallback": self.fallback_reason, "l2_flushed": self.l2_flushed,
                "median_us": s.median_us, "p25_us": s.p25_us, "p75_us": s.p75_us,
                "cv": s.cv, "n_samples": s.n, "samples_us": [round(x, 4) for x in self.samples_us]}


@dataclass(frozen=True)
class _Budget:
    warmup_ms: float      # time spent warming up before the first sample
    rep_ms: float         # time budget for the samples
    min_reps: int         # at least this many samples, whatever the time
    max_reps: int         # at most this many samples
    flush_l2: bool        # flush the L2 before every sample (GPU only)

    def reps(self, iter_ms: float) -> int:
        """Samples that fit `rep_ms` at `iter_ms` per iteration, clamped to [min_reps, max_reps]."""
        n = int(self.rep_ms / max(iter_ms, 1e-6))
        return max(self.min_reps, min(self.max_reps, n))


def _budget(device: torch.device, warmup_ms, rep_ms, min_reps, max_reps, flush_l2) -> _Budget:
    """Validates the timing arguments (ConfigError names the field) and fills device defaults."""
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
    return _Budget(float(warmup_ms), float(rep_ms), min_reps, max_reps, bool(flush_l2))


# ---- CPU ---------------------------------------------------------------------------------

def _time_wall(fn: Callable, budget: _Budget, reason: str | None) -> Timing:
    """perf_counter around each call; warmup and reps by time. Nothing is flushed between calls
    (budget.flush_l2 is a GPU option), so the Timing says l2_flushed=False."""
    calls, iter_ms = _warmup(fn, budget.warmup_ms, sync=lambda: None)
    samples = []
    for _ in range(budget.reps(iter_ms)):
        t0 = perf_counter()
        fn()
        samples.append((perf_counter() - t0) * 1e6)
    return Timing(samples, "wall", reason, l2_flushed=False, warmup_calls=calls)


def _warmup(fn: Callable, warmup_ms: float, sync: Callable[[], None]) -> tuple[int, float]:
    """Calls fn (at least once) until warmup_ms has passed; returns (calls, ms per call incl. sync)."""
    calls, t0 = 0, perf_counter()
    while True:
        fn()
        sync()
        calls += 1
        elapsed_ms = (perf_counter() - t0) * 1e3
        if elapsed_ms >= warmup_ms:
            return calls, elapsed_ms / calls
