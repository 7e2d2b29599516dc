"""A correct dense backend that reads fp8 KV pools, and the deliberately broken ones the default
`treebench check` must catch on fp8 data (scales ignored, swapped or applied twice, NaN slots
read, e4m3 decoded as e5m2, a causal mask on fp8 data, ...).

They are the selftest's (treebench.harness.selftest.mutants_fp8), re-exported under the names
the tests use; none registers itself: ``treebench check --backend tests/fp8_backends.py:Fp8ScalesSwapped``.
"""

from __future__ import annotations

from treebench.harness.selftest.dense import Dense
from treebench.harness.selftest.mutants_fp8 import (
    FP8_MUTANTS as BROKEN_FP8,
    Fp8AlwaysE4m3,
    Fp8CausalMask,
    Fp8DecodedAsE5m2,
    Fp8GroupOf4,
    Fp8NaNSlotsRead,
    Fp8ScalesIgnored,
    Fp8ScalesSwapped,
    Fp8ScaleTwice,
)


class Fp8Correct(Dense):
    """The correct dense backend (it declares every kv_dtype and dequantises code * scale)."""

    name = "fp8_correct"


__all__ = [
    "BROKEN_FP8",
    "Fp8AlwaysE4m3",
    "Fp8CausalMask",
    "Fp8Correct",
    "Fp8DecodedAsE5m2",
    "Fp8GroupOf4",
    "Fp8NaNSlotsRead",
    "Fp8ScaleTwice",
    "Fp8ScalesIgnored",
    "Fp8ScalesSwapped",
]
