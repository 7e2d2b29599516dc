"""Mutants of `Dense` a check must kill: the eleven faults every kernel is prone to,
each one step overridden (moved here from tests/broken_backends.py, which
re-exports them). Axis-specific mutants are in `mutants_axes`, bugs found in other
projects in `mutants_field`, fp8-pool faults in `mutants_fp8`; `ALL_MUTANTS` at the end of
`mutants_field` lists all.

`AXES` names every coverage axis a mutant may need (its `axis`); a check suite
that lacks the axis lets the mutant survive.
"""

from __future__ import annotations

import torch
from treebench.harness.selftest.dense import Dense

AXES = {  # axis -> the cases that exercise it
    "paged layout": "pages in a shuffled or interleaved pool, not in request order",
    "page tails": "S_b mid-page (a NaN tail) and S_b an exact multiple of P with a NaN page next in the block table",
    "branching trees": "trees with siblings and cousins",
    "ragged contexts": "requests of different L_b in one batch",
    "mixed trees": "per-request trees that differ from request 0's",
    "GQA G > 1": "G > 1 with Hkv > 1, so h // G and h % Hkv differ",
    "any case": "any case at all",
    "batches": "B > 1 requests of T_b > 1 in one batch",
    "mask words": "T_b past a mask word (31/32/33, 63/64/65 nodes) with ancestors beyond the first word",
    "page size": "page sizes other than 16 (1 .. 256, 64 among them) with contexts spanning pages",
    "large logits": "scores past exp's float32 range (|s| > 88)",
    "G = 1": "plain multi-head attention, Hq == Hkv",
    "KV heads > 2": "Hkv of 3 and 8, so a KV head index clamped or wrapped at 2 reads the wrong head",
    "batches > 8": "B of 11 requests, so a batch cut at 8 requests drops some",
    "batches > 32": "B of 33 requests, so a batch cut at 32 (or 16) requests drops some",
    "softmax scale": "an sm_scale other than 1/sqrt(D) (0.3), so a kernel that ignores inputs.sm_scale differs",
    "context 0": "a request with L_b = 0",
    "L_b = P·k": "a context ending exactly at a page end",
    "shape coincidences": "a request with T_b == Hq",
    "re-prepare": "prepare() again on a batch of the same shape with other trees",
    "repeat": "the prepared callable called twice, both outputs compared",
    "long context": "L_b of 16k-32k tokens (outputs ~1/sqrt(L_b): bf16's atol hides smaller contexts' errors)",
    "fp8 KV": "an fp8 pool (e4m3fn) with non-unit scales and a NaN-coded page tail",
    "fp8 unequal scales": "an fp8 pool with k_scale != v_scale (0.25 and 0.5), so a swapped pair differs",
    "fp8 formats": "pools of both fp8 formats, e4m3fn and e5m2",
    "fp8 GQA": "an fp8 pool under G > 4 (Hq 12, Hkv 2)",
}


