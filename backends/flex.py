"""PyTorch FlexAttention with a BlockMask built from a tree `mask_mod`.

Upstream: `torch.nn.attention.flex_attention` (torch >= 2.5; checked with 2.11 on
the GPU and 2.13 on the CPU). Compiled with `torch.compile` on the GPU; eager
(the unfused reference path) on the CPU, for small cases only.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import ClassVar
from types import SimpleNamespace

import torch

from treebench.backends._conversions import (dequantise, gather_kv, pad_ragged, padded_rows, padded_tree_masks, tree_mask_mod,
                                  unpad)
from treebench.harness.adapter.contract import Backend, Capabilities, capability_skip, register
from treebench.harness.model.cases import FP8_DTYPES, Case
from treebench.harness.model.paged import BatchInputs

# Eager flex on the CPU is deliberate: drop torch's "use torch.compile" advice once,
# here, rather than paying for a warnings context inside the timed call.
warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")

CPU_MAX_SCORES = 1 << 25  # eager CPU flex materialises (B, Hq, T_max, S_max) fp32 scores: <= 128 MiB
BLOCK_SIZE = 128          # BlockMask block size (FlexAttention's default, both axes)
RECOMPILE_LIMIT = 64      # dynamo's per-function recompile cap (default 8), raised so a sweep stays compiled
DYNAMIC = True            # symbolic shapes from the first compile: a static first compile of some
                          # shapes fails in inductor (suites/findings/flex_static_no_choices.toml)

_COMPILED: dict[bool, Callable] = {}  # dynamic -> flex_attention compiled for CUDA, once per process
_PREPARED = [0]                      # GPU prepares since the last dynamo reset


def _flex_for(device: torch.device, dynamic: bool = DYNAMIC) -> Callable:
    """flex_attention compiled (CUDA; one compiled callable per `dynamic`) or eager (CPU).

    Compiled with `dynamic=True`: every shape is symbolic from the first
    compile. (With dynamo's default, the first shape after a reset compiles
    statically, and on the H200 with torch 2.11 that static compile raised
    inductor's NoValidChoicesError for B 16, T 40 and B 64, T 64 of the seed
    suite: suites/findings/flex_static_no_choices.toml.) After
    `recompile_limit` recompiles dynamo silently runs flex *eagerly*, so the
    limit is raised to RECOMPILE_LIMIT (a process-wide dynamo setting) and
    dynamo's caches are reset every RECOMPILE_LIMIT // 2 GPU prepares (a sweep
    can recompile once per case).
    (Marking B and H static, so that inductor may pick its flex-decoding
    kernel, was tried on the H200 and ran the seed-size case 3x slower.)
    """
    from torch.nn.attention.flex_attention import flex_attention
    if device.type != "cuda":
        return flex_attention
    _PREPARED[0] += 1
    if _PREPARED[0] >= RECOMPILE_LIMIT // 2:
        # Each case's BlockMask and mask_mod closure are new objects, so a sweep may
        # recompile once per case; past the limit dynamo would go eager for the rest
        # of the process (measured: the seed suite's last cases ran 10-20x slower).
        # Dropping dynamo's caches first keeps every case compiled.
        torch._dynamo.reset()
        _COMPILED.clear()
        _PREPARED[0] = 1
    if dynamic not in _COMPILED:
        cfg = torch._dynamo.config
        cfg.recompile_limit = max(cfg.recompile_limit, RECOMPILE_LIMIT)
        _COMPILED[dynamic] = torch.compile(flex_attention, dynamic=dynamic)
    return _COMPILED[dynamic]


@register
class FlexTree(Backend):
    """FlexAttention over K/V gathered out of the pages into a padded batch.

    Pages are gathered, not read in place: the prepare step copies each
    request's logical K/V [0, S_b) through the block table into zero-padded
    (B, Hkv, S_max, D) tensors (untimed; it costs one extra copy of the batch's
    K/V, 2 * sum S_b * Hkv * D elements read and B * S_max * Hkv * D written per
    tensor, plus that memory). torch's experimental
    `torch.nn.attention.experimental._paged_attention.PagedAttention` helper was
    not used: it needs an HND pool (1, Hkv, N * P, D) (a full-pool transpose),
    a KV block size equal to P, and it loads whole pages, so the NaN tail of a
    last page reaches P @ V as 0 * NaN.

    Timed: padding q to (B, Hq, T_max, D), the (compiled) `flex_attention` call
    with `enable_gqa=True`, and unpadding the output to (sum T_b, Hq, D).
    Setup (untimed): the K/V gather, `create_block_mask` (evaluates the tree
    `mask_mod` once), and one warm-up call that triggers compilation.

    Supports per-request trees, ragged contexts, every dtype and P. On the CPU
    it runs eagerly and skips cases whose score matrix exceeds CPU_MAX_SCORES.
    An fp8 pool is dequantised in the untimed gather (float32(code) * scale,
    rounded to the query dtype): FlexAttention then runs on bf16/fp16 K/V, a slow
    correct baseline whose timing does not include reading fp8.
    """

    name = "flex"
    capabilities = Capabilities(devices=("cpu", "cuda"), kv_dtypes=FP8_DTYPES)
    kernel_options: ClassVar[dict | None] = None   # flex_attention's kernel_options (None: its default)
    dynamic: ClassVar[bool] = DYNAMIC              # torch.compile's `dynamic` on the GPU

    @staticmethod
    def _api() -> SimpleNamespace:
        from torch.nn.attention.flex_attention import create_block_mask
        return SimpleNamespace(create_block_mask=create_block_mask, flex_for=_flex_for)

    def availability(self) -> str | None:
        try:
            self._api()
        except ImportError as e:
            return f"torch.nn.attention.flex_attention missing: needs torch >= 2.5 ({e})"
        return super().availability()

    def supports(self, case: Case) -> str | None:
        reason = capability_skip(self.capabilities, case)
        if reason or torch.cuda.is_available():
            return reason
        t_max = max(t.size for t in case.trees())
        s_max = case.context_range()[1] + t_max
        scores = case.batch_size * case.num_q_heads * t_max * s_max
        if scores > CPU_MAX_SCORES:
            return (f"eager FlexAttention on the CPU materialises {scores} scores "
                    f"(B*Hq*T*S), above its limit {CPU_MAX_SCORES}; run it on a GPU")
        return None

    def prepare(self, inputs: BatchInputs) -> Callable[[], torch.Tensor]:
        """Gathers K/V, builds the BlockMask, compiles; returns the timed call."""
        api = self._api()
        a = flex_arguments(inputs, api.create_block_mask)
        flex = api.flex_for(inputs.device, self.dynamic)
        q, ts, t_max = inputs.q, a.tree_sizes, a.t_max
        rows = padded_rows(ts, t_max, device=inputs.device)         # no host copy in the timed call
        extra = {"kernel_options": self.kernel_options} if self.kernel_options else {}

        def run() -> torch.Tensor:
            qp = pad_ragged(q, ts, t_max, rows=rows).transpose(1, 2)  # (B, Hq, T_max, D)
            out = flex(qp, a.k, a.v, block_mask=a.block_mask, scale=inputs.sm_scale,
                       enable_gqa=True, **extra)                       # (B, Hq, T_max, D)
            return unpad(out.transpose(1, 2), ts, rows=rows)          # (sum T, Hq, D)

        run()  # compile (GPU) outside the timed region
        run.kernel = ("flex " + ",".join(f"{k}={v}" for k, v in self.kernel_options.items()) if self.kernel_options
                      else "flex inductor" if inputs.device.type == "cuda" else "flex eager")
        return run


def flex_arguments(inputs: BatchInputs, create_block_mask) -> SimpleNamespace:
    """K/V and BlockMask for `inputs` (pure conversion plus the mask build).

    Returns:
        namespace with k, v: (B, Hkv, S_max, D) zero-padded logical K/V in the query dtype
        (an fp8 pool's codes dequantised: `dequantise`);
        block_mask over (T_max, S_max) from `tree_mask_mod`; tree_sizes [T_b];
        t_max; mask_mod (for tests).
    """
    ls, ts, ss = inputs.host_lists()
    t_max, s_max, dev = max(ts), max(ss), inputs.device
    k, v = gather_kv(inputs.k_cache, inputs.v_cache, inputs.block_table, ss)   # (sum S, Hkv, D)
    k, v = dequantise(k, inputs.k_scale, inputs.dtype), dequantise(v, inputs.v_scale, inputs.dtype)
    kp, vp = (pad_ragged(x, ss, s_max).transpose(1, 2).contiguous() for x in (k, v))  # (B, Hkv, S_max, D)
    mask_mod = tree_mask_mod(torch.tensor(ls, device=dev), torch.tensor(ts, device=dev),
                             padded_tree_masks(inputs.trees, t_max).to(dev))
    block_mask = create_block_mask(mask_mod, len(ts), None, t_max, s_max, device=dev, BLOCK_SIZE=BLOCK_SIZE)
    return SimpleNamespace(k=kp, v=vp, block_mask=block_mask, tree_sizes=ts, t_max=t_max, mask_mod=mask_mod)


@register
class FlexFa4(FlexTree):
    """FlexTree lowered to FlashAttention-4: `flex_attention(..., kernel_options={"BACKEND": "FLASH"})`
    (torch 2.11+, which hands the score/mask mods to `flash_attn.cute`; it raises where that
    lowering is unavailable). GPU only; the same gather, BlockMask and timing as `flex`.

    Compiled with `dynamic=False` (a static compile per shape): under `dynamic=True` the tree
    mask_mod's captured Python int (the clamp bound T_max - 1) becomes a SymInt, and torch
    2.11's FLASH lowering refuses any mask_mod that captures a dynamic scalar ("NYI: score_mod
    or mask_mod captures a dynamic scalar (SymInt/SymFloat)", torch/_inductor/kernel/flex/
    flex_attention.py, `_has_unsupported_captured_scalars`). Captured tensors are fine.
    """

    name = "flex_fa4"
    install_hint = "flash_attn.cute (FlashAttention-4) not installed: pip install flash-attn-4 (torch >= 2.11)"
    capabilities = Capabilities(devices=("cuda",), dtypes=("bfloat16", "float16"), min_compute_capability=(9, 0))
    kernel_options: ClassVar[dict | None] = {"BACKEND": "FLASH"}
    dynamic: ClassVar[bool] = False

    def load_optional(self) -> object:
        import flash_attn.cute  # the FLASH backend of flex_attention imports it
        return flash_attn.cute

    def availability(self) -> str | None:
        reason = super().availability()
        if reason is None and tuple(int(x) for x in torch.__version__.split(".")[:2]) < (2, 11):
            return f"flex_attention's FLASH backend needs torch >= 2.11; this is {torch.__version__}"
        return reason
