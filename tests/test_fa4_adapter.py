"""fa4_tree / fa4_causal on the CPU: the mask_mod's aux tensors against the ancestor masks,
the kernel label, and the whole prepare path through a fake `flash_attn_varlen_func` that
implements FA4's documented varlen + page_table semantics in float64 and evaluates the
mask exactly as the CuTe mask_mod reads the aux tensors (`tree_visible`), and loads K/V the
way FA4's two paged paths do (TMA: whole pages; else zero-filled past S_b). The real kernel
is tests/test_fa4_gpu.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from treebench.backends import fa4_tree as fa4
from treebench.backends.fa4_tree import (FA4Causal, FA4Tree, fa4_finite_tails, fa4_kernel_label, fa4_kv_tile,
                                         fa4_tree_aux, fa4_uses_tma, mask_mod_takes_seqlen_info, pool_bytes,
                                         tree_visible)
from treebench.harness.model.cases import Case
from treebench.harness.model.compare import compare, compare_lse
from treebench.harness.model.paged import build_inputs
from treebench.harness.model.reference import reference_attention
from treebench.harness.model.tree_specs import parse_tree


def small_case(**kw) -> Case:
    base = {"batch_size": 3, "context_len": "ragged:0-40", "tree": "full:2:2", "num_q_heads": 6, "num_kv_heads": 2,
                "head_dim": 16, "dtype": "float32", "page_size": 16, "layout": "shuffled"}
    base.update(kw)
    return Case(**base)


def tree_mask_mod(batch, head, m_idx, n_idx, seqlen_info, aux_tensors):
    """The tree mask_mod with 4.0.0b36's six arguments, in Python: what the CuTe one computes."""
    return tree_visible(aux_tensors, batch, m_idx, n_idx)


