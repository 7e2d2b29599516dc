"""A correct dense tree-attention backend, in float32, one request at a time, built
from small overridable steps so that each mutant (treebench.harness.selftest.mutants)
breaks exactly one of them.

It shares no code with backends/ or the reference: its own gather through the block
table, its own mask and its own softmax. Steps, in call order for request b:
`kv_span` (tokens read, tree offset) -> `token_slots` (via `page_ids`: where each
token sits in the pool) -> `tree_mask` / `context_visible` (the mask) -> `kv_head`
(GQA) -> `scale` -> `softmax_pv` (softmax and P·V); `gather` reads the slots and
`dequantise` turns an fp8 pool's codes into values (code * k_scale, code * v_scale).
"""

from __future__ import annotations

import torch
from treebench.harness.adapter.contract import Capabilities
from treebench.harness.model.cases import KV_DTYPES


class Dense:
    """Paged tree attention over the whole KV span of each request, correct.

    Class attributes used by `treebench selftest`: `description` (one line), `axis`
    (the coverage axis a check needs to catch this backend's fault; None: correct)
    and `upstream` (the fix in another project this bug was seen in, or None).
    """

    name = "selftest_dense"
    mask_kind = "tree"
    capabilities = Capabilities(devices=("cpu", "cuda"), kv_dtypes=KV_DTYPES)
    description = "dense float32 softmax(Q K^T) V over context + tree, one request at a time"
    axis: str | None = None
    upstream: str | None = None

    def availability(self) -> str | None:
        return None

    def supports(self, case) -> str | None:
        return None

    # ---- steps -------------------------------------------------------------------
    def page_ids(self, inputs, b: int, n_pages: int) -> list[int]:
        """Physical pages of request b's logical pages [0, n_pages): block_table[b, j]."""
        row = inputs.block_table[b].tolist()
        return [row[min(j, len(row) - 1)] for j in range(n_pages)]  # past the row: its last entry, as OOB garbage

    def kv_span(self, inputs, b: int) -> tuple[int, int]:
        """(KV tokens read, context length used as the tree's offset) for request b: (S_b, L_b)."""
        return int(inputs.seq_lens[b]), int(inputs.context_lens[b])

    def token_slots(self, inputs, b: int, n_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(physical page, in-page offset), each (n_tokens,) int64 on CPU: where logical token t of
        request b sits in the pool, `block_table[b, t // P]` and `t % P`."""
        P = inputs.page_size
        pages = torch.tensor(self.page_ids(inputs, b, -(-n_tokens // P)), dtype=torch.int64)
        t = torch.arange(n_tokens)
        return pages[t // P], t % P

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
        """Softmax scale: inputs.sm_scale (1/sqrt(D) unless the case sets sm_scale)."""
        return inputs.sm_scale

    def dequantise(self, inputs, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K, V float32 from the pool's elements (n, Hkv, D): float32(code) * k_scale and * v_scale
        (the scales are 1.0 for a bf16/fp16/fp32 pool)."""
        return k.float() * inputs.k_scale, v.float() * inputs.v_scale

    def softmax_pv(self, scores: torch.Tensor, v: torch.Tensor, n_ctx: int) -> torch.Tensor:
        """(T_b, Hq, D) float32 from masked scores (Hq, T_b, n) float32 (-inf where hidden) and
        v (n, Hq, D) float32; the first n_ctx of the n tokens are context."""
        return torch.einsum("htn,nhd->thd", scores.softmax(-1), v)

    # ---- the computation ---------------------------------------------------------
    def gather(self, inputs, b: int, n_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K, V (n_tokens, Hkv, D) float32 of request b, read slot by slot through `token_slots`
        (an fp8 pool's bytes are read as bytes, then `dequantise`d)."""
        page, off = self.token_slots(inputs, b, n_tokens)
        page, off = page.to(inputs.device), off.to(inputs.device)
        k, v = inputs.k_cache, inputs.v_cache
        if k.element_size() == 1:
            k, v = (x.view(torch.uint8)[page, off].view(x.dtype) for x in (k, v))   # (n_tokens, Hkv, D) codes
        else:
            k, v = k[page, off], v[page, off]
        return self.dequantise(inputs, k, v)

    def full_mask(self, inputs, b: int, n_tokens: int, n_ctx: int) -> torch.Tensor:
        """(T_b, n_tokens) bool on inputs.device: context part, then the tree mask, then anything after it visible."""
        t = inputs.trees[b].size
        m = torch.ones(t, n_tokens, dtype=torch.bool)
        m[:, :n_ctx] = self.context_visible(n_ctx)
        m[:, n_ctx:n_ctx + t] = self.tree_mask(inputs, b)[:, :max(0, min(t, n_tokens - n_ctx))]
        return m.to(inputs.device)

    def masked_scores(self, inputs, b: int, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
        """(scores (Hq, T_b, n) float32 with -inf where hidden, v (n, Hq, D) float32, n_ctx) of request b."""
        n_tokens, n_ctx = self.kv_span(inputs, b)
        k, v = self.gather(inputs, b, n_tokens)
        hq, hkv = q.shape[1], k.shape[1]
        heads = torch.tensor([self.kv_head(h, hq, hkv) for h in range(hq)], device=q.device)
        k, v = k[:, heads], v[:, heads]                                     # (n, Hq, D)
        scores = torch.einsum("thd,nhd->htn", q.float(), k) * self.scale(inputs)  # (Hq, T_b, n)
        scores = scores.masked_fill(~self.full_mask(inputs, b, n_tokens, n_ctx), float("-inf"))
        return scores, v, n_ctx

    def attend(self, inputs, b: int, q: torch.Tensor) -> torch.Tensor:
        """(T_b, Hq, D) float32 output of request b from its queries q (T_b, Hq, D)."""
        return self.softmax_pv(*self.masked_scores(inputs, b, q))

    def compute(self, inputs) -> torch.Tensor:
        """(sum T_b, Hq, D) in inputs.dtype: every request's output, request-major."""
        qo = inputs.qo_indptr.tolist()
        outs = [self.attend(inputs, b, inputs.q[qo[b]:qo[b + 1]]) for b in range(len(inputs.trees))]
        return torch.cat(outs).to(inputs.dtype)

    def prepare(self, inputs):
        """The zero-argument callable returning (sum T_b, Hq, D) in inputs.dtype."""
        return lambda: self.compute(inputs)
