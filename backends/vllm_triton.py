"""vLLM's Triton `unified_attention` with a tree `qq_bias`.

Upstream: `vllm/v1/attention/ops/triton_unified_attention.py` (older releases:
`vllm/attention/ops/triton_unified_attention.py`), the kernel vLLM's Triton and
tree-attention backends call. It is causal over the paged cache; `qq_bias`, a
(T, T) float32 additive bias indexed [query, kv_position - L_b], masks the
non-ancestor tree nodes that causality alone would let through (written against
vLLM 0.33.0).

fp8 KV (`--kv-cache-dtype fp8`: a float8_e4m3fn cache): the kernel takes the fp8
pool as is plus `k_descale` / `v_descale` float32 tensors, of which it reads the
first element (`tl.load(k_scale)`), and dequantises each tile in `_cast_kv_tile`
as `(code.to(float32) * k_descale).to(Q.dtype)`. Releases whose unified_attention
has `kv_quant_mode` take that path only with `KVQuantMode.FP8_PER_TENSOR` (with
the default NONE they would cast the codes unscaled); earlier ones choose it from
the cache dtype.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable

import torch

from treebench.backends._conversions import require_shared_tree, tree_additive_bias
from treebench.harness.adapter.contract import Backend, Capabilities, register
from treebench.harness.model.paged import BatchInputs

INSTALL_HINT = "vllm not installed: pip install vllm (needs its Triton unified_attention with qq_bias)"
MODULES = ("vllm.v1.attention.ops.triton_unified_attention",   # vLLM >= 0.11 layout
           "vllm.attention.ops.triton_unified_attention")      # earlier releases


def _unified_attention() -> Callable:
    """vLLM's unified_attention from whichever module path this release has.

    Raises:
        ImportError: vLLM missing, or its kernel lacks `qq_bias`.
    """
    errors = []
    for name in MODULES:
        try:
            fn = importlib.import_module(name).unified_attention
        except (ImportError, AttributeError) as e:
            errors.append(f"{name}: {e}")
            continue
        if "qq_bias" not in inspect.signature(fn).parameters:
            raise ImportError(f"{name}.unified_attention has no qq_bias argument (vLLM too old)")
        return fn
    raise ImportError("; ".join(errors))


@register
class VllmTriton(Backend):
    """vLLM Triton unified attention, causal + one (T, T) tree bias for the batch.

    Timed: one `unified_attention` call writing into a preallocated output.
    Setup (untimed): the float32 (T, T) `qq_bias` (0 for ancestors, -inf
    otherwise), the output buffer, the K/V descales (inputs.k_scale and
    inputs.v_scale; 1.0 for a bf16/fp16 pool).

    Limits: `qq_bias` is one (T, T) tensor shared by the batch (per-request trees
    are a skip); fp16/bf16 queries over a pool in their dtype or float8_e4m3fn
    (vLLM's fp8 cache dtype); sm80+. Reads the pool in place through the block
    table at any P, masking positions >= S_b, so the NaN tails are never used.
    """

    install_hint = INSTALL_HINT
    name = "vllm_triton"
    runs_triton = True
    capabilities = Capabilities(devices=("cuda",), dtypes=("bfloat16", "float16"), kv_dtypes=("float8_e4m3fn",),
                                per_request_trees=False, min_compute_capability=(8, 0))

    @staticmethod
    def _kernel() -> Callable:
        return _unified_attention()

    def load_optional(self) -> object:
        return self._kernel()

    @staticmethod
    def _fp8_quant_mode(kernel: Callable) -> object:
        """vLLM's `KVQuantMode.FP8_PER_TENSOR`, taken from the enum of `kernel`'s `kv_quant_mode`
        default, so it is the one the kernel compares against wherever its module imported it
        from (`vllm.v1.kv_cache_interface` in a full install, a stand-in in a kernel-only copy).

        Raises:
            AttributeError: the enum has no FP8_PER_TENSOR (a vLLM without per-tensor fp8 KV).
        """
        default = inspect.signature(kernel).parameters["kv_quant_mode"].default
        return type(default).FP8_PER_TENSOR

    def prepare(self, inputs: BatchInputs) -> Callable[[], torch.Tensor]:
        """Builds qq_bias and the output buffer; returns the timed call.

        Raises:
            BackendUnavailable: vLLM cannot be imported.
            ConfigError: the batch's trees differ.
        """
        kernel = self.optional()
        kw = vllm_arguments(inputs)
        if inputs.k_cache.element_size() == 1 and "kv_quant_mode" in inspect.signature(kernel).parameters:
            kw["kv_quant_mode"] = self._fp8_quant_mode(kernel)     # else the fp8 codes would be cast unscaled

        def run() -> torch.Tensor:
            kernel(**kw)
            return kw["out"]

        run.kernel = "vllm unified_attention 2d"   # no split-K scratch passed, so never its 3D kernel
        return run


def vllm_arguments(inputs: BatchInputs) -> dict:
    """Keyword arguments of `unified_attention` for `inputs` (pure conversion).

    q (sum T, Hq, D), k/v the (N, P, Hkv, D) pool, out (sum T, Hq, D),
    cu_seqlens_q (B+1,) int32, seqused_k = S_b (B,) int32, block_table (B,
    max_pages) int32, qq_bias (T, T) float32, k/v_descale (B, Hkv) float32
    filled with inputs.k_scale / inputs.v_scale (the kernel reads element 0).

    Raises:
        ConfigError: requests carry different trees.
    """
    require_shared_tree(inputs, "vllm_triton", "qq_bias")
    trees = inputs.trees
    _, ts, ss = inputs.host_lists()
    B, Hkv, dev = len(ts), inputs.k_cache.shape[2], inputs.device
    k_descale = torch.full((B, Hkv), inputs.k_scale, dtype=torch.float32, device=dev)
    v_descale = torch.full((B, Hkv), inputs.v_scale, dtype=torch.float32, device=dev)
    return dict(
        q=inputs.q, k=inputs.k_cache, v=inputs.v_cache, out=torch.empty_like(inputs.q),
        cu_seqlens_q=inputs.qo_indptr.to(torch.int32), max_seqlen_q=max(ts),
        seqused_k=inputs.seq_lens.to(torch.int32), max_seqlen_k=max(ss),
        softmax_scale=inputs.sm_scale, causal=True, window_size=(-1, -1),
        block_table=inputs.block_table, softcap=0.0, q_descale=None,
        k_descale=k_descale, v_descale=v_descale,
        qq_bias=tree_additive_bias(trees[0], torch.float32).to(dev).contiguous())
