"""Correct variants of `Dense`: the same attention computed another way, each of which
a check must PASS (a check that flags them has tolerances too tight or a reference
that is itself order-dependent).

- `OnlineReversed`: online (flash-style) softmax over blocks of 5 KV tokens, last block first.
- `SplitKV`: FlashDecoding-style split-KV: per-split partial states merged by their
  log-sum-exp, empty splits (LSE = -inf) handled.
- `PerPath`: Medusa/SpecInfer-style per-path verification: each root-to-leaf path is a
  causal chain over the context plus the path.
- `Bf16Probabilities`: FlashAttention-2's P·V: the unnormalised probabilities
  exp(s - m) rounded to bf16 before the matmul, the row sum kept in float32.
- `DenseLse`: Dense returning (out, lse) (`returns_lse = True`), lse the logsumexp of the
  masked scores; its LSE mutants are in `mutants_lse`.
- `SplitKVLse`: SplitKV returning (out, lse), both out of the pairwise LSE merge.
"""

from __future__ import annotations

import torch
from treebench.harness.adapter.contract import Capabilities
from treebench.harness.selftest.dense import Dense

NEG_INF = float("-inf")


class OnlineReversed(Dense):
    name = "selftest_online_reversed"
    description = "online softmax over blocks of 5 KV tokens, last block first"
    BLOCK = 5  # KV tokens per block

    def softmax_pv(self, scores, v, n_ctx):
        hq, t, n = scores.shape
        m = torch.full((hq, t), NEG_INF, device=scores.device)            # running max (Hq, T_b)
        l = torch.zeros(hq, t, device=scores.device)                       # running sum of exp
        acc = torch.zeros(t, hq, v.shape[-1], device=scores.device)        # (T_b, Hq, D)
        for lo in reversed(range(0, n, self.BLOCK)):
            s = scores[..., lo:lo + self.BLOCK]                             # (Hq, T_b, block)
            m_new = torch.maximum(m, s.amax(-1))
            safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
            alpha = torch.exp(m - safe)                                     # 0 while nothing seen yet
            p = torch.exp(s - safe[..., None])
            l = l * alpha + p.sum(-1)
            acc = acc * alpha.T[..., None] + torch.einsum("htn,nhd->thd", p, v[lo:lo + self.BLOCK])
            m = m_new
        return acc / l.T[..., None]


