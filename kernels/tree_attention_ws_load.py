"""The loading side of the warp-specialised kernel (`tree_attention_ws.tree_attn_ws_kernel`):
its work-item schedule and the partitions that fill the consumers' K/V ring.

- `item_request`, `item_tiles`: a work item (M-tile fastest, then KV split, KV head,
  request b; NUM_WG * 64 packed rows) -> its request's (L_b, qo_b, T_b), three int32 scalar
  loads from CTX_LENS (B,) and QO (B + 1,), and its KV tiles [t_lo, t_hi) of BLOCK_N tokens,
  those before t_ctx wholly inside the context [0, L_b). Every partition walks the same items
  (pid, pid + grid, ...) through them, so ring positions agree across partitions.
- `ws_producer`: the TMA producer, one warp. It loads each tile through K_DESC / V_DESC (the
  pools viewed as (N * P, HKV * D); one (BLOCK_N, D) box per tile, or one (P, D) box per page
  when P < BLOCK_N), its pages read from the block table BT (B, max pages) int32, BT_CHUNK
  entries at a time, and zeroes the V rows past S_b of a request's last tile in shared memory
  before handing it on (TMA reads the pool's unused slots there). Over fp8 pools it fills the
  fp8 ring and leaves that zeroing to the converter.
- `producer`: the producer partition of bf16 / fp16 pools: `ws_producer`, or with GATHER one
  warpgroup that copies each tile by cp.async (`tree_attention_gather`, any P).
- `ws_converter`: fp8 pools only, the warpgroup that writes each fp8 tile once in Q's dtype
  into the consumers' ring (`tree_attention_ws_fp8`).

Ring protocol (described in `tree_attention_ws`): a slot is written after its "empty" barrier
(kv_empty, one arrival per consumer) completes, then signalled on its "ready" barriers
(k_ready / v_ready: TMA transaction bytes, or one arrival per cp.async thread).

Only for sm_90 GPUs with Gluon's Hopper API (Triton 3.6 to 3.9).
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma

from treebench.kernels.tree_attention_gather import gather_layout, gather_tile, tile_pages
from treebench.kernels.tree_attention_ws_fp8 import convert_kv_tile, convert_one_tile

# TMA global -> shared copy: `async_copy_global_to_shared` in Triton 3.6, `async_load` in 3.9
# (where the old name raises).
_tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
BT_CHUNK = gl.constexpr(32)   # block-table entries the producer loads at once (one per lane)


@gluon.jit
def item_request(item, CTX_LENS, QO, m_tiles, num_splits, HKV: gl.constexpr):
    """(L, qo, T) of work item `item`'s request: three scalar loads, issued ahead of use."""
    b = item // (m_tiles * num_splits * HKV)
    L = gl.load(CTX_LENS + b)
    qo = gl.load(QO + b)
    T = gl.load(QO + b + 1) - qo
    return L, qo, T


