"""The tl kernel's short build (`KernelOptions.short_build`): ONE_TILE (one split, every
S_b <= BLOCK_N: one tile, no loop, a plain softmax) against the float64 reference; the
option's rule and checks.

CPU: Triton's interpreter (16 x 16 tiles, so S_b <= 16 takes ONE_TILE), tiny shapes; on a GPU
the same tests compile the kernel (64-token tiles: every S_b here still fits one tile).
"""

from __future__ import annotations

import pytest

from tests.kernel_device import DEVICE, TINY, triton  # noqa: E402,F401  (sets TRITON_INTERPRET first)
from tests.kernel_device import run_checked as run  # noqa: E402
from treebench.harness.errors import ConfigError  # noqa: E402
from treebench.harness.model.cases import Case  # noqa: E402
from treebench.harness.model.compare import compare, compare_lse  # noqa: E402
from treebench.harness.model.paged import build_inputs  # noqa: E402
from treebench.harness.model.reference import reference_attention  # noqa: E402
from treebench.kernels.options import KernelOptions  # noqa: E402
from treebench.kernels.tree_attention_plan import KernelConfig, short_context_config  # noqa: E402

from treebench.kernels.tree_attention import TreeAttention  # noqa: E402

SMALL = dict(num_q_heads=4, num_kv_heads=2, head_dim=32)      # G 2, D 32
GQA4 = dict(num_q_heads=8, num_kv_heads=2, head_dim=32)       # G 4: 28 rows for 7 nodes, two M-tiles
SHORT = KernelOptions(short_build=True)
TILE = KernelConfig(16, 16, 1, 1, bt_ahead=1)                 # the interpreter's tile, with the look-ahead asked for
FP8 = dict(kv_dtype="float8_e4m3fn", k_scale=0.25, v_scale=0.5)


def consts(ta: TreeAttention) -> dict:
    """The forward launch's constexprs."""
    return ta._launches[0].consts


def assert_build(ta: TreeAttention, build: str) -> None:
    """ta runs the short build `build` ("one-tile") without TMA or look-ahead, or ("") today's build."""
    c = consts(ta)
    assert ta.short_build == build and c["ONE_TILE"] is (build == "one-tile"), ta.kernel
    if build:
        assert ta.kernel.endswith(f" {build}") and not c["KV_DESC"] and not c["BT_AHEAD"] and not ta.kv_desc
    else:
        assert ta.kernel.endswith(f"splits={ta.plan.num_splits}"), ta.kernel


def check(case: Case, lse: bool = True, **kw) -> TreeAttention:
    """The kernel on `case` in tree mode (output, and with lse the LSE, first NaN) against the
    float64 reference, with the pool's tolerance (`compare`'s kv_dtype: fp8 pools)."""
    inputs = build_inputs(case, DEVICE)
    ta = TreeAttention(inputs.for_backend(), return_lse=lse, **kw)
    ta.out.fill_(float("nan"))
    if lse:
        ta.lse.fill_(float("nan"))
    out = ta()
    ref, ref_lse = reference_attention(inputs, return_lse=True)
    rec = compare(out, ref, inputs.qo_indptr, case.dtype, kv_dtype=case.kv_dtype)
    assert rec.nonfinite == 0 and rec.passed, rec
    if lse:
        lrec = compare_lse(ta.lse, ref_lse, inputs.qo_indptr, case.dtype)
        assert lrec.passed, lrec.reason()
    assert consts(ta)["WRITE_LSE"] is lse
    return ta


@pytest.mark.parametrize("page_size", [1, 3, 16])
@pytest.mark.parametrize("mode", ["tree", "bias", "causal"])
def test_one_tile_matches_the_reference(page_size, mode):
    """L_b 9, 0 and 4: request 0's 7-node tree ends exactly at S_b = BLOCK_N (16), the others
    below it (mixed trees in tree mode: fewer rows, so some M-tiles exit early); G 4, two M-tiles."""
    case = Case(batch_size=3, context_len="list:9,0,4", tree="full:2:2", page_size=page_size,
                tree_per_request="mixed" if mode == "tree" else "same", **GQA4)
    ta = run(case, mode, config=TILE, options=SHORT)
    assert_build(ta, "one-tile")
    assert ta.plan.num_splits == 1 and ta.plan.m_tiles == 2


