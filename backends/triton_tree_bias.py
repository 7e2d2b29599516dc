"""treebench's own Triton kernel with one additive (T, T) fp32 tree bias shared
by the batch (vLLM's Triton `qq_bias` convention: 0 on a node's ancestors and
itself, -inf elsewhere). Every request must verify the same tree."""

from __future__ import annotations

import dataclasses

from treebench.backends.triton_tree import TRITON_CAPABILITIES, TritonTreeBackend
from treebench.harness.adapter.contract import register


@register
class TritonTreeBiasBackend(TritonTreeBackend):
    """The Triton tree kernel reading a shared (T, T) fp32 qq_bias instead of bitmasks."""

    name = "triton_tree_bias"
    capabilities = dataclasses.replace(TRITON_CAPABILITIES, per_request_trees=False)
    mask_mode = "bias"
