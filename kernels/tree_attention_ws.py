"""Warp-specialised tree attention for sm_90, in Gluon (Triton's explicit-layout dialect).

The same work as `tree_attention_tl.tree_attn_fwd_kernel` (docs/kernel.md), laid out
the way FlashAttention-3 lays out its Hopper forward kernel (Shah et al. 2024,
"FlashAttention-3", sections 3.1-3.2): a work item is NUM_WG * 64 packed rows of
one (request b, KV head, KV split); each CTA takes items pid, pid + grid, ...
(a persistent wave when the grid is smaller than the item count) and splits its
warps by role:

- a producer warp streams every K/V tile of its items into a ring of STAGES
  shared-memory buffers with TMA (page from the block table, one box of
  BLOCK_N tokens x D), each buffer guarded by a "ready" mbarrier per tensor and an
  "empty" mbarrier that every consumer releases; it runs ahead into the next
  item while the consumers finish the last one (with GATHER, for pages TMA cannot read,
  the producer is a warpgroup that copies each tile row by row with cp.async,
  `tree_attention_gather`, each ready barrier counting one arrival per producer thread);
- NUM_WG consumer warpgroups, each owning 64 rows, run Q K^T (wgmma, Q from
  shared memory), the online softmax (FlashAttention-2, fp32, exp2) and P V
  (wgmma, P from registers) on each tile as soon as it lands; with PIPE, tile
  j's Q K^T is issued before tile j - 1's P V and tile j's softmax runs while
  that P V is on the tensor cores (FlashAttention-3's Algorithm 2).

So each K/V tile is read from L2 once per CTA for all NUM_WG * 64 rows (the
tl kernel reads it once per 64-row M-tile), the loads never wait in the
consumers' instruction stream, and the consumer warpgroups, scheduled
independently, overlap one's softmax with another's MMAs. Per work item, each
consumer also copies the next item's Q rows into its Q buffer with cp.async
as soon as its last MMA has read the buffer, and loads the next request's
(L_b, qo_b, T_b) one item ahead, so an item starts without a global-load wait
(run 13 in lab/runs.md: 4% faster on full:3:3 at B 64, and fewer spills). The softmax
rescales lazily (FlashAttention-4's conditional rescaling): on an unmasked tile the
running max moves only when the tile's row max passes it by more than 8 (log2 units,
a factor 2^8), so most tiles leave alpha at 1 and `rescale` skips the accumulator's multiply warp by warp;
padding rows (past T_b * G) start at a huge max, so their P is 0 and P V multiplies
zeros (run 15 in lab/runs.md: 4.5% faster on full:3:3 at B 64 with the L2 flushed,
7.6% back to back, where the H200 runs at its power cap).

Rows pack the G query heads of the KV head with the request's tree nodes,
node-major (row r = node * G + g), as in the tl kernel. Tiles wholly inside
the context [0, L_b) need no mask; the tiles overlapping [L_b, S_b) apply the
tree mask (MASK_MODE 0 bitmask, 1 additive bias, 2 causal) in the consumer. The
bitmask is turned into one 64-bit word of allowed columns per row and tile
(`tree_attention_ws_softmax`: context bits and the row's tree bits), loaded ahead of the
tile's Q K^T, so per score only one bit is tested. TMA
reads those tiles whole, so rows past S_b hold whatever the pool holds there
(NaN in the harness's pools): their scores are masked to -inf, and the
producer zeroes the V rows past S_b of a request's last tile in shared memory
before handing it on (P V would turn 0 * NaN into NaN).

fp8 pools (`KernelOptions.ws_fp8`): the producer lands the codes in a ring of their own and a
converter warpgroup writes each tile once in Q's dtype into the consumers' ring, V rows past
S_b as zeros (`tree_attention_ws_fp8`, which draws the rings and their barriers).

Only for sm_90 GPUs with Gluon's Hopper API (Triton 3.6 to 3.9); the CPU
interpreter does not run Gluon, so `TreeAttention` uses the tl kernel there.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, warpgroup_mma,
                                                              warpgroup_mma_wait)

from treebench.kernels.tree_attention_gather import GATHER_THREADS, GATHER_WARPS
from treebench.kernels.tree_attention_ws_fp8 import mma_smem_layout
from treebench.kernels.tree_attention_ws_load import item_request, item_tiles, producer, ws_converter, ws_producer
from treebench.kernels.tree_attention_ws_softmax import next_words, rescale, softmax_tile, tile_mask

# cp.async global -> shared: `async_copy_global_to_shared` in Triton 3.6, `async_load` in 3.9.
_cp_async = getattr(async_copy, "async_load", None) or async_copy.async_copy_global_to_shared


@gluon.constexpr_function
def _load_layout(d):
    """Blocked layout of a (64, d) tile over one warpgroup, 16-byte vectors along d."""
    tpw_d = d // 8 if d < 256 else 32
    return gl.BlockedLayout([1, 8], [32 // tpw_d, tpw_d], [4, 1], [1, 0])


@gluon.constexpr_function
def _mma_layout(n):
    """wgmma accumulator layout of a (64, n) tile over one warpgroup."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, n, 16])


