"""Where the warp-specialised kernel leaves the float64 reference's tolerance: one GPU call that
runs the same batches through it with one factor changed at a time and prints each run's error.

    python lab/ws_fp8_probe.py [--ws3] > $OUT/ws-fp8-probe.txt

Variants (Hq 32, Hkv 8, D 128, bf16 queries unless named; ws=True; "every code": every used pool
slot of K and/or V rewritten with the finite fp8 codes in turn, k_scale 2^-6 / v_scale 2^-8 for
e4m3, as `tests/test_kernel_fp8.py`'s every-code test; `KernelOptions.ws_fp8` on throughout):
- bf16 pools with logit_scale 1, 4 and 16 (scores that pass the lazy rescale's threshold of 8
  log2 units), the 27-node tree: the bf16 kernel's rescale path;
- the every-code batch through the tl kernel (ws=False) and the warp-specialised one, with its
  intra-warpgroup pipelining on and off, codes in K only, V only and both;
- the fp16-query e4m3 batch and B 64, L 2048 medusa over e4m3 (P 128), five runs each, pipelining
  on and off: is the error the same every run (a wrong value) or not (a race)?
- with --ws3, only the 3-consumer-warpgroup build (WS3_FP8, full:3:3's 160 rows): the six-request
  batch over e5m2 and e4m3 with 3 splits at P 128 and 16, and B 64, L 2048 over both, five runs
  each, against the tl kernel on the same batch.

Each line: variant, kernel, max abs error, the fraction of elements out of tolerance, the worst
element (request, token, head) and pass / FAIL. Needs an sm_90 GPU.
"""

from __future__ import annotations

import dataclasses
import sys

import torch

from treebench.harness.model.cases import Case
from treebench.harness.model.compare import compare
from treebench.harness.model.paged import build_inputs
from treebench.harness.model.reference import reference_attention
from treebench.kernels.options import KernelOptions
from treebench.kernels.tree_attention import TreeAttention

GQA4 = {"num_q_heads": 32, "num_kv_heads": 8, "head_dim": 128}
SIX = "list:0,1,63,64,100,1000"
REPEATS = 5                           # runs of each batch that raced
WS_FP8 = KernelOptions(ws_fp8=True)   # off by default; no effect on bf16 / fp16 pools


def every_code(inputs, fmt: str, pools: str) -> None:
    """Rewrites the used slots of the named pools ("k", "v" or "kv") with the finite codes in turn."""
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    finite = codes[codes.view(getattr(torch, fmt)).float().isfinite()].cuda()
    for name in pools:
        pool = inputs.k_cache if name == "k" else inputs.v_cache
        used = ~pool.float().isnan()
        pool.view(torch.uint8)[used] = finite[torch.arange(int(used.sum()), device="cuda") % len(finite)]
    inputs.logical_from_pool()                  # the reference reads the logical copies


def run(label: str, inputs, case: Case, strict: bool = False, options: KernelOptions = WS_FP8, **kw) -> None:
    """One variant's line (strict: the query dtype's tolerance, not the fp8 one)."""
    try:
        ta = TreeAttention(inputs.for_backend(), options=options, **kw)
        ta.out.fill_(float("nan"))
        out = ta()
        torch.cuda.synchronize()
    except Exception as e:   # noqa: BLE001 -- a refusal or failure is a line, the probe goes on
        print(f"{label:58s} error {type(e).__name__}: {str(e).splitlines()[0][:120]}", flush=True)
        return
    rec = compare(out, reference_attention(inputs), inputs.qo_indptr, case.dtype,
                  kv_dtype=None if strict else case.kv_dtype)
    print(f"{label:58s} {ta.kernel:24s} err {rec.max_abs_err:.4g} bad {rec.mismatch_frac:.3g} "
          f"worst {rec.worst} {'pass' if rec.passed and not rec.nonfinite else 'FAIL'}", flush=True)


