"""The LSE as a checked output: compare_lse's record, the contract's (out, lse) shape, and
`treebench check` failing a backend whose LSE is in log2, transposed or another request's,
with a reason naming the LSE and where it is wrong."""

from __future__ import annotations

import math
from dataclasses import replace
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from treebench.harness.model.cases import Case
from treebench.harness.model.compare import LSE_TOLERANCES, compare_lse
from treebench.harness.model.paged import build_inputs
from treebench.harness.model.reference import reference_attention
from treebench.harness.run.config import RunConfig
from treebench.harness.run.pair import CaseData, run_case_backend
from treebench.harness.selftest.mutants_lse import Log2Lse, TransposedLse, WrongRequestLse
from treebench.harness.selftest.variants import DenseLse, SplitKVLse

ROOT = Path(__file__).resolve().parent.parent
NEG_INF = float("-inf")
CASE = Case(batch_size=3, context_len="ragged:0-20", tree="full:2:2", num_q_heads=4, num_kv_heads=2, head_dim=32)


def test_compare_lse_maps_the_worst_entry_to_request_node_head():
    ref = torch.zeros(7, 3, dtype=torch.float64)
    lse = ref.float().clone()
    lse[5, 2] = 0.5                                            # request 1 (rows 4..6), node 1, head 2
    rec = compare_lse(lse, ref, torch.tensor([0, 4, 7]), "bfloat16")
    assert not rec.passed and rec.worst == (1, 1, 2) and rec.max_abs_err == pytest.approx(0.5)
    assert rec.reason().startswith("lse: max |err| 0.5 at (request 1, node 1, head 2)")


def test_compare_lse_matches_empty_rows_and_refuses_other_infinities():
    ref = torch.tensor([[NEG_INF, 1.0]], dtype=torch.float64)
    ptr = torch.tensor([0, 1])
    assert compare_lse(torch.tensor([[NEG_INF, 1.0]]), ref, ptr, "float16").passed
    for bad in (float("inf"), float("nan"), 0.0):              # FlashAttention-2 writes +inf for an empty row
        rec = compare_lse(torch.tensor([[bad, 1.0]]), ref, ptr, "float16")
        assert not rec.passed and math.isinf(rec.max_abs_err)


@pytest.mark.parametrize("dtype", sorted(LSE_TOLERANCES))
def test_compare_lse_tolerance_passes_rounding_and_fails_log2(dtype):
    inputs = build_inputs(replace(CASE, dtype=dtype))
    _, ref = reference_attention(inputs, return_lse=True)
    assert compare_lse(ref.float(), ref, inputs.qo_indptr, dtype).passed
    assert not compare_lse((ref / math.log(2)).float(), ref, inputs.qo_indptr, dtype).passed


def row_of(backend, case=CASE, mode="check") -> dict:
    config = RunConfig(mode=mode, device="cpu", quiet=True, check_memory=False)
    return run_case_backend(backend, case, CaseData(case), None, torch.device("cpu"), config)


@pytest.mark.parametrize("mode", ["check", "run"])
@pytest.mark.parametrize("cls", [DenseLse, SplitKVLse])
def test_a_correct_lse_passes_and_its_error_is_stored(cls, mode):
    row = row_of(cls(), mode=mode)
    assert row["status"] == "pass", row["reason"]
    assert row["lse_max_abs_err"] is not None and row["lse_max_abs_err"] < 1e-4


@pytest.mark.parametrize("cls", [Log2Lse, TransposedLse, WrongRequestLse])
def test_a_wrong_lse_is_a_mismatch_that_names_the_lse(cls):
    row = row_of(cls())
    assert row["status"] == "mismatch" and "lse: max |err|" in row["reason"] and "at (request" in row["reason"]
    assert row["max_abs_err"] < 0.02                           # the output itself is right


def test_declaring_returns_lse_and_returning_a_tensor_is_an_error_row():
    class Forgets(DenseLse):
        def prepare(self, inputs):
            fn = super().prepare(inputs)
            return lambda: fn()[0]

    row = row_of(Forgets())
    assert row["status"] == "error" and "expected (out, lse)" in row["reason"]


def test_an_lse_of_the_wrong_shape_or_dtype_is_an_error_row():
    class Float64Lse(DenseLse):
        def prepare(self, inputs):
            fn = super().prepare(inputs)
            return lambda: (fn()[0], fn()[1].double())

    row = row_of(Float64Lse())
    assert row["status"] == "error" and "torch.float32" in row["reason"]


def test_the_kernel_attribute_of_the_prepared_callable_is_in_the_row():
    class Named(DenseLse):
        def prepare(self, inputs):
            fn = super().prepare(inputs)

            def run():
                return fn()
            run.kernel = "dense lse"
            return run

    assert row_of(Named(), mode="run")["kernel"] == "dense lse"
    assert row_of(Named())["kernel"] == "dense lse"
    assert row_of(DenseLse())["kernel"] is None


@pytest.mark.parametrize("cls", ["Log2Lse", "TransposedLse", "WrongRequestLse"])
def test_check_cli_exits_1_on_a_wrong_lse(cls, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "treebench", "check", "--suite", "smoke",
                           "--backend", f"harness/selftest/mutants_lse.py:{cls}", "--out", str(tmp_path / "r.jsonl")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "lse: max |err|" in proc.stdout + proc.stderr


def test_a_nan_lse_is_counted_as_non_finite():
    import torch
    from treebench.harness.model.compare import compare_lse
    ref = torch.tensor([[0.5, float("-inf")], [1.0, 2.0]], dtype=torch.float64)
    lse = torch.tensor([[float("nan"), float("-inf")], [1.0, float("inf")]])
    rec = compare_lse(lse, ref, torch.tensor([0, 2]), "bfloat16")
    assert not rec.passed and rec.nonfinite == 2 and rec.reason().endswith(", 2 non-finite")
    assert compare_lse(ref.float(), ref, torch.tensor([0, 2]), "bfloat16").nonfinite == 0   # -inf == -inf: right
