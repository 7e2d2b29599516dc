"""The device's measured peaks: copy bandwidth (what `pct_peak_bw` refers to) and dense bf16
matrix rate (the roofline's compute roof).

A run measures both once (`treebench.harness.sweep.execute`) and hands them to the env
fingerprint (`treebench.harness.store.env.env_fingerprint`), which records them.
"""

from __future__ import annotations

import statistics

import torch
from treebench.harness.errors import ConfigError
from treebench.harness.timing.timers import event_loop


def _cuda_device(device: torch.device | str, what: str) -> torch.device | None:
    """`device` as a CUDA torch.device, None for any other device.

    Raises:
        ConfigError: a CUDA device that torch cannot see.
    """
    dev = torch.device(device)
    if dev.type != "cuda":
        return None
    if not torch.cuda.is_available():
        raise ConfigError(f"{what} device={dev}: torch sees no CUDA GPU")
    return dev


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
    dev = _cuda_device(device, "peak bandwidth")
    if dev is None:
        return None
    with torch.cuda.device(dev):
        free, _ = torch.cuda.mem_get_info()
        size = min(nbytes, free // 4) // 2**20 * 2**20          # whole MiB
        src = torch.empty(size, dtype=torch.uint8, device=dev)
        dst = torch.empty_like(src)
        for _ in range(3):
            dst.copy_(src)
        samples_us = event_loop(lambda: dst.copy_(src), lambda: None, reps)
    return 2 * size / (statistics.median(samples_us) * 1e-6)   # read + write, per second


def measure_matrix_rate(device: torch.device | str, n: int = 8192, reps: int = 5) -> float | None:
    """Dense bf16 matrix rate in TFLOP/s (10^12 FLOP/s): the best of `reps` `torch.matmul`s of two
    (n, n) bf16 matrices, 2 n^3 FLOPs each (n multiply-adds per output element).

    Timed with CUDA events after 3 warmup products; n is halved until the three (n, n)
    matrices fit in a quarter of free memory. The best sample, not the median: this is the
    compute roof of the roofline, what the tensor cores reach here (on an H200 below the
    datasheet's 989 TFLOP/s dense bf16: clocks and power cap it).

    Returns:
        TFLOP/s, or None on a device other than CUDA.

    Raises:
        ConfigError: a CUDA device that torch cannot see.
    """
    dev = _cuda_device(device, "matrix rate")
    if dev is None:
        return None
    with torch.cuda.device(dev):
        free, _ = torch.cuda.mem_get_info()
        while n > 256 and 3 * n * n * 2 > free // 4:            # three (n, n) bf16 matrices
            n //= 2
        a = torch.randn(n, n, device=dev, dtype=torch.bfloat16)  # (n, n)
        b = torch.randn(n, n, device=dev, dtype=torch.bfloat16)  # (n, n)
        out = torch.empty(n, n, device=dev, dtype=torch.bfloat16)
        for _ in range(3):
            torch.matmul(a, b, out=out)
        samples_us = event_loop(lambda: torch.matmul(a, b, out=out), lambda: None, reps)
    return 2 * n**3 / (min(samples_us) * 1e-6) / 1e12
