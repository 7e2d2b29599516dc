"""Mutants of `Dense` that get an fp8 KV pool wrong: the faults an fp8 path of a kernel is prone
to, each one step overridden and correct on bf16/fp16 pools, so only the default check's fp8
cases (its `kv_dtype` axis) can kill them.

A stored code c means float(c) * k_scale (K) or * v_scale (V) (docs/design.md, "fp8 KV"); the
pool is e4m3fn or e5m2 and its unused slots hold the NaN code.
"""

from __future__ import annotations

import torch
from treebench.harness.selftest.dense import Dense


def _fp8(inputs) -> bool:
    """True when the pool holds fp8 codes."""
    return inputs.k_cache.element_size() == 1


class Fp8ScalesIgnored(Dense):
    """Reads the codes as the values: k_scale and v_scale never applied."""
    name = "field_fp8_scales_ignored"
    description = "fp8 pool: codes used as values, k_scale and v_scale ignored"
    axis = "fp8 KV"
    upstream = "FlashInfer #4979 (non-unit k/v scales ignored; earlier tests used scale 1 only)"

    def dequantise(self, inputs, k, v):
        return k.float(), v.float()


class Fp8ScalesSwapped(Dense):
    """Multiplies K by v_scale and V by k_scale."""
    name = "mutant_fp8_scales_swapped"
    description = "fp8 pool: K dequantised with v_scale and V with k_scale"
    axis = "fp8 unequal scales"

    def dequantise(self, inputs, k, v):
        return k.float() * inputs.v_scale, v.float() * inputs.k_scale


class Fp8ScaleTwice(Dense):
    """Applies each scale twice: once when dequantising, again on the scores and the output
    (k_scale folded into sm_scale on top of a dequantised K, and likewise for V)."""
    name = "mutant_fp8_scale_twice"
    description = "fp8 pool: each scale applied twice (dequantised, then folded into sm_scale / the output)"
    axis = "fp8 KV"

    def dequantise(self, inputs, k, v):
        k, v = super().dequantise(inputs, k, v)
        return k * inputs.k_scale, v * inputs.v_scale


class Fp8NaNSlotsRead(Dense):
    """The fp8 path loads whole pages (wide vector loads) and masks nothing past S_b: the NaN codes
    of the last page's tail reach the softmax."""
    name = "mutant_fp8_reads_nan_slots"
    description = "fp8 pool: whole last page read past S_b, its NaN codes included"
    axis = "fp8 KV"

    def kv_span(self, inputs, b):
        s, l = super().kv_span(inputs, b)
        return (-(-s // inputs.page_size) * inputs.page_size if _fp8(inputs) else s), l


class Fp8DecodedAsE5m2(Dense):
    """Decodes the bytes of an e4m3fn pool as e5m2 (the format flag of the other fp8 dtype)."""
    name = "mutant_fp8_e4m3_read_as_e5m2"
    description = "fp8 pool: e4m3fn codes decoded as e5m2"
    axis = "fp8 KV"

    def dequantise(self, inputs, k, v):
        if k.dtype == torch.float8_e4m3fn:
            k, v = (x.view(torch.uint8).view(torch.float8_e5m2) for x in (k, v))
        return super().dequantise(inputs, k, v)


class Fp8AlwaysE4m3(Dense):
    """Decodes every fp8 pool as e4m3fn (the only fp8 format it was written for)."""
    name = "mutant_fp8_always_e4m3"
    description = "fp8 pool: every pool decoded as e4m3fn, e5m2 codes included"
    axis = "fp8 formats"

    def dequantise(self, inputs, k, v):
        if _fp8(inputs):
            k, v = (x.view(torch.uint8).view(torch.float8_e4m3fn) for x in (k, v))
        return super().dequantise(inputs, k, v)


class Fp8CausalMask(Dense):
    """On an fp8 pool uses a causal mask over the tree (node j visible to i iff j <= i), not the
    ancestor mask: the kind of fault a loose fp8 tolerance over random data lets through."""
    name = "field_fp8_causal_mask"
    description = "fp8 pool: causal mask over the tree instead of the ancestor mask"
    axis = "fp8 KV"
    upstream = "FlashInfer PR #4199 (random-data fp8 checks could not tell a causal mask from a full one)"

    def tree_mask(self, inputs, b):
        m = super().tree_mask(inputs, b)
        return torch.ones_like(m).tril() if _fp8(inputs) else m


class Fp8GroupOf4(Dense):
    """The fp8 path's GQA mapping is written for groups of at most 4 query heads per KV head:
    with G > 4 query head h reads KV head min(h // 4, Hkv - 1)."""
    name = "mutant_fp8_gqa_group_4"
    description = "fp8 pool: GQA mapping h // 4 (groups of at most 4), wrong for G > 4"
    axis = "fp8 GQA"

    def attend(self, inputs, b, q):
        self._fp8 = _fp8(inputs)
        return super().attend(inputs, b, q)

    def kv_head(self, h, num_q_heads, num_kv_heads):
        if getattr(self, "_fp8", False) and num_q_heads // num_kv_heads > 4:
            return min(h // 4, num_kv_heads - 1)
        return super().kv_head(h, num_q_heads, num_kv_heads)


FP8_MUTANTS = (Fp8ScalesIgnored, Fp8ScalesSwapped, Fp8ScaleTwice, Fp8NaNSlotsRead, Fp8DecodedAsE5m2, Fp8AlwaysE4m3,
               Fp8CausalMask, Fp8GroupOf4)
