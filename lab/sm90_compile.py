"""Compiles the triton_tree forward kernel for sm_90 on any machine (no GPU) and reports
what the compiler made of it: the facts docs/kernel.md cites from "a local sm_90 compile".

    python lab/sm90_compile.py                          # the default config, TMA and P 16 paths
    python lab/sm90_compile.py --config 128,32,8,3,128,1 --page-size 128 --num-ctas 1
    python lab/sm90_compile.py --ws [--config 128,64,4,4,168,0,2] [--mask tree|bias|causal] [--pipe on|off]
    python lab/sm90_compile.py --ws --ws-gather --page-size 8    # the producer's cp.async page gathers
    python lab/sm90_compile.py --ws --kv-dtype float8_e4m3fn [--page-size 16]   # WS2_FP8 / WS3_FP8, the converter
    python lab/sm90_compile.py --config 16,64,2,4,0,1 --kv-dtype float8_e4m3fn --fp8-path fp16 --ops
    python lab/sm90_compile.py --config 16,32,2,2 --page-size 16 --kv-desc off --short-build one-tile
    python lab/sm90_compile.py --config 64,64,4,2 --page-size 16 --kv-desc off --short-build one-tile --mask causal --lse

For each build (the forward kernel as `TreeAttention` would launch it for Hq 32,
Hkv 8, D 128, bf16, the tree mask unless --mask, no split, no LSE unless --lse) it prints one line, "name: {dict}", with registers per thread,
spilled loads/stores (LDL/STL), SASS instructions (NOPs left out), shared memory in bytes, the counts of wgmma
(HGMMA), TMA (UTMALDG) and TMA-multicast instructions in the SASS, and the `num`
of each `ttg.async_wait` inside the context loop (how many async copies stay in
flight when the loop waits for a tile; 0 = none). --kv-dtype builds it over fp8 pools
(bf16 queries), --fp8-path picks `KernelOptions.fp8_path`, --short-build the kernel's short
build (`KernelOptions.short_build`: ONE_TILE; needs --kv-desc off and no
look-ahead), and --ops adds the counts of
`op_counts` (conversion, shared-memory, MMA and barrier instructions; the context loop's
TTGIR layout and conversion ops; where each HGMMA takes its A operand; the same counts
inside each SASS loop that issues MMAs). Uses Triton's own ptxas and
cuobjdump (bundled with the triton wheel). The default builds need Triton 3.9 (the
2-CTA build asserts in Triton 3.6's compiler); one --config build and --ws work
with 3.6 and 3.9, whose figures differ (docs/kernel.md says which it quotes).

With --ws it builds the warp-specialised Gluon kernel instead (the table's WS2 and
WS3 configs, or --config's; --pipe forces the intra-warpgroup pipelining on or off;
--page-size P reads TMA boxes of whole tiles or, below the tile, of one page each;
--ws-gather the producer's cp.async page gathers at any P)
and prints whether it pipelines, its registers, spills, shared memory, warps, and
wgmma / TMA / setmaxnreg / cp.async (LDGSTS) instruction counts; it exits without Python's teardown,
where Triton 3.9's Gluon reports leaked nanobind objects. --page-size applies to it (P 16
and 32: one TMA box per page), and so does --kv-dtype: over fp8 pools it builds the fp8
twins of the table's configs (`WS_FP8_CONFIGS`; a --config needs an 8th field, fp8_stages)
and also prints the converter's tile loop (`convert_loops`).

Exit 2 with one line on bad input (a --config KernelConfig refuses, --ws with a
tl-kernel config, a ws config without --ws, a ws config over one CTA's shared
memory, no Triton).
"""

from __future__ import annotations

import argparse
import math
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from treebench.harness.errors import ConfigError  # noqa: E402
from treebench.kernels.options import FP8_PATHS, KernelOptions  # noqa: E402  (--fp8-path: the kernel's FP8_PATH is the index)
from treebench.kernels.tree_attention_plan import (MASK_MODES, SMEM_PER_SM, WS_CONVERTER_REGS,  # noqa: E402
                                                   KernelConfig, parse_kernel_config)

