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
from treebench.kernels.tree_attention_tl import _fp8_bits_to_fp16, _split_q  # noqa: E402

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


@pytest.mark.parametrize("path", ["bits", "fp16", "split"])
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
    split = path == "split" and fmt == "e4m3fn" and qdtype == "bfloat16"   # else "split" runs as "fp16"
    assert ta._fp8_path() == ("split" if split else "fp16" if path == "split" else path)


@pytest.mark.parametrize("path", ["bits", "fp16", "cast", "cvt", "split"])
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


@triton.jit
def _split_kernel(X, HI, LO, SCALE, M: tl.constexpr, D: tl.constexpr):
    offs = tl.arange(0, M)[:, None] * D + tl.arange(0, D)[None, :]
    hi, lo, scale = _split_q(tl.load(X + offs))
    tl.store(HI + offs, hi)
    tl.store(LO + offs, lo)
    tl.store(SCALE + tl.arange(0, M), scale)


def test_split_q_writes_each_bf16_query_as_two_e4m3_terms():
    """`_split_q` (fp8_path "split"): hi + lo times the row's power of 2 gives back every bf16 element
    within 2^-9 of its row's largest |q| exactly, and every other one within 2^-16 of that largest;
    rows of any magnitude (2^-40 to 2^40, and zero) stay finite."""
    m, d = 16, 32
    q = torch.randn(m, d, dtype=torch.float64)
    q[:, 0] = 3.0                                         # every row's largest |q| is known
    q *= (2.0 ** torch.tensor([-40, -9, 0, 7, 8, 9, 20, 40] * 2, dtype=torch.float64))[:, None]
    q[5, 1:] = q[5, 1:] * 2.0 ** -12                      # elements far below their row's largest
    q[11] = 0.0
    q = q.to(torch.bfloat16).to(DEVICE)
    hi, lo = (torch.empty(m, d, dtype=torch.float8_e4m3fn, device=DEVICE) for _ in range(2))
    scale = torch.empty(m, dtype=torch.float32, device=DEVICE)
    _split_kernel[(1,)](q, hi, lo, scale, M=m, D=d)
    back = (hi.double() + lo.double()) * scale.double()[:, None]
    exact = q.double()
    amax = exact.abs().amax(1, keepdim=True)
    near = exact.abs() >= amax * 2.0 ** -9
    assert back.isfinite().all() and torch.equal(back[11], exact[11])
    assert torch.equal(back[near], exact[near])
    assert ((back - exact).abs() <= amax * 2.0 ** -16).all()
    assert (~near[5]).sum() == d - 1                      # the far-below row took the inexact branch


def test_fp8_path_rule_takes_cvt_for_one_tile_page_lookups():
    """fp8_path=None and token_pages=None (the defaults): the one-tile build over an fp8 pool for up to
    CVT_ONE_TILE_MAX_ROWS packed rows looks up each token's page (P 8 under 16-token tiles, and P 16
    too) and takes "cvt"; "fp16" with token_pages off, with more rows or in the looped build; an
    explicit path is kept; the interpreter runs "cvt" as "fp16"."""
    from treebench.kernels.options import CVT_ONE_TILE_MAX_ROWS
    from treebench.kernels.tree_attention_plan import KernelConfig

    def choice(tree, page_size, context, block_n=16, **opts):
        case = Case(batch_size=1, context_len=context, tree=tree, page_size=page_size, **TINY)
        ta = TreeAttention(fp8_inputs(case, torch.float8_e4m3fn)[0], config=KernelConfig(16, block_n, 1, 1),
                           options=KernelOptions(**({"short_build": True} | opts)))
        return ta.fp8_path_choice(), ta.kernel, ta._fp8_path()

    assert choice("full:2:1", 8, 9) == ("cvt", "tl gather splits=1 one-tile", "fp16")      # 6 rows
    assert choice("full:2:1", 16, 9)[:2] == ("cvt", "tl gather splits=1 one-tile")      # token_pages' rule too
    assert choice("full:2:1", 16, 9, token_pages=False)[:2] == ("fp16", "tl tile splits=1 one-tile")
    assert choice("full:2:1", 8, 40, short_build=False)[:2] == ("fp16", "tl gather splits=1")
    assert choice("full:2:1", 8, 9, fp8_path="bits")[0] == "bits"
    assert 2 * 40 > CVT_ONE_TILE_MAX_ROWS                                   # full:3:3: 40 nodes, G 2
    assert choice("full:3:3", 8, 9, block_n=64)[:2] == ("fp16", "tl gather splits=1 one-tile")
    with pytest.raises(ConfigError, match="token_pages='on'"):
        KernelOptions(token_pages="on")


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
    """Compiled, GPU configs: 16-160 packed rows, TMA tiles at P 128; with ws_fp8 off the tl kernel
    runs (B 64 with 160 rows would otherwise take the warp-specialised 3-warpgroup build, which the
    ws_fp8 tests below cover), and without ws_fp8 the warp-specialised kernel names the pool."""
    case = Case(batch_size=batch, context_len="ragged:0-900", tree=tree, tree_per_request="mixed",
                page_size=page_size, num_q_heads=32, num_kv_heads=8, head_dim=128)
    ta = run_fp8(case, FP8[fmt], options=KernelOptions(ws_fp8=False))
    assert ta.kernel.startswith("tl ")
    assert "fp8" in ws_unsupported(fp8_inputs(case, FP8[fmt])[0])


