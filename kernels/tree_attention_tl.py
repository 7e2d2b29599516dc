"""Triton tree attention over a paged KV cache: the tl forward kernel (Triton's tile language;
every GPU and the CPU interpreter). `tree_attention.TreeAttention` launches it.

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

Pages: any P >= 1. When P % BLOCK_N == 0 a tile lies inside one page (one
block-table load, contiguous rows); otherwise each token looks up its own page
(with PAGE_GATHER and BLOCK_N % P == 0, each of the tile's pages once). With
KV_DESC the context tiles of such pages are loaded by TMA (one descriptor box
of BLOCK_N tokens x D per tile, the pools viewed as (N * P, HKV * D)). With
BT_AHEAD the block-table entries of each context tile are loaded one tile
before its K/V, so the TMA issue (run 5: 240 -> 198 us for the 27-node tree
at B 64) or the pointer loads' addresses (P 16: 3-14% faster, run 6) do not
wait on them (docs/kernel.md). The masked tail tiles keep pointer loads:
their columns past S_b must read as zeros, not as the pool's NaN slots.
With split-KV the merge kernel is a programmatic dependent launch (PDL) where
the device allows it.

Short contexts have a smaller build (less code to fetch cold after an L2
flush): ONE_TILE, for one split with every S_b <= BLOCK_N, drops both loops:
tile 0 is loaded once and its softmax is a plain one (row max, exp2, sum; no
rescale of a running state).

fp8 pools (float8_e4m3fn, float8_e5m2, per-tensor scales): every K/V tile is
converted right after its load and the MMAs run in Q's dtype (FP8_PATH 0, the
cast) or in fp16 (1: the codes' bits moved into fp16; 2: the cast to fp16, Q
rounded to fp16 once); with FP8_PATH 4 (e4m3 pools, bf16 queries) K's codes go straight into
fp8 MMAs against Q split into two e4m3 terms (`_split_q`) and only V is converted (to fp16);
k_scale is folded into the score scale, v_scale into the final normalisation.
No path reads an unused slot (the fp8 NaN code in the harness): the masked
loads stop at S_b.
"""

from __future__ import annotations

import triton
import triton.language as tl

from treebench.kernels.tree_attention_ops import mma as _dot
from treebench.kernels.tree_attention_reduce import gdc_launch_dependents, merge_partials

MASK_BITS, MASK_BIAS, MASK_CAUSAL = 0, 1, 2
LOG2E = 1.4426950408889634  # log2(e): exp(x) == exp2(x * LOG2E)


@triton.jit
def _fp8_bits_to_fp16(x):
    """fp8 codes x (float8_e4m3fn or float8_e5m2, any shape) as fp16 by integer bit
    manipulation. e5m2 has fp16's exponent bias: the code shifted left by 8 is its fp16 value.
    e4m3fn (bias 7): sign to bit 15, exponent and mantissa to bits 7-13 give value * 2^-8
    (denormal codes too, as fp16 denormals), then one multiply by 256, exact since every
    finite code's value is a normal fp16 value. Exact for every finite code; a NaN (or e5m2
    inf) code may become some other value, which the kernel allows only because no load
    reads an unused pool slot (the masked loads stop at S_b, the context loops read valid
    slots only)."""
    c = x.to(tl.uint8, bitcast=True).to(tl.uint16)            # zero-extended code
    if x.dtype == tl.float8e5:                                # s eeeee mm
        y = (c << 8).to(tl.float16, bitcast=True)
    else:                                                     # s eeee mmm
        y = (((c & 0x80) << 8) | ((c & 0x7F) << 7)).to(tl.float16, bitcast=True) * 256.0
    return y.to(tl.float16)


