"""A deliberately broken GPU backend: its Triton kernel stores 4 TiB past its
output buffer, which makes the GPU raise an illegal memory access. The error is
sticky: every later CUDA call in that process fails too, so only a fresh
process can go on. tests/test_isolate.py runs it under --isolate and checks
that the row names the fault and that the next pairs still run.

Load it as ``--backend tests/gpu_illegal_access.py:IllegalAccess``. Never
register it; never run it without --isolate on a GPU you still need in the
same process.
"""

from __future__ import annotations

import importlib.util

import torch

from treebench.harness.adapter.contract import Capabilities

WILD_OFFSET = 2**40  # elements past the output's start: far outside any allocation
BLOCK = 16


def _kernel():
    """The wild-store Triton kernel, built on first use (triton is optional)."""
    import triton
    import triton.language as tl

    @triton.jit
    def wild_store(out_ptr, offset, BLOCK: tl.constexpr):
        idx = tl.arange(0, BLOCK)
        tl.store(out_ptr + offset + idx, tl.zeros([BLOCK], dtype=tl.float32))  # offset is int64: 4 TiB out

    return wild_store


class IllegalAccess:
    """Launches the wild store, then synchronizes so that the fault surfaces inside the timed callable."""

    name = "illegal_access"
    mask_kind = "tree"
    capabilities = Capabilities(devices=("cuda",))

    def availability(self):
        if importlib.util.find_spec("triton") is None:
            return "triton not installed: pip install triton"
        if not torch.cuda.is_available():
            return "needs a CUDA GPU"
        return None

    def supports(self, case):
        return None

    def prepare(self, inputs):
        kernel = _kernel()
        scratch = torch.zeros(BLOCK, dtype=torch.float32, device=inputs.device)

        def run():
            kernel[(1,)](scratch, WILD_OFFSET, BLOCK=BLOCK)
            torch.cuda.synchronize(inputs.device)  # raises: CUDA error: an illegal memory access was encountered
            return torch.zeros_like(inputs.q)

        return run
