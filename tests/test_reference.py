"""The reference against an independent oracle, and the paged-KV builder's invariants."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from treebench.harness.model.cases import Case
from treebench.harness.model.paged import build_inputs
from treebench.harness.model.reference import reference_attention


def path_unrolled_oracle(inputs) -> torch.Tensor:
    """Second oracle (the method of vLLM's and xformers' tree tests): every
    root-to-node path becomes an ordinary sequence (context, then the path's
    nodes); the node's query attends to all of it with no mask at all.

    Returns (sum T_b, Hq, D) float64.
    """
    G = inputs.case.group_size
    ls, ts, ss = inputs.host_lists()
    qo = inputs.qo_indptr.tolist()
    out = torch.empty(inputs.q.shape, dtype=torch.float64)
    for b, tree in enumerate(inputs.trees):
        s0 = int(inputs.kv_indptr[b])
        k_all = inputs.k_logical[s0:s0 + ss[b]].double()
        v_all = inputs.v_logical[s0:s0 + ss[b]].double()
        for i in range(tree.size):
            path, j = [], i
            while j >= 0:
                path.append(j)
                j = tree.parents[j]
            idx = list(range(ls[b])) + [ls[b] + n for n in reversed(path)]
            k = k_all[idx].repeat_interleave(G, dim=1)          # (len, Hq, D)
            v = v_all[idx].repeat_interleave(G, dim=1)
            q = inputs.q[qo[b] + i].double()                    # (Hq, D)
            p = torch.softmax(torch.einsum("hd,shd->hs", q, k) * inputs.sm_scale, dim=-1)
            out[qo[b] + i] = torch.einsum("hs,shd->hd", p, v)
    return out


CASES = [
    dict(batch_size=1, context_len=0, tree="full:2:2"),
    dict(batch_size=2, context_len=37, tree="parents:-1,0,0,1,1,2,5"),
    dict(batch_size=3, context_len="ragged:0-50", tree="full:3:2", tree_per_request="mixed"),
    dict(batch_size=2, context_len=16, tree="chain:5", num_q_heads=6, num_kv_heads=3),
    dict(batch_size=2, context_len=9, tree="full:2:2", sm_scale=0.3),
]


@pytest.mark.parametrize("kw", CASES)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_reference_matches_path_unrolled_oracle(kw, dtype):
    kw = {"num_q_heads": 4, "num_kv_heads": 2, "head_dim": 16, "page_size": 16, **kw}
    inputs = build_inputs(Case(dtype=dtype, **kw))
    ref = reference_attention(inputs)
    oracle = path_unrolled_oracle(inputs)
    torch.testing.assert_close(ref, oracle, rtol=1e-10, atol=1e-10)


def test_reference_lse_is_logsumexp_of_scaled_scores():
    inputs = build_inputs(Case(batch_size=1, context_len=5, tree="chain:0", num_q_heads=1,
                               num_kv_heads=1, head_dim=8, page_size=16, dtype="float32"))
    _, lse = reference_attention(inputs, return_lse=True)
    q, k = inputs.q[0, 0].double(), inputs.k_logical[:, 0].double()   # (D,), (S, D)
    expect = torch.logsumexp(k @ q * inputs.sm_scale, dim=0)
    torch.testing.assert_close(lse[0, 0], expect)


def test_the_case_sm_scale_is_the_inputs_and_the_references_scale():
    """build_inputs hands case.sm_scale to inputs.sm_scale (default 1/sqrt(D)), with the twin's Q/K/V."""
    kw = dict(batch_size=2, context_len=9, tree="full:2:2", num_q_heads=4, num_kv_heads=2, head_dim=16,
              dtype="float32")
    scaled, plain = build_inputs(Case(sm_scale=0.3, **kw)), build_inputs(Case(**kw))
    assert scaled.sm_scale == 0.3 and plain.sm_scale == 0.25
    assert torch.equal(scaled.q, plain.q) and torch.equal(scaled.k_logical, plain.k_logical)
    ref = reference_attention(scaled)
    torch.testing.assert_close(ref, path_unrolled_oracle(scaled), rtol=1e-10, atol=1e-10)
    assert (ref - reference_attention(plain)).abs().max() > 0.05


