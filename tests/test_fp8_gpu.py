"""Each fp8 peer adapter on a tiny fp8 KV case against the float64 reference, on the GPU.

Skips without CUDA, and per adapter without its package (the adapter's `availability()`).
Run on the GPU host from the repo root:

    source .gpu/env.sh; PYTHONPATH=. python -m pytest -q tests/test_fp8_gpu.py

Every case has unequal power-of-two scales (k 0.25, v 0.5) except where an adapter takes one
scale for K and V (xqa: both 0.5), a GQA 48/4 case with a tiny head dim where the adapter takes
it (FlashInfer #2208), and a "mean" values case (Q = K = 0) that tells a wrong mask apart at
fp8 tolerance (FlashInfer PR #4199). flashinfer_xqa on SM90 computes its MMAs in e4m3
(mha_sm90.cu: Q and the probabilities rounded to fp8 too), so it is held to a looser bound,
XQA_FP8_MATH (see docs/peers.md), and its errors are printed.
"""

from __future__ import annotations

import pytest
import torch

import treebench.backends  # noqa: F401  (registers the built-in adapters)
from treebench.harness.adapter.contract import REGISTRY
from treebench.harness.model.cases import Case
from treebench.harness.model.compare import compare, compare_lse
from treebench.harness.model.paged import build_inputs
from treebench.harness.model.reference import reference_attention
from treebench.harness.run.verify import check_output, lse_base, returns_lse

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

PEERS = ("vllm_triton", "flashinfer_mask", "flashinfer_xqa", "flex", "reference", "torch_sdpa")
BASE = dict(batch_size=3, context_len=40, tree="full:2:2", num_q_heads=8, num_kv_heads=2, head_dim=64,
            dtype="bfloat16", page_size=16, k_scale=0.25, v_scale=0.5)
CASES = {
    "e4m3": dict(kv_dtype="float8_e4m3fn"),
    "e5m2": dict(kv_dtype="float8_e5m2"),
    "e4m3 fp16 queries": dict(kv_dtype="float8_e4m3fn", dtype="float16"),
    "e4m3 mean values": dict(kv_dtype="float8_e4m3fn", values="mean"),
    "e4m3 ragged mixed": dict(kv_dtype="float8_e4m3fn", context_len="ragged:0-50", tree_per_request="mixed"),
    "e4m3 GQA 48/4": dict(kv_dtype="float8_e4m3fn", num_q_heads=48, num_kv_heads=4, head_dim=16),
    "e4m3 equal scales": dict(kv_dtype="float8_e4m3fn", k_scale=0.5, v_scale=0.5),
}
XQA_FP8_MATH = 0.15   # atol = rtol for xqa's e4m3 MMAs: Q and P rounded to 3 mantissa bits (2^-4 relative)


def _case(name: str, backend) -> Case:
    kw = {**BASE, **CASES[name]}
    if backend.name == "flashinfer_xqa":                  # one kv_scale for K and V
        kw["k_scale"] = kw["v_scale"] = 0.5
    return Case(**kw)


@pytest.mark.parametrize("case_name", sorted(CASES))
@pytest.mark.parametrize("name", PEERS)
def test_fp8_peer_matches_the_reference(name, case_name):
    backend = REGISTRY[name]()
    why = backend.availability()
    if why:
        pytest.skip(why)
    case = _case(case_name, backend)
    why = backend.supports(case)
    if why:
        pytest.skip(why)
    inputs = build_inputs(case, "cuda")
    ref, ref_lse = reference_attention(inputs, return_lse=True)
    out, lse = check_output(backend.prepare(inputs.for_backend())(), inputs, returns_lse(backend),
                            lse_base(backend))   # (out, lse) where the backend returns its LSE
    torch.cuda.synchronize()
    loose = XQA_FP8_MATH if name == "flashinfer_xqa" and torch.cuda.get_device_capability()[0] == 9 else None
    rec = compare(out, ref, inputs.qo_indptr, case.dtype, atol=loose, rtol=loose, kv_dtype=case.kv_dtype)
    print(f"{name} {case_name}: max_abs_err {rec.max_abs_err:.4g} (atol {rec.atol:g}), "
          f"mismatch {rec.mismatch_frac:.3g}")
    assert rec.nonfinite == 0 and rec.passed, rec
    if lse is not None:
        lrec = compare_lse(lse, ref_lse, inputs.qo_indptr, case.dtype)
        assert lrec.passed, lrec.reason()