class SplitKV(Dense):
    name = "selftest_split_kv"
    description = "split-KV in 4 splits of ceil(max S_b / 4) tokens, partial states merged pairwise by LSE"
    SPLITS = 4  # splits per request; the split length is shared by the batch, so short requests have empty ones

    def prepare(self, inputs):
        self._split_len = max(1, -(-int(inputs.seq_lens.max()) // self.SPLITS))
        return super().prepare(inputs)

    def partial(self, s: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(o (T_b, Hq, D), lse (Hq, T_b)) of one split: scores s (Hq, T_b, n) and v (n, Hq, D);
        a split with nothing visible (or no token) has o = 0, lse = -inf."""
        hq, t, n = s.shape
        if n == 0:
            return torch.zeros(t, hq, v.shape[-1], device=s.device), torch.full((hq, t), NEG_INF, device=s.device)
        m = s.amax(-1)
        safe = torch.where(torch.isinf(m), torch.zeros_like(m), m)
        p = torch.exp(s - safe[..., None])                                   # (Hq, T_b, n)
        l = p.sum(-1)
        o = torch.einsum("htn,nhd->thd", p, v) / l.clamp_min(1e-30).T[..., None]
        return o, torch.where(l > 0, safe + torch.log(l), torch.full_like(l, NEG_INF))

    def merge_states(self, a, b):
        """The merged (o, lse) of two partial states; both empty (LSE -inf) stays empty."""
        (oa, la), (ob, lb) = a, b
        m = torch.maximum(la, lb)
        empty = torch.isinf(m)
        safe = torch.where(empty, torch.zeros_like(m), m)
        wa, wb = torch.exp(la - safe), torch.exp(lb - safe)                 # (Hq, T_b)
        total = torch.where(empty, torch.ones_like(m), wa + wb)
        o = (oa * wa.T[..., None] + ob * wb.T[..., None]) / total.T[..., None]
        return o, torch.where(empty, m, safe + torch.log(total))

    def merged(self, scores, v) -> tuple[torch.Tensor, torch.Tensor]:
        """(o (T_b, Hq, D), lse (Hq, T_b)): every split's partial state, merged pairwise by LSE."""
        w = self._split_len
        states = [self.partial(scores[..., i * w:(i + 1) * w], v[i * w:(i + 1) * w]) for i in range(self.SPLITS)]
        while len(states) > 1:                                                # a pairwise merge tree
            states = [self.merge_states(states[i], states[i + 1]) if i + 1 < len(states) else states[i]
                      for i in range(0, len(states), 2)]
        return states[0]

    def softmax_pv(self, scores, v, n_ctx):
        return self.merged(scores, v)[0]


class PerPath(Dense):
    name = "selftest_per_path"
    description = "each root-to-leaf path verified as a causal chain over context + path"

    def attend(self, inputs, b, q):
        n_tokens, n_ctx = self.kv_span(inputs, b)
        k, v = self.gather(inputs, b, n_tokens)
        hq, hkv = q.shape[1], k.shape[1]
        heads = torch.tensor([self.kv_head(h, hq, hkv) for h in range(hq)], device=q.device)
        k, v = k[:, heads], v[:, heads]                                      # (n, Hq, D)
        tree = inputs.trees[b]
        out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)     # (T_b, Hq, D)
        for leaf in tree.leaves:
            path = torch.nonzero(tree.ancestor_mask[leaf]).flatten()         # root .. leaf, in tree order
            keys = torch.cat([torch.arange(n_ctx), n_ctx + path]).to(q.device)
            s = torch.einsum("thd,nhd->htn", q[path.to(q.device)].float(), k[keys]) * self.scale(inputs)
            chain = torch.ones(len(path), len(path), dtype=torch.bool, device=q.device).tril()
            s[..., n_ctx:] = s[..., n_ctx:].masked_fill(~chain, NEG_INF)   # (Hq, len(path), n_ctx + len(path))
            out[path.to(q.device)] = torch.einsum("htn,nhd->thd", s.softmax(-1), v[keys])
        return out


class Bf16Probabilities(Dense):
    name = "selftest_bf16_probabilities"
    description = "FlashAttention-2's P·V: exp(s - m) rounded to bf16 before the matmul, row sum in float32"

    def softmax_pv(self, scores, v, n_ctx):
        p = torch.exp(scores - scores.amax(-1, keepdim=True))                 # (Hq, T_b, n) float32
        l = p.sum(-1)                                                         # (Hq, T_b) float32
        o = torch.einsum("htn,nhd->thd", p.to(torch.bfloat16).float(), v)
        return o / l.T[..., None]


class DenseLse(Dense):
    """Dense that also returns the LSE of its masked float32 scores, (sum T_b, Hq) float32."""

    name = "selftest_dense_lse"
    description = "dense float32 attention returning (out, lse), lse = logsumexp of the masked scores"
    capabilities = Capabilities(devices=("cpu", "cuda"))
    returns_lse = True

    def attend_lse(self, inputs, b: int, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(o (T_b, Hq, D), lse (T_b, Hq)) float32 of request b."""
        scores, v, n_ctx = self.masked_scores(inputs, b, q)
        return self.softmax_pv(scores, v, n_ctx), torch.logsumexp(scores, -1).T    # lse (T_b, Hq)

    def lse_out(self, inputs, lses: list[torch.Tensor]) -> torch.Tensor:
        """(sum T_b, Hq) float32 from the per-request (T_b, Hq) LSEs: concatenated request-major."""
        return torch.cat(lses)

    def compute(self, inputs):
        qo = inputs.qo_indptr.tolist()
        pairs = [self.attend_lse(inputs, b, inputs.q[qo[b]:qo[b + 1]]) for b in range(len(inputs.trees))]
        out = torch.cat([o for o, _ in pairs]).to(inputs.dtype)
        return out, self.lse_out(inputs, [lse for _, lse in pairs]).float().contiguous()


class SplitKVLse(SplitKV, DenseLse):
    """SplitKV returning the merged LSE: 4 splits' partial (o, lse), empty ones -inf, merged pairwise."""

    name = "selftest_split_kv_lse"
    description = "split-KV in 4 splits returning (out, lse), both from the pairwise LSE merge"

    def attend_lse(self, inputs, b, q):
        scores, v, _ = self.masked_scores(inputs, b, q)
        o, lse = self.merged(scores, v)                                    # (T_b, Hq, D), (Hq, T_b)
        return o, lse.T


CORRECT = (Dense, OnlineReversed, SplitKV, PerPath, Bf16Probabilities, DenseLse, SplitKVLse)