def ws3() -> None:
    """The --ws3 variants."""
    for fmt in ("float8_e5m2", "float8_e4m3fn"):
        cases = [(f"full:3:3 six {fmt[6:]} P{p} splits 3", 3,
                  Case(batch_size=6, context_len=SIX, tree="full:3:3", page_size=p, kv_dtype=fmt, k_scale=0.25,
                       v_scale=0.5, **GQA4)) for p in (128, 16)]
        cases.append((f"full:3:3 B64 L2048 {fmt[6:]} P128", None,
                      Case(batch_size=64, context_len=2048, tree="full:3:3", page_size=128, kv_dtype=fmt,
                           k_scale=0.25, v_scale=0.5, layout="shuffled", **GQA4)))
        for name, splits, case in cases:
            inputs = build_inputs(case, "cuda")
            for i in range(REPEATS):
                run(f"{name} ws run {i}", inputs, case, ws=True, num_splits=splits)
            run(f"{name} tl", inputs, case, ws=False, num_splits=splits)


def main() -> None:
    if sys.argv[1:] == ["--ws3"]:
        return ws3()
    if sys.argv[1:]:
        print(f"ws_fp8_probe: unknown arguments {' '.join(sys.argv[1:])}; use no arguments or --ws3", file=sys.stderr)
        raise SystemExit(2)
    pipe_off = KernelOptions(ws_fp8=True, ws_pipe=False)
    for ls in (1.0, 4.0, 16.0):
        case = Case(batch_size=6, context_len=SIX, tree="vllm:pr_27", page_size=128, logit_scale=ls, **GQA4)
        inputs = build_inputs(case, "cuda")
        run(f"bf16 logit_scale {ls:g} ws", inputs, case, ws=True, num_splits=1)
        run(f"bf16 logit_scale {ls:g} ws pipe off", inputs, case, ws=True, num_splits=1, options=pipe_off)
        run(f"bf16 logit_scale {ls:g} tl", inputs, case, ws=False, num_splits=1)
    for fmt, ks, vs in (("float8_e4m3fn", 2.0 ** -6, 2.0 ** -8), ("float8_e5m2", 2.0 ** -13, 2.0 ** -15)):
        case = Case(batch_size=6, context_len=SIX, tree="vllm:pr_27", page_size=128, kv_dtype=fmt,
                    k_scale=ks, v_scale=vs, **GQA4)
        for pools in ("kv", "k", "v"):
            inputs = build_inputs(case, "cuda")
            every_code(inputs, fmt, pools)
            tag = f"{fmt[6:]} every code in {pools}"
            run(f"{tag} tl", inputs, case, strict=True, ws=False)
            run(f"{tag} ws", inputs, case, strict=True, ws=True)
            run(f"{tag} ws pipe off", inputs, case, strict=True, ws=True, options=pipe_off)
            run(f"{tag} ws splits 1", inputs, case, strict=True, ws=True, num_splits=1)
    fp16 = Case(batch_size=6, context_len=SIX, tree="vllm:pr_27", page_size=128, kv_dtype="float8_e4m3fn",
                k_scale=0.25, v_scale=0.5, dtype="float16", **GQA4)
    medusa = Case(batch_size=64, context_len=2048, tree="medusa:mc_sim_7b_63", page_size=128,
                  kv_dtype="float8_e4m3fn", k_scale=0.25, v_scale=0.5, layout="shuffled", **GQA4)
    for name, case, splits in (("fp16 queries e4m3", fp16, 2), ("medusa B64 L2048 e4m3", medusa, None)):
        inputs = build_inputs(case, "cuda")
        for i in range(REPEATS):
            run(f"{name} ws run {i}", inputs, case, ws=True, num_splits=splits)
        run(f"{name} ws pipe off", inputs, case, ws=True, num_splits=splits, options=pipe_off)
        run(f"{name} tl", inputs, case, ws=False, num_splits=splits)
        twin = dataclasses.replace(case, kv_dtype=None, k_scale=1.0, v_scale=1.0)
        t_in = build_inputs(twin, "cuda")
        run(f"{name}: bf16/fp16 twin ws", t_in, twin, ws=True, num_splits=splits)


if __name__ == "__main__":
    main()
