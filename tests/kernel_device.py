"""Where the Triton kernel tests run: a CUDA GPU, else Triton's CPU interpreter.

Import it before anything that imports Triton: without CUDA it sets TRITON_INTERPRET=1
(Triton reads it at import). A module importing it is skipped, as a whole, where Triton
is missing or where there is no GPU and the interpreter was turned off.
"""

from __future__ import annotations

import os

import pytest
import torch

from treebench.harness.model.paged import triton_interpret

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

triton = pytest.importorskip("triton")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu" and not triton_interpret():
    pytest.skip("no CUDA GPU and TRITON_INTERPRET is off", allow_module_level=True)

TINY = dict(num_q_heads=4, num_kv_heads=2, head_dim=64)    # G 2 with Hkv 2


def assert_graph_replays(ta, expect: torch.Tensor, replays: int = 1) -> None:
    """Captures the callable `ta` in a CUDA graph and replays it `replays` times, each time
    after filling `ta.out` with NaN, asserting the output equals `expect` bit for bit."""
    from treebench.harness.timing.timers import capture_graph
    graph = capture_graph(ta)
    for _ in range(replays):
        ta.out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(ta.out, expect, rtol=0, atol=0)


def run_checked(case, mode: str = "tree", **kw):
    """Runs the kernel on `case` (`TreeAttention(inputs, mode, return_lse=True, **kw)`, its output
    first filled with NaN so every element must be written) and asserts output and LSE against the
    float64 reference; returns the TreeAttention. mode "causal" runs the batch's chains."""
    from treebench.harness.model.compare import compare
    from treebench.harness.model.paged import build_inputs
    from treebench.harness.model.reference import reference_attention
    from treebench.kernels.tree_attention import TreeAttention

    inputs = build_inputs(case, DEVICE)
    if mode == "causal":
        inputs = inputs.causal()
    ta = TreeAttention(inputs, mode, return_lse=True, **kw)
    ta.out.fill_(float("nan"))
    out = ta()
    ref, ref_lse = reference_attention(inputs, return_lse=True)
    rec = compare(out, ref, inputs.qo_indptr, case.dtype)
    assert rec.passed, rec
    torch.testing.assert_close(ta.lse.double(), ref_lse, atol=1e-4, rtol=1e-4)
    return ta
