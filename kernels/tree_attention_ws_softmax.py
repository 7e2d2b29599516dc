"""The consumer side's tree mask and online softmax of the warp-specialised kernel
(`tree_attention_ws.tree_attn_ws_kernel`), per (64, BLOCK_N) tile of one consumer warpgroup.

- `next_words`, `tile_mask`: the mask of a tile overlapping [L_b, S_b). With the bitmask
  (MASK_MODE 0; MASK (sum T_b, ceil(max T_b / 64)) int64 words) each row's allowed columns
  are one 64-bit word, held as a (lo, hi) pair of (64,) int32 (bits 0-31, 32-63; BLOCK_N <= 64),
  loaded one tile ahead (`_mask_words`) and tested one bit per score (`_word_allowed`);
  with the shared bias (MASK_MODE 1; BIAS (T, T) fp32, converted to log2 units) or causal
  (MASK_MODE 2) the mask is computed per score (`_tree_allowed_ws`). Either way the tile's
  mask is (allowed (64, BLOCK_N) bool, bias fp32 in log2 units or 0.0). mctx is the rows'
  mask context: (MASK, BIAS, row_tok, node, row_ok, L, T, stride_mw, stride_bias), the rows'
  token index, tree node and row < T_b * G as (64,) int32 / bool.
- `softmax_tile`: the online softmax (FlashAttention-2, fp32, exp2) of one raw Q K^T tile
  s (64, BLOCK_N) fp32 in the wgmma accumulator layout, with the running max m_i and sum l_i
  (64,) fp32 in its row layout, all in log2 units (the scores times qk_scale = sm_scale *
  k_scale * log2(e)); returns p (64, BLOCK_N) fp32 and alpha, the factor of the old accumulator.
- `rescale`: the (64, D) fp32 accumulator times alpha per row, skipped warp by warp where all
  of a warp's alphas are 1 (inline PTX, `_rescale_asm`).

Unmasked tiles rescale lazily, FlashAttention-4's conditional rescaling (as described in
Modal's "We reverse-engineered Flash Attention 4", 2025): the running max moves only when a
tile's row max passes it by more than RESCALE_THRESHOLD (8, log2 units), so p stays <= 2^8,
alpha is exactly 1 on most tiles and `rescale` skips the multiply; the output divides by l
in the same units, so the result is the same softmax.

Only for sm_90 GPUs with Gluon's Hopper API (Triton 3.6 to 3.9).
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl


@gluon.jit
def _mask_words(MASK, row_tok, row_ok, n0, L, stride_mw, BLOCK_N: gl.constexpr):
    """The bitmask's allowed columns of KV tile [n0, n0 + BLOCK_N), which overlaps [L, L + T):
    per row (row_tok, row_ok in one row layout), bit c of the returned (lo, hi) int32 pair
    (bits 0-31, 32-63 of one 64-bit word) is set iff column n0 + c is context (< L) or a
    tree node the row's node sees. Bits of nodes past T_b are 0 in `pack_tree_masks`'s
    words, and a row past T_b * G loads 0 (context only). Only row-wide work: two word
    loads and a few shifts, issued before the tile's Q K^T wait so that their latency
    hides behind the MMA."""
    gl.static_assert(BLOCK_N <= 64, "one 64-bit word of mask bits per tile")
    n_ctx = gl.minimum(gl.maximum(L - n0, 0), BLOCK_N)           # context columns: bits [0, n_ctx)
    jb = gl.maximum(n0 - L, 0)                                   # tree node of bit n_ctx
    wa = jb // 64
    sh = (jb % 64).to(gl.uint64)
    row_words = MASK + row_tok.to(gl.int64) * stride_mw
    lo_word = gl.load(row_words + gl.minimum(wa, stride_mw - 1), mask=row_ok, other=0)
    hi_word = gl.load(row_words + gl.minimum(wa + 1, stride_mw - 1), mask=row_ok & (wa + 1 < stride_mw), other=0)
    lo_word = lo_word.to(gl.uint64, bitcast=True)                # unsigned: logical shifts
    hi_word = hi_word.to(gl.uint64, bitcast=True)
    window = (lo_word >> sh) | gl.where(sh > 0, hi_word << ((64 - sh) % 64), 0)   # nodes jb, jb + 1, ...
    one = gl.full_like(window, 1)
    ctx_bits = gl.where(n_ctx >= 64, ~(one * 0), (one << (n_ctx % 64).to(gl.uint64)) - 1)
    word = ctx_bits | (window << (n_ctx % 64).to(gl.uint64))
    lo = word.to(gl.uint32).to(gl.int32, bitcast=True)
    hi = (word >> 32).to(gl.uint32).to(gl.int32, bitcast=True)
    return lo, hi


@gluon.jit
def _word_allowed(lo, hi, BLOCK_N: gl.constexpr, s_layout: gl.constexpr):
    """(64, BLOCK_N) bool in s_layout: bit c of row r's (lo, hi) words (`_mask_words`);
    per element one select, one shift and one test."""
    c = gl.expand_dims(gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout)), 0)
    half = gl.expand_dims(lo, 1)
    if BLOCK_N > 32:
        half = gl.where(c >= 32, gl.expand_dims(hi, 1), half)
    return ((half >> (c % 32)) & 1) != 0


@gluon.jit
def _tree_allowed_ws(BIAS, node, row_ok, offs_n, L, T, stride_bias, BLOCK_N: gl.constexpr, MASK_MODE: gl.constexpr,
                     s_layout: gl.constexpr):
    """(allowed (64, BLOCK_N) bool, additive bias in log2 units or 0.0) in s_layout for
    columns offs_n (SliceLayout(0, s_layout)) of a tile overlapping [L, L + T); rows
    node / row_ok in SliceLayout(1, s_layout); MASK_MODE 1 (shared bias) or 2 (causal),
    as `tree_attention_tl._tree_allowed` (the bitmask: `_mask_words`)."""
    j = offs_n - L
    in_tree = (j >= 0) & (j < T)
    jj = gl.maximum(j, 0)
    ctx = gl.expand_dims(offs_n < L, 0)
    both = gl.expand_dims(row_ok, 1) & gl.expand_dims(in_tree, 0)
    if MASK_MODE == 1:
        bptr = BIAS + gl.expand_dims(node, 1) * stride_bias + gl.expand_dims(jj, 0)
        allowed = ctx | both
        bias = gl.load(bptr, mask=both, other=0.0) * 1.4426950408889634
    else:
        allowed = ctx | (both & (gl.expand_dims(jj, 0) <= gl.expand_dims(node, 1)))
        bias = gl.zeros([64, BLOCK_N], gl.float32, layout=s_layout)
    return allowed, bias


RESCALE_THRESHOLD = gl.constexpr(8.0)   # log2 units: an unmasked tile's p stays <= 256


@gluon.jit
def softmax_tile(s, m_i, l_i, qk_scale, allowed, bias, MASK_MODE: gl.constexpr, MASKED: gl.constexpr):
    """Online softmax of one (64, BLOCK_N) fp32 score tile s (raw Q K^T): returns (p fp32
    in s's layout, alpha, m_new, l_new), all in log2 units (exp2). MASKED: the tile
    overlaps [L, S), so `allowed` (bool, s's shape) applies, plus `bias` (log2 units) with
    the shared bias (MASK_MODE 1), and a row may see nothing yet; the running max is exact
    there. Unmasked tiles rescale lazily (p up to 2^RESCALE_THRESHOLD; the output divides
    by l in the same units, so the result is the same softmax)."""
    if MASKED:
        if MASK_MODE == 1:
            s = gl.where(allowed, s * qk_scale + bias, float("-inf"))
        else:
            s = gl.where(allowed, s * qk_scale, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(s, axis=1))
        m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)   # a row that saw nothing yet
        alpha = gl.exp2(m_i - m_safe)
        p = gl.exp2(s - gl.expand_dims(m_safe, 1))
    else:
        # Lazy rescaling: the running max moves only when a tile's row max passes it by more
        # than RESCALE_THRESHOLD (log2 units), so p <= 2^8 and alpha is exactly 1 on most tiles,
        # where `rescale` skips the accumulator's multiply.
        m_tile = gl.max(s, axis=1) * qk_scale
        m_new = gl.where(m_tile > m_i + RESCALE_THRESHOLD, m_tile, m_i)
        alpha = gl.exp2(m_i - m_new)
        p = gl.exp2(s * qk_scale - gl.expand_dims(m_new, 1))   # one FFMA per score
    l_new = l_i * alpha + gl.sum(p, axis=1)
    return p, alpha, m_new, l_new


@gluon.constexpr_function
def _rescale_asm(n):
    """PTX of `rescale` for n accumulator values per thread: four alpha tests (a thread's
    first four values cover both of its rows), a warp vote, and n multiplies skipped by a
    warp whose alphas are all 1. Operands: $0..$n-1 out (tied to the acc inputs), then n
    alphas from $2n."""
    tests = "".join(f"setp.neu.f32 p{k}, ${2 * n + k}, 0f3F800000; " for k in range(4))
    body = "".join(f"mul.f32 ${i}, ${i}, ${2 * n + i}; " for i in range(n))
    return ("{ .reg .pred p<4>; " + tests + "or.pred p0, p0, p1; or.pred p2, p2, p3; or.pred p0, p0, p2; "
            "vote.sync.any.pred p0, p0, 0xffffffff; @!p0 bra.uni SKIP; " + body + "SKIP: }")


@gluon.constexpr_function
def _rescale_constraints(n):
    """Constraints of `_rescale_asm(n)`: n outputs, the n acc inputs tied to them, n alphas."""
    return ",".join(["=r"] * n + [str(i) for i in range(n)] + ["r"] * n)


@gluon.jit
def rescale(acc, alpha_o):
    """acc * alpha per row for a (64, D) fp32 wgmma accumulator (alpha_o in SliceLayout(1, its
    layout)), the multiply skipped by each warp whose 16 rows all have alpha 1 (with lazy
    rescaling, most tiles: FlashAttention-4's conditional rescaling, as described in Modal's
    "We reverse-engineered Flash Attention 4", 2025). One inline-asm block over a thread's
    D / 2 values, in the accumulator's register order: values 4k, 4k + 1 of row r and
    4k + 2, 4k + 3 of row r + 8 (the wgmma m64nNk16 layout), so the first four alphas are
    both rows' (the sm_90 SASS multiplies registers 0-1 mod 4 by one alpha and 2-3 by the
    other)."""
    n: gl.constexpr = acc.shape[1] // 2                  # values per thread: 64 x D over 128 threads
    a = gl.expand_dims(alpha_o, 1) + gl.zeros_like(acc)
    return gl.inline_asm_elementwise(_rescale_asm(n), _rescale_constraints(n), [acc, a], gl.float32, True, n)


@gluon.jit
def tile_mask(s_layout: gl.constexpr, t, words, mctx, BLOCK_N: gl.constexpr, MASK_MODE: gl.constexpr):
    """(allowed, bias) of masked KV tile t for `softmax_tile`: from the tile's bitmask
    words (MASK_MODE 0, `_mask_words`), else `_tree_allowed_ws`'s."""
    MASK, BIAS, row_tok, node, row_ok, L, T, stride_mw, stride_bias = mctx
    if MASK_MODE == 0:
        lo, hi = words
        allowed = _word_allowed(lo, hi, BLOCK_N, s_layout)
        bias = 0.0
    else:
        offs_n = t * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
        allowed, bias = _tree_allowed_ws(BIAS, node, row_ok, offs_n, L, T, stride_bias, BLOCK_N, MASK_MODE, s_layout)
    return allowed, bias


@gluon.jit
def next_words(t, words, mctx, BLOCK_N: gl.constexpr, MASK_MODE: gl.constexpr):
    """The bitmask words of KV tile t (`_mask_words`) with MASK_MODE 0; else `words` as they are."""
    MASK, BIAS, row_tok, node, row_ok, L, T, stride_mw, stride_bias = mctx
    if MASK_MODE == 0:
        words = _mask_words(MASK, row_tok, row_ok, t * BLOCK_N, L, stride_mw, BLOCK_N)
    return words