@gluon.jit
def item_tiles(item, L, qo, T, m_tiles, num_splits, tiles_per_split, HKV: gl.constexpr, G: gl.constexpr,
                BLOCK_N: gl.constexpr, NUM_WG: gl.constexpr):
    """Work item `item` (M-tile fastest, then split, KV head, request) of a request with
    (L, qo, T) -> (b, kh, split, L, S, qo, T, t_lo, t_hi, t_ctx, m0): its KV tiles are
    [t_lo, t_hi), those before t_ctx wholly inside the context; an item with no rows
    streams nothing."""
    mt = item % m_tiles
    split = (item // m_tiles) % num_splits
    kh = (item // (m_tiles * num_splits)) % HKV
    b = item // (m_tiles * num_splits * HKV)
    S = L + T
    m0 = mt * (NUM_WG * 64)
    t_lo = split * tiles_per_split
    t_hi = gl.minimum(t_lo + tiles_per_split, gl.cdiv(S, BLOCK_N))
    t_hi = gl.where(m0 < T * G, t_hi, t_lo)     # no rows here: an empty loop in every partition
    t_hi = gl.maximum(t_hi, t_lo)
    t_ctx = gl.maximum(gl.minimum(L // BLOCK_N, t_hi), t_lo)
    return b, kh, split, L, S, qo, T, t_lo, t_hi, t_ctx, m0


@gluon.jit
def _work_item(item, CTX_LENS, QO, m_tiles, num_splits, tiles_per_split, HKV: gl.constexpr, G: gl.constexpr,
               BLOCK_N: gl.constexpr, NUM_WG: gl.constexpr):
    """`item_tiles` of work item `item`, its request's (L, qo, T) loaded here."""
    L, qo, T = item_request(item, CTX_LENS, QO, m_tiles, num_splits, HKV)
    return item_tiles(item, L, qo, T, m_tiles, num_splits, tiles_per_split, HKV, G, BLOCK_N, NUM_WG)


@gluon.jit
def _zero_rows_past(slot, valid, BLOCK_N: gl.constexpr, D: gl.constexpr):
    """Zeroes rows [valid, BLOCK_N) of one (BLOCK_N, D) shared-memory tile, 8 rows at a
    time, from one warp (generic-proxy stores; the caller fences before handing it on)."""
    tpw_d: gl.constexpr = D // 8 if D < 256 else 32
    layout: gl.constexpr = gl.BlockedLayout([1, 8], [32 // tpw_d, tpw_d], [1, 1], [1, 0])
    for c in gl.static_range(BLOCK_N // 8):
        if (c + 1) * 8 > valid:
            sub = slot.slice(c * 8, 8, dim=0)
            v = sub.load(layout)
            r = c * 8 + gl.arange(0, 8, layout=gl.SliceLayout(1, layout))
            sub.store(gl.where(gl.expand_dims(r < valid, 1), v, gl.zeros_like(v)))


@gluon.jit
def ws_producer(prm, ptrs, smem, WG: gl.constexpr, HKV: gl.constexpr, G: gl.constexpr, D: gl.constexpr,
                 P: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, MASK_MODE: gl.constexpr,
                 SPLIT: gl.constexpr, WRITE_LSE: gl.constexpr, PIPE: gl.constexpr, NUM_WG: gl.constexpr):
    """One warp: every K/V tile of this program's work items into the ring, by TMA, in
    order. The last tile of a request (rows past S_b read from the pool's unused slots)
    lands on fix_bar first; its V rows past S_b are zeroed here before the consumers
    see it (P V would turn 0 * NaN into NaN); its K rows only give scores the consumers
    mask to -inf. With an fp8 pool `smem` holds the fp8 ring (the kernel passes it), whose
    tiles the converter zeroes past S_b as it converts them, so none lands on fix_bar."""
    m_tiles, num_splits, tiles_per_split, qk_scale, n_items = prm
    (Q, BT, CTX_LENS, QO, MASK, BIAS, O, LSE, O_PART, LSE_PART, K_DESC, V_DESC,
     stride_qt, stride_qh, stride_bt, stride_mw, stride_bias, stride_ps) = ptrs
    q_smem, k_bufs, v_bufs, k_ready, v_ready, kv_empty, fix_bar = smem
    bt_layout: gl.constexpr = gl.BlockedLayout([1], [32], [1], [0])
    lane = gl.arange(0, BT_CHUNK, layout=bt_layout)
    NP: gl.constexpr = BLOCK_N // P if P < BLOCK_N else 1   # pages per tile
    tile_bytes: gl.constexpr = BLOCK_N * D * k_bufs.dtype.primitive_bitwidth // 8
    FIX_V: gl.constexpr = not k_bufs.dtype.is_fp8()          # fp8 codes: the converter zeroes the tail
    it = 0                                      # ring position, across work items
    fixes = 0                                   # fix_bar phase
    for item in range(gl.program_id(0), n_items, gl.num_programs(0)):
        b, kh, split, L, S, qo, T, t_lo, t_hi, t_ctx, m0 = _work_item(
            item, CTX_LENS, QO, m_tiles, num_splits, tiles_per_split, HKV, G, BLOCK_N, NUM_WG)
        bt_row = BT + b.to(gl.int64) * stride_bt
        last = gl.maximum(t_hi - 1, 0)
        # The pages of BT_CHUNK tiles (of BT_CHUNK pages when a tile spans several) in one
        # load, one per lane, so filling the ring waits on one block-table latency, not one per tile.
        if P < BLOCK_N:                         # NP pages per tile, one TMA box each
            last = gl.maximum(S - 1, 0) // P    # the request's last page (past it: that page again)
            pages = gl.load(bt_row + gl.minimum(t_lo * NP + lane, last))
        else:
            pages = gl.load(bt_row + (gl.minimum(t_lo + lane, last) * BLOCK_N) // P)
        for t in range(t_lo, t_hi):
            j = t - t_lo
            st = it % STAGES
            if P < BLOCK_N:
                if (j % (BT_CHUNK // NP) == 0) & (j > 0):
                    pages = gl.load(bt_row + gl.minimum(t * NP + lane, last))
                sel = (j % (BT_CHUNK // NP)) * NP
            else:
                if (j % BT_CHUNK == 0) & (j > 0):
                    pages = gl.load(bt_row + (gl.minimum(t + lane, last) * BLOCK_N) // P)
                sel = j % BT_CHUNK
            mbarrier.wait(kv_empty.index(st), ((it // STAGES) & 1) ^ 1)   # a fresh barrier passes phase 1
            mbarrier.expect(k_ready.index(st), tile_bytes)
            _tma_tile(K_DESC, pages, lane, sel, t, kh, k_ready.index(st), k_bufs.index(st), P, BLOCK_N, D)
            if FIX_V:
                tail = (t + 1) * BLOCK_N > S    # the request's last tile holds rows past S
            else:
                tail = False
            if tail:
                mbarrier.expect(fix_bar, tile_bytes)
                _tma_tile(V_DESC, pages, lane, sel, t, kh, fix_bar, v_bufs.index(st), P, BLOCK_N, D)
                mbarrier.wait(fix_bar, fixes & 1)
                fixes += 1
                _zero_rows_past(v_bufs.index(st), S - t * BLOCK_N, BLOCK_N, D)
                fence_async_shared()            # the zeros before the consumers' wgmma reads
                mbarrier.arrive(v_ready.index(st), count=1)
            else:
                mbarrier.expect(v_ready.index(st), tile_bytes)
                _tma_tile(V_DESC, pages, lane, sel, t, kh, v_ready.index(st), v_bufs.index(st), P, BLOCK_N, D)
            it += 1


@gluon.jit
def _gather_producer(prm, ptrs, smem, HKV: gl.constexpr, G: gl.constexpr, D: gl.constexpr, P: gl.constexpr,
                     BLOCK_N: gl.constexpr, STAGES: gl.constexpr, NUM_WG: gl.constexpr):
    """One warpgroup (GATHER_WARPS): every K/V tile of this program's work items into the ring
    by cp.async pointer gathers, in order (`tree_attention_gather`): each tile's row pages are
    loaded one tile ahead, before the wait for its ring slot, so no copy waits on a block-table
    load but the first of each item; rows past S_b land as zeros."""
    m_tiles, num_splits, tiles_per_split, qk_scale, n_items = prm
    (Q, BT, CTX_LENS, QO, MASK, BIAS, O, LSE, O_PART, LSE_PART, K, V,
     stride_qt, stride_qh, stride_bt, stride_mw, stride_bias, stride_ps) = ptrs
    q_smem, k_bufs, v_bufs, k_ready, v_ready, kv_empty, fix_bar = smem
    layout: gl.constexpr = gather_layout(D)
    it = 0                                      # ring position, across work items
    for item in range(gl.program_id(0), n_items, gl.num_programs(0)):
        b, kh, split, L, S, qo, T, t_lo, t_hi, t_ctx, m0 = _work_item(
            item, CTX_LENS, QO, m_tiles, num_splits, tiles_per_split, HKV, G, BLOCK_N, NUM_WG)
        bt_row = BT + b.to(gl.int64) * stride_bt
        last = gl.maximum(S - 1, 0) // P        # the request's last page (past it: that page again)
        pages = tile_pages(bt_row, t_lo, last, P, BLOCK_N, layout)
        for t in range(t_lo, t_hi):
            nxt = tile_pages(bt_row, t + 1, last, P, BLOCK_N, layout)   # one tile ahead
            st = it % STAGES
            mbarrier.wait(kv_empty.index(st), ((it // STAGES) & 1) ^ 1)   # a fresh barrier passes phase 1
            gather_tile(k_bufs.index(st), v_bufs.index(st), k_ready.index(st), v_ready.index(st), K, V, pages, t, S,
                        kh, HKV, D, P, BLOCK_N, layout)
            pages = nxt
            it += 1


@gluon.jit
def ws_converter(prm, ptrs, smem, ring8, HKV: gl.constexpr, G: gl.constexpr, BLOCK_N: gl.constexpr,
                  D: gl.constexpr, STAGES: gl.constexpr, F8_STAGES: gl.constexpr, NUM_WG: gl.constexpr,
                  FENCES: gl.constexpr, SIDE: gl.constexpr = 0):
    """One warpgroup, fp8 pools only: every tile the producer lands in the fp8 ring (ring8),
    in the producer's order, into the consumers' ring (smem) in the MMA dtype, V rows past
    S_b as zeros. SIDE 0: both tiles (`tree_attention_ws_fp8.convert_kv_tile`, FENCES
    fence-barrier pairs per tile); 1 / 2: the K / V tile only, beside a second converter
    warpgroup taking the other (`convert_one_tile`)."""
    m_tiles, num_splits, tiles_per_split, qk_scale, n_items = prm
    (Q, BT, CTX_LENS, QO, MASK, BIAS, O, LSE, O_PART, LSE_PART, K_DESC, V_DESC,
     stride_qt, stride_qh, stride_bt, stride_mw, stride_bias, stride_ps) = ptrs
    q_smem, k_bufs, v_bufs, k_ready, v_ready, kv_empty, fix_bar = smem
    k8_bufs, v8_bufs, k8_ready, v8_ready, kv8_empty = ring8
    it = 0                                      # ring position, across work items (both rings)
    for item in range(gl.program_id(0), n_items, gl.num_programs(0)):
        b, kh, split, L, S, qo, T, t_lo, t_hi, t_ctx, m0 = _work_item(
            item, CTX_LENS, QO, m_tiles, num_splits, tiles_per_split, HKV, G, BLOCK_N, NUM_WG)
        for t in range(t_lo, t_hi):
            if SIDE == 0:
                convert_kv_tile(ring8, k_bufs, v_bufs, k_ready, v_ready, kv_empty, it, S - t * BLOCK_N, STAGES,
                                F8_STAGES, BLOCK_N, D, FENCES)
            elif SIDE == 1:
                convert_one_tile(k8_bufs, k8_ready, kv8_empty, k_bufs, k_ready, kv_empty, it, S - t * BLOCK_N,
                                 STAGES, F8_STAGES, BLOCK_N, D, False)
            else:
                convert_one_tile(v8_bufs, v8_ready, kv8_empty, v_bufs, v_ready, kv_empty, it, S - t * BLOCK_N,
                                 STAGES, F8_STAGES, BLOCK_N, D, True)
            it += 1


@gluon.jit
def producer(prm, ptrs, smem, WG: gl.constexpr, HKV: gl.constexpr, G: gl.constexpr, D: gl.constexpr,
              P: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, MASK_MODE: gl.constexpr,
              SPLIT: gl.constexpr, WRITE_LSE: gl.constexpr, PIPE: gl.constexpr, NUM_WG: gl.constexpr,
              GATHER: gl.constexpr):
    """The producer partition: `_gather_producer` with GATHER, else `ws_producer` (TMA)."""
    if GATHER:
        _gather_producer(prm, ptrs, smem, HKV, G, D, P, BLOCK_N, STAGES, NUM_WG)
    else:
        ws_producer(prm, ptrs, smem, WG, HKV, G, D, P, BLOCK_N, STAGES, MASK_MODE, SPLIT, WRITE_LSE, PIPE, NUM_WG)


@gluon.jit
def _tma_tile(desc, pages, lane, sel, t, kh, bar, buf, P: gl.constexpr, BLOCK_N: gl.constexpr, D: gl.constexpr):
    """KV tile t of a (request, KV head) into `buf` (BLOCK_N, D) by TMA, arriving on `bar`: one
    box when a tile lies in one page (pages[sel] is its page); else one P-row box per page
    (pages[sel + i], i < BLOCK_N // P), each into its rows of buf."""
    if P < BLOCK_N:
        for i in gl.static_range(BLOCK_N // P):
            page = gl.sum(gl.where(lane == sel + i, pages, 0), axis=0)
            _tma_load(desc, [page * P, kh * D], bar, buf.slice(i * P, P))
    else:
        page = gl.sum(gl.where(lane == sel, pages, 0), axis=0)
        _tma_load(desc, [page * P + (t * BLOCK_N) % P, kh * D], bar, buf)
