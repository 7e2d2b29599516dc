"""treebench's Triton tree-attention kernel and its three backends.

On a machine without CUDA the kernel tests run under Triton's CPU interpreter
(TRITON_INTERPRET=1, set below before Triton is imported); tiny cases only, a
few seconds in all. The `gpu` tests run the kernel compiled on a CUDA GPU.
"""

from __future__ import annotations


import pytest
import torch

from tests.kernel_device import DEVICE, TINY, triton  # noqa: E402,F401  (sets TRITON_INTERPRET first)
from tests.kernel_device import assert_graph_replays  # noqa: E402
from tests.kernel_device import run_checked as check  # noqa: E402
from treebench.harness.model.cases import Case  # noqa: E402
from treebench.harness.model.compare import compare, compare_lse  # noqa: E402
from treebench.harness.errors import ConfigError  # noqa: E402
from treebench.harness.model.paged import build_inputs  # noqa: E402
from treebench.harness.model.reference import reference_attention  # noqa: E402
from treebench.harness.model.tree_specs import parse_tree  # noqa: E402
from treebench.kernels.options import KernelOptions  # noqa: E402
from treebench.kernels.tree_attention_plan import (KernelConfig, choose_num_splits, make_plan,  # noqa: E402
                                         pack_tree_masks, tree_bias)

from treebench.kernels.tree_attention import TreeAttention  # noqa: E402





# ---- mask packing and planning (no kernel) -------------------------------------------


