"""Peer adapters on the CPU: input conversions against hand-computed cases, and
each adapter's whole `prepare` path through a fake kernel that implements the
peer library's documented semantics in float64 (the real kernels are checked on
the GPU by lab/check_peers.py and `treebench check`)."""

from __future__ import annotations

import enum
import math
from types import SimpleNamespace

import pytest
import torch

from treebench.backends import _conversions as cv
from treebench.backends import causal_baseline as cb
from treebench.backends.causal_baseline import CausalBaseline
from treebench.backends.flashinfer_mask import FlashInferMask, flashinfer_plan_arguments
from treebench.backends.flex import FlexTree
from treebench.backends.vllm_triton import VllmTriton
from treebench.backends.xformers_tree import XformersTree, xformers_arguments
from treebench.harness.model.cases import Case
from treebench.harness.model.compare import compare, compare_lse
from treebench.harness.errors import ConfigError
from treebench.harness.model.paged import build_inputs
from treebench.harness.model.reference import reference_attention
from treebench.harness.model.tree_specs import parse_tree

GPU_ONLY = (XformersTree, FlashInferMask, CausalBaseline, VllmTriton)


def small_case(**kw) -> Case:
    base = dict(batch_size=4, context_len="ragged:0-45", tree="full:2:2", num_q_heads=6,
                num_kv_heads=2, head_dim=16, dtype="float32", page_size=8, layout="shuffled")
    base.update(kw)
    return Case(**base)


def dense(q, k, v, allowed, scale):
    """Float64 attention for one request: q (T, Hq, D), k/v (S, Hkv, D), allowed (T, S) bool."""
    g = q.shape[1] // k.shape[1]
    k, v = k.double().repeat_interleave(g, 1), v.double().repeat_interleave(g, 1)
    s = torch.einsum("thd,shd->hts", q.double(), k) * scale
    s = s.masked_fill(~allowed.to(s.device), float("-inf"))
    return torch.einsum("hts,shd->thd", torch.softmax(s, -1), v)


def assert_matches_reference(out, inputs, ref=None, lse_base=math.e):
    """`out` (or (out, lse) from a backend that returns its LSE, in log base `lse_base`) matches the
    float64 reference."""
    lse = None
    if isinstance(out, tuple):
        out, lse = out
        lse = lse * math.log(lse_base)
    ref_out, ref_lse = reference_attention(inputs, return_lse=True)
    rec = compare(out, ref_out if ref is None else ref, inputs.qo_indptr, inputs.case.dtype,
                  kv_dtype=inputs.case.kv_dtype)
    assert rec.passed, rec
    if lse is not None:
        lrec = compare_lse(lse, ref_lse, inputs.qo_indptr, inputs.case.dtype)
        assert lrec.passed, lrec.reason()


def rows(cache, slots):
    """Rows of a (N, P, Hkv, D) pool at flat slots; an fp8 pool's codes as float64 (unscaled)."""
    flat = cache.reshape(-1, *cache.shape[2:])
    if cache.element_size() == 1:
        return flat.view(torch.uint8)[slots].view(cache.dtype).double()
    return flat[slots]


# ---- conversions against hand-computed cases ----------------------------------------------

def test_token_slots_hand_computed():
    bt = torch.tensor([[3, 1], [0, 2]], dtype=torch.int32)
    slots = cv.token_slots(bt, starts=[0, 2], lengths=[6, 3], page_size=4)
    # request 0, positions 0..5 -> pages 3,3,3,3,1,1; request 1, positions 2..4 -> pages 0,0,2
    assert slots.tolist() == [12, 13, 14, 15, 4, 5, 2, 3, 8]


def test_flashinfer_page_metadata_hand_computed():
    bt = torch.tensor([[5, 2, 7], [1, 9, 9], [4, 9, 9]], dtype=torch.int32)
    indptr, indices, last = cv.flashinfer_page_metadata(bt, seq_lens=[9, 4, 1], page_size=4)
    assert indptr.tolist() == [0, 3, 4, 5]
    assert indices.tolist() == [5, 2, 7, 1, 4]
    assert last.tolist() == [1, 4, 1]
    assert indptr.dtype == indices.dtype == last.dtype == torch.int32


