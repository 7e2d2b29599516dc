"""The FLOP and byte model and the tables built from rows.

Pair counts are checked against the reference's own (T, S) request mask, an
independent construction; byte counts against hand-worked examples.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest

from treebench.harness.model.cases import Case
from treebench.harness.analyze.tables import mask_overhead_table, speedup_table
from treebench.harness.model.workload import (DEVICE_PEAKS, attended_pairs, attention_bytes, attention_flops,
                                              case_metrics, device_peak, kv_bytes, kv_values_read, rates,
                                              row_work)
from treebench.harness.model.paged import build_inputs
from treebench.harness.model.reference import request_mask
from treebench.harness.store.rows import read_rows
from treebench.harness.model.tree_specs import parse_tree

BASE = Path(__file__).parent / "data" / "results" / "h200-baseline"


@pytest.mark.parametrize("spec", ["chain:0", "chain:5", "full:3:2", "full:2:4", "random:36:7", "random:231:3"])
@pytest.mark.parametrize("context_len", [0, 17, 1024])
def test_attended_pairs_equal_the_reference_mask(spec, context_len):
    tree = parse_tree(spec)
    mask = request_mask(tree.ancestor_mask, context_len)          # (T, L + T) bool
    assert attended_pairs([context_len], [tree.depths]) == [int(mask.sum())]


def test_attended_pairs_by_hand():
    # chain:2 (depths 0, 1, 2) after 5 context tokens: 3 * 5 + (1 + 2 + 3) = 21; full:3:1 alone: 1 + 3 * 2 = 7
    assert attended_pairs([5, 0], [[0, 1, 2], [0, 1, 1, 1]]) == [21, 7]


def test_flops_are_four_per_pair_head_and_dim():
    assert attention_flops([21, 7], num_q_heads=32, head_dim=128) == 4 * 28 * 32 * 128


@pytest.mark.parametrize("L, T, P, pages", [(16, 1, 16, 2), (15, 1, 16, 1), (1024, 40, 16, 67), (0, 13, 1, 13)])
def test_kv_bytes_count_whole_pages(L, T, P, pages):
    # pages = ceil((L + T) / P); Hkv 8, D 128, bf16, K and V
    assert kv_bytes([L], [T], 8, 128, P, 2) == pages * P * 8 * 128 * 2 * 2


def test_attention_bytes_by_hand():
    # B=2: L = (16, 1024), T = (4, 13); Hq 32, Hkv 8, D 128, P 16, bf16
    pages = 2 + 65                                       # ceil(20/16), ceil(1037/16)
    kv = pages * 16 * 8 * 128 * 2 * 2
    qo = 2 * 17 * 32 * 128 * 2                           # Q read + O written
    mask = math.ceil(16 / 8) + math.ceil(169 / 8)        # T^2 bits per request
    assert attention_bytes([16, 1024], [4, 13], 32, 8, 128, 16, 2) == kv + qo + mask + pages * 4


@pytest.mark.parametrize("context_len, tree, heads", [("ragged:3-37", "full:2:2", (8, 2)), (232, "chain:4", (4, 4))])
def test_kv_values_read_count_what_the_reference_expands(context_len, tree, heads):
    """2 x sum_b S_b x Hq x D: the K and V values of the reference's per-request (S_b, Hq, D) tensors
    after repeat_interleave over the group; page size and dtype play no part."""
    case = Case(batch_size=3, context_len=context_len, tree=tree, num_q_heads=heads[0], num_kv_heads=heads[1],
                head_dim=16, page_size=5)
    inputs = build_inputs(case)
    ls, ts, _ = inputs.host_lists()
    ptr = inputs.kv_indptr.tolist()
    expanded = sum(inputs.k_logical[ptr[b]:ptr[b + 1]].repeat_interleave(case.group_size, dim=1).numel()
                   for b in range(case.batch_size))                                    # (S_b, Hq, D) each
    assert kv_values_read(ls, ts, case.num_q_heads, case.head_dim) == 2 * expanded


def test_rates():
    r = rates(flops=2_000_000_000_000, nbytes=1_000_000_000_000, median_us=1e6, peak_bytes_per_s=4e12)
    assert r == pytest.approx({"tflops": 2.0, "tb_per_s": 1.0, "pct_peak_bw": 25.0})
    assert rates(1, 1, None, 4e12) == {"tflops": None, "tb_per_s": None, "pct_peak_bw": None}
    assert rates(1, 1, 1.0, None)["pct_peak_bw"] is None


@pytest.mark.parametrize("tree_per_request", ["same", "mixed"])
def test_case_metrics_use_the_batch(tree_per_request):
    case = Case(batch_size=3, context_len="ragged:5-37", tree="full:2:2", num_q_heads=4, num_kv_heads=2,
                head_dim=8, dtype="float32", page_size=4, tree_per_request=tree_per_request)
    inputs = build_inputs(case)
    ls, ts, _ = inputs.host_lists()
    pairs = sum(int(request_mask(t.ancestor_mask, l).sum()) for t, l in zip(inputs.trees, ls))
    m = case_metrics(inputs, median_us=10.0, peak_bytes_per_s=1e12)
    assert m["flops"] == 4 * pairs * 4 * 8
    assert m["bytes"] == attention_bytes(ls, ts, 4, 2, 8, 4, 4)
    assert m["tflops"] == pytest.approx(m["flops"] / 10e-6 / 1e12)
    assert m["pct_peak_bw"] == pytest.approx(100 * m["bytes"] / 10e-6 / 1e12)


def test_row_work_recomputes_stored_figures():
    rows = [r for r in read_rows(BASE) if r["backend"] == "triton_tree"][:6]
    for r in rows:
        bare = {k: v for k, v in r.items() if k not in ("flops", "bytes")}
        assert row_work(bare) == (r["flops"], r["bytes"])


def test_device_peaks_from_the_table():
    assert device_peak("NVIDIA H200") is DEVICE_PEAKS["H200"]
    assert device_peak("NVIDIA H100 PCIe") is DEVICE_PEAKS["H100 PCIe"]
    assert device_peak("NVIDIA H100 80GB HBM3") is DEVICE_PEAKS["H100"]
    assert device_peak("Some Future GPU") is None and device_peak(None) is None


def test_speedup_table():
    rows = read_rows(BASE)
    sp = speedup_table(rows, "flashinfer_mask", exclude=["causal_baseline"])
    assert set(sp["backend"]) == {"triton_tree", "xformers_tree"}
    assert (sp["speedup"] == sp["baseline_us"] / sp["median_us"]).all()
    # flashinfer mismatches on one T=40 case (no speedup there); xformers skips all 9 T=40 cases
    assert len(sp[sp["backend"] == "triton_tree"]) == 35 and len(sp[sp["backend"] == "xformers_tree"]) == 27
    assert speedup_table(rows, "no_such_backend").empty


def test_mask_overhead_table_has_the_seed_layout():
    rows = read_rows(BASE)
    t = mask_overhead_table(rows)
    assert list(t.columns) == ["Backend", "Batch Size", "Sequence Position", "Seqlen Q", "Time (us)", "Overhead (%)"]
    assert t.iloc[0]["Backend"] == "causal_baseline" and pd.isna(t.iloc[0]["Overhead (%)"])
    assert list(t["Seqlen Q"].iloc[:16:4]) == [1, 4, 13, 40]      # B=1, L=16: T ascending, causal first
    by = {(r["backend"], r["case_id"]): r["median_us"] for r in rows if r["status"] == "pass"}
    tri = next(r for r in rows if r["backend"] == "triton_tree" and r["case"]["context_len"] == 1024)
    want = 100 * (by[("triton_tree", tri["case_id"])] / by[("causal_baseline", tri["case_id"])] - 1)
    got = t[(t["Backend"] == "triton_tree") & (t["Batch Size"] == tri["case"]["batch_size"])
            & (t["Sequence Position"] == 1024) & (t["Seqlen Q"] == tri["tree_sizes"][0])]["Overhead (%)"]
    assert got.item() == pytest.approx(want)


def test_mask_overhead_table_adds_varying_axes():
    rows = read_rows(BASE)[:8]
    other = [{**r, "case": {**r["case"], "page_size": 32}, "case_id": r["case_id"] + "-P32"} for r in rows]
    t = mask_overhead_table(rows + other)
    assert "Page Size" in t.columns and set(t["Page Size"]) == {16, 32}


def test_mask_overhead_table_takes_result_sets_that_repeat_cases():
    """Two result sets with the same cases (say a baseline run and today's): no crash, and
    each row's overhead is against the causal time of its own run."""
    rows = [r for r in read_rows(BASE) if r["status"] == "pass"]
    later = [{**r, "run_id": "later", "median_us": r["median_us"] * (2.0 if r["backend"] == "causal_baseline" else 1.0)}
             for r in rows]
    t = mask_overhead_table(rows + later)
    assert len(t) == 2 * len(mask_overhead_table(rows))
    assert "Run" in t.columns and "later" in set(t["Run"]) and "Run" not in mask_overhead_table(rows).columns
    tri = next(r for r in rows if r["backend"] == "triton_tree" and r["case"]["context_len"] == 1024)
    causal = next(r for r in rows if r["backend"] == "causal_baseline" and r["case_id"] == tri["case_id"])
    got = t[(t["Backend"] == "triton_tree") & (t["Batch Size"] == tri["case"]["batch_size"])
            & (t["Sequence Position"] == 1024) & (t["Seqlen Q"] == tri["tree_sizes"][0])]["Overhead (%)"]
    want = {100 * (tri["median_us"] / causal["median_us"] - 1), 100 * (tri["median_us"] / (2 * causal["median_us"]) - 1)}
    assert sorted(got.round(9)) == sorted(round(w, 9) for w in want)
