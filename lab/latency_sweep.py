"""Candidate tile configs and page paths of treebench's Triton kernel on the latency-bound seed
cells and the P 16 against P 128 cells, timed in one process, with vLLM's Triton kernel beside
them when it imports: one GPU call gives the numbers that choose the configs.

    python lab/latency_sweep.py --out $OUT/latency.json [--budget-s 240] [--groups latency,pages]

Cells (bf16, Hq 32, Hkv 8, D 128, shuffled pages, one tree per batch as in the seed suite):
- `latency`: L 16, P 16 and 128, B 1 with every seed tree (T 1-64) and B 16 with full:3:0 and
  full:3:1: one or two KV tiles per request, so fixed costs decide (the seed cells where vLLM's
  kernel was faster in the seed run at 4aba09b, `lab/runs.md`, and their neighbours);
- `pages`: full:3:3, vllm:pr_27 and eagle:mc_sim_7b_63 at B 16, medusa:mc_sim_7b_63 and
  vllm:pr_27 at B 64, vllm:pr_27 at B 1, all at L 2048, P 16 and 128: what a tile spanning
  several pages costs, and at P 16 the tl kernel's gather (`tl`) against the plan's choice;
  and the B >= 16 cells at P 1 and 8 (`GATHER_PAGES`), pages no TMA path reads, with two
  candidates only: the default (the warp-specialised kernel's cp.async gathers) and
  `no_ws_gather` (the tl kernel's per-token gather), to set against the same trees' P 128
  default;
- `b1`: B 1, L 2048, the 27-node tree (vllm:pr_27), full:3:3 and full:3:1, P 16 and 128: one
  request, so split-KV fills the GPU and the merge is on the critical path (`B1_CANDIDATES`:
  split counts, the fused merge, merge rows, the tl kernel against the warp-specialised one;
  `B1_TILES`: tl tiles of 64 and 128 rows with 8-32 splits); each passing row also gets the
  device us per call of each kernel it launches (`kernels_us`: `splits_sweep.kernel_times`, the
  median over 20 profiled calls back to back);
- `fp8`: the `fp8_targets` cells (B 64, L 2048, full:3:1, full:3:2, vllm:pr_27, P 16 and 128)
  over an e4m3 pool with k_scale 0.25 and v_scale 0.5, with the same cell in bf16 timed
  beside (`bf16_default`): which tl tiles (`FP8_CONFIGS`) and which fp8 operand path
  (`KernelOptions.fp8_path`: the default rule, the fp16 MMAs over cast codes forced, the cast to Q's dtype,
  bit-manipulated codes, the PTX conversion that keeps fp16 tiles in shared memory, or K's codes
  straight into fp8 MMAs against Q split in two e4m3 terms, `FP8_ALT_PATHS`; each tile of
  `FP8_CONFIGS` with the default, the cast and the split) an fp8 pool wants, and the warp-specialised kernel
  over the codes against the tl kernel (`KernelOptions.ws_fp8`: `ws_fp8` the plan's choice with
  it on, `no_ws_fp8` with it off whatever the default, `ws_fp8_forced` ws=True where the plan
  keeps the tl kernel); split counts (`FP8_SPLITS`, `FP8_SPLIT_TILES`) and the cvt path's
  16-row tiles and splits (`FP8_CVT_TILES`, `FP8_CVT_SPLITS`), and the warp-specialised kernel
  with one consumer warpgroup and a converter (`WS1_FP8_STAGES`); with
  --fp8-all-trees also eagle:mc_sim_7b_63, full:3:3 and medusa:mc_sim_7b_63 (`FP8_WS_TREES`);
- `decode`: the small trees (full:3:0 to full:3:2, 4-52 rows per KV head) at B 1 and 16, L 1024
  and 2048, P 16 and 128: single-token and few-token decode, where flashinfer_xqa (timed beside,
  with vLLM's kernel) was the seed suite's best peer and triton_tree took 0.61-1.00x of it
  (the seed run at a84176c, `lab/runs.md`); split counts (`DECODE_SPLITS`), tl tiles (`DECODE_TILES`) and tl tiles with
  their own split counts (`DECODE_TILE_SPLITS`) against
  the plan's choice;
- `batched_short`: L 16 at B 64 and 16, P 16 and 128, the trees of 13 nodes or more (full:3:2,
  full:3:3, vllm:pr_27, eagle:mc_sim_7b_63, medusa:mc_sim_7b_63): the seed cells at L 16 where
  triton_tree took 0.55-0.76x of the best peer (the seed run at a84176c), one or two KV tiles per
  request but hundreds to thousands of programs, so neither the one-wave short configs nor
  split-KV apply; the default against the warp-specialised kernel forced on (`ws`, with and
  without its persistent wave and PIPE) and off (`tl`), and tl tiles (`BATCHED_SHORT_TILES`) in the
  looped build and, those of 64 tokens or more, in the one-tile build;
- `ws1`: full:3:2 (52 rows per KV head) at B 16, L 256, and at B 16 and 64, L 1024 and 2048, each
  at P 16, 32 and 128, where the seed suite's P 16 took up to 1.14x of its P 128
  (the seed run at 6758b82, before `ws1_config`; the default now takes WS1 at B 16, P 16 / 32): the tl kernel's
  per-token gather with one and two splits against the warp-specialised kernel with one consumer
  warpgroup (`WS1_CONFIGS`), which at P 16 reads one TMA box per page, and its cp.async gather
  (`ws1x2 gather`); flashinfer_xqa and vLLM's kernel timed beside;
- `fp8_wide`: the `fp8` group's candidates on the seed_fp8 suite's B 16 and 64, L 1024 and 2048
  cells of its trees (`FP8_TREES`), P 16 and 128;
- `fp8_latency`: the `latency` cells over that e4m3 pool (the seed_fp8 suite's L 16 cells),
  with their bf16 twins: the default, the other fp8 operand paths, the short build off, and
  short-config tiles with more warps (`FP8_SHORT_CONFIGS`, the one-tile build where it runs) and
  128-token one-tile tiles (`WIDE_SHORT_CONFIGS`), and each token's page looked up where a tile lies
  in one page forced on (`token_pages`, with the default operand path and with "fp16") and off
  (`no_token_pages`).

Candidates (`candidates`, explicit and small: under 2 minutes on an H200): the default plan;
early_first forced on and off; for the latency cells, the tl kernel's short build forced on
and off (`short_build`, `no_short_build`: `KernelOptions.short_build`, run right after the
default), small tl tiles (BLOCK_M 16-64, BLOCK_N 16-64, 1-4 warps) with early_first, and
short tiles with 4 and 8 warps and 128-token tiles in the one-tile build (`SHORT_WARP_CONFIGS`,
`WIDE_SHORT_CONFIGS`, `+short`);
`page_gather`, and `ws_page_tma=False` (the tl kernel's gather instead of one TMA box per
page) and `tl` (the tl kernel forced), for the P 16 cells; `no_ws_gather` for the P 1 and 8
cells. Every candidate's output is compared with the float64 reference before it is timed (a
mismatch is reported, not timed). Each is timed twice: with the harness's timer
(`time_callable`, CUDA graph, L2 flushed before every call, as the seed suite) and back to
back with `triton.testing.do_bench_cudagraph` (warm L2, the peers' published method).

Prints one line per (cell, candidate): us flushed, us back to back, ratio to the default
and to vLLM; writes every row and the environment as JSON to --out. Candidates that the
kernel refuses (a config or option that cannot run a cell) are rows with the reason, and
so are those whose build or call raises (status "error"): the sweep goes on.
Bad arguments: one line on stderr, exit 2, nothing written. --smoke runs tiny cells in
Triton's CPU interpreter (wall timer; no do_bench), to test the script without a GPU (a tiny
cell per requested group).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import sys
import time
from pathlib import Path
from typing import NoReturn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))       # lab/: splits_sweep's profiler pass

import torch  # noqa: E402

from treebench.harness.errors import ConfigError  # noqa: E402
from treebench.harness.model.cases import Case  # noqa: E402
from treebench.harness.model.compare import compare  # noqa: E402
from treebench.harness.model.paged import build_inputs, triton_interpret  # noqa: E402
from treebench.harness.model.reference import reference_attention  # noqa: E402
from treebench.harness.run.loading import availability_of, load_one  # noqa: E402
from treebench.harness.run.verify import error_reason  # noqa: E402
from treebench.harness.timing.stats import summarize  # noqa: E402
from treebench.harness.timing.timers import time_callable  # noqa: E402
from treebench.kernels.options import KernelOptions  # noqa: E402
from treebench.kernels.tree_attention_plan import KernelConfig  # noqa: E402
from splits_sweep import kernel_times  # noqa: E402

FP8 = {"kv_dtype": "float8_e4m3fn", "k_scale": 0.25, "v_scale": 0.5}   # seed_fp8's pool
SEED_TREES = ("full:3:0", "full:3:1", "full:3:2", "full:3:3", "vllm:pr_27", "eagle:mc_sim_7b_63", "medusa:mc_sim_7b_63")
LATENCY_CELLS = (*((1, t) for t in SEED_TREES), (16, "full:3:0"), (16, "full:3:1"))   # (B, tree) at L 16
PAGE_CELLS = (("full:3:3", 16), ("medusa:mc_sim_7b_63", 64), ("vllm:pr_27", 64), ("vllm:pr_27", 1),
              ("vllm:pr_27", 16), ("eagle:mc_sim_7b_63", 16))
PAGES = (16, 128)
# pages no TMA path reads, timed on the B >= 16 page cells with the default and no_ws_gather only
# (each is a new build of both kernels: the group's runtime stays small)
GATHER_PAGES = (1, 8)
# Small tl tiles for one or two KV tiles per request: (BLOCK_M, BLOCK_N, warps, stages); one
# stage loads a lone tile straight to registers, with no pipeline prologue.
TINY_CONFIGS = ((16, 16, 1, 2), (16, 32, 2, 2), (16, 64, 2, 2), (32, 32, 2, 2), (32, 64, 4, 2),
                (64, 32, 4, 2), (64, 64, 4, 2), (16, 32, 2, 1), (16, 64, 2, 1), (32, 64, 4, 1), (64, 64, 4, 1))
FP8_TREES = ("full:3:1", "full:3:2", "vllm:pr_27")
# with --fp8-all-trees: every seed tree of 26 nodes or more too (the warp-specialised kernel's rows)
FP8_WS_TREES = ("eagle:mc_sim_7b_63", "full:3:3", "medusa:mc_sim_7b_63")
# tl tiles for the L 16 cells over an fp8 pool (`fp8_latency`): the short configs' tiles with 2-8 warps
FP8_SHORT_CONFIGS = ((16, 32, 4, 2), (16, 32, 8, 2), (16, 64, 4, 2), (16, 64, 8, 2), (32, 64, 8, 2), (16, 32, 2, 1),
                     (32, 64, 4, 1))
# the one-tile build with more warps for the bf16 latency cells: in a local sm_90 compile the 16-row
# short config's one-tile build runs 859 SASS instructions per thread with 2 warps, 584 with 4, 496 with 8
SHORT_WARP_CONFIGS = ((16, 32, 4, 2), (16, 32, 8, 2), (16, 64, 4, 2), (16, 64, 8, 2), (32, 64, 8, 2))
# one-tile 128-token tiles, for S_b up to 128 (medusa at L 16: S_b 80, three 32-token or two 64-token tiles)
WIDE_SHORT_CONFIGS = ((16, 128, 4, 2), (16, 128, 8, 2), (32, 128, 4, 2), (32, 128, 8, 2), (64, 128, 8, 2))
# tl tiles for an fp8 pool, (BLOCK_M, BLOCK_N, warps, stages): the table's 16- and 64-row tiles
# (larger BLOCK_N and more warps measured slower over fp8 pools) and one 128-row tile for the
# 112 rows of the 27-node tree (one M tile, each K/V tile read once).
FP8_CONFIGS = ((16, 64, 2, 4), (64, 64, 4, 3), (128, 64, 8, 3))
# KernelOptions.fp8_path values timed against the default ("fp16"): with the plan's config, and
# the first with each FP8_CONFIGS tile.
FP8_ALT_PATHS = ("fp16", "cast", "bits", "cvt", "split")
# split-KV over fp8 pools at B 64 (the plan gives 512 programs one split each): the codes' conversion
# runs on the program's own warps, so more, shorter programs per SM may hide it behind the loads;
# and the 16-row tile with 4 warps (fewer conversions per thread) over the fp16 path
FP8_SPLITS = (2, 3, 4)
FP8_SPLIT_TILES = ((16, 64, 4, 4, 1), (16, 64, 4, 4, 2), (16, 32, 2, 4, 2), (64, 64, 4, 4, 2))
# 16-row tl tiles over the "cvt" path (fp16 tiles in shared memory: more shared memory per stage
# than the fp16 path's fp8 tiles, so fewer stages may keep more programs per SM), and split-KV with it
FP8_CVT_TILES = ((16, 64, 2, 3), (16, 64, 2, 2), (16, 64, 4, 3), (16, 32, 2, 4))
FP8_CVT_SPLITS = (2,)
# the warp-specialised kernel with one consumer warpgroup over fp8 pools (a converter warpgroup
# beside it) for the 16 and 52 rows of full:3:1 and full:3:2, which the tl kernel converts in its own
# warps: (stages, fp8 stages), named `ws1_fp8 s{stages}f{fp8 stages}`, forced (a config with ws 1)
WS1_FP8_STAGES = ((3, 4), (2, 4), (3, 6), (4, 4))
# the converter's fence + barrier pairs per K/V tile (`KernelOptions.ws_fp8_fences`): with the WS1 twins
# above (`ws1_fp8 s{..}f{..}` without a suffix: 3 pairs, the first build; ` fencesN`: N), and as
# `ws_fp8 fencesN` with the plan's choice
WS_FP8_FENCES = (3, 2, 1)
# the WS1 twin with two converter warpgroups, one for K and one for V (`KernelConfig.fp8_converters` 2;
# 16 warps, so 128 registers per thread at launch): (stages, fp8 stages), named `ws1_fp8 2cvt s{..}f{..}`
WS1_FP8_2CVT_STAGES = ((4, 4), (3, 4), (3, 6), (2, 4))
B1_TREES = ("vllm:pr_27", "full:3:3", "full:3:1")
# (name, TreeAttention keyword arguments) for one request at L 2048
B1_CANDIDATES = (*((f"splits{n}", {"num_splits": n}) for n in (4, 8, 12, 16, 24, 32)),
                 *((f"fused_merge splits{n}", {"fused_merge": True, "num_splits": n}) for n in (8, 16)),
                 ("fused_merge", {"fused_merge": True}), ("merge_rows4", {"merge_rows": 4}),
                 ("tl", {"ws": False}), ("tl splits16", {"ws": False, "num_splits": 16}))
# tl tiles for one request at L 2048, (BLOCK_M, BLOCK_N, warps, stages, splits): one 128-row M tile
# (the 27-node tree's 112 rows read each K/V tile once) and 64-row tiles with more, shorter splits
B1_TILES = ((128, 64, 8, 3, 8), (128, 64, 8, 2, 16), (128, 128, 8, 2, 16), (64, 64, 4, 2, 16),
            (64, 64, 4, 2, 32), (64, 128, 8, 2, 16))
DECODE_TREES = ("full:3:0", "full:3:1", "full:3:2")
DECODE_SPLITS = (1, 2, 3, 4, 5, 6, 8, 16, 24)   # 3, 5 and 6 beside 4, the plan's count at B 16 (128 programs)
# tl tiles for the decode cells, (BLOCK_M, BLOCK_N, warps, stages): the table's 16-row tile with
# more warps, fewer stages and 32- or 128-token tiles, and the 64-row tile for full:3:2's 52 rows
DECODE_TILES = ((16, 64, 4, 3), (16, 64, 2, 2), (16, 32, 2, 4), (16, 128, 4, 3), (64, 64, 4, 2))
# tl tiles with a split count each, (BLOCK_M, BLOCK_N, warps, stages, splits), for the B 16 decode cells:
# smaller or shallower tiles (more programs resident per SM) with more splits than the plan's 4 (5-8 splits
# of its own tile took 1.05-1.16x of 4, `results/h200/kernel/decode-splits.txt`)
DECODE_TILE_SPLITS = ((16, 32, 2, 3, 6), (16, 32, 2, 3, 8), (16, 32, 2, 4, 4), (16, 32, 2, 4, 6), (16, 32, 2, 4, 8),
                      (16, 64, 2, 3, 4), (16, 64, 2, 3, 6), (16, 64, 2, 2, 6), (16, 64, 2, 2, 8), (16, 32, 4, 3, 8),
                      (16, 64, 4, 3, 4), (16, 128, 4, 2, 4))
# the warp-specialised kernel with one consumer warpgroup for the decode cells' 4-16 rows per KV head,
# (stages, splits), named `ws1x{stages} splits{n}` (forced: a config with ws 1): a producer warp's TMA
# ring of up to 6 tiles in flight per SM, against the tl kernel's software pipelining of 2-4 stages
DECODE_WS1 = tuple((st, n) for st in (3, 4, 6) for n in (1, 2, 4))
BATCHED_SHORT_TREES = ("full:3:2", "full:3:3", "vllm:pr_27", "eagle:mc_sim_7b_63", "medusa:mc_sim_7b_63")
# tl tiles for the batched L 16 cells, (BLOCK_M, BLOCK_N, warps, stages); those whose BLOCK_N holds
# every S_b (16 + T: 29-80 tokens) also in the one-tile build
BATCHED_SHORT_TILES = ((16, 64, 8, 2), (32, 64, 4, 2), (64, 64, 4, 2), (64, 32, 4, 2), (128, 64, 8, 2),
                       (16, 128, 8, 2), (64, 128, 8, 2))
# the warp-specialised kernel with one consumer warpgroup (64 rows) for full:3:2's 52 rows per KV head,
# (BLOCK_M, BLOCK_N, warps, stages, max_regs, bt_ahead, ws): at P 16 its producer reads one TMA box per
# page (`ws_page_tma`) where the tl kernel gathers per token
WS1_CONFIGS = ((64, 64, 4, 2, 128, 0, 1), (64, 64, 4, 3, 168, 0, 1), (64, 64, 4, 4, 168, 0, 1))
WS1_CELLS = ((16, 256), *((b, ln) for b in (16, 64) for ln in (1024, 2048)))   # (B, L) of full:3:2
WS1_PAGES = (16, 32, 128)
GROUPS = ("latency", "pages", "fp8", "b1", "fp8_latency", "decode", "batched_short", "ws1", "fp8_wide")
# peers timed beside the candidates of a group (vLLM's kernel in every group)
GROUP_PEERS = {"decode": ("vllm_triton", "flashinfer_xqa"), "ws1": ("vllm_triton", "flashinfer_xqa")}


def one_tile_tiles(configs) -> list[tuple]:
    """Candidates `tl{M}x{N}w{warps}s{stages}+short`: each (BLOCK_M, BLOCK_N, warps, stages) tile in
    the one-tile build (`KernelOptions.short_build` forced, early_first on), where it can run."""
    opts = KernelOptions(early_first=True, short_build=True)
    return [(f"tl{bm}x{bn}w{w}s{s}+short", KernelConfig(bm, bn, w, s), opts) for bm, bn, w, s in configs]


def candidates(group: str, page_size: int, smoke: bool = False) -> list[tuple]:
    """(name, config or None for the plan's, options[, TreeAttention keyword arguments]) of one
    cell group at one page size (with smoke, every fifth of the fp8 tiles and of the b1
    candidates: the interpreter runs each at its full size; `fp8_wide` takes the fp8 group's)."""
    group = "fp8" if group == "fp8_wide" else group
    out: list[tuple[str, KernelConfig | None, KernelOptions]] = [
        ("default", None, KernelOptions()), ("early", None, KernelOptions(early_first=True)),
        ("no_early", None, KernelOptions(early_first=False))]
    if page_size < 64:
        out.append(("page_gather", None, KernelOptions(page_gather=True)))
        out.append(("page_gather+early", None, KernelOptions(page_gather=True, early_first=True)))
    if group == "b1":
        tiles = [(f"tl{bm}x{bn}w{w}s{st} splits{n}", KernelConfig(bm, bn, w, st), KernelOptions(),
                  {"ws": False, "num_splits": n}) for bm, bn, w, st, n in B1_TILES[::5 if smoke else 1]]
        return out[:1] + [(name, None, KernelOptions(), kw) for name, kw in B1_CANDIDATES[::5 if smoke else 1]] + tiles
    if group == "decode":
        splits = [(f"splits{n}", None, KernelOptions(), {"num_splits": n}) for n in ((1, 8) if smoke else DECODE_SPLITS)]
        tiles = [(f"tl{bm}x{bn}w{w}s{st}", KernelConfig(bm, bn, w, st), KernelOptions())
                 for bm, bn, w, st in DECODE_TILES[::3 if smoke else 1]]
        tile_splits = [(f"tl{bm}x{bn}w{w}s{st} splits{n}", KernelConfig(bm, bn, w, st), KernelOptions(),
                        {"ws": False, "num_splits": n}) for bm, bn, w, st, n in DECODE_TILE_SPLITS[::6 if smoke else 1]]
        ws1 = [] if smoke else [   # Gluon needs a GPU
            (f"ws1x{st} splits{n}", KernelConfig(64, 64, 4, st, 168, 0, 1), KernelOptions(), {"num_splits": n})
            for st, n in DECODE_WS1]
        return out[:1] + [("tl", None, KernelOptions(), {"ws": False})] + splits + tiles + tile_splits + ws1
    if group == "ws1":
        ws1 = [] if smoke else [   # Gluon needs a GPU
            *((f"ws1x{c[3]}", KernelConfig(*c), KernelOptions()) for c in WS1_CONFIGS),   # named by stages
            ("ws1x2 gather", KernelConfig(*WS1_CONFIGS[0]), KernelOptions(ws_page_tma=False))]
        return out[:1] + [(f"tl splits{n}", None, KernelOptions(), {"ws": False, "num_splits": n})
                          for n in (1, 2)] + ws1
    if group == "batched_short":
        tiles = BATCHED_SHORT_TILES[::4 if smoke else 1]
        # lse: the LSE store the triton_tree adapter asks for (return_lse=True), beside the plan's build
        return out[:1] + [("lse", None, KernelOptions(), {"return_lse": True}),
                          ("tl", None, KernelOptions(), {"ws": False})] + (
            [] if smoke else [("ws", None, KernelOptions(), {"ws": True}),     # Gluon needs a GPU
                              ("ws_no_persist", None, KernelOptions(ws_persist=False), {"ws": True}),
                              ("ws_no_pipe", None, KernelOptions(ws_pipe=False), {"ws": True}),
                              ("ws_pipe", None, KernelOptions(ws_pipe=True), {"ws": True})]) + [
            (f"tl{bm}x{bn}w{w}s{s}", KernelConfig(bm, bn, w, s), KernelOptions(short_build=False), {"ws": False})
            for bm, bn, w, s in tiles] + one_tile_tiles(t for t in tiles if t[1] >= 64)
    if group == "pages" and page_size in GATHER_PAGES:
        return [out[0], ("no_ws_gather", None, KernelOptions(ws_gather=False))]
    if group == "fp8":
        paths = [(f"fp8_{p}", None, KernelOptions(fp8_path=p)) for p in FP8_ALT_PATHS]
        tiles = [(f"tl{bm}x{bn}w{w}s{s}{'' if p == 'fp16' else '+' + p}", KernelConfig(bm, bn, w, s),
                  KernelOptions(fp8_path=p)) for bm, bn, w, s in FP8_CONFIGS[::5 if smoke else 1]
                 for p in ("fp16", "cast", "split")]
        ws_fp8 = [("ws_fp8", None, KernelOptions(ws_fp8=True)), ("no_ws_fp8", None, KernelOptions(ws_fp8=False))] + (
            [] if smoke else [("ws_fp8_forced", None, KernelOptions(ws_fp8=True), {"ws": True})])   # Gluon needs a GPU
        splits = [(f"splits{n}", None, KernelOptions(), {"num_splits": n}) for n in FP8_SPLITS[::5 if smoke else 1]]
        split_tiles = [(f"tl{bm}x{bn}w{w}s{s} splits{n}", KernelConfig(bm, bn, w, s), KernelOptions(),
                        {"ws": False, "num_splits": n}) for bm, bn, w, s, n in FP8_SPLIT_TILES[::5 if smoke else 1]]
        cvt = [(f"tl{bm}x{bn}w{w}s{s}+cvt", KernelConfig(bm, bn, w, s), KernelOptions(fp8_path="cvt"))
               for bm, bn, w, s in FP8_CVT_TILES[::5 if smoke else 1]] + [
            (f"cvt splits{n}", None, KernelOptions(fp8_path="cvt"), {"num_splits": n}) for n in FP8_CVT_SPLITS]
        ws1_fp8 = [] if smoke else [   # Gluon needs a GPU
            *((f"ws1_fp8 s{st}f{f8}{'' if n == 3 else f' fences{n}'}", KernelConfig(64, 64, 4, st, 168, 0, 1, f8),
               KernelOptions(ws_fp8_fences=n)) for st, f8 in WS1_FP8_STAGES for n in WS_FP8_FENCES),
            *((f"ws_fp8 fences{n}", None, KernelOptions(ws_fp8_fences=n)) for n in WS_FP8_FENCES if n != 3),
            *((f"ws1_fp8 2cvt s{st}f{f8}", KernelConfig(64, 64, 4, st, 128, 0, 1, f8, 2), KernelOptions())
              for st, f8 in WS1_FP8_2CVT_STAGES)]
        return out[:1] + paths + tiles + ws_fp8 + splits + split_tiles + cvt + ws1_fp8
    if group == "fp8_latency":   # more warps per tile: fewer conversions per thread before the first MMA
        return out[:1] + [(f"fp8_{p}", None, KernelOptions(fp8_path=p)) for p in FP8_ALT_PATHS] + [
            ("token_pages", None, KernelOptions(token_pages=True)),
            ("token_pages+fp16", None, KernelOptions(token_pages=True, fp8_path="fp16")),
            ("no_token_pages", None, KernelOptions(token_pages=False)),
            ("no_short_build", None, KernelOptions(short_build=False)),
            *one_tile_tiles(FP8_SHORT_CONFIGS[::4 if smoke else 1]),
            *one_tile_tiles(WIDE_SHORT_CONFIGS[::5 if smoke else 1])]
    if group == "latency":
        out[1:1] = [("short_build", None, KernelOptions(short_build=True)),
                    ("no_short_build", None, KernelOptions(short_build=False))]
        out += [(f"tl{bm}x{bn}w{w}s{s}+early", KernelConfig(bm, bn, w, s), KernelOptions(early_first=True))
                for bm, bn, w, s in TINY_CONFIGS]
        out += one_tile_tiles(SHORT_WARP_CONFIGS[::3 if smoke else 1])
        out += one_tile_tiles(WIDE_SHORT_CONFIGS[::5 if smoke else 1])
        if not smoke:   # the table's warp-specialised config, forced (Gluon needs a GPU)
            out.append(("ws", None, KernelOptions(), {"ws": True}))
    elif page_size < 64:
        out.append(("no_ws_page_tma", None, KernelOptions(ws_page_tma=False)))
        out.append(("tl", None, KernelOptions(), {"ws": False}))
    return out


def cells(groups: list[str], smoke: bool, fp8_all_trees: bool = False) -> list[tuple[str, Case]]:
    """(group, case) in the order they are run: latency cells first (fp8_all_trees: the fp8 group
    with `FP8_WS_TREES` too)."""
    if smoke:
        tiny = dict(num_q_heads=4, num_kv_heads=2, head_dim=64, layout="shuffled")
        return [(g, c) for g, c in (
            ("latency", Case(batch_size=1, context_len=16, tree="full:2:1", page_size=8, **tiny)),
            ("pages", Case(batch_size=2, context_len=40, tree="full:2:2", page_size=16, **tiny)),
            ("pages", Case(batch_size=2, context_len=40, tree="full:2:2", page_size=GATHER_PAGES[1], **tiny)),
            ("fp8", Case(batch_size=2, context_len=20, tree="full:2:1", page_size=16, **FP8, **tiny)),
            ("b1", Case(batch_size=1, context_len=70, tree="full:2:2", page_size=16, **tiny)),
            ("fp8_latency", Case(batch_size=1, context_len=16, tree="full:2:1", page_size=8, **FP8, **tiny)),
            ("decode", Case(batch_size=2, context_len=70, tree="full:2:0", page_size=16, **tiny)),
            ("batched_short", Case(batch_size=3, context_len=16, tree="full:2:2", page_size=16, **tiny)),
            ("ws1", Case(batch_size=2, context_len=70, tree="full:2:2", page_size=16, **tiny)))
            if g in groups]
    seed = dict(num_q_heads=32, num_kv_heads=8, head_dim=128, dtype="bfloat16", layout="shuffled")
    out = []
    if "latency" in groups:
        out += [("latency", Case(batch_size=b, context_len=16, tree=t, page_size=p, **seed))
                for b, t in LATENCY_CELLS for p in PAGES]
    if "pages" in groups:
        out += [("pages", Case(batch_size=b, context_len=2048, tree=t, page_size=p, **seed))
                for t, b in PAGE_CELLS for p in PAGES]
        out += [("pages", Case(batch_size=b, context_len=2048, tree=t, page_size=p, **seed))
                for t, b in PAGE_CELLS if b >= 16 for p in GATHER_PAGES]
    if "b1" in groups:
        out += [("b1", Case(batch_size=1, context_len=2048, tree=t, page_size=p, **seed))
                for t in B1_TREES for p in PAGES]
    if "fp8" in groups:
        out += [("fp8", Case(batch_size=64, context_len=2048, tree=t, page_size=p, **FP8, **seed))
                for t in FP8_TREES + (FP8_WS_TREES if fp8_all_trees else ()) for p in PAGES]
    if "fp8_wide" in groups:   # the seed_fp8 suite's B 16 / 64, L 1024 / 2048 cells of the fp8 trees
        out += [("fp8", Case(batch_size=b, context_len=ln, tree=t, page_size=p, **FP8, **seed))
                for t in FP8_TREES for b in (16, 64) for ln in (1024, 2048) for p in PAGES]
    if "decode" in groups:
        out += [("decode", Case(batch_size=b, context_len=ln, tree=t, page_size=p, **seed))
                for b in (1, 16) for ln in (1024, 2048) for t in DECODE_TREES for p in PAGES]
    if "batched_short" in groups:
        out += [("batched_short", Case(batch_size=b, context_len=16, tree=t, page_size=p, **seed))
                for b in (64, 16) for t in BATCHED_SHORT_TREES for p in PAGES]
    if "ws1" in groups:
        out += [("ws1", Case(batch_size=b, context_len=ln, tree="full:3:2", page_size=p, **seed))
                for b, ln in WS1_CELLS for p in WS1_PAGES]
    if "fp8_latency" in groups:
        out += [("fp8_latency", Case(batch_size=b, context_len=16, tree=t, page_size=p, **FP8, **seed))
                for b, t in LATENCY_CELLS for p in PAGES]
    return out


def peer_call(name: str, inputs, case: Case):
    """The registered backend `name`'s kernel on `inputs` (of `case`) as a zero-argument callable,
    or (None, why): the peer not loadable or not available here, or refusing the case."""
    try:
        backend = load_one(name)
        why = availability_of(backend) or backend.supports(case)
        if why:
            return None, why
        return backend.prepare(inputs.for_backend()), ""
    except Exception as e:   # noqa: BLE001 -- the peer missing or refusing: a row with the reason
        return None, f"{type(e).__name__}: {e}".splitlines()[0][:200]


def time_both(fn, device: str, smoke: bool) -> tuple[float, float | None]:
    """(median us, L2 flushed, harness timer; median us back to back, do_bench_cudagraph)."""
    timing = time_callable(fn, device=device, mode="auto", warmup_ms=5, rep_ms=25, min_reps=2 if smoke else 10)
    flushed = summarize(timing.samples_us).median_us
    if smoke:
        return flushed, None
    import triton.testing
    return flushed, float(triton.testing.do_bench_cudagraph(fn, rep=25, return_mode="median")) * 1e3


def run_candidate(inputs, ref, case: Case, cfg, opts, device: str, smoke: bool, extra: dict | None = None,
                  breakdown: bool = False) -> dict:
    from treebench.kernels.tree_attention import TreeAttention
    try:
        ta = TreeAttention(inputs.for_backend(), "tree", config=cfg, options=opts, **(extra or {}))
    except ConfigError as e:
        return {"status": "refused", "reason": str(e)}
    except Exception as e:     # noqa: BLE001 -- a build that fails (out of resources, ...) is a row, the sweep goes on
        return {"status": "error", "reason": error_reason(e)}
    row = {"kernel": ta.kernel, "config": str(ta.plan.config), "splits": ta.plan.num_splits}
    try:
        ta.out.fill_(float("nan"))
        rec = compare(ta(), ref, inputs.qo_indptr, case.dtype, kv_dtype=case.kv_dtype)
        row["max_abs_err"] = rec.max_abs_err
        if not rec.passed:
            return row | {"status": "mismatch", "reason": f"max_abs_err {rec.max_abs_err:.3g}"}
        flushed, loop = time_both(ta, device, smoke)
        kernels = kernel_times(ta) if breakdown and not smoke else {}
    except Exception as e:     # noqa: BLE001 -- as above
        return row | {"status": "error", "reason": error_reason(e)}
    return row | {"status": "pass", "flushed_us": flushed, "loop_us": loop} | (
        {"kernels_us": kernels} if kernels else {})


def chosen(args, case: Case) -> bool:
    """The cell passes --page-sizes, --trees and --batch-sizes (each: any value when not given)."""
    return not (args.page_sizes and case.page_size not in args.page_sizes or args.trees and case.tree not in args.trees
                or args.batch_sizes and case.batch_size not in args.batch_sizes)


def sweep(args) -> list[dict]:
    device = "cpu" if args.smoke else "cuda"
    rows: list[dict] = []
    t0 = time.monotonic()
    for group, case in cells(args.groups, args.smoke, args.fp8_all_trees):
        if not chosen(args, case):
            continue
        if time.monotonic() - t0 > args.budget_s:
            print(f"budget of {args.budget_s:.0f} s spent: stopping before {case.case_id}", flush=True)
            break
        inputs = build_inputs(case, device)
        ref = reference_attention(inputs)
        label = f"{group} B{case.batch_size} L{case.context_len} {case.tree} P{case.page_size}"
        base = {"group": group, "batch_size": case.batch_size, "context_len": case.context_len,
                "tree": case.tree, "page_size": case.page_size, "case_id": case.case_id,
                "kv_dtype": case.kv_dtype or case.dtype, "k_scale": case.k_scale, "v_scale": case.v_scale}
        cell_rows = []
        for peer in () if args.smoke else GROUP_PEERS.get(group, ("vllm_triton",)):
            fn, why = peer_call(peer, inputs, case)
            row = {"candidate": peer, "status": "skipped", "reason": why} if fn is None else \
                {"candidate": peer, "status": "pass", **dict(zip(("flushed_us", "loop_us"),
                                                                time_both(fn, device, False)))}
            cell_rows.append(base | row)
        if group in ("fp8", "fp8_latency"):   # the same cell over a bf16 pool, the other side of the fp8 / bf16 ratio
            twin = dataclasses.replace(case, kv_dtype=None, k_scale=1.0, v_scale=1.0)
            t_in = build_inputs(twin, device)
            cell_rows.append(base | {"candidate": "bf16_default", "case_id": twin.case_id, "kv_dtype": twin.dtype,
                                     "k_scale": 1.0, "v_scale": 1.0} | run_candidate(
                t_in, reference_attention(t_in), twin, None, KernelOptions(), device, args.smoke))
            del t_in
        for name, cfg, opts, *extra in candidates(group, case.page_size, args.smoke):
            if args.candidates and name not in args.candidates:
                continue
            cell_rows.append(base | {"candidate": name} | run_candidate(
                inputs, ref, case, cfg, opts, device, args.smoke, *extra, breakdown=group == "b1"))
        print_cell(label, cell_rows)
        rows += cell_rows
        write(args.out, rows)
    return rows


def print_cell(label: str, rows: list[dict]) -> None:
    """One line per candidate: flushed / back-to-back us and the ratios to default and vLLM."""
    by = {r["candidate"]: r for r in rows if r.get("status") == "pass"}
    ref, peer, xqa, bf16 = by.get("default"), by.get("vllm_triton"), by.get("flashinfer_xqa"), by.get("bf16_default")
    print(f"== {label}", flush=True)
    for r in rows:
        if r.get("status") != "pass":
            print(f"   {r['candidate']:<24} {r['status']}: {r.get('reason', '')[:90]}")
            continue
        loop = "" if r["loop_us"] is None else f"{r['loop_us']:7.2f}"
        ratios = "".join(f"  /{n} {r['flushed_us'] / o['flushed_us']:.3f}"
                         for n, o in (("def", ref), ("vllm", peer), ("xqa", xqa), ("bf16", bf16))
                         if o is not None and r is not o)
        kern = "".join(f"  [{n.split('_kernel')[0]} {us:.2f}]" for n, us in r.get("kernels_us", {}).items())
        err = f"  err {r['max_abs_err']:.2g}" if "max_abs_err" in r else ""
        print(f"   {r['candidate']:<24} {r['flushed_us']:7.2f} flushed {loop:>7} loop  {r.get('kernel', ''):<22}"
              f"{ratios}{kern}{err}", flush=True)


def write(out: Path, rows: list[dict]) -> None:
    env = {"gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
           "torch": torch.__version__, "python": platform.python_version()}
    try:
        import triton
        env["triton"] = triton.__version__
    except ImportError:
        pass
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps({"env": env, "rows": rows}, indent=1))
    tmp.replace(out)


def refuse(msg: str) -> NoReturn:
    print(f"latency_sweep: {msg}", file=sys.stderr)
    raise SystemExit(2)


def listed(text: str | None, flag: str, kind: type = str) -> list:
    """The entries of a comma-separated flag, each read by `kind` ('16,128' -> [16, 128]); [] when
    the flag is not given. Refuses (one line, exit 2) an empty flag or entry ('16,,128', '16,'),
    an entry `kind` cannot read, and an entry given twice ('16,16', for integers '16,016' too)."""
    if text is None:
        return []
    words = [w.strip() for w in text.split(",")]
    if not any(words):
        refuse(f"{flag} is empty: give comma-separated entries, or leave it out")
    if "" in words:
        refuse(f"{flag} {text!r}: an empty entry (two commas in a row, or a comma at an end); "
               "separate the entries with single commas")
    try:
        values = [kind(w) for w in words]
    except ValueError:
        refuse(f"{flag} {text!r}: want comma-separated integers")
    twice = next((w for i, (w, v) in enumerate(zip(words, values)) if v in values[:i]), None)
    if twice is not None:
        refuse(f"{flag} {text!r}: {twice} given twice; give each entry once")
    return values


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    ap.add_argument("--out", required=True, type=Path, help="JSON file to write (a new path)")
    ap.add_argument("--budget-s", type=float, default=240.0, help="stop starting new cells after this (s)")
    ap.add_argument("--groups", default="latency,pages", help=f"comma-separated subset of {','.join(GROUPS)}")
    ap.add_argument("--candidates", default=None,
                    help="comma-separated candidate names to run (default: all of each group's; vLLM's kernel and "
                         "the fp8 group's bf16 twin always run)")
    ap.add_argument("--page-sizes", default=None, help="comma-separated page sizes: only the cells at these")
    ap.add_argument("--trees", default=None, help="comma-separated tree specs: only the cells of these")
    ap.add_argument("--batch-sizes", default=None, help="comma-separated batch sizes: only the cells at these")
    ap.add_argument("--fp8-all-trees", action="store_true",
                    help="the fp8 group over every seed tree of 26 nodes or more too (FP8_WS_TREES)")
    ap.add_argument("--smoke", action="store_true", help="a tiny cell per group in the CPU interpreter")
    args = ap.parse_args(argv)
    args.groups = listed(args.groups, "--groups")
    args.candidates = set(listed(args.candidates, "--candidates"))
    args.trees = set(listed(args.trees, "--trees"))
    args.page_sizes = set(listed(args.page_sizes, "--page-sizes", int))
    args.batch_sizes = set(listed(args.batch_sizes, "--batch-sizes", int))
    if not args.groups or any(g not in GROUPS for g in args.groups):
        refuse(f"--groups {','.join(args.groups)!r}: use a comma-separated subset of {','.join(GROUPS)}")
    known = {c[0] for g in args.groups for p in (1, 8, 16, 128) for c in candidates(g, p, args.smoke)}
    if args.candidates - known:
        refuse(f"--candidates: no candidate {', '.join(sorted(args.candidates - known))} in groups "
               f"{','.join(args.groups)}; known: {', '.join(sorted(known))}")
    known_trees = {*SEED_TREES, *(c.tree for _, c in cells(GROUPS, True))}
    if args.trees - known_trees:
        refuse(f"--trees: no cell of tree {', '.join(sorted(args.trees - known_trees))}; "
               f"known: {', '.join(sorted(known_trees))}")
    every = [c for _, c in cells(args.groups, args.smoke, args.fp8_all_trees)]
    if not any(chosen(args, c) for c in every):
        refuse(f"no cell of groups {','.join(args.groups)} at the --page-sizes, --trees and --batch-sizes given; "
               f"their cells have page sizes {sorted({c.page_size for c in every})}, batch sizes "
               f"{sorted({c.batch_size for c in every})}")
    if not args.budget_s > 0:
        refuse(f"--budget-s {args.budget_s}: must be a positive number of seconds")
    if args.out.suffix != ".json" or args.out.exists() or not args.out.parent.is_dir():
        refuse(f"--out {args.out}: want a new .json file in an existing folder")
    if args.smoke and not triton_interpret():
        refuse("--smoke runs in Triton's CPU interpreter: set TRITON_INTERPRET=1")
    if not args.smoke and not torch.cuda.is_available():
        refuse("needs a CUDA GPU (or --smoke with TRITON_INTERPRET=1)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    sweep(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
