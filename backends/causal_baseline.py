"""Plain causal attention over the same L_b and T_b, no tree mask: what tree
masking costs, measured against FlashAttention kernels.

Paths, chosen per case (the row's `kernel` names the one taken):

- FlashAttention-3's `flash_attn_interface.flash_attn_with_kvcache` (the Hopper build of
  flash-attn, sm_90+) with `page_table`, `cache_seqlens` = S_b and the packed queries
  through `cu_seqlens_q` (hopper/flash_attn_interface.py), any page size, when that module
  is installed;
- the `flash_attn` package's (FA2) `flash_attn_with_kvcache`, reading the paged pool
  through the block table, when that package is installed and P % 256 == 0 (its
  paged-KV requirement);
- otherwise PyTorch's FlashAttention-2 kernel (`aten._flash_attention_forward`,
  the kernel behind SDPA's flash backend) through its variable-length entry
  `torch.nn.attention.varlen.varlen_attn`, over K/V gathered out of the pages;
  on a torch without `varlen_attn`, SDPA itself with the flash backend forced and
  a lower-right causal bias, for batches of equal L_b and T_b.

Causal here is bottom-right aligned: query i (at position L_b + i) sees KV
positions [0, L_b + i]; the runner hands this backend `inputs.causal()` (each
tree replaced by a chain of the same T_b) and checks it against that reference.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import torch

from treebench.backends._conversions import gather_kv, pad_ragged, padded_rows, prefix_sums, unpad
from treebench.harness.adapter.contract import Backend, Capabilities, capability_skip, register
from treebench.harness.model.cases import Case
from treebench.harness.model.paged import BatchInputs

FLASH_ATTN_PAGE_MULTIPLE = 256  # flash_attn_with_kvcache: paged KV block size must divide by 256


def _flash_attn_with_kvcache() -> Callable | None:
    try:
        from flash_attn import flash_attn_with_kvcache
    except ImportError:
        return None
    return flash_attn_with_kvcache


def _fa3_with_kvcache() -> Callable | None:
    """FlashAttention-3's flash_attn_with_kvcache (module flash_attn_interface), on sm_90+ only."""
    try:
        from flash_attn_interface import flash_attn_with_kvcache
    except ImportError:
        return None
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9:
        return None
    return flash_attn_with_kvcache


def _varlen_attn() -> Callable | None:
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return varlen_attn


@register
class CausalBaseline(Backend):
    """Causal FlashAttention over [0, S_b) for T_b queries: the no-tree baseline.

    Timed: the flash kernel call (plus left-padding q / unpadding the output on
    the flash_attn path, which takes a (B, T_max) query batch).
    Setup (untimed): on the torch paths, gathering each request's K/V [0, S_b)
    through the block table into packed (sum S_b, Hkv, D) tensors (one copy of
    the batch's K/V); building cu_seqlens.

    `kernel_path(case)` names the path a case takes. fp16/bf16, D <= 256 and a
    multiple of 8, sm80+ (FlashAttention-2's limits).
    """

    name = "causal_baseline"
    mask_kind = "causal"
    capabilities = Capabilities(devices=("cuda",), dtypes=("bfloat16", "float16"),
                                min_compute_capability=(8, 0))

    def note(self) -> str:
        """The path cases take here, for `treebench list` (it names a missing flash_attn)."""
        torch_path = "torch varlen_attn (FA2) over gathered K/V" if _varlen_attn() else \
            "torch SDPA flash over gathered K/V (equal L_b and T_b only)"
        if _fa3_with_kvcache() is not None:
            return "FA3 flash_attn_with_kvcache (flash_attn_interface) over the pool, any P"
        if _flash_attn_with_kvcache() is None:
            return f"flash_attn not installed (pip install flash-attn): {torch_path}"
        return f"flash_attn_with_kvcache when P % {FLASH_ATTN_PAGE_MULTIPLE} == 0, else {torch_path}"

    def kernel_path(self, case: Case) -> str:
        """'fa3_with_kvcache', 'flash_attn_with_kvcache' (FA2), 'torch_varlen_flash' or 'torch_sdpa_flash'."""
        if _fa3_with_kvcache():
            return "fa3_with_kvcache"
        if _flash_attn_with_kvcache() and case.page_size % FLASH_ATTN_PAGE_MULTIPLE == 0:
            return "flash_attn_with_kvcache"
        return "torch_varlen_flash" if _varlen_attn() else "torch_sdpa_flash"

    def supports(self, case: Case) -> str | None:
        reason = capability_skip(self.capabilities, case)
        if reason:
            return reason
        if case.head_dim % 8 or case.head_dim > 256:
            return f"head dim {case.head_dim}: FlashAttention needs D <= 256 and a multiple of 8"
        if self.kernel_path(case) == "torch_sdpa_flash" and (case.is_ragged or case.tree_per_request == "mixed"):
            return ("ragged batches need torch.nn.attention.varlen (absent in this torch) "
                    "or the flash_attn package; SDPA's dense flash path needs equal L_b and T_b")
        return None

    def prepare(self, inputs: BatchInputs) -> Callable[[], torch.Tensor]:
        """Builds the chosen path's arguments; returns the timed call."""
        path = self.kernel_path(inputs.case)
        if path == "fa3_with_kvcache":
            fa3 = _fa3_with_kvcache()
            assert fa3 is not None  # kernel_path chose it because it imports
            return _prepare_fa3(inputs, fa3)
        if path == "flash_attn_with_kvcache":
            flash = _flash_attn_with_kvcache()
            assert flash is not None  # kernel_path chose it because it imports
            return _prepare_flash_attn(inputs, flash)
        if path == "torch_varlen_flash":
            varlen = _varlen_attn()
            assert varlen is not None  # kernel_path chose it because it imports
            return _prepare_varlen(inputs, varlen)
        return _prepare_sdpa(inputs)


