"""The float64 reference as a backend (slow; a sanity check of the plumbing)."""

from __future__ import annotations

from harness.backend import Backend, register
from harness.paged import BatchInputs
from harness.reference import reference_attention


@register
class ReferenceBackend(Backend):
    """Dense masked attention in float64 over the logical K/V, cast to the input dtype.

    Timed: the whole float64 computation (a reference, not a contender).
    """

    name = "reference"

    def prepare(self, inputs: BatchInputs):
        return lambda: reference_attention(inputs).to(inputs.dtype)
