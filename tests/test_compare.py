"""The correctness record: tolerances, NaN handling, worst element mapping."""

from __future__ import annotations

import pytest
import torch

from treebench.harness.model.compare import TOLERANCES, compare


def _ref(seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(7, 3, 5, generator=g, dtype=torch.float64)   # (sum T=7, Hq=3, D=5)


QO = torch.tensor([0, 4, 7], dtype=torch.int32)   # B=2: T_0 = 4, T_1 = 3


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_rounded_reference_passes(dtype):
    ref = _ref()
    rec = compare(ref.to(getattr(torch, dtype)), ref, QO, dtype)
    assert rec.passed and rec.mismatch_frac == 0 and rec.nonfinite == 0
    assert (rec.atol, rec.rtol) == TOLERANCES[dtype]


def test_worst_element_maps_to_request_node_head():
    ref = _ref()
    out = ref.clone()
    out[5, 2, 1] += 1.0            # row 5 = request 1, node 1; head 2
    rec = compare(out, ref, QO, "float32")
    assert not rec.passed
    assert rec.worst == (1, 1, 2)
    assert rec.mismatch_frac == pytest.approx(1 / ref.numel())
    assert rec.max_abs_err == pytest.approx(1.0)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_nonfinite_is_always_a_mismatch(bad):
    ref = _ref()
    out = ref.clone()
    out[2, 0, 0] = bad
    rec = compare(out, ref, QO, "bfloat16", atol=1e9, rtol=1e9)
    assert not rec.passed and rec.nonfinite == 1 and rec.worst == (0, 2, 0)


def test_shape_mismatch_raises():
    with pytest.raises(ValueError, match="shape"):
        compare(torch.zeros(7, 3, 4), _ref(), QO, "float32")
