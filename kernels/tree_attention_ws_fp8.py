"""fp8 K/V pools in the warp-specialised kernel: the converter's tile step (`convert_kv_tile`).

With an fp8 pool (float8_e4m3fn or float8_e5m2 codes, `BackendInputs.k_scale` / `v_scale`)
`tree_attention_ws.tree_attn_ws_kernel` runs two rings instead of one:

    producer warp --TMA--> fp8 ring (F8_STAGES)  --converter warpgroup-->  converted ring (STAGES)
                  k8_ready / v8_ready (tx bytes)   kv8_empty (converter)    k_ready / v_ready / kv_empty
                                                                             (consumer warpgroups)

The producer lands the codes of each K/V tile in the fp8 ring as it lands bf16 tiles
otherwise; one converter warpgroup loads each landed tile from shared memory once, casts it
to the MMA dtype (Q's: bf16 or fp16; every fp8 value is exact in both) and stores it in the
NVMMA layout the consumers' wgmma reads, so the conversion happens once per CTA for all
NUM_WG * 64 rows, not once per 64-row consumer. The consumers are the bf16 kernel's: they
wait on k_ready / v_ready and release kv_empty as before. The scales are not applied to the
tiles: k_scale is folded into the score scale on the host, v_scale into the consumers' final
normalisation, so split-KV partials and the merge are unchanged.

A request's last tile is read whole by TMA, past S_b, where the harness's fp8 pools hold the
NaN code: its K rows only give scores the consumers mask to -inf (a select), and its V rows
past S_b are written as zeros instead of converted (P V would turn 0 * NaN into NaN).

Ordering per tile: wait for the codes (k8_ready / v8_ready, TMA transaction bytes) and for the
converted slot to be free (kv_empty, the consumers' release of its last use), load and cast,
store (generic proxy), `fence_async_shared` (each thread's stores before any async-proxy read,
the wgmma), a partition barrier (every thread's stores and fences before the one arrival) and
one arrival on k_ready / v_ready. The fp8 slot is released (kv8_empty) once both its tiles are
in registers, behind the same barrier.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier

# Barrier of one partition's warps: `barrier` in Triton 3.9, `thread_barrier` in 3.6.
_barrier = getattr(gl, "barrier", None) or gl.thread_barrier


@gluon.constexpr_function
def code_layout(d):
    """Blocked layout of a (BLOCK_N, d) tile of fp8 codes over one warpgroup: 16 codes
    (16 bytes, one shared-memory vector) per thread along d."""
    tpw_d = d // 16
    return gl.BlockedLayout([1, 16], [32 // tpw_d, tpw_d], [4, 1], [1, 0])


@gluon.constexpr_function
def mma_smem_layout(n, d, dtype):
    """The NVMMA shared layout of an (n, d) tile in `dtype`, the one the host gives bf16/fp16
    pools' TMA descriptors (`NVMMASharedLayout.get_default_for`)."""
    return gl.NVMMASharedLayout.get_default_for([n, d], dtype)


@gluon.constexpr_function
def bf16_asm(e5m2, masked):
    """PTX of `to_mma` for 4 fp8 codes in one register ($2) -> 4 bf16 in two ($0: codes 0, 1; $1:
    codes 2, 3), by integer operations: each code moved into the high byte of a 16-bit half
    (prmt), its exponent and mantissa shifted into bf16's fields beside its sign (the fields
    grow from 4 (e4m3) or 5 (e5m2) exponent bits to 8), then one bf16x2 multiply by 2^120
    (e4m3) or 2^112 (e5m2), the difference of the exponent biases. Exact for every finite
    code, subnormals included (a subnormal code lands on a subnormal bf16 with the same
    factor between them); codes of NaN / inf give finite values. masked: the codes are first
    ANDed with $3 (0: zeros, -1: kept; $4-$5 are the pack's other three, equal, masks)."""
    shift, bias = (3, "0x77807780") if e5m2 else (4, "0x7B807B80")      # 2^112 / 2^120 as bf16x2
    src = "w" if masked else "$2"

    def half(out, sel):
        return (f"prmt.b32 x, {src}, 0, {sel}; and.b32 m, x, 0x7F007F00; shr.b32 m, m, {shift}; "
                f"and.b32 x, x, 0x80008000; or.b32 m, m, x; mul.rn.bf16x2 {out}, m, f; ")
    return ("{ .reg .b32 x, m, f, w; mov.b32 f, " + bias + "; " + ("and.b32 w, $2, $3; " if masked else "")
            + half("$0", "0x1404") + half("$1", "0x3424") + "}")


@gluon.jit
def to_mma(codes, dtype: gl.constexpr, keep):
    """fp8 codes (any distributed layout) as `dtype` values, exactly, where keep (int32 of codes'
    shape and layout, or None) is -1; 0 where it is 0: to bf16 by `bf16_asm` (sm_90 has no
    fp8 -> bf16 conversion, and Triton's cast goes through fp16 with one F2F per element), to
    fp16 by Triton's cast (one F2FP per two e4m3 codes; e5m2 is a shift)."""
    if dtype == gl.bfloat16:
        bits = codes.to(gl.uint8, bitcast=True)
        if keep is None:
            return gl.inline_asm_elementwise(bf16_asm(codes.dtype.is_fp8e5(), False), "=r,=r,r", [bits],
                                             gl.bfloat16, True, 4)
        else:
            return gl.inline_asm_elementwise(bf16_asm(codes.dtype.is_fp8e5(), True), "=r,=r,r,r,r,r,r",
                                             [bits, keep], gl.bfloat16, True, 4)
    else:
        v = codes.to(dtype)
        if keep is not None:
            v = gl.where(keep != 0, v, gl.zeros_like(v))
        return v


