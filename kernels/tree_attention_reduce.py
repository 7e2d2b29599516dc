"""Split-KV merge for the tree-attention kernel.

Each of num_splits programs of one (request, KV head, M-tile) wrote a partial
output O_s (normalised by its own softmax sum) and its LSE_s (natural log).
The exact result is the LSE-weighted mean (FlashDecoding, Dao et al. 2023;
FlashInfer's ``merge_states``):

    LSE = log(sum_s exp(LSE_s)),  O = sum_s exp(LSE_s - LSE) * O_s.

A split that saw no allowed column of a row has LSE_s = -inf and weight 0.

Two forms: `tree_attn_merge_kernel`, a second launch with one program per
(token, query head) row (the default), and `merge_partials`, called by the forward kernel's
last split program of a tile (one launch; fused_merge=True).
"""

from __future__ import annotations

import triton
import triton.language as tl

try:   # programmatic dependent launch (sm_90+): Triton 3.3 and later
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
    HAS_PDL = True
except ImportError:   # pragma: no cover - older Triton
    gdc_launch_dependents = gdc_wait = None
    HAS_PDL = False


@triton.jit(do_not_specialize=["stride_ps", "num_splits"])
def tree_attn_merge_kernel(
    O_PART, LSE_PART, O, LSE,
    stride_ps, num_splits,                      # one split's plane (sum T * Hq); KV splits
    BLOCK_S: tl.constexpr, ROWS: tl.constexpr, D: tl.constexpr, WRITE_LSE: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """Grid: (cdiv(sum T * Hq, ROWS),). Program p merges rows [p * ROWS, (p + 1) * ROWS)
    of (sum T, Hq) over their splits.

    PDL: launched as a programmatic dependent launch (launch_pdl): the programs may
    start while the forward kernel still runs and wait (griddepcontrol.wait) for its
    completion and memory before the first load, so the launch latency overlaps the
    forward kernel's tail.

    Every split's LSE and partial O of those rows are loaded at once, as a
    (BLOCK_S, ROWS) and a (BLOCK_S, ROWS, D) tile (BLOCK_S = next power of 2 >=
    num_splits), so the merge costs two dependent memory latencies whatever the
    split count (a loop over splits costs two per split). ROWS = 1 is the
    measured default; more rows per program means fewer, larger programs (for
    many rows and few splits, docs/kernel.md).

    O_PART: (num_splits, sum T, Hq, D) fp32; LSE_PART: (num_splits, sum T, Hq) fp32;
    O: (sum T, Hq, D) contiguous, the input dtype; LSE: (sum T, Hq) fp32.
    """
    if PDL:
        gdc_wait()                                                     # the partials are complete
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)   # (ROWS,)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, D)
    r_ok = rows < stride_ps
    ok = (offs_s < num_splits)[:, None] & r_ok[None, :]                # (BLOCK_S, ROWS)
    plane = offs_s.to(tl.int64)[:, None] * stride_ps + rows[None, :]  # into one split's plane
    lse_s = tl.load(LSE_PART + plane, mask=ok, other=float("-inf"))
    o_s = tl.load(O_PART + plane[:, :, None] * D + offs_d[None, None, :], mask=ok[:, :, None], other=0.0)
    m = tl.max(lse_s, 0)                                               # (ROWS,)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    w = tl.exp(lse_s - m_safe[None, :])                                # 0 for a split that saw nothing
    den = tl.sum(w, 0)
    den_safe = tl.where(den > 0.0, den, 1.0)
    out = tl.sum(w[:, :, None] * o_s, 0) / den_safe[:, None]           # (ROWS, D)
    tl.store(O + rows[:, None] * D + offs_d[None, :], out.to(O.dtype.element_ty), mask=r_ok[:, None])
    if WRITE_LSE:
        tl.store(LSE + rows, m_safe + tl.log(den_safe), mask=r_ok)


@triton.jit
def merge_partials(O_PART, LSE_PART, O, LSE, o_off, lse_off, row_ok, stride_ps, num_splits,
                   BLOCK_M: tl.constexpr, D: tl.constexpr, WRITE_LSE: tl.constexpr):
    """Merges the num_splits partials of one M-tile's rows into O (and LSE).

    o_off (BLOCK_M, D) / lse_off (BLOCK_M,): the rows' offsets into one split's
    plane (stride_ps rows of D apart). Partials written by other programs of the
    same launch are read through L2 (.cg), after the caller's acquire.
    """
    m = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    for s in range(num_splits):                               # 1) the largest LSE per row
        plane = tl.cast(s, tl.int64) * stride_ps
        m = tl.maximum(m, tl.load(LSE_PART + plane + lse_off, mask=row_ok, other=float("-inf"),
                                  cache_modifier=".cg"))
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    den = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, D), tl.float32)
    for s in range(num_splits):                               # 2) weighted sum of the partials
        plane = tl.cast(s, tl.int64) * stride_ps
        w = tl.exp(tl.load(LSE_PART + plane + lse_off, mask=row_ok, other=float("-inf"),
                           cache_modifier=".cg") - m_safe)
        o_s = tl.load(O_PART + plane * D + o_off, mask=row_ok[:, None], other=0.0, cache_modifier=".cg")
        den += w
        acc += w[:, None] * o_s
    out = acc / tl.where(den > 0.0, den, 1.0)[:, None]
    tl.store(O + o_off, out.to(O.dtype.element_ty), mask=row_ok[:, None])
    if WRITE_LSE:
        tl.store(LSE + lse_off, m_safe + tl.log(tl.where(den > 0.0, den, 1.0)), mask=row_ok)
