"""The float64 reference as a backend (slow; a sanity check of the plumbing)."""

from __future__ import annotations

from treebench.harness.adapter.contract import Backend, register
from treebench.harness.model.paged import BatchInputs
from treebench.harness.model.reference import paged_reference_attention


@register
class ReferenceBackend(Backend):
    """Dense masked attention in float64 over K/V gathered from the paged pool, cast
    to the input dtype (like every backend it never sees the logical K/V).

    Timed: the gather and the whole float64 computation (a reference, not a contender).
    """

    name = "reference"

    def prepare(self, inputs: BatchInputs):
        return lambda: paged_reference_attention(inputs).to(inputs.dtype)