@pytest.mark.gpu
@pytest.mark.skipif(DEVICE != "cuda", reason="needs a CUDA GPU")
@pytest.mark.parametrize("path", ["bits", "fp16", "cvt", "split"])
@pytest.mark.parametrize("fmt", ["e4m3fn", "e5m2"])
@pytest.mark.parametrize("page_size,tree,batch", [(16, "full:3:1", 3), (128, "random:40:3", 5)])
def test_fp8_paths_on_gpu(path, fmt, page_size, tree, batch):
    """The alternative fp8 paths compiled: the mma_v2 (16-row) and wgmma (64-row) tiles."""
    case = Case(batch_size=batch, context_len="ragged:0-900", tree=tree, tree_per_request="mixed",
                page_size=page_size, num_q_heads=32, num_kv_heads=8, head_dim=128)
    assert run_fp8(case, FP8[fmt], options=KernelOptions(fp8_path=path)).kernel.startswith("tl ")


# ---- fp8 pools in the warp-specialised kernel (KernelOptions.ws_fp8) -------------------------

SM90 = DEVICE == "cuda" and torch.cuda.get_device_capability() == (9, 0)
WS_FP8 = KernelOptions(ws_fp8=True)
NO_WS_FP8 = KernelOptions(ws_fp8=False)
GQA4 = dict(num_q_heads=32, num_kv_heads=8, head_dim=128)             # G 4, the tuned D


def ws_fp8_case(fmt: str, page_size: int, tree: str, batch: int = 6, **kw) -> Case:
    """L_b 0, 1, 63, 64, 100, 1000 (0 and lengths off multiples of 64), k_scale 0.25, v_scale 0.5
    unless kw says otherwise."""
    return Case(batch_size=batch, context_len="list:" + ",".join(["0", "1", "63", "64", "100", "1000"][:batch]),
                tree=tree, page_size=page_size, kv_dtype=fmt, **({"k_scale": 0.25, "v_scale": 0.5} | kw), **GQA4)


def run_ws_fp8(inputs, case: Case, atol_dtype: str | None = None, **kw) -> TreeAttention:
    """The ws_fp8 kernel on `inputs` (output and LSE first NaN) against the float64 reference; the
    fp8 tolerance unless atol_dtype names a stricter one (the query dtype's own)."""
    from treebench.harness.model.compare import compare_lse
    from treebench.harness.model.reference import reference_attention

    ta = TreeAttention(inputs.for_backend(), return_lse=True, options=WS_FP8, **kw)
    ta.out.fill_(float("nan"))
    ta.lse.fill_(float("nan"))
    out = ta()
    ref, ref_lse = reference_attention(inputs, return_lse=True)
    rec = compare(out, ref, inputs.qo_indptr, case.dtype, kv_dtype=None if atol_dtype else case.kv_dtype)
    assert rec.nonfinite == 0 and rec.passed, rec
    lrec = compare_lse(ta.lse, ref_lse, inputs.qo_indptr, case.dtype)
    assert lrec.passed, lrec.reason()
    return ta


