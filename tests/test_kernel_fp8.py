"""The Triton tree kernel reading fp8 K/V pools (float8_e4m3fn, float8_e5m2) with per-tensor
scales: a stored code c means float(c) * scale (`BackendInputs.k_scale` / `v_scale`).

The case is built in bf16 by `build_inputs`, its pools converted to codes here
(codes = (pool / scale).to(fp8); the unused slots' NaN stays the fp8 NaN code, so a read
of one shows), and the kernel compared with a float64 dense attention over the
dequantised codes. CPU: Triton's interpreter, tiny shapes; `gpu` tests: compiled.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tests.kernel_device import DEVICE, TINY, triton  # noqa: E402,F401  (sets TRITON_INTERPRET first)
import triton.language as tl  # noqa: E402
from treebench.harness.errors import ConfigError  # noqa: E402
from treebench.harness.model.cases import Case  # noqa: E402
from treebench.harness.model.compare import compare  # noqa: E402
from treebench.harness.model.paged import BackendInputs, build_inputs  # noqa: E402
from treebench.harness.model.reference import paged_reference_attention  # noqa: E402
from treebench.kernels.options import KernelOptions  # noqa: E402

from treebench.kernels.tree_attention import TreeAttention, ws_unsupported  # noqa: E402
from treebench.kernels.tree_attention_tl import _fp8_bits_to_fp16  # noqa: E402

FP8 = {"e4m3fn": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}


def to_fp8(pool: torch.Tensor, dtype: torch.dtype, headroom: float = 0.5) -> tuple[torch.Tensor, float]:
    """(codes, scale): the finite values' amax maps to `headroom` of the format's largest value."""
    amax = pool[~pool.isnan()].abs().max().item()
    scale = amax / (torch.finfo(dtype).max * headroom)
    return (pool.float() / scale).to(dtype), scale


def fp8_inputs(case: Case, dtype: torch.dtype) -> tuple[BackendInputs, BackendInputs]:
    """(fp8 inputs for the kernel, the same batch over the dequantised pools in float64)."""
    inputs = build_inputs(case, DEVICE).for_backend()
    (kc, ks), (vc, vs) = to_fp8(inputs.k_cache, dtype), to_fp8(inputs.v_cache, dtype, headroom=0.25)
    assert kc.float().isnan().any() and vc.float().isnan().any()     # the unused slots hold the NaN code
    fp8 = dataclasses.replace(inputs, k_cache=kc, v_cache=vc, k_scale=ks, v_scale=vs)
    deq = dataclasses.replace(inputs, k_cache=kc.double() * ks, v_cache=vc.double() * vs)
    return fp8, deq


def run_fp8(case: Case, dtype: torch.dtype, **kw) -> TreeAttention:
    fp8, deq = fp8_inputs(case, dtype)
    ta = TreeAttention(fp8, **kw)
    ta.out.fill_(float("nan"))
    out = ta()
    rec = compare(out, paged_reference_attention(deq), fp8.qo_indptr, case.dtype)
    assert rec.passed, rec
    return ta


@pytest.mark.parametrize("fmt", ["e4m3fn", "e5m2"])
@pytest.mark.parametrize("page_size,splits", [(16, 1), (8, 3), (1, 1), (24, 2)])
def test_fp8_pools_ragged_contexts_mixed_trees(fmt, page_size, splits):
    """Per-request trees, L_b in [0, 50]: context tiles, masked tail tiles and (split-KV)
    splits that see nothing; the scales are far from 1, so a missing one fails."""
    case = Case(batch_size=3, context_len="ragged:0-50", tree="full:2:2", tree_per_request="mixed",
                page_size=page_size, **TINY)
    ta = run_fp8(case, FP8[fmt], num_splits=splits)
    assert ta.kernel.startswith("tl ")


@pytest.mark.parametrize("kv_desc", [True, False])
def test_fp8_pools_through_tma_descriptors_and_pointer_loads(kv_desc):
    """P 32 with 16-token tiles: the context tiles by TMA boxes of fp8 codes, or pointer loads."""
    case = Case(batch_size=2, context_len="list:40,75", tree="full:2:2", page_size=32, **TINY)
    ta = run_fp8(case, torch.float8_e4m3fn, options=KernelOptions(kv_desc=kv_desc))
    assert ta.kernel == ("tl tma splits=1" if kv_desc else "tl tile splits=1")


@pytest.mark.parametrize("mode", ["bias", "causal"])
def test_fp8_pools_in_bias_and_causal_modes(mode):
    case = Case(batch_size=2, context_len=20, tree="full:2:2", page_size=8, **TINY)
    fp8, deq = fp8_inputs(case, torch.float8_e5m2)
    if mode == "causal":
        fp8, deq = fp8.causal(), deq.causal()
    out = TreeAttention(fp8, mode)()
    assert compare(out, paged_reference_attention(deq), fp8.qo_indptr, case.dtype).passed


def test_fp8_scales_are_applied():
    """The same codes with k_scale and v_scale doubled: the scores sharpen and the output doubles
    relative to it, so a kernel that ignored either scale would match neither reference."""
    case = Case(batch_size=1, context_len=30, tree="full:2:1", page_size=16, **TINY)
    fp8, deq = fp8_inputs(case, torch.float8_e4m3fn)
    twice = dataclasses.replace(fp8, k_scale=2 * fp8.k_scale, v_scale=2 * fp8.v_scale)
    ref = paged_reference_attention(dataclasses.replace(deq, k_cache=deq.k_cache * 2, v_cache=deq.v_cache * 2))
    assert compare(TreeAttention(twice)(), ref, fp8.qo_indptr, case.dtype).passed
    assert not compare(TreeAttention(fp8)(), ref, fp8.qo_indptr, case.dtype).passed


@pytest.mark.parametrize("path", ["bits", "fp16"])
@pytest.mark.parametrize("fmt", ["e4m3fn", "e5m2"])
@pytest.mark.parametrize("qdtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("page_size,kv_desc", [(16, False), (32, True)])
def test_fp8_paths_match_the_reference(path, fmt, qdtype, page_size, kv_desc):
    """The alternative fp8 paths (`KernelOptions.fp8_path`) over ragged contexts with scales far
    from 1: pointer loads (P 16, 16-token tiles) and TMA context tiles (P 32)."""
    case = Case(batch_size=3, context_len="ragged:0-50", tree="full:2:2", tree_per_request="mixed",
                page_size=page_size, dtype=qdtype, **TINY)
    ta = run_fp8(case, FP8[fmt], options=KernelOptions(fp8_path=path, kv_desc=kv_desc))
    assert ta.kernel == ("tl tma splits=1" if kv_desc else "tl tile splits=1")


@pytest.mark.parametrize("path", ["bits", "fp16", "cast"])
def test_fp8_paths_keep_bf16_queries_past_fp16s_range(path):
    """bf16 queries up to 2^20 in some rows (fp16's largest value is 65504) and the K scale
    shrunk to keep the logits moderate: the fp16 paths scale such rows into fp16's range
    (`Q_ROW_SCALE`), so every output is finite and matches; without it they overflow to NaN."""
    case = Case(batch_size=2, context_len="list:9,20", tree="full:2:2", page_size=16, **TINY)
    fp8, deq = fp8_inputs(case, torch.float8_e4m3fn)
    q = fp8.q.clone()
    q[::2] *= 2.0 ** 20                                   # every other token's rows past fp16's range
    shrink = 2.0 ** -20
    fp8 = dataclasses.replace(fp8, q=q, k_scale=fp8.k_scale * shrink)
    deq = dataclasses.replace(deq, q=q, k_cache=deq.k_cache * shrink)
    assert q.abs().max().item() > 65504 and q.dtype == torch.bfloat16
    out = TreeAttention(fp8, options=KernelOptions(fp8_path=path))()
    assert out.isfinite().all()
    assert compare(out, paged_reference_attention(deq), fp8.qo_indptr, case.dtype).passed


@triton.jit
def _convert_kernel(X, Y, N: tl.constexpr):
    offs = tl.arange(0, N)
    tl.store(Y + offs, _fp8_bits_to_fp16(tl.load(X + offs)))


@pytest.mark.parametrize("fmt", ["e4m3fn", "e5m2"])
def test_fp8_bit_conversion_of_every_code(fmt):
    """`_fp8_bits_to_fp16` over all 256 codes equals torch's conversion to fp16 on every finite
    code (denormals and both zeros included, compared bit for bit)."""
    out_dtype = torch.float16
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(FP8[fmt]).to(DEVICE)
    out = torch.empty(256, dtype=out_dtype, device=DEVICE)
    _convert_kernel[(1,)](codes, out, N=256)
    want = codes.to(out_dtype)
    finite = want.isfinite()
    assert finite.sum() == (254 if fmt == "e4m3fn" else 248)
    assert torch.equal(out[finite].view(torch.int16), want[finite].view(torch.int16))


def test_fp8_path_option_is_checked():
    with pytest.raises(ConfigError, match="fp8_path='fast'"):
        KernelOptions(fp8_path="fast")


def test_kv_pool_dtypes_the_kernel_refuses():
    case = Case(batch_size=1, context_len=10, tree="full:2:1", page_size=16, **TINY)
    inputs = build_inputs(case, DEVICE).for_backend()
    with pytest.raises(ConfigError, match="kv dtype torch.float32"):
        TreeAttention(dataclasses.replace(inputs, k_cache=inputs.k_cache.float(), v_cache=inputs.v_cache.float()))
    fp8, _ = fp8_inputs(case, torch.float8_e4m3fn)
    with pytest.raises(ConfigError, match="v_cache dtype"):
        TreeAttention(dataclasses.replace(fp8, v_cache=inputs.v_cache))


@pytest.mark.gpu
@pytest.mark.skipif(DEVICE != "cuda", reason="needs a CUDA GPU")
@pytest.mark.parametrize("fmt", ["e4m3fn", "e5m2"])
@pytest.mark.parametrize("page_size", [16, 128, 24])
@pytest.mark.parametrize("tree,batch", [("full:3:1", 3), ("random:40:3", 5), ("full:3:3", 64)])
def test_fp8_pools_on_gpu(fmt, page_size, tree, batch):
    """Compiled, GPU configs: 16-160 packed rows, TMA tiles at P 128; the warp-specialised
    kernel refuses fp8 pools (B 64, 160 rows would take it), so the tl kernel runs."""
    case = Case(batch_size=batch, context_len="ragged:0-900", tree=tree, tree_per_request="mixed",
                page_size=page_size, num_q_heads=32, num_kv_heads=8, head_dim=128)
    ta = run_fp8(case, FP8[fmt])
    assert ta.kernel.startswith("tl ")
    assert "fp8" in ws_unsupported(fp8_inputs(case, FP8[fmt])[0])


@pytest.mark.gpu
@pytest.mark.skipif(DEVICE != "cuda", reason="needs a CUDA GPU")
@pytest.mark.parametrize("path", ["bits", "fp16"])
@pytest.mark.parametrize("fmt", ["e4m3fn", "e5m2"])
@pytest.mark.parametrize("page_size,tree,batch", [(16, "full:3:1", 3), (128, "random:40:3", 5)])
def test_fp8_paths_on_gpu(path, fmt, page_size, tree, batch):
    """The alternative fp8 paths compiled: the mma_v2 (16-row) and wgmma (64-row) tiles."""
    case = Case(batch_size=batch, context_len="ragged:0-900", tree=tree, tree_per_request="mixed",
                page_size=page_size, num_q_heads=32, num_kv_heads=8, head_dim=128)
    assert run_fp8(case, FP8[fmt], options=KernelOptions(fp8_path=path)).kernel.startswith("tl ")