@triton.jit
def _fp8_cvt_to_fp16(x):
    """fp8 codes x as fp16 by the hardware's paired conversion (cvt.rn.f16x2.e4m3x2 /
    e5m2x2, four codes per instance), as inline PTX marked impure so the compiler keeps it
    next to the load: the tile then reaches shared memory in fp16 and the MMA operands are
    read by ldmatrix (a pure conversion is moved past the shared-memory round trip)."""
    if x.dtype == tl.float8e5:
        y = tl.inline_asm_elementwise(
            "{ .reg .b16 lo, hi; mov.b32 {lo, hi}, $2; cvt.rn.f16x2.e5m2x2 $0, lo; cvt.rn.f16x2.e5m2x2 $1, hi; }",
            "=r,=r,r", [x.to(tl.uint8, bitcast=True)], dtype=tl.float16, is_pure=False, pack=4)
    else:
        y = tl.inline_asm_elementwise(
            "{ .reg .b16 lo, hi; mov.b32 {lo, hi}, $2; cvt.rn.f16x2.e4m3x2 $0, lo; cvt.rn.f16x2.e4m3x2 $1, hi; }",
            "=r,=r,r", [x.to(tl.uint8, bitcast=True)], dtype=tl.float16, is_pure=False, pack=4)
    return y


@triton.jit
def _kv_operand(x, dtype: tl.constexpr, FP8_PATH: tl.constexpr):
    """A loaded K/V tile (BLOCK_N, D) as an MMA operand in `dtype` (bf16 / fp16).
    FP8_PATH 0, 2 and 4: `.to(dtype)`. 1: fp8 codes converted to fp16 by bit manipulation
    (`_fp8_bits_to_fp16`); 3: by the hardware's paired conversion (`_fp8_cvt_to_fp16`); with
    FP8_PATH 1-4, dtype is fp16 for an fp8 pool."""
    if FP8_PATH == 1 and x.dtype.is_fp8():
        y = _fp8_bits_to_fp16(x)
    elif FP8_PATH == 3 and x.dtype.is_fp8():
        y = _fp8_cvt_to_fp16(x)
    else:
        y = x.to(dtype)
    return y


@triton.jit
def _e4m3_part(x):
    """The part of fp32 x (any shape) that e4m3 holds exactly, as fp32: x's top 4 significant
    bits (its mantissa cut to 3 bits) where |x| >= 2^-6 (e4m3's smallest normal), else x cut
    to a multiple of 2^-9 (its subnormals' spacing), towards zero. x - part is exact in fp32,
    and the later cast to e4m3 has nothing to round (the CPU interpreter rounds some values
    wrongly)."""
    top = (x.to(tl.uint32, bitcast=True) & 0xFFF00000).to(tl.float32, bitcast=True)
    return tl.where(tl.abs(x) >= 0.015625, top, (x * 512.0).to(tl.int32).to(tl.float32) * (1.0 / 512.0))


@triton.jit
def _split_q(q):
    """A bf16 query tile q (BLOCK_M, D) as two float8_e4m3fn terms for fp8 MMAs against K's codes:
    (hi, lo, row_scale (BLOCK_M,) fp32) with hi + lo within 2^-9 of q / row_scale. Each row is
    first divided by the power of 2 that brings its largest |q| into (128, 256] (e4m3's largest
    finite value is 448); hi holds each element's top 4 significant bits and lo the rest, both
    exact in e4m3 (`_e4m3_part`). Exact for every element within 2^-9 of its row's largest |q|
    (bf16 has 8 significant bits, each term 4); any other element is off by less than 2^-16 of
    the row's largest |q|. A zero row stays zero."""
    qf = q.to(tl.float32)
    amax = tl.max(tl.abs(qf), 1)                                      # (BLOCK_M,)
    e = tl.ceil(tl.log2(tl.maximum(amax, 1e-30) * (1.0 / 256.0)))     # amax * 2^-e in (128, 256]
    xs = qf * tl.exp2(-e)[:, None]                                    # exact: a power of 2
    hi = _e4m3_part(xs)
    lo = _e4m3_part(xs - hi)
    return hi.to(tl.float8e4nv), lo.to(tl.float8e4nv), tl.exp2(e)


@triton.jit
def _scores(q, q_lo, k, DOT_FP32: tl.constexpr, FP8_PATH: tl.constexpr):
    """Raw scores q k^T (BLOCK_M, BLOCK_N) fp32 of a K tile k (BLOCK_N, D). FP8_PATH 4 ("split"):
    q and q_lo are `_split_q`'s e4m3 terms and k holds the pool's e4m3 codes, two fp8 MMAs
    (the same tensor-core time as one 16-bit MMA) and no conversion of K; otherwise one MMA
    in q's dtype (q_lo unused)."""
    if FP8_PATH == 4:
        s = _dot(q_lo, tl.trans(k), _dot(q, tl.trans(k), None, DOT_FP32), DOT_FP32)
    else:
        s = _dot(q, tl.trans(k), None, DOT_FP32)
    return s


