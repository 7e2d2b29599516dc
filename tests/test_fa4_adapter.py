"""fa4_tree / fa4_causal on the CPU: the mask_mod's aux tensors against the ancestor masks,
the kernel label, and the whole prepare path through a fake `flash_attn_varlen_func` that
implements FA4's documented varlen + page_table semantics in float64 and evaluates the
mask exactly as the CuTe mask_mod reads the aux tensors (`tree_visible`). The real kernel
is tests/test_fa4_gpu.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from treebench.backends import fa4_tree as fa4
from treebench.backends.fa4_tree import FA4Causal, FA4Tree, fa4_kernel_label, fa4_kv_tile, fa4_tree_aux, tree_visible
from treebench.harness.model.cases import Case
from treebench.harness.model.compare import compare, compare_lse
from treebench.harness.model.paged import build_inputs
from treebench.harness.model.reference import reference_attention
from treebench.harness.model.tree_specs import parse_tree

TREE_MASK = object()   # stands for the CuTe mask_mod: the fake evaluates tree_visible instead


def small_case(**kw) -> Case:
    base = dict(batch_size=3, context_len="ragged:0-40", tree="full:2:2", num_q_heads=6, num_kv_heads=2,
                head_dim=16, dtype="float32", page_size=16, layout="shuffled")
    base.update(kw)
    return Case(**base)


def fake_varlen(q, k, v, *, cu_seqlens_q, max_seqlen_q, max_seqlen_k, seqused_k, page_table, softmax_scale,
                pack_gqa, return_lse, causal=False, mask_mod=None, aux_tensors=None):
    """FA4's varlen forward: request b's queries q[cu[b]:cu[b+1]] over its first seqused_k[b]
    positions read through page_table; causal is bottom-right aligned; lse (Hq, total_q)."""
    assert return_lse and page_table.dtype == seqused_k.dtype == cu_seqlens_q.dtype == torch.int32
    assert (mask_mod is TREE_MASK) != causal and (aux_tensors is not None) == (mask_mod is not None)
    assert pack_gqa == (q.shape[1] > k.shape[2])
    cu, P = cu_seqlens_q.tolist(), k.shape[1]
    out = torch.zeros(q.shape, dtype=torch.float64)
    lse = torch.zeros(q.shape[1], q.shape[0], dtype=torch.float64)
    for b in range(len(cu) - 1):
        t, s = cu[b + 1] - cu[b], int(seqused_k[b])
        assert t <= max_seqlen_q and s <= max_seqlen_k
        pages = page_table[b, : -(-s // P)].long()
        kb, vb = (c[pages].reshape(-1, *c.shape[2:])[:s].double() for c in (k, v))
        if causal:
            allowed = torch.ones(t, s, dtype=torch.bool).tril(s - t)
        else:
            allowed = torch.tensor([[tree_visible(aux_tensors, b, m, n) for n in range(s)] for m in range(t)])
        g = q.shape[1] // k.shape[2]
        sc = torch.einsum("thd,shd->hts", q[cu[b]:cu[b + 1]].double(), kb.repeat_interleave(g, 1)) * softmax_scale
        sc = sc.masked_fill(~allowed, float("-inf"))
        out[cu[b]:cu[b + 1]] = torch.einsum("hts,shd->thd", sc.softmax(-1), vb.repeat_interleave(g, 1))
        lse[:, cu[b]:cu[b + 1]] = torch.logsumexp(sc, -1)
    return out.to(q.dtype), lse.float()


@pytest.fixture
def fake_fa4(monkeypatch):
    monkeypatch.setattr(FA4Tree, "_api", staticmethod(lambda: SimpleNamespace(varlen=fake_varlen,
                                                                              mask_mod=lambda: TREE_MASK)))


def test_aux_tensors_spell_each_requests_mask():
    trees = [parse_tree("full:2:2"), parse_tree("chain:0"), parse_tree("random:40:1")]   # 40 + 1 > 32 bits
    inputs = build_inputs(small_case(batch_size=3, context_len="ragged:0-40"), trees=trees)
    aux = fa4_tree_aux(inputs)
    ls, ts, ss = inputs.host_lists()
    assert all(a.dtype == torch.int32 for a in aux) and aux[1].shape[1] == 2
    for b, tree in enumerate(trees):
        want = torch.ones(ts[b], ss[b], dtype=torch.bool)
        want[:, ls[b]:] = tree.ancestor_mask
        got = torch.tensor([[tree_visible(aux, b, m, n) for n in range(ss[b])] for m in range(ts[b])])
        assert torch.equal(got, want), b


def test_aux_tensors_cover_a_partial_last_tile():
    inputs = build_inputs(small_case())
    node_col, anc, _ = fa4_tree_aux(inputs)
    assert node_col.shape[1] >= max(inputs.host_lists()[2]) + 192 and anc.shape[0] >= inputs.q.shape[0] + 192 * 2


@pytest.mark.parametrize("case_kw", [dict(), dict(tree_per_request="mixed", page_size=32),
                                     dict(context_len=0, tree="random:9:3"), dict(num_kv_heads=6, tree="chain:5"),
                                     dict(batch_size=2, context_len=17, tree="random:40:2", page_size=128)])
def test_fa4_tree_through_the_fake(fake_fa4, case_kw):
    inputs = build_inputs(small_case(**case_kw))
    out, lse = FA4Tree().prepare(inputs)()
    ref, ref_lse = reference_attention(inputs, return_lse=True)
    assert compare(out, ref, inputs.qo_indptr, "float32").passed
    assert lse.shape == inputs.q.shape[:2] and compare_lse(lse, ref_lse, inputs.qo_indptr, "float32").passed


def test_fa4_causal_through_the_fake(fake_fa4):
    inputs = build_inputs(small_case()).causal()
    out, lse = FA4Causal().prepare(inputs)()
    ref, ref_lse = reference_attention(inputs, return_lse=True)
    assert compare(out, ref, inputs.qo_indptr, "float32").passed
    assert compare_lse(lse, ref_lse, inputs.qo_indptr, "float32").passed
    assert FA4Causal.mask_kind == "causal"


def test_an_lse_left_as_hq_by_total_is_caught(fake_fa4, monkeypatch):
    """Without the transpose, the (Hq, total_q) LSE read as (total_q, Hq) fails the LSE check."""
    monkeypatch.setattr(fa4, "fa4_lse_rows", lambda lse, total, hq: lse.contiguous().view(total, hq))
    inputs = build_inputs(small_case())
    _, lse = FA4Tree().prepare(inputs)()
    _, ref_lse = reference_attention(inputs, return_lse=True)
    assert not compare_lse(lse, ref_lse, inputs.qo_indptr, "float32").passed


@pytest.mark.parametrize("P, D, causal, major, want", [
    (128, 128, False, 9, "fa4 tma"), (16, 128, False, 9, "fa4 paged"), (128, 96, False, 9, "fa4 paged"),
    (128, 96, True, 9, "fa4 tma"), (128, 64, False, 10, "fa4 tma"), (64, 128, False, 10, "fa4 paged")])
def test_the_kernel_label_compares_the_page_with_the_kv_tile(P, D, causal, major, want):
    assert fa4_kernel_label(P, D, causal, major).startswith(want)
    assert fa4_kv_tile(D, causal, major) in (80, 128, 144)


def test_the_row_names_the_kernel(fake_fa4):
    fn = FA4Tree().prepare(build_inputs(small_case(page_size=128)))
    assert fn.kernel.startswith("fa4 ")


def test_fa4_skips_name_their_reason():
    assert "dtype float32" in FA4Tree().supports(small_case(dtype="float32", head_dim=64))
    assert "head dim 256" in FA4Tree().supports(small_case(dtype="bfloat16", head_dim=256))
    assert "page size 8" in FA4Tree().supports(small_case(dtype="bfloat16", head_dim=64, page_size=8))
    reason = FA4Tree().availability()
    assert reason and ("flash_attn.cute" in reason or "CUDA" in reason)
