"""Host-side planning for the tree-attention kernel: tile configs, split-KV and
the tree masks in the kernel's formats.

Pure Python and torch (no Triton import), so it is testable anywhere. Every
choice here is made once in `prepare`, from host lists; nothing in the timed
call looks at it again.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import numpy as np
import torch

from treebench.harness.errors import ConfigError
from treebench.harness.model.trees import TokenTree

MASK_MODES = ("tree", "bias", "causal")        # kernel MASK_MODE 0, 1, 2
HEAD_DIMS = (32, 64, 128, 256)                 # D: a power of 2 (tl.arange), >= 16 (tl.dot); the tested ones
DTYPES = (torch.bfloat16, torch.float16)
FP8_KV_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)   # fp8 pools: codes, cast to Q's dtype after each load


def is_integer(v) -> bool:
    """True for an integer (Python or numpy), False for bool, float and str."""
    return isinstance(v, numbers.Integral) and not isinstance(v, (bool, np.bool_))


@dataclass(frozen=True)
class KernelConfig:
    """Tile shape and launch parameters of the forward kernel."""

    block_m: int      # packed (node, g) rows per program; power of 2 >= 16 (ws: 64 * ws)
    block_n: int      # KV tokens per tile; power of 2 >= 16
    num_warps: int    # warps per program
    num_stages: int   # software-pipelining depth of the K/V tile loads
    max_regs: int = 0  # registers per thread cap (Triton's maxnreg; 0 = the compiler's choice)
    bt_ahead: int = 0  # 1: each context tile's block-table entries are loaded one tile ahead of its K/V
    ws: int = 0        # consumer warpgroups of the warp-specialised Gluon kernel (0: the tl kernel)
    fp8_stages: int = 0  # ws over fp8 pools: buffers of the TMA ring of fp8 codes, read by a converter warpgroup
    fp8_converters: int = 1  # with fp8_stages: converter warpgroups (1: K and V; 2: one for K, one for V)

    def __post_init__(self) -> None:
        rules = (("block_m", lambda v: 16 <= v <= 256 and (not v & (v - 1) or v == 192),
                  "an integer power of 2 from 16 to 256 (or 192 = 3 warpgroups of the warp-specialised kernel)"),
                 ("block_n", lambda v: 16 <= v <= 256 and not v & (v - 1), "an integer power of 2 from 16 to 256"),
                 ("num_warps", lambda v: v in (1, 2, 4, 8, 16), "the integer 1, 2, 4, 8 or 16"),
                 ("num_stages", lambda v: 1 <= v <= 8, "an integer from 1 to 8"),
                 ("max_regs", lambda v: v == 0 or 24 <= v <= 255, "the integer 0 (no cap) or one from 24 to 255"),
                 ("bt_ahead", lambda v: v in (0, 1), "the integer 0 or 1 (2 and 3 measured slower, docs/kernel.md)"),
                ("ws", lambda v: v in (0, 1, 2, 3), "the integer 0 (the tl kernel) or 1 to 3 consumer warpgroups"),
                ("fp8_stages", lambda v: v == 0 or 2 <= v <= 6 and self.ws, "0, or 2 to 6 with ws > 0 (fp8 pools)"),
                ("fp8_converters", lambda v: v == 1 or v == 2 and self.fp8_stages,
                 "1, or 2 with fp8_stages > 0 (a converter warpgroup for K and one for V)"))
        for name, ok, want in rules:
            v = getattr(self, name)
            if not is_integer(v) or not ok(v):      # True, 4.0 and "4" are refused; numpy integers are taken
                raise ConfigError(f"kernel config {name}={v!r}: must be {want}")
            object.__setattr__(self, name, int(v))
        if self.block_m == 192 and self.ws != 3:
            raise ConfigError(f"kernel config block_m=192 with ws={self.ws}: 192 rows are the 3 consumer "
                              "warpgroups of the warp-specialised kernel (ws=3)")
        if self.ws:
            self._check_ws()

    def _check_ws(self) -> None:
        """Raises ConfigError unless this warp-specialised config can be built: 64 rows per
        consumer warpgroup, 32- or 64-token tiles (the bitmask window holds 64 columns), 4
        warps, 2-6 stages, no block-table look-ahead (the producer reads the table ahead
        itself), and a max_regs that fits the register
        file (max_regs * 128 threads * `ws_warpgroups` <= 65536) while leaving each
        consumer at least WS_MIN_CONSUMER_REGS (ptxas refuses fewer for its tile)."""
        groups, others = self.ws_warpgroups, WS_PRODUCER_REGS + self.converter_regs
        limit = REGS_PER_SM // (128 * groups) // 8 * 8
        floor = next(m for m in range(8, 257, 8) if (m * groups - others) // self.ws // 8 * 8 >= WS_MIN_CONSUMER_REGS)
        if (self.block_m != 64 * self.ws or self.block_n not in (32, 64) or self.num_warps != 4
                or not 2 <= self.num_stages <= 6 or self.bt_ahead or not 0 < self.max_regs <= limit
                or self.ws_regs[0] < WS_MIN_CONSUMER_REGS):
            raise ConfigError(f"kernel config {self}: the warp-specialised kernel (ws={self.ws}) takes "
                              f"block_m = 64 * ws = {64 * self.ws}, block_n 32 or 64, 4 warps, 2 to 6 stages, "
                              f"bt_ahead 0 and max_regs (registers per thread at launch) from {floor} (each "
                              f"consumer warpgroup keeps at least {WS_MIN_CONSUMER_REGS}) to {limit} (the "
                              "register file)")

    @property
    def ws_warpgroups(self) -> int:
        """Warpgroups: ws consumers, the producer warp's, with fp8_stages the converters (tl: 0)."""
        return self.ws + 1 + (self.fp8_converters if self.fp8_stages else 0) if self.ws else 0

    @property
    def converter_regs(self) -> int:
        """Registers per thread of all the fp8 converter warpgroups together (0 without fp8_stages)."""
        return WS_CONVERTER_REGS * self.fp8_converters if self.fp8_stages else 0

    @property
    def ws_regs(self) -> tuple[int, int]:
        """`ws_regs_for` the TMA producer. Raises ConfigError for a tl config (ws 0)."""
        return self.ws_regs_for(gather=False)

    def ws_regs_for(self, gather: bool) -> tuple[int, int]:
        """(consumer, producer) registers per thread of the warp-specialised kernel's
        partitions (setmaxnreg; multiples of 8, at most 256): the producer's warpgroup
        keeps WS_PRODUCER_REGS (TMA) or, with gather (its cp.async page gathers),
        WS_GATHER_PRODUCER_REGS; an fp8 converter (fp8_stages) WS_CONVERTER_REGS; the
        consumers share the rest of max_regs * `ws_warpgroups`' worth (below
        WS_MIN_CONSUMER_REGS with gather only for max_regs under 96 at ws 1, which
        `TreeAttention` refuses). Raises ConfigError for a tl config (ws 0)."""
        if not self.ws:
            raise ConfigError(f"kernel config {self}: ws_regs of a tl-kernel config (ws=0)")
        producer = WS_GATHER_PRODUCER_REGS if gather else WS_PRODUCER_REGS
        spare = self.max_regs * self.ws_warpgroups - producer - self.converter_regs
        return min(256, spare // max(self.ws, 1) // 8 * 8), producer

    def ws_shared_bytes(self, head_dim: int, itemsize: int = 2) -> int:
        """Shared memory of the warp-specialised kernel in bytes: Q (block_m, D) and the K/V
        ring (2 x stages x (block_n, D)), plus WS_SCRATCH_BYTES per consumer warpgroup for
        its layout conversions and the barriers (sm_90 compiles, D 128, Triton 3.6: 90172 B
        for ws 1 with 2 stages, 180336 B for ws 2 with 4, 245920 B for ws 2 with 6,
        172152 B for ws 3 with 3; block_n 32: 139384 B for ws 3 with 4). An upper bound of
        those; past SMEM_PER_SM a config cannot launch (`TreeAttention` refuses it). itemsize:
        bytes per element of Q (and of the K/V ring); fp8_stages adds the ring of 1-byte codes."""
        return ((self.block_m + 2 * self.num_stages * self.block_n) * head_dim * itemsize
                + 2 * self.fp8_stages * self.block_n * head_dim + self.ws * WS_SCRATCH_BYTES)

    def ws_pipe_for(self, tiles_per_split: int, ws3_min_tiles: int | None = None) -> bool:
        """The tuned choice of the warp-specialised kernel's intra-warpgroup pipelining
        (its PIPE) for work items of `tiles_per_split` KV tiles (`Plan.tiles_per_split`):
        always for 1-2 consumer warpgroups; for 3 from `ws3_min_tiles` tiles per item
        (None: WS3_PIPE_MIN_TILES; `KernelOptions.ws3_pipe_min_tiles` passes another).

        Measured on the H200 with the harness's timer, pipelined against not, in one run
        (run 10 in lab/runs.md, `run10-pipe-ab/`, P 128, Hq 32, Hkv 8, D 128): with 2
        warpgroups it is 0.92-0.99x on every cell (27-node and medusa trees, B 16-64,
        L 512-4096); with 3 (full:3:3, B 16-64) 1.03-1.11x at L 512-1024 (9-17 tiles per
        item), 0.98-1.01x at L 2048 (33 tiles) and 0.94-0.98x at L 3072-4096. Its
        pipelined build spills more (59 values against 46 in the sm_90 compile, Triton
        3.6), a cost that only a long enough loop earns back.

        3 over fp8 pools (fp8_stages: 128 registers per consumer) never: that pipelined build spills
        in every context tile loop (sm_90 compile). Raises ConfigError for a tl config (ws 0)."""
        if not self.ws:
            raise ConfigError(f"kernel config {self}: ws_pipe_for of a tl-kernel config (ws=0)")
        min_tiles = WS3_PIPE_MIN_TILES if ws3_min_tiles is None else ws3_min_tiles
        return self.ws < 3 or not self.fp8_stages and tiles_per_split >= min_tiles

    def ctas_per_sm(self, head_dim: int, itemsize: int = 2) -> int:
        """Programs of this config that run at once on one SM: 2 for the tl kernel's
        larger tiles (their registers and shared memory allow exactly 2, docs/kernel.md);
        for the warp-specialised kernel as many as both its shared memory
        (`ws_shared_bytes` plus 1 KiB reserved per CTA) and its registers (max_regs per
        thread over ws + 1 warpgroups) allow, 1 or 2. head_dim: D; itemsize: bytes per
        K/V element (2 for bf16/fp16)."""
        if not self.ws:
            return 2
        by_smem = SMEM_PER_SM // (self.ws_shared_bytes(head_dim, itemsize) + 1024)
        by_regs = REGS_PER_SM // (self.max_regs * 128 * self.ws_warpgroups)
        return max(1, min(2, by_smem, by_regs))


WS3_PIPE_MIN_TILES = 32      # KV tiles per work item from which 3 consumer warpgroups pipeline (run 10)
WS_PRODUCER_REGS = 40        # the producer warp's warpgroup: scalar work and TMA issue only
# the gathering producer warpgroup: each thread's row pages and addresses (sm_90 compile, Triton 3.9:
# at 40 its tile loop spills at P 1 and 24, at 56 at none of P 1, 8, 24, 128)
WS_GATHER_PRODUCER_REGS = 56
WS_CONVERTER_REGS = 56       # the fp8 converter warpgroup: one tile's codes and converted values
WS_SCRATCH_BYTES = 8 * 1024 + 128  # per consumer warpgroup (see KernelConfig.ws_shared_bytes; compiles: 8232-8272)
WS_MIN_CONSUMER_REGS = 128         # registers per consumer thread below which the build fails or spills in its loop
REGS_PER_SM = 65536                # sm_90's register file (32-bit registers per SM)
SMEM_PER_SM = 227 * 1024      # the largest dynamic shared memory of one sm_90 CTA (228 KiB per SM, 1 KiB reserved per CTA)


def parse_kernel_config(text: str) -> KernelConfig:
    """'BLOCK_M,BLOCK_N,warps,stages[,max_regs[,bt_ahead[,ws[,fp8_stages[,fp8_converters]]]]]' (--config)
    -> KernelConfig.

    Raises:
        ConfigError: not 4 to 9 integers, or a field KernelConfig refuses.
    """
    try:
        fields = [int(f) for f in text.split(",")]
    except ValueError:
        fields = []
    if not 4 <= len(fields) <= 9:
        raise ConfigError(f"--config {text!r}: want BLOCK_M,BLOCK_N,warps,stages[,max_regs[,bt_ahead[,ws"
                          "[,fp8_stages[,fp8_converters]]]]] (integers)")
    return KernelConfig(*fields)


@dataclass(frozen=True)
class Plan:
    """How one batch is cut into programs."""

    config: KernelConfig
    num_splits: int   # KV splits per (request, KV head); 1 = no split-KV, no merge kernel
    m_tiles: int      # M-tiles per (request, KV head, split): ceil(G * max T_b / block_m)
    num_programs: int  # forward grid: B * Hkv * num_splits * m_tiles
    tiles_per_split: int = 0  # KV tiles per split: ceil(ceil(max S_b / block_n) / num_splits)


# (rows bound, D bound) -> config; first row whose bounds hold wins. rows = G * max T_b.
# Measured on the H200 with lab/bench_kernel.py (docs/kernel.md, lab/runs.md);
# bt_ahead=1 (block table read one tile ahead of the K/V loads) from run 5 (TMA) and run 6 (P 16 gather).
# The warp-specialised Gluon kernel's rows (ws > 0; run 8): 2 consumer warpgroups (128 rows) with
# a 4-stage ring, 3 (192 rows, a 3-stage ring, pipelined from 32 tiles per work item:
# `KernelConfig.ws_pipe_for`) for 129-192 rows. They apply only where `ws_unsupported` finds
# no reason against, D is 128 (the tuned one) and the batch is large enough (`ws_fills`); else the tl-kernel rows below.
WS2 = KernelConfig(128, 64, 4, 4, 168, 0, 2)
WS3 = KernelConfig(192, 64, 4, 3, 128, 0, 3)
# The same rows over fp8 pools (KernelOptions.ws_fp8): a converter warpgroup more, a ring of fp8 codes
# beside the converted one (docs/kernel.md, "fp8 in the warp-specialised kernel": builds and timings).
WS2_FP8 = KernelConfig(128, 64, 4, 3, 128, 0, 2, 4)
WS3_FP8 = KernelConfig(192, 64, 4, 3, 96, 0, 3, 3)
WS_FP8_CONFIGS = {WS2: WS2_FP8, WS3: WS3_FP8}   # a table config -> its fp8-pool twin
# One consumer warpgroup (64 rows, a 3-stage ring) for the tl kernel's 64-row batches that it would
# read by per-token gathers (P 16 and 32) where the warp-specialised kernel reads one TMA box per
# page (`ws1_config`).
WS1 = KernelConfig(64, 64, 4, 3, 168, 0, 1)
# Its fp8-pool twin (a converter warpgroup, `ws1_config`): 4 stages and 4 fp8 stages.
WS1_FP8 = KernelConfig(64, 64, 4, 4, 168, 0, 1, 4)
GPU_CONFIGS: tuple[tuple[int, int, KernelConfig], ...] = (
    (16, 128, KernelConfig(16, 64, 2, 4)),
    (16, 256, KernelConfig(16, 64, 4, 3)),
    (32, 128, KernelConfig(32, 64, 4, 3)),
    (32, 256, KernelConfig(32, 32, 4, 3)),
    (64, 128, KernelConfig(64, 64, 4, 3, bt_ahead=1)),
    (64, 256, KernelConfig(64, 32, 8, 2)),
    (128, 128, WS2),
    (192, 128, WS3),
    (1 << 30, 128, WS2),
    (1 << 30, 128, KernelConfig(64, 64, 4, 3, bt_ahead=1)),
    (1 << 30, 256, KernelConfig(64, 32, 8, 2)),
)
WS_HEAD_DIMS = (128,)        # the warp-specialised rows are tuned for D 128 only
INTERPRET_CONFIG = KernelConfig(16, 16, 1, 1)   # the CPU interpreter: smallest tiles run fastest


def next_pow2(n: int) -> int:
    """Smallest power of 2 >= n (n >= 1)."""
    return 1 << max(n - 1, 0).bit_length()


def choose_config(rows: int, head_dim: int, interpret: bool, ws: bool = True) -> KernelConfig:
    """The tuned config for `rows` = G * max T_b packed rows and head dim D; with
    ws=False the first tl-kernel config (the fallback where the warp-specialised
    kernel cannot run)."""
    if interpret:
        return INTERPRET_CONFIG
    for max_rows, max_d, cfg in GPU_CONFIGS:
        if rows <= max_rows and head_dim <= max_d and (not cfg.ws or ws and head_dim in WS_HEAD_DIMS):
            return cfg
    raise ConfigError(f"head dim {head_dim}: the kernel supports D <= 256")


# Short contexts (every S_b fits one or two tiles: L 16 in the seed suite), where fixed latency
# decides: (max S_b bound, rows above, rows bound, config over bf16/fp16 pools, config over fp8
# pools or None (the table's), the grid it needs). The grid, counted in the entry's own BLOCK_M
# rows: "one wave" (at most 2 programs per SM), "fills" (at least one per SM) or "any".
# lab/latency_sweep.py on the H200 (L 16, P 16 and 128, flushed; docs/kernel.md, "Short contexts"):
# - S_b <= 64, 17-256 rows, 64-row programs filling every SM (B 16 and 64 with the trees of 13 nodes
#   or more but medusa; B 16 with full:3:2 has 128 programs on 132 SMs and keeps the next entry):
#   the one-tile 64-row tile of 64 tokens with 4 warps, 0.82-0.91x of the plan's earlier choice
#   (the warp-specialised kernel or a 16-row tile) over bf16 pools
#   (`results/h200/kernel/batched-short-sweep.txt`); not measured over fp8 pools;
# - S_b <= 32, <= 64 rows (full:3:0 to full:3:2): (16, 32, 2, 2) took 0.80-0.91x of the table's
#   config (`results/h200/kernel/latency-sweep-l16.txt`); in the one-tile build 4 warps took
#   0.90-0.98x of 2 over bf16 pools, and 8 warps 0.88-0.93x of 2 over e4m3 pools (fewer fp8
#   conversions per thread before the first MMA; `results/h200/kernel/short-warps-sweep.txt`);
# - S_b <= 64 in one wave (the 27-node, eagle and full:3:3 trees at B 1): the one-tile 16-row
#   tile of 64 tokens, 0.85-0.92x of (32, 64, 4, 2) with 8 warps over bf16 pools and 0.87-0.92x
#   with 4 over e4m3 (the same file);
# - S_b <= 128 in one wave (medusa at B 1, S_b 80): the one-tile 16-row tile of 128 tokens with
#   8 warps, 0.71-0.82x of (32, 64, 4, 2) over bf16 and 0.61-0.73x over e4m3 pools
#   (`results/h200/kernel/short-wide-sweep.txt`);
# - S_b <= 80, <= 256 rows in one wave of 32-row programs (medusa at B 3): (32, 64, 4, 2),
#   0.84-0.89x of the table's config at B 1 (`latency-sweep-l16.txt`).
SHORT_CONFIGS: tuple[tuple[int, int, int, KernelConfig, KernelConfig | None, str], ...] = (
    (64, 16, 256, KernelConfig(64, 64, 4, 2), None, "fills"),
    (32, 0, 64, KernelConfig(16, 32, 4, 2), KernelConfig(16, 32, 8, 2), "any"),
    (64, 0, 256, KernelConfig(16, 64, 8, 2), KernelConfig(16, 64, 4, 2), "one wave"),
    (128, 0, 256, KernelConfig(16, 128, 8, 2), KernelConfig(16, 128, 8, 2), "one wave"),
    (80, 0, 256, KernelConfig(32, 64, 4, 2), KernelConfig(32, 64, 4, 2), "one wave"),
)


def short_context_config(rows: int, head_dim: int, max_seq_len: int, batch_size: int, num_kv_heads: int,
                         num_sms: int, interpret: bool = False, fp8: bool = False) -> KernelConfig | None:
    """The tl-kernel config for a batch whose every S_b is short (`SHORT_CONFIGS`, the first
    entry that holds), or None (the tuned table applies; always under the CPU interpreter,
    `interpret`). rows = G * max T_b; max_seq_len = max S_b; fp8: the pools hold fp8 codes (an
    entry without an fp8 config is skipped). D 128 only (the measured one). Raises nothing."""
    if head_dim != 128 or interpret:
        return None
    for max_s, min_rows, max_rows, cfg, cfg_fp8, grid in SHORT_CONFIGS:
        chosen = cfg_fp8 if fp8 else cfg
        if chosen is None or not (max_seq_len <= max_s and min_rows < rows <= max_rows):
            continue
        programs = batch_size * num_kv_heads * math.ceil(rows / chosen.block_m)
        if grid == "any" or grid == "one wave" and programs <= 2 * num_sms or grid == "fills" and programs >= num_sms:
            return chosen
    return None


def ws_fills(config: KernelConfig, batch_size: int, num_kv_heads: int, rows: int, num_sms: int,
             tl_tma: bool = True) -> bool:
    """True when the warp-specialised kernel should run this batch: the tl kernel's
    64-row programs (B * Hkv * ceil(rows / 64)) would need more than one wave at its
    2 programs per SM, or they fill every SM at least once (no split-KV) and the tl kernel
    would read the pool by per-token pointer gathers (tl_tma False: a tile spans several
    pages, as at P 16 or 32) where the warp-specialised kernel reads one TMA box per page. Within one wave every tl program runs at once and the
    warp-specialised kernel's fixed costs lost to the tl kernel's TMA path (run V, seed suite
    back to back: the 27-node and eagle trees at B 16 1.03-1.19x at L 16 and 1024; B 1
    1.2-1.6x in run 8); its gather at P 16 took 1.33x of P 128's TMA on those trees at B 16,
    L 2048 (the seed run at 4aba09b, `lab/runs.md`), where the warp-specialised kernel's P 16 stayed
    within 1.04x of its P 128 at B 64 (`results/h200/pages/`).

    Args:
        config: the table's config for the batch (a tl-kernel config: always True).
        batch_size, num_kv_heads: B and Hkv.
        rows: G * max T_b, the packed rows per (request, KV head).
        num_sms: multiprocessors of the device (132 on an H200).
        tl_tma: the tl kernel's config would read the context tiles by TMA
            (`kv_desc_unsupported` has no reason against its BLOCK_N).
    Raises nothing."""
    if not config.ws:
        return True
    programs = batch_size * num_kv_heads * math.ceil(rows / 64)
    return programs > 2 * num_sms or not tl_tma and programs >= num_sms


def ws1_config(rows: int, head_dim: int, batch_size: int, num_kv_heads: int, num_sms: int,
               page_path: str, fp8: bool = False, fp8_ws: bool = True) -> KernelConfig | None:
    """WS1 (the warp-specialised kernel with one consumer warpgroup) or WS1_FP8 for a batch the
    table gives the tl kernel's 64-row tile, or None (the table's choice stands).

    bf16 / fp16 pools (fp8 False): WS1 where rows = G * max T_b is 33-64 (one 64-row M-tile, as
    full:3:2's 52 rows at G 4), D is 128, the warp-specialised kernel would read the pool one TMA
    box per page (page_path "tma-page": P 16 or 32, where the tl kernel gathers per token) and the
    B * Hkv programs fill at least TC_FULL_FRACTION of the SMs in one wave of one program per SM
    (no split-KV). Measured on the H200 for full:3:2 at B 16 (128 programs on 132 SMs), L 1024 and
    2048, P 16, L2 flushed (`results/h200/kernel/ws1-sweep.txt`): 0.82x and 0.86x of the tl
    kernel's gather with its 2 splits (0.84x and 0.82x of its one split), which brings P 16 to
    1.00x of the tl kernel's P 128 at L 2048; 2 stages took 0.98-1.05x of the gather and 4 stages
    1.00x of 3. At B 64 (512 programs) it took 1.02-1.03x of the tl kernel's gather, which keeps
    it there.

    Also WS1 for bf16 / fp16 pools of 9-16 rows (full:3:1's 16 at G 4; WS1_FEW_ROWS) at D 128 in
    that one wave, whether TMA reads whole 64-token tiles (page_path "tma", P 64 and up) or one box
    per page: its producer warp keeps three 64-token tiles in flight per SM where the tl kernel's
    16-row tile needs 4 splits to fill the GPU, and no merge runs. Measured on the H200 for full:3:1
    at B 16, L 1024 and 2048, P 16 and 128, L2 flushed, flashinfer_xqa and vllm_triton in the same
    process (`results/h200/kernel/decode-ws1.txt`, the `ws1x3 splits1` candidate, WS1 with one
    split): 0.92-0.96x of the tl kernel's 16-row tile with 4 splits; full:3:0's 4 rows took
    0.98-0.99x at P 16 and 1.00-1.02x at P 128 and keep the tl kernel; 2 or 4 splits of WS1 took
    1.04-1.21x, 4 or 6 stages 0.99-1.04x of 3. Rows 9-15 were not measured (no seed tree has them).

    fp8 pools (fp8 True, with the warp-specialised fp8 build on, fp8_ws): WS1_FP8 where rows is
    33-64, D is 128, TMA reads the pool (page_path "tma" or "tma-page") and the B * Hkv programs
    fill at least TC_FULL_FRACTION of the SMs: the tl kernel converts every tile in the warps
    that run its MMAs, WS1_FP8's converter warpgroup beside them. Measured on an H100 for full:3:2,
    e4m3, L2 flushed, against the tl kernel's fp16 path in the same process
    (`results/h100/kernel/fp8-ws1-rule.txt`): 0.92-0.95x at B 64, L 1024 and 2048, P 16 and 128;
    0.77-0.86x at B 16 (128 programs, where the tl kernel takes 2 splits at P 16); two converter
    warpgroups, one for K and one for V, took 1.13-1.18x of one at B 64, L 2048
    (`fp8-ws1-2cvt.txt`); full:3:1 (16 rows) keeps the tl kernel, whose 16-row tile took
    0.84-0.92x of WS1_FP8 there.

    Args:
        rows: G * max T_b.
        head_dim: D.
        batch_size, num_kv_heads: B and Hkv.
        num_sms: multiprocessors of the device (132 on an H200).
        page_path: `ws_page_path` of the pool's page size for a 64-token tile.
        fp8: the pools hold fp8 codes.
        fp8_ws: fp8 pools may take the warp-specialised kernel (`KernelOptions.ws_fp8`).
    Raises nothing."""
    programs = batch_size * num_kv_heads
    few = WS1_FEW_ROWS[0] < rows <= WS1_FEW_ROWS[1] and not fp8
    if not ((32 < rows <= 64 or few) and head_dim == 128):
        return None
    if fp8:
        return WS1_FP8 if fp8_ws and page_path in ("tma", "tma-page") and programs >= TC_FULL_FRACTION * num_sms \
            else None
    if (page_path == "tma-page" or few and page_path == "tma") and TC_FULL_FRACTION * num_sms <= programs <= num_sms:
        return WS1
    return None


WS1_FEW_ROWS = (8, 16)   # (above, up to): the rows per KV head of the decode-like batches WS1 also takes


def ws_page_path(page_size: int, block_n: int, page_tma: bool = False, gather: bool = False) -> str:
    """How the warp-specialised kernel reads a pool of `page_size`-token pages in `block_n`-token
    tiles (`TreeAttention.kernel`'s page path):

    - "tma": P % block_n == 0, one TMA box per tile (inside one page);
    - "tma-page": with page_tma (`KernelOptions.ws_page_tma`), P a multiple of 16 that divides
      block_n: one TMA box of P rows per page;
    - "gather": with gather (`KernelOptions.ws_gather`), any other P >= 1: the producer's
      cp.async gathers, a page lookup per token row (`tree_attention_gather`);
    - "": none of them (the pool keeps the tl kernel).

    Raises nothing."""
    if page_size % block_n == 0:
        return "tma"
    if page_tma and page_size % 16 == 0 and block_n % page_size == 0:
        return "tma-page"
    return "gather" if gather else ""


def choose_num_splits(programs: int, kv_tiles: list[int], num_sms: int, block_m: int,
                      tma_tiles: bool = False, programs_per_sm: int = 2) -> int:
    """KV splits per (request, KV head) so that the grid fills the GPU.

    Args:
        programs: B * Hkv * M-tiles, the grid without split-KV.
        kv_tiles: ceil(S_b / BLOCK_N) per request.
        num_sms: multiprocessors of the device (132 on an H200).
        block_m: the config's BLOCK_M.
        tma_tiles: the context tiles are loaded through TMA descriptors (the
            forward kernel's KV_DESC path, or the warp-specialised kernel).
        programs_per_sm: how many of the larger tiles' programs fit one SM (2 for
            the tl kernel's BLOCK_M 64; the warp-specialised kernel's from its
            shared memory).

    Returns:
        1 when the grid already fills the GPU, or for the larger tiles read by TMA when it
        fills TC_FULL_FRACTION of it (a second wave of splits and the merge cost more than the
        idle SMs: full:3:2's 52 rows at B 16, 128 programs on 132 SMs, took 0.83-0.88x of
        2 splits' time at P 128, L 1024 and 2048, `results/h200/kernel/decode-sweep.txt`;
        at P 16, the per-token gather, 0.95x at L 1024 and 1.04x at L 2048, so it keeps the
        rule below). Else, for the memory-bound
        BLOCK_M 16 tiles, enough splits for 3 programs per SM, down to one KV
        tile per split (at most STREAM_MAX_SPLITS): short splits hide the
        latency of a small batch. For the tensor-core-bound larger tiles, as
        many splits as fit one wave at programs_per_sm (their occupancy),
        keeping at least MIN_TILES_PER_SPLIT tiles in each split and, with TMA
        tiles, at most TC_MAX_SPLITS splits. Chosen from the split sweeps on the H200
        (lab/splits_sweep.py, run4-splits.csv in lab/runs.md; the TMA
        kernel's in run5*; docs/kernel.md).
    """
    if programs >= num_sms or block_m > 16 and tma_tiles and programs >= TC_FULL_FRACTION * num_sms:
        return 1
    if block_m <= 16:
        want = math.ceil(3 * num_sms / programs)
        cap = min(max(kv_tiles), STREAM_MAX_SPLITS)
    else:
        want = (programs_per_sm * num_sms) // programs
        cap = max(kv_tiles) // MIN_TILES_PER_SPLIT
        if tma_tiles:
            cap = min(cap, TC_MAX_SPLITS)
    return max(1, min(want, cap, MAX_SPLITS))


TC_FULL_FRACTION = 0.9      # larger TMA tiles: a grid this full of the SMs takes no split-KV
MIN_TILES_PER_SPLIT = 3     # tensor-core-bound tiles: fewer made B 1 slower (run 4)
TC_MAX_SPLITS = 8           # tensor-core-bound tiles read by TMA: 11 splits slower than 8 at L 2048,
                            # while P 16 (a page lookup per token) lost 3-11% with the cap (run 5)
STREAM_MAX_SPLITS = 24      # memory-bound tiles: the largest split count measured (run 4)
MAX_SPLITS = 64


def make_plan(batch_size: int, num_kv_heads: int, group_size: int, tree_sizes: list[int],
              seq_lens: list[int], head_dim: int, *, num_sms: int, interpret: bool,
              config: KernelConfig | None = None, num_splits: int | None = None,
              tma_tiles: bool = False) -> Plan:
    """Chooses the config (unless given: the tl kernel's tuned one, as `TreeAttention`
    decides on the warp-specialised kernel itself), the M-tiling and split-KV for one
    batch (tma_tiles: the forward kernel will load the context tiles through TMA).

    Raises:
        ConfigError: num_splits not an integer in [1, MAX_SPLITS], or (no config given)
            a head dim over 256.
    """
    cfg = config or choose_config(group_size * max(tree_sizes), head_dim, interpret, ws=False)
    m_tiles = math.ceil(group_size * max(tree_sizes) / cfg.block_m)
    programs = batch_size * num_kv_heads * m_tiles
    tiles = [math.ceil(s / cfg.block_n) for s in seq_lens]
    if num_splits is None:
        num_splits = 1 if interpret else choose_num_splits(programs, tiles, num_sms, cfg.block_m,
                                                           tma_tiles or bool(cfg.ws), cfg.ctas_per_sm(head_dim))
    if not is_integer(num_splits) or not 1 <= num_splits <= MAX_SPLITS:
        raise ConfigError(f"num_splits={num_splits!r}: must be an integer from 1 (split-KV off) "
                          f"to {MAX_SPLITS}")
    num_splits = int(num_splits)
    return Plan(cfg, num_splits, m_tiles, programs * num_splits, math.ceil(max(tiles) / num_splits))


def pack_tree_masks(trees: list[TokenTree]) -> torch.Tensor:
    """The per-request bitmask the kernel reads: (sum T_b, W) int64 on the CPU,
    W = ceil(max T_b / 64); bit j % 64 of word [qo_b + i, j // 64] is set iff
    tree node j is node i or an ancestor of it (row i of `ancestor_mask`)."""
    width = math.ceil(max(t.size for t in trees) / 64)
    rows = []
    for tree in trees:
        m = np.zeros((tree.size, width * 64), dtype=bool)
        m[:, :tree.size] = tree.ancestor_mask.numpy()
        rows.append(np.packbits(m.reshape(tree.size, width, 64), axis=-1, bitorder="little"))
    words = np.ascontiguousarray(np.concatenate(rows)).view("<i8")   # (sum T, W, 1)
    return torch.from_numpy(words.reshape(-1, width).copy())


def tree_bias(trees: list[TokenTree]) -> torch.Tensor:
    """vLLM's shared `qq_bias`: (T, T) fp32, 0 where node j is i or an ancestor
    of i, -inf elsewhere.

    Raises:
        ConfigError: the requests do not all share one tree.
    """
    if any(t.parents != trees[0].parents for t in trees):
        raise ConfigError("tree_per_request: the shared qq_bias mode needs one tree for the whole batch "
                          "(use tree_per_request = 'same', or the per-request bitmask backend triton_tree)")
    return trees[0].additive_bias(torch.float32)


def ws_pool_unsupported(q_dtype: torch.dtype, kv_dtype: torch.dtype, k_scale: float, v_scale: float,
                        fp8: bool = False) -> str:
    """Why the warp-specialised kernel cannot read K/V pools of kv_dtype (Q: q_dtype), or "": Q's dtype
    with scales 1, or with fp8 (`KernelOptions.ws_fp8`) fp8 codes with any scales. Raises nothing."""
    if kv_dtype in FP8_KV_DTYPES:
        return "" if fp8 else (f"kv dtype {kv_dtype}: the warp-specialised kernel reads fp8 pools only with "
                               "KernelOptions.ws_fp8 (its converter warpgroup)")
    if kv_dtype != q_dtype:
        return f"kv dtype {kv_dtype}: the warp-specialised kernel reads pools in Q's dtype ({q_dtype}) or fp8 codes"
    if (k_scale, v_scale) != (1.0, 1.0):
        return "k_scale / v_scale other than 1 with a bf16/fp16 pool: the warp-specialised kernel scales fp8 pools only"
    return ""


def check_inputs(dtype: torch.dtype, head_dim: int, mask_mode: str, kv_dtype: torch.dtype | None = None) -> None:
    """Raises ConfigError naming the field when the kernel cannot take these inputs
    (dtype: Q's; kv_dtype: the K/V pools', None for Q's: the same dtype or fp8 codes)."""
    if dtype not in DTYPES:
        raise ConfigError(f"dtype {dtype}: the Triton tree kernel takes bfloat16 or float16")
    if kv_dtype is not None and kv_dtype != dtype and kv_dtype not in FP8_KV_DTYPES:
        raise ConfigError(f"kv dtype {kv_dtype}: the Triton tree kernel reads K/V pools in Q's dtype ({dtype}) "
                          "or as float8_e4m3fn / float8_e5m2 codes")
    if head_dim not in HEAD_DIMS:
        raise ConfigError(f"head dim {head_dim}: the Triton tree kernel takes D in {HEAD_DIMS}")
    if mask_mode not in MASK_MODES:
        raise ConfigError(f"mask_mode {mask_mode!r}: use one of {', '.join(MASK_MODES)}")