def test_flattened_mask_hand_computed():
    fork, chain = parse_tree("parents:-1,0,0"), parse_tree("chain:1")
    got = cv.flattened_tree_mask([fork, chain], context_lens=[2, 1]).int().tolist()
    want = [1, 1, 1, 0, 0,   1, 1, 1, 1, 0,   1, 1, 1, 0, 1,    # request 0: (T 3, S 5)
            1, 1, 0,   1, 1, 1]                                 # request 1: (T 2, S 3)
    assert got == want


def test_tree_additive_bias_hand_computed():
    bias = cv.tree_additive_bias(parse_tree("parents:-1,0,0,1"))   # node 3 is node 1's child
    inf = float("-inf")
    assert bias.tolist() == [[0, inf, inf, inf], [0, 0, inf, inf], [0, inf, 0, inf], [0, 0, inf, 0]]


@pytest.mark.parametrize("left", [False, True])
def test_pad_ragged_and_unpad(left):
    x = torch.arange(1, 6).float()[:, None]                 # (5, 1): request 0 has 3 rows, request 1 has 2
    padded = cv.pad_ragged(x, [3, 2], 4, left=left)[..., 0]
    want = [[0, 1, 2, 3], [0, 0, 4, 5]] if left else [[1, 2, 3, 0], [4, 5, 0, 0]]
    assert padded.tolist() == want
    assert torch.equal(cv.unpad(padded[..., None], [3, 2], left=left), x)


def test_precomputed_rows_give_the_same_padding():
    x, lens = torch.randn(9, 2, 3), [4, 0, 5]
    rows = cv.padded_rows(lens, 6, left=True)
    assert torch.equal(cv.pad_ragged(x, lens, 6, left=True, rows=rows), cv.pad_ragged(x, lens, 6, left=True))
    assert torch.equal(cv.unpad(cv.pad_ragged(x, lens, 6, rows=cv.padded_rows(lens, 6)), lens), x)


def test_gather_kv_matches_logical_kv():
    inputs = build_inputs(small_case(page_size=5, layout="interleaved"))
    k, v = cv.gather_kv(inputs.k_cache, inputs.v_cache, inputs.block_table, inputs.host_lists()[2])
    assert torch.equal(k, inputs.k_logical) and torch.equal(v, inputs.v_logical)


@pytest.mark.parametrize("tree", ["full:2:2", "chain:4", "random:9:3"])
def test_tree_mask_mod_matches_request_masks(tree):
    trees = [parse_tree(tree), parse_tree("chain:0"), parse_tree("full:3:1")]
    ls = [3, 0, 7]
    t_max, s_max = max(t.size for t in trees), max(l + t.size for l, t in zip(ls, trees))
    mod = cv.tree_mask_mod(torch.tensor(ls), torch.tensor([t.size for t in trees]),
                           cv.padded_tree_masks(trees, t_max))
    q, kv = torch.arange(t_max)[:, None], torch.arange(s_max)[None, :]
    for b, (t, l) in enumerate(zip(trees, ls)):
        got = mod(torch.tensor(b), torch.tensor(0), q, kv)
        want = torch.zeros(t_max, s_max, dtype=torch.bool)
        want[:t.size, :l + t.size] = cv.request_tree_mask(t, l)
        assert torch.equal(got, want)


# ---- flashinfer: whole prepare path through a fake wrapper -----------------------------------