@triton.jit
def _k_operand(x, dtype: tl.constexpr, FP8_PATH: tl.constexpr):
    """A loaded K tile as `_scores` takes it: the codes themselves with FP8_PATH 4, else
    `_kv_operand`'s conversion."""
    if FP8_PATH == 4:
        y = x
    else:
        y = _kv_operand(x, dtype, FP8_PATH)
    return y


@triton.jit
def _kv_tile_offsets(BT, b, start, bt_width, stride_bt, stride_kn, stride_kp,
                     P: tl.constexpr, BLOCK_N: tl.constexpr, PAGE_TILE: tl.constexpr, PAGE_GATHER: tl.constexpr):
    """Element offsets (BLOCK_N,) int64 of tokens [start, start + BLOCK_N) of
    request b into the pool, through block_table: [b, logical_page] -> physical_page.
    Every block-table read is clamped into the request's row (bt_width columns), so it
    needs no load of S_b; tokens past S_b get some in-bounds page's offset (or, past
    the row, the row's last page) and the caller masks their loads.

    PAGE_TILE (P % BLOCK_N == 0): one block-table load for the tile. Otherwise
    PAGE_GATHER (P < BLOCK_N, BLOCK_N % P == 0): one load per page, the tile's
    BLOCK_N // P pages as a vector, each page's P rows contiguous; else one lookup per
    token (any P, e.g. 1, 3, 24)."""
    row = BT + b * stride_bt
    if PAGE_TILE:  # the tile lies inside one page: one block-table load
        phys = tl.load(row + tl.minimum(start // P, bt_width - 1)).to(tl.int64)
        offs = phys * stride_kn + ((start % P) + tl.arange(0, BLOCK_N)) * stride_kp
    elif PAGE_GATHER:  # BLOCK_N // P whole pages (start is a multiple of BLOCK_N, so of P)
        NP: tl.constexpr = BLOCK_N // P
        phys = tl.load(row + tl.minimum(start // P + tl.arange(0, NP), bt_width - 1)).to(tl.int64)   # (NP,)
        offs2 = phys[:, None] * stride_kn + tl.arange(0, P)[None, :] * stride_kp                  # (NP, P)
        offs = tl.reshape(offs2, (BLOCK_N,))
    else:
        page = tl.minimum((start + tl.arange(0, BLOCK_N)) // P, bt_width - 1)    # (BLOCK_N,) logical pages
        phys = tl.load(row + page).to(tl.int64)
        offs = phys * stride_kn + ((start + tl.arange(0, BLOCK_N)) % P) * stride_kp
    return offs


@triton.jit
def _window_words(MASK, row_tok, row_ok, n0, L, stride_mw):
    """The bitmask's allowed columns [n0, n0 + 64) of a tile, as (lo, hi): two (BLOCK_M,) int32
    vectors in row_tok's layout (bits 0-31 and 32-63 of one 64-bit word per row). MASK holds
    `pack_tree_masks`'s int64 words, stride_mw of them per token row; n0 and L are scalars
    (tokens). Bit c of a row's word is set iff column n0 + c is
    context (< L) or a tree node the row's node sees. Bits of nodes past T_b are 0 in
    `pack_tree_masks`'s words, a word past the row's last loads 0, and a row past T_b * G
    loads 0 (context only). Row-wide work only: two word loads and a few shifts (the
    warp-specialised kernel's `_mask_words`)."""
    n_ctx = tl.minimum(tl.maximum(L - n0, 0), 64)               # context columns: bits [0, n_ctx)
    jb = tl.maximum(n0 - L, 0)                                  # tree node of bit n_ctx
    wa = jb // 64
    sh = (jb % 64).to(tl.uint64)
    row_words = MASK + row_tok.to(tl.int64) * stride_mw
    # (a where, not row_ok & scalar: the CPU interpreter refuses that mask's dtype)
    lo_word = tl.load(row_words + tl.minimum(wa, stride_mw - 1), mask=tl.where(wa < stride_mw, row_ok, False), other=0)
    hi_word = tl.load(row_words + tl.minimum(wa + 1, stride_mw - 1), mask=tl.where(wa + 1 < stride_mw, row_ok, False),
                      other=0)
    lo_word = lo_word.to(tl.uint64, bitcast=True)               # unsigned: logical shifts
    hi_word = hi_word.to(tl.uint64, bitcast=True)
    window = (lo_word >> sh) | tl.where(sh > 0, hi_word << ((64 - sh) % 64), 0)   # nodes jb, jb + 1, ...
    one = window * 0 + 1
    ctx_bits = tl.where(n_ctx >= 64, ~(one * 0), (one << (n_ctx % 64).to(tl.uint64)) - 1)
    word = ctx_bits | (window << (n_ctx % 64).to(tl.uint64))
    lo = word.to(tl.uint32).to(tl.int32, bitcast=True)
    hi = (word >> 32).to(tl.uint32).to(tl.int32, bitcast=True)
    return lo, hi


@triton.jit
def _tree_allowed(MASK, BIAS, row_tok, node, row_ok, offs_n, n0, L, T, stride_mw, stride_bias,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, MASK_MODE: tl.constexpr):
    """(allowed (BLOCK_M, BLOCK_N) bool, additive bias in log2 units or 0.0) for
    columns offs_n = n0 + [0, BLOCK_N) of a tile overlapping [L, L + T); row_tok = qo_b + node."""
    if MASK_MODE == 0:
        # Per row, one 64-bit window of mask bits per 64 columns (`_window_words`, context bits
        # folded in); per score one 32-bit shift and test, and a select per further 32 columns
        # (docs/kernel.md, "Masks").
        c = tl.arange(0, BLOCK_N)
        lo, hi = _window_words(MASK, row_tok, row_ok, n0, L, stride_mw)
        half = tl.broadcast_to(lo[:, None], (BLOCK_M, BLOCK_N))
        if BLOCK_N > 32:
            half = tl.where((c // 32 == 1)[None, :], hi[:, None], half)
        for k in tl.static_range(1, (BLOCK_N + 63) // 64):
            lo_k, hi_k = _window_words(MASK, row_tok, row_ok, n0 + 64 * k, L, stride_mw)
            half = tl.where((c // 32 == 2 * k)[None, :], lo_k[:, None], half)
            half = tl.where((c // 32 == 2 * k + 1)[None, :], hi_k[:, None], half)
        allowed = ((half >> (c % 32)[None, :]) & 1) != 0
        bias = 0.0
    else:
        j = offs_n - L                                      # (BLOCK_N,) tree index of the column
        in_tree = (j >= 0) & (j < T)
        jj = tl.maximum(j, 0)
        ctx = (offs_n < L)[None, :]
        both = row_ok[:, None] & in_tree[None, :]
        if MASK_MODE == 1:
            bptr = BIAS + node[:, None] * stride_bias + jj[None, :]
            allowed = ctx | both
            bias = tl.load(bptr, mask=both, other=0.0) * 1.4426950408889634   # (BLOCK_M, BLOCK_N) fp32, log2 units
        else:
            allowed = ctx | (both & (jj[None, :] <= node[:, None]))
            bias = 0.0
    return allowed, bias


@triton.jit
def _masked_tile(q, q_lo, K_h, V_h, kv, offs_d, valid, MASK, BIAS, row_tok, node, row_ok, offs_n, n0, L, T, qk_2d,
                 dtype: tl.constexpr, stride_mw, stride_bias, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 MASK_MODE: tl.constexpr, DOT_FP32: tl.constexpr, FP8_PATH: tl.constexpr):
    """(scores (BLOCK_M, BLOCK_N) fp32 in log2 units, -inf where masked; V (BLOCK_N, D) in the
    MMA dtype `dtype`) of a tile overlapping [L, L + T) at pool offsets kv; its K/V rows where not
    valid (past S_b) are loaded as zeros, never read from the pool."""
    k = _k_operand(tl.load(K_h + kv[:, None] + offs_d[None, :], mask=valid[:, None], other=0.0), dtype,
                   FP8_PATH)
    v = _kv_operand(tl.load(V_h + kv[:, None] + offs_d[None, :], mask=valid[:, None], other=0.0), dtype,
                    FP8_PATH)
    allowed, bias = _tree_allowed(MASK, BIAS, row_tok, node, row_ok, offs_n, n0, L, T, stride_mw,
                                  stride_bias, BLOCK_M, BLOCK_N, MASK_MODE)
    s = _scores(q, q_lo, k, DOT_FP32, FP8_PATH) * qk_2d + bias
    return tl.where(allowed, s, float("-inf")), v


# Integer arguments that vary from batch to batch are not specialised (Triton
# would otherwise compile a new kernel when one of them is 1 or a multiple of 16).
@triton.jit(do_not_specialize=["stride_bt", "stride_mw", "stride_bias", "stride_ps", "m_tiles", "num_splits",
                               "tiles_per_split", "bt_width"])
def tree_attn_fwd_kernel(
    Q, K, V, BT, CTX_LENS, QO, MASK, BIAS, O, LSE, O_PART, LSE_PART, SEM,
    K_DESC, V_DESC,                             # TMA descriptors of the pools as (N * P, HKV * D), or None
    qk_scale, v_scale,                          # sm_scale * k_scale * log2(e); v_scale (fp8 pools; else 1.0), fp32
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
    PAGE_GATHER: tl.constexpr = False, EARLY_FIRST: tl.constexpr = False, FP8_PATH: tl.constexpr = 0,
    Q_ROW_SCALE: tl.constexpr = False, ONE_TILE: tl.constexpr = False, TOKEN_PAGES: tl.constexpr = False,
):
    """Grid: (B * HKV * num_splits * m_tiles,), M-tile fastest so the M-tiles that
    share a KV stream run together (their re-reads hit L2). SPLIT: num_splits > 1.
    FUSED_MERGE: the last split program of each (request, KV head, M-tile) merges the
    partials (counted in SEM, (B * HKV * m_tiles,) int32, zero between launches);
    otherwise tree_attn_merge_kernel does, in a second launch (with PDL, launched as a
    programmatic dependent launch once every program has passed its main loops). KV_DESC: context
    tiles through K_DESC / V_DESC (needs P % BLOCK_N == 0); BT_AHEAD: each context
    tile's block-table entries loaded one tile ahead (the TMA page, or on the
    pointer-load paths the tile's K/V offsets, loop-carried). PAGE_GATHER: a tile that
    spans several whole pages (BLOCK_N % P == 0) reads one block-table entry per page,
    not per token. EARLY_FIRST (pointer paths): the split's first tile's offsets are
    loaded with the request's lengths, before the early exit, so a one-tile call (L_b
    near 0) waits on two dependent loads, not three.

    K and V may be fp8 codes (float8_e4m3fn / float8_e5m2): each tile is converted after
    its load (FP8_PATH, `_kv_operand`: 0 to Q's dtype, 1 and 2 to fp16 with Q cast to
    fp16 too); k_scale is folded into qk_scale and v_scale multiplies the
    normalised output (a code c means c * scale). FP8_PATH 4 (float8_e4m3fn K, bf16 Q): Q K^T
    as two e4m3 MMAs, Q's terms from `_split_q` (each row's power of 2 folded into its score
    scale), K's codes unconverted; V cast to fp16, P V in fp16. Q_ROW_SCALE (FP8_PATH 1 or 2 with bf16
    Q): each row of Q is divided by the power of 2 that brings its largest |q| to at most
    32768 before the cast to fp16 (1 for every |q| <= 32768), and that row's raw scores
    are multiplied by it, so no bf16 query overflows fp16.

    TOKEN_PAGES (pointer paths, not with KV_DESC): each token's page is looked up even where a
    tile lies in one page (`KernelOptions.token_pages`).

    ONE_TILE, the short build (the caller guarantees one split and every S_b <= BLOCK_N; not
    with KV_DESC or BT_AHEAD, which serve the context loop it drops): no loop, tile 0 loaded
    once, masked at S_b, and a plain softmax (m = row max, p = exp2(s - m), l = sum p, acc = p V).

    Split s covers the request's tiles [s * tiles_per_split, (s + 1) * tiles_per_split):
    its first tile does not depend on a load, so (with BT_AHEAD and KV_DESC) its
    block-table entry is loaded in the same round trip as the request's context
    length, not after it.
    Splits past a short request's last tile see nothing (LSE -inf, weight 0 in the merge)."""
    tl.static_assert(not (ONE_TILE and (KV_DESC or BT_AHEAD or SPLIT)), "ONE_TILE: one split, no context loop")
    tl.static_assert(not (TOKEN_PAGES and KV_DESC), "TOKEN_PAGES: pointer loads")
    pid = tl.program_id(0)
    mt = pid % m_tiles
    split = (pid // m_tiles) % num_splits
    kh = (pid // (m_tiles * num_splits)) % HKV
    b = pid // (m_tiles * num_splits * HKV)
    t_lo = split * tiles_per_split
    bt_row = BT + b * stride_bt
    PAGE_TILE: tl.constexpr = P % BLOCK_N == 0 and not TOKEN_PAGES   # TOKEN_PAGES: each token's page looked up
    GATHER_PAGES: tl.constexpr = PAGE_GATHER and BLOCK_N % P == 0 and not PAGE_TILE
    if KV_DESC and BT_AHEAD:                    # the first tile's page (loop-carried), clamped into the row
        page_next = tl.load(bt_row + tl.minimum((t_lo * BLOCK_N) // P, bt_width - 1))
    if EARLY_FIRST and not KV_DESC:             # the split's first tile, before any length is known
        kv_first = _kv_tile_offsets(BT, b, t_lo * BLOCK_N, bt_width, stride_bt, stride_kn, stride_kp,
                                    P, BLOCK_N, PAGE_TILE, GATHER_PAGES)
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
    tl.static_assert(not (Q_ROW_SCALE and FP8_PATH == 4), "FP8_PATH 4 scales its rows itself")
    if Q_ROW_SCALE:                                          # bf16 Q into fp16's range, row by row
        qf = q.to(tl.float32)
        amax = tl.max(tl.abs(qf), 1)                         # (BLOCK_M,)
        # 2^e with e >= 0 the least power keeping the row's |q| <= 32768 (fp16's max is 65504;
        # log2's error cannot cost the factor of 2 to spare); e = 0 for every |q| <= 32768
        e = tl.maximum(tl.ceil(tl.log2(tl.maximum(amax, 1.0) * (1.0 / 32768.0))), 0.0)
        q = (qf * tl.exp2(-e)[:, None]).to(tl.float16)       # exact: a power of 2, then bf16 -> fp16
        row_scale = tl.exp2(e)                               # (BLOCK_M,): multiplies the row's raw scores
    elif FP8_PATH == 4:                                      # Q K^T in e4m3 (two terms of Q), P V in fp16
        q, q_lo, row_scale = _split_q(q)
    elif FP8_PATH != 0 and K.dtype.element_ty.is_fp8():     # the MMAs in fp16 (Q rounded once)
        q = q.to(tl.float16)
    if FP8_PATH != 4:
        q_lo = q                                             # unused by `_scores`
    dtype = tl.float16 if FP8_PATH == 4 else q.dtype         # the P V MMA's operands (and K's but with FP8_PATH 4)

    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    if Q_ROW_SCALE or FP8_PATH == 4:            # raw score -> log2 units: per row, the row's power of 2 folded in
        qk_row = qk_scale * row_scale                        # (BLOCK_M,)
        qk_2d = qk_row[:, None]
    else:                                       # one scalar for every row
        qk_row = qk_scale
        qk_2d = qk_scale
    acc = tl.zeros((BLOCK_M, D), tl.float32)
    K_h = K + kh * stride_kh
    V_h = V + kh * stride_kh

    # With BT_AHEAD, the page(s) of the next context tile are loaded one tile ahead of its
    # K/V loads (clamped into the split's context tiles, so they never leave the request's
    # row): the TMA issue, or the gathered loads' addresses, do not wait on them.
    last = tl.maximum(t_ctx - 1, 0)
    if BT_AHEAD and not KV_DESC:                # pointer paths: the next tile's K/V offsets (loop-carried)
        if EARLY_FIRST:                         # the first context tile is t_lo whenever the loop runs
            kv_next = kv_first
        else:
            kv_next = _kv_tile_offsets(BT, b, tl.minimum(t_lo, last) * BLOCK_N, bt_width, stride_bt, stride_kn,
                                       stride_kp, P, BLOCK_N, PAGE_TILE, GATHER_PAGES)
    if ONE_TILE:                                # one split, every S_b <= BLOCK_N: tile 0 alone
        offs_n = tl.arange(0, BLOCK_N)
        if EARLY_FIRST:
            kv = kv_first
        else:
            kv = _kv_tile_offsets(BT, b, 0, bt_width, stride_bt, stride_kn, stride_kp, P, BLOCK_N, PAGE_TILE,
                                  GATHER_PAGES)
        s, v = _masked_tile(q, q_lo, K_h, V_h, kv, offs_d, offs_n < S, MASK, BIAS, row_tok, node, row_ok, offs_n,
                            0, L, T, qk_2d, dtype, stride_mw, stride_bias, BLOCK_M, BLOCK_N, MASK_MODE, DOT_FP32,
                            FP8_PATH)
        m_i = tl.max(s, 1)                      # a plain softmax: no running max to rescale
        p = tl.exp2(s - tl.where(m_i == float("-inf"), 0.0, m_i)[:, None])
        l_i = tl.sum(p, 1)
        acc = _dot(p.to(dtype), v, None, DOT_FP32)
    else:
        for t in range(t_lo, t_ctx):                # 1) context tiles: no mask
            if KV_DESC:                              # one TMA box per tile (P % BLOCK_N == 0)
                start = t * BLOCK_N
                if BT_AHEAD:
                    page = page_next
                    page_next = tl.load(bt_row + (tl.minimum(t + 1, last) * BLOCK_N) // P)
                else:
                    page = tl.load(bt_row + start // P)
                row0 = page * P + start % P
                k = _k_operand(K_DESC.load([row0, kh * D]), dtype, FP8_PATH)    # (BLOCK_N, D) MMA operand
                v = _kv_operand(V_DESC.load([row0, kh * D]), dtype, FP8_PATH)
            else:
                if BT_AHEAD:
                    kv = kv_next
                    kv_next = _kv_tile_offsets(BT, b, tl.minimum(t + 1, last) * BLOCK_N, bt_width, stride_bt,
                                               stride_kn, stride_kp, P, BLOCK_N, PAGE_TILE, GATHER_PAGES)
                else:
                    kv = _kv_tile_offsets(BT, b, t * BLOCK_N, bt_width, stride_bt, stride_kn, stride_kp, P, BLOCK_N,
                                          PAGE_TILE, GATHER_PAGES)
                k = _k_operand(tl.load(K_h + kv[:, None] + offs_d[None, :]), dtype, FP8_PATH)     # (BLOCK_N, D)
                v = _kv_operand(tl.load(V_h + kv[:, None] + offs_d[None, :]), dtype, FP8_PATH)
            s = _scores(q, q_lo, k, DOT_FP32, FP8_PATH)           # (BLOCK_M, BLOCK_N) raw scores
            m_new = tl.maximum(m_i, tl.max(s, 1) * qk_row)        # log2 units
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(s * qk_2d - m_new[:, None])               # one FFMA per score
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = _dot(p.to(dtype), v, acc * alpha[:, None], DOT_FP32)   # the MMA accumulates in place
            m_i = m_new

        for t in range(tl.maximum(t_lo, t_ctx), t_hi):  # 2) tiles overlapping [L, S): masked
            offs_n = t * BLOCK_N + tl.arange(0, BLOCK_N)
            valid = offs_n < S
            if EARLY_FIRST and not KV_DESC:
                if t == t_lo:                       # the split's first tile: its offsets were loaded early
                    kv = kv_first
                else:
                    kv = _kv_tile_offsets(BT, b, t * BLOCK_N, bt_width, stride_bt, stride_kn, stride_kp, P, BLOCK_N,
                                          PAGE_TILE, GATHER_PAGES)
            else:
                kv = _kv_tile_offsets(BT, b, t * BLOCK_N, bt_width, stride_bt, stride_kn, stride_kp, P, BLOCK_N,
                                      PAGE_TILE, GATHER_PAGES)
            s, v = _masked_tile(q, q_lo, K_h, V_h, kv, offs_d, valid, MASK, BIAS, row_tok, node, row_ok, offs_n,
                                t * BLOCK_N, L, T, qk_2d, dtype, stride_mw, stride_bias, BLOCK_M, BLOCK_N, MASK_MODE,
                                DOT_FP32, FP8_PATH)
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
    out = acc * (v_scale / tl.where(seen, l_i, 1.0))[:, None]    # v_scale: fp8 V codes (1.0 otherwise)
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