@pytest.mark.gpu
@pytest.mark.skipif(not SM90, reason="needs a CUDA sm_90 GPU (the warp-specialised kernel)")
@pytest.mark.parametrize("fmt", ["float8_e4m3fn", "float8_e5m2"])
@pytest.mark.parametrize("page_size", [128, 16])
@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("tree,trees", [("vllm:pr_27", "same"), ("full:3:3", "same"), ("vllm:pr_27", "mixed")])
def test_ws_fp8_matches_the_reference_on_gpu(fmt, page_size, splits, tree, trees):
    """ws=True with ws_fp8: 112 rows (WS2_FP8) and 160 (WS3_FP8), per-request trees (consumers whose
    rows all pad), ragged L_b with 0, split-KV off and on (splits that see nothing), P 128 (one
    box per tile) and P 16 (one per page); every request's last tile is read past S_b, where the
    pool holds NaN codes."""
    case = ws_fp8_case(fmt, page_size, tree, tree_per_request=trees)
    ta = run_ws_fp8(build_inputs(case, DEVICE), case, ws=True, num_splits=splits)
    assert ta.ws and ta.plan.config.fp8_stages > 0 and ta.plan.num_splits == splits
    assert ta.plan.config.ws == (3 if tree == "full:3:3" else 2)
    assert ta.kernel == f"ws {'tma' if page_size == 128 else 'tma-page'} splits={splits}"


@pytest.mark.gpu
@pytest.mark.skipif(not SM90, reason="needs a CUDA sm_90 GPU (the warp-specialised kernel)")
@pytest.mark.parametrize("fmt,scale", [("float8_e4m3fn", 0.25), ("float8_e5m2", 1.0)])
def test_ws_fp8_with_fp16_queries_on_gpu(fmt, scale):
    """fp16 queries: the converted tiles and the MMAs in fp16 (Triton's cast of the codes; e5m2's
    smallest codes stay fp16 normals only at scales from 1, `Case`'s rule)."""
    case = ws_fp8_case(fmt, 128, "vllm:pr_27", dtype="float16", k_scale=scale, v_scale=2 * scale if scale < 1 else 1.0)
    assert run_ws_fp8(build_inputs(case, DEVICE), case, ws=True, num_splits=2).ws


@pytest.mark.gpu
@pytest.mark.skipif(not SM90, reason="needs a CUDA sm_90 GPU (the warp-specialised kernel)")
@pytest.mark.parametrize("fmt,k_scale,v_scale", [("float8_e4m3fn", 2.0 ** -6, 2.0 ** -8),
                                                 ("float8_e5m2", 2.0 ** -13, 2.0 ** -15)])
def test_ws_fp8_converts_every_finite_code_exactly_on_gpu(fmt, k_scale, v_scale):
    """Every used pool slot of K and V rewritten with the finite codes in turn (subnormals and both
    zeros included) and power-of-2 scales that keep |k| <= 7 and |v| <= 1.75: the converter's
    integer conversion is exact, so the output meets the query dtype's own tolerance, not the
    fp8 one."""
    case = ws_fp8_case(fmt, 128, "vllm:pr_27", k_scale=k_scale, v_scale=v_scale)
    inputs = build_inputs(case, DEVICE)
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    finite = codes[codes.view(getattr(torch, fmt)).float().isfinite()].to(DEVICE)   # 254 / 248 codes
    for pool in (inputs.k_cache, inputs.v_cache):
        used = ~pool.float().isnan()                      # the unused slots keep the NaN code
        pool.view(torch.uint8)[used] = finite[torch.arange(int(used.sum()), device=DEVICE) % len(finite)]
    inputs.logical_from_pool()                            # the reference reads the logical copies
    run_ws_fp8(inputs, case, atol_dtype=case.dtype, ws=True)