def _prepare_fa3(inputs: BatchInputs, kernel: Callable) -> Callable[[], torch.Tensor]:
    """FA3 flash_attn_with_kvcache over the pool: packed queries (cu_seqlens_q), bottom-right
    causal per request (query i at position L_b + i), the block table as page_table."""
    _, ts, _ = inputs.host_lists()
    kw = dict(cache_seqlens=inputs.seq_lens.to(torch.int32), page_table=inputs.block_table.to(torch.int32),
              cu_seqlens_q=inputs.qo_indptr.to(torch.int32), max_seqlen_q=max(ts), softmax_scale=inputs.sm_scale,
              causal=True)

    def run() -> torch.Tensor:
        out = kernel(inputs.q, inputs.k_cache, inputs.v_cache, **kw)
        return out[0] if isinstance(out, tuple) else out              # (sum T, Hq, D)

    run.kernel = "fa3 flash_attn_with_kvcache"
    return run


def _prepare_flash_attn(inputs: BatchInputs, kernel: Callable) -> Callable[[], torch.Tensor]:
    """flash_attn_with_kvcache over the pool. Queries are left-padded to T_max so
    that bottom-right causal alignment (query row r sees [0, S_b - T_max + r])
    puts request b's query i at position L_b + i."""
    _, ts, _ = inputs.host_lists()
    t_max = max(ts)
    seqlens = inputs.seq_lens.to(torch.int32)
    rows = padded_rows(ts, t_max, left=True, device=inputs.device)     # no host copy in the timed call

    def run() -> torch.Tensor:
        qp = pad_ragged(inputs.q, ts, t_max, left=True, rows=rows)     # (B, T_max, Hq, D)
        out = kernel(qp, inputs.k_cache, inputs.v_cache, cache_seqlens=seqlens,
                     block_table=inputs.block_table, softmax_scale=inputs.sm_scale, causal=True)
        return unpad(out, ts, left=True, rows=rows)                    # (sum T, Hq, D)

    run.kernel = "fa2 flash_attn_with_kvcache"
    return run


def varlen_keywords(kernel: Callable, sm_scale: float) -> dict:
    """Causal + GQA keywords for whichever `varlen_attn` signature this torch has
    (`is_causal=` in its first releases, `window_size=(-1, 0)` later)."""
    params = inspect.signature(kernel).parameters
    kw: dict = {"scale": sm_scale}
    if "is_causal" in params:
        kw["is_causal"] = True
    else:
        kw["window_size"] = (-1, 0)
    if "enable_gqa" in params:
        kw["enable_gqa"] = True
    return kw


def _prepare_varlen(inputs: BatchInputs, kernel: Callable) -> Callable[[], torch.Tensor]:
    """varlen_attn over gathered, packed K/V (sum S_b, Hkv, D)."""
    _, ts, ss = inputs.host_lists()
    k, v = gather_kv(inputs.k_cache, inputs.v_cache, inputs.block_table, ss)
    cu_q = inputs.qo_indptr.to(torch.int32)
    cu_k = prefix_sums(ss, inputs.device)
    kw = varlen_keywords(kernel, inputs.sm_scale)
    t_max, s_max = max(ts), max(ss)                  # host work stays out of the timed call

    def run() -> torch.Tensor:
        return kernel(inputs.q, k, v, cu_q, cu_k, t_max, s_max, **kw)

    run.kernel = "torch varlen_attn (fa2)"
    return run


def _prepare_sdpa(inputs: BatchInputs) -> Callable[[], torch.Tensor]:
    """SDPA with the flash backend forced, dense (B, H, T|S, D), equal T and S."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.bias import causal_lower_right

    _, ts, ss = inputs.host_lists()
    B, T, S = len(ts), ts[0], ss[0]
    k, v = gather_kv(inputs.k_cache, inputs.v_cache, inputs.block_table, ss)
    k, v = (pad_ragged(x, ss, S).transpose(1, 2) for x in (k, v))    # (B, Hkv, S, D)
    bias = causal_lower_right(T, S)

    def run() -> torch.Tensor:
        q = inputs.q.view(B, T, *inputs.q.shape[1:]).transpose(1, 2)  # (B, Hq, T, D)
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            out = torch.nn.functional.scaled_dot_product_attention(
                q, k, v, attn_mask=bias, scale=inputs.sm_scale, enable_gqa=True)
        return out.transpose(1, 2).reshape(B * T, -1, q.shape[-1])     # (sum T, Hq, D)

    run.kernel = "torch sdpa flash (fa2)"
    return run