class FakeFlashInferWrapper:
    """BatchPrefillWithPagedKVCacheWrapper's documented semantics (NHD, custom mask)."""

    def __init__(self, workspace, layout):
        assert layout == "NHD" and workspace.dtype == torch.uint8

    def plan(self, qo_indptr, kv_indptr, kv_indices, last_page_len, hq, hkv, d, page_size, *,
             custom_mask, q_data_type, kv_data_type, sm_scale):
        assert all(t.dtype == torch.int32 for t in (qo_indptr, kv_indptr, kv_indices, last_page_len))
        assert custom_mask.dtype == torch.bool
        self.args = SimpleNamespace(qo=qo_indptr.tolist(), kv=kv_indptr.tolist(), idx=kv_indices,
                                    last=last_page_len.tolist(), p=page_size, mask=custom_mask, scale=sm_scale,
                                    kv_dtype=kv_data_type)
        self._backend = "fa2"                                            # what plan resolves "auto" to

    def run(self, q, kv, return_lse=False, *, k_scale=None, v_scale=None):
        """(out, lse base 2 as FlashInfer's kernels write it) with return_lse, else out; k_scale folded into
        sm_scale, the output times v_scale (prefill.py's run); the codes as read."""
        a, outs, lses, moff = self.args, [], [], 0
        assert kv[0].dtype == a.kv_dtype == kv[1].dtype, "plan's kv_data_type must be the pool's dtype"
        scale, v_scale = a.scale * (1.0 if k_scale is None else k_scale), 1.0 if v_scale is None else v_scale
        for b in range(len(a.qo) - 1):
            pages = a.idx[a.kv[b]:a.kv[b + 1]].long()
            s = (len(pages) - 1) * a.p + a.last[b]                       # kv_len from the page metadata
            slots = (pages[:, None] * a.p + torch.arange(a.p)).flatten()[:s]
            k, v = (rows(c, slots) for c in kv)
            t = a.qo[b + 1] - a.qo[b]
            m = a.mask[moff:moff + t * s].view(t, s)                     # row-major (T_b, kv_len_b)
            moff += t * s
            outs.append(dense(q[a.qo[b]:a.qo[b + 1]], k, v, m, scale) * v_scale)
            g = q.shape[1] // k.shape[1]
            sc = torch.einsum("thd,shd->ths", q[a.qo[b]:a.qo[b + 1]].double(),
                              k.double().repeat_interleave(g, 1)) * scale
            lses.append(torch.logsumexp(sc.masked_fill(~m[:, None, :], float("-inf")), -1) / math.log(2))
        assert moff == a.mask.numel()
        out = torch.cat(outs).to(q.dtype)
        return (out, torch.cat(lses).float()) if return_lse else out


@pytest.mark.parametrize("batch_size", [1, 5])
@pytest.mark.parametrize("page_size", [5, 16])
def test_flashinfer_flattening_ragged_mixed(monkeypatch, batch_size, page_size):
    monkeypatch.setattr(FlashInferMask, "_flashinfer", staticmethod(
        lambda: SimpleNamespace(Wrapper=FakeFlashInferWrapper)))
    inputs = build_inputs(small_case(batch_size=batch_size, page_size=page_size, tree_per_request="mixed"))
    assert_matches_reference(FlashInferMask().prepare(inputs)(), inputs, lse_base=FlashInferMask.lse_base)


def test_flashinfer_fake_catches_a_misordered_mask(monkeypatch):
    """The fake is strict: a mask flattened in the wrong request order fails."""
    inputs = build_inputs(small_case(batch_size=3, context_len=20, tree_per_request="mixed"))
    plan = flashinfer_plan_arguments(inputs)
    ls = inputs.host_lists()[0]
    plan.keywords["custom_mask"] = cv.flattened_tree_mask(inputs.trees[::-1], ls[::-1])
    w = FakeFlashInferWrapper(torch.empty(1, dtype=torch.uint8), "NHD")
    w.plan(*plan.positional, **plan.keywords)
    try:
        out = w.run(inputs.q, (inputs.k_cache, inputs.v_cache))
        passed = compare(out, reference_attention(inputs), inputs.qo_indptr, "float32").passed
    except RuntimeError:   # segments of the wrong T_b * S_b cannot even be viewed
        passed = False
    assert not passed


# ---- xformers: whole prepare path through a fake tree_attention ------------------------------

