"""FlashAttention-4 probe: `flash_attn.cute.flash_attn_varlen_func` called directly (not through
the adapter) on one tiny paged batch, causal and then with the tree mask_mod, each compared with
the float64 dense reference. For the GPU host, in under a minute:

    source .fa4b/env.sh; PYTHONPATH=. python lab/fa4_probe.py

Batch: B 2, L 150, tree full:2:2 (T 7), Hq 4, Hkv 2, D 64, bf16, shuffled pages. Each step is
one (mask, P, pool) triple:
  - P 16: FA4's page-by-page path (P is not its KV tile), the harness pool (unused slots NaN);
  - P 128 with the NaN pool: the TMA path, which loads each page whole; an output that is
    non-finite while the LSE is right says the NaN tail of the last page reaches P @ V as 0 * NaN;
  - P 128 with the last pages' tails zeroed (`fa4_finite_tails`): what the adapter runs.
Prints, per step: the path, the output's largest |err| and non-finite count, the LSE's largest
|err|, and whether the harness's compare() passes it; a step that raises prints its exception
and the last frames. No step starts after 40 s (CuTe compiles are the cost).
"""

from __future__ import annotations

import importlib.metadata
import sys
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))       # the repository root: treebench

from treebench.backends.fa4_tree import (cute_tree_mask_mod, fa4_finite_tails, fa4_kv_tile, fa4_tree_aux,
                                         fa4_uses_tma, mask_mod_takes_seqlen_info)
from treebench.harness.model.cases import Case
from treebench.harness.model.compare import compare, compare_lse
from treebench.harness.model.paged import build_inputs
from treebench.harness.model.reference import reference_attention

BUDGET_S = 40.0        # no step starts past this: a CuTe compile takes seconds


def versions() -> str:
    found = []
    for dist in ("flash-attn-4", "nvidia-cutlass-dsl", "quack-kernels", "torch"):
        try:
            found.append(f"{dist} {importlib.metadata.version(dist)}")
        except importlib.metadata.PackageNotFoundError:
            found.append(f"{dist} not installed")
    return ", ".join(found)


def step(varlen, mask_mod, name: str, inputs, causal: bool, zero_tails: bool) -> None:
    """One call of `varlen` (FA4's) on `inputs` (BatchInputs), with `mask_mod()` (the tree's) unless
    `causal`, compared with the reference."""
    if causal:
        inputs = inputs.causal()
    ref, ref_lse = reference_attention(inputs, return_lse=True)
    _, ts, ss = inputs.host_lists()
    hq, hkv, d = inputs.q.shape[1], inputs.k_cache.shape[2], inputs.q.shape[2]
    k, v = fa4_finite_tails(inputs) if zero_tails else (inputs.k_cache, inputs.v_cache)
    kw = {"cu_seqlens_q": inputs.qo_indptr.to(torch.int32).contiguous(), "max_seqlen_q": max(ts),
          "max_seqlen_k": max(ss), "seqused_k": inputs.seq_lens.to(torch.int32).contiguous(),
          "page_table": inputs.block_table.to(torch.int32).contiguous(), "softmax_scale": inputs.sm_scale,
          "pack_gqa": hq > hkv, "return_lse": True}
    if causal:
        kw["causal"] = True
    on_gpu = inputs.device.type == "cuda"
    major = torch.cuda.get_device_capability()[0] if on_gpu else 10
    tile = fa4_kv_tile(d, causal, major)
    path = f"{'tma' if fa4_uses_tma(inputs.page_size, d, causal, major) else 'paged'} (sm{major}x, KV tile {tile})"
    t0 = time.perf_counter()
    try:
        if not causal:
            kw.update(mask_mod=mask_mod(), aux_tensors=fa4_tree_aux(inputs))
        out, lse = varlen(inputs.q, k, v, **kw)
        if on_gpu:
            torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001 -- a probe reports every failure and goes on
        print(f"{name}: {path}: raised {type(e).__name__}: {e}")
        print("  " + "\n  ".join(traceback.format_exc().strip().splitlines()[-8:]))
        return
    secs = time.perf_counter() - t0
    lse_rows = lse.transpose(0, 1) if tuple(lse.shape) == (hq, out.shape[0]) else lse
    bad = ~out.isfinite()
    err = (out.double() - ref).abs().masked_fill(bad, 0)
    lse_err = (lse_rows.double() - ref_lse).abs()
    ok_out = compare(out, ref, inputs.qo_indptr, inputs.case.dtype).passed
    ok_lse = compare_lse(lse_rows, ref_lse, inputs.qo_indptr, inputs.case.dtype).passed if lse is not None else False
    first = f", first at flat index {int(bad.flatten().nonzero()[0])}" if bad.any() else ""
    print(f"{name}: {path}: out {tuple(out.shape)} max finite |err| {float(err.max()):.3g}, "
          f"non-finite {int(bad.sum())}/{out.numel()}{first}; lse {tuple(lse.shape)} max |err| "
          f"{float(lse_err.max()):.3g}; compare: out {'pass' if ok_out else 'FAIL'}, "
          f"lse {'pass' if ok_lse else 'FAIL'} ({secs:.1f} s with compile)")


def main() -> int:
    start = time.perf_counter()
    if not torch.cuda.is_available():
        print("fa4_probe: needs a CUDA GPU (none is visible here)", file=sys.stderr)
        return 2
    try:
        from flash_attn.cute import flash_attn_varlen_func, mask
    except ImportError as e:
        print(f"fa4_probe: flash_attn.cute not importable ({e}): source .fa4b/env.sh first", file=sys.stderr)
        return 2
    print(f"{torch.cuda.get_device_name()} sm_{''.join(map(str, torch.cuda.get_device_capability()))}; "
          f"{versions()}")
    print(f"mask_mod signature: {'with' if mask_mod_takes_seqlen_info(mask) else 'without'} seqlen_info "
          f"(flash_attn.cute.mask has call_mask_mod: {hasattr(mask, 'call_mask_mod')})")
    axes = {"batch_size": 2, "context_len": 150, "tree": "full:2:2", "num_q_heads": 4, "num_kv_heads": 2,
            "head_dim": 64, "dtype": "bfloat16", "layout": "shuffled"}
    batches = {p: build_inputs(Case(**axes, page_size=p), "cuda") for p in (16, 128)}
    tree_mask = []                                                   # built (CuTe) on first use, once

    def mask_mod():
        if not tree_mask:
            tree_mask.append(cute_tree_mask_mod(mask_mod_takes_seqlen_info(mask)))
        return tree_mask[0]

    steps = [("causal P16 NaN pool", True, 16, False), ("causal P128 NaN pool", True, 128, False),
             ("causal P128 zeroed tails", True, 128, True), ("tree P16 NaN pool", False, 16, False),
             ("tree P128 zeroed tails", False, 128, True), ("tree P128 NaN pool", False, 128, False)]
    for name, causal, p, zero in steps:
        if time.perf_counter() - start > BUDGET_S:
            print(f"{name}: not run (the {BUDGET_S:.0f} s budget is spent)")
            continue
        step(flash_attn_varlen_func, mask_mod, name, batches[p], causal, zero)
    print(f"done in {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