@pytest.mark.gpu
@pytest.mark.skipif(not SM90, reason="needs a CUDA sm_90 GPU (the warp-specialised kernel)")
@pytest.mark.parametrize("page_size", [128, 16])
def test_ws_fp8_default_plan_takes_the_ws_kernel_on_gpu(page_size):
    """B 64 with the 27-node tree: with ws_fp8 (the default) the plan's choice (ws=None) is the
    warp-specialised kernel, and with ws_fp8=False the tl kernel (the same batch)."""
    case = Case(batch_size=64, context_len="ragged:0-700", tree="vllm:pr_27", page_size=page_size,
                kv_dtype="float8_e4m3fn", k_scale=0.25, v_scale=0.5, **GQA4)
    inputs = build_inputs(case, DEVICE)
    assert run_ws_fp8(inputs, case).kernel.startswith("ws tma")
    assert TreeAttention(inputs.for_backend()).kernel.startswith("ws tma")
    assert TreeAttention(inputs.for_backend(), options=NO_WS_FP8).kernel.startswith("tl ")


@pytest.mark.gpu
@pytest.mark.skipif(not SM90, reason="needs a CUDA sm_90 GPU (the warp-specialised kernel)")
def test_ws_fp8_refuses_a_config_without_its_ring_on_gpu():
    """A warp-specialised config must match its pool: an fp8 pool with ws_fp8 needs fp8_stages (the
    converter's ring), a bf16 pool a config without."""
    from treebench.kernels.tree_attention_plan import WS2, WS2_FP8

    fp8 = build_inputs(ws_fp8_case("float8_e4m3fn", 128, "vllm:pr_27"), DEVICE).for_backend()
    with pytest.raises(ConfigError, match="fp8_stages=0"):
        TreeAttention(fp8, config=WS2, options=WS_FP8)
    bf16 = build_inputs(Case(batch_size=2, context_len=100, tree="vllm:pr_27", page_size=128, **GQA4), DEVICE)
    with pytest.raises(ConfigError, match="fp8_stages=4"):
        TreeAttention(bf16.for_backend(), config=WS2_FP8, options=WS_FP8)


def test_ws_pool_reasons():
    """`ws_pool_unsupported`: fp8 codes only with ws_fp8, and then with any scales; a pool in Q's
    dtype only with scales 1; any other pool dtype never."""
    from treebench.kernels.tree_attention_plan import ws_pool_unsupported

    bf16, e4m3, e5m2 = torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2
    for kv in (e4m3, e5m2):
        assert "KernelOptions.ws_fp8" in ws_pool_unsupported(bf16, kv, 1.0, 1.0)
        assert ws_pool_unsupported(bf16, kv, 0.25, 0.5, fp8=True) == ""
        assert ws_pool_unsupported(torch.float16, kv, 0.25, 0.5, fp8=True) == ""
    assert ws_pool_unsupported(bf16, bf16, 1.0, 1.0) == ws_pool_unsupported(bf16, bf16, 1.0, 1.0, fp8=True) == ""
    assert "k_scale / v_scale" in ws_pool_unsupported(bf16, bf16, 0.5, 1.0, fp8=True)
    assert "Q's dtype" in ws_pool_unsupported(bf16, torch.float16, 1.0, 1.0, fp8=True)


def test_ws_unsupported_names_the_flag_before_the_device():
    """An fp8 batch: without ws_fp8 the first reason is the pool, with it (the default) the next one
    (here, on the CPU, the device); TreeAttention(ws=True) raises each, and the default plan runs
    the tl kernel."""
    case = Case(batch_size=2, context_len=20, tree="full:2:1", page_size=16, kv_dtype="float8_e4m3fn",
                k_scale=0.25, v_scale=0.5, **TINY)
    inputs = build_inputs(case, DEVICE).for_backend()
    assert "ws_fp8" in ws_unsupported(inputs)
    if DEVICE == "cpu":
        assert "CUDA GPU" in ws_unsupported(inputs, fp8=True)
        with pytest.raises(ConfigError, match="ws=True: the warp-specialised kernel needs a CUDA GPU"):
            TreeAttention(inputs, ws=True, options=WS_FP8)
    with pytest.raises(ConfigError, match="ws=True: kv dtype torch.float8_e4m3fn.*KernelOptions.ws_fp8"):
        TreeAttention(inputs, ws=True, options=NO_WS_FP8)
    ta = TreeAttention(inputs, options=WS_FP8)            # too small a batch for the ws kernel: tl
    assert ta.kernel.startswith("tl ") and not ta.ws


