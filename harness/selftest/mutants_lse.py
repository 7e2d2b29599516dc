"""Mutants of the LSE as a checked output: the faults a kernel that returns its log-sum-exp
is prone to, each one step of `DenseLse.lse_out` (treebench.harness.selftest.variants)
overridden.

A backend with ``returns_lse = True`` (treebench.harness.adapter.contract.Backend) returns
``(out, lse)``, lse (sum T_b, Hq) float32 in natural log; the check compares it with the
reference's (treebench.harness.model.compare.compare_lse). The faults:

- `Log2Lse`: the LSE in base 2 (FlashInfer's kernels keep it so: ``backends/_lse.py``), x 1.44;
- `TransposedLse`: an (Hq, sum T_b) buffer handed out as (sum T_b, Hq) (FlashAttention-4's varlen
  LSE is (Hq, total_q): flash_attn/cute/interface.py, ``lse_shape``);
- `WrongRequestLse`: every request's LSE rows taken from the next request's.
"""

from __future__ import annotations

import math

from treebench.harness.selftest.variants import DenseLse


class Log2Lse(DenseLse):
    name = "mutant_lse_log2"
    description = "returns the LSE in base 2 (log2 sum exp), not the natural log"
    axis = "any case"

    def lse_out(self, inputs, lses):
        return super().lse_out(inputs, lses) / math.log(2.0)


class TransposedLse(DenseLse):
    name = "mutant_lse_transposed"
    description = "an (Hq, sum T_b) LSE buffer returned as (sum T_b, Hq)"
    axis = "any case"

    def lse_out(self, inputs, lses):
        lse = super().lse_out(inputs, lses)                                # (sum T, Hq)
        return lse.T.contiguous().view(lse.shape)                          # (Hq, sum T) bytes read as (sum T, Hq)


class WrongRequestLse(DenseLse):
    name = "mutant_lse_wrong_request"
    description = "request b's LSE rows taken from request b + 1's (mod B)"
    axis = "batches"

    def lse_out(self, inputs, lses):
        return super().lse_out(inputs, lses).roll(-lses[0].shape[0], dims=0)   # rows shifted by T_0


LSE_MUTANTS = (Log2Lse, TransposedLse, WrongRequestLse)
