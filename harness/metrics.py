"""Metrics (SKELETON: the timing work item replaces this with the full FLOP and
byte model; `case_metrics`'s signature stays)."""

from __future__ import annotations

from harness.paged import BatchInputs


def case_metrics(inputs: BatchInputs, median_us: float | None, peak_bytes_per_s: float | None = None) -> dict:
    """tflops, tb_per_s, pct_peak_bw for one timed case (None when not timed)."""
    return {"tflops": None, "tb_per_s": None, "pct_peak_bw": None}
