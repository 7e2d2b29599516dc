"""Device-memory prediction: skip a case that cannot fit instead of dying out of memory.

``predict_device_bytes(case, backend)`` adds up, in bytes, what one (case,
backend) pair puts on its device: the batch inputs built by
treebench.harness.model.paged.build_inputs (paged pool, Q, logical K/V, index tensors), the
float64 reference's peak working set (treebench.harness.model.reference.reference_attention),
the backend's output (twice with the determinism check), the comparison's
float64 temporaries (treebench.harness.model.compare.compare), the timer's L2 flush buffer on
a GPU, and the backend's own scratch from its optional hook
``workspace_bytes(case) -> int``. ``fit_reason`` compares it with the free
memory of the device (``torch.cuda.mem_get_info`` plus what PyTorch's caching
allocator holds but does not use; ``MemAvailable`` of /proc/meminfo on the
CPU; no check where neither is known).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, fields
from pathlib import Path

import torch

from treebench.harness.model.cases import Case
from treebench.harness.model.paged import TORCH_DTYPES
from treebench.harness.timing.timers import FLUSH_BYTES as TIMING_FLUSH_BYTES  # the L2 flush buffer on a GPU

log = logging.getLogger(__name__)

GIB = 2**30
F64 = 8                                   # bytes per float64 element (reference, compare)
I32 = 4                                   # bytes per int32 index element
COMPARE_F64_TEMPS = 7                     # compare(): o, diff, |r|, rel, per_elem, full_like, (o - r)
MEMINFO = Path("/proc/meminfo")


@dataclass(frozen=True)
class MemoryPrediction:
    """Predicted device bytes of one (case, backend) pair, by part."""

    inputs: int        # BatchInputs: pool, Q, logical K/V, index tensors
    reference: int     # float64 reference: peak working set of the largest request + the kept output
    output: int        # the backend's output(s), (sum T_b, Hq, D) in the case dtype
    compare: int       # float64 temporaries of compare()
    timing: int        # L2 flush buffer (GPU, run mode only)
    workspace: int     # the backend's workspace_bytes(case) hook (0 without one)

    @property
    def total(self) -> int:
        """All parts, bytes."""
        return sum(getattr(self, f.name) for f in fields(self))


def _sizes(case: Case) -> tuple[list[int], list[int], list[int]]:
    """(L_b, T_b, S_b) lists of a case."""
    ls = case.context_lens()
    ts = [t.size for t in case.trees()]
    return ls, ts, [l + t for l, t in zip(ls, ts)]


def inputs_bytes(case: Case) -> int:
    """Bytes of build_inputs(case) on its device, with its page arithmetic.

    N = sum_b ceil(S_b / P) + max(2, that sum // 4) pages (treebench.harness.model.paged's spare
    NaN pages); K and V pools (N, P, Hkv, D), logical K/V (sum S_b, Hkv, D) and Q
    (sum T_b, Hq, D) in the case dtype (the pools and logical K/V in its kv dtype); block_table
    (B, max pages) and three (B,) or (B+1,) int32 vectors.
    """
    _, ts, ss = _sizes(case)
    e, ekv = TORCH_DTYPES[case.dtype].itemsize, TORCH_DTYPES[case.kv_dtype_name].itemsize
    P, Hq, Hkv, D, B = case.page_size, case.num_q_heads, case.num_kv_heads, case.head_dim, case.batch_size
    pages = [-(-s // P) for s in ss]                              # ceil(S_b / P)
    num_pages = sum(pages) + max(2, sum(pages) // 4)              # N
    pool = 2 * num_pages * P * Hkv * D * ekv                      # K and V pools
    logical = 2 * sum(ss) * Hkv * D * ekv                         # k_logical, v_logical
    q = sum(ts) * Hq * D * e
    index = (B * max(pages) + B + B + (B + 1)) * I32              # block_table, context/seq lens, qo_indptr
    return pool + logical + q + index


def reference_bytes(case: Case) -> int:
    """Peak float64 bytes of reference_attention: the largest request's working set plus the outputs.

    Per request b: q (T, Hq, D), k and v (S, Hkv, D) and their GQA-repeated
    copies (S, Hq, D), three (Hq, T, S) score-sized tensors (scores, masked
    scores, probabilities), and the (T, S) bool mask; across requests the
    (sum T_b, Hq, D) outputs are held twice (the list and the concatenation).
    """
    _, ts, ss = _sizes(case)
    Hq, Hkv, D = case.num_q_heads, case.num_kv_heads, case.head_dim
    per_request = max(
        (t * Hq * D + 2 * s * Hkv * D + 2 * s * Hq * D + 3 * Hq * t * s) * F64 + t * s
        for t, s in zip(ts, ss))
    return per_request + 2 * sum(ts) * Hq * D * F64


def _workspace(backend, case: Case) -> int:
    """The backend's workspace_bytes(case) hook, 0 without one (a raising hook is logged and counts 0)."""
    hook = getattr(backend, "workspace_bytes", None)
    if hook is None:
        return 0
    try:
        return max(0, int(hook(case)))
    except Exception as e:  # noqa: BLE001 -- a broken hook must not stop the sweep; the run itself may still fit
        log.warning("%s.workspace_bytes raised %s: %s; counting 0", getattr(backend, "name", "?"),
                    type(e).__name__, e)
        return 0


