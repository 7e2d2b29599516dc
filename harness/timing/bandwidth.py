"""The device's peak memory bandwidth, measured: what `pct_peak_bw` refers to.

A run measures it once (`treebench.harness.sweep.execute`) and hands it to the env
fingerprint (`treebench.harness.store.env.env_fingerprint`), which records it.
"""

from __future__ import annotations

import statistics

import torch
from treebench.harness.errors import ConfigError
from treebench.harness.timing.timers import event_loop


def measure_peak_bandwidth(device: torch.device | str, nbytes: int = 2 * 2**30, reps: int = 10) -> float | None:
    """Device-to-device copy bandwidth in bytes/s, counting bytes read + written.

    A `nbytes` copy (2 GiB by default, at most a quarter of free memory) is
    timed `reps` times with CUDA events after 3 warmup copies; the median is
    used. It is the achievable HBM bandwidth that `pct_peak_bw` refers to
    (the datasheet figure is higher: 4.8 TB/s on an H200).

    Returns:
        bytes/s, or None on a device other than CUDA (the CPU has no such peak here).

    Raises:
        ConfigError: a CUDA device that torch cannot see.
    """
    dev = torch.device(device)
    if dev.type != "cuda":
        return None
    if not torch.cuda.is_available():
        raise ConfigError(f"peak bandwidth device={dev}: torch sees no CUDA GPU")
    with torch.cuda.device(dev):
        free, _ = torch.cuda.mem_get_info()
        size = min(nbytes, free // 4) // 2**20 * 2**20          # whole MiB
        src = torch.empty(size, dtype=torch.uint8, device=dev)
        dst = torch.empty_like(src)
        for _ in range(3):
            dst.copy_(src)
        samples_us = event_loop(lambda: dst.copy_(src), lambda: None, reps)
    return 2 * size / (statistics.median(samples_us) * 1e-6)   # read + write, per second
