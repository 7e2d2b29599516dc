"""SGLang's Triton `extend_attention_fwd` with its per-request custom mask.

Upstream: `sglang/srt/layers/attention/triton_ops/extend_attention.py`
(written against sglang 0.5.10.post1), the kernel SGLang's Triton attention
backend runs for EAGLE target verify. Its KV cache has page size 1: the prefix
is read through token-level indices into the pool viewed as (N * P, Hkv, D), so
any P works once the block table is expanded to one slot per token (slot =
block_table[b, t // P] * P + t % P). The verify path passes:

- the context as the "prefix": `kv_indptr` (prefix sums of L_b) and
  `kv_indices` (the L_b slots of each request) into `k_buffer` / `v_buffer`;
- the tree's own K/V as the "extend": contiguous `k_extend` / `v_extend`
  (sum T_b, Hkv, D), the tensors the QKV projection has just produced;
- `custom_mask`: request b's (T_b, L_b + T_b) boolean rows flattened row-major,
  concatenated request by request (`mask_indptr` = prefix sums of T_b * S_b),
  the context columns all True. With `skip_prefix_custom_mask=True` (the
  default) the kernel reads only the tree columns of each row.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from types import SimpleNamespace

import torch

from treebench.backends._conversions import flattened_tree_mask, gather_tokens, prefix_sums, token_slots
from treebench.harness.adapter.contract import Backend, Capabilities, register
from treebench.harness.model.paged import BatchInputs

INSTALL_HINT = "sglang not installed: pip install 'sglang[srt]' (its Triton extend_attention_fwd)"
MODULE = "sglang.srt.layers.attention.triton_ops.extend_attention"


@register
class SglangTriton(Backend):
    """SGLang Triton extend attention: context through token indices, tree as extend + custom mask.

    Timed: one `extend_attention_fwd` call writing into a preallocated output.
    Setup (untimed): the token-level `kv_indices` (int64 slots of [0, L_b)) and
    int32 `kv_indptr` / `qo_indptr`, the flattened boolean mask and its int64
    `mask_indptr`, the output buffer, and gathering the tree's K/V (slots of
    [L_b, S_b)) out of the pool into contiguous (sum T_b, Hkv, D) `k_extend` /
    `v_extend`. That copy is not timed because SGLang's verify path never makes
    it: there the tree's K/V arrive as the fresh output of the QKV projection
    (`k.contiguous()`, `v.contiguous()`), and the kernel reads only the context
    from the pool.

    Index dtypes: SGLang's verify metadata builds int32 `kv_indices`; int64 is
    used here (SGLang's draft-extend path converts to int64 too), so slot *
    Hkv * D cannot overflow int32 in the kernel's address arithmetic on large
    pools. `is_causal=True` as SGLang passes it; with a custom mask it only
    bounds the tree columns a query block visits to those before its end, and
    every ancestor precedes its node.

    Any P (the gather makes token indices), any D (the kernel pads to a power of
    two), per-request trees, ragged contexts; fp16/bf16; sm80+.
    """

    install_hint = INSTALL_HINT
    name = "sglang_triton"
    runs_triton = True
    capabilities = Capabilities(devices=("cuda",), dtypes=("bfloat16", "float16"),
                                min_compute_capability=(8, 0))

    def availability(self) -> str | None:
        """The GPU first: the kernel module queries the CUDA device when imported."""
        if not torch.cuda.is_available():
            return "needs a CUDA GPU; none is visible to torch"
        return super().availability()

    @staticmethod
    def _kernel() -> Callable:
        """`extend_attention_fwd` (imported lazily; tests put a fake module in sys.modules).

        Raises:
            ImportError: sglang missing, or its kernel module failed at import.
        """
        try:
            module = importlib.import_module(MODULE)
        except ImportError:
            raise
        except Exception as e:   # e.g. no GPU for the module's import-time device query
            raise ImportError(f"{MODULE} failed at import: {type(e).__name__}: {e}") from e
        return module.extend_attention_fwd

    def load_optional(self) -> object:
        return self._kernel()

    def prepare(self, inputs: BatchInputs) -> Callable[[], torch.Tensor]:
        """Builds the indices, mask, extend K/V and output; returns the timed call.

        Raises:
            BackendUnavailable: sglang cannot be imported.
        """
        kernel = self.optional()
        args = sglang_arguments(inputs)
        out = args.positional[3]

        def run() -> torch.Tensor:
            kernel(*args.positional, **args.keywords)
            return out

        run.kernel = "sglang extend_attention_fwd"
        return run


def sglang_arguments(inputs: BatchInputs) -> SimpleNamespace:
    """`extend_attention_fwd`'s arguments for `inputs` (pure conversion).

    Returns:
        namespace with `positional` = (q_extend (sum T_b, Hq, D), k_extend,
        v_extend (sum T_b, Hkv, D) contiguous, o_extend (sum T_b, Hq, D),
        k_buffer, v_buffer (N * P, Hkv, D) views of the pool, qo_indptr (B+1,)
        int32, kv_indptr (B+1,) int32 = prefix sums of L_b, kv_indices (sum L_b,)
        int64 [kv_indptr[b] + t] -> pool slot of request b's position t (one
        element, 0, when every L_b is 0: a valid pointer the kernel never
        reads), custom_mask (sum T_b * S_b,) bool, is_causal True, mask_indptr
        (B+1,) int64 = prefix sums of T_b * S_b, max_len_extend = max T_b,
        k_scale 1.0, v_scale 1.0) and `keywords` = sm_scale, logit_cap 0,
        skip_prefix_custom_mask True, sliding_window_size -1. Tensors on
        inputs.device.
    """
    ls, ts, ss = inputs.host_lists()
    n, P, Hkv, D = inputs.k_cache.shape
    bt, dev, B = inputs.block_table, inputs.device, inputs.batch_size
    tree_slots = token_slots(bt, ls, ts, P)                                   # (sum T_b,) slots of [L_b, S_b)
    kv_indices = token_slots(bt, [0] * B, ls, P)                              # (sum L_b,) slots of [0, L_b)
    if kv_indices.numel() == 0:
        kv_indices = torch.zeros(1, dtype=torch.int64, device=dev)
    mask_indptr = torch.tensor([0] + [t * s for t, s in zip(ts, ss)], device=dev).cumsum(0)   # int64
    positional = (
        inputs.q, gather_tokens(inputs.k_cache, tree_slots), gather_tokens(inputs.v_cache, tree_slots),
        torch.empty_like(inputs.q),
        inputs.k_cache.view(n * P, Hkv, D), inputs.v_cache.view(n * P, Hkv, D),
        inputs.qo_indptr.to(torch.int32), prefix_sums(ls, dev), kv_indices,
        flattened_tree_mask(inputs.trees, ls).to(dev), True, mask_indptr, max(ts), 1.0, 1.0)
    keywords = dict(sm_scale=inputs.sm_scale, logit_cap=0.0, skip_prefix_custom_mask=True,
                    sliding_window_size=-1)
    return SimpleNamespace(positional=positional, keywords=keywords)
