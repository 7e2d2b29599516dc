"""The float64 reference as a backend (slow; a sanity check of the plumbing)."""

from __future__ import annotations

from treebench.harness.adapter.contract import Backend, Capabilities, register
from treebench.harness.model.cases import KV_DTYPES
from treebench.harness.model.paged import BatchInputs
from treebench.harness.model.reference import paged_reference_attention


@register
class ReferenceBackend(Backend):
    """Dense masked attention in float64 over K/V gathered from the paged pool, cast
    to the input dtype (like every backend it never sees the logical K/V). Reads every
    pool dtype: fp8 codes are dequantised exactly (float64(code) * scale).

    Timed: the gather and the whole float64 computation (a reference, not a contender).
    """

    name = "reference"
    capabilities = Capabilities(kv_dtypes=KV_DTYPES)

    def prepare(self, inputs: BatchInputs):
        return lambda: paged_reference_attention(inputs).to(inputs.dtype)
