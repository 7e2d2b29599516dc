"""fp8 KV pools: the case axes (ids unchanged at their defaults), the pool of codes with NaN-coded
free slots, the exact dequantising reference, the tolerances, the default check's kv_dtype axis
and the faults it must catch (tests/fp8_backends.py)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

import treebench.backends  # noqa: F401  (registers the built-in adapters)
from treebench.harness.adapter.contract import REGISTRY, Capabilities, capability_skip
from treebench.harness.checking.default_check import default_check
from treebench.harness.cli.main import main
from treebench.harness.errors import ConfigError
from treebench.harness.model.cases import Case
from treebench.harness.model.compare import TOLERANCES, compare, tolerance
from treebench.harness.model.paged import FP8_NAN_CODE, build_inputs, position_values, quantise
from treebench.harness.model.reference import reference_attention
from treebench.harness.model.suites import load_suite
from treebench.harness.model.workload import case_metrics
from treebench.harness.selftest.power import selftest
from treebench.harness.selftest.variants import CORRECT
from treebench.harness.store.rows import read_rows

from tests import fp8_backends

ROOT = Path(__file__).resolve().parent.parent
BACKENDS = ROOT / "tests" / "fp8_backends.py"
FP8 = ("float8_e4m3fn", "float8_e5m2")
SMALL = dict(batch_size=2, context_len=17, tree="full:2:2", num_q_heads=4, num_kv_heads=2, head_dim=64)


def fp8_case(kv="float8_e4m3fn", **kw) -> Case:
    return Case(**{**SMALL, "kv_dtype": kv, "k_scale": 0.25, "v_scale": 0.5, **kw})


# ---- the case axes -----------------------------------------------------------------------------

def test_stored_case_ids_are_unchanged():
    rows = read_rows([ROOT / "tests" / "data" / "results" / "h200-baseline" / "seed.jsonl"])
    assert rows and all(Case(**r["case"]).case_id == r["case_id"] for r in rows)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_defaults_spelt_out_keep_axes_id_and_draws(dtype):
    plain = Case(**{**SMALL, "dtype": dtype})
    spelt = Case(**{**SMALL, "dtype": dtype, "kv_dtype": dtype, "k_scale": 1, "v_scale": 1.0})
    assert spelt == plain and spelt.axes == plain.axes and spelt.case_id == plain.case_id
    assert "kv_dtype" not in plain.axes and "k_scale" not in plain.axes
    a, b = build_inputs(plain), build_inputs(spelt)
    assert torch.equal(a.q, b.q) and torch.equal(a.k_logical, b.k_logical) and (a.k_scale, a.v_scale) == (1.0, 1.0)


def test_fp8_cases_show_in_the_id_and_the_axes():
    c = fp8_case()
    assert "-kvfp8e4m3-ks0.25-vs0.5-" in c.case_id and "-kvfp8e5m2-" in fp8_case("float8_e5m2").case_id
    assert c.axes["kv_dtype"] == "float8_e4m3fn" and c.axes["k_scale"] == 0.25 and c.kv_fp8
    assert fp8_case().case_id != fp8_case(v_scale=0.25).case_id
    assert Case(**c.axes) == c                                      # a row's axes rebuild the case


@pytest.mark.parametrize("kw, needle", [
    (dict(kv_dtype="float8_e4m3", dtype="bfloat16"), "kv_dtype='float8_e4m3': use one of"),
    (dict(kv_dtype="float8_e4m3fn", dtype="float32"), "not supported with float32 queries"),
    (dict(kv_dtype="float8_e5m2", k_scale=0.0), "k_scale=0.0: must be a positive finite number"),
    (dict(kv_dtype="float8_e5m2", v_scale=float("inf")), "v_scale=inf: must be a positive finite number"),
    (dict(kv_dtype="float8_e5m2", v_scale=True), "v_scale=True"),
    (dict(k_scale=0.5), "scales apply to fp8 pools only"),
])
def test_bad_kv_axes_are_one_line_config_errors(kw, needle):
    with pytest.raises(ConfigError, match=None) as e:
        Case(**{**SMALL, **kw})
    assert needle in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("kw, needle", [
    ({"k_scale": 1e-30}, ("k_scale=1e-30: float8_e4m3fn's smallest normal 0.015625 x k_scale is below float16's "
                          "smallest normal 6.10352e-05; use 0.00390625 <= k_scale <= 64")),
    ({"v_scale": 1e38, "dtype": "bfloat16"}, ("v_scale=1e+38: float8_e4m3fn's max 448 x v_scale overflows "
                                              "bfloat16's max 3.38953e+38; use 0.00223214 <= v_scale <= 64")),
    ({"v_scale": 147.0}, "v_scale=147: float8_e4m3fn's max 448 x v_scale overflows float16's max 65504"),
    ({"kv_dtype": "float8_e5m2", "k_scale": 2.0}, "float8_e5m2's max 57344 x k_scale overflows float16's max"),
    ({"kv_dtype": "float8_e5m2", "k_scale": 0.5}, "float8_e5m2's smallest normal 6.10352e-05 x k_scale is below"),
    ({"k_scale": float("nan")}, "k_scale=nan: must be a positive finite number"),
    ({"k_scale": 1e-30, "dtype": "bfloat16"}, ("k_scale=1e-30: a value of 1 codes to 1 / k_scale = 1e+30, outside "
                                              "float8_e4m3fn's normal range [0.015625, 448]")),
    ({"v_scale": 65.0, "dtype": "bfloat16"}, "use 0.00223214 <= v_scale <= 64"),
])
def test_fp8_scales_whose_values_leave_the_query_dtype_are_refused(kw, needle):
    with pytest.raises(ConfigError) as e:
        fp8_case(**{"dtype": "float16", **kw})
    assert needle in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("kv, dtype, lo, hi", [("float8_e4m3fn", "float16", 2.0**-8, 64.0),
                                               ("float8_e5m2", "float16", 1.0, 65504 / 57344),
                                               ("float8_e4m3fn", "bfloat16", 1 / 448, 64.0),
                                               ("float8_e5m2", "bfloat16", 1 / 57344, 2.0**14)])
def test_fp8_scales_at_the_bounds_are_accepted(kv, dtype, lo, hi):
    for s in (lo, hi):
        assert fp8_case(kv, dtype=dtype, k_scale=s, v_scale=s).k_scale == s


def test_the_range_table_is_torch_finfo():
    from treebench.harness.model.cases import FLOAT_RANGE
    for name, (top, tiny) in FLOAT_RANGE.items():
        info = torch.finfo(getattr(torch, name))
        assert (top, tiny) == (info.max, info.smallest_normal), name


def test_a_suite_with_an_extreme_fp8_scale_exits_2(tmp_path, capsys):
    suite = tmp_path / "bad.toml"
    suite.write_text('[suite]\nname = "bad"\n[axes]\nbatch_size = [1]\ncontext_len = [4]\ntree = ["chain:1"]\n'
                     'dtype = ["float16"]\nkv_dtype = ["float8_e4m3fn"]\nk_scale = [1e-30]\n')
    assert main(["check", "--suite", str(suite), "--backend", "torch_sdpa", "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "k_scale=1e-30" in err[0] and "smallest normal" in err[0]


def test_a_suite_with_a_bad_kv_dtype_exits_2(tmp_path, capsys):
    suite = tmp_path / "bad.toml"
    suite.write_text('[suite]\nname = "bad"\n[axes]\nbatch_size = [1]\ncontext_len = [4]\ntree = ["chain:1"]\n'
                     'kv_dtype = ["fp8"]\n')
    assert main(["check", "--suite", str(suite), "--backend", "torch_sdpa", "--quiet"]) == 2
    assert "kv_dtype='fp8'" in capsys.readouterr().err


def test_seed_fp8_suite_is_the_seed_grid_in_e4m3():
    seed, fp8 = load_suite("seed"), load_suite("seed_fp8")
    assert len(seed.cases) == len(fp8.cases)
    for a, b in zip(seed.cases, fp8.cases):
        assert dataclasses.replace(b, kv_dtype=None, k_scale=1.0, v_scale=1.0) == a
        assert (b.kv_dtype, b.k_scale, b.v_scale) == ("float8_e4m3fn", 0.25, 0.5)


# ---- the pool of codes and the reference -------------------------------------------------------

@pytest.mark.parametrize("kv", FP8)
def test_the_pool_holds_the_codes_and_nan_codes_elsewhere(kv):
    c = fp8_case(kv, context_len="ragged:0-40", batch_size=3)
    i = build_inputs(c)
    dt = getattr(torch, kv)
    assert i.k_cache.dtype == i.v_cache.dtype == i.k_logical.dtype == dt and i.q.dtype == torch.bfloat16
    assert (i.k_scale, i.v_scale) == (0.25, 0.5)
    used = torch.zeros(i.k_cache.shape[:2], dtype=torch.bool)
    for b, s in enumerate(i.seq_lens.tolist()):
        pos = torch.arange(s)
        page, off = i.block_table[b].long()[pos // c.page_size], pos % c.page_size
        used[page, off] = True
        for pool, log in ((i.k_cache, i.k_logical), (i.v_cache, i.v_logical)):
            got = pool.view(torch.uint8)[page, off]
            assert torch.equal(got, log[int(i.kv_indptr[b]):int(i.kv_indptr[b + 1])].view(torch.uint8))
    assert (i.k_cache.view(torch.uint8)[~used] == FP8_NAN_CODE).all()
    assert (i.v_cache.view(torch.uint8)[~used] == FP8_NAN_CODE).all() and i.v_cache[~used].float().isnan().all()


def test_the_codes_are_the_draws_over_the_scale_saturated():
    plain, c = Case(**SMALL), fp8_case()
    a, b = build_inputs(plain), build_inputs(c)          # the same draws (and pages): the pool's format seeds nothing
    k, codes = a.k_logical.float(), b.k_logical.float()
    assert torch.equal(a.q, b.q) and torch.equal(a.block_table, b.block_table)
    assert torch.allclose(codes * 0.25, k, rtol=2 ** -3, atol=2 ** -9 * 0.25)   # e4m3: 3 mantissa bits
    big = quantise(torch.tensor([1e4, -1e9, 3.0]), torch.float8_e4m3fn, 0.5)
    assert big.float().tolist() == [448.0, -448.0, 6.0] and quantise(torch.tensor([1e9]), torch.float8_e5m2,
                                                                     1.0).float().item() == 57344.0


@pytest.mark.parametrize("kv, max_hkv", [("float8_e4m3fn", 8), ("float8_e5m2", 4)])
def test_position_values_are_exact_codes_under_power_of_two_scales(kv, max_hkv):
    for hkv in (1, 2, 4, 8):
        v = position_values(torch.arange(64), hkv, 16)
        for scale in (0.25, 0.5, 2.0):
            exact = torch.equal(quantise(v, getattr(torch, kv), scale).float() * scale, v)
            assert exact == (hkv <= max_hkv), (kv, hkv, scale)


@pytest.mark.parametrize("kv", FP8)
def test_the_reference_dequantises_the_codes_exactly(kv):
    i = build_inputs(fp8_case(kv, context_len="ragged:0-30", batch_size=3, tree_per_request="mixed"))
    values = dataclasses.replace(i, k_logical=i.k_logical.double() * 0.25, v_logical=i.v_logical.double() * 0.5,
                                 k_scale=1.0, v_scale=1.0)
    assert torch.equal(reference_attention(i), reference_attention(values))


def test_mean_values_give_the_mean_of_the_visible_v_rows():
    i = build_inputs(fp8_case(values="mean"))
    assert not i.q.any() and not i.k_logical.float().any()
    out, ptr, qo = reference_attention(i), i.kv_indptr.tolist(), i.qo_indptr.tolist()
    for b, tree in enumerate(i.trees):
        v = i.v_logical[ptr[b]:ptr[b + 1]].double() * 0.5                 # (S, Hkv, D)
        L = int(i.context_lens[b])
        for node in range(tree.size):
            seen = torch.cat([torch.arange(L), L + torch.nonzero(tree.ancestor_mask[node]).flatten()])
            want = v[seen].mean(0).repeat_interleave(2, 0)                 # (Hq, D): G = 2
            assert torch.allclose(out[qo[b] + node], want, atol=1e-12)


def test_tolerances_per_query_and_kv_dtype():
    assert tolerance("bfloat16") == tolerance("bfloat16", "bfloat16") == TOLERANCES["bfloat16"]
    assert tolerance("bfloat16", "float8_e4m3fn") == tolerance("bfloat16", "float8_e5m2") == (2.4e-2, 2.4e-2)
    assert tolerance("float16", "float8_e4m3fn") == (6e-3, 6e-3)
    ref = torch.ones(3, 2, 4, dtype=torch.float64)
    qo = torch.tensor([0, 3])
    assert compare(ref + 0.035, ref, qo, "bfloat16", kv_dtype="float8_e4m3fn").passed   # 0.035 < 0.048
    assert not compare(ref + 0.035, ref, qo, "bfloat16").passed                         # 0.035 > 0.032


def test_fp8_bytes_count_one_byte_per_kv_element():
    plain, fp8 = (build_inputs(c) for c in (Case(**SMALL), fp8_case()))
    kv_bf16 = sum(-(-s // 16) for s in plain.seq_lens.tolist()) * 16 * 2 * 64 * 2 * 2
    assert case_metrics(plain, None)["bytes"] - case_metrics(fp8, None)["bytes"] == kv_bf16 // 2


# ---- capabilities and the default check ------------------------------------------------------

def test_backends_opt_in_to_fp8():
    c = fp8_case()
    assert "kv_dtype float8_e4m3fn not supported" in capability_skip(Capabilities(), c)
    assert capability_skip(Capabilities(kv_dtypes=("float8_e4m3fn",)), c) is None
    assert "and float8_e4m3fn" in capability_skip(Capabilities(kv_dtypes=("float8_e4m3fn",)), fp8_case("float8_e5m2"))
    assert capability_skip(Capabilities(), Case(**SMALL)) is None


def test_the_default_check_has_the_kv_dtype_axis():
    d = default_check(REGISTRY["torch_sdpa"]())
    cov = d.coverage["kv_dtype"]
    assert not cov["skipped"] and cov["ran"][:3] == ["same", "float8_e4m3fn", "float8_e5m2"]
    fp8 = [c for c in d.cases if c.kv_fp8]
    assert all(c.k_scale != c.v_scale or c.k_scale == 0.5 for c in fp8) and any(c.k_scale != c.v_scale for c in fp8)
    assert any(c.group_size == 6 for c in fp8) and any(c.values == "mean" for c in fp8)
    assert all(c.k_scale != 1.0 and c.v_scale != 1.0 for c in fp8)
    skipped = default_check(REGISTRY["xformers_tree"]()).coverage["kv_dtype"]["skipped"]
    assert set(skipped) >= set(FP8) and all("Capabilities.kv_dtypes" in why for why in skipped.values())


@pytest.mark.parametrize("name, kvs", [("vllm_triton", {"float8_e4m3fn"}), ("flashinfer_mask", set(FP8)),
                                       ("flashinfer_xqa", {"float8_e4m3fn"}), ("flex", set(FP8)),
                                       ("reference", set(FP8)), ("torch_sdpa", set(FP8)), ("xformers_tree", set())])
def test_which_peers_declare_fp8(name, kvs):
    assert set(REGISTRY[name].capabilities.kv_dtypes) & set(FP8) == kvs


def test_xqa_skips_unequal_scales():
    xqa = REGISTRY["flashinfer_xqa"]()
    assert "one kv_scale" in xqa.supports(fp8_case())
    assert xqa.supports(fp8_case(k_scale=0.5)) is None


# ---- the faults the check must catch -----------------------------------------------------------

def _fp8_check_cases(backend):
    d = default_check(backend)
    return [c for c in d.cases if "kv_dtype" in d.check_axes[c.case_id]]


def test_the_fp8_cases_kill_every_broken_fp8_backend_and_pass_the_correct_ones():
    found = {o.name: o for o in selftest((fp8_backends.Fp8Correct, *CORRECT, *fp8_backends.BROKEN_FP8),
                                         cases_for=_fp8_check_cases, device="cpu")}
    assert all(found[cls.name].failed_check for cls in fp8_backends.BROKEN_FP8), \
        [n for n, o in found.items() if o.mutant and not o.failed_check]
    assert not [o.evidence for o in found.values() if not o.mutant and o.failed_check]


def test_the_fp8_faults_need_the_fp8_cases():
    """Without the kv_dtype axis every fp8 fault survives: each is a fault of the fp8 path only."""
    def no_fp8(backend):
        d = default_check(backend)
        return [c for c in d.cases if not c.kv_fp8][:12]
    found = selftest(fp8_backends.BROKEN_FP8, cases_for=no_fp8, device="cpu")
    assert not [o.name for o in found if o.failed_check]


def test_a_mean_values_case_alone_catches_the_causal_mask_on_fp8_data():
    found = selftest((fp8_backends.Fp8CausalMask, fp8_backends.Fp8Correct),
                     cases_for=lambda b: [fp8_case(values="mean")], device="cpu")
    assert [o.failed_check for o in found] == [True, False]


@pytest.mark.parametrize("cls, rc", [("Fp8Correct", 0), ("Fp8ScalesSwapped", 1)])
def test_treebench_check_on_fp8_backends(tmp_path, cls, rc):
    out = tmp_path / "rows.jsonl"
    assert main(["check", "--backend", f"{BACKENDS}:{cls}", "--out", str(out), "--quiet"]) == rc
    rows = read_rows([out])
    fp8 = [r for r in rows if (r["case"].get("kv_dtype") or "").startswith("float8")]
    assert fp8 and all(r["status"] == ("pass" if rc == 0 else r["status"]) for r in fp8)
    assert any(r["status"] == "mismatch" for r in fp8) == bool(rc)
    assert json.dumps(fp8[0]["case"]) and fp8[0]["case"]["k_scale"] == 0.25


def test_the_report_shows_kv_dtype_where_it_varies():
    from treebench.harness.analyze.report import time_pivot
    from treebench.harness.analyze.tables import timed_frame

    def row(case, backend="torch_sdpa"):
        return {"status": "pass", "median_us": 10.0, "case_id": case.case_id, "backend": backend,
                "case": case.axes, "tree_sizes": [7, 7]}
    plain, fp8 = Case(**SMALL), fp8_case()
    pivot = time_pivot(timed_frame([row(plain), row(fp8)]), ["torch_sdpa"])
    assert len(pivot) == 2 and sorted(pivot["kv_dtype"]) == ["bfloat16", "float8_e4m3fn"]
    assert "kv_dtype" not in time_pivot(timed_frame([row(plain), row(plain, "flex")]), ["torch_sdpa", "flex"])


@pytest.mark.parametrize("kv", ["float8_e4m3fn", None])
def test_logical_from_pool_follows_rewritten_pool_slots(kv):
    """`BatchInputs.logical_from_pool`: after pool slots are rewritten (here every used value's
    mantissa's last bit flipped; these codes stay finite), the reference sees the new codes, the same as the pool read through
    the block table; on unchanged inputs it changes nothing."""
    from treebench.harness.model.reference import paged_reference_attention

    case = Case(batch_size=3, context_len="list:0,5,20", tree="full:2:1", page_size=4, num_q_heads=4,
                num_kv_heads=2, head_dim=16, kv_dtype=kv, **({"k_scale": 0.25, "v_scale": 0.5} if kv else {}))
    inputs = build_inputs(case, "cpu")
    before = inputs.k_logical.view(torch.uint8).clone()
    inputs.logical_from_pool()
    assert torch.equal(inputs.k_logical.view(torch.uint8), before)
    for pool in (inputs.k_cache, inputs.v_cache):
        n = pool.element_size()               # bytes per value: the low one (little-endian) holds the
        used = (~pool.float().isnan()).repeat_interleave(n, dim=-1)   # mantissa's last bit
        used &= torch.arange(used.shape[-1]) % n == 0
        pool.view(torch.uint8)[used] ^= 1
    stale = reference_attention(inputs)
    inputs.logical_from_pool()
    fresh = reference_attention(inputs)
    assert not torch.equal(stale, fresh)
    assert torch.allclose(fresh, paged_reference_attention(inputs.for_backend()), rtol=0, atol=1e-12)
