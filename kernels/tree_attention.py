"""Triton tree attention over a paged KV cache: the forward kernel.

One program owns one (request b, KV head, KV split, M-tile) work item. Its rows
pack the G query heads of the KV head with the request's tree nodes, node-major
(row r = node * G + g, so a row's query is the contiguous D-vector
q[qo_b + node, kv_head * G + g]); every K/V tile is therefore read once per
(request, KV head, split) for all G * T_b rows (GQA packing, as FlashInfer's
and vLLM's decode kernels do).

The program walks its split's share of the request's KV tiles of BLOCK_N
tokens in two loops:

1. context tiles (wholly inside [0, L_b)): no mask at all;
2. the tiles that overlap [L_b, S_b): context columns pass, tree column
   L_b + j passes for row node i iff j is i or an ancestor of i, columns past
   S_b are masked (and their K/V loads too: every unused pool slot is NaN).

The tree test has three modes (MASK_MODE):

- ``MASK_BITS`` (0): per-request bitmask, ``mask_words[qo_b + i, j // 64]``
  bit ``j % 64`` (int64 words, W = ceil(max T_b / 64) per node);
- ``MASK_BIAS`` (1): one additive (T, T) fp32 bias shared by the batch
  (0 or -inf), vLLM's Triton ``qq_bias`` convention;
- ``MASK_CAUSAL`` (2): plain causal j <= i, the baseline with no tree mask.

Softmax is online (FlashAttention-2, Dao 2023, Algorithm 1) in fp32 with exp2
and sm_scale * log2(e) folded into one FFMA per score. With one split the
program writes the output (and LSE) itself; with several it writes a partial
(O, LSE) in fp32, merged by ``tree_attention_reduce.tree_attn_merge_kernel``
(a second launch) or, with FUSED_MERGE, by the tile's last split program.

Pages: when P % BLOCK_N == 0 a tile lies inside one page (one block-table
load, contiguous rows); otherwise each token looks up its own page. With
KV_DESC the context tiles of such pages are loaded by TMA (one descriptor box
of BLOCK_N tokens x D per tile, the pools viewed as (N * P, HKV * D)). With
BT_AHEAD the block-table entries of each context tile are loaded one tile
before its K/V, so the TMA issue (run 5: 240 -> 198 us for the 27-node tree
at B 64) or the pointer loads' addresses (P 16: 3-14% faster, run 6) do not
wait on them (docs/kernel.md). The masked tail tiles keep pointer loads:
their columns past S_b must read as zeros, not as the pool's NaN slots.
With split-KV the merge kernel is a programmatic dependent launch (PDL) where
the device allows it.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from harness.errors import ConfigError
from harness.paged import BatchInputs
from kernels.launch import FixedLaunch, verify_fast_path
from kernels.tree_attention_plan import (MASK_MODES, SMEM_PER_SM, KernelConfig, check_inputs, choose_config,
                                         is_integer, make_plan, next_pow2, pack_tree_masks, tree_bias, ws_fills)
from kernels.tree_attention_reduce import HAS_PDL, gdc_launch_dependents, merge_partials, tree_attn_merge_kernel

MASK_BITS, MASK_BIAS, MASK_CAUSAL = 0, 1, 2
LOG2E = 1.4426950408889634  # log2(e): exp(x) == exp2(x * LOG2E)


@triton.jit
def _dot(a, b, acc, DOT_FP32: tl.constexpr):
    """a @ b with an fp32 accumulator, plus `acc` when given (None: zeros); the MMA
    accumulates into acc in place, so the P V MMA of one tile may still run while the
    next tile's Q K^T is issued. DOT_FP32 upcasts the operands first: exact for
    bf16/fp16 values, and needed by the CPU interpreter, whose bfloat16 dot is wrong
    (Triton 3.9)."""
    if DOT_FP32:
        c = tl.dot(a.to(tl.float32), b.to(tl.float32), acc)
    else:
        c = tl.dot(a, b, acc)
    return c


@triton.jit
def _kv_tile_offsets(BT, b, start, S, stride_bt, stride_kn, stride_kp,
                     P: tl.constexpr, BLOCK_N: tl.constexpr, PAGE_TILE: tl.constexpr):
    """Element offsets (BLOCK_N,) int64 of tokens [start, start + BLOCK_N) of
    request b into the pool, through block_table: [b, logical_page] -> physical_page.
    Tokens at or past S get an in-bounds offset (their tile's page, or token S - 1's
    page in the gather path) and the caller masks their loads."""
    if PAGE_TILE:  # the tile lies inside one page: one block-table load
        phys = tl.load(BT + b * stride_bt + start // P).to(tl.int64)
        offs = phys * stride_kn + ((start % P) + tl.arange(0, BLOCK_N)) * stride_kp
    else:
        offs_n = tl.minimum(start + tl.arange(0, BLOCK_N), S - 1)   # past S: S - 1's page (loads masked)
        phys = tl.load(BT + b * stride_bt + offs_n // P).to(tl.int64)
        offs = phys * stride_kn + (offs_n % P) * stride_kp
    return offs


@triton.jit
def _tree_allowed(MASK, BIAS, row_tok, node, row_ok, offs_n, L, T, stride_mw, stride_bias,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, MASK_MODE: tl.constexpr):
    """(allowed (BLOCK_M, BLOCK_N) bool, additive bias in log2 units or 0.0) for
    columns offs_n of a tile overlapping [L, L + T); row_tok = qo_b + node."""
    j = offs_n - L                                          # (BLOCK_N,) tree index of the column
    in_tree = (j >= 0) & (j < T)
    jj = tl.maximum(j, 0)
    ctx = (offs_n < L)[None, :]
    both = row_ok[:, None] & in_tree[None, :]
    if MASK_MODE == 0:
        # The tile's tree columns span at most WORDS consecutive mask words; load each
        # as a (BLOCK_M,) row vector (no 2D gather, so no layout shuffle through shared memory).
        WORDS: tl.constexpr = BLOCK_N // 64 + 1 if BLOCK_N >= 64 else 2
        w0 = tl.min(jj, 0) // 64                             # first word the tile touches
        shift = (jj % 64).to(tl.int64)[None, :]
        bits = tl.zeros((BLOCK_M, BLOCK_N), tl.int64)
        for w in tl.static_range(WORDS):
            widx = tl.minimum(w0 + w, stride_mw - 1)          # clamp past the row's last word (stride_mw = W)
            word = tl.load(MASK + row_tok * stride_mw + widx, mask=row_ok, other=0)   # (BLOCK_M,) int64
            hit = ((jj // 64) == w0 + w)[None, :]
            bits = tl.where(hit, (word[:, None] >> shift) & 1, bits)
        allowed = ctx | (both & (bits != 0))
        bias = 0.0
    elif MASK_MODE == 1:
        bptr = BIAS + node[:, None] * stride_bias + jj[None, :]
        allowed = ctx | both
        bias = tl.load(bptr, mask=both, other=0.0) * 1.4426950408889634   # (BLOCK_M, BLOCK_N) fp32, log2 units
    else:
        allowed = ctx | (both & (jj[None, :] <= node[:, None]))
        bias = 0.0
    return allowed, bias


# Integer arguments that vary from batch to batch are not specialised (Triton
# would otherwise compile a new kernel when one of them is 1 or a multiple of 16).
@triton.jit(do_not_specialize=["stride_bt", "stride_mw", "stride_bias", "stride_ps", "m_tiles", "num_splits",
                               "tiles_per_split", "bt_width"])
def tree_attn_fwd_kernel(
    Q, K, V, BT, CTX_LENS, QO, MASK, BIAS, O, LSE, O_PART, LSE_PART, SEM,
    K_DESC, V_DESC,                             # TMA descriptors of the pools as (N * P, HKV * D), or None
    qk_scale,                                   # sm_scale * log2(e), fp32
    stride_qt, stride_qh,                       # q (sum T, Hq, D); its last dim is contiguous
    stride_kn, stride_kp, stride_kh,            # k/v cache (N, P, Hkv, D)
    stride_bt, stride_mw, stride_bias,          # block_table row, mask-words row, bias row
    stride_ps,                                  # partial workspace: one split's plane, sum T * Hq
    m_tiles, num_splits,                        # M-tiles and KV splits per (request, KV head)
    tiles_per_split, bt_width,                  # KV tiles per split (from the longest S_b); block_table columns
    HKV: tl.constexpr, G: tl.constexpr, D: tl.constexpr, P: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT: tl.constexpr, FUSED_MERGE: tl.constexpr,
    MASK_MODE: tl.constexpr, WRITE_LSE: tl.constexpr, DOT_FP32: tl.constexpr,
    KV_DESC: tl.constexpr = False, BT_AHEAD: tl.constexpr = False, PDL: tl.constexpr = False,
):
    """Grid: (B * HKV * num_splits * m_tiles,), M-tile fastest so the M-tiles that
    share a KV stream run together (their re-reads hit L2). SPLIT: num_splits > 1.
    FUSED_MERGE: the last split program of each (request, KV head, M-tile) merges the
    partials (counted in SEM, (B * HKV * m_tiles,) int32, zero between launches);
    otherwise tree_attn_merge_kernel does, in a second launch (with PDL, launched as a
    programmatic dependent launch once every program has passed its main loops). KV_DESC: context
    tiles through K_DESC / V_DESC (needs P % BLOCK_N == 0); BT_AHEAD: each context
    tile's block-table entries loaded one tile ahead (the TMA page, or on the
    pointer-load paths the tile's K/V offsets, loop-carried).

    Split s covers the request's tiles [s * tiles_per_split, (s + 1) * tiles_per_split):
    its first tile does not depend on a load, so (with BT_AHEAD and KV_DESC) its
    block-table entry is loaded in the same round trip as the request's context
    length, not after it.
    Splits past a short request's last tile see nothing (LSE -inf, weight 0 in the merge)."""
    pid = tl.program_id(0)
    mt = pid % m_tiles
    split = (pid // m_tiles) % num_splits
    kh = (pid // (m_tiles * num_splits)) % HKV
    b = pid // (m_tiles * num_splits * HKV)
    t_lo = split * tiles_per_split
    bt_row = BT + b * stride_bt
    if KV_DESC and BT_AHEAD:                    # the first tile's page (loop-carried), clamped into the row
        page_next = tl.load(bt_row + tl.minimum((t_lo * BLOCK_N) // P, bt_width - 1))
    L = tl.load(CTX_LENS + b)
    qo = tl.load(QO + b)
    T = tl.load(QO + b + 1) - qo
    if mt * BLOCK_M >= T * G:                   # a request with fewer rows than the largest
        return
    S = L + T
    n_tiles = tl.cdiv(S, BLOCK_N)
    t_hi = tl.minimum(t_lo + tiles_per_split, n_tiles)
    t_ctx = tl.minimum(L // BLOCK_N, t_hi)      # tiles before t_ctx need no mask

    rows = mt * BLOCK_M + tl.arange(0, BLOCK_M)  # (BLOCK_M,) packed row = node * G + g
    node = rows // G
    row_ok = rows < T * G
    row_tok = qo + node                          # token index into q / out
    head = kh * G + rows % G
    offs_d = tl.arange(0, D)
    q_off = row_tok.to(tl.int64)[:, None] * stride_qt + head[:, None] * stride_qh + offs_d[None, :]
    q = tl.load(Q + q_off, mask=row_ok[:, None], other=0.0)   # (BLOCK_M, D)
    dtype = q.dtype

    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, D), tl.float32)
    K_h = K + kh * stride_kh
    V_h = V + kh * stride_kh
    PAGE_TILE: tl.constexpr = P % BLOCK_N == 0

    # With BT_AHEAD, the page(s) of the next context tile are loaded one tile ahead of its
    # K/V loads (clamped into the split's context tiles, so they never leave the request's
    # row): the TMA issue, or the gathered loads' addresses, do not wait on them.
    last = tl.maximum(t_ctx - 1, 0)
    if BT_AHEAD and not KV_DESC:                # pointer paths: the next tile's K/V offsets (loop-carried)
        kv_next = _kv_tile_offsets(BT, b, tl.minimum(t_lo, last) * BLOCK_N, S, stride_bt, stride_kn, stride_kp,
                                   P, BLOCK_N, PAGE_TILE)
    for t in range(t_lo, t_ctx):                # 1) context tiles: no mask
        if KV_DESC:                              # one TMA box per tile (P % BLOCK_N == 0)
            start = t * BLOCK_N
            if BT_AHEAD:
                page = page_next
                page_next = tl.load(bt_row + (tl.minimum(t + 1, last) * BLOCK_N) // P)
            else:
                page = tl.load(bt_row + start // P)
            row0 = page * P + start % P
            k = K_DESC.load([row0, kh * D])                     # (BLOCK_N, D)
            v = V_DESC.load([row0, kh * D])
        else:
            if BT_AHEAD:
                kv = kv_next
                kv_next = _kv_tile_offsets(BT, b, tl.minimum(t + 1, last) * BLOCK_N, S, stride_bt, stride_kn,
                                           stride_kp, P, BLOCK_N, PAGE_TILE)
            else:
                kv = _kv_tile_offsets(BT, b, t * BLOCK_N, S, stride_bt, stride_kn, stride_kp, P, BLOCK_N, PAGE_TILE)
            k = tl.load(K_h + kv[:, None] + offs_d[None, :])      # (BLOCK_N, D)
            v = tl.load(V_h + kv[:, None] + offs_d[None, :])
        s = _dot(q, tl.trans(k), None, DOT_FP32)              # (BLOCK_M, BLOCK_N) raw scores
        m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)      # log2 units
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s * qk_scale - m_new[:, None])            # one FFMA per score
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = _dot(p.to(dtype), v, acc * alpha[:, None], DOT_FP32)   # the MMA accumulates in place
        m_i = m_new

    for t in range(tl.maximum(t_lo, t_ctx), t_hi):  # 2) tiles overlapping [L, S): masked
        offs_n = t * BLOCK_N + tl.arange(0, BLOCK_N)
        valid = offs_n < S
        kv = _kv_tile_offsets(BT, b, t * BLOCK_N, S, stride_bt, stride_kn, stride_kp, P, BLOCK_N, PAGE_TILE)
        k = tl.load(K_h + kv[:, None] + offs_d[None, :], mask=valid[:, None], other=0.0)
        v = tl.load(V_h + kv[:, None] + offs_d[None, :], mask=valid[:, None], other=0.0)
        allowed, bias = _tree_allowed(MASK, BIAS, row_tok, node, row_ok, offs_n, L, T, stride_mw, stride_bias,
                                      BLOCK_M, BLOCK_N, MASK_MODE)
        s = _dot(q, tl.trans(k), None, DOT_FP32) * qk_scale + bias
        s = tl.where(allowed, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row that saw nothing yet
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = _dot(p.to(dtype), v, acc * alpha[:, None], DOT_FP32)
        m_i = m_new

    if PDL:                                     # the merge kernel may launch now (it waits for this grid)
        gdc_launch_dependents()
    seen = l_i > 0.0                            # False only for a split that saw nothing of a row
    out = acc / tl.where(seen, l_i, 1.0)[:, None]
    lse = tl.where(seen, (m_i + tl.log2(tl.where(seen, l_i, 1.0))) * 0.6931471805599453, float("-inf"))
    lse_off = row_tok.to(tl.int64) * (HKV * G) + head          # (BLOCK_M,) into (sum T, Hq)
    o_off = lse_off[:, None] * D + offs_d[None, :]              # out is contiguous (sum T, Hq, D)
    if not SPLIT:
        tl.store(O + o_off, out.to(O.dtype.element_ty), mask=row_ok[:, None])
        if WRITE_LSE:
            tl.store(LSE + lse_off, lse, mask=row_ok)
    else:
        plane = split.to(tl.int64) * stride_ps
        tl.store(O_PART + plane * D + o_off, out, mask=row_ok[:, None])
        tl.store(LSE_PART + plane + lse_off, lse, mask=row_ok)
        if FUSED_MERGE:                         # the last split of this (b, kv head, M-tile) to finish merges
            tl.debug_barrier()                  # every thread's partial is stored before the release below
            counter = SEM + (b * HKV + kh) * m_tiles + mt
            arrived = tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu")
            if arrived == num_splits - 1:
                merge_partials(O_PART, LSE_PART, O, LSE, o_off, lse_off, row_ok, stride_ps, num_splits,
                               BLOCK_M, D, WRITE_LSE)
                tl.atomic_xchg(counter, 0, sem="relaxed", scope="gpu")   # ready for the next launch


# ---- host side: prepare once, then launch -------------------------------------------

USE_KV_DESC = True   # kv_desc=None: TMA descriptor loads wherever kv_desc_unsupported allows
WS_PIPE = True       # the warp-specialised kernel's intra-warpgroup pipelining (PIPE)
WS_PERSIST = True    # the warp-specialised kernel as one wave of persistent programs
USE_PDL = True       # pdl=None: the merge kernel as a programmatic dependent launch wherever pdl_unsupported allows


def pdl_unsupported(device: torch.device) -> str:
    """Why the split-KV merge kernel cannot be a programmatic dependent launch on `device`.

    Args:
        device: the batch's device (`BatchInputs.device`).

    Returns:
        "" when it can (a CUDA device of sm_90 or newer, a Triton with griddepcontrol,
        not the CPU interpreter); else the first reason against, one line. Raises nothing.
    """
    if interpreting() or device.type != "cuda":
        return "programmatic dependent launch needs a CUDA GPU (not the Triton interpreter)"
    if torch.cuda.get_device_capability(device)[0] < 9:
        return "programmatic dependent launch needs sm_90 or newer"
    if not HAS_PDL:
        return f"Triton {triton.__version__} has no griddepcontrol (gdc_wait)"
    return ""


def kv_desc_unsupported(inputs: BatchInputs, block_n: int) -> str:
    """Why the context tiles cannot be loaded through TMA descriptors, or "" when they can.

    Args:
        inputs: the batch; its k_cache / v_cache are the (N, P, Hkv, D) bf16/fp16 pools.
        block_n: BLOCK_N, KV tokens per tile.

    Returns:
        "" when a tile lies in one page (P % BLOCK_N == 0), the pools are contiguous
        NHD with 16-byte aligned bases and fewer than 2**31 token slots (int32 TMA
        coordinates), and the device has TMA (sm_90+, or Triton's CPU interpreter,
        which emulates it); else the first reason against, one line. Raises nothing.
    """
    kc, vc = inputs.k_cache, inputs.v_cache
    n, p, hkv, d = kc.shape
    if p % block_n:
        return f"page size {p} is not a multiple of BLOCK_N {block_n}"
    if not (kc.is_contiguous() and vc.is_contiguous()):
        return "the K/V pools are not contiguous (N, P, Hkv, D)"
    if kc.data_ptr() % 16 or vc.data_ptr() % 16:
        return "the K/V pools are not 16-byte aligned"
    if n * p >= 2**31:
        return f"the pool has {n * p} token slots; TMA coordinates are int32"
    if kc.device.type == "cuda" and torch.cuda.get_device_capability(kc.device)[0] < 9:
        return "TMA needs sm_90 or newer"
    if kc.device.type != "cuda" and not interpreting():
        return "TMA needs a CUDA device or the Triton interpreter"
    return ""


def ws_unsupported(inputs: BatchInputs) -> str:
    """Why the warp-specialised Gluon kernel (`tree_attention_ws`) cannot run this batch, or "".

    Args:
        inputs: the batch.

    Returns:
        "" on an sm_90 GPU (wgmma is Hopper's; sm_100 has none) with a Triton whose
        Gluon has the Hopper API, D 64 or 128, and pools TMA can read in 64-token
        tiles (`kv_desc_unsupported` with BLOCK_N 64); else the first reason
        against, one line. Raises nothing.
    """
    if interpreting() or inputs.device.type != "cuda":
        return "the warp-specialised kernel needs a CUDA GPU (Gluon does not run in the Triton interpreter)"
    if torch.cuda.get_device_capability(inputs.device) != (9, 0):
        return "the warp-specialised kernel needs sm_90 (wgmma)"
    d = inputs.q.shape[-1]
    if d not in (64, 128):
        return f"head dim {d}: the warp-specialised kernel takes D 64 or 128 (shared memory)"
    why = kv_desc_unsupported(inputs, 64)
    if why:
        return why
    try:
        import kernels.tree_attention_ws  # noqa: F401
    except ImportError as e:
        return f"Triton {triton.__version__} has no Gluon Hopper API ({e})"
    return ""


def interpreting() -> bool:
    """True under TRITON_INTERPRET=1 (Triton's CPU interpreter)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


class TreeAttention:
    """Tree attention for one prepared batch; call it to launch.

    Attributes:
        plan: the tile config, split-KV and grid chosen for the batch.
        out: (sum T_b, Hq, D) in the input dtype, written by every call.
        lse: (sum T_b, Hq) fp32 natural-log LSE when prepared with return_lse, else None.
        kv_desc: the context tiles are loaded through TMA descriptors.
        pdl: the split-KV merge kernel is a programmatic dependent launch.
        ws: the forward kernel is the warp-specialised Gluon one (`tree_attention_ws`).
    """

    def __init__(self, inputs: BatchInputs, mask_mode: str = "tree", *, return_lse: bool = False,
                 config: KernelConfig | None = None, num_splits: int | None = None,
                 fast_launch: bool = True, fused_merge: bool = False, merge_rows: int = 1,
                 kv_desc: bool | None = None, pdl: bool | None = None, ws: bool | None = None):
        """Does all host work: checks, plan, mask packing, buffers, a warm-up launch.

        Args:
            inputs: the batch (adapter contract); its tensors stay referenced.
            mask_mode: "tree" (per-request bitmask), "bias" (one shared (T, T)
                fp32 qq_bias) or "causal" (j <= i, no tree mask).
            return_lse: also write `lse`.
            config: a KernelConfig instead of the tuned table's.
            num_splits: KV splits instead of the heuristic's (1 = split-KV off).
            fast_launch: replay through the compiled launcher after the warm-up.
            fused_merge: with split-KV, merge in the forward kernel's last split
                program (one launch) instead of a second merge kernel; off by
                default: its serial merge measured slower on the H200 (docs/kernel.md).
            merge_rows: (sum T, Hq) rows per program of the split-KV merge kernel, a
                power of 2 from 1 to 16 (1, the measured default; G groups a KV head's rows).
            kv_desc: load the context tiles' K/V through TMA tensor descriptors
                (`triton.tools.tensor_descriptor.TensorDescriptor` over the pools viewed as
                (N * P, Hkv * D)). None (default): wherever `kv_desc_unsupported` finds no
                reason against it. True where it finds one raises ConfigError.
            pdl: with split-KV and the merge in a second kernel, launch that kernel as a
                programmatic dependent launch (Triton's launch_pdl; it waits on
                griddepcontrol for the forward grid): its launch overlaps the forward
                kernel's last programs. None (default): wherever `pdl_unsupported` finds
                no reason against it. True where it finds one raises ConfigError.
            ws: the warp-specialised Gluon kernel (`tree_attention_ws`). None (default):
                where the tuned table's config is a warp-specialised one (`KernelConfig.ws`
                > 0), `ws_unsupported` finds no reason against it and the batch is large
                enough (`ws_fills`); else the table's tl-kernel config. True: the table's
                warp-specialised config whatever the batch size. False: always the tl
                kernel. A `config` with ws > 0 is run as given. The warp-specialised
                kernel loads every tile by TMA and merges splits in a second kernel, so
                kv_desc=False or fused_merge=True select the tl kernel. ws=True, or a
                warp-specialised `config`, where it cannot run raises ConfigError.

        Raises:
            ConfigError: unsupported dtype, head dim, mask mode, mixed trees in bias mode,
                merge_rows not a power of 2 in [1, 16], num_splits not an integer in [1, 64], kv_desc=True where
                `kv_desc_unsupported` gives a reason, pdl=True where `pdl_unsupported` does,
                ws not None / True / False, ws=True where the table has no warp-specialised
                config for the rows and D, or ws=True / a warp-specialised `config` that
                cannot run here (see ws).
        """
        check_inputs(inputs.dtype, inputs.q.shape[-1], mask_mode)
        self.inputs, self.mask_mode, self.return_lse = inputs, mask_mode, return_lse
        self.fused_merge = fused_merge
        if not is_integer(merge_rows) or not 1 <= merge_rows <= 16 or merge_rows & (merge_rows - 1):
            raise ConfigError(f"merge_rows={merge_rows!r}: must be an integer power of 2 from 1 to 16")
        self.merge_rows = int(merge_rows)
        ls, ts, ss = inputs.host_lists()
        dev = inputs.device
        hq, d = inputs.q.shape[1], inputs.q.shape[2]
        hkv = inputs.k_cache.shape[2]
        sms = torch.cuda.get_device_properties(dev).multi_processor_count if dev.type == "cuda" else 1
        if ws not in (None, True, False):
            raise ConfigError(f"ws={ws!r}: must be None (the plan decides), True or False")
        rows = hq // hkv * max(ts)
        cfg = config or choose_config(rows, d, interpreting(), ws=ws is not False)
        if ws is True or cfg.ws:
            why_ws = ("ws=False" if ws is False else "kv_desc=False (it loads every tile by TMA)"
                      if kv_desc is False else "fused_merge (it merges in a second kernel)" if fused_merge
                      else ws_unsupported(inputs))
            if why_ws and (config is not None or ws is True):
                raise ConfigError(f"config ws={cfg.ws}: {why_ws}" if config is not None else f"ws=True: {why_ws}")
            if ws is True and not cfg.ws:
                raise ConfigError(f"ws=True: no warp-specialised config for {rows} packed rows at D {d} (the "
                                  "table has them above 64 rows at D 128; pass config=KernelConfig(..., ws=N))")
            if not why_ws and config is None and ws is None and not ws_fills(cfg, len(ts), hkv, rows, sms):
                why_ws = "the tl kernel's programs fit one wave"
            if why_ws:
                cfg = choose_config(rows, d, interpreting(), ws=False)
        self.ws = bool(cfg.ws)
        why_not = kv_desc_unsupported(inputs, cfg.block_n)
        if kv_desc and why_not:
            raise ConfigError(f"kv_desc: {why_not}")
        self.kv_desc = (kv_desc if kv_desc is not None else USE_KV_DESC) and not why_not
        why_not_pdl = pdl_unsupported(inputs.device)
        if pdl and why_not_pdl:
            raise ConfigError(f"pdl: {why_not_pdl}")
        pdl_on = (pdl if pdl is not None else USE_PDL) and not why_not_pdl
        self.plan = make_plan(len(ts), hkv, hq // hkv, ts, ss, d, num_sms=sms, interpret=interpreting(),
                              config=cfg, num_splits=num_splits, tma_tiles=self.kv_desc)
        self.out = torch.empty(inputs.q.shape, dtype=inputs.dtype, device=dev)
        self.lse = torch.empty(inputs.q.shape[:2], dtype=torch.float32, device=dev) if return_lse else None
        self.pdl = pdl_on and self.plan.num_splits > 1 and not fused_merge   # a merge kernel to launch early
        self._launches = self._build_ws_launches(ts) if self.ws else self._build_launches(ls, ts)
        self()                                   # warm-up: compiles
        self.fast_launch = fast_launch and not interpreting() and verify_fast_path(self._launches, self)

    def __call__(self) -> torch.Tensor:
        """Launches the kernel(s); returns `out`. No allocation, no host sync."""
        for launch in self._launches:
            launch()
        return self.out

    def _mask_args(self, ts: list[int]):
        """(mask words, bias, stride_mw, stride_bias) for the mask mode; unused ones are dummies."""
        dev, dummy = self.inputs.device, self.inputs.context_lens
        if self.mask_mode == "tree":
            words = pack_tree_masks(self.inputs.trees).to(dev)       # (sum T, W) int64
            return words, dummy, words.stride(0), 0
        if self.mask_mode == "bias":
            bias = tree_bias(self.inputs.trees).to(dev)              # (T, T) fp32
            return dummy, bias, 0, bias.stride(0)
        return dummy, dummy, 0, 0

    def _build_launches(self, ls: list[int], ts: list[int]) -> list[FixedLaunch]:
        inp, plan, cfg = self.inputs, self.plan, self.plan.config
        q, kc, vc = inp.q, inp.k_cache, inp.v_cache
        if q.stride(-1) != 1 or kc.stride() != vc.stride() or kc.stride(-1) != 1:
            q, kc, vc = q.contiguous(), kc.contiguous(), vc.contiguous()
        hkv, d = kc.shape[2], q.shape[2]
        g = q.shape[1] // hkv
        words, bias, stride_mw, stride_bias = self._mask_args(ts)
        split = plan.num_splits > 1
        rows = q.shape[0] * q.shape[1]                                  # sum T * Hq
        o_part = torch.empty((plan.num_splits, *q.shape), dtype=torch.float32, device=q.device) if split else self.out
        lse_part = torch.empty((plan.num_splits, *q.shape[:2]), dtype=torch.float32, device=q.device) \
            if split else (self.lse if self.lse is not None else inp.context_lens)
        lse = self.lse if self.lse is not None else lse_part
        fused = split and self.fused_merge
        sem = torch.zeros(len(ts) * hkv * plan.m_tiles, dtype=torch.int32, device=q.device) if fused \
            else inp.context_lens
        k_desc = v_desc = None
        if self.kv_desc:
            rows_kv = kc.shape[0] * kc.shape[1]
            k_desc, v_desc = (TensorDescriptor(t, [rows_kv, hkv * d], [hkv * d, 1], [cfg.block_n, d])
                              for t in (kc, vc))
        fwd = FixedLaunch(tree_attn_fwd_kernel, (plan.num_programs,), [
            q, kc, vc, inp.block_table, inp.context_lens, inp.qo_indptr, words, bias,
            self.out, lse, o_part, lse_part, sem, k_desc, v_desc, inp.sm_scale * LOG2E,
            q.stride(0), q.stride(1), kc.stride(0), kc.stride(1), kc.stride(2),
            inp.block_table.stride(0), stride_mw, stride_bias, rows, plan.m_tiles, plan.num_splits,
            plan.tiles_per_split, inp.block_table.shape[1]],
            dict(HKV=hkv, G=g, D=d, P=kc.shape[1], BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, SPLIT=split,
                 FUSED_MERGE=fused, MASK_MODE=MASK_MODES.index(self.mask_mode), WRITE_LSE=self.lse is not None,
                 DOT_FP32=interpreting(), KV_DESC=self.kv_desc,
                 BT_AHEAD=bool(cfg.bt_ahead), PDL=self.pdl),
            dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages,
                 **({"maxnreg": cfg.max_regs} if cfg.max_regs and not interpreting() else {})))
        if not split or fused:
            return [fwd]
        return [fwd, self._merge_launch(o_part, lse_part, lse, rows)]

    def _build_ws_launches(self, ts: list[int]) -> list[FixedLaunch]:
        """The warp-specialised forward kernel (and the merge kernel with split-KV)."""
        from triton.experimental.gluon import language as gl
        from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as GluonDescriptor

        from kernels.tree_attention_ws import tree_attn_ws_kernel

        inp, plan, cfg = self.inputs, self.plan, self.plan.config
        q, kc, vc = inp.q, inp.k_cache, inp.v_cache
        if q.stride(-1) != 1:
            q = q.contiguous()
        hkv, d = kc.shape[2], q.shape[2]
        words, bias, stride_mw, stride_bias = self._mask_args(ts)
        split = plan.num_splits > 1
        rows = q.shape[0] * q.shape[1]
        o_part = torch.empty((plan.num_splits, *q.shape), dtype=torch.float32, device=q.device) if split else self.out
        lse_part = torch.empty((plan.num_splits, *q.shape[:2]), dtype=torch.float32, device=q.device) \
            if split else (self.lse if self.lse is not None else inp.context_lens)
        lse = self.lse if self.lse is not None else lse_part
        layout = gl.NVMMASharedLayout.get_default_for([cfg.block_n, d], gl.bfloat16 if q.dtype == torch.bfloat16
                                                      else gl.float16)
        rows_kv = kc.shape[0] * kc.shape[1]
        k_desc, v_desc = (GluonDescriptor(t, [rows_kv, hkv * d], [hkv * d, 1], [cfg.block_n, d], layout)
                          for t in (kc, vc))
        consumer_regs, producer_regs = cfg.ws_regs
        sms = torch.cuda.get_device_properties(q.device).multi_processor_count
        per_sm = max(1, min(2, SMEM_PER_SM // (cfg.ws_shared_bytes(d) + 1024)))
        programs = min(plan.num_programs, sms * per_sm) if WS_PERSIST else plan.num_programs
        fwd = FixedLaunch(tree_attn_ws_kernel, (programs,), [
            q, k_desc, v_desc, inp.block_table, inp.context_lens, inp.qo_indptr, words, bias,
            self.out, lse, o_part, lse_part, inp.sm_scale * LOG2E, q.stride(0), q.stride(1),
            inp.block_table.stride(0), stride_mw, stride_bias, rows, plan.m_tiles, plan.num_splits,
            plan.tiles_per_split, plan.num_programs],
            dict(HKV=hkv, G=q.shape[1] // hkv, D=d, P=kc.shape[1], BLOCK_N=cfg.block_n, NUM_WG=cfg.ws,
                 STAGES=cfg.num_stages, MASK_MODE=MASK_MODES.index(self.mask_mode), SPLIT=split,
                 WRITE_LSE=self.lse is not None, CONSUMER_REGS=consumer_regs, PRODUCER_REGS=producer_regs,
                 PIPE=WS_PIPE and cfg.ws < 3),
            dict(num_warps=4, maxnreg=cfg.max_regs))
        if not split:
            return [fwd]
        return [fwd, self._merge_launch(o_part, lse_part, lse, rows)]

    def _merge_launch(self, o_part: torch.Tensor, lse_part: torch.Tensor, lse: torch.Tensor,
                      rows: int) -> FixedLaunch:
        """The split-KV merge kernel over the partials (rows = sum T * Hq)."""
        plan, d = self.plan, o_part.shape[-1]
        per = self.merge_rows
        return FixedLaunch(tree_attn_merge_kernel, (-(-rows // per),),
                           [o_part, lse_part, self.out, lse, rows, plan.num_splits],
                           dict(BLOCK_S=next_pow2(plan.num_splits), ROWS=per, D=d, WRITE_LSE=self.lse is not None,
                                PDL=self.pdl),
                           dict(num_warps=4 if plan.num_splits * per * d >= 2048 else 2, num_stages=1,
                                **({"launch_pdl": True} if self.pdl else {})))
