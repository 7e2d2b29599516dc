"""The tl kernel's tile step with swapped MMA operands (`KernelOptions.swap_ab`, the kernel's
SWAP_AB): per KV tile, S^T = K Q^T and O^T += V^T P^T instead of S = Q K^T and O += P V.

The converted K/V tile is then the MMA's A operand, which wgmma may read from registers
(the unswapped kernel's B operand must sit in shared memory, so a tile converted in
registers, fp8 codes to fp16 or bf16, is written to shared memory again), and Q^T, loaded
once per program, is the B operand. The wgmma M dimension becomes BLOCK_N (64) and D, its N
dimension BLOCK_M, so 16 query rows still fit a wgmma (N 16): the "swap AB" of decode kernels
with few query rows. P^T (BLOCK_N, BLOCK_M), the second MMA's B operand, goes to shared memory.

Everything here is transposed against `tree_attention_tl`: scores S^T are (BLOCK_N, BLOCK_M),
the softmax statistics m_i, l_i (BLOCK_M,) reduce along axis 0 (one column per query row),
the accumulator is O^T (D, BLOCK_M) and the kernel transposes it back before its epilogue.
"""

from __future__ import annotations

import triton
import triton.language as tl

from treebench.kernels.tree_attention_ops import mma as _mma


@triton.jit
def swap_step(q_t, k, v, acc, m_i, l_i, col_scale, allowed, bias, dtype: tl.constexpr,
              MASKED: tl.constexpr, DOT_FP32: tl.constexpr):
    """One KV tile of online softmax with swapped operands.

    Args:
        q_t: (D, BLOCK_M) Q^T in the MMA dtype.
        k, v: (BLOCK_N, D) the tile's K and V, converted to the MMA dtype (`_kv_operand`).
        acc: (D, BLOCK_M) fp32 O^T so far; m_i, l_i: (BLOCK_M,) fp32 running max (log2 units)
            and sum.
        col_scale: (BLOCK_M,) fp32, each query row's factor from raw score to log2 units
            (qk_scale, times the row's Q_ROW_SCALE power of 2).
        allowed: (BLOCK_N, BLOCK_M) bool and bias (the same shape, fp32 log2 units, or 0.0):
            the tail tile's mask (`tree_allowed_t`); unused unless MASKED.
        MASKED: the tail tiles' loop (masked columns, rows that may have seen nothing yet).

    Returns:
        (acc, m_i, l_i) after the tile, in the same shapes.
    """
    s = _mma(k, q_t, None, DOT_FP32)                               # (BLOCK_N, BLOCK_M) S^T, raw scores
    if MASKED:
        s = tl.where(allowed, s * col_scale[None, :] + bias, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 0))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)       # a row that saw nothing yet
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(s - m_safe[None, :])
    else:
        m_new = tl.maximum(m_i, tl.max(s, 0) * col_scale)            # log2 units
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s * col_scale[None, :] - m_new[None, :])        # one FFMA per score
    l_i = l_i * alpha + tl.sum(p, 0)
    acc = _mma(tl.trans(v), p.to(dtype), acc * alpha[None, :], DOT_FP32)   # (D, BLOCK_M) O^T += V^T P^T
    return acc, m_new, l_i


@triton.jit
def tree_allowed_t(MASK, BIAS, row_tok, node, row_ok, offs_n, L, T, stride_mw, stride_bias,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, MASK_MODE: tl.constexpr):
    """`tree_attention_tl._tree_allowed` transposed: (allowed (BLOCK_N, BLOCK_M) bool, additive
    bias (BLOCK_N, BLOCK_M) fp32 in log2 units, or 0.0) for columns offs_n (BLOCK_N,) of a tile
    overlapping [L, L + T), rows row_tok = qo_b + node (BLOCK_M,). MASK_MODE 0: the bitmask
    words mask[row_tok, j // 64] bit j % 64, loaded as (BLOCK_M,) vectors; 1: the shared (T, T)
    bias; 2: causal j <= i."""
    j = offs_n - L                                          # (BLOCK_N,) tree index of the column
    in_tree = (j >= 0) & (j < T)
    jj = tl.maximum(j, 0)
    ctx = (offs_n < L)[:, None]
    both = in_tree[:, None] & row_ok[None, :]
    if MASK_MODE == 0:
        WORDS: tl.constexpr = BLOCK_N // 64 + 1 if BLOCK_N >= 64 else 2
        w0 = tl.min(jj, 0) // 64                             # first word the tile touches
        shift = (jj % 64).to(tl.int64)[:, None]
        bits = tl.zeros((BLOCK_N, BLOCK_M), tl.int64)
        for w in tl.static_range(WORDS):
            widx = tl.minimum(w0 + w, stride_mw - 1)          # clamp past the row's last word (stride_mw = W)
            word = tl.load(MASK + row_tok * stride_mw + widx, mask=row_ok, other=0)   # (BLOCK_M,) int64
            hit = ((jj // 64) == w0 + w)[:, None]
            bits = tl.where(hit, (word[None, :] >> shift) & 1, bits)
        allowed = ctx | (both & (bits != 0))
        bias = 0.0
    elif MASK_MODE == 1:
        bptr = BIAS + node[None, :] * stride_bias + jj[:, None]
        allowed = ctx | both
        bias = tl.load(bptr, mask=both, other=0.0) * 1.4426950408889634   # (BLOCK_N, BLOCK_M) fp32, log2 units
    else:
        allowed = ctx | (both & (jj[:, None] <= node[None, :]))
        bias = 0.0
    return allowed, bias
