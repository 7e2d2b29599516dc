"""The work model of tree attention: FLOPs, bytes, rates and the device peak table.

Pure functions over plain lists (L_b, T_b, node depths, Hq, Hkv, D, P, element
size), so the runner stores each row's figures and the report can recompute any
row's figures from its case axes. Every factor is commented. Peaks come from the
env fingerprint (HBM bandwidth measured by a device copy and the dense bf16 matrix rate
measured by a matmul, `treebench.harness.timing.bandwidth`) or from `DEVICE_PEAKS`
(datasheet figures, the compute roof when no rate was measured), never from a literal
inside a formula. The report's tables over rows live in `treebench.harness.analyze.tables`.

FLOPs count only attended (query, key) pairs, from the tree's real mask
density: query node i of request b attends to the L_b context tokens and to its
depth_i + 1 tree ancestors (itself included), so request b has
T_b * L_b + sum_i (depth_i + 1) pairs. A dense T_b x S_b count would credit a
kernel for masked-out work.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

if TYPE_CHECKING:   # the paged inputs load torch; this module's arithmetic needs none
    from treebench.harness.model.paged import BatchInputs

ELEMENT_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4,   # bytes per element of each case dtype
                 "float8_e4m3fn": 1, "float8_e5m2": 1}         # and of each kv_dtype
INDEX_BYTES = 4                                                # int32 block-table entry


@dataclass(frozen=True)
class DevicePeak:
    """Datasheet peaks of one GPU (dense, no sparsity)."""

    tflops_16bit: float     # BF16/FP16 tensor-core TFLOP/s, dense
    hbm_tb_per_s: float     # HBM bandwidth, TB/s (10^12 bytes/s)
    source: str             # where the figures come from


# Matched by substring of the env's gpu_name, first match wins (most specific first).
DEVICE_PEAKS: dict[str, DevicePeak] = {
    "H200": DevicePeak(989.4, 4.8, "NVIDIA H200 datasheet (SXM): 1,979 TFLOPS BF16 with sparsity / 2"),
    "H100 PCIe": DevicePeak(756.5, 2.0, "NVIDIA H100 datasheet (PCIe): 1,513 TFLOPS BF16 sparse / 2"),
    "H100": DevicePeak(989.4, 3.35, "NVIDIA H100 datasheet (SXM): 1,979 TFLOPS BF16 sparse / 2"),
    "A100": DevicePeak(312.0, 2.039, "NVIDIA A100 datasheet (80GB SXM): 312 TFLOPS BF16 dense"),
    "L40S": DevicePeak(362.05, 0.864, "NVIDIA L40S datasheet: 733 TFLOPS BF16 sparse / 2"),
}


def device_peak(gpu_name: str | None) -> DevicePeak | None:
    """Datasheet peaks for `gpu_name` (e.g. "NVIDIA H200"), or None when unknown."""
    for key, peak in DEVICE_PEAKS.items():
        if gpu_name and key.lower() in gpu_name.lower():
            return peak
    return None


# ---- work: pairs, FLOPs, bytes -------------------------------------------------------------

def attended_pairs(context_lens: Sequence[int], tree_depths: Sequence[Sequence[int]]) -> list[int]:
    """Attended (query, key) pairs per request, from the tree mask's real density.

    Args:
        context_lens: [L_b] for b in [0, B).
        tree_depths: [[depth_i for node i in tree b]]: T_b depths per request (root = 0).

    Returns:
        [T_b * L_b + sum_i (depth_i + 1)] for b in [0, B).
    """
    return [len(d) * l            # every tree node sees all L_b context tokens
            + sum(d) + len(d)     # ... and its depth_i ancestors plus itself
            for l, d in zip(context_lens, tree_depths, strict=True)]


def attention_flops(pairs: Sequence[int], num_q_heads: int, head_dim: int) -> int:
    """FLOPs of tree attention: 4 * pairs * Hq * D (FlashAttention's convention).

    Per attended pair and query head: the score q.k is D multiply-adds (2D
    FLOPs) and the weighted value p * v is D multiply-adds (2D FLOPs). Softmax
    exponentials and the rescaling are not counted (as FlashAttention's papers).
    """
    return sum(pairs) * num_q_heads * (2 * head_dim    # q . k
                                       + 2 * head_dim)  # p * v


def kv_bytes(context_lens: Sequence[int], tree_sizes: Sequence[int], num_kv_heads: int, head_dim: int,
             page_size: int, element_bytes: int) -> int:
    """Bytes of the KV pages actually read: every page holding one of the S_b tokens, whole.

    Each request reads ceil(S_b / P) pages of P tokens; each token slot holds
    Hkv * D elements for K and as many for V. Each KV head is counted once: a
    GQA kernel serves the G query heads of a group from one read of HBM.
    """
    pages = sum(math.ceil((l + t) / page_size) for l, t in zip(context_lens, tree_sizes, strict=True))
    return (pages * page_size        # token slots in the pages read
            * num_kv_heads * head_dim  # elements per slot, per K or V
            * element_bytes
            * 2)                      # K and V


def kv_values_read(context_lens: Sequence[int], tree_sizes: Sequence[int], num_q_heads: int, head_dim: int) -> int:
    """K and V values as the Hq query heads read them: 2 * sum_b S_b * Hq * D (a count, not bytes).

    Unlike `kv_bytes` (each KV head once, whole pages: what a GQA kernel moves from HBM), each
    of a group's G query heads counts the S_b tokens' K and V rows again, as a computation that
    expands K/V to Hq heads touches them (the float64 reference's repeat_interleave, SDPA's
    enable_gqa on a CPU). The CPU time of a (case, backend) pair follows it
    (`treebench.harness.run.costs.PAIR_COSTS`).

    Args:
        context_lens: [L_b] for b in [0, B).
        tree_sizes: [T_b] for b in [0, B).
    """
    return (sum(l + t for l, t in zip(context_lens, tree_sizes, strict=True))  # sum_b S_b tokens
            * num_q_heads * head_dim     # values per token, per query head
            * 2)                         # K and V


def attention_bytes(context_lens: Sequence[int], tree_sizes: Sequence[int], num_q_heads: int,
                    num_kv_heads: int, head_dim: int, page_size: int, element_bytes: int,
                    kv_element_bytes: int | None = None) -> int:
    """Bytes moved to and from HBM by one tree-attention call (a lower bound a kernel can reach).

    KV pages read (`kv_bytes`, at `kv_element_bytes` per element: 1 for an fp8 pool;
    None: `element_bytes`) + Q read + O written (sum T_b * Hq * D elements each) + the
    tree mask (T_b^2 bits per request, packed) + the block-table entries of the pages
    read (int32).
    """
    kv_element_bytes = element_bytes if kv_element_bytes is None else kv_element_bytes
    total_t = sum(tree_sizes)
    pages = sum(math.ceil((l + t) / page_size) for l, t in zip(context_lens, tree_sizes, strict=True))
    return (kv_bytes(context_lens, tree_sizes, num_kv_heads, head_dim, page_size, kv_element_bytes)
            + total_t * num_q_heads * head_dim * element_bytes      # Q, read once
            + total_t * num_q_heads * head_dim * element_bytes      # O, written once
            + sum(math.ceil(t * t / 8) for t in tree_sizes)         # tree mask, 1 bit per (node, node)
            + pages * INDEX_BYTES)                                  # block-table entries read


def rates(flops: int | None, nbytes: int | None, median_us: float | None,
          peak_bytes_per_s: float | None) -> dict:
    """tflops, tb_per_s, pct_peak_bw of work done in `median_us` (None where unknown).

    TFLOP/s = flops / seconds / 1e12; TB/s = bytes / seconds / 1e12 (decimal,
    as datasheets); % of peak = 100 * (bytes / seconds) / peak bytes/s.
    """
    if not median_us or median_us <= 0 or flops is None or nbytes is None:
        return {"tflops": None, "tb_per_s": None, "pct_peak_bw": None}
    seconds = median_us * 1e-6
    bw = nbytes / seconds                                        # bytes/s
    return {"tflops": flops / seconds / 1e12, "tb_per_s": bw / 1e12,
            "pct_peak_bw": 100.0 * bw / peak_bytes_per_s if peak_bytes_per_s else None}


def roofline_us(flops: int, nbytes: int, peak_bytes_per_s: float | None, peak: DevicePeak | None,
                matmul_tflops: float | None = None) -> float | None:
    """The roofline time of one call, microseconds: the slower of moving the bytes and doing the FLOPs.

    max(bytes / measured copy bandwidth, FLOPs / compute roof), the compute roof being the
    measured dense bf16 matrix rate `matmul_tflops` (TFLOP/s) when given, else the datasheet
    16-bit tensor peak of `peak`; a roof whose peak is unknown is left out, and without a measured
    bandwidth there is no roofline (None): a datasheet HBM figure is a promise, the measured copy
    is what this machine reaches.
    """
    if not peak_bytes_per_s:
        return None
    tflops = matmul_tflops or (peak.tflops_16bit if peak else None)
    memory_s = nbytes / peak_bytes_per_s                                 # seconds at the bandwidth roof
    compute_s = flops / (tflops * 1e12) if tflops else 0.0               # seconds at the compute roof
    return 1e6 * max(memory_s, compute_s)


def row_roofline_us(row: dict, env: dict) -> float | None:
    """`roofline_us` of a result row on the peaks of its env fingerprint `env` (`peak_bw_bytes_per_s`,
    `peak_matmul_tflops`, else the datasheet peak of `gpu_name`); None without a measured bandwidth.

    Raises:
        ConfigError: the row stores no flops/bytes and its case cannot be rebuilt (`row_work`).
    """
    if not env.get("peak_bw_bytes_per_s"):
        return None
    return roofline_us(*row_work(row), env["peak_bw_bytes_per_s"], device_peak(env.get("gpu_name")),
                       env.get("peak_matmul_tflops"))


def compute_roof(env: dict) -> tuple[float | None, str]:
    """The compute roof `roofline_us` uses for an env fingerprint: (TFLOP/s, "measured") from its
    `peak_matmul_tflops`, else (TFLOP/s, "datasheet") from `DEVICE_PEAKS` by its GPU name, else (None, "")."""
    if env.get("peak_matmul_tflops"):
        return float(env["peak_matmul_tflops"]), "measured"
    peak = device_peak(env.get("gpu_name"))
    return (peak.tflops_16bit, "datasheet") if peak else (None, "")


def case_metrics(inputs: BatchInputs, median_us: float | None, peak_bytes_per_s: float | None = None) -> dict:
    """flops, bytes, tflops, tb_per_s, pct_peak_bw for one timed case.

    Args:
        inputs: the batch (L_b from `context_lens`, trees, shapes from `case`).
        median_us: median time per call, microseconds (None: not timed).
        peak_bytes_per_s: measured HBM peak from the env fingerprint (None: unknown).
    """
    ls, ts, _ = inputs.host_lists()
    c = inputs.case
    flops = attention_flops(attended_pairs(ls, [t.depths for t in inputs.trees]), c.num_q_heads, c.head_dim)
    nbytes = attention_bytes(ls, ts, c.num_q_heads, c.num_kv_heads, c.head_dim, c.page_size,
                             ELEMENT_BYTES[c.dtype], ELEMENT_BYTES[c.kv_dtype_name])
    return {"flops": flops, "bytes": nbytes, **rates(flops, nbytes, median_us, peak_bytes_per_s)}


def row_work(row: dict) -> tuple[int, int]:
    """(flops, bytes) of a result row: stored values, else recomputed from its case axes.

    Raises:
        ConfigError: the row's case cannot be rebuilt (bad axes).
    """
    if row.get("flops") is not None and row.get("bytes") is not None:
        return int(row["flops"]), int(row["bytes"])
    from treebench.harness.model.cases import Case  # local: rebuilding trees is the rare path

    names = {f.name for f in fields(Case)}
    case = Case(**{k: v for k, v in row["case"].items() if k in names})
    ls, trees = row.get("context_lens") or case.context_lens(), case.trees()
    ts = [t.size for t in trees]
    flops = attention_flops(attended_pairs(ls, [t.depths for t in trees]), case.num_q_heads, case.head_dim)
    return flops, attention_bytes(ls, ts, case.num_q_heads, case.num_kv_heads, case.head_dim,
                                  case.page_size, ELEMENT_BYTES[case.dtype], ELEMENT_BYTES[case.kv_dtype_name])