@gluon.jit
def past_s_b_mask(valid, BLOCK_N: gl.constexpr, D: gl.constexpr, layout: gl.constexpr):
    """`to_mma`'s keep for a V tile: int32 (BLOCK_N, D) in `layout`, -1 on rows < valid, 0 on rows
    past S_b (a request's last tile reaches the pool's unused slots; those rows become zeros)."""
    r = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, layout))
    return gl.expand_dims(gl.where(r < valid, -1, 0), 1) + gl.zeros([BLOCK_N, D], gl.int32, layout=layout)


@gluon.jit
def convert_one_tile(bufs8, ready8, kv8_empty, bufs, ready, kv_empty, it, valid, STAGES: gl.constexpr,
                     F8_STAGES: gl.constexpr, BLOCK_N: gl.constexpr, D: gl.constexpr, IS_V: gl.constexpr):
    """Ring position `it` for one of two converter warpgroups (`KernelConfig.fp8_converters` 2):
    the K tile's codes (IS_V False) or the V tile's (rows [valid, BLOCK_N) as zeros) from fp8 slot
    it % F8_STAGES into converted slot it % STAGES, then one fence and barrier, this warpgroup's
    arrival on kv8_empty (initialised for both converters) and on `ready` (k_ready / v_ready)."""
    layout: gl.constexpr = code_layout(D)
    st8 = it % F8_STAGES
    st = it % STAGES
    mbarrier.wait(ready8.index(st8), (it // F8_STAGES) & 1)
    codes = bufs8.index(st8).load(layout)
    if IS_V:
        vals = to_mma(codes, bufs.dtype, past_s_b_mask(valid, BLOCK_N, D, layout))
    else:
        vals = to_mma(codes, bufs.dtype, None)
    mbarrier.wait(kv_empty.index(st), ((it // STAGES) & 1) ^ 1)   # a fresh barrier passes phase 1
    bufs.index(st).store(vals)
    fence_async_shared()                        # the code loads and the stores before the async proxy's next use
    _barrier()
    mbarrier.arrive(kv8_empty.index(st8), count=1)
    mbarrier.arrive(ready.index(st), count=1)


@gluon.jit
def convert_kv_tile(ring8, k_bufs, v_bufs, k_ready, v_ready, kv_empty, it, valid, STAGES: gl.constexpr,
                    F8_STAGES: gl.constexpr, BLOCK_N: gl.constexpr, D: gl.constexpr, FENCES: gl.constexpr):
    """Ring position `it`: the K and V codes of one tile from fp8 slot it % F8_STAGES into
    converted slot it % STAGES (in k_bufs.dtype), rows [valid, BLOCK_N) of V as zeros
    (valid = S_b - the tile's first token; >= BLOCK_N for every tile but a request's last).
    ring8 = (k8_bufs, v8_bufs, k8_ready, v8_ready, kv8_empty); one warpgroup calls it.

    FENCES: `fence_async_shared` + partition barrier pairs per tile (`KernelOptions.ws_fp8_fences`).
    3: K published (k_ready) after its stores, the fp8 slot released (kv8_empty) after V's
    loads, V published after its stores. 2: K published as in 3; V's loads and stores behind
    one fence, then kv8_empty and v_ready. 1: K and V loaded, converted and stored, then one
    fence and barrier before the three arrivals. Every arrival follows a fence that orders all of
    this thread's earlier shared-memory reads and writes before the async proxy's (the producer's
    next TMA write into the fp8 slot, the consumers' wgmma reads)."""
    k8_bufs, v8_bufs, k8_ready, v8_ready, kv8_empty = ring8
    layout: gl.constexpr = code_layout(D)
    st8 = it % F8_STAGES
    ph8 = (it // F8_STAGES) & 1
    st = it % STAGES
    mbarrier.wait(k8_ready.index(st8), ph8)
    k = to_mma(k8_bufs.index(st8).load(layout), k_bufs.dtype, None)
    mbarrier.wait(kv_empty.index(st), ((it // STAGES) & 1) ^ 1)   # a fresh barrier passes phase 1
    k_bufs.index(st).store(k)
    if FENCES > 1:
        fence_async_shared()                    # the stores before the consumers' wgmma reads
        _barrier()
        mbarrier.arrive(k_ready.index(st), count=1)
    mbarrier.wait(v8_ready.index(st8), ph8)
    codes = v8_bufs.index(st8).load(layout)
    if FENCES > 2:
        fence_async_shared()                    # these generic reads before the producer's next TMA write
        _barrier()                              # every thread holds its codes: the fp8 slot is free
        mbarrier.arrive(kv8_empty.index(st8), count=1)
    v_bufs.index(st).store(to_mma(codes, v_bufs.dtype, past_s_b_mask(valid, BLOCK_N, D, layout)))
    fence_async_shared()
    _barrier()
    if FENCES < 3:
        mbarrier.arrive(kv8_empty.index(st8), count=1)
    if FENCES < 2:
        mbarrier.arrive(k_ready.index(st), count=1)
    mbarrier.arrive(v_ready.index(st), count=1)
