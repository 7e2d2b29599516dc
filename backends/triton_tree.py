"""treebench's own Triton tree-attention kernel, per-request bitmask mode.

Each request's tree mask is packed into int64 words, (sum T_b, ceil(T/64)),
so every request in the batch may carry its own tree (EAGLE-2-style dynamic
trees). The kernel is in kernels/tree_attention.py; docs/kernel.md explains it.
"""

from __future__ import annotations

import importlib.util

import torch

from treebench.harness.adapter.contract import Backend, Capabilities, register
from treebench.harness.errors import ConfigError
from treebench.harness.model.cases import FP8_DTYPES
from treebench.harness.model.paged import BatchInputs, triton_interpret
from treebench.kernels.options import KernelOptions
from treebench.kernels.tree_attention_plan import HEAD_DIMS

TRITON_CAPABILITIES = Capabilities(
    dtypes=("bfloat16", "float16"),
    page_size_multiple=1,                   # any P >= 1: tiles that span pages gather per token
    kv_dtypes=FP8_DTYPES,                   # fp8 pools: codes cast after the load, scales folded in
    head_dims=HEAD_DIMS,
    max_tree_size=256,
    min_compute_capability=(8, 0),          # bf16 tensor-core dot
)


def triton_availability() -> str | None:
    """None when the Triton kernels can run here (a CUDA GPU, or TRITON_INTERPRET=1), else why not."""
    if importlib.util.find_spec("triton") is None:
        return "triton not installed: pip install -e '.[triton]' from the treebench checkout (Triton 3.6 to 3.9)"
    if triton_interpret():
        return None
    if not torch.cuda.is_available():
        return "needs a CUDA GPU (or TRITON_INTERPRET=1 for the CPU interpreter)"
    cc = torch.cuda.get_device_capability()
    assert TRITON_CAPABILITIES.min_compute_capability is not None
    if cc < TRITON_CAPABILITIES.min_compute_capability:
        return f"needs compute capability >= 8.0 (bf16 tensor cores), this GPU is {cc}"
    return None


@register
class TritonTreeBackend(Backend):
    """Our Triton kernel: GQA-packed rows, split-KV with an LSE merge, per-request bitmask trees.

    Args:
        options: the kernel's launch choices (`treebench.kernels.options.KernelOptions`); the
            default, KernelOptions(), is the tuned launches the registry runs. A lab
            script builds a backend with another to time a variant.
    """

    name = "triton_tree"
    capabilities = TRITON_CAPABILITIES
    mask_mode = "tree"
    returns_lse = True      # TreeAttention(return_lse=True) writes lse (sum T_b, Hq) fp32, natural log
    runs_triton = True

    def __init__(self, options: KernelOptions | None = None):
        """Raises ConfigError: options not a KernelOptions."""
        if options is not None and not isinstance(options, KernelOptions):
            raise ConfigError(f"options={options!r}: must be a KernelOptions (treebench.kernels.options)")
        self.options = options or KernelOptions()

    def availability(self) -> str | None:
        return triton_availability()

    def prepare(self, inputs: BatchInputs):
        """Plans, packs the masks, allocates every buffer and launches once (TreeAttention with
        return_lse=True); returns a zero-argument callable launching it and returning
        (out (sum T_b, Hq, D), lse (sum T_b, Hq) fp32), whose `kernel` is the launch's."""
        from treebench.kernels.tree_attention import TreeAttention

        return WithLse(TreeAttention(inputs, self.mask_mode, return_lse=True, options=self.options))


class WithLse:
    """A prepared TreeAttention as the contract's (out, lse) callable; `kernel` is the launch's,
    and every other attribute (plan, options, kv_desc, ...) reads through to the launch."""

    def __init__(self, launch):
        self.launch = launch

    def __getattr__(self, name: str):
        if name == "launch":                       # not set yet (copy, pickle): no recursion
            raise AttributeError(name)
        return getattr(self.launch, name)

    @property
    def kernel(self) -> str:
        """The path the launch names (its `kernel`, "" when it names none)."""
        return str(getattr(self.launch, "kernel", "") or "")

    def __call__(self):
        """Launches; returns (out, lse), the launch's own buffers."""
        return self.launch(), self.launch.lse