@pytest.mark.parametrize("tree_per_request", ["same", "mixed"])
@pytest.mark.parametrize("page_size", [16, 32])
def test_layout_invariance(tree_per_request, page_size):
    """The same logical case through all three layouts gives the same reference
    output, and gathering the pool through each block table gives back the logical K/V."""
    base = Case(batch_size=4, context_len="ragged:1-70", tree="full:2:2", num_q_heads=4, num_kv_heads=2,
                head_dim=16, page_size=page_size, tree_per_request=tree_per_request, dtype="float16")
    refs = []
    for layout in ("contiguous", "shuffled", "interleaved"):
        inputs = build_inputs(dataclasses.replace(base, layout=layout))
        refs.append(reference_attention(inputs))
        _, _, ss = inputs.host_lists()
        for b, s in enumerate(ss):
            pos = torch.arange(s)
            pages = inputs.block_table[b].long()[pos // page_size]
            s0 = int(inputs.kv_indptr[b])
            assert torch.equal(inputs.k_cache[pages, pos % page_size], inputs.k_logical[s0:s0 + s])
            assert torch.equal(inputs.v_cache[pages, pos % page_size], inputs.v_logical[s0:s0 + s])
    assert torch.equal(refs[0], refs[1]) and torch.equal(refs[0], refs[2])


def _used_pages(inputs):
    ls, ts, ss = inputs.host_lists()
    P = inputs.page_size
    return [inputs.block_table[b, :-(-s // P)].tolist() for b, s in enumerate(ss)]


def test_layouts_differ_and_pages_are_disjoint():
    base = Case(batch_size=3, context_len=40, tree="full:2:1", num_q_heads=2, num_kv_heads=1,
                head_dim=8, page_size=16, dtype="float32")
    tables = {}
    for layout in ("contiguous", "shuffled", "interleaved"):
        used = _used_pages(build_inputs(dataclasses.replace(base, layout=layout)))
        flat = [p for row in used for p in row]
        assert len(flat) == len(set(flat)), "a physical page is shared by two logical pages"
        tables[layout] = used
    assert tables["contiguous"] == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    assert tables["interleaved"] == [[0, 3, 6], [1, 4, 7], [2, 5, 8]]
    assert tables["shuffled"] not in (tables["contiguous"], tables["interleaved"])


def test_unused_slots_are_nan_and_padding_points_at_a_nan_page():
    inputs = build_inputs(Case(batch_size=3, context_len="ragged:3-40", tree="full:2:2", num_q_heads=2,
                               num_kv_heads=1, head_dim=8, page_size=16, dtype="bfloat16"))
    P = inputs.page_size
    written = torch.zeros(inputs.k_cache.shape[:2], dtype=torch.bool)    # (N, P)
    _, _, ss = inputs.host_lists()
    for b, s in enumerate(ss):
        pos = torch.arange(s)
        written[inputs.block_table[b].long()[pos // P], pos % P] = True
    assert torch.isnan(inputs.k_cache[~written]).all() and torch.isnan(inputs.v_cache[~written]).all()
    assert not torch.isnan(inputs.k_cache[written]).any()
    for b, s in enumerate(ss):
        for page in inputs.block_table[b, -(-s // P):].tolist():
            assert torch.isnan(inputs.k_cache[page]).all()
    assert inputs.k_cache.shape[0] > sum(-(-s // P) for s in ss), "pool must be larger than needed"


def test_inputs_are_deterministic_per_case_and_differ_across_seeds():
    c = Case(batch_size=2, context_len="ragged:1-30", tree="full:2:1", num_q_heads=2, num_kv_heads=1,
             head_dim=8, page_size=16, tree_per_request="mixed", dtype="float32")
    a, b = build_inputs(c), build_inputs(c)
    assert torch.equal(a.q, b.q) and torch.equal(a.block_table, b.block_table)
    assert a.context_lens.tolist() == b.context_lens.tolist()
    d = build_inputs(dataclasses.replace(c, seed=1))
    assert not torch.equal(a.q[:1], d.q[:1])


def test_causal_view_replaces_trees_by_chains():
    inputs = build_inputs(Case(batch_size=2, context_len=4, tree="full:2:2", num_q_heads=2, num_kv_heads=1,
                               head_dim=8, page_size=16, dtype="float32"))
    c = inputs.causal()
    assert [t.size for t in c.trees] == [t.size for t in inputs.trees]
    assert all(torch.equal(t.ancestor_mask, torch.ones(7, 7, dtype=torch.bool).tril()) for t in c.trees)
