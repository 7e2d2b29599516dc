"""FlashInfer's batch prefill over the paged cache with a boolean custom mask.

Upstream: `flashinfer.BatchPrefillWithPagedKVCacheWrapper` (NHD layout; checked
with flashinfer-python 0.6.18.post1). The tree is expressed as a custom mask
over each request's full KV length: request b's (T_b, S_b) boolean mask,
flattened row-major, concatenated request by request.

fp8 KV: `plan(..., kv_data_type=<the pool's fp8 dtype>)` JIT-builds the FA2
prefill kernel for bf16/fp16 Q over fp8 K/V (it converts each K/V tile to the
query dtype); `run(q, kv, k_scale=, v_scale=)` folds k_scale into sm_scale and
multiplies the output by v_scale (prefill.py, `BatchPrefillWithPagedKVCacheWrapper.run`).
Both are exact for per-tensor scales: a code times a scale is what a stored code means.
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace

import torch

from treebench.backends._conversions import flashinfer_page_metadata, flattened_tree_mask, prefill_backend
from treebench.harness.adapter.contract import Backend, Capabilities, register
from treebench.harness.model.paged import BatchInputs

INSTALL_HINT = "flashinfer not installed: pip install -e '.[gpu]' from the treebench checkout"
WORKSPACE_BYTES = 128 * 1024 * 1024  # float workspace size FlashInfer's docs recommend


@register
class FlashInferMask(Backend):
    """FlashInfer paged prefill with a per-request tree mask.

    Timed: `wrapper.run(q, (k_cache, v_cache), return_lse=True)` and the LSE's base-2 to
    natural-log scaling (FlashInfer's LSE is log2: `backends/_lse.py`). The row's
    `kernel` is the wrapper's backend after `plan` ("flashinfer fa2" or "flashinfer fa3").
    Setup (untimed): the page metadata (int32 `qo_indptr`, `paged_kv_indptr`,
    `paged_kv_indices`, `paged_kv_last_page_len`) built from the block table and
    S_b, the flattened boolean mask, and `wrapper.plan(...)`, which bit-packs the
    mask on the GPU (`segment_packbits`) and schedules the work. The first plan of
    a (dtype, head dim) JIT-compiles FlashInfer's custom-mask kernel (~50 s).

    The boolean `custom_mask` path is used on purpose. With a caller-packed
    `packed_custom_mask`, `plan` keeps `mask_indptr` as element counts (prefix
    sums of T_b * S_b, `_compute_page_mask_indptr`), but the kernel adds it to a
    uint8 pointer as a byte offset (`variants.cuh`: `maybe_custom_mask +
    maybe_mask_indptr[batch_idx]`), so with B > 1 every request after the first
    reads another request's bits. The boolean path has `segment_packbits`
    return byte offsets of byte-aligned segments, which is right.

    Supports per-request trees and ragged contexts; fp16/bf16 queries over a pool
    in their dtype, float8_e4m3fn or float8_e5m2; sm80+.
    """

    install_hint = INSTALL_HINT
    name = "flashinfer_mask"
    returns_lse = True
    lse_base = 2.0          # FlashInfer writes base-2 LSE; the check converts it, outside the timed call
    capabilities = Capabilities(
        devices=("cuda",),
        dtypes=("bfloat16", "float16"),   # FA2 prefill kernels
        kv_dtypes=("float8_e4m3fn", "float8_e5m2"),   # plan(kv_data_type=...), run(k_scale=, v_scale=)
        head_dims=(64, 128, 256),         # head dims FlashInfer instantiates for prefill
        min_compute_capability=(8, 0),
    )

    def __init__(self) -> None:
        self._workspace: torch.Tensor | None = None

    @staticmethod
    def _flashinfer() -> SimpleNamespace:
        """The FlashInfer entry point (imported lazily; tests swap in fakes)."""
        from flashinfer import BatchPrefillWithPagedKVCacheWrapper
        return SimpleNamespace(Wrapper=BatchPrefillWithPagedKVCacheWrapper)

    def load_optional(self) -> object:
        return self._flashinfer()

    def _workspace_on(self, device: torch.device) -> torch.Tensor:
        """One 128 MiB uint8 float workspace per adapter, reused across cases."""
        if self._workspace is None or self._workspace.device != device:
            self._workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        return self._workspace

    def prepare(self, inputs: BatchInputs) -> Callable[[], tuple[torch.Tensor, torch.Tensor]]:
        """Plans the batch; returns the timed `run`, giving (out, natural-log lse).

        Raises:
            BackendUnavailable: flashinfer cannot be imported.
        """
        fi = self.optional()
        plan = flashinfer_plan_arguments(inputs)
        wrapper = fi.Wrapper(self._workspace_on(inputs.device), "NHD")
        wrapper.plan(*plan.positional, **plan.keywords)
        q, kv, scales = inputs.q, (inputs.k_cache, inputs.v_cache), plan.run_keywords

        def run() -> tuple[torch.Tensor, torch.Tensor]:
            return wrapper.run(q, kv, return_lse=True, **scales)      # lse (sum T_b, Hq) fp32, base 2

        run.kernel = "flashinfer " + prefill_backend(wrapper)
        return run


def flashinfer_plan_arguments(inputs: BatchInputs) -> SimpleNamespace:
    """`plan`'s arguments for `inputs` (pure conversion).

    Returns:
        namespace with `positional` = (qo_indptr (B+1,) int32, paged_kv_indptr
        (B+1,) int32, paged_kv_indices (sum pages_b,) int32,
        paged_kv_last_page_len (B,) int32, Hq, Hkv, D, P) and `keywords` =
        custom_mask (sum T_b * S_b,) bool, q_data_type = the input dtype,
        kv_data_type = the pool's dtype, sm_scale; and `run_keywords`: k_scale
        and v_scale (floats) for an fp8 pool, {} otherwise. Tensors on inputs.device.
    """
    ls, _, ss = inputs.host_lists()
    _, P, Hkv, D = inputs.k_cache.shape
    indptr, indices, last = flashinfer_page_metadata(inputs.block_table, ss, P)
    mask = flattened_tree_mask(inputs.trees, ls).to(inputs.device)
    positional = (inputs.qo_indptr.to(torch.int32), indptr, indices, last, inputs.q.shape[1], Hkv, D, P)
    keywords = dict(custom_mask=mask, q_data_type=inputs.dtype, kv_data_type=inputs.k_cache.dtype,
                    sm_scale=inputs.sm_scale)
    fp8 = inputs.k_cache.element_size() == 1
    run_keywords = dict(k_scale=float(inputs.k_scale), v_scale=float(inputs.v_scale)) if fp8 else {}
    return SimpleNamespace(positional=positional, keywords=keywords, run_keywords=run_keywords)