def test_ws_fp8_option_and_configs():
    """The flag's type check and default; the fp8 twins of the table's warp-specialised rows: one
    warpgroup more in the register file (the converter's WS_CONVERTER_REGS), both rings within one
    CTA's shared memory, 3 warpgroups never pipelined; fp8_stages only with ws."""
    from treebench.kernels.tree_attention_plan import (SMEM_PER_SM, WS2, WS2_FP8, WS3, WS3_FP8, WS_CONVERTER_REGS,
                                                       WS_FP8_CONFIGS, WS_PRODUCER_REGS, KernelConfig,
                                                       parse_kernel_config)

    assert KernelOptions().ws_fp8 is True and KernelOptions(ws_fp8=False).changed() == {"ws_fp8": False}
    with pytest.raises(ConfigError, match="ws_fp8=1"):
        KernelOptions(ws_fp8=1)
    assert WS_FP8_CONFIGS == {WS2: WS2_FP8, WS3: WS3_FP8}
    for bf16, fp8 in WS_FP8_CONFIGS.items():
        assert (fp8.block_m, fp8.block_n, fp8.ws) == (bf16.block_m, bf16.block_n, bf16.ws) and fp8.fp8_stages
        assert fp8.ws_warpgroups == bf16.ws_warpgroups + 1 == fp8.ws + 2
        consumer, producer = fp8.ws_regs
        assert consumer * fp8.ws + producer + WS_CONVERTER_REGS <= fp8.max_regs * fp8.ws_warpgroups
        assert fp8.max_regs * 128 * fp8.ws_warpgroups <= 65536 and consumer >= 128
        assert fp8.ws_shared_bytes(128) <= SMEM_PER_SM < fp8.ws_shared_bytes(128) + 2 * 64 * 128 * 2 * 2
        assert fp8.ctas_per_sm(128) == 1
    assert WS2_FP8.ws_regs == (208, WS_PRODUCER_REGS) and WS3_FP8.ws_regs == (128, WS_PRODUCER_REGS)
    assert WS2_FP8.ws_pipe_for(33) and not WS3_FP8.ws_pipe_for(1 << 20) and WS3.ws_pipe_for(33)
    assert parse_kernel_config("128,64,4,3,128,0,2,4") == WS2_FP8
    with pytest.raises(ConfigError, match="fp8_stages=4"):
        KernelConfig(64, 64, 4, 3, 0, 0, 0, 4)                # the tl kernel has no converter
    with pytest.raises(ConfigError, match="the register file"):
        KernelConfig(192, 64, 4, 3, 128, 0, 3, 3)             # 5 warpgroups of 128 registers: 81920 > 65536


def test_fp8_converters_and_fences():
    """Two converter warpgroups (one for K, one for V) only with an fp8 ring: one warpgroup more in
    the register file and the consumers' share; `--config`'s 9th field; the converter's one fence
    per tile by default (`KernelOptions.ws_fp8_fences`); WS1_FP8 fits one CTA."""
    from treebench.kernels.tree_attention_plan import (SMEM_PER_SM, WS1_FP8, WS_CONVERTER_REGS, WS_PRODUCER_REGS,
                                                       KernelConfig, parse_kernel_config)

    two = KernelConfig(64, 64, 4, 4, 128, 0, 1, 4, 2)
    assert two.ws_warpgroups == WS1_FP8.ws_warpgroups + 1 == 4
    assert two.converter_regs == 2 * WS_CONVERTER_REGS and WS1_FP8.converter_regs == WS_CONVERTER_REGS
    assert two.ws_regs == (256, WS_PRODUCER_REGS) and two.max_regs * 128 * two.ws_warpgroups <= 65536
    assert parse_kernel_config("64,64,4,4,128,0,1,4,2") == two
    assert KernelConfig(64, 64, 4, 3, 168, 0, 1).converter_regs == 0
    with pytest.raises(ConfigError, match="fp8_converters=2"):
        KernelConfig(64, 64, 4, 3, 168, 0, 1, 0, 2)           # no fp8 ring, nothing to convert
    with pytest.raises(ConfigError, match="fp8_converters=3"):
        KernelConfig(64, 64, 4, 4, 128, 0, 1, 4, 3)
    with pytest.raises(ConfigError, match="the register file"):
        KernelConfig(64, 64, 4, 4, 168, 0, 1, 4, 2)           # 4 warpgroups of 168 registers
    with pytest.raises(ConfigError, match="4 to 9 integers|want BLOCK_M"):
        parse_kernel_config("64,64,4,4,128,0,1,4,2,1")
    assert WS1_FP8.ws_shared_bytes(128) <= SMEM_PER_SM and WS1_FP8.fp8_converters == 1
    assert KernelOptions().ws_fp8_fences == 1 and KernelOptions(ws_fp8_fences=3).changed() == {"ws_fp8_fences": 3}


