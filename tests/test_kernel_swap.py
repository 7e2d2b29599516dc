"""The tl kernel with swapped MMA operands (`KernelOptions.swap_ab`: S^T = K Q^T, O^T += V^T P^T,
`kernels/tree_attention_swap.py`) against the float64 reference, output and LSE: bf16 / fp16
and fp8 pools, both loops (context tiles and the masked tail), every mask mode, TMA and
pointer loads, split-KV. CPU: Triton's interpreter, tiny shapes; `gpu` tests: compiled.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tests.kernel_device import DEVICE, TINY, run_checked, triton  # noqa: E402,F401  (sets TRITON_INTERPRET first)
from tests.test_kernel_fp8 import FP8, fp8_inputs, run_fp8  # noqa: E402
from treebench.harness.errors import ConfigError  # noqa: E402
from treebench.harness.model.cases import Case  # noqa: E402
from treebench.harness.model.compare import compare  # noqa: E402
from treebench.harness.model.paged import build_inputs  # noqa: E402
from treebench.harness.model.reference import paged_reference_attention  # noqa: E402
from treebench.kernels.options import KernelOptions  # noqa: E402
from treebench.kernels.tree_attention import TreeAttention  # noqa: E402
from treebench.kernels.tree_attention_plan import KernelConfig  # noqa: E402

SWAP = KernelOptions(swap_ab=True)


def swap_const(ta: TreeAttention) -> bool:
    """The SWAP_AB constexpr the forward kernel was launched with."""
    return ta._launches[0].consts["SWAP_AB"]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("page_size,kv_desc,splits", [(16, False, 1), (32, True, 1), (16, False, 3), (32, True, 2)])
def test_swap_ab_ragged_contexts_mixed_trees(dtype, page_size, kv_desc, splits):
    """Per-request trees, L_b in [0, 60]: context tiles, the masked tail, splits that see
    nothing of a request; P 16 by pointer loads, P 32 by TMA boxes (16-token tiles)."""
    case = Case(batch_size=3, context_len="ragged:0-60", tree="full:2:2", tree_per_request="mixed",
                page_size=page_size, dtype=dtype, **TINY)
    ta = run_checked(case, num_splits=splits, options=KernelOptions(swap_ab=True, kv_desc=kv_desc))
    assert swap_const(ta) and ta.kernel == f"tl {'tma' if kv_desc else 'tile'} splits={splits}"


@pytest.mark.parametrize("cfg", [KernelConfig(16, 16, 1, 1, bt_ahead=1), KernelConfig(32, 32, 1, 1),
                                 KernelConfig(16, 64, 1, 1, bt_ahead=1)])
@pytest.mark.parametrize("kv_desc,fused", [(False, False), (True, True)])
def test_swap_ab_tiles_gather_and_fused_merge(cfg, kv_desc, fused):
    """Other tiles (a 64-token tile spans four 16-token pages: the per-token gather; P 64 by
    TMA), the block table read a tile ahead, early-first offsets, the fused split merge; the
    27-node tree gives 54 packed rows, so several M-tiles."""
    p = 16 if not kv_desc else 64
    case = Case(batch_size=2, context_len="list:70,5", tree="vllm:pr_27", page_size=p, **TINY)
    opts = KernelOptions(swap_ab=True, kv_desc=kv_desc, early_first=not kv_desc)
    ta = run_checked(case, config=cfg, num_splits=2, fused_merge=fused, options=opts)
    assert swap_const(ta) and ta.plan.m_tiles > 1


@pytest.mark.parametrize("mode", ["bias", "causal"])
def test_swap_ab_bias_and_causal_modes(mode):
    case = Case(batch_size=2, context_len="list:20,3", tree="full:2:2", page_size=8, **TINY)
    assert swap_const(run_checked(case, mode, num_splits=2, options=SWAP))


def test_swap_ab_tree_wider_than_one_mask_word():
    """80 nodes: the tail tiles read two 64-bit mask words per row."""
    case = Case(batch_size=1, context_len=10, tree="random:79:5", page_size=16, **TINY)
    run_checked(case, config=KernelConfig(32, 64, 1, 1), options=SWAP)


def test_swap_ab_matches_the_unswapped_kernel():
    """The same batch with and without swapped operands: the same sums in another order."""
    case = Case(batch_size=3, context_len="ragged:0-60", tree="full:2:2", tree_per_request="mixed",
                page_size=16, **TINY)
    on, off = (run_checked(case, options=KernelOptions(swap_ab=s)) for s in (True, False))
    assert swap_const(on) and not swap_const(off)
    torch.testing.assert_close(on.out.float(), off.out.float(), atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(on.lse, off.lse, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("path", ["fp16", "cast", "bits"])
@pytest.mark.parametrize("fmt", ["e4m3fn", "e5m2"])
@pytest.mark.parametrize("page_size,kv_desc,splits", [(16, False, 1), (32, True, 2)])
def test_swap_ab_fp8_pools(path, fmt, page_size, kv_desc, splits):
    """fp8 codes with scales far from 1 (`fp8_inputs`), every fp8 operand path, pointer loads
    and TMA context tiles, with and without split-KV."""
    case = Case(batch_size=3, context_len="ragged:0-50", tree="full:2:2", tree_per_request="mixed",
                page_size=page_size, **TINY)
    ta = run_fp8(case, FP8[fmt], num_splits=splits,
                 options=KernelOptions(swap_ab=True, fp8_path=path, kv_desc=kv_desc))
    assert swap_const(ta) and ta.kernel.startswith("tl ")


def test_swap_ab_fp8_keeps_bf16_queries_past_fp16s_range():
    """bf16 queries up to 2^20 in every other token's rows over an fp8 pool, fp16 MMAs: the
    rows' power-of-2 scales (Q_ROW_SCALE) enter the swapped kernel's per-column score factor."""
    case = Case(batch_size=2, context_len="list:9,20", tree="full:2:2", page_size=16, **TINY)
    fp8, deq = fp8_inputs(case, torch.float8_e4m3fn)
    q = fp8.q.clone()
    q[::2] *= 2.0 ** 20
    fp8 = dataclasses.replace(fp8, q=q, k_scale=fp8.k_scale * 2.0 ** -20)
    deq = dataclasses.replace(deq, q=q, k_cache=deq.k_cache * 2.0 ** -20)
    ta = TreeAttention(fp8, options=KernelOptions(swap_ab=True, fp8_path="fp16"))
    out = ta()
    assert swap_const(ta) and out.isfinite().all()
    assert compare(out, paged_reference_attention(deq), fp8.qo_indptr, case.dtype).passed


def test_swap_ab_option_is_checked():
    with pytest.raises(ConfigError, match="swap_ab=1: must be True or False"):
        KernelOptions(swap_ab=1)
    assert KernelOptions().swap_ab is False and SWAP.changed() == {"swap_ab": True}
    case = Case(batch_size=1, context_len=10, tree="full:2:1", page_size=16, **TINY)
    with pytest.raises(ConfigError, match="ws=True: swap_ab"):     # a tl-kernel option: no warp-specialised run
        TreeAttention(build_inputs(case, DEVICE).for_backend(), ws=True, options=SWAP)


@pytest.mark.gpu
@pytest.mark.skipif(DEVICE != "cuda", reason="needs a CUDA GPU")
@pytest.mark.parametrize("cfg", [KernelConfig(16, 64, 4, 4), KernelConfig(16, 64, 2, 4), KernelConfig(64, 64, 4, 3, 0, 1)])
@pytest.mark.parametrize("kv", ["bf16", "e4m3fn"])
@pytest.mark.parametrize("page_size", [16, 128])
def test_swap_ab_on_gpu(cfg, kv, page_size):
    """Compiled: wgmma with 16-row tiles (4 warps), mma_v2 (2 warps), 64-row tiles; TMA at P 128."""
    case = Case(batch_size=5, context_len="ragged:0-900", tree="random:40:3", tree_per_request="mixed",
                page_size=page_size, num_q_heads=32, num_kv_heads=8, head_dim=128)
    opts = KernelOptions(swap_ab=True)
    ta = run_checked(case, config=cfg, options=opts) if kv == "bf16" else run_fp8(case, FP8[kv], config=cfg,
                                                                                    options=opts)
    assert swap_const(ta)
