"""Tile-language helpers of the tl kernel (`tree_attention_tl`): the MMA and the e4m3 rounding."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def mma(a, b, acc, DOT_FP32: tl.constexpr):
    """a @ b with an fp32 accumulator, plus `acc` when given (None: zeros); a (M, K) and b
    (K, N) in the MMA dtype (bf16 / fp16, or fp8 codes), acc and the result (M, N) fp32. The MMA
    accumulates into acc in place, so the P V MMA of one tile may still run while the next
    tile's Q K^T is issued. DOT_FP32 upcasts the operands first: exact for bf16/fp16/fp8 values,
    and needed by the CPU interpreter, whose bfloat16 dot is wrong (Triton 3.9)."""
    if DOT_FP32:
        c = tl.dot(a.to(tl.float32), b.to(tl.float32), acc)
    else:
        c = tl.dot(a, b, acc)
    return c


@triton.jit
def to_e4m3(x, EMULATE: tl.constexpr):
    """x (any shape) fp32 rounded to float8_e4m3fn, to nearest even, saturating at +-448
    (|x| <= 448 in the kernel's uses). EMULATE (the CPU interpreter): the rounding done in fp32
    arithmetic first, so the cast only sees representable values; Triton 3.9's interpreter
    rounds fp32 -> e4m3 wrongly where the mantissa carries into the exponent (124.3 -> 64, not
    128) and below the normals. On a GPU the cast is the hardware's (cvt.rn.satfinite)."""
    if EMULATE:
        a = tl.minimum(tl.abs(x), 448.0)
        e = tl.floor(tl.log2(tl.maximum(a, 2.0 ** -10)))
        e = tl.where(tl.exp2(e) > a, e - 1.0, e)                    # log2's error near a power of 2
        e = tl.where(tl.exp2(e + 1.0) <= a, e + 1.0, e)
        ulp = tl.exp2(tl.maximum(e, -6.0) - 3.0)                    # 3 mantissa bits; subnormals below 2^-6
        y = a / ulp                                                 # < 16: exact in fp32
        r = ((y + 12582912.0) - 12582912.0) * ulp                   # 1.5 * 2^23: fp32 adds round to nearest even
        y8 = tl.where(x < 0, -r, r).to(tl.float8e4nv)
    else:
        y8 = x.to(tl.float8e4nv)
    return y8