def _run_ptx(asm: str, regs: dict[str, int]) -> dict[str, int]:
    """A tiny interpreter of the integer PTX `bf16_asm` emits (mov, prmt without sign replication,
    and, or, shr, mul.rn.bf16x2) over 32-bit values; regs holds $2 / $3 and receives $0 / $1."""
    def val(x: str) -> int:
        return int(x, 16) if x.startswith("0x") or x.startswith("0X") else regs[x] if x in regs else int(x)

    def bf16x2(a: int, b: int) -> int:
        out = 0
        for sh in (0, 16):
            x, y = (torch.tensor([(v >> sh) & 0xFFFF], dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
                    .double() for v in (a, b))
            out |= (int((x * y).to(torch.bfloat16).view(torch.int16).item()) & 0xFFFF) << sh
        return out

    for ins in asm.strip("{} ").split(";"):
        ins = ins.strip()
        if not ins or ins.startswith(".reg"):
            continue
        op, args = ins.split(None, 1)
        a = [x.strip() for x in args.split(",")]
        if op == "mov.b32":
            regs[a[0]] = val(a[1])
        elif op == "prmt.b32":
            src, sel = val(a[1]) | (val(a[2]) << 32), val(a[3])
            assert not sel & 0x8888, "sign replication is not modelled"
            regs[a[0]] = sum(((src >> (8 * ((sel >> (4 * i)) & 7))) & 0xFF) << (8 * i) for i in range(4))
        elif op in ("and.b32", "or.b32", "shr.b32"):
            x, y = val(a[1]), val(a[2])
            regs[a[0]] = (x & y) if op == "and.b32" else (x | y) if op == "or.b32" else (x >> y)
        elif op == "mul.rn.bf16x2":
            regs[a[0]] = bf16x2(val(a[1]), val(a[2]))
        else:
            raise AssertionError(f"unmodelled PTX: {ins}")
    return regs


@pytest.mark.parametrize("fmt", ["e4m3fn", "e5m2"])
@pytest.mark.parametrize("masked", [False, True])
def test_ws_fp8_bf16_conversion_ptx_of_every_code(fmt, masked):
    """The converter's fp8 -> bf16 PTX (`tree_attention_ws_fp8.bf16_asm`), interpreted on the CPU over
    all 256 codes, four to a register in each byte position: every finite code gives torch's bf16
    bit for bit (denormals and both zeros included), and with a mask of 0 every code gives +0."""
    pytest.importorskip("triton.experimental.gluon")
    from treebench.kernels.tree_attention_ws_fp8 import bf16_asm

    asm = bf16_asm(fmt == "e5m2", masked)
    codes = torch.arange(256, dtype=torch.int32)
    want = codes.to(torch.uint8).view(FP8[fmt]).to(torch.bfloat16).view(torch.int16).int() & 0xFFFF
    finite = codes.to(torch.uint8).view(FP8[fmt]).float().isfinite()
    for rot in range(4):                                   # each code in each of the 4 byte positions
        for w in range(64):
            four = [int(codes[(4 * w + (i + rot) % 4) % 256]) for i in range(4)]
            regs = {"$2": sum(c << (8 * i) for i, c in enumerate(four)), "$3": 0xFFFFFFFF}
            got = _run_ptx(asm, regs)
            halves = [got["$0"] & 0xFFFF, got["$0"] >> 16, got["$1"] & 0xFFFF, got["$1"] >> 16]
            for c, h in zip(four, halves):
                if finite[c]:
                    assert h == int(want[c]), (fmt, hex(c), hex(h), hex(int(want[c])))
            if masked:
                regs = {"$2": regs["$2"], "$3": 0}
                got = _run_ptx(asm, regs)
                assert got["$0"] == got["$1"] == 0
