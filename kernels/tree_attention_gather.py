"""cp.async page gathers of K/V tiles for the warp-specialised kernel (`tree_attention_ws`).

Where TMA cannot read a pool tile by tile (P neither a multiple of BLOCK_N nor a
multiple of 16 that divides it: P 1, 3, 8, 24, 40, 48, 96 with 64-token tiles), the
producer warpgroup of the warp-specialised kernel (with its GATHER) copies each tile
row by row with cp.async (16-byte copies, the LDGSTS of sm_80+): token row pos of a
request reads page block_table[b, pos // P], slot pos % P, the page index clamped to
the request's last page (S_b - 1) // P, so every block-table read stays inside the
request's row. Rows past S_b are copied with their mask off, which cp.async turns into
zero-fill: no unused pool slot (NaN in the harness's pools) is read and no V row needs
zeroing afterwards.

Completion is signalled per thread: after a tile's copies each producer thread issues
`cp.async.mbarrier.arrive.noinc` on the tile's ready barrier, which the hardware
performs once that thread's earlier copies have landed, so the ready barriers count
one arrival per producer thread (`GATHER_THREADS`) and the producer never waits for
its own copies. cp.async writes shared memory through the generic proxy and wgmma reads
it through the async proxy: a consumer issues a proxy fence (fence.proxy.async) after
its ready wait and before its wgmma reads the tile (`tree_attention_ws._wait_landed`).

Only for sm_90 GPUs with Gluon's Hopper API (Triton 3.6 to 3.9).
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy

# cp.async global -> shared: `async_copy_global_to_shared` in Triton 3.6, `async_load` in 3.9.
_cp_async = getattr(async_copy, "async_load", None) or async_copy.async_copy_global_to_shared
GATHER_WARPS = gl.constexpr(4)      # the producer partition with GATHER: one warpgroup
GATHER_THREADS = gl.constexpr(128)  # arrivals per phase of a ready barrier with GATHER (one per producer thread)


@gluon.constexpr_function
def gather_layout(d):
    """Blocked layout of a (BLOCK_N, d) tile over the 4 producer warps, 16-byte vectors
    along d (8 bf16 / fp16 values per thread and row): at d 128 a warp covers 2 rows, the
    warpgroup 8, so each thread copies BLOCK_N / 8 row pieces per tile."""
    tpw_d = d // 8 if d < 256 else 32
    return gl.BlockedLayout([1, 8], [32 // tpw_d, tpw_d], [4, 1], [1, 0])


@gluon.jit
def tile_pages(bt_row, t, last, P: gl.constexpr, BLOCK_N: gl.constexpr, layout: gl.constexpr):
    """Physical page of each row of KV tile t: (BLOCK_N,) int32 in SliceLayout(1, layout),
    block_table[b, min((t * BLOCK_N + r) // P, last)] (bt_row: request b's block-table row;
    last: its last page). Rows sharing a page load one address (a broadcast, no extra traffic)."""
    r = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, layout))
    return gl.load(bt_row + gl.minimum((t * BLOCK_N + r) // P, last))


@gluon.jit
def gather_tile(k_buf, v_buf, k_bar, v_bar, K, V, pages, t, S, kh, HKV: gl.constexpr, D: gl.constexpr,
                P: gl.constexpr, BLOCK_N: gl.constexpr, layout: gl.constexpr):
    """KV tile t of a (request with S_b = S, KV head kh) into k_buf / v_buf (BLOCK_N, D) by
    cp.async, one 16-byte copy per thread and 8 columns, rows past S zero-filled; then each
    thread's `cp.async.mbarrier.arrive.noinc` on k_bar (after its K copies) and v_bar (after
    its V copies), so each barrier completes its phase once all GATHER_THREADS threads' copies
    have landed. K / V: the (N, P, HKV, D) pools, contiguous; pages: `tile_pages` of tile t."""
    r = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, layout))
    d = gl.arange(0, D, layout=gl.SliceLayout(0, layout))
    pos = t * BLOCK_N + r
    row = (pages.to(gl.int64) * P + pos % P) * (HKV * D) + kh * D       # (BLOCK_N,) element offsets
    off = gl.expand_dims(row, 1) + gl.expand_dims(d, 0)                  # (BLOCK_N, D)
    ok = gl.expand_dims(pos < S, 1)
    _cp_async(k_buf, K + off, mask=ok)
    async_copy.mbarrier_arrive(k_bar, increment_count=False)
    _cp_async(v_buf, V + off, mask=ok)
    async_copy.mbarrier_arrive(v_bar, increment_count=False)
