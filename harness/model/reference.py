"""The exact reference: dense masked attention in float64 over logical K/V.

Independent of every backend: it reads each request's logical K/V
(`inputs.k_logical`, never the paged pool) and the tree's ancestor mask.
Float64 on whatever device the inputs live on (the CPU here; the H200's FP64
units on the GPU). `paged_reference_attention` is the same computation over K/V
gathered from the paged pool, for the `reference` backend, which like every
backend never sees the logical copy.

An fp8 pool's codes are dequantised exactly: float64(code) * k_scale (v_scale for
V). Every fp8 value and its product with a float64 scale is exact in float64 (a
53-bit mantissa holds 4- or 3-bit ones), so the reference measures the kernel,
not the quantisation. For bf16/fp16/fp32 pools the scales are 1.0.
"""

from __future__ import annotations

import torch

from treebench.harness.model.paged import BackendInputs, BatchInputs


def request_mask(tree_mask: torch.Tensor, context_len: int) -> torch.Tensor:
    """(T, L + T) bool: query i sees every context token and its tree ancestors.

    Args:
        tree_mask: (T, T) bool ancestor mask, [i, j] True iff j is i or an ancestor.
        context_len: L_b.
    """
    t = tree_mask.shape[0]
    ctx = torch.ones(t, context_len, dtype=torch.bool)
    return torch.cat([ctx, tree_mask], dim=1)


def reference_attention(inputs: BatchInputs, return_lse: bool = False):
    """Tree attention for every request, in float64, over the logical K/V.

    Returns:
        out: (sum T_b, Hq, D) float64 on inputs.device; with `return_lse`, also
        lse: (sum T_b, Hq) float64, natural-log sum of exp of scaled scores.
    """
    ptr = inputs.kv_indptr.tolist()

    def kv(b: int, s: int) -> tuple[torch.Tensor, torch.Tensor]:
        return inputs.k_logical[ptr[b]:ptr[b] + s], inputs.v_logical[ptr[b]:ptr[b] + s]  # (S, Hkv, D) each
    return _attention(inputs, kv, return_lse)


def paged_reference_attention(inputs: BackendInputs) -> torch.Tensor:
    """`reference_attention` over K/V read from the paged pool through `block_table`.

    Args:
        inputs: a backend's view (or a full BatchInputs); only contract fields are read.

    Returns:
        (sum T_b, Hq, D) float64 on inputs.device.
    """
    P = inputs.page_size

    def kv(b: int, s: int) -> tuple[torch.Tensor, torch.Tensor]:
        pages = inputs.block_table[b, :-(-s // P)]                    # (ceil(S / P),) physical pages
        k = inputs.k_cache.index_select(0, pages).flatten(0, 1)[:s]   # (S, Hkv, D)
        return k, inputs.v_cache.index_select(0, pages).flatten(0, 1)[:s]
    return _attention(inputs, kv, False)


def _attention(inputs, kv, return_lse: bool):
    """The float64 masked attention of every request; kv(b, S_b) gives its (S_b, Hkv, D) K and V."""
    G = inputs.case.group_size
    outs, lses = [], []
    qo = inputs.qo_indptr.tolist()
    ls, _, ss = inputs.host_lists()
    for b, tree in enumerate(inputs.trees):
        q = inputs.q[qo[b]:qo[b + 1]].double()                       # (T, Hq, D)
        k, v = kv(b, ss[b])
        k, v = k.double() * inputs.k_scale, v.double() * inputs.v_scale  # (S, Hkv, D): codes dequantised
        k = k.repeat_interleave(G, dim=1)                            # (S, Hq, D): head h reads kv head h // G
        v = v.repeat_interleave(G, dim=1)
        scores = torch.einsum("thd,shd->hts", q, k) * inputs.sm_scale  # (Hq, T, S)
        mask = request_mask(tree.ancestor_mask, ls[b]).to(q.device)  # (T, S)
        scores = scores.masked_fill(~mask, float("-inf"))
        lse = torch.logsumexp(scores, dim=-1)                        # (Hq, T)
        p = torch.exp(scores - lse[..., None])                       # (Hq, T, S)
        outs.append(torch.einsum("hts,shd->thd", p, v))              # (T, Hq, D)
        lses.append(lse.transpose(0, 1))                             # (T, Hq)
    out = torch.cat(outs)
    return (out, torch.cat(lses)) if return_lse else out