class BrokenIgnoresBlockTable(Dense):
    """Assumes request b's pages are contiguous, right after request b-1's."""
    name = "broken_ignores_block_table"
    description = "ignores the block table: request b's pages assumed right after request b-1's"
    axis = "paged layout"

    def page_ids(self, inputs, b, n_pages):
        P = inputs.page_size
        first = sum(-(-int(s) // P) for s in inputs.seq_lens[:b].tolist())
        return list(range(first, first + n_pages))


class BrokenReadsPastEnd(Dense):
    """Reads the whole last page, past S_b, as if it were full."""
    name = "broken_reads_past_end"
    description = "reads the whole last page past S_b, as if it were full"
    axis = "page tails"

    def kv_span(self, inputs, b):
        s, l = super().kv_span(inputs, b)
        P = inputs.page_size
        return -(-s // P) * P, l


class BrokenExtraPageAtMultiple(Dense):
    """pages = S_b // P + 1 with last-page length `S_b % P or P`: one page too
    many when S_b is an exact multiple of P; the tree's offset is then derived
    as (tokens read) - T_b."""
    name = "broken_extra_page_at_multiple"
    description = "one page too many when S_b is an exact multiple of P (pages = S_b // P + 1)"
    axis = "page tails"

    def kv_span(self, inputs, b):
        s, _ = super().kv_span(inputs, b)
        P, t = inputs.page_size, inputs.trees[b].size
        n = (s // P) * P + (s % P or P)
        return n, n - t


class BrokenSiblingsSeeEachOther(Dense):
    """Lets tree nodes at the same depth (siblings, cousins) see each other."""
    name = "broken_siblings_see_each_other"
    description = "tree nodes at the same depth (siblings, cousins) see each other"
    axis = "branching trees"

    def tree_mask(self, inputs, b):
        d = torch.tensor(inputs.trees[b].depths)
        return super().tree_mask(inputs, b) | (d[:, None] == d[None, :])


class BrokenCausalMask(Dense):
    """Plain causal mask over the T_b tree tokens instead of the tree mask."""
    name = "broken_causal_mask"
    description = "a causal mask over the T_b tree tokens instead of the tree mask"
    axis = "branching trees"

    def tree_mask(self, inputs, b):
        t = inputs.trees[b].size
        return torch.ones(t, t, dtype=torch.bool).tril()


class BrokenRootHidden(Dense):
    """Hides the root (node 0) from its descendants."""
    name = "broken_root_hidden"
    description = "the root (node 0) hidden from its descendants"
    axis = "any case"

    def tree_mask(self, inputs, b):
        m = super().tree_mask(inputs, b).clone()
        m[1:, 0] = False
        return m


class BrokenGqaMapping(Dense):
    """Query head h reads KV head h % Hkv instead of h // G."""
    name = "broken_gqa_mapping"
    description = "query head h reads KV head h % Hkv instead of h // G"
    axis = "GQA G > 1"

    def kv_head(self, h, num_q_heads, num_kv_heads):
        return h % num_kv_heads


class BrokenSoftmaxScale(Dense):
    """Scales scores by 1/D instead of 1/sqrt(D)."""
    name = "broken_softmax_scale"
    description = "scores scaled by 1/D instead of 1/sqrt(D)"
    axis = "any case"

    def scale(self, inputs):
        return inputs.sm_scale ** 2


class BrokenRequest0Context(Dense):
    """Reuses request 0's context length (and so its mask offset) for every request."""
    name = "broken_request0_context"
    description = "request 0's context length (and mask offset) used for every request"
    axis = "ragged contexts"

    def kv_span(self, inputs, b):
        l0 = int(inputs.context_lens[0])
        return l0 + inputs.trees[b].size, l0


class BrokenRequest0Tree(Dense):
    """Uses request 0's tree mask for every request (cut or causally padded to T_b)."""
    name = "broken_request0_tree"
    description = "request 0's tree mask used for every request (cut or causally padded to T_b)"
    axis = "mixed trees"

    def tree_mask(self, inputs, b):
        t = inputs.trees[b].size
        m = torch.ones(t, t, dtype=torch.bool).tril()
        m0 = inputs.trees[0].ancestor_mask
        k = min(t, m0.shape[0])
        m[:k, :k] = m0[:k, :k]
        return m


class BrokenDropsLastContext(Dense):
    """Never attends to the last context token (position L_b - 1)."""
    name = "broken_drops_last_context"
    description = "never attends to the last context token (position L_b - 1)"
    axis = "any case"

    def context_visible(self, n_ctx):
        m = super().context_visible(n_ctx)
        m[-1:] = False
        return m


CLASSIC = (BrokenIgnoresBlockTable, BrokenReadsPastEnd, BrokenExtraPageAtMultiple, BrokenSiblingsSeeEachOther,
           BrokenCausalMask, BrokenRootHidden, BrokenGqaMapping, BrokenSoftmaxScale, BrokenRequest0Context,
           BrokenRequest0Tree, BrokenDropsLastContext)
