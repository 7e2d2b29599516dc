"""The tile-language MMA helper of the tl kernel (`tree_attention_tl`)."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def mma(a, b, acc, DOT_FP32: tl.constexpr):
    """a @ b with an fp32 accumulator, plus `acc` when given (None: zeros); a (M, K) and b
    (K, N) in the MMA dtype (bf16 / fp16), acc and the result (M, N) fp32. The MMA
    accumulates into acc in place, so the P V MMA of one tile may still run while the next
    tile's Q K^T is issued. DOT_FP32 upcasts the operands first: exact for bf16/fp16 values,
    and needed by the CPU interpreter, whose bfloat16 dot is wrong (Triton 3.9)."""
    if DOT_FP32:
        c = tl.dot(a.to(tl.float32), b.to(tl.float32), acc)
    else:
        c = tl.dot(a, b, acc)
    return c