@gluon.jit
def _q_rows(qo, T, kh, m0, stride_qt, stride_qh, WG: gl.constexpr, G: gl.constexpr, ld_layout: gl.constexpr):
    """Warpgroup WG's 64 packed Q rows of an item: (r, ok, offset into Q), row r = node * G + g
    in SliceLayout(1, ld_layout); ok: r < T * G."""
    r = m0 + WG * 64 + gl.arange(0, 64, layout=gl.SliceLayout(1, ld_layout))
    ok = r < T * G
    off = (qo + r // G).to(gl.int64) * stride_qt + (kh * G + r % G) * stride_qh
    return r, ok, off


@gluon.jit
def _issue_q(q_wg, Q, item, qo, T, m_tiles, num_splits, stride_qt, stride_qh, d_ld, WG: gl.constexpr,
             HKV: gl.constexpr, G: gl.constexpr, NUM_WG: gl.constexpr, ld_layout: gl.constexpr):
    """Work item `item`'s Q rows of warpgroup WG (its request's qo, T) into q_wg by cp.async,
    as one commit group, rows past T * G zero-filled; the caller waits for the group
    (`async_copy.wait_group`) and fences before a wgmma reads q_wg."""
    kh = (item // (m_tiles * num_splits)) % HKV
    m0 = (item % m_tiles) * (NUM_WG * 64)
    r, ok, off = _q_rows(qo, T, kh, m0, stride_qt, stride_qh, WG, G, ld_layout)
    _cp_async(q_wg, Q + gl.expand_dims(off, 1) + gl.expand_dims(d_ld, 0), mask=gl.expand_dims(ok, 1))
    async_copy.commit_group()


@gluon.jit
def _wait_landed(bar, phase, GATHER: gl.constexpr):
    """Waits for a ring slot's ready barrier `bar` to complete `phase`; with GATHER (a tile
    written by cp.async, the generic proxy) then fences (fence.proxy.async) so that the
    wgmma that reads the slot (the async proxy) sees it."""
    mbarrier.wait(bar, phase)
    if GATHER:
        fence_async_shared()


@gluon.jit
def _tile_step(q_wg, k_bufs, v_bufs, k_ready, v_ready, kv_empty, pos, t, s0, acc, m_i, l_i, words, qk_scale, mctx,
               STAGES: gl.constexpr, BLOCK_N: gl.constexpr, MASK_MODE: gl.constexpr, MASKED: gl.constexpr,
               s_layout: gl.constexpr, o_layout: gl.constexpr, GATHER: gl.constexpr):
    """KV tile t at ring position pos, in turn: Q K^T, softmax, P V, release. MASKED:
    `words` are tile t's bitmask words, and tile t + 1's are loaded while Q K^T runs.
    GATHER: the tiles are cp.async gathers (`_wait_landed`). Returns (acc, m_i, l_i, words)."""
    st = pos % STAGES
    ph = (pos // STAGES) & 1
    _wait_landed(k_ready.index(st), ph, GATHER)
    s = warpgroup_mma(q_wg, k_bufs.index(st).permute((1, 0)), s0, use_acc=False, is_async=True)
    if MASKED:
        allowed_words = words
        words = next_words(t + 1, words, mctx, BLOCK_N, MASK_MODE)
    s = warpgroup_mma_wait(num_outstanding=0, deps=(s, ))
    if MASKED:
        allowed, bias = tile_mask(s_layout, t, allowed_words, mctx, BLOCK_N, MASK_MODE)
        p, alpha, m_i, l_i = softmax_tile(s, m_i, l_i, qk_scale, allowed, bias, MASK_MODE, True)
    else:
        p, alpha, m_i, l_i = softmax_tile(s, m_i, l_i, qk_scale, 0, 0.0, MASK_MODE, False)
    acc = rescale(acc, gl.convert_layout(alpha, gl.SliceLayout(1, o_layout)))
    pa = gl.convert_layout(p.to(k_bufs.dtype), gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2))
    _wait_landed(v_ready.index(st), ph, GATHER)
    acc = warpgroup_mma(pa, v_bufs.index(st), acc, is_async=True)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
    mbarrier.arrive(kv_empty.index(st), count=1)
    return acc, m_i, l_i, words


@gluon.jit
def _ws_consumer(prm, ptrs, smem, v_scale, WG: gl.constexpr, HKV: gl.constexpr, G: gl.constexpr, D: gl.constexpr,
                 P: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, MASK_MODE: gl.constexpr,
                 SPLIT: gl.constexpr, WRITE_LSE: gl.constexpr, PIPE: gl.constexpr, NUM_WG: gl.constexpr,
                 GATHER: gl.constexpr):
    """One warpgroup: rows [m0 + 64 WG, m0 + 64 WG + 64) of each of this program's work
    items, over every tile of the item. PIPE: FlashAttention-3's intra-warpgroup
    pipelining (its Algorithm 2): tile j's Q K^T is issued before tile j - 1's P V, and
    tile j's softmax runs while that P V is on the tensor cores; else each tile's Q K^T,
    softmax and P V in turn. smem's tiles are in the MMA dtype (Q's); with an fp8 pool the
    converter fills them and v_scale (fp32) multiplies the normalised output (None otherwise).
    GATHER: the ring's tiles are cp.async gathers, fenced after each ready wait (`_wait_landed`)."""
    m_tiles, num_splits, tiles_per_split, qk_scale, n_items = prm
    (Q, BT, CTX_LENS, QO, MASK, BIAS, O, LSE, O_PART, LSE_PART, K_DESC, V_DESC,
     stride_qt, stride_qh, stride_bt, stride_mw, stride_bias, stride_ps) = ptrs
    q_smem, k_bufs, v_bufs, k_ready, v_ready, kv_empty, fix_bar = smem
    dtype: gl.constexpr = k_bufs.dtype          # the MMA dtype: the pool's, or Q's over fp8 codes
    ld_layout: gl.constexpr = _load_layout(D)
    s_layout: gl.constexpr = _mma_layout(BLOCK_N)
    o_layout: gl.constexpr = _mma_layout(D)
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    q_wg = q_smem.index(WG)
    s0 = gl.zeros([64, BLOCK_N], gl.float32, layout=s_layout)
    d_ld = gl.arange(0, D, layout=gl.SliceLayout(0, ld_layout))
    it = 0                                      # ring position, across work items
    # Each item's request (L, qo, T) is loaded one item ahead, and its Q rows are copied
    # (cp.async) into q_wg while the previous item finishes: the first item's here.
    nxt_L, nxt_qo, nxt_T = item_request(gl.program_id(0), CTX_LENS, QO, m_tiles, num_splits, HKV)
    _issue_q(q_wg, Q, gl.program_id(0), nxt_qo, nxt_T, m_tiles, num_splits, stride_qt, stride_qh, d_ld, WG, HKV, G,
             NUM_WG, ld_layout)
    for item in range(gl.program_id(0), n_items, gl.num_programs(0)):
        b, kh, split, L, S, qo, T, t_lo, t_hi, t_ctx, m0 = item_tiles(
            item, nxt_L, nxt_qo, nxt_T, m_tiles, num_splits, tiles_per_split, HKV, G, BLOCK_N, NUM_WG)
        nxt = item + gl.num_programs(0)
        nxt_L, nxt_qo, nxt_T = item_request(gl.minimum(nxt, n_items - 1), CTX_LENS, QO, m_tiles, num_splits, HKV)
        async_copy.wait_group(0)                # this item's Q rows (issued during the last item)
        fence_async_shared()                    # cp.async's writes before the wgmma reads them

        rows = m0 + WG * 64 + gl.arange(0, 64, layout=row_s)
        node = rows // G
        row_ok = rows < T * G
        row_tok = qo + node
        mctx = (MASK, BIAS, row_tok, node, row_ok, L, T, stride_mw, stride_bias)
        # A padding row (past T * G) starts with a huge running max, so its p is exp2(-1e30) = 0 on
        # every tile (alpha 1, l 0; it is not stored): P V then multiplies zero rows, which draws
        # less power than the rows of ones that zero Q rows would give (the GPU runs at its power
        # cap on full:3:3, where 32 of the 192 rows pad: run 15).
        m_i = gl.where(row_ok, float("-inf"), 1.0e30)
        l_i = gl.zeros([64], gl.float32, layout=row_s)
        acc = gl.zeros([64, D], gl.float32, layout=o_layout)
        words = (gl.zeros([64], gl.int32, layout=row_s), gl.zeros([64], gl.int32, layout=row_s))   # `next_words`
        # A warpgroup whose rows all lie past the request's T * G (the last M-tile of a tree
        # whose rows are not a multiple of NUM_WG * 64) computes nothing: it only releases
        # each ring slot once the slot has landed (the drain loop below).
        t_end = gl.where(m0 + WG * 64 < T * G, t_hi, t_lo)
        t_ctx = gl.minimum(t_ctx, t_end)
        n = t_end - t_lo
        nc = t_ctx - t_lo                       # context tiles (no mask); the rest, to t_end, are masked
        if PIPE:
            p_prev = gl.zeros([64, BLOCK_N], dtype, layout=p_layout)
            if nc > 0:                          # prologue: tile 0's Q K^T and softmax
                st = it % STAGES
                _wait_landed(k_ready.index(st), (it // STAGES) & 1, GATHER)
                s = warpgroup_mma(q_wg, k_bufs.index(st).permute((1, 0)), s0, use_acc=False, is_async=True)
                s = warpgroup_mma_wait(num_outstanding=0, deps=(s, ))
                p, alpha, m_i, l_i = softmax_tile(s, m_i, l_i, qk_scale, 0, 0.0, MASK_MODE, False)
                p_prev = gl.convert_layout(p.to(dtype), p_layout)
            for j in range(1, nc):
                st = (it + j) % STAGES
                sp = (it + j - 1) % STAGES
                mbarrier.wait(k_ready.index(st), ((it + j) // STAGES) & 1)
                _wait_landed(v_ready.index(sp), ((it + j - 1) // STAGES) & 1, GATHER)   # one fence for both
                s_tok = warpgroup_mma(q_wg, k_bufs.index(st).permute((1, 0)), s0, use_acc=False, is_async=True)
                acc_tok = warpgroup_mma(p_prev, v_bufs.index(sp), acc, is_async=True)
                s = warpgroup_mma_wait(num_outstanding=1, deps=(s_tok, ))      # Q K^T of tile j done
                p, alpha, m_i, l_i = softmax_tile(s, m_i, l_i, qk_scale, 0, 0.0, MASK_MODE, False)
                acc, p_prev = warpgroup_mma_wait(num_outstanding=0, deps=(acc_tok, p_prev))
                mbarrier.arrive(kv_empty.index(sp), count=1)
                acc = rescale(acc, gl.convert_layout(alpha, row_o))
                p_prev = gl.convert_layout(p.to(dtype), p_layout)
            # the first masked tile's bitmask words, loaded before the last context tile's P V
            words = next_words(t_lo + nc, words, mctx, BLOCK_N, MASK_MODE)
            if nc > 0:                          # epilogue: the last context tile's P V
                sp = (it + nc - 1) % STAGES
                _wait_landed(v_ready.index(sp), ((it + nc - 1) // STAGES) & 1, GATHER)
                acc_tok = warpgroup_mma(p_prev, v_bufs.index(sp), acc, is_async=True)
                acc, p_prev = warpgroup_mma_wait(num_outstanding=0, deps=(acc_tok, p_prev))
                mbarrier.arrive(kv_empty.index(sp), count=1)
        else:
            for j in range(0, nc):
                acc, m_i, l_i, words = _tile_step(q_wg, k_bufs, v_bufs, k_ready, v_ready, kv_empty, it + j, t_lo + j,
                                                  s0, acc, m_i, l_i, words, qk_scale, mctx, STAGES, BLOCK_N, MASK_MODE,
                                                  False, s_layout, o_layout, GATHER)
            words = next_words(t_lo + nc, words, mctx, BLOCK_N, MASK_MODE)
        for j in range(nc, n):                  # the tiles overlapping [L, S): masked, one at a time
            acc, m_i, l_i, words = _tile_step(q_wg, k_bufs, v_bufs, k_ready, v_ready, kv_empty, it + j, t_lo + j, s0,
                                              acc, m_i, l_i, words, qk_scale, mctx, STAGES, BLOCK_N, MASK_MODE, True,
                                              s_layout, o_layout, GATHER)
        for j in range(n, t_hi - t_lo):         # an idle warpgroup: release each slot once it has landed
            st = (it + j) % STAGES
            mbarrier.wait(k_ready.index(st), ((it + j) // STAGES) & 1)
            mbarrier.wait(v_ready.index(st), ((it + j) // STAGES) & 1)
            mbarrier.arrive(kv_empty.index(st), count=1)
        it += t_hi - t_lo
        if nxt < n_items:                       # every MMA that read q_wg is done: the next item's Q
            _issue_q(q_wg, Q, nxt, nxt_qo, nxt_T, m_tiles, num_splits, stride_qt, stride_qh, d_ld, WG, HKV, G, NUM_WG,
                     ld_layout)

        seen = l_i > 0.0                        # False only for a split that saw nothing of a row
        l_safe = gl.where(seen, l_i, 1.0)
        if GATHER:                              # gathers read bf16 / fp16 pools
            out = acc / gl.expand_dims(gl.convert_layout(l_safe, row_o), 1)
        elif K_DESC.dtype.is_fp8():             # a V code c means c * v_scale
            out = acc * gl.expand_dims(gl.convert_layout(v_scale / l_safe, row_o), 1)
        else:
            out = acc / gl.expand_dims(gl.convert_layout(l_safe, row_o), 1)
        lse = gl.where(seen, (m_i + gl.log2(l_safe)) * 0.6931471805599453, float("-inf"))
        out = gl.convert_layout(out, ld_layout)
        r_ld, ok_ld, _ = _q_rows(qo, T, kh, m0, stride_qt, stride_qh, WG, G, ld_layout)   # recomputed, not kept live
        o_row = (qo + r_ld // G).to(gl.int64) * (HKV * G) + kh * G + r_ld % G   # (64,) into (sum T, Hq)
        o_off = gl.expand_dims(o_row, 1) * D + gl.expand_dims(d_ld, 0)
        lse_row = (row_tok.to(gl.int64) * (HKV * G) + kh * G + rows % G)
        if not SPLIT:
            gl.store(O + o_off, out.to(dtype), mask=gl.expand_dims(ok_ld, 1))
            if WRITE_LSE:
                gl.store(LSE + lse_row, lse, mask=row_ok)
        else:
            plane = split.to(gl.int64) * stride_ps
            gl.store(O_PART + plane * D + o_off, out, mask=gl.expand_dims(ok_ld, 1))
            gl.store(LSE_PART + plane + lse_row, lse, mask=row_ok)


@gluon.jit(do_not_specialize=["stride_bt", "stride_mw", "stride_bias", "stride_ps", "m_tiles", "num_splits",
                              "tiles_per_split", "n_items"])
def tree_attn_ws_kernel(
    Q, K_DESC, V_DESC, BT, CTX_LENS, QO, MASK, BIAS, O, LSE, O_PART, LSE_PART,
    qk_scale,                                   # sm_scale * k_scale * log2(e), fp32
    v_scale,                                    # fp8 pools: V's scale, fp32; else None (a constexpr)
    stride_qt, stride_qh,                       # q (sum T, Hq, D); its last dim is contiguous
    stride_bt, stride_mw, stride_bias,          # block_table row, mask-words row, bias row
    stride_ps,                                  # partial workspace: one split's plane, sum T * Hq
    m_tiles, num_splits, tiles_per_split, n_items,
    HKV: gl.constexpr, G: gl.constexpr, D: gl.constexpr, P: gl.constexpr, BLOCK_N: gl.constexpr,
    NUM_WG: gl.constexpr, STAGES: gl.constexpr, MASK_MODE: gl.constexpr, SPLIT: gl.constexpr,
    WRITE_LSE: gl.constexpr, CONSUMER_REGS: gl.constexpr, PRODUCER_REGS: gl.constexpr, PIPE: gl.constexpr = True,
    GATHER: gl.constexpr = False, K=None, V=None, F8_STAGES: gl.constexpr = 0, CONVERTER_REGS: gl.constexpr = 0,
    CVT_FENCES: gl.constexpr = 1, CONVERTERS: gl.constexpr = 1,
):
    """Grid: (programs,), each program taking work items pid, pid + programs, ... of the
    n_items = B * HKV * num_splits * m_tiles (M-tile fastest); programs = n_items gives one
    item per program, fewer (one wave) makes the kernel persistent, so the producer
    streams the next item's first tiles while the consumers finish the last one.
    num_warps=4 (the first consumer warpgroup; the others and the producer warp are
    worker partitions).

    Q (sum T, Hq, D) bf16/fp16; K_DESC / V_DESC: Gluon TMA descriptors of the pools viewed
    as (N * P, HKV * D), block (BLOCK_N, D) where P % BLOCK_N == 0, else (P, D) with
    BLOCK_N % P == 0 and P a multiple of 16 (one box per page, `tree_attention_ws_load`), the
    layout of a (BLOCK_N, D) buffer either way; BT (B, max pages) int32;
    CTX_LENS (B,) int32 L_b; QO (B + 1,) int32 offsets of each request's nodes; MASK
    (sum T, W) int64 / BIAS (T, T) fp32 for MASK_MODE 0 / 1; O (sum T, Hq, D) in the
    input dtype; LSE (sum T, Hq) fp32 natural log (WRITE_LSE); with SPLIT, O_PART
    (num_splits, sum T, Hq, D) / LSE_PART (num_splits, sum T, Hq) fp32 partials for
    `tree_attention_reduce.tree_attn_merge_kernel`. An item's M-tile holds NUM_WG * 64
    packed rows; items past a short request's rows stream nothing and store nothing.
    CONSUMER_REGS / PRODUCER_REGS: registers per thread of the consumer and producer
    partitions (setmaxnreg; launch with maxnreg so that they fit, `KernelConfig.ws_regs_for`).
    PIPE: the consumers' intra-warpgroup pipelining. GATHER: the producer is a warpgroup
    that reads every tile by cp.async pointer gathers (`tree_attention_gather`, any P) from
    K / V, the (N, P, HKV, D) pools themselves (contiguous, 16-byte aligned), instead of
    TMA; K_DESC / V_DESC are then None (and K / V None without GATHER). Raises nothing
    at run time; a NUM_WG other than 1-3 fails to compile.

    fp8 pools (K_DESC / V_DESC over float8_e4m3fn / float8_e5m2 codes, their layout the
    NVMMA one of a (BLOCK_N, D) fp8 tile): the producer lands the codes in a ring of
    F8_STAGES fp8 buffers and a converter warpgroup (CONVERTER_REGS registers) writes each
    tile once into the consumers' STAGES-deep ring in Q's dtype (`tree_attention_ws_fp8`, with
    CVT_FENCES fence-barrier pairs per tile; CONVERTERS 2: one converter warpgroup for K, one for
    V, NUM_WG 1 only);
    qk_scale then holds k_scale and v_scale scales the output."""
    if GATHER:                                  # bf16 / fp16 pools (fp8 pools take the TMA paths)
        dtype: gl.constexpr = K.dtype.element_ty
        smem_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, D], dtype)
        kv_k = K
        kv_v = V
        FP8: gl.constexpr = False
    else:
        FP8: gl.constexpr = K_DESC.dtype.is_fp8()
        if FP8:                                 # the consumers' tiles in Q's dtype, from the converter
            dtype: gl.constexpr = Q.dtype.element_ty
            smem_layout: gl.constexpr = mma_smem_layout(BLOCK_N, D, dtype)
        else:
            smem_layout: gl.constexpr = K_DESC.layout
            dtype: gl.constexpr = K_DESC.dtype
        kv_k = K_DESC
        kv_v = V_DESC
    PRODUCER_WARPS: gl.constexpr = GATHER_WARPS if GATHER else 1
    READY_COUNT: gl.constexpr = GATHER_THREADS if GATHER else 1   # cp.async: one arrival per producer thread
    q_smem = gl.allocate_shared_memory(dtype, [NUM_WG, 64, D], smem_layout)
    k_bufs = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, D], smem_layout)
    v_bufs = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, D], smem_layout)
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    kv_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    fix_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(fix_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(i), count=READY_COUNT)
        mbarrier.init(v_ready.index(i), count=READY_COUNT)
        mbarrier.init(kv_empty.index(i), count=NUM_WG)

    prm = (m_tiles, num_splits, tiles_per_split, qk_scale, n_items)
    ptrs = (Q, BT, CTX_LENS, QO, MASK, BIAS, O, LSE, O_PART, LSE_PART, kv_k, kv_v,   # descriptors, or the pools
            stride_qt, stride_qh, stride_bt, stride_mw, stride_bias, stride_ps)
    smem = (q_smem, k_bufs, v_bufs, k_ready, v_ready, kv_empty, fix_bar)
    # Each partition's constexprs are spelled out: packed in a tuple (or a tuple built with +)
    # they reach the partition as runtime values with Triton 3.6 and 3.9.
    if FP8:                                     # producer -> fp8 ring -> converter -> smem's ring -> consumers
        k8_bufs = gl.allocate_shared_memory(K_DESC.dtype, [F8_STAGES, BLOCK_N, D], K_DESC.layout)
        v8_bufs = gl.allocate_shared_memory(K_DESC.dtype, [F8_STAGES, BLOCK_N, D], K_DESC.layout)
        k8_ready = gl.allocate_shared_memory(gl.int64, [F8_STAGES, 1], mbarrier.MBarrierLayout())
        v8_ready = gl.allocate_shared_memory(gl.int64, [F8_STAGES, 1], mbarrier.MBarrierLayout())
        kv8_empty = gl.allocate_shared_memory(gl.int64, [F8_STAGES, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(F8_STAGES):
            mbarrier.init(k8_ready.index(i), count=1)
            mbarrier.init(v8_ready.index(i), count=1)
            mbarrier.init(kv8_empty.index(i), count=CONVERTERS)   # every converter releases the slot
        ring8 = (k8_bufs, v8_bufs, k8_ready, v8_ready, kv8_empty)
        smem8 = (q_smem, k8_bufs, v8_bufs, k8_ready, v8_ready, kv8_empty, fix_bar)   # the producer's ring
        if CONVERTERS == 2:
            gl.static_assert(NUM_WG == 1, "two converter warpgroups: NUM_WG 1")
            gl.warp_specialize([
                (_ws_consumer, (prm, ptrs, smem, v_scale, 0, HKV, G, D, P, BLOCK_N, STAGES, MASK_MODE, SPLIT,
                                WRITE_LSE, PIPE, NUM_WG, GATHER)),
                (ws_converter, (prm, ptrs, smem, ring8, HKV, G, BLOCK_N, D, STAGES, F8_STAGES, NUM_WG, CVT_FENCES,
                                1)),
                (ws_converter, (prm, ptrs, smem, ring8, HKV, G, BLOCK_N, D, STAGES, F8_STAGES, NUM_WG, CVT_FENCES,
                                2)),
                (ws_producer, (prm, ptrs, smem8, 0, HKV, G, D, P, BLOCK_N, F8_STAGES, MASK_MODE, SPLIT, WRITE_LSE,
                                PIPE, NUM_WG)),
            ], [4, 4, 1], [CONVERTER_REGS, CONVERTER_REGS, PRODUCER_REGS])
        elif NUM_WG == 1:
            gl.warp_specialize([
                (_ws_consumer, (prm, ptrs, smem, v_scale, 0, HKV, G, D, P, BLOCK_N, STAGES, MASK_MODE, SPLIT,
                                WRITE_LSE, PIPE, NUM_WG, GATHER)),
                (ws_converter, (prm, ptrs, smem, ring8, HKV, G, BLOCK_N, D, STAGES, F8_STAGES, NUM_WG, CVT_FENCES)),
                (ws_producer, (prm, ptrs, smem8, 0, HKV, G, D, P, BLOCK_N, F8_STAGES, MASK_MODE, SPLIT, WRITE_LSE,
                                PIPE, NUM_WG)),
            ], [4, 1], [CONVERTER_REGS, PRODUCER_REGS])
        elif NUM_WG == 2:
            gl.warp_specialize([
                (_ws_consumer, (prm, ptrs, smem, v_scale, 0, HKV, G, D, P, BLOCK_N, STAGES, MASK_MODE, SPLIT,
                                WRITE_LSE, PIPE, NUM_WG, GATHER)),
                (_ws_consumer, (prm, ptrs, smem, v_scale, 1, HKV, G, D, P, BLOCK_N, STAGES, MASK_MODE, SPLIT,
                                WRITE_LSE, PIPE, NUM_WG, GATHER)),
                (ws_converter, (prm, ptrs, smem, ring8, HKV, G, BLOCK_N, D, STAGES, F8_STAGES, NUM_WG, CVT_FENCES)),
                (ws_producer, (prm, ptrs, smem8, 0, HKV, G, D, P, BLOCK_N, F8_STAGES, MASK_MODE, SPLIT, WRITE_LSE,
                                PIPE, NUM_WG)),
            ], [4, 4, 1], [CONSUMER_REGS, CONVERTER_REGS, PRODUCER_REGS])
        else:
            gl.static_assert(NUM_WG == 3, "NUM_WG: 1, 2 or 3 consumer warpgroups")
            gl.warp_specialize([
                (_ws_consumer, (prm, ptrs, smem, v_scale, 0, HKV, G, D, P, BLOCK_N, STAGES, MASK_MODE, SPLIT,
                                WRITE_LSE, PIPE, NUM_WG, GATHER)),
                (_ws_consumer, (prm, ptrs, smem, v_scale, 1, HKV, G, D, P, BLOCK_N, STAGES, MASK_MODE, SPLIT,
                                WRITE_LSE, PIPE, NUM_WG, GATHER)),
                (_ws_consumer, (prm, ptrs, smem, v_scale, 2, HKV, G, D, P, BLOCK_N, STAGES, MASK_MODE, SPLIT,
                                WRITE_LSE, PIPE, NUM_WG, GATHER)),
                (ws_converter, (prm, ptrs, smem, ring8, HKV, G, BLOCK_N, D, STAGES, F8_STAGES, NUM_WG, CVT_FENCES)),
                (ws_producer, (prm, ptrs, smem8, 0, HKV, G, D, P, BLOCK_N, F8_STAGES, MASK_MODE, SPLIT, WRITE_LSE,
                                PIPE, NUM_WG)),
            ], [4, 4, 4, 1], [CONSUMER_REGS, CONSUMER_REGS, CONVERTER_REGS, PRODUCER_REGS])
    elif NUM_WG == 1:
        gl.warp_specialize([
            (_ws_consumer, (prm, ptrs, smem, v_scale, 0, HKV, G, D, P, BLOCK_N, STAGES, MASK_MODE, SPLIT, WRITE_LSE,
                    PIPE, NUM_WG, GATHER)),
            (producer, (prm, ptrs, smem, 0, HKV, G, D, P, BLOCK_N, STAGES, MASK_MODE, SPLIT, WRITE_LSE,
                    PIPE, NUM_WG, GATHER)),
        ], [PRODUCER_WARPS], [PRODUCER_REGS])
    elif NUM_WG == 2:
        gl.warp_specialize([
            (_ws_consumer, (prm, ptrs, smem, v_scale, 0, HKV, G, D, P, BLOCK_N, STAGES, MASK_MODE, SPLIT, WRITE_LSE,
                    PIPE, NUM_WG, GATHER)),
            (_ws_consumer, (prm, ptrs, smem, v_scale, 1, HKV, G, D, P, BLOCK_N, STAGES, MASK_MODE, SPLIT, WRITE_LSE,
                    PIPE, NUM_WG, GATHER)),
            (producer, (prm, ptrs, smem, 0, HKV, G, D, P, BLOCK_N, STAGES, MASK_MODE, SPLIT, WRITE_LSE,
                    PIPE, NUM_WG, GATHER)),
        ], [4, PRODUCER_WARPS], [CONSUMER_REGS, PRODUCER_REGS])
    else:
        gl.static_assert(NUM_WG == 3, "NUM_WG: 1, 2 or 3 consumer warpgroups")
        gl.warp_specialize([
            (_ws_consumer, (prm, ptrs, smem, v_scale, 0, HKV, G, D, P, BLOCK_N, STAGES, MASK_MODE, SPLIT, WRITE_LSE,
                    PIPE, NUM_WG, GATHER)),
            (_ws_consumer, (prm, ptrs, smem, v_scale, 1, HKV, G, D, P, BLOCK_N, STAGES, MASK_MODE, SPLIT, WRITE_LSE,
                    PIPE, NUM_WG, GATHER)),
            (_ws_consumer, (prm, ptrs, smem, v_scale, 2, HKV, G, D, P, BLOCK_N, STAGES, MASK_MODE, SPLIT, WRITE_LSE,
                    PIPE, NUM_WG, GATHER)),
            (producer, (prm, ptrs, smem, 0, HKV, G, D, P, BLOCK_N, STAGES, MASK_MODE, SPLIT, WRITE_LSE,
                    PIPE, NUM_WG, GATHER)),
        ], [4, 4, PRODUCER_WARPS], [CONSUMER_REGS, CONSUMER_REGS, PRODUCER_REGS])
