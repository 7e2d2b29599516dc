"""TensorRT-LLM's XQA kernel, as FlashInfer ships it: `flashinfer.xqa`.

XQA is TensorRT-LLM's decode-phase MHA/GQA kernel; built with SPEC_DEC it is
TensorRT-LLM's Medusa/EAGLE verify kernel (the tree's T tokens as `q_seq_len`
query rows per request, a bit mask over the draft block). FlashInfer vendors
its source (`csrc/xqa/mha.cu`, `mha_sm90.cu`) and JIT-builds one module per
(dtype, P, D, G, q_seq_len). Written against flashinfer-python 0.6.18.post1.

The speculative-decoding mask, read from `applyMaskFromInput` in mha.cu:

- `seq_lens[b]` is S_b: the tree's K/V are already in the cache, as the last
  T_b tokens of the sequence. Positions [0, S_b - T_b) = [0, L_b) are always
  visible; position L_b + j is visible to row i iff bit j of row i is set.
- Bit j of row i: node i may see node j (its ancestors and itself). A row is
  ceil(q_seq_len / 32) 32-bit words (the kernel reads them as pairs of uint16:
  uint16 word j // 16, bit j % 16, least significant bit first; little-endian,
  so also 32-bit word j // 32, bit j % 32). Bits at j >= T_b are padding, 0.
- Rows are request-major: [B, q_seq_len, 2 * ceil(q_seq_len / 32)] uint16 with
  one T for the batch, or [sum T_b, ...] packed by `q_cu_seq_lens` (ragged Q),
  each row still ceil(q_seq_len / 32) words wide for q_seq_len = max T_b.

fp8 KV: xqa takes a float8_e4m3fn pool (its only fp8 format) and one `kv_scale`
for both K and V (the kernel's qk scale is q_scale * kv_scale / sqrt(D) and its
output scale kv_scale * rcp_out_scale), so a case with k_scale != v_scale is a
skip. On SM90 an fp8 pool runs `mha_sm90.cu` (`run_sm90_fp8_mha`), whose MMAs
take their operands in the cache's fp8 type: Q and the probabilities are
rounded to e4m3 as well, beyond the "K/V rounded to the query dtype" that the
fp8 tolerance allows (harness/model/compare.py), so expect mismatches there.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Sequence

import torch

from treebench.harness.adapter.contract import Backend, Capabilities, register
from treebench.harness.model.cases import Case
from treebench.harness.model.paged import BatchInputs
from treebench.harness.model.trees import TokenTree

INSTALL_HINT = ("flashinfer not installed: pip install -e '.[gpu]' from the treebench checkout (flashinfer.xqa is TensorRT-LLM's "
                "XQA kernel, its Medusa/EAGLE verify path)")
SEMAPHORE_BYTES = 8 * 1024 * 1024     # what FlashInfer's own XQA decode path reserves (decode.py)
SCRATCH_BYTES = 128 * 1024 * 1024     # multi-block partial results
XQA_MAJORS = (9, 10, 12)              # xqa.py: "XQA is only supported on SM90, SM100, SM120/SM121 GPUs"


@register
class FlashInferXqa(Backend):
    """TensorRT-LLM's XQA Medusa/EAGLE verify kernel through `flashinfer.xqa`.

    Timed: one `xqa(...)` call writing into a preallocated output (FlashInfer's
    Python wrapper included: it picks the module, cached after the first call).
    Setup (untimed): the uint16 bit mask, `seq_lens` = S_b as (B, 1) uint32,
    `q_cu_seq_lens` when the T_b differ, the output, a zeroed 8 MiB semaphore
    buffer and a 128 MiB scratch (one pair per adapter, reused), and one warm-up
    call that JIT-builds the module of this (dtype, P, D, G, q_seq_len).

    One T for the batch: q viewed as (B, 1, T, Hq, D) (beam width 1). T_b that
    differ: ragged Q, q packed (sum T_b, Hq, D) with `q_cu_seq_lens` and
    q_seq_len = max T_b. T = 1 everywhere: plain decode (q_seq_len 1, no mask).
    The kernel's scale is q_scale / sqrt(D), so q_scale = sm_scale * sqrt(D).

    Limits (xqa.py, jit/xqa.py): P in {16, 32, 64, 128}; D % 16 == 0 and
    16 <= D <= 256 with speculative decoding; KV in the query dtype (fp16 or
    bf16) or float8_e4m3fn with k_scale == v_scale; SM90, SM100 or SM120 only (bf16/fp16 KV runs the generic mha.cu kernel on
    SM90, the Hopper kernel being for fp8 KV).
    """

    install_hint = INSTALL_HINT
    name = "flashinfer_xqa"
    capabilities = Capabilities(
        devices=("cuda",),
        dtypes=("bfloat16", "float16"),            # INPUT_FP16 with CACHE_ELEM_ENUM 0: KV in the input dtype
        kv_dtypes=("float8_e4m3fn",),              # CACHE_ELEM_ENUM 2; one kv_scale (see supports)
        page_sizes=(16, 32, 64, 128),              # gen_xqa_module: TOKENS_PER_PAGE
        head_dims=tuple(range(16, 257, 16)),       # HEAD_ELEMS % 16 == 0; > 256 has no SPEC_DEC
        min_compute_capability=(9, 0),
    )

    def __init__(self) -> None:
        self._buffers: tuple[torch.Tensor, torch.Tensor] | None = None

    @staticmethod
    def _xqa() -> Callable:
        """`flashinfer.xqa` (imported lazily; tests put a fake module in sys.modules)."""
        from flashinfer import xqa
        return xqa

    def load_optional(self) -> object:
        return self._xqa()

    def availability(self) -> str | None:
        reason = super().availability()
        if reason is None and torch.cuda.get_device_capability()[0] not in XQA_MAJORS:
            return f"XQA runs on SM90, SM100 and SM120 only; this GPU is {torch.cuda.get_device_capability()}"
        return reason

    def note(self) -> str:
        """For `treebench list`: what this kernel is."""
        return ("TensorRT-LLM's XQA kernel (its Medusa/EAGLE spec-decoding verify path) as shipped in "
                "flashinfer.xqa; ragged trees through q_cu_seq_lens")

    def supports(self, case: Case) -> str | None:
        reason = super().supports(case)
        if reason is None and case.kv_fp8 and case.k_scale != case.v_scale:
            return (f"xqa takes one kv_scale for K and V; this case has k_scale {case.k_scale:g} != "
                    f"v_scale {case.v_scale:g}")
        if reason is None and len({t.size for t in case.trees()}) > 1 and not self._has_ragged_q():
            return "trees of different sizes need xqa's q_cu_seq_lens (ragged Q); this FlashInfer lacks it"
        return reason

    def _has_ragged_q(self) -> bool:
        try:
            return "q_cu_seq_lens" in inspect.signature(self._xqa()).parameters
        except ImportError:
            return True   # availability() reports the missing package

    def _buffers_on(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """(scratch uint8, semaphores uint32 zeroed), allocated once per adapter."""
        if self._buffers is None or self._buffers[0].device != device:
            scratch = torch.zeros(SCRATCH_BYTES, dtype=torch.uint8, device=device)
            semaphores = torch.zeros(SEMAPHORE_BYTES, dtype=torch.uint8, device=device).view(torch.uint32)
            self._buffers = (scratch, semaphores)
        return self._buffers

    def prepare(self, inputs: BatchInputs) -> Callable[[], torch.Tensor]:
        """Builds the mask and metadata, warms up (JIT build); returns the timed call.

        Raises:
            BackendUnavailable: flashinfer cannot be imported.
        """
        xqa = self.optional()
        kw = xqa_arguments(inputs, *self._buffers_on(inputs.device))
        result = kw["output"].view(inputs.q.shape)          # (sum T_b, Hq, D) view of the output

        def run() -> torch.Tensor:
            xqa(**kw)
            return result

        run()   # builds the JIT module outside the timed region
        major = torch.cuda.get_device_capability(inputs.device)[0] if inputs.device.type == "cuda" else 0
        run.kernel = xqa_kernel(kw, major)
        return run


def xqa_kernel(kw: dict, sm_major: int) -> str:
    """The XQA source `flashinfer.xqa` runs for these arguments (the row's `kernel`): the Hopper
    kernel mha_sm90.cu for an fp8 (e4m3) pool on SM9x with D <= 256, except that speculative
    decoding (q_seq_len > 1) takes it only with one T for the batch and q_seq_len * G > 32
    (ragged Q, and the SWAP_AB shapes q_seq_len * G <= 32, go to mha.cu); else the generic mha.cu.
    Mirrors flashinfer/xqa.py `xqa` (run_sm90_fp8_mha) and jit/xqa.py `swap_ab_eligible`,
    FlashInfer 0.6.18.post1.

    Args:
        kw: `xqa_arguments`' dict: k_cache (N, P, Hkv, D), q (..., Hq, D), num_kv_heads, q_seq_len,
            q_cu_seq_lens ((B+1,) int32 or None).
        sm_major: the GPU's compute-capability major (9: Hopper; 0 off a GPU).

    Returns:
        "xqa mha_sm90 (Hopper)" or "xqa mha (generic)". Raises nothing."""
    k_cache, q = kw["k_cache"], kw["q"]
    d, hkv = k_cache.shape[-1], kw["num_kv_heads"]
    g = q.shape[-2] // hkv
    hopper = k_cache.dtype == torch.float8_e4m3fn and sm_major == 9 and d <= 256
    if hopper and kw["q_seq_len"] > 1 and (kw["q_cu_seq_lens"] is not None or kw["q_seq_len"] * g <= 32):
        hopper = False
    return "xqa mha_sm90 (Hopper)" if hopper else "xqa mha (generic)"


def xqa_arguments(inputs: BatchInputs, scratch: torch.Tensor, semaphores: torch.Tensor) -> dict:
    """Keyword arguments of `flashinfer.xqa` for `inputs` (pure conversion).

    q / output (B, 1, T, Hq, D), or (B, 1, Hq, D) when T = 1, or (sum T_b, Hq,
    D) with q_cu_seq_lens (B+1,) int32 when the T_b differ; k/v_cache the (N,
    P, Hkv, D) pool (NHD); page_table (B, max_pages) int32; seq_lens (B, 1)
    uint32 = S_b; mask uint16 from `xqa_tree_mask` (None when T = 1);
    q_scale = sm_scale * sqrt(D); kv_scale = inputs.k_scale (= v_scale; 1.0 for a
    bf16/fp16 pool). Tensors on inputs.device.

    Raises:
        ConfigError: an fp8 pool with k_scale != v_scale (xqa has one kv_scale).
    """
    if inputs.k_scale != inputs.v_scale:
        from treebench.harness.errors import ConfigError
        raise ConfigError(f"flashinfer_xqa: one kv_scale for K and V, but k_scale {inputs.k_scale:g} != "
                          f"v_scale {inputs.v_scale:g}")
    _, ts, _ = inputs.host_lists()
    B, (_, Hq, D), dev = inputs.batch_size, inputs.q.shape, inputs.device
    t_max, ragged = max(ts), len(set(ts)) > 1
    if ragged:
        q = inputs.q
    else:
        q = inputs.q.view(B, 1, t_max, Hq, D) if t_max > 1 else inputs.q.view(B, 1, Hq, D)
    mask = None
    if t_max > 1:
        bits = xqa_tree_mask(inputs.trees, t_max)                               # (sum T_b, W) uint16, CPU
        mask = bits.view(torch.int16).to(dev).view(torch.uint16)                # moved as int16: a plain copy
        mask = mask if ragged else mask.view(B, t_max, -1)                      # (B, T, W)
    return dict(
        q=q, k_cache=inputs.k_cache, v_cache=inputs.v_cache, page_table=inputs.block_table.to(torch.int32),
        seq_lens=inputs.seq_lens.to(torch.int32).view(torch.uint32).reshape(B, 1),
        output=torch.empty_like(q), workspace_buffer=scratch, semaphores=semaphores,
        num_kv_heads=inputs.k_cache.shape[2], page_size=inputs.page_size,
        q_scale=inputs.sm_scale * math.sqrt(D), kv_scale=float(inputs.k_scale), kv_layout="NHD",
        q_seq_len=t_max, mask=mask,
        q_cu_seq_lens=inputs.qo_indptr.to(torch.int32).contiguous() if ragged else None)


def xqa_tree_mask(trees: Sequence[TokenTree], q_seq_len: int) -> torch.Tensor:
    """XQA's speculative-decoding bit mask of a batch of trees.

    Row i of request b (rows request-major) sets bit j iff node j is node i or
    one of its ancestors: uint16 word j // 16, bit j % 16 (LSB first). Each row
    is 2 * ceil(q_seq_len / 32) uint16 words (32-bit aligned, as mha.cu reads
    it); bits at j >= T_b are 0.

    Args:
        trees: B token trees, T_b <= q_seq_len.
        q_seq_len: the kernel's q_seq_len (max T_b).

    Returns:
        (sum T_b, 2 * ceil(q_seq_len / 32)) uint16 on the CPU.
    """
    words = 2 * -(-q_seq_len // 32)                                         # uint16 words per row
    weights = torch.tensor([1 << k for k in range(16)], dtype=torch.int64)  # bit k of a word
    rows = []
    for tree in trees:
        bits = torch.zeros(tree.size, words * 16, dtype=torch.int64)
        bits[:, :tree.size] = tree.ancestor_mask.long()                    # (T_b, T_b): [i, j] node i sees j
        values = (bits.view(tree.size, words, 16) * weights).sum(-1)       # (T_b, words) in [0, 2^16)
        rows.append(values)
    packed = torch.cat(rows)                                                # (sum T_b, words) int64
    return ((packed + 2 ** 15) % 2 ** 16 - 2 ** 15).to(torch.int16).view(torch.uint16)