def predict_device_bytes(case: Case, backend, device: torch.device | str = "cpu", mode: str = "run",
                         determinism: bool = False) -> MemoryPrediction:
    """Predicted device memory of running `backend` on `case`, by part (see the module docstring).

    Args:
        case: the case.
        backend: the adapter (its optional `workspace_bytes(case) -> int` hook is added).
        device: where it runs; the timer's 256 MiB L2 flush buffer counts on CUDA in run mode.
        mode: "run" (correctness then timing) or "check" (correctness only).
        determinism: the output is kept twice for the bitwise determinism check.

    Returns:
        MemoryPrediction (bytes).
    """
    _, ts, _ = _sizes(case)
    out = sum(ts) * case.num_q_heads * case.head_dim * TORCH_DTYPES[case.dtype].itemsize
    timed_on_gpu = torch.device(device).type == "cuda" and mode == "run"
    return MemoryPrediction(
        inputs=inputs_bytes(case), reference=reference_bytes(case),
        output=out * (2 if determinism else 1),
        compare=COMPARE_F64_TEMPS * sum(ts) * case.num_q_heads * case.head_dim * F64,
        timing=TIMING_FLUSH_BYTES if timed_on_gpu else 0,
        workspace=_workspace(backend, case))


def _meminfo_available() -> int | None:
    """MemAvailable of /proc/meminfo in bytes, or None where there is none."""
    try:
        for line in MEMINFO.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024               # the file gives kB
    except (OSError, ValueError, IndexError):
        return None
    return None


def free_device_bytes(device: torch.device | str) -> int | None:
    """Bytes free for a new case on `device`, or None when unknown (no check then).

    CUDA: free memory from the driver plus what PyTorch's caching allocator
    reserved but does not use. CPU: MemAvailable.
    """
    dev = torch.device(device)
    if dev.type == "cuda":
        free, _total = torch.cuda.mem_get_info(dev)
        return int(free + torch.cuda.memory_reserved(dev) - torch.cuda.memory_allocated(dev))
    if dev.type == "cpu":
        return _meminfo_available()
    return None


BYTE_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB")   # powers of 1024


def format_bytes(n: float) -> str:
    """A byte count in the largest binary unit it reaches, three significant digits:
    1000 -> '1000 B', 64 * 2**20 -> '64.0 MiB', 9 * 2**60 -> '9.00 EiB'."""
    v, unit = float(n), 0
    while abs(v) >= 1024 and unit < len(BYTE_UNITS) - 1:
        v, unit = v / 1024, unit + 1
    if unit == 0:
        return f"{int(v)} B"
    return f"{v:.2f} {BYTE_UNITS[unit]}" if abs(v) < 10 else f"{v:.1f} {BYTE_UNITS[unit]}" if abs(v) < 100 \
        else f"{v:.0f} {BYTE_UNITS[unit]}"


def fit_reason(case: Case, backend, device: torch.device | str, mode: str = "run", determinism: bool = False,
               inputs_built: bool = False, reference_built: bool = False) -> str | None:
    """None when `backend` on `case` is predicted to fit on `device`, else the skip reason.

    Args:
        inputs_built, reference_built: the case's inputs / this backend's reference
            already live on the device (an earlier backend built them; the runner
            builds each once per case), so they are not counted again.

    Returns:
        None, or "predicted X > free Y on DEVICE (inputs ..., reference ..., ...)", each size
        in its own unit (`format_bytes`: "64.0 MiB", "9.00 GiB").
    """
    free = free_device_bytes(device)
    if free is None:
        return None
    pred = predict_device_bytes(case, backend, device, mode, determinism)
    need = pred.total - (pred.inputs if inputs_built else 0) - (pred.reference if reference_built else 0)
    if need <= free:
        return None
    parts = ", ".join(f"{f.name} {format_bytes(getattr(pred, f.name))}" for f in fields(pred) if getattr(pred, f.name))
    return f"predicted {format_bytes(need)} > free {format_bytes(free)} on {device} ({parts})"
