"""Merging two partial attention states by their log-sum-exp (no optional package).

A partial state over a key set K is (O, lse): O the softmax-weighted mean of V over
K, lse = log sum_{k in K} exp(s_k) in natural log. Two states over disjoint key
sets merge into the state over their union. The two-pass adapters
(`backends/two_pass.py`, `backends/two_pass_flashinfer.py`) use it to join the
context pass and the tree pass.
"""

from __future__ import annotations

import math

import torch

LN2 = math.log(2.0)   # FlashInfer's kernels return base-2 LSE: lse_e = lse_2 * ln 2


def merge_states(o1: torch.Tensor, lse1: torch.Tensor, o2: torch.Tensor,
                 lse2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The attention state over the union of two disjoint key sets.

    With m = max(lse1, lse2), w_i = exp(lse_i - m):

        O   = (w1 * O1 + w2 * O2) / (w1 + w2)
        lse = m + log(w1 + w2)

    the rule of FlashInfer's `merge_state` (flashinfer/cascade.py; its kernel in
    include/flashinfer/attention/cascade.cuh works in base 2) and of
    FlashAttention-2's split-KV combine (`combine_attn_seqk_parallel`,
    csrc/flash_attn/src/flash_fwd_kernel.h). Empty sets are handled where the plain
    formula gives NaN:

    - a state with lse = -inf (no keys) has weight 0 and its O is never read,
      so an undefined O (NaN from 0 / 0) cannot leak into the result;
    - both lse = -inf merge to (O = 0, lse = -inf), the empty state, not NaN
      (the plain formula computes exp(-inf - -inf) = exp(NaN)).

    Args:
        o1, o2: (n, H, D) float32 partial outputs.
        lse1, lse2: (n, H) float32 natural-log LSE; -inf for an empty key set.

    Returns:
        O (n, H, D) float32 and lse (n, H) float32, on the inputs' device.
    """
    m = torch.maximum(lse1, lse2)
    m = torch.where(torch.isneginf(m), torch.zeros_like(m), m)   # both empty: shift by 0, not by -inf
    w1, w2 = torch.exp(lse1 - m), torch.exp(lse2 - m)            # (n, H); 0 for an empty set
    den = w1 + w2
    num = (torch.where(w1[..., None] > 0, w1[..., None] * o1, 0.0)
           + torch.where(w2[..., None] > 0, w2[..., None] * o2, 0.0))   # (n, H, D)
    o = num / torch.where(den > 0, den, 1.0)[..., None]
    return o, m + torch.log(den)
