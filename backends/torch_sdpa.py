"""PyTorch SDPA over K/V gathered from the paged pool: the portable baseline."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from treebench.backends._conversions import dequantise
from treebench.harness.adapter.contract import Backend, Capabilities, register
from treebench.harness.model.cases import FP8_DTYPES
from treebench.harness.model.paged import BatchInputs
from treebench.harness.model.reference import request_mask


@register
class TorchSdpaBackend(Backend):
    """Dense masked `torch.nn.functional.scaled_dot_product_attention`, one call per request.

    For request b the timed callable gathers the ceil(S_b / P) pages named by
    `block_table[b]` from the paged pool (never from `k_logical`), keeps the
    first S_b tokens, and runs SDPA with a boolean (T_b, S_b) mask: every
    context token [0, L_b) plus the tree's ancestor mask (`enable_gqa=True`:
    query head h reads KV head h // G). The gather is inside the timed
    callable, so the measured time includes copying each request's K/V out of
    the pool; the masks and block-table slices are built untimed in `prepare`.
    Runs on CPU and CUDA, any dtype, page size, head dim and GQA group. An fp8
    pool's codes are gathered as bytes and dequantised in the timed callable
    (float32(code) * scale rounded to the query dtype), then SDPA runs in the
    query dtype.
    """

    name = "torch_sdpa"
    capabilities = Capabilities(devices=("cpu", "cuda"), kv_dtypes=FP8_DTYPES)

    def prepare(self, inputs: BatchInputs) -> Callable[[], torch.Tensor]:
        """Builds per-request masks and page lists; returns the timed callable
        producing (sum T_b, Hq, D) in inputs.dtype on inputs.device."""
        ls, ts, ss = inputs.host_lists()
        P, dev = inputs.page_size, inputs.device
        plan = []
        for b, tree in enumerate(inputs.trees):
            pages = inputs.block_table[b, :-(-ss[b] // P)]                       # (ceil(S_b / P),) int32
            mask = request_mask(tree.ancestor_mask, ls[b]).to(dev)               # (T_b, S_b) bool
            plan.append((pages, ss[b], mask))
        q_split = inputs.q.split(ts)                                              # B x (T_b, Hq, D)
        fp8 = inputs.k_cache.element_size() == 1
        k_cache, v_cache = (c.view(torch.uint8) if fp8 else c for c in (inputs.k_cache, inputs.v_cache))
        kv_dtype, scale, dtype = inputs.k_cache.dtype, inputs.sm_scale, inputs.dtype
        k_scale, v_scale = inputs.k_scale, inputs.v_scale

        def run() -> torch.Tensor:
            outs = []
            for q, (pages, s, mask) in zip(q_split, plan):
                k = k_cache.index_select(0, pages).flatten(0, 1)[:s]             # (S_b, Hkv, D)
                v = v_cache.index_select(0, pages).flatten(0, 1)[:s]             # (S_b, Hkv, D)
                if fp8:                                                          # bytes -> codes -> values
                    k = dequantise(k.view(kv_dtype), k_scale, dtype)
                    v = dequantise(v.view(kv_dtype), v_scale, dtype)
                o = F.scaled_dot_product_attention(
                    q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
                    attn_mask=mask, scale=scale, enable_gqa=True)                 # (1, Hq, T_b, D)
                outs.append(o[0].transpose(0, 1))                                # (T_b, Hq, D)
            return torch.cat(outs)                                               # (sum T_b, Hq, D)

        run.kernel = "torch sdpa per request (dense masked; torch picks the sdpa backend)"
        return run
