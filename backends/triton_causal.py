"""treebench's own Triton kernel in causal-only mode: the new T_b tokens attend
causally (j <= i) with no tree mask. The baseline that shows what tree masking
costs; the runner checks it against a causal reference (`inputs.causal()`)."""

from __future__ import annotations

from treebench.backends.triton_tree import TritonTreeBackend
from treebench.harness.adapter.contract import register


@register
class TritonCausalBackend(TritonTreeBackend):
    """The Triton tree kernel with the tree test replaced by j <= i."""

    name = "triton_causal"
    mask_kind = "causal"
    mask_mode = "causal"