HKV, G, D = 8, 4, 128
KV_TYPES = {"bf16": "bf16", "float8_e4m3fn": "fp8e4nv", "float8_e5m2": "fp8e5"}   # --kv-dtype: Triton's names
TARGET_CONTEXT = 2048 + 40   # S_b of full:3:3 at L 2048, the speed target: --pipe auto's choice
POINTERS = {"Q": "*bf16", "K": "*bf16", "V": "*bf16", "O": "*bf16", "BT": "*i32", "CTX_LENS": "*i32", "QO": "*i32",
            "SEM": "*i32", "MASK": "*i64", "BIAS": "*fp32", "LSE": "*fp32", "O_PART": "*fp32", "LSE_PART": "*fp32"}
ALIGNED = [*POINTERS, "stride_qt", "stride_qh", "stride_kn", "stride_kp", "stride_kh"]   # multiples of 16


def compile_forward(cfg: KernelConfig, page_size: int, kv_desc: bool, num_ctas: int = 1, kv_dtype: str = "bf16",
                    fp8_path: int = 0, ops: bool = False, short: str = "", mask_mode: int = 0,
                    write_lse: bool = False) -> dict:
    """Builds the forward kernel for sm_90 and reads its resource use and SASS.

    Args:
        cfg: the tile config (its bt_ahead turns the look-ahead on).
        page_size: P; with kv_desc, P % cfg.block_n must be 0 (the TMA path).
        kv_desc: context tiles through TMA descriptors.
        num_ctas: CTAs per cluster (Triton's num_ctas).
        kv_dtype: the K/V pools' element type, a key of `KV_TYPES` (bf16 queries always).
        fp8_path: the kernel's FP8_PATH (how fp8 codes become MMA operands; 0: the cast).
        ops: also count the conversion, shared-memory and barrier instructions of the
            SASS and TTGIR (`op_counts`).
        short: the short build, "one-tile" (ONE_TILE); "": none.
        mask_mode: the kernel's MASK_MODE (0 bitmask, 1 bias, 2 causal).
        write_lse: WRITE_LSE (the LSE store the adapter asks for).

    Returns:
        dict of regs, spill_loads, spill_stores, ins (SASS instructions but NOPs), shared_bytes, hgmma, utmaldg,
        multicast (ints) and loop_async_wait (list of ints, TTGIR order); with ops, also
        sass and ttgir (dicts of counts, `op_counts`).

    Raises:
        ConfigError: kv_desc with P % BLOCK_N != 0; a short build with kv_desc or cfg.bt_ahead.
    """
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from treebench.kernels.tree_attention_tl import tree_attn_fwd_kernel as kernel

    if kv_desc and page_size % cfg.block_n:
        raise ConfigError(f"TMA path needs P % BLOCK_N == 0 (P {page_size}, BLOCK_N {cfg.block_n})")
    if short and (kv_desc or cfg.bt_ahead):
        raise ConfigError(f"--short-build {short} has no context loop: add --kv-desc off and a config with bt_ahead 0")
    kv = KV_TYPES[kv_dtype]
    sig = {n: POINTERS.get(n, "i32") for n in kernel.arg_names}
    sig["K"] = sig["V"] = f"*{kv}"
    sig["qk_scale"] = sig["v_scale"] = "fp32"
    const = dict(HKV=HKV, G=G, D=D, P=page_size, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, SPLIT=False,
                 FUSED_MERGE=False, MASK_MODE=mask_mode, WRITE_LSE=write_lse, DOT_FP32=False, KV_DESC=kv_desc,
                 BT_AHEAD=bool(cfg.bt_ahead), PDL=False, PAGE_GATHER=False, EARLY_FIRST=False,
                 FP8_PATH=fp8_path, Q_ROW_SCALE=fp8_path not in (0, 4) and kv_dtype != "bf16",
                 ONE_TILE=short == "one-tile")
    if kv_desc:
        sig["K_DESC"] = sig["V_DESC"] = f"tensordesc<{kv}[{cfg.block_n}, {D}]>"
    else:
        const["K_DESC"] = const["V_DESC"] = None
    sig.update({c: "constexpr" for c in const})
    attrs = {(kernel.arg_names.index(n),): [["tt.divisibility", 16]] for n in ALIGNED}
    src = ASTSource(kernel, sig, {(kernel.arg_names.index(c),): v for c, v in const.items()}, attrs)
    opts = dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages, num_ctas=num_ctas,
                **({"maxnreg": cfg.max_regs} if cfg.max_regs else {}))
    ck = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=opts)
    usage, sass = cubin_usage(ck.asm["cubin"])
    ttgir = ck.asm["ttgir"]
    loop = ttgir[ttgir.find("scf.for"):]
    loop = loop[:loop.find("scf.yield")]                     # the first loop: the context tiles
    ins = len(re.findall(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?(?!NOP\b)[A-Z]", sass))
    out = dict(**usage, ins=ins, shared_bytes=int(ck.metadata.shared), hgmma=sass.count("HGMMA"),
               utmaldg=len(re.findall(r"UTMALDG", sass)), multicast=sass.count("MULTICAST"),
               loop_async_wait=[int(n) for n in re.findall(r"ttg\.async_wait.*?\{num = (\d+)", loop)])
    return out | (op_counts(sass, loop) if ops else {})


def op_counts(sass: str, loop_ttgir: str) -> dict:
    """Counts in a build of what moves a loaded K/V tile to the MMA: SASS opcodes over the whole
    kernel (conversions F2FP / F2F / I2F / HADD2 / PRMT / LOP3 / SHF, shared memory LDS / STS /
    LDSM, MMAs HGMMA / HMMA, barriers BAR) and, in the TTGIR of the context loop, the layout
    and shared-memory ops and the element conversions (tt.fp_to_fp, arith.extf / truncf /
    extui / bitcast). hgmma_a: how many HGMMAs take A from registers (`HGMMA... R24, R64,
    gdesc[...]`) and how many from a descriptor (`R24, gdesc[...], gdesc[...]`); mma_loops: the
    MMA, shared-memory and barrier counts and length of each innermost loop that issues MMAs
    (`loop_bodies`; the tl kernel's context and tail loops, in address order)."""
    names = ("F2FP", "F2F", "I2F", "HADD2", "HMUL2", "PRMT", "LOP3", "SHF", "IMAD", "LDS", "STS", "LDSM", "LDG",
             "HGMMA", "HMMA", "BAR", "WARPGROUP")
    opcodes = re.findall(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", sass)
    counts = {n: sum(1 for o in opcodes if o == n or o.startswith(n + "_")) for n in names}
    ir_ops = ("ttg.local_alloc", "ttg.local_load", "ttg.local_store", "ttg.convert_layout", "ttg.async_copy",
              "ttng.async_tma_copy", "tt.trans", "ttg.memdesc_trans", "tt.fp_to_fp", "arith.extf", "arith.truncf",
              "arith.extui", "arith.bitcast", "tt.bitcast", "arith.shli", "arith.ori", "arith.andi",
              "ttng.warp_group_dot", "tt.dot")
    ir = {o: n for o in ir_ops if (n := len(re.findall(re.escape(o) + r"\b", loop_ttgir)))}
    a_regs = len(re.findall(r"\bHGMMA\.\S+\s+R\d+,\s*R\d+", sass))          # A from registers
    a_desc = len(re.findall(r"\bHGMMA\.\S+\s+R\d+,\s*gdesc", sass))        # A and B both descriptors
    loops = [{n: sum(1 for o in body if o == n or o.startswith(n + "_")) for n in ("HGMMA", "HMMA", "STS", "LDS",
                                                                                   "LDSM", "BAR")} | {"ins": len(body)}
             for body in loop_bodies(sass, ("HGMMA", "HMMA"))]
    return {"sass": counts, "hgmma_a": {"regs": a_regs, "desc": a_desc}, "mma_loops": loops, "ttgir_loop": ir}


def loop_bodies(sass: str, marks: tuple[str, ...]) -> list[list[str]]:
    """The opcodes (e.g. "HGMMA", "STS") of each innermost backward-branch loop of a
    one-function SASS listing that holds one of `marks`: the tile loops, whose shared-memory
    traffic per tile then reads apart from the prologue's and epilogue's."""
    ins = [(int(m[1], 16), m[2], m[3]) for m in re.finditer(
        r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)([^;\n]*)", sass)]
    loops = [(int(t[1], 16), addr) for addr, op, rest in ins
             if op == "BRA" and (t := re.search(r"(0x[0-9a-f]+)", rest)) and int(t[1], 16) < addr]
    bodies = {(lo, hi): [op for a, op, _ in ins if lo <= a <= hi] for lo, hi in loops}
    marked = [k for k, body in bodies.items() if any(o in marks for o in body)]
    inner = [k for k in marked if not any(j != k and k[0] <= j[0] and j[1] <= k[1] for j in marked)]
    return [bodies[k] for k in sorted(inner)]


def compile_ws(cfg: KernelConfig, mask_mode: int = 0, pipe: bool | None = None, page_size: int = 128,
               gather: bool = False, kv_dtype: str = "bf16", cvt_fences: int = 1) -> dict:
    """Builds the warp-specialised Gluon kernel (`kernels/tree_attention_ws.py`) for sm_90
    as `TreeAttention` would launch it (Hq 32, Hkv 8, D 128, bf16, no split) and
    reads its resource use and SASS.

    Args:
        cfg: a warp-specialised config (cfg.ws > 0); its max_regs is the kernel's maxnreg.
        mask_mode: 0 bitmask, 1 bias, 2 causal.
        pipe: intra-warpgroup pipelining (the kernel's PIPE); None: the tuned choice at the
            speed target's context, L 2048 (`KernelConfig.ws_pipe_for` of its KV tiles).
        page_size: P; below BLOCK_N the build loads one TMA box of P rows per page.
        gather: the producer's cp.async page gathers (the kernel's GATHER,
            `KernelOptions.ws_gather`) instead of TMA; any page_size.
        kv_dtype: the pools' element type, a key of `KV_TYPES` (bf16 queries always); an fp8
            one needs a config with fp8_stages (the converter's ring).

    Returns:
        dict of pipe (bool, as built), regs (the launch's per-thread count, before the
        partitions' setmaxnreg), spill_loads, spill_stores, shared_bytes, num_warps, hgmma,
        utmaldg, setmaxnreg and ldgsts (counts of those SASS instructions; LDGSTS: the
        consumers' cp.async of the next item's Q rows, and with gather the producer's K/V
        copies), producer_loop (the gather producer's tile loop: instructions, LDGSTS and
        spill instructions, or None), and tile_loops
        (`mma_loops`: instructions, HGMMAs and spills of each innermost wgmma loop).

    Raises:
        ConfigError: cfg.ws is 0.
    """
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon._runtime import GluonASTSource

    from treebench.kernels.tree_attention_ws import tree_attn_ws_kernel as kernel

    if not cfg.ws:
        raise ConfigError(f"--ws needs a warp-specialised config (its 7th field ws > 0), not {cfg}")
    if (kv_dtype != "bf16") != bool(cfg.fp8_stages):
        raise ConfigError(f"--config {cfg}: fp8_stages (its 8th field) > 0 exactly when --kv-dtype is an fp8 one")
    if cfg.ws_shared_bytes(D) > SMEM_PER_SM:
        raise ConfigError(f"--config {cfg}: about {cfg.ws_shared_bytes(D)} bytes of shared memory at D {D}, "
                          f"over one CTA's {SMEM_PER_SM}: fewer stages")
    pipe = cfg.ws_pipe_for(math.ceil(TARGET_CONTEXT / cfg.block_n)) if pipe is None else pipe
    kv = KV_TYPES[kv_dtype]
    layout = gl.NVMMASharedLayout.get_default_for([cfg.block_n, D], {"bf16": gl.bfloat16, "fp8e4nv": gl.float8e4nv,
                                                                      "fp8e5": gl.float8e5}[kv])
    sig = {n: POINTERS.get(n, "i32") for n in kernel.arg_names}
    sig["qk_scale"] = "fp32"
    consumer, producer = cfg.ws_regs_for(gather)
    const = dict(HKV=HKV, G=G, D=D, P=page_size, BLOCK_N=cfg.block_n, NUM_WG=cfg.ws, STAGES=cfg.num_stages,
                 MASK_MODE=mask_mode, SPLIT=False, WRITE_LSE=False, CONSUMER_REGS=consumer,
                 PRODUCER_REGS=producer, PIPE=pipe, GATHER=gather)
    if gather:
        const["K_DESC"] = const["V_DESC"] = None
    else:
        sig["K_DESC"] = sig["V_DESC"] = f"tensordesc<{kv}[{min(page_size, cfg.block_n)}, {D}],{layout!r}>"
        const["K"] = const["V"] = None
    if cfg.fp8_stages:                          # the V scale a runtime fp32; else None, a constexpr
        sig["v_scale"] = "fp32"
        const.update(F8_STAGES=cfg.fp8_stages, CONVERTER_REGS=WS_CONVERTER_REGS, CVT_FENCES=cvt_fences,
                     CONVERTERS=cfg.fp8_converters)
    else:
        const["v_scale"] = None
    sig.update({c: "constexpr" for c in const})
    attrs = {(kernel.arg_names.index(n),): [["tt.divisibility", 16]] for n in ALIGNED
             if n in kernel.arg_names and n not in const}
    src = GluonASTSource(kernel, sig, {(kernel.arg_names.index(c),): v for c, v in const.items()}, attrs)
    ck = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4, maxnreg=cfg.max_regs))
    usage, sass = cubin_usage(ck.asm["cubin"])
    out = dict(pipe=pipe, **usage, shared_bytes=int(ck.metadata.shared), num_warps=int(ck.metadata.num_warps),
               hgmma=sass.count("HGMMA"), utmaldg=len(re.findall(r"UTMALDG", sass)),
               setmaxnreg=len(re.findall(r"SETMAXREG", sass)), ldgsts=len(re.findall(r"LDGSTS", sass)),
               producer_loop=gather_loop(sass) if gather else None, tile_loops=mma_loops(sass))
    return out | ({"convert_loops": convert_loops(sass)} if cfg.fp8_stages else {})

def gather_loop(sass: str) -> tuple[int, int, int] | None:
    """The gather producer's tile loop in a SASS listing: the innermost backward-branch loop
    holding more than 8 LDGSTS (the consumers' Q copies sit outside any tile loop), as
    (instructions, LDGSTS, spill instructions LDL/STL); None when there is none."""
    ins = [(int(m[1], 16), m[2]) for m in re.finditer(r"/\*([0-9a-f]{4,})\*/\s+(.*?);", sass)]
    loops = []
    for addr, text in ins:
        m = re.search(r"\bBRA\b.*?(0x[0-9a-f]+)", text)
        if m and int(m[1], 16) < addr:
            body = [t for a, t in ins if int(m[1], 16) <= a <= addr]
            if sum("LDGSTS" in t for t in body) > 8:
                loops.append((addr - int(m[1], 16), body))
    if not loops:
        return None
    body = min(loops)[1]
    return len(body), sum("LDGSTS" in t for t in body), sum(bool(re.search(r"\b(LDL|STL)\b", t)) for t in body)


def convert_loops(sass: str) -> list[dict]:
    """The fp8 converter's tile loop (bf16 queries): each innermost loop with the bf16x2 multiplies
    of `tree_attention_ws_fp8.bf16_asm` (HMUL2) and no wgmma or exp2 (a consumer's), with its
    length and the counts of its loads, stores, conversion and integer ops, barriers and spills
    (per tile and thread: one K and one V tile)."""
    names = ("LDS", "STS", "PRMT", "LOP3", "LEA", "SHF", "HMUL2", "F2FP", "F2F", "SEL", "BAR", "LDL", "STL")
    return [{"ins": len(body)} | {n: sum(1 for o in body if o == n or o.startswith(n + "_")) for n in names}
            for body in loop_bodies(sass, ("HMUL2",)) if "HGMMA" not in body and "MUFU" not in body]


def mma_loops(sass: str) -> list[tuple[int, int, int]]:
    """The innermost loops of a SASS listing that issue wgmma: for each, (instructions,
    HGMMA instructions, spill instructions LDL/STL). A loop is a backward branch's range
    (target address to branch); innermost: no other such range with HGMMA inside it. In the
    warp-specialised kernel these are the consumers' per-tile loops (one tile's Q K^T and
    P V: 12 HGMMAs at D 128, 64-token tiles), so their spill count says whether spills sit
    in the tile loops or only in the per-item code around them."""
    funcs: list[list[tuple[int, str]]] = []
    last = -1
    for line in sass.splitlines():
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?);", line)
        if not m:
            continue
        addr = int(m[1], 16)
        if addr <= last or not funcs:          # addresses restart: the next function
            funcs.append([])
        funcs[-1].append((addr, m[2]))
        last = addr
    out = []
    for ins in funcs:
        loops = []
        for addr, text in ins:
            m = re.search(r"\bBRA\b.*?(0x[0-9a-f]+)", text)
            if m and int(m[1], 16) < addr:
                body = [t for a, t in ins if int(m[1], 16) <= a <= addr]
                loops.append((int(m[1], 16), addr, body))
        with_mma = [(lo, hi, body) for lo, hi, body in loops if any("HGMMA" in t for t in body)]
        for lo, hi, body in with_mma:
            if not any((lo2, hi2) != (lo, hi) and lo <= lo2 and hi2 <= hi for lo2, hi2, _ in with_mma):
                out.append((len(body), sum("HGMMA" in t for t in body),
                            sum(bool(re.search(r"\b(LDL|STL)\b", t)) for t in body)))
    return out


def cubin_usage(cubin: bytes) -> tuple[dict, str]:
    """Registers per thread and spilled loads / stores (LDL / STL) of a compiled kernel, and
    its SASS text, read by the cuobjdump bundled with the Triton wheel.

    Returns:
        (dict of regs, spill_loads, spill_stores, the SASS text).

    Raises:
        subprocess.CalledProcessError, FileNotFoundError: no usable cuobjdump in this Triton.
    """
    import triton

    tools = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "k.cubin"
        path.write_bytes(cubin)
        res = subprocess.run([str(tools / "cuobjdump"), "-res-usage", str(path)], capture_output=True,
                             text=True, check=True).stdout
        sass = subprocess.run([str(tools / "cuobjdump"), "-sass", str(path)], capture_output=True,
                              text=True, check=True).stdout
    return dict(regs=int(re.search(r"REG:(\d+)", res).group(1)), spill_loads=len(re.findall(r"\bLDL\b", sass)),
                spill_stores=len(re.findall(r"\bSTL\b", sass))), sass


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                 allow_abbrev=False)
    ap.add_argument("--config", help="one build: BLOCK_M,BLOCK_N,warps,stages[,max_regs[,bt_ahead[,ws[,fp8_stages]]]] "
                                     "(ws > 0 with --ws; fp8_stages > 0 with --ws and an fp8 --kv-dtype)")
    ap.add_argument("--page-size", type=int, default=128)
    ap.add_argument("--kv-desc", choices=["on", "off"], default="on")
    ap.add_argument("--num-ctas", type=int, default=1)
    ap.add_argument("--kv-dtype", choices=list(KV_TYPES), default="bf16",
                    help="the K/V pools' dtype (queries stay bf16)")
    ap.add_argument("--fp8-path", choices=list(FP8_PATHS), default="cast",
                    help="with an fp8 --kv-dtype: KernelOptions.fp8_path (how codes become MMA operands)")
    ap.add_argument("--short-build", choices=["one-tile"], default="",
                    help="the tl kernel's short build (KernelOptions.short_build); needs --kv-desc off")
    ap.add_argument("--ops", action="store_true",
                    help="also print SASS conversion / shared-memory / MMA / barrier counts and the "
                         "context loop's TTGIR layout and conversion ops")
    ap.add_argument("--ws", action="store_true",
                    help="the warp-specialised Gluon kernel instead (--config with a 7th field ws > 0; "
                         "default: the table's 2- and 3-warpgroup configs, or their fp8 twins over an fp8 "
                         "--kv-dtype; at --page-size, TMA boxes unless --ws-gather; --kv-desc, --num-ctas and "
                         "--fp8-path do not apply)")
    ap.add_argument("--ws-gather", action="store_true",
                    help="--ws only: the producer's cp.async page gathers (KernelOptions.ws_gather), any --page-size")
    ap.add_argument("--mask", choices=list(MASK_MODES), default=None,
                    help="the mask mode (default tree, the bitmask)")
    ap.add_argument("--lse", action="store_true",
                    help="tl builds: also store the LSE (WRITE_LSE, as the triton_tree adapter launches it)")
    ap.add_argument("--pipe", choices=["auto", "on", "off"], default=None,
                    help="--ws only: the intra-warpgroup pipelining (PIPE); auto (default): the tuned "
                         "choice at L 2048 (KernelConfig.ws_pipe_for; on for every table config there)")
    ap.add_argument("--cvt-fences", type=int, choices=[1, 2, 3], default=KernelOptions().ws_fp8_fences,
                    help="--ws over fp8 pools: the converter's fence + barrier pairs per tile "
                         "(KernelOptions.ws_fp8_fences; default: its default)")
    args = ap.parse_args()
    os.environ.pop("TRITON_INTERPRET", None)
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")   # Triton 3.6's default, as on the GPU (3.9 warns if unset)
    try:
        import triton  # noqa: F401
    except ImportError:
        print("sm90_compile: Triton is not installed (pip install -e '.[dev]')", file=sys.stderr)
        return 2
    try:
        if args.num_ctas not in (1, 2, 4):
            raise ConfigError(f"--num-ctas {args.num_ctas}: 1, 2 or 4")
        if not args.ws and (args.pipe or args.ws_gather):
            flag = "--pipe" if args.pipe else "--ws-gather"
            raise ConfigError(f"{flag} applies to the warp-specialised build only: add --ws")
        if not args.page_size >= 1:
            raise ConfigError(f"--page-size {args.page_size}: must be a positive number of tokens")
        if args.ws and args.lse:
            raise ConfigError("--lse applies to the tl builds only: drop --ws")
        if args.ws and args.short_build:
            raise ConfigError("--short-build applies to the tl builds only: drop --ws")
        if args.ws and args.fp8_path != "cast":
            raise ConfigError("--fp8-path applies to the tl builds only (the warp-specialised one converts in a "
                              "converter warpgroup): drop --ws")
        if args.ws:
            from treebench.kernels.tree_attention_plan import WS2, WS2_FP8, WS3, WS3_FP8
            mask = args.mask or "tree"
            mode = MASK_MODES.index(mask)
            fp8 = args.kv_dtype != "bf16"
            cfgs = [(args.config, parse_kernel_config(args.config))] if args.config else [
                ("2 warpgroups (WS2_FP8)" if fp8 else "2 warpgroups (WS2)", WS2_FP8 if fp8 else WS2),
                ("3 warpgroups (WS3_FP8)" if fp8 else "3 warpgroups (WS3)", WS3_FP8 if fp8 else WS3)]
            for name, cfg in cfgs:
                pipe = None if args.pipe in (None, "auto") else args.pipe == "on"
                res = compile_ws(cfg, mode, pipe=pipe, page_size=args.page_size, gather=args.ws_gather,
                                 kv_dtype=args.kv_dtype, cvt_fences=args.cvt_fences)
                path = "gather" if args.ws_gather else "tma"
                print(f"{name}, {mask}, {args.kv_dtype} pool, P {args.page_size} {path}: {res}", flush=True)
            sys.stderr.flush()
            os._exit(0)   # skip teardown: Triton 3.9's Gluon prints nanobind leak reports there
        if args.config and parse_kernel_config(args.config).ws:
            raise ConfigError(f"--config {args.config} is a warp-specialised config (7th field ws > 0): add --ws")
        if args.config:
            builds = [(args.config, parse_kernel_config(args.config), args.page_size, args.kv_desc == "on",
                       args.num_ctas)]
        else:    # the builds docs/kernel.md cites
            builds = [(name, parse_kernel_config(c), p, tma, ctas) for name, c, p, tma, ctas in (
                ("P 16 gather, look-ahead 0", "64,64,4,3,0,0", 16, False, 1),
                ("P 16 gather, look-ahead 1", "64,64,4,3,0,1", 16, False, 1),
                ("P 128 TMA, look-ahead 1 (default)", "64,64,4,3,0,1", 128, True, 1),
                ("P 128 TMA, 128 rows, 8 warps, 128 regs", "128,32,8,3,128,1", 128, True, 1),
                ("P 128 TMA, 128 rows over a 2-CTA cluster", "128,64,4,3,0,1", 128, True, 2))]
        if args.kv_dtype == "bf16" and args.fp8_path != "cast":
            raise ConfigError(f"--fp8-path {args.fp8_path} needs an fp8 --kv-dtype")
        path = FP8_PATHS.index(args.fp8_path)
        mask = args.mask or "tree"
        for name, cfg, p, tma, ctas in builds:
            res = compile_forward(cfg, p, tma, ctas, args.kv_dtype, path, args.ops, args.short_build,
                                  MASK_MODES.index(mask), args.lse)
            print(f"{name}, {mask}{', LSE' if args.lse else ''}, {args.kv_dtype} pool: {res}", flush=True)
    except ConfigError as e:
        print(f"sm90_compile: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
