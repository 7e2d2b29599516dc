"""Mutants of `Dense` that reproduce bugs found and fixed in other projects' tree or
paged attention (each cites the upstream fix in `upstream`), and `ALL_MUTANTS` (the LSE
mutants of `mutants_lse` included).
"""

from __future__ import annotations

import torch
from treebench.harness.selftest.dense import Dense
from treebench.harness.selftest.mutants import CLASSIC
from treebench.harness.selftest.mutants_axes import AXIS_MUTANTS
from treebench.harness.selftest.mutants_lse import LSE_MUTANTS
from treebench.harness.selftest.mutants_fp8 import FP8_MUTANTS
from treebench.harness.selftest.variants import SplitKV


class PaddingSlotsRead(Dense):
    """Attends to every slot of the block-table row (max_pages · P tokens), the padding entries past
    request b's last page included."""
    name = "field_block_table_padding"
    description = "reads the block-table row's padding slots past the request's last page"
    axis = "ragged contexts"
    upstream = "vLLM PR #43682 (block-table padding slots read)"

    def kv_span(self, inputs, b):
        return inputs.block_table.shape[1] * inputs.page_size, int(inputs.context_lens[b])


class PackedMaskOffset(Dense):
    """Reads request b's bits from the batch's packed mask at the query offset qo_indptr[b]
    (sum of T_b) instead of the mask offset (sum of T_b²)."""
    name = "field_packed_mask_offset"
    description = "request b's mask bits read at qo_indptr[b] instead of sum T_b² in the packed batch mask"
    axis = "batches"
    upstream = "FlashInfer PR #2201 (mask offsets of a packed batch)"

    def tree_mask(self, inputs, b):
        packed = torch.cat([t.ancestor_mask.flatten() for t in inputs.trees])   # (sum T_b²,) bool
        t, start = inputs.trees[b].size, int(inputs.qo_indptr[b])
        return packed[start:start + t * t].view(t, t)


class TreeAfterContext(Dense):
    """Assumes the tree's K/V sit in the pool right after the last context token's slot, so a tree
    that crosses into a page elsewhere in the pool is read from the wrong page."""
    name = "field_tree_kv_contiguous"
    description = "tree K/V assumed physically right after the last context token (they are scattered)"
    axis = "paged layout"
    upstream = "SGLang PR #15360 (tree K/V locations assumed contiguous)"

    def token_slots(self, inputs, b, n_tokens):
        page, off = super().token_slots(inputs, b, n_tokens)
        P, n_ctx = inputs.page_size, int(inputs.context_lens[b])
        flat = page * P + off                                                    # (n_tokens,) flat pool slot
        anchor = flat[n_ctx - 1] if n_ctx else flat[0] - 1
        flat = flat.clone()
        flat[n_ctx:] = (anchor + 1 + torch.arange(n_tokens - n_ctx)) % (inputs.k_cache.shape[0] * P)
        return flat // P, flat % P


class StaleMaskAcrossPlans(Dense):
    """Keeps the packed masks of its first plan for a batch shape (B, sum T_b) and reuses them when
    prepare() is called again with that shape but other trees."""
    name = "field_stale_mask"
    description = "mask of an earlier prepare() reused for a batch of the same shape (state kept across plans)"
    axis = "re-prepare"
    upstream = "FlashInfer PR #1028 (stale mask reused across plans)"

    def prepare(self, inputs):
        plans = self.__dict__.setdefault("_plans", {})
        key = (len(inputs.trees), int(inputs.qo_indptr[-1]))
        self._masks = plans.setdefault(key, [t.ancestor_mask for t in inputs.trees])
        return super().prepare(inputs)

    def tree_mask(self, inputs, b):
        return self._masks[b]


class EmptyStatesMergeNaN(SplitKV):
    """Split-KV whose merge of two partial states does not special-case both LSE = -inf:
    exp(-inf - -inf) = NaN, so a request with two empty splits returns NaN."""
    name = "field_empty_merge_nan"
    description = "split-KV merge of two empty partial states (both LSE = -inf) gives NaN"
    axis = "ragged contexts"
    upstream = "FlashInfer #4051 (merge_state with both LSE = -inf)"

    def merge_states(self, a, b):
        (oa, la), (ob, lb) = a, b
        m = torch.maximum(la, lb)
        wa, wb = torch.exp(la - m), torch.exp(lb - m)                          # NaN when both are -inf
        o = (oa * wa.T[..., None] + ob * wb.T[..., None]) / (wa + wb).T[..., None]
        return o, m + torch.log(wa + wb)


class FlatIndexPositions(Dense):
    """Guards the tree mask with `key position <= query position`, taking tree keys' positions from
    their flat index (L_b + j) instead of their depth (L_b + depth(j)): ancestors that come late in
    breadth-first order are hidden from shallow-numbered descendants."""
    name = "field_flat_index_positions"
    description = "tree key positions from the flat index L_b + j instead of L_b + depth(j)"
    axis = "branching trees"
    upstream = "TensorRT-LLM PR #13081 (sibling positions from the flat index, not the depth)"

    def tree_mask(self, inputs, b):
        tree = inputs.trees[b]
        key_pos = torch.arange(tree.size)                                       # flat index, should be depth
        query_pos = torch.tensor(tree.depths)
        return super().tree_mask(inputs, b) & (key_pos[None, :] <= query_pos[:, None])


FIELD_MUTANTS = (PaddingSlotsRead, PackedMaskOffset, TreeAfterContext, StaleMaskAcrossPlans, EmptyStatesMergeNaN,
                 FlatIndexPositions)
ALL_MUTANTS = (*CLASSIC, *AXIS_MUTANTS, *FIELD_MUTANTS, *LSE_MUTANTS, *FP8_MUTANTS)