@pytest.mark.parametrize("spec", ["full:3:0", "full:2:2", "random:63:1", "random:64:2", "random:150:3"])
def test_pack_tree_masks_round_trips_the_ancestor_mask(spec):
    trees = [parse_tree(spec), parse_tree("chain:5")]
    words = pack_tree_masks(trees)                            # (sum T, W) int64
    width = words.shape[1]
    assert width == -(-max(t.size for t in trees) // 64)
    row = 0
    for tree in trees:
        for i in range(tree.size):
            bits = [(int(words[row, j // 64]) >> (j % 64)) & 1 for j in range(width * 64)]
            expect = tree.ancestor_mask[i].tolist() + [False] * (width * 64 - tree.size)
            assert bits == [int(x) for x in expect]
            row += 1


def test_tree_bias_is_zero_on_ancestors_and_rejects_mixed_trees():
    tree = parse_tree("full:2:2")
    bias = tree_bias([tree, tree])
    assert torch.equal(bias == 0, tree.ancestor_mask)
    assert torch.isinf(bias[~tree.ancestor_mask]).all()
    with pytest.raises(ConfigError, match="tree_per_request"):
        tree_bias([tree, parse_tree("chain:6")])


@pytest.mark.parametrize("programs,tiles,block_m,expect", [
    (512, [33], 16, 1),        # B 64: the grid already fills 132 SMs three times
    (128, [33], 16, 4),        # B 16, memory-bound tiles: ~3 programs per SM
    (8, [33], 16, 24),         # B 1: down to one KV tile per split, at most 24 splits
    (8, [17], 16, 17),         # B 1, L 1024: one tile per split
    (16, [33], 64, 8),         # B 1, tensor-core-bound tiles read by TMA: at most 8 splits
    (16, [17], 64, 5),         # B 1, L 1024: capped at 3 KV tiles per split
    (32, [33], 64, 8),         # B 1, 4 M-tiles: one wave at 2 programs per SM
    (128, [33], 64, 1),        # B 16, TMA tiles: 128 programs fill 0.9 of 132 SMs, no split-KV
    (118, [33], 64, 2),        # under 0.9 of the SMs: one wave at 2 programs per SM
    (8, [1], 16, 1),           # one tile: nothing to split
])
def test_choose_num_splits(programs, tiles, block_m, expect):
    assert choose_num_splits(programs, tiles, 132, block_m, tma_tiles=True) == expect


def test_make_plan_tiles_rows_and_rejects_bad_splits():
    plan = make_plan(2, 8, 4, [40, 13], [2088, 30], 128, num_sms=132, interpret=False)
    assert plan.m_tiles == -(-4 * 40 // plan.config.block_m)
    assert plan.num_programs == 2 * 8 * plan.m_tiles * plan.num_splits
    with pytest.raises(ConfigError, match="num_splits"):
        make_plan(1, 1, 1, [3], [5], 64, num_sms=1, interpret=True, num_splits=0)
    with pytest.raises(ConfigError, match="block_n"):
        KernelConfig(16, 24, 4, 2)


# ---- the kernel ------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("page_size,tree", [(16, "full:2:2"), (32, "full:3:2")])   # G * T = 14 and 26 rows
def test_kernel_ragged_contexts_mixed_trees(dtype, page_size, tree):
    """B 3, L_b drawn in [0, 40], per-request random trees (one or two M-tiles of 16 rows)."""
    case = Case(batch_size=3, context_len="ragged:0-40", tree=tree, tree_per_request="mixed",
                page_size=page_size, dtype=dtype, **TINY)
    check(case)


def test_kernel_zero_context():
    """L_b = 0: only the tree's own K/V; with split-KV some splits see nothing of a row."""
    case = Case(batch_size=2, context_len=0, tree="full:2:2", tree_per_request="mixed", page_size=16, **TINY)
    check(case, num_splits=2)


@pytest.mark.parametrize("splits,fused", [(1, True), (3, True), (3, False)])
def test_kernel_split_kv_on_and_off(splits, fused):
    """S_b = 25 + 7 = 32, an exact multiple of P = 16: the block-table entry after the
    last page points at a NaN page; splits merge in the kernel or in a second one."""
    case = Case(batch_size=2, context_len=25, tree="full:2:2", page_size=16, **TINY)
    ta = check(case, num_splits=splits, fused_merge=fused)
    assert ta.plan.num_splits == splits
    assert len(ta._launches) == (2 if splits > 1 and not fused else 1)


@pytest.mark.parametrize("tree,context,config", [
    ("random:70:4", 5, KernelConfig(32, 64, 1, 1)),
    ("random:150:3", "ragged:0-70", KernelConfig(16, 128, 1, 1)),    # two 64-column windows per tile
    ("random:150:3", "ragged:0-70", KernelConfig(16, 32, 1, 1)),     # a window's low half only
    ("random:130:5", 64, KernelConfig(16, 64, 1, 1))])               # tiles aligned to the mask words
def test_kernel_tree_wider_than_one_mask_word(tree, context, config):
    """T = 71 to 151 > 64: two or three int64 words per node (bit 63 is the sign bit); each
    tile's 64-column windows straddle two words wherever L_b is not a multiple of 64."""
    case = Case(batch_size=2, context_len=context, tree=tree, tree_per_request="mixed", page_size=16,
                num_q_heads=2, num_kv_heads=2, head_dim=32)
    check(case, config=config)


@pytest.mark.parametrize("mode", ["bias", "causal"])
def test_kernel_bias_and_causal_modes(mode):
    case = Case(batch_size=2, context_len=19, tree="full:2:2", page_size=16, **TINY)
    check(case, mode, num_splits=2)


def test_kernel_gqa_group_of_eight_with_one_kv_head():
    case = Case(batch_size=2, context_len=32, tree="full:2:1", page_size=32, num_q_heads=8, num_kv_heads=1,
                head_dim=32, dtype="float16")
    check(case, config=KernelConfig(16, 32, 1, 1))


def test_kernel_rejects_unsupported_inputs():
    case = Case(batch_size=1, context_len=4, tree="chain:2", page_size=16, dtype="float32", **TINY)
    with pytest.raises(ConfigError, match="dtype"):
        TreeAttention(build_inputs(case, DEVICE))
    case = Case(batch_size=1, context_len=4, tree="chain:2", page_size=16, num_q_heads=2, num_kv_heads=1,
                head_dim=48)
    with pytest.raises(ConfigError, match="head dim"):
        TreeAttention(build_inputs(case, DEVICE))
    mixed = Case(batch_size=2, context_len=4, tree="full:2:1", tree_per_request="mixed", page_size=16, **TINY)
    with pytest.raises(ConfigError, match="tree_per_request"):
        TreeAttention(build_inputs(mixed, DEVICE), "bias")


# ---- the backends ----------------------------------------------------------------------


def test_backends_register_and_declare_their_modes():
    from treebench.backends.triton_causal import TritonCausalBackend
    from treebench.backends.triton_tree import TritonTreeBackend
    from treebench.backends.triton_tree_bias import TritonTreeBiasBackend

    assert (TritonTreeBackend.name, TritonTreeBackend.mask_kind) == ("triton_tree", "tree")
    assert TritonCausalBackend.mask_kind == "causal"
    mixed = Case(batch_size=2, context_len=4, tree="full:2:1", tree_per_request="mixed", page_size=16, **TINY)
    assert TritonTreeBiasBackend().supports(mixed) is not None
    assert TritonTreeBackend().supports(mixed) is None
    assert TritonTreeBackend().supports(Case(batch_size=1, context_len=4, tree="chain:1", page_size=24)) \
        is None                                               # any P (tiles that span pages gather)
    assert TritonTreeBackend().availability() is None


def test_backend_prepare_returns_a_callable_with_the_output():
    from treebench.backends.triton_tree import TritonTreeBackend

    case = Case(batch_size=2, context_len="ragged:0-20", tree="full:2:1", page_size=16, **TINY)
    inputs = build_inputs(case, DEVICE)
    fn = TritonTreeBackend().prepare(inputs)
    out, lse = fn()
    assert out.shape == inputs.q.shape and out.dtype == inputs.dtype and lse.shape == inputs.q.shape[:2]
    ref, ref_lse = reference_attention(inputs, return_lse=True)
    assert compare(out, ref, inputs.qo_indptr, case.dtype).passed
    assert compare_lse(lse, ref_lse, inputs.qo_indptr, case.dtype).passed


def test_availability_reasons(monkeypatch):
    import importlib.util

    from treebench.backends.triton_tree import triton_availability

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    assert triton_availability() == ("triton not installed: pip install -e '.[triton]' from the treebench checkout "
                                     "(Triton 3.6 to 3.9)")
    monkeypatch.undo()
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert triton_availability() == "needs a CUDA GPU (or TRITON_INTERPRET=1 for the CPU interpreter)"


# ---- GPU only --------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("splits", [1, 4])
def test_callable_replays_from_a_cuda_graph(splits):
    case = Case(batch_size=3, context_len="ragged:0-300", tree="full:3:2", tree_per_request="mixed",
                page_size=16, num_q_heads=8, num_kv_heads=2, head_dim=128)
    inputs = build_inputs(case, "cuda")
    ta = TreeAttention(inputs, num_splits=splits)
    assert_graph_replays(ta, ta().clone(), replays=3)      # the split counters reset every launch


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("page_size", [16, 48, 128, 256])
@pytest.mark.parametrize("head_dim,gqa", [(64, (8, 8)), (128, (32, 8)), (256, (16, 2))])
def test_kernel_on_gpu(page_size, head_dim, gqa):
    case = Case(batch_size=5, context_len="ragged:0-900", tree="random:40:3", tree_per_request="mixed",
                page_size=page_size, num_q_heads=gqa[0], num_kv_heads=gqa[1], head_dim=head_dim)
    check(case)


@pytest.mark.parametrize("merge_rows", [1, 4, 8])
def test_merge_kernel_rows_per_program(merge_rows):
    """The split-KV merge with several (token, head) rows per program: rows past the
    end (sum T * Hq not a multiple of merge_rows) are masked, results unchanged."""
    case = Case(batch_size=3, context_len="ragged:0-40", tree="full:2:1", tree_per_request="mixed",
                page_size=16, **TINY)
    ta = check(case, num_splits=3, merge_rows=merge_rows)
    assert ta._launches[1].grid[0] == -(-ta.out.shape[0] * ta.out.shape[1] // merge_rows)
    with pytest.raises(ConfigError, match="merge_rows"):
        TreeAttention(build_inputs(case, DEVICE), num_splits=3, merge_rows=3)


# ---- TMA descriptor loads of the context tiles -----------------------------------------


@pytest.mark.parametrize("bt_ahead", [0, 1])
@pytest.mark.parametrize("splits", [1, 4])
def test_kernel_tma_loads_match_pointer_loads(bt_ahead, splits):
    """kv_desc on and off give the same output (bit for bit: the same tiles in the same
    order), with the block table read in the tile's iteration or one tile ahead, with
    and without split-KV (a split's look-ahead must not read past its tiles).
    P 32 with 16-token tiles: two tiles per page."""
    case = Case(batch_size=3, context_len="ragged:0-90", tree="full:2:2", tree_per_request="mixed",
                page_size=32, **TINY)
    cfg = KernelConfig(16, 16, 1, 1, bt_ahead=bt_ahead)
    on = check(case, config=cfg, num_splits=splits, options=KernelOptions(kv_desc=True))
    assert on.kv_desc
    off = check(case, config=cfg, num_splits=splits, options=KernelOptions(kv_desc=False))
    assert not off.kv_desc
    torch.testing.assert_close(on.out, off.out, rtol=0, atol=0)


@pytest.mark.parametrize("page_size,block_n", [(16, 32), (32, 16)])   # a tile spans 2 pages / lies in one
@pytest.mark.parametrize("splits", [1, 4])
def test_kernel_pointer_loads_with_block_table_ahead(page_size, block_n, splits):
    """The pointer-load paths (kv_desc off) with the block table read one tile ahead
    (bt_ahead 1) give the same output as reading it in the tile's own iteration, bit for
    bit: the gather path (P 16, 32-token tiles: a page lookup per token) and the one-page
    tiles, with and without split-KV and with ragged contexts (some splits see nothing)."""
    case = Case(batch_size=3, context_len="ragged:0-90", tree="full:2:2", tree_per_request="mixed",
                page_size=page_size, **TINY)
    outs = [check(case, config=KernelConfig(16, block_n, 1, 1, bt_ahead=a), num_splits=splits,
                  options=KernelOptions(kv_desc=False)).out for a in (0, 1)]
    torch.testing.assert_close(outs[1], outs[0], rtol=0, atol=0)


@pytest.mark.skipif(DEVICE == "cuda", reason="the refusal is for a machine without a CUDA GPU")
def test_pdl_is_refused_without_a_gpu():
    """pdl=True under the interpreter names why; the default quietly uses two ordinary launches."""
    from treebench.kernels.tree_attention import pdl_unsupported
    case = Case(batch_size=2, context_len=25, tree="full:2:2", page_size=16, **TINY)
    inputs = build_inputs(case, DEVICE)
    assert "CUDA GPU" in pdl_unsupported(inputs.device)
    with pytest.raises(ConfigError, match="pdl: programmatic dependent launch needs a CUDA GPU"):
        TreeAttention(inputs, num_splits=3, options=KernelOptions(pdl=True))
    ta = TreeAttention(inputs, num_splits=3)
    assert not ta.pdl and len(ta._launches) == 2


@pytest.mark.gpu
@pytest.mark.skipif(DEVICE != "cuda", reason="needs a CUDA GPU")
@pytest.mark.parametrize("page_size", [16, 128])
def test_pdl_merge_matches_ordinary_launches_and_replays(page_size):
    """The merge kernel as a programmatic dependent launch gives the same output as two
    ordinary launches, bit for bit, eagerly and replayed from a CUDA graph (B 1, L 2048:
    8 or more splits)."""
    from treebench.kernels.tree_attention import pdl_unsupported
    case = Case(batch_size=1, context_len=2048, tree="vllm:pr_27", page_size=page_size, num_q_heads=32,
                num_kv_heads=8, head_dim=128)
    inputs = build_inputs(case, DEVICE)
    if pdl_unsupported(inputs.device):
        pytest.skip(pdl_unsupported(inputs.device))
    on, off = check(case, options=KernelOptions(pdl=True)), check(case, options=KernelOptions(pdl=False))
    assert on.pdl and not off.pdl and on.plan.num_splits > 1
    expect = off().clone()
    torch.testing.assert_close(on().clone(), expect, rtol=0, atol=0)
    assert_graph_replays(on, expect)


@pytest.mark.parametrize("kw, needle", [
    (dict(num_splits=2.5), "num_splits=2.5"), (dict(num_splits="3"), "num_splits='3'"),
    (dict(num_splits=True), "num_splits=True"), (dict(num_splits=65), "num_splits=65"),
    (dict(num_splits=0), "num_splits=0"), (dict(merge_rows=2.0), "merge_rows=2.0"),
    (dict(merge_rows=True), "merge_rows=True"), (dict(merge_rows=3), "merge_rows=3"),
    (dict(merge_rows=32), "merge_rows=32"),
])
def test_tree_attention_refuses_non_integer_plan_overrides(kw, needle):
    """num_splits and merge_rows take integers in range (Python or numpy) (a new-user pass got raw
    TypeErrors from torch and Triton for 2.5, "3" and True, and 1000 splits accepted)."""
    case = Case(batch_size=2, context_len=25, tree="full:2:2", page_size=16, **TINY)
    with pytest.raises(ConfigError, match=needle.replace("(", r"\(")):
        TreeAttention(build_inputs(case, DEVICE), **kw)


def test_numpy_integers_are_taken_as_integers():
    """A config or split count read from numpy (a sweep over np.arange) is an integer too."""
    import numpy as np
    cfg = KernelConfig(np.int64(16), np.int32(16), np.int64(1), np.int64(1), bt_ahead=np.int64(1))
    assert cfg == KernelConfig(16, 16, 1, 1, bt_ahead=1) and type(cfg.block_m) is int
    case = Case(batch_size=2, context_len=25, tree="full:2:2", page_size=16, **TINY)
    ta = check(case, config=cfg, num_splits=np.int64(3), merge_rows=np.int64(2))
    assert ta.plan.num_splits == 3 and type(ta.plan.num_splits) is int and ta.merge_rows == 2
    with pytest.raises(ConfigError, match="num_splits"):
        TreeAttention(build_inputs(case, DEVICE), num_splits=np.bool_(True))


def test_make_plan_tiles_per_split_from_the_longest_request():
    """Split s covers tiles [s * tiles_per_split, (s + 1) * tiles_per_split) of every
    request, sized by the longest: ceil(ceil(max S_b / BLOCK_N) / num_splits)."""
    cfg = KernelConfig(64, 64, 4, 3)
    plan = make_plan(2, 8, 4, [28, 28], [2076, 100], 128, num_sms=132, interpret=False, config=cfg, num_splits=8)
    assert plan.tiles_per_split == -(-(-(-2076 // 64)) // 8) == 5
    assert make_plan(1, 8, 4, [28], [2076], 128, num_sms=132, interpret=False, config=cfg,
                     num_splits=1).tiles_per_split == 33


def test_kv_desc_is_refused_where_tiles_straddle_pages():
    """P 16 with 32-token tiles: a tile spans two pages, so no TMA box; the default
    falls back to pointer loads, and asking for descriptors is a ConfigError naming why."""
    case = Case(batch_size=2, context_len=40, tree="full:2:1", page_size=16, **TINY)
    cfg = KernelConfig(16, 32, 1, 1)
    assert not check(case, config=cfg).kv_desc
    with pytest.raises(ConfigError, match="page size 16 is not a multiple of BLOCK_N 32"):
        TreeAttention(build_inputs(case, DEVICE), config=cfg, options=KernelOptions(kv_desc=True))


def test_kv_desc_unsupported_names_non_contiguous_pools():
    from treebench.kernels.tree_attention import kv_desc_unsupported

    inputs = build_inputs(Case(batch_size=1, context_len=20, tree="chain:2", page_size=16, **TINY), DEVICE)
    assert kv_desc_unsupported(inputs, 16) == ""
    strided = inputs.k_cache.transpose(1, 2).contiguous().transpose(1, 2)     # (N, P, Hkv, D), HND memory
    inputs.k_cache = strided
    assert "not contiguous" in kv_desc_unsupported(inputs, 16)


def test_kernel_config_rejects_bt_ahead_out_of_range():
    with pytest.raises(ConfigError, match="bt_ahead"):
        KernelConfig(64, 64, 4, 3, bt_ahead=2)


def test_choose_num_splits_caps_only_tma_tiles():
    """P 16 with 64-token tiles (a page lookup per token, no TMA), or TMA off: the
    8-split cap and the 0.9-full rule, measured for the TMA path, do not apply; 3 KV tiles
    per split does."""
    assert choose_num_splits(16, [33], 132, 64, tma_tiles=True) == 8
    assert choose_num_splits(16, [33], 132, 64, tma_tiles=False) == 11
    assert choose_num_splits(128, [33], 132, 64, tma_tiles=False) == 2    # the gather keeps its 2 splits
    plan = dict(num_sms=132, interpret=False)
    assert make_plan(1, 8, 4, [28], [2076], 128, tma_tiles=True, **plan).num_splits == 8
    assert make_plan(1, 8, 4, [28], [2076], 128, tma_tiles=False, **plan).num_splits == 11


def test_tree_attention_plans_splits_from_the_tma_decision(monkeypatch):
    """TreeAttention decides kv_desc before planning, and plans the split cap from it."""
    import treebench.kernels.tree_attention as kt

    seen = []
    real = kt.make_plan
    monkeypatch.setattr(kt, "make_plan", lambda *a, **kw: seen.append(kw["tma_tiles"]) or real(*a, **kw))
    case = Case(batch_size=1, context_len=20, tree="chain:2", page_size=16, **TINY)
    inputs = build_inputs(case, DEVICE)
    for kv_desc in (True, False):
        ta = TreeAttention(inputs, options=KernelOptions(kv_desc=kv_desc), config=KernelConfig(16, 16, 1, 1))
        assert ta.kv_desc is kv_desc
    assert seen == [True, False]


def _launch_specs(ta: TreeAttention) -> list[tuple]:
    """Each launch's kernel, grid, constexprs and launch options (what the options decide)."""
    return [(fl.kernel, fl.grid, fl.consts, fl.options) for fl in ta._launches]


def test_tree_attention_objects_with_different_options_are_independent():
    """Two launch objects prepared in one process with different KernelOptions keep their
    own: building the second changes nothing in the first (its launches, its output), and
    the default options give the launches of no options at all."""
    case = Case(batch_size=2, context_len="ragged:10-60", tree="full:2:2", tree_per_request="mixed",
                page_size=16, **TINY)
    inputs = build_inputs(case, DEVICE)
    cfg = KernelConfig(16, 16, 1, 1)
    off = TreeAttention(inputs, config=cfg, num_splits=3, options=KernelOptions(kv_desc=False))
    off_specs, off_out = _launch_specs(off), off().clone()
    on = TreeAttention(inputs, config=cfg, num_splits=3)
    assert not off.kv_desc and on.kv_desc
    assert off.options == KernelOptions(kv_desc=False) and on.options == KernelOptions()
    assert [c["KV_DESC"] for _, _, c, _ in _launch_specs(off)[:1]] == [False]
    assert [c["KV_DESC"] for _, _, c, _ in _launch_specs(on)[:1]] == [True]
    assert _launch_specs(off) == off_specs                                 # untouched by the second
    torch.testing.assert_close(off().clone(), off_out, rtol=0, atol=0)
    torch.testing.assert_close(on().clone(), off_out, rtol=0, atol=0)   # same tiles, same order
    default = TreeAttention(inputs, config=cfg, num_splits=3, options=KernelOptions())
    assert _launch_specs(default) == _launch_specs(on)


def test_tree_attention_module_has_no_global_knobs():
    """The launch choices live in KernelOptions only: no module-level switch to mutate."""
    import treebench.kernels.tree_attention as kta
    assert not [n for n in ("USE_KV_DESC", "WS_PIPE", "WS_PERSIST", "USE_PDL") if hasattr(kta, n)]


@pytest.mark.parametrize("kw, needle", [
    (dict(kv_desc="yes"), "kv_desc='yes': must be None"), (dict(kv_desc=1), "kv_desc=1: must be None"),
    (dict(ws_pipe=0), "ws_pipe=0: must be None"), (dict(pdl="auto"), "pdl='auto': must be None"),
    (dict(ws_persist=None), "ws_persist=None: must be True or False"),
    (dict(ws_persist=1), "ws_persist=1: must be True or False"),
    (dict(ws3_pipe_min_tiles=0), "ws3_pipe_min_tiles=0: must be a positive integer"),
    (dict(ws3_pipe_min_tiles=32.0), "ws3_pipe_min_tiles=32.0: must be a positive integer"),
    (dict(ws3_pipe_min_tiles=True), "ws3_pipe_min_tiles=True: must be a positive integer"),
    (dict(ws_fp8_fences=0), "ws_fp8_fences=0: must be 1, 2 or 3"),
    (dict(ws_fp8_fences=4), "ws_fp8_fences=4: must be 1, 2 or 3"),
    (dict(ws_fp8_fences=True), "ws_fp8_fences=True: must be 1, 2 or 3"),
    (dict(ws_fp8_fences="1"), "ws_fp8_fences='1': must be 1, 2 or 3"),
])
def test_kernel_options_reject_wrong_types(kw, needle):
    with pytest.raises(ConfigError, match=needle.replace("(", r"\(")):
        KernelOptions(**kw)


def test_kernel_options_are_frozen_and_checked_where_taken():
    """Options cannot be changed after construction; TreeAttention and the backends refuse
    anything that is not a KernelOptions; a backend passes its options to the kernel."""
    import dataclasses

    from treebench.backends.triton_causal import TritonCausalBackend
    from treebench.backends.triton_tree import TritonTreeBackend
    from treebench.backends.triton_tree_bias import TritonTreeBiasBackend
    opts = KernelOptions(ws_pipe=False)
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.ws_pipe = True   # type: ignore[misc]
    assert opts.changed() == {"ws_pipe": False} and KernelOptions().changed() == {}
    inputs = build_inputs(Case(batch_size=1, context_len=20, tree="chain:2", page_size=16, **TINY), DEVICE)
    with pytest.raises(ConfigError, match="options=.*must be a KernelOptions"):
        TreeAttention(inputs, options={"kv_desc": False})
    for cls in (TritonTreeBackend, TritonTreeBiasBackend, TritonCausalBackend):
        with pytest.raises(ConfigError, match="must be a KernelOptions"):
            cls(options="kv_desc=False")
        assert cls().options == KernelOptions()
    fn = TritonTreeBackend(KernelOptions(kv_desc=False)).prepare(inputs)
    assert fn.options == KernelOptions(kv_desc=False) and not fn.kv_desc


@pytest.mark.parametrize("kw, needle", [
    (dict(num_warps=0), "num_warps"), (dict(num_warps=3), "num_warps"), (dict(num_stages=0), "num_stages"),
    (dict(block_n=512), "block_n"), (dict(max_regs=8), "max_regs"), (dict(bt_ahead=1.5), "bt_ahead"),
    (dict(num_warps=True), "num_warps"), (dict(num_warps=4.0), "num_warps"), (dict(num_stages=1000), "num_stages"),
    (dict(bt_ahead=True), "bt_ahead"), (dict(num_warps="4"), "num_warps='4'"),
])
def test_kernel_config_rejects_bad_fields(kw, needle):
    with pytest.raises(ConfigError, match=needle):
        KernelConfig(**{**dict(block_m=64, block_n=64, num_warps=4, num_stages=3), **kw})


# ---- the warp-specialised Gluon kernel (sm_90) -----------------------------------------

WS_CONFIGS = [KernelConfig(128, 64, 4, 4, 168, 0, 2), KernelConfig(64, 64, 4, 2, 128, 0, 1),
              KernelConfig(192, 64, 4, 3, 128, 0, 3), KernelConfig(192, 32, 4, 4, 128, 0, 3)]


def test_ws_config_fields_and_budgets():
    """A warp-specialised config is 64 rows per consumer warpgroup, 32- or 64-token tiles
    and 4 warps; its registers split max_regs over ws + 1 warpgroups with the producer's
    fixed share; its shared memory fits one sm_90 CTA and bounds what the sm_90 compiles
    took; its occupancy is the smaller of what shared memory and registers allow; parse
    takes the 7th field."""
    from treebench.kernels.tree_attention_plan import SMEM_PER_SM, WS_PRODUCER_REGS, parse_kernel_config
    ws2 = KernelConfig(128, 64, 4, 4, 168, 0, 2)
    assert ws2.ws_regs == (232, WS_PRODUCER_REGS)           # (3 * 168 - 40) / 2, a multiple of 8
    assert KernelConfig(64, 64, 4, 2, 128, 0, 1).ws_regs == (216, WS_PRODUCER_REGS)
    assert KernelConfig(192, 64, 4, 3, 128, 0, 3).ws_regs == (152, WS_PRODUCER_REGS)
    for cfg in WS_CONFIGS:
        assert cfg.ws_shared_bytes(128) <= SMEM_PER_SM
    # sm_90 compiles with Triton 3.6 (lab/sm90_compile.py --ws): what each build took
    compiled = {(128, 64, 4, 4, 168, 0, 2): 180336, (64, 64, 4, 2, 128, 0, 1): 90172,
                (192, 64, 4, 3, 128, 0, 3): 172152, (192, 32, 4, 4, 128, 0, 3): 139384,
                (128, 32, 4, 4, 168, 0, 2): 114800, (128, 32, 4, 6, 168, 0, 2): 147616}
    for fields, took in compiled.items():
        assert took <= KernelConfig(*fields).ws_shared_bytes(128) <= took + 1024, fields
    assert [cfg.ctas_per_sm(128) for cfg in WS_CONFIGS] == [1, 2, 1, 1]   # ws 1 with 2 stages: 2 per SM
    # 2 consumer warpgroups on 32-token tiles: shared memory would allow 2 CTAs, 168 registers x 384 one
    assert KernelConfig(128, 32, 4, 4, 168, 0, 2).ctas_per_sm(128) == 1
    assert KernelConfig(64, 64, 4, 3).ctas_per_sm(128) == 2
    # PIPE (run 10): always with 1-2 consumer warpgroups; with 3 from 32 KV tiles per work item
    assert [cfg.ws_pipe_for(31) for cfg in WS_CONFIGS] == [True, True, False, False]
    assert [cfg.ws_pipe_for(32) for cfg in WS_CONFIGS] == [True, True, True, True]
    assert parse_kernel_config("128,64,4,4,168,0,2") == ws2
    assert parse_kernel_config("192,32,4,4,128,0,3").block_n == 32
    for bad in [(64, 64, 4, 4, 168, 0, 2), (128, 16, 4, 4, 168, 0, 2), (128, 128, 4, 4, 168, 0, 2),
                (128, 64, 8, 4, 168, 0, 2),
                (128, 64, 4, 4, 0, 0, 2), (256, 64, 4, 4, 168, 0, 4), (192, 64, 4, 3, 128),
                (128, 64, 4, 4, 88, 0, 2),        # 112 registers per consumer: ptxas refuses the tile
                (128, 64, 4, 4, 176, 0, 2),       # 176 * 384 threads > the 65536-register file
                (192, 64, 4, 3, 136, 0, 3), (128, 64, 4, 4, 168, 1, 2), (128, 64, 4, 7, 168, 0, 2)]:
        with pytest.raises(ConfigError, match="kernel config"):
            KernelConfig(*bad)
    with pytest.raises(ConfigError, match="192 rows are the 3 consumer warpgroups"):
        KernelConfig(192, 64, 4, 3)
    with pytest.raises(ConfigError, match="ws_regs of a tl-kernel config"):
        KernelConfig(64, 64, 4, 3).ws_regs
    with pytest.raises(ConfigError, match="ws_pipe_for of a tl-kernel config"):
        KernelConfig(64, 64, 4, 3).ws_pipe_for(64)


def test_choose_config_picks_the_ws_rows_only_for_d128():
    from treebench.kernels.tree_attention_plan import WS2, WS3, choose_config
    assert choose_config(112, 128, False) == WS2          # the 27-node tree, G 4
    assert choose_config(160, 128, False) == WS3          # full:3:3, G 4
    assert choose_config(256, 128, False) == WS2          # medusa, G 4: two M-tiles of 128 rows
    assert choose_config(52, 128, False).ws == 0           # one 64-row tile: the tl kernel
    for rows, d, ws in ((112, 64, True), (112, 256, True), (112, 128, False)):
        cfg = choose_config(rows, d, False, ws=ws)
        assert cfg.ws == 0 and cfg.block_m == 64
    assert choose_config(112, 128, True).ws == 0          # the interpreter: its own tiny tiles


def test_short_context_configs_cover_the_seed_trees_at_b1_l16_in_one_wave():
    """`short_context_config` (H200, 132 SMs, Hkv 8, D 128): S_b <= 32 with <= 64 rows takes
    the 16-row, 32-token tile at any B (4 warps over bf16, 8 over fp8 pools); S_b <= 64 with
    <= 256 rows the 16-row, 64-token tile while its programs fit one wave at 2 per SM (B 1: the
    27-node tree's 112 rows, full:3:3's 160), S_b <= 128 the 16-row, 128-token one (medusa's 256
    rows at B 1 and 2), and S_b <= 80 the 32-row tile in one wave; else the table's config.
    First of all, over bf16/fp16 pools only: S_b <= 64 with 17-256 rows takes the 64-row, 64-token
    tile once its programs fill every SM (B 16 and 64 at L 16 with the 27-node tree)."""
    from treebench.kernels.tree_attention_plan import short_context_config
    assert short_context_config(16, 128, 20, 16, 8, 132) == KernelConfig(16, 32, 4, 2)        # full:3:1, L 16
    assert short_context_config(16, 128, 20, 16, 8, 132, fp8=True) == KernelConfig(16, 32, 8, 2)
    assert short_context_config(160, 128, 56, 1, 8, 132) == KernelConfig(16, 64, 8, 2)        # full:3:3, L 16
    assert short_context_config(160, 128, 56, 1, 8, 132, fp8=True) == KernelConfig(16, 64, 4, 2)
    assert short_context_config(112, 128, 44, 3, 8, 132) == KernelConfig(16, 64, 8, 2)        # 168 programs
    assert short_context_config(112, 128, 44, 5, 8, 132) == KernelConfig(32, 64, 4, 2)        # 280 16-row ones
    assert short_context_config(256, 128, 80, 1, 8, 132) == KernelConfig(16, 128, 8, 2)       # medusa, L 16
    assert short_context_config(256, 128, 80, 2, 8, 132) == KernelConfig(16, 128, 8, 2)       # 256 programs
    assert short_context_config(256, 128, 80, 3, 8, 132) == KernelConfig(32, 64, 4, 2)        # 384 16-row ones
    assert short_context_config(256, 128, 80, 4, 8, 132) == KernelConfig(32, 64, 4, 2)        # 256 programs
    assert short_context_config(160, 128, 56, 16, 8, 132) == KernelConfig(64, 64, 4, 2)       # 384 64-row ones
    assert short_context_config(160, 128, 56, 16, 8, 132, fp8=True) is None   # 640 16-row programs: over one wave
    assert short_context_config(112, 128, 44, 64, 8, 132) == KernelConfig(64, 64, 4, 2)       # 1024 programs
    assert short_context_config(52, 128, 29, 64, 8, 132) == KernelConfig(64, 64, 4, 2)        # full:3:2, 512
    assert short_context_config(52, 128, 29, 16, 8, 132) == KernelConfig(16, 32, 4, 2)        # 128 < 132 SMs
    assert short_context_config(16, 128, 20, 64, 8, 132) == KernelConfig(16, 32, 4, 2)        # 16 rows: not above 16
    assert short_context_config(256, 128, 80, 64, 8, 132) is None       # medusa at B 64: S_b 80 > 64
    assert short_context_config(256, 128, 81, 3, 8, 132) is None        # a longer context, past one wave
    assert short_context_config(256, 128, 129, 1, 8, 132) is None       # past one 128-token tile
    assert short_context_config(257, 128, 80, 1, 8, 132) is None        # more rows
    assert short_context_config(160, 64, 56, 1, 8, 132) is None         # D 64: not measured


def test_ws_fills_when_the_tl_kernel_needs_more_than_one_wave():
    from treebench.kernels.tree_attention_plan import WS2, WS3, ws_fills
    assert ws_fills(WS2, 64, 8, 112, 132)                 # 1024 tl programs > 264
    assert not ws_fills(WS2, 16, 8, 112, 132)              # 256: one wave of the tl kernel
    assert ws_fills(WS3, 16, 8, 160, 132)                 # full:3:3 at B 16: 384 tl programs
    assert not ws_fills(WS2, 1, 8, 112, 132)
    assert ws_fills(KernelConfig(64, 64, 4, 3), 1, 8, 112, 132)   # a tl config always
    # within one wave, but the tl kernel would gather per token (P 16) where ws reads a box per page
    assert ws_fills(WS2, 16, 8, 112, 132, tl_tma=False)   # 256 programs: every SM at least once
    assert not ws_fills(WS2, 1, 8, 112, 132, tl_tma=False)  # 16 programs: split-KV on the tl kernel


@pytest.mark.parametrize("rows,d,batch,page_path,fp8,expect", [
    (52, 128, 16, "tma-page", False, True),      # full:3:2 at B 16, P 16 / 32: 128 programs on 132 SMs
    (64, 128, 16, "tma-page", False, True),
    (36, 128, 15, "tma-page", False, True),      # 120 programs: 0.91 of the SMs
    (52, 128, 14, "tma-page", False, False),     # 112 programs: below 0.9, split-KV keeps the tl kernel
    (52, 128, 17, "tma-page", False, False),     # 136 programs: past one per SM
    (52, 128, 64, "tma-page", False, False),     # B 64: the tl kernel's gather measured as fast
    (52, 128, 16, "tma", False, False),          # P 128: the tl kernel reads it by TMA
    (52, 128, 16, "gather", False, False),       # P 8: no box per page
    (52, 128, 16, "", False, False),             # ws_page_tma off
    (52, 128, 16, "tma-page", True, True),       # fp8 pools: WS1_FP8 from 0.9 of the SMs' worth of programs
    (52, 128, 16, "tma", True, True),            # ... at P 128 too
    (52, 128, 64, "tma-page", True, True),       # ... and over several waves (512 programs)
    (52, 128, 14, "tma", True, False),           # 112 programs: split-KV keeps the tl kernel
    (52, 128, 64, "gather", True, False),        # fp8 pools are read by TMA only
    (16, 128, 64, "tma", True, False),           # full:3:1's 16 rows: the tl kernel's 16-row tile
    (16, 128, 16, "tma", False, True),           # full:3:1's 16 rows at B 16 over bf16: WS1, one split
    (16, 128, 16, "tma-page", False, True),      # ... at P 16 / 32 too
    (9, 128, 16, "tma", False, True),            # the few-rows range's lower end
    (8, 128, 16, "tma", False, False),           # full:3:0-like rows (4-8): the tl kernel
    (4, 128, 16, "tma-page", False, False),      # full:3:0's 4 rows at P 16: the tl kernel
    (16, 128, 16, "gather", False, False),       # P 8: no TMA path
    (16, 128, 64, "tma", False, False),          # B 64: 512 programs, several waves
    (16, 128, 14, "tma", False, False),          # 112 programs: split-KV keeps the tl kernel
    (16, 64, 16, "tma", False, False),           # D 64: not measured
    (16, 128, 16, "tma", True, False),           # fp8 pools of 16 rows: the tl kernel's 16-row tile
    (24, 128, 16, "tma", False, False),          # 17-32 rows: the table's 32-row tile
    (52, 64, 64, "tma", True, False),            # D 64: not measured
    (52, 64, 16, "tma-page", False, False),      # D 64: not measured
    (32, 128, 16, "tma-page", False, False),     # 32 rows: the table's 32-row tile
    (65, 128, 16, "tma-page", False, False),     # two 64-row M-tiles
])
def test_ws1_config_only_where_measured(rows, d, batch, page_path, fp8, expect):
    """`ws1_config` (132 SMs, Hkv 8): one consumer warpgroup for 33-64 rows at D 128 over
    bf16/fp16 pools read one TMA box per page, and for 9-16 rows read by TMA either way, when the
    B * Hkv programs fill 0.9-1.0 of the SMs;
    over fp8 pools read by TMA (WS1_FP8, a converter warpgroup beside) from 0.9 of the SMs up."""
    from treebench.kernels.tree_attention_plan import WS1, WS1_FP8, ws1_config
    got = ws1_config(rows, d, batch, 8, 132, page_path, fp8=fp8)
    assert got == ((WS1_FP8 if fp8 else WS1) if expect else None)
    if expect:
        assert got.ws == 1 and got.block_m == 64 and bool(got.fp8_stages) == fp8
    if fp8:   # with KernelOptions.ws_fp8 off fp8 pools never take the warp-specialised kernel
        assert ws1_config(rows, d, batch, 8, 132, page_path, fp8=True, fp8_ws=False) is None


@pytest.mark.skipif(DEVICE == "cuda", reason="the refusal is for a machine without a CUDA GPU")
def test_ws_kernel_is_refused_without_a_gpu():
    """A warp-specialised config names why it cannot run here; the default quietly
    keeps the tl kernel."""
    from treebench.kernels.tree_attention import ws_unsupported
    case = Case(batch_size=2, context_len=70, tree="full:2:2", page_size=64, **TINY)
    inputs = build_inputs(case, DEVICE)
    assert "CUDA GPU" in ws_unsupported(inputs)
    with pytest.raises(ConfigError, match="config ws=2: the warp-specialised kernel needs a CUDA GPU"):
        TreeAttention(inputs, config=WS_CONFIGS[0])
    with pytest.raises(ConfigError, match="ws=True: the warp-specialised kernel needs a CUDA GPU"):
        TreeAttention(inputs, ws=True)
    with pytest.raises(ConfigError, match="config ws=2: ws=False"):
        TreeAttention(inputs, config=WS_CONFIGS[0], ws=False)
    with pytest.raises(ConfigError, match="ws=True: kv_desc=False"):
        TreeAttention(inputs, ws=True, options=KernelOptions(kv_desc=False))
    for bad in ("yes", 0, 1):
        with pytest.raises(ConfigError, match=f"ws={bad!r}: must be None"):
            TreeAttention(inputs, ws=bad)
    with pytest.raises(ConfigError, match="must be a KernelConfig"):
        TreeAttention(inputs, config=(128, 64, 4, 4, 168, 0, 2))
    assert not TreeAttention(inputs).ws and not TreeAttention(inputs, ws=False).ws
    assert TreeAttention(inputs).ws_pipe is None                 # no PIPE on the tl kernel


@pytest.mark.gpu
@pytest.mark.skipif(DEVICE != "cuda" or torch.cuda.get_device_capability() != (9, 0), reason="needs an sm_90 GPU")
@pytest.mark.parametrize("cfg", WS_CONFIGS, ids=["ws2", "ws1", "ws3", "ws3-n32"])
@pytest.mark.parametrize("pipe", [True, False])
@pytest.mark.parametrize("splits", [1, 3])
def test_ws_kernel_on_gpu(cfg, pipe, splits):
    """The warp-specialised kernel against the float64 reference: ragged contexts
    (some zero), mixed per-request trees up to 70 nodes (several M-tiles, idle
    consumers), S_b not a multiple of 64 (the producer zeroes V rows past S_b), one
    persistent wave and one item per program, and replayed from a CUDA graph."""
    case = Case(batch_size=6, context_len="ragged:0-700", tree="random:70:4", tree_per_request="mixed",
                page_size=128, num_q_heads=16, num_kv_heads=4, head_dim=128)
    for persist in (True, False):
        ta = check(case, config=cfg, num_splits=splits, options=KernelOptions(ws_pipe=pipe, ws_persist=persist))
        assert ta.ws and ta.kv_desc
        assert_graph_replays(ta, ta.out.clone())


@pytest.mark.gpu
@pytest.mark.skipif(DEVICE != "cuda" or torch.cuda.get_device_capability() != (9, 0), reason="needs an sm_90 GPU")
@pytest.mark.parametrize("mode", ["tree", "bias", "causal"])
def test_ws_default_plan_on_gpu(mode):
    """The default plan takes the warp-specialised kernel for a large batch of a 28-node
    tree (G 4: 112 rows) in every mask mode, and the tl kernel for a single request
    (unless ws=True) and for D 64 (not tuned); every one of them exact. ws=True with
    no warp-specialised row for the batch (full:2:1, G 4: 12 rows) is refused."""
    import dataclasses
    big = Case(batch_size=48, context_len="ragged:100-400", tree="vllm:pr_27", page_size=64,   # 768 tl programs
               num_q_heads=32, num_kv_heads=8, head_dim=128)
    assert check(big, mode).ws
    one = dataclasses.replace(big, batch_size=1)
    assert not check(one, mode).ws
    assert check(one, mode, ws=True).ws                   # forced: split-KV over the one request
    assert not check(dataclasses.replace(big, head_dim=64, dtype="float16"), mode).ws
    with pytest.raises(ConfigError, match="ws=True: no warp-specialised config for 12 packed rows at D 128"):
        TreeAttention(build_inputs(dataclasses.replace(big, tree="full:2:1"), DEVICE), mode, ws=True)


@pytest.mark.gpu
@pytest.mark.skipif(DEVICE != "cuda" or torch.cuda.get_device_capability() != (9, 0), reason="needs an sm_90 GPU")
def test_ws_default_plan_pipelines_3_warpgroups_from_32_tiles_on_gpu():
    """full:3:3 at G 4 (160 rows) takes the 3-warpgroup config; it pipelines from 32 KV
    tiles per work item (L 2048 + T 40: 33 tiles) and not below (L 1024: 17), its
    threshold is an option (ws3_pipe_min_tiles), options.ws_pipe forces either, and the
    2-warpgroup config (the 27-node tree) always pipelines."""
    import dataclasses

    case = Case(batch_size=24, context_len=2048, tree="full:3:3", page_size=128,
                num_q_heads=32, num_kv_heads=8, head_dim=128)
    long_ = TreeAttention(build_inputs(case, DEVICE))
    assert long_.plan.config.ws == 3 and long_.plan.tiles_per_split == 33 and long_.ws_pipe is True
    short = check(dataclasses.replace(case, context_len=1024))
    assert short.plan.config.ws == 3 and short.plan.tiles_per_split == 17 and short.ws_pipe is False
    assert TreeAttention(build_inputs(dataclasses.replace(case, tree="vllm:pr_27", context_len=512),
                                      DEVICE)).ws_pipe is True
    assert check(dataclasses.replace(case, context_len=1024), options=KernelOptions(ws_pipe=True)).ws_pipe is True
    assert TreeAttention(build_inputs(case, DEVICE), options=KernelOptions(ws_pipe=False)).ws_pipe is False
    assert TreeAttention(build_inputs(case, DEVICE), options=KernelOptions(ws3_pipe_min_tiles=1 << 30)).ws_pipe is False
    assert check(dataclasses.replace(case, context_len=1024),
                 options=KernelOptions(ws3_pipe_min_tiles=17)).ws_pipe is True


@pytest.mark.gpu
@pytest.mark.skipif(DEVICE != "cuda" or torch.cuda.get_device_capability() != (9, 0), reason="needs an sm_90 GPU")
def test_ws_32_token_tiles_take_pages_of_96_on_gpu():
    """P 96 is a multiple of 32, not of 64: a warp-specialised config of 32-token tiles
    reads it by TMA and is exact; one of 64-token tiles reads it by the producer's gathers
    (`KernelOptions.ws_gather`, on by default) and is refused without them, naming the page size."""
    from treebench.kernels.options import KernelOptions
    case = Case(batch_size=5, context_len="ragged:0-500", tree="full:3:3", page_size=96,
                num_q_heads=16, num_kv_heads=4, head_dim=128)
    ta = check(case, config=KernelConfig(192, 32, 4, 4, 128, 0, 3))
    assert ta.ws and ta.plan.config.block_n == 32 and ta.ws_path == "tma"
    wide = KernelConfig(192, 64, 4, 3, 128, 0, 3)
    assert TreeAttention(build_inputs(case, DEVICE), config=wide).ws_path == "gather"
    with pytest.raises(ConfigError, match="page size 96 is not a multiple of BLOCK_N 64"):
        TreeAttention(build_inputs(case, DEVICE), config=wide, options=KernelOptions(ws_gather=False))
