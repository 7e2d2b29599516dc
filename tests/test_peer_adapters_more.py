"""The SGLang Triton, FlashInfer XQA and two-pass adapters on the CPU.

GPU adapters run their whole `prepare` path through a fake of the upstream call
put in `sys.modules` (so the adapter's real import line runs): the fake checks
the arguments' shapes, dtypes and values and computes the kernel's documented
semantics in float64 (what the upstream source reads: SGLang's
extend_attention.py, FlashInfer's csrc/xqa/mha.cu, FlashInfer's base-2 LSE).
`two_pass` runs for real, through `treebench check` too.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

from tests.test_peer_adapters import dense  # float64 attention of one request

from treebench.backends import _conversions as cv
from treebench.backends import flashinfer_xqa as fx
from treebench.backends import sglang_triton as sg
from treebench.backends import two_pass as tp
from treebench.backends import two_pass_flashinfer as tpf
from treebench.backends._lse import merge_states
from treebench.backends.flashinfer_xqa import FlashInferXqa, xqa_tree_mask
from treebench.backends.sglang_triton import SglangTriton, sglang_arguments
from treebench.backends.two_pass import TwoPass, attend_with_lse
from treebench.backends.two_pass_flashinfer import TwoPassFlashInfer, two_pass_plans
from treebench.harness.cli.main import main
from treebench.harness.model.cases import Case
from treebench.harness.model.compare import compare, compare_lse
from treebench.harness.model.paged import build_inputs
from treebench.harness.model.reference import reference_attention
from treebench.harness.model.tree_specs import parse_tree
from treebench.harness.store.rows import read_rows

ROOT = Path(__file__).resolve().parent.parent
NEG_INF = float("-inf")


def small_case(**kw) -> Case:
    base = dict(batch_size=4, context_len="ragged:0-45", tree="full:2:2", num_q_heads=6,
                num_kv_heads=2, head_dim=16, dtype="float32", page_size=16, layout="shuffled")
    base.update(kw)
    return Case(**base)


def passes(out, inputs) -> bool:
    """`out`, or (out, lse) from a backend that returns its LSE, matches the float64 reference."""
    ref, ref_lse = reference_attention(inputs, return_lse=True)
    lse_ok = True
    if isinstance(out, tuple):
        out, lse = out
        lse_ok = compare_lse(lse, ref_lse, inputs.qo_indptr, inputs.case.dtype).passed
    return lse_ok and compare(out, ref, inputs.qo_indptr, inputs.case.dtype,
                              kv_dtype=inputs.case.kv_dtype).passed


def install(monkeypatch, name: str, **attrs) -> types.ModuleType:
    """Puts a fake module `name` (and its parent packages) into sys.modules."""
    parts = name.split(".")
    for i in range(1, len(parts) + 1):
        monkeypatch.setitem(sys.modules, ".".join(parts[:i]), types.ModuleType(".".join(parts[:i])))
    mod = sys.modules[name]
    for key, value in attrs.items():
        setattr(mod, key, value)
    return mod


def pool_rows(cache, slots):
    """Rows of the (N, P, Hkv, D) pool at flat slots; an fp8 pool's codes as float64 (unscaled)."""
    flat = cache.reshape(-1, *cache.shape[2:])
    if cache.element_size() == 1:
        return flat.view(torch.uint8)[slots.long()].view(cache.dtype).double()
    return flat[slots.long()]


# ---- the LSE merge --------------------------------------------------------------------------

def naive_merge(o1, lse1, o2, lse2):
    """The merge formula with no guard (both -inf gives exp(NaN))."""
    m = torch.maximum(lse1, lse2)
    w1, w2 = torch.exp(lse1 - m), torch.exp(lse2 - m)
    return (w1[..., None] * o1 + w2[..., None] * o2) / (w1 + w2)[..., None], m + torch.log(w1 + w2)


def is_empty_state(o, lse) -> bool:
    return bool(torch.isfinite(o).all() and (o == 0).all() and torch.isneginf(lse).all())


