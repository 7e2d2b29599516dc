"""Deliberately faulty paged tree-attention backends, to prove that the `check`
suite (suites/check.toml) catches each fault a real kernel is prone to.

`Correct` is an independent paged implementation (its own gather through the
block table and its own masked softmax, sharing no code with backends/ or the
reference). Each `Broken...` subclass overrides one hook to inject one fault.
None of them registers itself: load them with
``treebench check --backend tests/broken_backends.py:BrokenCausalMask``.
"""

from __future__ import annotations

import torch

from treebench.harness.adapter.contract import Capabilities


class Correct:
    """Paged tree attention, correct, in float32, one request at a time.

    Hooks (each Broken class overrides one): `page_ids` (block-table lookup),
    `kv_span` (how many KV tokens a request reads and where its tree starts),
    `tree_mask`, `context_visible`, `kv_head` and `scale`.
    """

    name = "correct"
    mask_kind = "tree"
    capabilities = Capabilities(devices=("cpu", "cuda"))

    def availability(self):
        return None

    def supports(self, case):
        return None

    # ---- hooks -------------------------------------------------------------------
    def page_ids(self, inputs, b: int, n_pages: int) -> list[int]:
        """Physical pages of request b's logical pages [0, n_pages): block_table[b, j]."""
        row = inputs.block_table[b].tolist()
        return [row[min(j, len(row) - 1)] for j in range(n_pages)]  # past the row: its last entry, as OOB garbage

    def kv_span(self, inputs, b: int) -> tuple[int, int]:
        """(KV tokens read, context length used as the tree's offset) for request b: (S_b, L_b)."""
        return int(inputs.seq_lens[b]), int(inputs.context_lens[b])

    def tree_mask(self, inputs, b: int) -> torch.Tensor:
        """(T_b, T_b) bool: [i, j] True iff tree node j is i or an ancestor of i."""
        return inputs.trees[b].ancestor_mask

    def context_visible(self, n_ctx: int) -> torch.Tensor:
        """(n_ctx,) bool: which context tokens every query sees (all of them)."""
        return torch.ones(n_ctx, dtype=torch.bool)

    def kv_head(self, h: int, num_q_heads: int, num_kv_heads: int) -> int:
        """KV head read by query head h under GQA: h // G."""
        return h // (num_q_heads // num_kv_heads)

    def scale(self, inputs) -> float:
        """Softmax scale: inputs.sm_scale (1/sqrt(D))."""
        return inputs.sm_scale

    # ---- the computation ---------------------------------------------------------
    def gather(self, inputs, b: int, n_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K, V (n_tokens, Hkv, D) float32 of request b, read page by page through `page_ids`."""
        P = inputs.page_size
        pages = self.page_ids(inputs, b, -(-n_tokens // P))
        k = torch.cat([inputs.k_cache[p] for p in pages])[:n_tokens]      # (n_tokens, Hkv, D)
        v = torch.cat([inputs.v_cache[p] for p in pages])[:n_tokens]
        return k.float(), v.float()

    def full_mask(self, inputs, b: int, n_tokens: int, n_ctx: int) -> torch.Tensor:
        """(T_b, n_tokens) bool on inputs.device: context part, then the tree mask, then anything after it visible."""
        t = inputs.trees[b].size
        m = torch.ones(t, n_tokens, dtype=torch.bool)
        m[:, :n_ctx] = self.context_visible(n_ctx)
        m[:, n_ctx:n_ctx + t] = self.tree_mask(inputs, b)[:, :max(0, min(t, n_tokens - n_ctx))]
        return m.to(inputs.device)

    def attend(self, inputs, b: int, q: torch.Tensor) -> torch.Tensor:
        """(T_b, Hq, D) float32 output of request b from its queries q (T_b, Hq, D)."""
        n_tokens, n_ctx = self.kv_span(inputs, b)
        k, v = self.gather(inputs, b, n_tokens)
        hq, hkv = q.shape[1], k.shape[1]
        heads = torch.tensor([self.kv_head(h, hq, hkv) for h in range(hq)], device=q.device)
        k, v = k[:, heads], v[:, heads]                                     # (n, Hq, D)
        scores = torch.einsum("thd,nhd->htn", q.float(), k) * self.scale(inputs)  # (Hq, T_b, n)
        scores = scores.masked_fill(~self.full_mask(inputs, b, n_tokens, n_ctx), float("-inf"))
        return torch.einsum("htn,nhd->thd", scores.softmax(-1), v)

    def prepare(self, inputs):
        qo = inputs.qo_indptr.tolist()

        def run() -> torch.Tensor:
            outs = [self.attend(inputs, b, inputs.q[qo[b]:qo[b + 1]]) for b in range(len(inputs.trees))]
            return torch.cat(outs).to(inputs.dtype)                         # (sum T_b, Hq, D)

        return run


class BrokenIgnoresBlockTable(Correct):
    """Assumes request b's pages are contiguous, right after request b-1's."""
    name = "broken_ignores_block_table"

    def page_ids(self, inputs, b, n_pages):
        P = inputs.page_size
        first = sum(-(-int(s) // P) for s in inputs.seq_lens[:b].tolist())
        return list(range(first, first + n_pages))


class BrokenReadsPastEnd(Correct):
    """Reads the whole last page, past S_b, as if it were full."""
    name = "broken_reads_past_end"

    def kv_span(self, inputs, b):
        s, l = super().kv_span(inputs, b)
        P = inputs.page_size
        return -(-s // P) * P, l


class BrokenExtraPageAtMultiple(Correct):
    """pages = S_b // P + 1 with last-page length `S_b % P or P`: one page too
    many when S_b is an exact multiple of P; the tree's offset is then derived
    as (tokens read) - T_b."""
    name = "broken_extra_page_at_multiple"

    def kv_span(self, inputs, b):
        s, _ = super().kv_span(inputs, b)
        P, t = inputs.page_size, inputs.trees[b].size
        n = (s // P) * P + (s % P or P)
        return n, n - t


class BrokenSiblingsSeeEachOther(Correct):
    """Lets tree nodes at the same depth (siblings, cousins) see each other."""
    name = "broken_siblings_see_each_other"

    def tree_mask(self, inputs, b):
        d = torch.tensor(inputs.trees[b].depths)
        return super().tree_mask(inputs, b) | (d[:, None] == d[None, :])


class BrokenCausalMask(Correct):
    """Plain causal mask over the T_b tree tokens instead of the tree mask."""
    name = "broken_causal_mask"

    def tree_mask(self, inputs, b):
        t = inputs.trees[b].size
        return torch.ones(t, t, dtype=torch.bool).tril()


class BrokenRootHidden(Correct):
    """Hides the root (node 0) from its descendants."""
    name = "broken_root_hidden"

    def tree_mask(self, inputs, b):
        m = super().tree_mask(inputs, b).clone()
        m[1:, 0] = False
        return m


class BrokenGqaMapping(Correct):
    """Query head h reads KV head h % Hkv instead of h // G."""
    name = "broken_gqa_mapping"

    def kv_head(self, h, num_q_heads, num_kv_heads):
        return h % num_kv_heads


class BrokenSoftmaxScale(Correct):
    """Scales scores by 1/D instead of 1/sqrt(D)."""
    name = "broken_softmax_scale"

    def scale(self, inputs):
        return inputs.sm_scale ** 2


class BrokenRequest0Context(Correct):
    """Reuses request 0's context length (and so its mask offset) for every request."""
    name = "broken_request0_context"

    def kv_span(self, inputs, b):
        l0 = int(inputs.context_lens[0])
        return l0 + inputs.trees[b].size, l0


class BrokenRequest0Tree(Correct):
    """Uses request 0's tree mask for every request (cut or causally padded to T_b)."""
    name = "broken_request0_tree"

    def tree_mask(self, inputs, b):
        t = inputs.trees[b].size
        m = torch.ones(t, t, dtype=torch.bool).tril()
        m0 = inputs.trees[0].ancestor_mask
        k = min(t, m0.shape[0])
        m[:k, :k] = m0[:k, :k]
        return m


class BrokenDropsLastContext(Correct):
    """Never attends to the last context token (position L_b - 1)."""
    name = "broken_drops_last_context"

    def context_visible(self, n_ctx):
        m = super().context_visible(n_ctx)
        m[-1:] = False
        return m


BROKEN = (BrokenIgnoresBlockTable, BrokenReadsPastEnd, BrokenExtraPageAtMultiple, BrokenSiblingsSeeEachOther,
          BrokenCausalMask, BrokenRootHidden, BrokenGqaMapping, BrokenSoftmaxScale, BrokenRequest0Context,
          BrokenRequest0Tree, BrokenDropsLastContext)