class FakePagedBias:
    @classmethod
    def from_seqlens(cls, q_seqlen, kv_seqlen, block_tables, page_size, device=None):
        return SimpleNamespace(q=list(q_seqlen), kv=list(kv_seqlen), bt=block_tables, p=page_size)


def fake_tree_attention(q, spec_k, spec_v, cache_k, cache_v, spec_bias, prefix, prefix_op=None):
    """xformers semantics in BMGHK: q[b, i, g, h] attends cache rows of request b's
    first kv_seqlen logical positions (through the block table) and spec rows j
    with bias[i, j]; its G is the KV-head axis, H the heads sharing it."""
    assert prefix_op == "splitk" and cache_k.shape[0] == 1
    B, T, G, H, D = q.shape
    out = torch.empty(B, T, G, H, D, dtype=torch.float64)
    for b in range(B):
        pos = torch.arange(prefix.kv[b])
        slots = prefix.bt[b].long()[pos // prefix.p] * prefix.p + pos % prefix.p
        for g in range(G):
            for h in range(H):
                k = torch.cat([cache_k[0, slots, g, h], spec_k[b, :, g, h]])[:, None]   # (S, 1, D)
                v = torch.cat([cache_v[0, slots, g, h], spec_v[b, :, g, h]])[:, None]
                allowed = torch.cat([torch.ones(T, len(pos), dtype=torch.bool), spec_bias == 0], 1)
                out[b, :, g, h] = dense(q[b, :, g, h][:, None], k, v, allowed, D ** -0.5)[:, 0]
    return out.to(q.dtype)


@pytest.mark.parametrize("tree", ["full:2:2", "random:7:11"])
@pytest.mark.parametrize("page_size", [8, 13])
def test_xformers_conversion_ragged(monkeypatch, tree, page_size):
    monkeypatch.setattr(XformersTree, "_ops", staticmethod(lambda: SimpleNamespace(
        tree_attention=fake_tree_attention, prefix_op="splitk", paged_bias=FakePagedBias)))
    inputs = build_inputs(small_case(batch_size=3, tree=tree, page_size=page_size))
    fn = XformersTree().prepare(inputs)
    assert_matches_reference(fn(), inputs)
    assert fn.kernel == "xformers tree_attention (prefix: triton split-K)"


def test_xformers_rejects_mixed_trees():
    inputs = build_inputs(small_case(tree_per_request="mixed", context_len=4))
    with pytest.raises(ConfigError, match="tree_per_request"):
        xformers_arguments(inputs, FakePagedBias)


# ---- vLLM: whole prepare path through a fake unified_attention -------------------------------

class KVQuantMode(enum.IntEnum):
    """vLLM's KVQuantMode (vllm/v1/kv_cache_interface.py), the values the kernel compares against."""
    NONE = 0
    FP8_PER_TENSOR = 1


FP8_PER_TENSOR = KVQuantMode.FP8_PER_TENSOR


def fake_unified_attention(*, q, k, v, out, cu_seqlens_q, max_seqlen_q, seqused_k, max_seqlen_k,
                           softmax_scale, causal, window_size, block_table, softcap, q_descale,
                           k_descale, v_descale, qq_bias, kv_quant_mode=KVQuantMode.NONE):
    """vLLM kernel semantics: causal over [0, seq_len), query i at context_len + i,
    plus qq_bias[i, kv - context_len] on the query region; K/V tiles cast as `_cast_kv_tile`
    does: code * descale[0] with kv_quant_mode FP8_PER_TENSOR, a plain cast otherwise."""
    assert causal and qq_bias.dtype == torch.float32 and block_table.dtype == torch.int32
    assert k_descale.dtype == v_descale.dtype == torch.float32
    ks, vs = (float(d.flatten()[0]) if kv_quant_mode == FP8_PER_TENSOR else 1.0 for d in (k_descale, v_descale))
    qo, p = cu_seqlens_q.tolist(), k.shape[1]
    for b, s in enumerate(seqused_k.tolist()):
        t = qo[b + 1] - qo[b]
        ctx = s - t
        pos = torch.arange(s)
        slots = block_table[b].long()[pos // p] * p + pos % p
        kk, vv = rows(k, slots) * ks, rows(v, slots) * vs
        allowed = pos[None, :] <= ctx + torch.arange(t)[:, None]                 # causal
        bias = torch.zeros(t, s)
        bias[:, ctx:] = qq_bias[:t, :t]
        allowed &= bias > float("-inf")
        out[qo[b]:qo[b + 1]] = dense(q[qo[b]:qo[b + 1]], kk, vv, allowed, softmax_scale).to(out.dtype)


@pytest.mark.parametrize("tree", ["full:3:1", "random:6:2", "chain:3"])
def test_vllm_qq_bias_ragged(monkeypatch, tree):
    monkeypatch.setattr(VllmTriton, "_kernel", staticmethod(lambda: fake_unified_attention))
    inputs = build_inputs(small_case(batch_size=5, tree=tree, page_size=16))
    fn = VllmTriton().prepare(inputs)
    assert_matches_reference(fn(), inputs)
    assert fn.kernel == "vllm unified_attention 2d"


# ---- causal baseline: both paths through fake FlashAttention kernels -------------------------

def fake_varlen(query, key, value, cu_q, cu_k, max_q, max_k, *, scale=None, window_size=(-1, -1),
                enable_gqa=False):
    """FlashAttention-2 varlen semantics: bottom-right causal per sequence."""
    assert window_size == (-1, 0) and enable_gqa
    qo, ko, outs = cu_q.tolist(), cu_k.tolist(), []
    for b in range(len(qo) - 1):
        t, s = qo[b + 1] - qo[b], ko[b + 1] - ko[b]
        allowed = torch.arange(s)[None, :] <= s - t + torch.arange(t)[:, None]
        outs.append(dense(query[qo[b]:qo[b + 1]], key[ko[b]:ko[b + 1]], value[ko[b]:ko[b + 1]], allowed, scale))
    return torch.cat(outs).to(query.dtype)


def fake_flash_with_kvcache(q, k_cache, v_cache, *, cache_seqlens, block_table, softmax_scale, causal):
    """flash_attn_with_kvcache semantics: (B, Tq) queries, bottom-right causal
    against each request's first cache_seqlens[b] paged tokens."""
    assert causal
    tq, p = q.shape[1], k_cache.shape[1]
    out = torch.empty(q.shape, dtype=torch.float64)
    for b, s in enumerate(cache_seqlens.tolist()):
        pos = torch.arange(s)
        slots = block_table[b].long()[pos // p] * p + pos % p
        k, v = (c.reshape(-1, *c.shape[2:])[slots] for c in (k_cache, v_cache))
        allowed = pos[None, :] <= s - tq + torch.arange(tq)[:, None]
        allowed[~allowed.any(1)] = True          # fully masked padding rows: any finite value
        out[b] = dense(q[b], k, v, allowed, softmax_scale)
    return out.to(q.dtype)


def fake_fa3_with_kvcache(q, k_cache, v_cache, *, cache_seqlens, page_table, cu_seqlens_q, max_seqlen_q,
                          softmax_scale, causal):
    """FA3 flash_attn_with_kvcache with packed queries: request b's rows cu[b]:cu[b+1], bottom-right
    causal against its first cache_seqlens[b] paged tokens; returns (out, lse) as FA3 does."""
    assert causal and page_table.dtype == cache_seqlens.dtype == cu_seqlens_q.dtype == torch.int32
    cu, p = cu_seqlens_q.tolist(), k_cache.shape[1]
    out = torch.empty(q.shape, dtype=torch.float64)
    for b, s in enumerate(cache_seqlens.tolist()):
        t, pos = cu[b + 1] - cu[b], torch.arange(s)
        assert t <= max_seqlen_q
        slots = page_table[b].long()[pos // p] * p + pos % p
        k, v = (c.reshape(-1, *c.shape[2:])[slots] for c in (k_cache, v_cache))
        out[cu[b]:cu[b + 1]] = dense(q[cu[b]:cu[b + 1]], k, v, pos[None, :] <= s - t + torch.arange(t)[:, None],
                                     softmax_scale)
    return out.to(q.dtype), None


def test_causal_baseline_takes_fa3_where_installed(monkeypatch):
    monkeypatch.setattr(cb, "_fa3_with_kvcache", lambda: fake_fa3_with_kvcache)
    case = small_case(batch_size=4, tree_per_request="mixed", page_size=8)
    inputs = build_inputs(case).causal()
    fn = CausalBaseline().prepare(inputs)
    assert CausalBaseline().kernel_path(case) == "fa3_with_kvcache" and fn.kernel == "fa3 flash_attn_with_kvcache"
    assert_matches_reference(fn(), inputs)


@pytest.mark.parametrize("path", ["varlen", "flash_attn"])
def test_causal_baseline_against_causal_reference(monkeypatch, path):
    monkeypatch.setattr(cb, "_varlen_attn", lambda: fake_varlen)
    monkeypatch.setattr(cb, "_flash_attn_with_kvcache", lambda: fake_flash_with_kvcache if path != "varlen" else None)
    case = small_case(batch_size=4, tree_per_request="mixed", page_size=256 if path != "varlen" else 8)
    inputs = build_inputs(case).causal()
    backend = CausalBaseline()
    assert backend.kernel_path(case) == ("torch_varlen_flash" if path == "varlen" else "flash_attn_with_kvcache")
    assert_matches_reference(backend.prepare(inputs)(), inputs)


def test_varlen_keywords_follow_the_signature():
    def old(q, k, v, cu_q, cu_k, max_q, max_k, is_causal=False, scale=None):
        pass
    assert cb.varlen_keywords(old, 0.5) == {"scale": 0.5, "is_causal": True}
    assert cb.varlen_keywords(fake_varlen, 0.5) == {"scale": 0.5, "window_size": (-1, 0), "enable_gqa": True}


# ---- flex: real eager FlexAttention on the CPU -----------------------------------------------

@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("case_kw", [dict(batch_size=3, tree_per_request="mixed", page_size=5),
                                     dict(batch_size=2, context_len=37, tree="full:3:2", num_kv_heads=6)])
def test_flex_eager_matches_reference(case_kw, dtype):
    inputs = build_inputs(small_case(dtype=dtype, **case_kw))
    out = FlexTree().prepare(inputs)()
    assert out.dtype == inputs.dtype and out.shape == inputs.q.shape
    assert_matches_reference(out, inputs)


def test_timed_calls_build_no_index_tensor_from_host_lists(monkeypatch):
    """A timed call must not copy host lists to the device (CUDA graph capture
    forbids it): the helpers that do are only called in setup."""
    monkeypatch.setattr(cb, "_flash_attn_with_kvcache", lambda: fake_flash_with_kvcache)
    flex_in = build_inputs(small_case(batch_size=3, tree_per_request="mixed"))
    causal_in = build_inputs(small_case(batch_size=3, page_size=256)).causal()
    calls = [FlexTree().prepare(flex_in), CausalBaseline().prepare(causal_in)]

    def host_copy(*a, **k):
        raise AssertionError("index tensor built from host lists inside the timed callable")
    for mod in (cv, cb, __import__("treebench.backends.flex", fromlist=["x"])):
        for helper in ("padded_rows", "token_slots", "prefix_sums"):
            if hasattr(mod, helper):
                monkeypatch.setattr(mod, helper, host_copy)
    for fn in calls:
        assert fn().shape == (sum(t.size for t in flex_in.trees) if fn is calls[0]
                              else causal_in.q.shape[0], 6, 16)


# ---- capabilities and availability -----------------------------------------------------------

@pytest.mark.parametrize("cls, kw, needle", [
    (XformersTree, dict(page_size=16), "multiple of 64"),
    (XformersTree, dict(page_size=64, head_dim=64, tree_per_request="mixed"), "per-request trees"),
    (XformersTree, dict(page_size=64, dtype="float32"), "dtype float32"),
    (VllmTriton, dict(tree_per_request="mixed"), "per-request trees"),
    (FlashInferMask, dict(head_dim=96, dtype="bfloat16"), "head dim 96"),
    (CausalBaseline, dict(head_dim=264, dtype="float16"), "head dim 264"),
])
def test_skips_name_their_reason(cls, kw, needle):
    assert needle in cls().supports(small_case(**{"dtype": "bfloat16", **kw}))


def test_supported_cases_have_no_skip():
    case = small_case(page_size=64, dtype="bfloat16", head_dim=128, context_len=100)
    for cls in (XformersTree, VllmTriton, FlashInferMask):
        assert cls().supports(case) is None


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU-only behaviour")
def test_cpu_availability_and_flex_size_limit():
    for cls in GPU_ONLY:   # a missing package is named first (its install hint), else the missing GPU
        reason = cls().availability()
        assert "needs a CUDA GPU" in reason or "not installed: pip install" in reason
    assert FlexTree().availability() is None
    big = Case(batch_size=64, context_len=2048, tree="full:3:3")
    assert "materialises" in FlexTree().supports(big)


def test_flex_resets_dynamo_before_the_recompile_limit(monkeypatch):
    """A sweep recompiles flex once per case; the adapter must drop dynamo's caches
    before dynamo's recompile limit makes every later case run eagerly."""
    import treebench.backends.flex as flex_mod

    compiled, resets = [], []
    def fake_compile(fn, dynamic=None):
        assert dynamic is True, "flex must compile with symbolic shapes (static first compiles fail)"
        compiled.append(fn)
        return fn
    monkeypatch.setattr(torch, "compile", fake_compile)
    monkeypatch.setattr(torch._dynamo, "reset", lambda: resets.append(1))
    monkeypatch.setattr(flex_mod, "_COMPILED", {})
    monkeypatch.setattr(flex_mod, "_PREPARED", [0])
    saved = torch._dynamo.config.recompile_limit   # set and restored by hand: torch's config module
    torch._dynamo.config.recompile_limit = 8       # loses the key when monkeypatch's undo deletes it
    try:
        for _ in range(3 * flex_mod.RECOMPILE_LIMIT):
            flex_mod._flex_for(torch.device("cuda"))
        assert torch._dynamo.config.recompile_limit == flex_mod.RECOMPILE_LIMIT
    finally:
        torch._dynamo.config.recompile_limit = saved
    # never more prepares between two resets than half the limit, and one compile per reset
    assert len(resets) >= 3 * flex_mod.RECOMPILE_LIMIT // (flex_mod.RECOMPILE_LIMIT // 2) - 1
    assert len(compiled) == len(resets) + 1
    before = flex_mod._PREPARED[0]
    from torch.nn.attention.flex_attention import flex_attention
    assert flex_mod._flex_for(torch.device("cpu")) is flex_attention     # eager on the CPU, not counted
    assert flex_mod._PREPARED[0] == before


def test_list_names_the_missing_flash_attn_package(monkeypatch, capsys):
    """`treebench list` shows, for causal_baseline, which path it takes and that
    the flash_attn package is missing (issue: 'unavailable with the reason')."""
    from treebench.harness.cli.main import main
    monkeypatch.setattr(cb, "_flash_attn_with_kvcache", lambda: None)
    monkeypatch.setattr(CausalBaseline, "availability", lambda self: None)
    assert "flash_attn not installed" in CausalBaseline().note()
    monkeypatch.setenv("COLUMNS", "400")
    assert main(["list"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if "causal_baseline" in line)
    assert "flash_attn not installed" in row and " yes " in row
    monkeypatch.setattr(cb, "_flash_attn_with_kvcache", lambda: (lambda *a, **k: None))
    assert CausalBaseline().note().startswith("flash_attn_with_kvcache when P % 256 == 0")