@pytest.mark.parametrize("merge, ok", [(merge_states, True), (naive_merge, False)], ids=["merge_states", "naive"])
def test_two_empty_states_merge_to_the_empty_state(merge, ok):
    """Both LSE = -inf: (0, -inf), never NaN; the unguarded formula is caught."""
    o = torch.randn(3, 2, 4)
    lse = torch.full((3, 2), NEG_INF)
    assert is_empty_state(*merge(o, lse, o.clone(), lse.clone())) is ok


def test_merge_ignores_the_output_of_an_empty_state():
    o2, lse2 = torch.randn(5, 3, 8), torch.randn(5, 3)
    garbage = torch.full((5, 3, 8), float("nan"))          # a kernel's 0 / 0 over no keys
    o, lse = merge_states(garbage, torch.full((5, 3), NEG_INF), o2, lse2)
    assert torch.equal(o, o2) and torch.equal(lse, lse2)
    assert torch.isnan(naive_merge(garbage, torch.full((5, 3), NEG_INF), o2, lse2)[0]).all()


@pytest.mark.parametrize("split", [1, 7, 36])
def test_merge_of_two_key_sets_is_attention_over_their_union(split):
    torch.manual_seed(split)
    q, k, v = torch.randn(5, 4, 16), torch.randn(37, 2, 16), torch.randn(37, 2, 16)
    o1, l1 = attend_with_lse(q, k[:split], v[:split], None, 0.25)
    o2, l2 = attend_with_lse(q, k[split:], v[split:], None, 0.25)
    o, lse = merge_states(o1, l1, o2, l2)
    want_o, want_lse = attend_with_lse(q, k, v, None, 0.25)
    torch.testing.assert_close(o, want_o, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse, want_lse, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(o.double(), dense(q, k, v, torch.ones(5, 37, dtype=torch.bool), 0.25).double(),
                               atol=1e-5, rtol=1e-5)


def test_attention_over_no_keys_is_the_empty_state():
    o, lse = attend_with_lse(torch.randn(3, 4, 8), torch.empty(0, 2, 8), torch.empty(0, 2, 8), None, 0.3)
    assert is_empty_state(o, lse) and o.shape == (3, 4, 8) and lse.shape == (3, 4)


# ---- two_pass (PyTorch inner): the real thing --------------------------------------------------

@pytest.mark.parametrize("case_kw", [dict(tree_per_request="mixed", page_size=5),
                                     dict(context_len=0, tree="random:9:3"),
                                     dict(batch_size=2, context_len=37, tree="full:3:2", num_kv_heads=6),
                                     dict(dtype="bfloat16", layout="interleaved")])
def test_two_pass_matches_reference(case_kw):
    inputs = build_inputs(small_case(**case_kw))
    out, lse = TwoPass().prepare(inputs)()
    assert out.dtype == inputs.dtype and out.shape == inputs.q.shape and lse.shape == inputs.q.shape[:2]
    out = (out, lse)
    assert passes(out, inputs)


def test_python_m_treebench_check_two_pass_exits_0():
    proc = subprocess.run([sys.executable, "-m", "treebench", "check", "--quiet", "--backend", "two_pass"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr


EMPTY_CONTEXT_SUITE = """
[suite]
name = "empty_context"
description = "L_b = 0 for every request: pass 1 of the two-pass method is empty"

[axes]
batch_size = [3]
context_len = [0, "ragged:0-9"]
tree = ["full:2:2"]
tree_per_request = ["mixed"]
num_q_heads = [4]
num_kv_heads = [2]
head_dim = [16]
dtype = ["float32"]
page_size = [4]
layout = ["shuffled"]
"""


def nan_over_no_keys(q, k, v, allowed, scale):
    """attend_with_lse as a kernel that leaves 0 / 0 in the rows with no keys."""
    o, lse = attend_with_lse(q, k, v, allowed, scale)
    return (torch.full_like(o, float("nan")) if k.shape[0] == 0 else o), lse


@pytest.mark.parametrize("merge, rc", [(merge_states, 0), (naive_merge, 1)], ids=["merge_states", "naive"])
def test_check_catches_a_broken_merge_on_empty_contexts(monkeypatch, tmp_path, merge, rc):
    """An empty pass 1 whose O is NaN: the guarded merge still passes `check`;
    the unguarded one (0 * NaN) is a mismatch that `check` reports."""
    suite, out = tmp_path / "empty.toml", tmp_path / "rows.jsonl"
    suite.write_text(EMPTY_CONTEXT_SUITE)
    monkeypatch.setattr(tp, "attend_with_lse", nan_over_no_keys)
    monkeypatch.setattr(tp, "merge_states", merge)
    assert main(["check", "--backend", "two_pass", "--suite", str(suite), "--out", str(out), "--quiet"]) == rc
    status = {r["case"]["context_len"]: r["status"] for r in read_rows([out])}
    assert status[0] == ("pass" if rc == 0 else "mismatch")
    assert status["ragged:0-9"] == "pass" or rc == 1


# ---- sglang_triton: prepare through a fake extend_attention_fwd -------------------------------

def fake_extend_attention_fwd(q_extend, k_extend, v_extend, o_extend, k_buffer, v_buffer, qo_indptr,
                              kv_indptr, kv_indices, custom_mask, is_causal, mask_indptr, max_len_extend,
                              k_scale, v_scale, sm_scale=None, logit_cap=0.0, skip_prefix_custom_mask=True,
                              sliding_window_size=-1, sinks=None, window_kv_offsets=None,
                              xai_temperature_len=-1):
    """extend_attention.py's `_fwd_kernel` semantics: stage 1 over the prefix slots
    kv_indices[kv_indptr[b]:kv_indptr[b+1]] of k_buffer (custom mask skipped there),
    stage 2 over the extend rows with mask row i at mask_indptr[b] + i * (L_b + T_b) + L_b."""
    assert qo_indptr.dtype == kv_indptr.dtype == torch.int32
    assert kv_indices.dtype == mask_indptr.dtype == torch.int64 and custom_mask.dtype == torch.bool
    assert k_extend.is_contiguous() and v_extend.is_contiguous() and k_buffer.dim() == 3
    assert is_causal is True and skip_prefix_custom_mask is True and k_scale == v_scale == 1.0
    assert logit_cap == 0.0 and sliding_window_size == -1 and sinks is None
    qo, kv, mo = qo_indptr.tolist(), kv_indptr.tolist(), mask_indptr.tolist()
    assert max_len_extend == max(b - a for a, b in zip(qo, qo[1:]))
    for b in range(len(qo) - 1):
        t, l = qo[b + 1] - qo[b], kv[b + 1] - kv[b]
        slots = kv_indices[kv[b]:kv[b + 1]]
        k = torch.cat([k_buffer[slots], k_extend[qo[b]:qo[b + 1]]])
        v = torch.cat([v_buffer[slots], v_extend[qo[b]:qo[b + 1]]])
        assert mo[b + 1] - mo[b] == t * (l + t)
        allowed = custom_mask[mo[b]:mo[b + 1]].view(t, l + t).clone()
        allowed[:, :l] = True                                                   # SKIP_PREFIX_CUSTOM_MASK
        allowed[:, l:] &= torch.ones(t, t, dtype=torch.bool).tril()             # IS_CAUSAL bounds stage 2
        o_extend[qo[b]:qo[b + 1]] = dense(q_extend[qo[b]:qo[b + 1]], k, v, allowed, sm_scale).to(o_extend.dtype)


@pytest.mark.parametrize("case_kw", [dict(tree_per_request="mixed", page_size=5),
                                     dict(context_len=0, batch_size=2),
                                     dict(context_len=33, tree="random:9:4", page_size=16, layout="interleaved")])
def test_sglang_through_a_fake_kernel(monkeypatch, case_kw):
    install(monkeypatch, sg.MODULE, extend_attention_fwd=fake_extend_attention_fwd)
    inputs = build_inputs(small_case(**case_kw))
    fn = SglangTriton().prepare(inputs)
    out = fn()
    assert fn.kernel == "sglang extend_attention_fwd"
    assert out.shape == inputs.q.shape and passes(out, inputs)


def test_sglang_indices_and_mask_map_to_the_right_slots():
    inputs = build_inputs(small_case(batch_size=5, tree_per_request="mixed", page_size=7))
    a = sglang_arguments(inputs).positional
    _, k_ext, _, _, k_buf, _, qo, kv_indptr, kv_indices, mask, _, mask_indptr, t_max = a[:13]
    ls, ts, ss = inputs.host_lists()
    assert k_buf.data_ptr() == inputs.k_cache.data_ptr() and k_buf.shape[0] == inputs.k_cache.shape[0] * 7
    assert kv_indptr.tolist() == cv.prefix_sums(ls).tolist() and t_max == max(ts)
    assert mask_indptr.tolist() == cv.prefix_sums([t * s for t, s in zip(ts, ss)]).tolist()
    kv_off = torch.tensor([0] + ss).cumsum(0).tolist()
    for b in range(5):
        logical = inputs.k_logical[kv_off[b]:kv_off[b + 1]]                     # (S_b, Hkv, D) positions 0..S_b
        ctx = kv_indices[kv_indptr[b]:kv_indptr[b + 1]]
        assert torch.equal(k_buf[ctx], logical[:ls[b]])                         # slot = page * P + offset
        assert torch.equal(k_ext[qo[b]:qo[b + 1]], logical[ls[b]:])            # the tree's own K
        seg = mask[mask_indptr[b]:mask_indptr[b + 1]].view(ts[b], ss[b])
        assert seg[:, :ls[b]].all() and torch.equal(seg[:, ls[b]:], inputs.trees[b].ancestor_mask)


def test_sglang_gives_a_valid_pointer_when_no_request_has_context():
    a = sglang_arguments(build_inputs(small_case(context_len=0))).positional
    assert a[7].tolist() == [0] * 5 and a[8].numel() == 1


# ---- flashinfer_xqa: the mask bits and prepare through a fake xqa ------------------------------

def test_xqa_mask_hand_computed():
    fork = parse_tree("parents:-1,0,0,1")                        # node 3 is node 1's child
    assert xqa_tree_mask([fork], 4).view(torch.int16).tolist() == [[1, 0], [3, 0], [5, 0], [11, 0]]
    chain = xqa_tree_mask([parse_tree("chain:39")], 40)          # T = 40: two 32-bit words per row
    assert chain.dtype == torch.uint16 and chain.shape == (40, 4)
    words = (chain.view(torch.int16).int() & 0xFFFF).tolist()
    assert words[16] == [0xFFFF, 1, 0, 0] and words[39] == [0xFFFF, 0xFFFF, 0xFF, 0]


def xqa_signature(q, k_cache, v_cache, page_table, seq_lens, output, workspace_buffer, semaphores,
                  num_kv_heads, page_size, sinks=None, q_scale=1.0, kv_scale=1.0, sliding_win_size=0,
                  kv_layout="NHD", sm_count=None, enable_pdl=None, rcp_out_scale=1.0, q_seq_len=1, mask=None,
                  *, q_cu_seq_lens=None, k_sf_cache=None, v_sf_cache=None):
    """flashinfer.xqa's signature in 0.6.18.post1."""


def fake_xqa(*args, **kw):
    """mha.cu semantics: row i of request b sees [0, S_b - T_b) and position
    S_b - T_b + j iff bit j (uint16 word j // 16, bit j % 16) of its mask row; K and V
    codes times kv_scale (the qk scale q_scale * kv_scale / sqrt(D), the output times kv_scale)."""
    a = inspect.signature(xqa_signature).bind(*args, **kw).arguments
    q, out, bt, sl, p = a["q"], a["output"], a["page_table"], a["seq_lens"], a["page_size"]
    assert bt.dtype == torch.int32 and sl.dtype == torch.uint32 and sl.dim() == 2 and sl.shape[1] == 1
    assert a["semaphores"].dtype == torch.uint32 and not a["semaphores"].view(torch.int32).any()
    assert a["workspace_buffer"].dtype == torch.uint8 and a.get("kv_layout", "NHD") == "NHD"
    assert out.shape == q.shape and out.dtype == q.dtype and a["num_kv_heads"] == a["k_cache"].shape[2]
    B, t_max, cu = sl.shape[0], a.get("q_seq_len", 1), a.get("q_cu_seq_lens")
    if cu is None:
        assert q.dim() == (5 if t_max > 1 else 4) and q.shape[:2] == (B, 1)
        cu = [t_max * b for b in range(B + 1)]
    else:
        assert q.dim() == 3 and cu.dtype == torch.int32 and t_max > 1
        cu = cu.tolist()
    Hq, D = q.shape[-2:]
    qq, oo = q.reshape(-1, Hq, D), out.view(-1, Hq, D)
    if t_max > 1:
        words = 2 * -(-t_max // 32)
        assert a["mask"].dtype == torch.uint16 and a["mask"].shape[-1] == words
        rows = a["mask"].reshape(-1, words).view(torch.int16).long() & 0xFFFF
    for b in range(B):
        s, t = int(sl[b, 0].view(torch.int32)), cu[b + 1] - cu[b]
        pos = torch.arange(s)
        k, v = (pool_rows(c, bt[b].long()[pos // p] * p + pos % p) * a.get("kv_scale", 1.0)
                for c in (a["k_cache"], a["v_cache"]))
        allowed = torch.ones(t, s, dtype=torch.bool)
        if t_max > 1:
            j = torch.arange(t)
            allowed[:, s - t:] = ((rows[cu[b]:cu[b + 1], j // 16] >> (j % 16)) & 1).bool()
        oo[cu[b]:cu[b + 1]] = dense(qq[cu[b]:cu[b + 1]], k, v, allowed, a["q_scale"] * D ** -0.5).to(out.dtype)


fake_xqa.__signature__ = inspect.signature(xqa_signature)   # what the adapter's signature check reads


@pytest.mark.parametrize("case_kw", [dict(tree="full:2:2"),                             # one T: (B, 1, T, Hq, D)
                                     dict(tree_per_request="mixed", page_size=32),      # ragged Q
                                     dict(tree="chain:0", context_len=20),              # T = 1: plain decode
                                     dict(tree="chain:39", batch_size=2, head_dim=32)])  # two mask words
def test_xqa_through_a_fake_kernel(monkeypatch, case_kw):
    install(monkeypatch, "flashinfer", xqa=fake_xqa)
    case = small_case(**case_kw)                                   # float32: the fake's tolerance is tight
    assert FlashInferXqa().supports(dataclasses.replace(case, dtype="bfloat16")) is None
    inputs = build_inputs(case)
    out = FlashInferXqa().prepare(inputs)()
    assert out.shape == inputs.q.shape and passes(out, inputs)


def test_xqa_fake_catches_a_transposed_mask(monkeypatch):
    """The fake reads bits as the kernel does: the mask of node j -> i instead of i -> j fails."""
    install(monkeypatch, "flashinfer", xqa=fake_xqa)
    inputs = build_inputs(small_case(batch_size=2, tree="full:2:2"))
    kw = fx.xqa_arguments(inputs, torch.zeros(8, dtype=torch.uint8), torch.zeros(4, dtype=torch.int32).view(
        torch.uint32))
    transposed = [type(t)(t.parents) for t in inputs.trees]
    for t in transposed:
        t.__dict__["ancestor_mask"] = t.ancestor_mask.T.contiguous()
    kw["mask"] = xqa_tree_mask(transposed, 7).view(2, 7, -1)
    fake_xqa(**kw)
    assert not passes(kw["output"].view(inputs.q.shape), inputs)


@pytest.mark.parametrize("kw, needle", [(dict(page_size=8), "page size 8"), (dict(head_dim=264), "head dim 264"),
                                        (dict(dtype="float32"), "dtype float32")])
def test_xqa_skips_name_their_reason(kw, needle):
    assert needle in FlashInferXqa().supports(small_case(**{"dtype": "bfloat16", **kw}))


def test_xqa_without_ragged_q_skips_trees_of_different_sizes(monkeypatch):
    def old_xqa(q, k_cache, v_cache, page_table, seq_lens, output, workspace_buffer, semaphores,
                num_kv_heads, page_size, q_seq_len=1, mask=None):
        pass
    install(monkeypatch, "flashinfer", xqa=old_xqa)
    assert "q_cu_seq_lens" in FlashInferXqa().supports(small_case(dtype="bfloat16", tree_per_request="mixed"))
    assert FlashInferXqa().supports(small_case(dtype="bfloat16")) is None


def test_xqa_names_the_kernel_flashinfer_picks():
    """mha_sm90.cu for an e4m3 pool on SM9x, unless speculative decoding has ragged Q or a SWAP_AB
    shape (q_seq_len * G <= 32); mha.cu otherwise (flashinfer/xqa.py, 0.6.18.post1)."""
    def kw(t, g=4, dtype=torch.float8_e4m3fn, ragged=False, d=128):
        return dict(k_cache=torch.empty(1, 16, 2, d, dtype=dtype), q=torch.empty(1, 1, t, 2 * g, d),
                    num_kv_heads=2, q_seq_len=t, q_cu_seq_lens=torch.zeros(2) if ragged else None)

    assert fx.xqa_kernel(kw(28), 9) == "xqa mha_sm90 (Hopper)"                     # 28 * 4 > 32
    assert fx.xqa_kernel(kw(1), 9) == "xqa mha_sm90 (Hopper)"                      # plain decode
    assert fx.xqa_kernel(kw(8), 9) == "xqa mha (generic)"                          # 8 * 4 <= 32: SWAP_AB
    assert fx.xqa_kernel(kw(28, ragged=True), 9) == "xqa mha (generic)"
    assert fx.xqa_kernel(kw(28, dtype=torch.bfloat16), 9) == "xqa mha (generic)"
    assert fx.xqa_kernel(kw(28), 10) == "xqa mha (generic)"


def test_xqa_rows_name_their_kernel(monkeypatch):
    install(monkeypatch, "flashinfer", xqa=fake_xqa)
    fn = FlashInferXqa().prepare(build_inputs(small_case(tree="full:2:2")))
    assert fn.kernel == "xqa mha (generic)"                                        # the CPU: no SM9x


def test_xqa_says_it_is_tensorrt_llms_verify_kernel():
    b = FlashInferXqa()
    assert "TensorRT-LLM" in b.note() and "TensorRT-LLM" in b.install_hint
    assert "Medusa/EAGLE verify" in (FlashInferXqa.__doc__ or "")


# ---- two_pass_flashinfer: prepare through a fake paged prefill wrapper -------------------------

class FakePrefill:
    """BatchPrefillWithPagedKVCacheWrapper's semantics (NHD, no mask, non-causal);
    `run(..., return_lse=True)` returns the LSE in base 2, as FlashInfer's kernels do."""

    lse_base2 = True

    def __init__(self, workspace, layout):
        assert layout == "NHD" and workspace.dtype == torch.uint8

    def plan(self, qo_indptr, kv_indptr, kv_indices, last_page_len, hq, hkv, d, page_size, *, causal,
             q_data_type, kv_data_type, sm_scale):
        assert all(t.dtype == torch.int32 for t in (qo_indptr, kv_indptr, kv_indices, last_page_len))
        assert causal is False and ((last_page_len >= 1) & (last_page_len <= page_size)).all()
        assert (kv_indptr[1:] > kv_indptr[:-1]).all(), "every request owns at least one page"
        self.qo, self.kv, self.idx = qo_indptr.tolist(), kv_indptr.tolist(), kv_indices.long()
        self.last, self.p, self.scale = last_page_len.tolist(), page_size, sm_scale

    def run(self, q, kv, return_lse=False):
        assert return_lse and kv[0].shape[1] == self.p
        o = torch.empty(q.shape, dtype=torch.float64)
        lse = torch.empty(q.shape[:2], dtype=torch.float64)
        for b in range(len(self.qo) - 1):
            pages = self.idx[self.kv[b]:self.kv[b + 1]]
            s = (len(pages) - 1) * self.p + self.last[b]
            k, v = (c[pages].reshape(-1, *c.shape[2:])[:s] for c in kv)
            qb = q[self.qo[b]:self.qo[b + 1]]
            g = qb.shape[1] // k.shape[1]
            scores = torch.einsum("thd,shd->ths", qb.double(), k.double().repeat_interleave(g, 1)) * self.scale
            o[self.qo[b]:self.qo[b + 1]] = dense(qb, k, v, torch.ones(len(qb), s, dtype=torch.bool), self.scale)
            lse[self.qo[b]:self.qo[b + 1]] = torch.logsumexp(scores, -1)
        return o.to(q.dtype), (lse / torch.log(torch.tensor(2.0)) if self.lse_base2 else lse).float()


@pytest.mark.parametrize("case_kw", [dict(tree_per_request="mixed", page_size=5),
                                     dict(context_len=0, tree="random:9:3"),
                                     dict(context_len="ragged:0-3", batch_size=6, page_size=4),
                                     dict(batch_size=2, context_len=40, tree="full:3:2", num_kv_heads=3)])
def test_two_pass_flashinfer_through_a_fake_wrapper(monkeypatch, case_kw):
    install(monkeypatch, "flashinfer", BatchPrefillWithPagedKVCacheWrapper=FakePrefill)
    inputs = build_inputs(small_case(**case_kw))
    out, lse = TwoPassFlashInfer().prepare(inputs)()
    assert out.shape == inputs.q.shape and out.dtype == inputs.dtype and passes((out, lse), inputs)


def test_two_pass_flashinfer_converts_the_base_2_lse(monkeypatch):
    """A wrapper returning natural-log LSE makes the adapter's ln 2 conversion wrong: a mismatch."""
    monkeypatch.setattr(FakePrefill, "lse_base2", False)
    install(monkeypatch, "flashinfer", BatchPrefillWithPagedKVCacheWrapper=FakePrefill)
    inputs = build_inputs(small_case(context_len=30))
    assert not passes(TwoPassFlashInfer().prepare(inputs)(), inputs)


def test_two_pass_tree_pages_are_the_ancestors_slots():
    inputs = build_inputs(Case(batch_size=1, context_len=2, tree="parents:-1,0,0,1", num_q_heads=2,
                               num_kv_heads=1, head_dim=16, dtype="float32", page_size=4))
    plans = two_pass_plans(inputs)
    qo, kv_indptr, kv_indices, last, *_, page_size = plans.tree.positional
    slots = cv.token_slots(inputs.block_table, [2], [4], 4).tolist()             # nodes 0..3 at positions 2..5
    assert page_size == 1 and qo.tolist() == [0, 1, 2, 3, 4] and last.tolist() == [1] * 4
    assert kv_indptr.tolist() == [0, 1, 3, 5, 8]                                  # depth + 1 slots per node
    assert kv_indices.tolist() == [slots[0], slots[0], slots[1], slots[0], slots[2],
                                   slots[0], slots[1], slots[3]]
    assert not plans.empty_context.any()


# ---- timed calls stay graph-safe ----------------------------------------------------------------

def test_timed_calls_build_no_index_tensor(monkeypatch):
    """After prepare, the timed call must not build index tensors from host lists."""
    install(monkeypatch, sg.MODULE, extend_attention_fwd=fake_extend_attention_fwd)
    install(monkeypatch, "flashinfer", xqa=fake_xqa, BatchPrefillWithPagedKVCacheWrapper=FakePrefill)
    inputs = build_inputs(small_case(tree_per_request="mixed"))
    calls = [cls().prepare(inputs) for cls in (TwoPass, SglangTriton, FlashInferXqa, TwoPassFlashInfer)]

    def host_copy(*a, **k):
        raise AssertionError("index tensor built inside the timed callable")
    for mod in (cv, tp, tpf, sg, fx):
        for helper in ("token_slots", "prefix_sums", "flashinfer_page_metadata", "flattened_tree_mask",
                       "xqa_tree_mask", "gather_tokens"):
            if hasattr(mod, helper):
                monkeypatch.setattr(mod, helper, host_copy)
    for fn in calls:
        out = fn()
        assert (out[0] if isinstance(out, tuple) else out).shape == inputs.q.shape


def test_torch_sdpa_rows_name_their_kernel():
    from treebench.harness.run.loading import load_one

    fn = load_one("torch_sdpa").prepare(build_inputs(small_case()))
    assert fn.kernel.startswith("torch sdpa per request")
