"""Two-pass tree attention: the method for kernels without a tree mask.

SGLang's FlashAttention-3 backend verifies an EAGLE tree this way
(`python/sglang/srt/layers/attention/flashattention_backend.py`, target verify
with topk > 1, `use_cascade_attn`): pass 1 runs every query of request b over
its L_b context tokens, non-causal, keeping (O, LSE); pass 2 runs each tree
node over the slots of its ancestors and itself only (a per-node page table,
`forward_metadata_spec_decode_expand`, over the cache viewed with page size 1);
the two states are merged by LSE (`merge_state_v2` there, `backends/_lse.py`
here).
Any attention kernel that returns its LSE can be put behind it.

This module holds the inner written in PyTorch (float32 math over gathered
slots, no SDPA), so the method runs on the CPU and in CI; the FlashInfer inner
is `backends/two_pass_flashinfer.py`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from treebench.backends._conversions import token_slots
from treebench.backends._lse import merge_states
from treebench.harness.adapter.contract import Backend, Capabilities, register
from treebench.harness.model.paged import BatchInputs


@register
class TwoPass(Backend):
    """Context pass + tree pass + LSE merge, both passes in float32 PyTorch.

    Timed: per request, gathering its context slots [0, L_b) and tree slots
    [L_b, S_b) from the pool, the two float32 softmax passes with their LSE, and
    the merge. Setup (untimed): the flat slot indices of both passes and each
    request's (T_b, T_b) ancestor mask on the device.

    L_b = 0 makes pass 1 empty: its state is (0, -inf) and the merge returns pass
    2 unchanged. Any device, dtype, P, D, G; per-request trees and ragged
    contexts. A reference for the method, not a fast kernel.
    """

    name = "two_pass"
    capabilities = Capabilities(devices=("cpu", "cuda"))
    returns_lse = True      # the merged state's natural-log LSE

    def prepare(self, inputs: BatchInputs) -> Callable[[], tuple[torch.Tensor, torch.Tensor]]:
        """Builds the slot indices and masks; returns the timed call, giving (out, merged lse)."""
        ls, ts, _ = inputs.host_lists()
        B, P, dev = inputs.batch_size, inputs.page_size, inputs.device
        ctx = token_slots(inputs.block_table, [0] * B, ls, P).split(ls)        # B x (L_b,) int64
        tree = token_slots(inputs.block_table, ls, ts, P).split(ts)            # B x (T_b,) int64
        masks = [t.ancestor_mask.to(dev) for t in inputs.trees]                # B x (T_b, T_b) bool
        q_split = inputs.q.split(ts)                                           # B x (T_b, Hq, D)
        n, _, Hkv, D = inputs.k_cache.shape
        k_flat = inputs.k_cache.reshape(n * P, Hkv, D)                         # pool as (N * P, Hkv, D)
        v_flat = inputs.v_cache.reshape(n * P, Hkv, D)
        scale, dtype = inputs.sm_scale, inputs.dtype

        def run() -> tuple[torch.Tensor, torch.Tensor]:
            o1, lse1 = _per_request(q_split, k_flat, v_flat, ctx, [None] * B, scale)   # context pass
            o2, lse2 = _per_request(q_split, k_flat, v_flat, tree, masks, scale)       # tree pass
            o, lse = merge_states(o1, lse1, o2, lse2)
            return o.to(dtype), lse                                              # (sum T, Hq, D), (sum T, Hq)

        run.kernel = "torch float32 two-pass"
        return run


def _per_request(qs, k_flat, v_flat, slots, masks, scale) -> tuple[torch.Tensor, torch.Tensor]:
    """One pass over the batch: request b's queries against the pool rows `slots[b]`.

    Returns:
        O (sum T_b, Hq, D) float32 and lse (sum T_b, Hq) float32.
    """
    outs = [attend_with_lse(q, k_flat[s], v_flat[s], m, scale) for q, s, m in zip(qs, slots, masks)]
    return torch.cat([o for o, _ in outs]), torch.cat([lse for _, lse in outs])


def attend_with_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor | None,
                    scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax attention of one request with its natural-log LSE, in float32.

    Args:
        q: (T, Hq, D) queries.
        k, v: (S, Hkv, D) keys and values; head h reads KV head h // G.
        allowed: (T, S) bool, or None when every key is visible.
        scale: softmax scale.

    Returns:
        O (T, Hq, D) float32 and lse (T, Hq) float32. S = 0 (or a row that sees
        nothing) gives the empty state (0, -inf).
    """
    T, Hq, D = q.shape
    if k.shape[0] == 0:
        return q.new_zeros(T, Hq, D, dtype=torch.float32), q.new_full((T, Hq), float("-inf"), dtype=torch.float32)
    G = Hq // k.shape[1]
    k = k.float().repeat_interleave(G, dim=1)                        # (S, Hq, D)
    v = v.float().repeat_interleave(G, dim=1)                        # (S, Hq, D)
    s = torch.einsum("thd,shd->hts", q.float(), k) * scale           # (Hq, T, S)
    if allowed is not None:
        s = s.masked_fill(~allowed, float("-inf"))
    m = s.amax(-1, keepdim=True)                                      # (Hq, T, 1)
    m = torch.where(torch.isneginf(m), torch.zeros_like(m), m)        # a row with no key: shift by 0
    p = torch.exp(s - m)                                              # (Hq, T, S)
    den = p.sum(-1)                                                   # (Hq, T)
    o = torch.einsum("hts,shd->thd", p, v) / torch.where(den > 0, den, 1.0).T[..., None]
    return o, (m[..., 0] + torch.log(den)).T                          # (T, Hq, D), (T, Hq)
