"""Mutants of `Dense`, one (at least) per coverage axis of a check suite: the bug one
would most expect a kernel to have where that axis bites. Each overrides one step.
"""

from __future__ import annotations

import torch
from treebench.harness.selftest.dense import Dense


class MaskWord32(Dense):
    """The tree mask packed into one 32-bit word per query: ancestors at node index >= 32 are lost."""
    name = "mutant_mask_word_32"
    description = "tree mask packed in one 32-bit word per query: ancestors at node index >= 32 lost"
    axis = "mask words"

    def tree_mask(self, inputs, b):
        m = super().tree_mask(inputs, b).clone()
        m[:, 32:] = torch.eye(m.shape[0], dtype=torch.bool)[:, 32:]  # only the diagonal survives past bit 31
        return m


class Page64Offset(Dense):
    """A path specialised for P = 64 that masks the in-page offset with 31 (a P-32 constant)."""
    name = "mutant_page64_offset"
    description = "the P = 64 path masks the in-page offset with 31 instead of 63"
    axis = "page size"

    def token_slots(self, inputs, b, n_tokens):
        page, off = super().token_slots(inputs, b, n_tokens)
        return page, (off & 31) if inputs.page_size == 64 else off


class PowerOfTwoPageOffset(Dense):
    """The in-page offset taken as pos & (P - 1) and the page as pos >> log2(P): right only
    when P is a power of two (a kernel written for 16 / 64 / 128 given P 24 or 3)."""
    name = "mutant_pow2_page_offset"
    description = "in-page offset as pos & (P - 1), page as pos >> floor(log2 P): wrong for P not a power of two"
    axis = "page size"

    def token_slots(self, inputs, b, n_tokens):
        p = inputs.page_size
        if p & (p - 1) == 0:
            return super().token_slots(inputs, b, n_tokens)
        t, shift = torch.arange(n_tokens), p.bit_length() - 1
        pages = torch.tensor(self.page_ids(inputs, b, int(t[-1]) // 2**shift + 1 if n_tokens else 0), dtype=torch.int64)
        return pages[t >> shift], t & (p - 1)


class NoMaxSubtraction(Dense):
    """softmax as exp(s) / sum exp(s) without subtracting the row max: inf / inf at |s| > 88."""
    name = "mutant_no_max_subtraction"
    description = "softmax without max subtraction: exp overflows float32 at large logits (inf / inf)"
    axis = "large logits"

    def softmax_pv(self, scores, v, n_ctx):
        p = torch.exp(scores)                                                  # (Hq, T_b, n)
        return torch.einsum("htn,nhd->thd", p / p.sum(-1, keepdim=True), v)


class MhaFastPath(Dense):
    """A G = 1 fast path that indexes KV head 0 for every query head, as the MQA path does."""
    name = "mutant_g1_fast_path"
    description = "G = 1 (Hq == Hkv) special-cased as MQA: every query head reads KV head 0"
    axis = "G = 1"

    def kv_head(self, h, num_q_heads, num_kv_heads):
        return 0 if num_q_heads == num_kv_heads else super().kv_head(h, num_q_heads, num_kv_heads)


class KvHeadClamped(Dense):
    """Clamps the KV head index to 1, as a kernel built and tested with Hkv = 2 only may: right
    while Hkv <= 2, every query head of KV head 2 and above reads KV head 1."""
    name = "mutant_kv_head_clamped"
    description = "KV head index clamped to 1 (min(h // G, 1)): right only for Hkv <= 2"
    axis = "KV heads > 2"

    def kv_head(self, h, num_q_heads, num_kv_heads):
        return min(super().kv_head(h, num_q_heads, num_kv_heads), 1)


class BatchCutAt8(Dense):
    """Computes requests 0-7 only and leaves the rows of request 8 on zero, as a kernel whose
    grid or per-request metadata holds 8 requests."""
    name = "mutant_batch_cut_at_8"
    description = "requests from index 8 on never computed: their output rows stay zero"
    axis = "batches > 8"
    cut = 8   # the first request index never computed

    def attend(self, inputs, b, q):
        return super().attend(inputs, b, q) if b < self.cut else torch.zeros(q.shape, device=q.device)


class BatchCutAt32(BatchCutAt8):
    """Computes requests 0-31 only, as a kernel whose grid is capped at 32 programs in the request
    dimension or that reads the block table through a 32-entry per-request table: right up to B 32."""
    name = "mutant_batch_cut_at_32"
    description = "requests from index 32 on never computed: their output rows stay zero"
    axis = "batches > 32"
    cut = 32


class FixedSoftmaxScale(Dense):
    """Scales the scores by 1/sqrt(D) from the head dim instead of reading inputs.sm_scale: right
    whenever the caller's scale is the default."""
    name = "mutant_fixed_sm_scale"
    description = "scores scaled by 1/sqrt(D) from the head dim; inputs.sm_scale ignored"
    axis = "softmax scale"

    def scale(self, inputs):
        return inputs.q.shape[-1] ** -0.5


class Fp16Denominator(Dense):
    """The softmax denominator accumulated token by token in float16: it stalls once its
    ulp outgrows the terms (past 2048 for terms near 1, far earlier for small ones)."""
    name = "mutant_fp16_denominator"
    description = "softmax row sum accumulated in float16, token by token (stalls on long contexts)"
    axis = "long context"

    def softmax_pv(self, scores, v, n_ctx):
        p = torch.exp(scores - scores.amax(-1, keepdim=True))                 # (Hq, T_b, n) float32
        l = torch.zeros(p.shape[:2], dtype=torch.float16, device=p.device)    # (Hq, T_b)
        for j in range(p.shape[-1]):
            l = l + p[..., j].half()
        return torch.einsum("htn,nhd->thd", p, v) / l.float().T[..., None]


class ContextPartialDivides(Dense):
    """Normalises the context and tree parts separately before merging them: with L_b = 0
    the context part is 0 / 0 = NaN, and 0 · NaN is NaN."""
    name = "mutant_context0_nan"
    description = "context part normalised by its own sum before the merge: 0 / 0 = NaN when L_b = 0"
    axis = "context 0"

    def softmax_pv(self, scores, v, n_ctx):
        p = torch.exp(scores - scores.amax(-1, keepdim=True))                 # (Hq, T_b, n)
        parts = []
        for lo, hi in ((0, n_ctx), (n_ctx, p.shape[-1])):
            l = p[..., lo:hi].sum(-1)                                          # (Hq, T_b)
            parts.append((l, torch.einsum("htn,nhd->thd", p[..., lo:hi], v[lo:hi]) / l.T[..., None]))
        (lc, oc), (lt, ot) = parts
        return (oc * lc.T[..., None] + ot * lt.T[..., None]) / (lc + lt).T[..., None]


class ReadsPastPageEnd(Dense):
    """When L_b = P·k, the last context token is read from slot P of its page: one past the end,
    which is slot 0 of the next physical page."""
    name = "mutant_context_page_end"
    description = "L_b = P·k: the last context token read one slot past its page end"
    axis = "L_b = P·k"

    def token_slots(self, inputs, b, n_tokens):
        page, off = super().token_slots(inputs, b, n_tokens)
        last, P = int(inputs.context_lens[b]) - 1, inputs.page_size
        if last >= 0 and (last + 1) % P == 0 and last < n_tokens:
            page, off = page.clone(), off.clone()
            page[last], off[last] = (page[last] + 1) % inputs.k_cache.shape[0], 0
        return page, off


class HeadsNodesConfused(Dense):
    """Guesses the query layout from its shape: when T_b == Hq it takes q as (Hq, T_b, D) and transposes."""
    name = "mutant_heads_equal_nodes"
    description = "q layout guessed from its shape: when T_b == Hq it is transposed as if head-major"
    axis = "shape coincidences"

    def attend(self, inputs, b, q):
        if q.shape[0] == q.shape[1]:
            q = q.transpose(0, 1)
        return super().attend(inputs, b, q)


class AccumulatesIntoOutput(Dense):
    """Accumulates into its persistent output buffer, zeroed only by prepare(): the first call is
    right, the second returns twice the answer."""
    name = "mutant_accumulates_output"
    description = "adds into a persistent output buffer zeroed only at prepare(): the second call doubles"
    axis = "repeat"

    def prepare(self, inputs):
        buf = torch.zeros(inputs.q.shape, dtype=inputs.dtype, device=inputs.device)

        def run():
            buf.add_(self.compute(inputs))
            return buf

        return run


class SwitchesAfterWarmup(Dense):
    """Right for its first two calls, then switches path, as an autotuner does once it has timed its
    candidates and settles on one (here a wrong one: the tree mask dropped, every node sees every
    tree node): a check that compares two calls sees the same answer twice."""
    name = "mutant_switches_after_warmup"
    description = "correct for two calls, then a path without the tree mask (an autotuner settling on a bad config)"
    axis = "repeat"

    def prepare(self, inputs):
        calls = [0]
        full = Dense()
        full.tree_mask = lambda inputs, b: torch.ones_like(Dense.tree_mask(full, inputs, b))

        def run():
            calls[0] += 1
            return (self if calls[0] <= 2 else full).compute(inputs)

        return run


AXIS_MUTANTS = (MaskWord32, Page64Offset, PowerOfTwoPageOffset, NoMaxSubtraction, MhaFastPath, KvHeadClamped,
                BatchCutAt8, BatchCutAt32, FixedSoftmaxScale, Fp16Denominator, ContextPartialDivides,
                ReadsPastPageEnd, HeadsNodesConfused, AccumulatesIntoOutput, SwitchesAfterWarmup)
