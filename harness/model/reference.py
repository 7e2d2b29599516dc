"""The exact reference: dense masked attention in float64 over logical K/V.

Independent of every backend: it reads each request's logical K/V
(`inputs.k_logical`, never the paged pool) and the tree's ancestor mask.
Float64 on whatever device the inputs live on (the CPU here; the H200's FP64
units on the GPU).
"""

from __future__ import annotations

import torch

from treebench.harness.model.paged import BatchInputs


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
    """Tree attention for every request, in float64.

    Returns:
        out: (sum T_b, Hq, D) float64 on inputs.device; with `return_lse`, also
        lse: (sum T_b, Hq) float64, natural-log sum of exp of scaled scores.
    """
    case = inputs.case
    G = case.group_size
    outs, lses = [], []
    qo = inputs.qo_indptr.tolist()
    ls, _, ss = inputs.host_lists()
    for b, tree in enumerate(inputs.trees):
        s0 = int(inputs.kv_indptr[b])
        q = inputs.q[qo[b]:qo[b + 1]].double()                       # (T, Hq, D)
        k = inputs.k_logical[s0:s0 + ss[b]].double()                 # (S, Hkv, D)
        v = inputs.v_logical[s0:s0 + ss[b]].double()                 # (S, Hkv, D)
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