@pytest.mark.parametrize("page_size", [3, 16])
@pytest.mark.parametrize("fused", [False, True])
def test_short_build_where_it_cannot_run(page_size, fused):
    """short_build=True where one tile does not hold every S_b (S_b 7 to 45, up to 3 tiles), or
    with split-KV asked for: today's build, the context loop and the masked one (with splits
    past a short request's last tile seeing nothing, weight 0 in the merge)."""
    case = Case(batch_size=4, context_len="list:0,3,25,38", tree="full:2:2", tree_per_request="mixed",
                page_size=page_size, **SMALL)
    assert_build(run(case, config=TILE, options=SHORT), "")
    ta = run(case, config=TILE, num_splits=3, fused_merge=fused, options=SHORT)
    assert_build(ta, "")
    assert ta.plan.num_splits == 3
    short = Case(batch_size=2, context_len="list:9,2", tree="full:2:2", page_size=page_size, **SMALL)
    assert_build(run(short, config=TILE, num_splits=2, fused_merge=fused, options=SHORT), "")


@pytest.mark.parametrize("page_size", [3, 16])
def test_one_tile_without_lse(page_size):
    case = Case(batch_size=2, context_len="list:9,1", tree="full:2:2", page_size=page_size, **SMALL)
    assert_build(check(case, lse=False, config=TILE, options=SHORT), "one-tile")


@pytest.mark.parametrize("path", ["fp16", "cast", "split"])
@pytest.mark.parametrize("page_size", [3, 16])
def test_one_tile_over_an_fp8_pool(path, page_size):
    """An e4m3 pool with k_scale 0.25 and v_scale 0.5 (the seed_fp8 pool), bf16 queries: the
    fp16 MMAs with each query row scaled into fp16's range (Q_ROW_SCALE), and the cast."""
    case = Case(batch_size=3, context_len="list:9,0,4", tree="full:2:2", tree_per_request="mixed",
                page_size=page_size, **FP8, **SMALL)
    ta = check(case, config=TILE, options=KernelOptions(short_build=True, fp8_path=path))
    assert_build(ta, "one-tile")
    assert consts(ta)["Q_ROW_SCALE"] is (path == "fp16")


def test_short_build_rule_and_checks():
    """None: on exactly where the short-context config applies, unless kv_desc=True asks for TMA
    context tiles; True / False forced; anything else, and True with kv_desc=True, refused."""
    for short_config in (True, False):
        assert KernelOptions().short_build_on(short_config) is short_config
        assert KernelOptions(short_build=True).short_build_on(short_config) is True
        assert KernelOptions(short_build=False).short_build_on(short_config) is False
        assert KernelOptions(kv_desc=False).short_build_on(short_config) is short_config
    assert KernelOptions(kv_desc=True).short_build_on(True) is False
    for bad in ("x", 1, 0):
        with pytest.raises(ConfigError, match=f"short_build={bad!r}: must be None"):
            KernelOptions(short_build=bad)
    with pytest.raises(ConfigError, match="short_build=True with kv_desc=True"):
        KernelOptions(short_build=True, kv_desc=True)
    assert KernelOptions(short_build=True).changed() == {"short_build": True}


def test_short_context_config_never_applies_in_the_interpreter():
    assert short_context_config(16, 128, 20, 16, 8, 132) == KernelConfig(16, 32, 4, 2)
    assert short_context_config(16, 128, 20, 16, 8, 132, interpret=True) is None


def test_default_takes_the_short_build_exactly_where_the_short_config_applies(monkeypatch):
    """With short_context_config standing in for the GPU's (the interpreter's tile wherever max
    S_b <= 40, else None), the default options take one-tile at S_b <= 16 (the tile) and today's
    build past it, early_first on up to 40; kv_desc=True and short_build=False keep
    today's build (the short config and early_first stay); a given config skips the rule."""
    import treebench.kernels.tree_attention as kt

    asked = []

    def short_config(rows, d, max_s, b, hkv, sms, interpret=False, fp8=False):
        asked.append(max_s)
        return KernelConfig(16, 16, 1, 1) if max_s <= 40 else None
    monkeypatch.setattr(kt, "short_context_config", short_config)
    for context, build, early in (("list:9,0", "one-tile", True), ("list:9,33", "", True), ("list:9,34", "", False)):
        case = Case(batch_size=2, context_len=context, tree="full:2:2", page_size=16, **SMALL)
        ta = run(case)
        assert (ta.short_build, ta.early_first) == (build, early), ta.kernel
        assert consts(ta)["ONE_TILE"] is (build == "one-tile")
        assert ta.kernel.endswith(" one-tile") is (build == "one-tile"), ta.kernel   # a GPU may split the others
    assert asked == [16, 40, 41]
    case = Case(batch_size=2, context_len="list:9,0", tree="full:2:2", page_size=16, **SMALL)
    for opts in (KernelOptions(kv_desc=True), KernelOptions(short_build=False)):
        ta = run(case, options=opts)
        assert ta.short_build == "" and ta.early_first and not consts(ta)["ONE_TILE"], ta.kernel
    assert run(case, config=KernelConfig(16, 16, 1, 1)).short_build == ""
