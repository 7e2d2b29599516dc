"""The float64 reference as a backend (slow; a sanity check of the plumbing)."""

from __future__ import annotations

from treebench.harness.adapter.contract import Backend, register
from treebench.harness.model.paged import BatchInputs
from treebench.harness.model.reference import reference_attention


@register
class ReferenceBackend(Backend):
    """Dense masked attention in float64 over the logical K/V, cast to the input dtype.

    Timed: the whole float64 computation (a reference, not a contender).
    """

    name = "reference"

    def prepare(self, inputs: BatchInputs):
        return lambda: reference_attention(inputs).to(inputs.dtype)
