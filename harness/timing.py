"""Timing (SKELETON: a plain host timer; the timing work item replaces the
internals and keeps `time_callable`'s signature and `Timing`'s fields)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass
class Timing:
    samples_us: list[float]        # raw per-iteration samples, microseconds
    timer: str                     # "cuda_graph" | "cuda_event" | "host_inclusive" | "wall"
    fallback_reason: str | None = None  # why the requested timer was not used


def time_callable(fn: Callable[[], torch.Tensor], *, device: torch.device | str = "cpu",
                  mode: str = "auto", warmup_ms: float = 5.0, rep_ms: float = 20.0,
                  min_reps: int = 3, max_reps: int = 1000, flush_l2: bool = True) -> Timing:
    """Runs `fn` repeatedly and returns raw per-call samples in microseconds."""
    fn()
    samples, spent = [], 0.0
    while len(samples) < min_reps or (spent < rep_ms * 1e3 and len(samples) < max_reps):
        t0 = time.perf_counter()
        fn()
        dt = (time.perf_counter() - t0) * 1e6
        samples.append(dt)
        spent += dt
    return Timing(samples, "wall")


def measure_peak_bandwidth(device: torch.device | str) -> float | None:
    """Device-copy bandwidth in bytes/s (read + write), measured once per run;
    None on the CPU. (SKELETON: the timing work item implements it.)"""
    return None