def fake_varlen(q, k, v, qv=None, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None,
                min_seqlen_k=None, seqused_q=None, seqused_k=None, gather_kv_indices=None, page_table=None,
                softmax_scale=None, causal=False, window_size=(None, None), learnable_sink=None, softcap=0.0,
                num_splits=1, pack_gqa=None, deterministic=False, score_mod=None, score_mod_bwd=None, mask_mod=None,
                block_sparse_tensors=None, aux_tensors=None, aux_scalars=None, return_lse=False,
                scheduler_metadata=None, seqlen_k_per_split=None, disable_scheduler_metadata=False,
                gather_bwd_recompute_p=False, gather_bwd_token_chunk=None):
    """flash_attn.cute.flash_attn_varlen_func of 4.0.0b36 (its signature; the checks of
    `_flash_attn_fwd` on page_table, seqused_k and cu_seqlens_q) in float64: request b's queries
    q[cu[b]:cu[b+1]] over its first seqused_k[b] positions read through page_table; causal is
    bottom-right aligned; mask_mod(b, h, m, n, seqlen_info, aux_tensors) per element; returns
    (out, lse (Hq, total_q)). K/V come in as FA4 loads them: with P equal to the KV tile (TMA)
    whole pages, whose slots past seqused_k get probability 0 but still enter P @ V (0 * NaN is
    NaN); else page by page, rows past seqused_k zero-filled."""
    B, P = cu_seqlens_q.shape[0] - 1, v.shape[1]
    assert cu_seqlens_k is None, "page_table is not supported with cu_seqlens_k"
    assert page_table.dtype == torch.int32 and page_table.stride(-1) == 1
    assert page_table.shape == (B, page_table.shape[1]) and k.shape == v.shape == (v.shape[0], P, *v.shape[2:])
    for t in (cu_seqlens_q, seqused_k):
        assert t.dtype == torch.int32 and t.stride(0) == 1
    assert seqused_k.shape == (B,) and q.shape[1] % k.shape[2] == 0
    assert return_lse and causal != (mask_mod is not None) and (aux_tensors is not None) == (mask_mod is not None)
    assert pack_gqa == (q.shape[1] > k.shape[2])
    whole_pages = fa4_uses_tma(P, q.shape[2], causal, 10)       # the fake runs SM100's tile table
    cu, g = cu_seqlens_q.tolist(), q.shape[1] // k.shape[2]
    out = torch.zeros(q.shape, dtype=torch.float64)
    lse = torch.zeros(q.shape[1], q.shape[0], dtype=torch.float64)
    for b in range(B):
        t, s = cu[b + 1] - cu[b], int(seqused_k[b])
        assert t <= max_seqlen_q and s <= max_seqlen_k
        n_pages = -(-s // P)
        kb, vb = (c[page_table[b, :n_pages].long()].reshape(-1, *c.shape[2:]).double() for c in (k, v))
        if not whole_pages:
            kb, vb = (torch.cat([x[:s], torch.zeros_like(x[s:])]) for x in (kb, vb))
        n = kb.shape[0]                                          # columns loaded: n_pages * P
        if causal:
            allowed = torch.ones(t, n, dtype=torch.bool).tril(s - t)
        else:
            allowed = torch.tensor([[bool(mask_mod(b, 0, m, c, None, aux_tensors)) if c < s else False
                                     for c in range(n)] for m in range(t)])
        allowed[:, s:] = False                                   # seqlen mask: score -inf past seqused_k
        sc = torch.einsum("thd,shd->hts", q[cu[b]:cu[b + 1]].double(), kb.repeat_interleave(g, 1)) * softmax_scale
        sc = torch.where(allowed, sc, float("-inf"))             # a select, as the kernel's mask: NaN K is dropped
        out[cu[b]:cu[b + 1]] = torch.einsum("hts,shd->thd", sc.softmax(-1), vb.repeat_interleave(g, 1))
        lse[:, cu[b]:cu[b + 1]] = torch.logsumexp(sc, -1)
    return out.to(q.dtype), lse.float()


@pytest.fixture
def fake_fa4(monkeypatch):
    monkeypatch.setattr(FA4Tree, "_api", staticmethod(lambda: SimpleNamespace(varlen=fake_varlen,
                                                                              mask_mod=lambda: tree_mask_mod)))


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


@pytest.mark.parametrize("case_kw", [{}, {"tree_per_request": "mixed", "page_size": 32},
                                     {"context_len": 0, "tree": "random:9:3"}, {"num_kv_heads": 6, "tree": "chain:5"},
                                     {"batch_size": 2, "context_len": 17, "tree": "random:40:2", "page_size": 128}])
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


@pytest.mark.parametrize("cls", [FA4Tree, FA4Causal])
def test_the_tma_path_reads_a_pool_copy_with_zeroed_tails(fake_fa4, cls):
    """P = 128 is the KV tile: FA4 loads whole pages, and the NaN tail of a last page would
    reach P @ V as 0 * NaN; the copy with zeroed tails passes, the pool itself is untouched."""
    inputs = build_inputs(small_case(batch_size=2, context_len="ragged:0-150", page_size=128))
    inputs = inputs.causal() if cls is FA4Causal else inputs
    fn = cls().prepare(inputs)
    assert fn.kernel.startswith("fa4 tma") and "zeroed tails" in fn.kernel
    out, lse = fn()
    ref, ref_lse = reference_attention(inputs, return_lse=True)
    assert compare(out, ref, inputs.qo_indptr, "float32").passed
    assert compare_lse(lse, ref_lse, inputs.qo_indptr, "float32").passed
    assert inputs.k_cache.isnan().any() and inputs.v_cache.isnan().any()


def test_the_tma_path_without_the_copy_returns_nan(fake_fa4, monkeypatch):
    """What the H200 showed for fa4_causal at P 128: the LSE right, every output non-finite."""
    monkeypatch.setattr(fa4, "fa4_finite_tails", lambda inputs: (inputs.k_cache, inputs.v_cache))
    inputs = build_inputs(small_case(batch_size=2, context_len=17, page_size=128)).causal()
    out, lse = FA4Causal().prepare(inputs)()
    _, ref_lse = reference_attention(inputs, return_lse=True)
    assert not out.isfinite().any()
    assert compare_lse(lse, ref_lse, inputs.qo_indptr, "float32").passed


def test_finite_tails_zero_exactly_the_read_slots_past_each_request():
    inputs = build_inputs(small_case(batch_size=3, context_len="list:0,16,40", page_size=16))
    k, v = fa4_finite_tails(inputs)
    _, _, ss = inputs.host_lists()
    table = inputs.block_table.tolist()
    for b, s in enumerate(ss):
        pages = table[b][: -(-s // 16)]
        got = k[pages].reshape(-1, *k.shape[2:])
        want = inputs.k_cache[pages].reshape(-1, *k.shape[2:])
        assert torch.equal(got[:s], want[:s]) and not got[s:].any(), b
        assert torch.equal(v[pages].reshape(-1, *v.shape[2:])[:s], inputs.v_cache[pages].reshape(-1, *v.shape[2:])[:s])
    used = {p for b, s in enumerate(ss) for p in table[b][: -(-s // 16)]}
    free = [p for p in range(k.shape[0]) if p not in used]
    assert free and k[free].isnan().all() and v[free].isnan().all()


def test_workspace_is_the_pool_copy_on_the_tma_path_only():
    case = small_case(page_size=128, head_dim=64)
    inputs = build_inputs(case)
    assert FA4Tree().workspace_bytes(case) == pool_bytes(case) == 2 * inputs.k_cache.nbytes
    assert FA4Tree().workspace_bytes(small_case(page_size=16, head_dim=64)) == 0


def test_the_mask_mod_signature_is_read_from_the_mask_module(tmp_path, monkeypatch):
    """4.0.0b36's mask.py has call_mask_mod (six arguments with seqlen_info); an older one
    that never names seqlen_info gets the five-argument mask_mod."""
    assert mask_mod_takes_seqlen_info(SimpleNamespace(call_mask_mod=lambda *a: None))
    old = tmp_path / "old_fa4_mask.py"
    old.write_text("def apply_mask(mask_mod, b, h, q, kv, aux_tensors):\n"
                   "    return mask_mod(b, h, q, kv, aux_tensors)\n")
    new = tmp_path / "new_fa4_mask.py"
    new.write_text("def apply(mask_mod, b, h, q, kv, seqlen_info, aux):\n"
                   "    return mask_mod(b, h, q, kv, seqlen_info, aux)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import new_fa4_mask
    import old_fa4_mask
    assert not mask_mod_takes_seqlen_info(old_fa4_mask)
    assert mask_mod_takes_seqlen_info(new_fa4_mask)


def test_a_five_argument_mask_mod_is_refused_by_the_fake(fake_fa4, monkeypatch):
    """The fake calls mask_mod as 4.0.0b36 does: one built for the older signature fails."""
    monkeypatch.setattr(FA4Tree, "_api", staticmethod(lambda: SimpleNamespace(
        varlen=fake_varlen, mask_mod=lambda: (lambda b, h, m, n, aux: tree_visible(aux, b, m, n)))))
    with pytest.raises(TypeError):
        FA4Tree().prepare(build_inputs(small_case()))


def test_flex_fa4_compiles_static_and_flex_symbolic(monkeypatch):
    """torch's FLASH lowering refuses a mask_mod that captures a SymInt, which dynamic=True makes
    of the tree mask_mod's captured int: flex_fa4 compiles statically, flex keeps symbolic shapes,
    each from its own compiled callable."""
    import treebench.backends.flex as flex_mod

    compiled = []
    monkeypatch.setattr(torch, "compile", lambda fn, dynamic=None: compiled.append(dynamic) or (lambda: dynamic))
    monkeypatch.setattr(flex_mod, "_COMPILED", {})
    monkeypatch.setattr(flex_mod, "_PREPARED", [0])
    saved = torch._dynamo.config.recompile_limit   # restored by hand, as tests/test_peer_adapters.py does
    try:
        cuda = torch.device("cuda")
        assert flex_mod._flex_for(cuda, flex_mod.FlexFa4.dynamic)() is False
        assert flex_mod._flex_for(cuda, flex_mod.FlexTree.dynamic)() is True
        assert flex_mod._flex_for(cuda, False)() is False and compiled == [False, True]
    finally:
        torch._dynamo.config.recompile_limit = saved


def _probe():
    """lab/fa4_probe.py imported as a module (lab/ is not a package)."""
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parents[1] / "lab" / "fa4_probe.py"
    spec = importlib.util.spec_from_file_location("fa4_probe", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(torch.cuda.is_available(), reason="the no-GPU refusal")
def test_the_probe_refuses_without_a_gpu(capsys):
    assert _probe().main() == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "CUDA GPU" in err[0]


def test_the_probe_tells_the_nan_tail_from_a_right_answer(capsys):
    """Through the fake: the TMA path with the NaN pool prints a non-finite output and a failing
    compare beside a passing LSE; with zeroed tails, and page by page, both pass."""
    probe = _probe()
    axes = {"batch_size": 2, "context_len": 20, "tree": "full:2:1", "num_q_heads": 4, "num_kv_heads": 2,
            "head_dim": 16, "dtype": "float32", "layout": "shuffled"}
    for p, causal, zero in [(128, True, False), (128, False, True), (16, False, False)]:
        probe.step(fake_varlen, lambda: tree_mask_mod, f"P{p}", build_inputs(Case(**axes, page_size=p)), causal, zero)
    nan_tail, zeroed, paged = capsys.readouterr().out.strip().splitlines()
    assert "tma" in nan_tail and "out FAIL, lse pass" in nan_tail and "non-finite 0/" not in nan_tail
    assert "tma" in zeroed and "out pass, lse pass" in zeroed and "non-finite 0/" in zeroed
    assert "paged" in paged and "out pass, lse pass" in paged
