"""Probes Triton's automatic warp specialisation (`tl.range(..., warp_specialize=True)`)
on sm_90 with the context loop of the triton_tree kernel, reduced to what that
feature accepts: K/V tiles and Q through TMA descriptors, no early return, no mask.

    python lab/ws_probe.py compile      # any machine: sm_90 builds, what the compiler made
    python lab/ws_probe.py run          # a CUDA sm_90 GPU: the same builds, checked and timed

The probe kernel computes, for each (request, KV head, M-tile), softmax(Q K^T) V over the
request's context tiles only (L_b a multiple of BLOCK_N), rows packing the G query heads
with the T nodes (row = node * G + g) as the real kernel does. Q is read through a 3-D
descriptor over q (sum T, Hq, D) with a (BLOCK_M / G, G, D) box, the pools through 2-D
descriptors (N * P, Hkv * D) with a (BLOCK_N, D) box, the page through the block table.

`compile` prints one line per build: warps, registers per thread, spilled loads,
shared memory, the number of warp-specialised regions and of partitions, the
wgmma ops (`ttng.warp_group_dot`) and output stores per partition, or the
compiler's first error line.
`run` also checks each build that compiles against a float32 torch reference on the
probe's own inputs (27-node tree sizes: T 28, G 4, B 64, L 2048, P 128, D 128, bf16)
and times it with `triton.testing.do_bench_cudagraph` (median, microseconds).
Output: one line per build on stdout. Exit 2 with one line on bad input.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
from pathlib import Path

import torch

try:
    import triton
    import triton.language as tl
except ImportError:
    print("ws_probe: Triton is not installed (pip install -e '.[dev]')", file=sys.stderr)
    sys.exit(2)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sm90_compile import cubin_usage  # noqa: E402

B, T, G, HKV, D, P, L = 64, 28, 4, 8, 128, 128, 2048
BUILDS = (  # name, BLOCK_M, BLOCK_N, num_warps, num_stages, warp_specialize
    ("64 rows, no WS", 64, 64, 4, 3, False),
    ("64 rows, WS", 64, 64, 4, 3, True),
    ("128 rows, no WS", 128, 64, 8, 3, False),
    ("128 rows, 4 warps, WS", 128, 64, 4, 3, True),
    ("128 rows, 8 warps, WS", 128, 64, 8, 3, True),
)


@triton.jit
def probe_kernel(Q_DESC, K_DESC, V_DESC, BT, CTX_LENS, O, qk_scale, stride_bt,
                 T: tl.constexpr, HKV: tl.constexpr, G: tl.constexpr, D: tl.constexpr, P: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, WS: tl.constexpr):
    """Grid (B * HKV * M_TILES,). Q_DESC: 3-D descriptor over q (B * T, HKV * G, D) with a
    (BLOCK_M / G, G, D) box; K_DESC / V_DESC: 2-D over the pools (N * P, HKV * D) with a
    (BLOCK_N, D) box; BT (B, pages) int32; CTX_LENS (B,) int32, multiples of BLOCK_N;
    O (B * T, HKV * G, D) in q's dtype; qk_scale = sm_scale * log2(e), fp32."""
    M_TILES: tl.constexpr = (T * G + BLOCK_M - 1) // BLOCK_M
    pid = tl.program_id(0)
    mt = pid % M_TILES
    kh = (pid // M_TILES) % HKV
    b = pid // (M_TILES * HKV)
    n_tiles = tl.load(CTX_LENS + b) // BLOCK_N
    q = Q_DESC.load([b * T + mt * (BLOCK_M // G), kh * G, 0]).reshape(BLOCK_M, D)
    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, D), tl.float32)
    for t in tl.range(0, n_tiles, warp_specialize=WS):
        page = tl.load(BT + b * stride_bt + (t * BLOCK_N) // P)
        row0 = page * P + (t * BLOCK_N) % P
        k = K_DESC.load([row0, kh * D])
        v = V_DESC.load([row0, kh * D])
        s = tl.dot(q, tl.trans(k))
        m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s * qk_scale - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = tl.dot(p.to(q.dtype), v, acc * alpha[:, None])
        m_i = m_new
    rows = mt * BLOCK_M + tl.arange(0, BLOCK_M)
    node, head = rows // G, kh * G + rows % G
    offs_d = tl.arange(0, D)
    o_off = (b * T + node).to(tl.int64)[:, None] * (HKV * G * D) + head[:, None] * D + offs_d[None, :]
    tl.store(O + o_off, (acc / l_i[:, None]).to(O.dtype.element_ty), mask=(rows < T * G)[:, None])


def compile_sm90(block_m: int, block_n: int, warps: int, stages: int, ws: bool) -> dict:
    """Builds the probe for sm_90 (no GPU needed) and reads what the compiler made.

    Returns:
        dict of warps, regs (per thread), spills (spilled loads), shared (bytes),
        ws_regions, partitions, and per partition the wgmma ops and output stores.

    Raises:
        RuntimeError: the compile failed; its message is the compiler's error line(s).
    """
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    k = probe_kernel
    sig = {n: "i32" for n in k.arg_names}
    sig.update(BT="*i32", CTX_LENS="*i32", O="*bf16", qk_scale="fp32",
               Q_DESC=f"tensordesc<bf16[{block_m // G}, {G}, {D}]>",
               K_DESC=f"tensordesc<bf16[{block_n}, {D}]>", V_DESC=f"tensordesc<bf16[{block_n}, {D}]>")
    const = dict(T=T, HKV=HKV, G=G, D=D, P=P, BLOCK_M=block_m, BLOCK_N=block_n, WS=ws)
    sig.update({c: "constexpr" for c in const})
    src = ASTSource(k, sig, {(k.arg_names.index(c),): v for c, v in const.items()})
    with tempfile.TemporaryFile("w+") as err:          # MLIR prints its diagnostics to fd 2
        saved = os.dup(2)
        os.dup2(err.fileno(), 2)
        try:
            ck = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                                options=dict(num_warps=warps, num_stages=stages))
        except Exception as e:
            os.dup2(saved, 2)
            err.seek(0)
            found = [ln.strip().split("error: ", 1)[-1] for ln in err if "error" in ln.lower()
                     and "Failures have been detected" not in ln]
            raise RuntimeError(" | ".join(dict.fromkeys(found)) or str(e).strip().splitlines()[0]) from None
        finally:
            os.dup2(saved, 2)
            os.close(saved)
    usage, _ = cubin_usage(ck.asm["cubin"])
    ttgir = ck.asm["ttgir"]
    parts = re.split(r"\n\s*(?:default \{|partition\d+\()", ttgir)[1:]   # the WS regions' bodies, in order
    return dict(warps=ck.metadata.num_warps, regs=usage["regs"], spills=usage["spill_loads"],
                shared=ck.metadata.shared,
                ws_regions=ttgir.count("ttg.warp_specialize("), partitions=len(parts),
                dots_per_partition=[p.count("ttng.warp_group_dot ") for p in parts],
                stores_per_partition=[p.count("tt.store ") for p in parts])


def gpu_inputs(seed: int = 0):
    """(q, k_cache, v_cache, block_table, ctx_lens) on the GPU: q (B * T, Hq, D) and the pools
    (N, P, Hkv, D) bf16 normal(0, 1), N = B * L / P; block_table (B, L / P) int32, one random
    permutation of the pages; ctx_lens (B,) int32, all L."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    pages = B * (L // P)
    q = torch.randn(B * T, HKV * G, D, device="cuda", generator=g).bfloat16()
    kc = torch.randn(pages, P, HKV, D, device="cuda", generator=g).bfloat16()
    vc = torch.randn(pages, P, HKV, D, device="cuda", generator=g).bfloat16()
    bt = torch.randperm(pages, device="cuda", generator=g).int().view(B, L // P)
    ctx = torch.full((B,), L, dtype=torch.int32, device="cuda")
    return q, kc, vc, bt, ctx


def reference(q, kc, vc, bt):
    """float32 softmax(Q K^T / sqrt(D)) V over each request's L context tokens, (B * T, Hq, D)
    fp32, from `gpu_inputs`' tensors (K/V gathered through the block table)."""
    k = kc[bt.long()].flatten(1, 2).float()                    # (B, L, Hkv, D)
    v = vc[bt.long()].flatten(1, 2).float()
    qf = q.float().view(B, T, HKV, G, D)
    s = torch.einsum("btkgd,blkd->bkgtl", qf, k) / D ** 0.5
    o = torch.einsum("bkgtl,blkd->btkgd", s.softmax(-1), v)
    return o.reshape(B * T, HKV * G, D)


def run_build(block_m: int, block_n: int, warps: int, stages: int, ws: bool, inputs, ref) -> dict:
    """Launches one build on `gpu_inputs`, checks it against `reference` (max |error| < 0.02)
    and times it with `do_bench_cudagraph` (no L2 flush).

    Returns:
        dict of max_abs_err, passed, median_us (microseconds).
    """
    from triton.testing import do_bench_cudagraph
    from triton.tools.tensor_descriptor import TensorDescriptor

    q, kc, vc, bt, ctx = inputs
    out = torch.empty_like(q)
    q_desc = TensorDescriptor(q, list(q.shape), list(q.stride()), [block_m // G, G, D])
    kv = [TensorDescriptor(t, [t.shape[0] * P, HKV * D], [HKV * D, 1], [block_n, D]) for t in (kc, vc)]
    grid = (B * HKV * -(-T * G // block_m),)

    def call():
        probe_kernel[grid](q_desc, kv[0], kv[1], bt, ctx, out, D ** -0.5 * 1.4426950408889634, bt.stride(0),
                           T=T, HKV=HKV, G=G, D=D, P=P, BLOCK_M=block_m, BLOCK_N=block_n, WS=ws,
                           num_warps=warps, num_stages=stages)
        return out
    call()
    torch.cuda.synchronize()
    err = (out.float() - ref).abs().max().item()
    us = do_bench_cudagraph(call, rep=100, return_mode="median") * 1e3
    return dict(max_abs_err=round(err, 5), passed=err < 2e-2, median_us=round(us, 1))


class _Parser(argparse.ArgumentParser):
    """Bad arguments: one line on stderr and exit 2 (not usage + message)."""

    def error(self, message: str):  # type: ignore[override]
        print(f"ws_probe: {message} (ws_probe.py compile|run)", file=sys.stderr)
        sys.exit(2)


def main() -> int:
    ap = _Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False)
    ap.add_argument("cmd", choices=["compile", "run"])
    args = ap.parse_args()
    os.environ.pop("TRITON_INTERPRET", None)
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    gpu = args.cmd == "run"
    if gpu and not (torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 9):
        print("ws_probe run: needs a CUDA GPU of sm_90 or newer ('compile' runs anywhere)", file=sys.stderr)
        return 2
    print(f"triton {triton.__version__}, torch {torch.__version__}", flush=True)
    inputs = gpu_inputs() if gpu else None
    ref = reference(*inputs[:4]) if gpu else None
    for name, bm, bn, w, s, ws in BUILDS:
        try:
            res = compile_sm90(bm, bn, w, s, ws)
        except Exception as e:  # noqa: BLE001 -- the compiler's refusal is the finding
            print(f"{name}: compile failed: {str(e)[:300]}", flush=True)
            continue
        if gpu:
            res.update(run_build(bm, bn, w, s, ws, inputs, ref))
        print(f"{name}: {res}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
