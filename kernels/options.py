"""The launch choices of one `TreeAttention` that are not part of its plan: `KernelOptions`.

Each `TreeAttention` carries its own frozen `KernelOptions`, so two launch
objects built with different options in one process (an A/B side by side, a
lab script's variant next to the default) never affect each other. The
defaults are the measured choices of docs/kernel.md; a non-default field is
for measuring against them.

Pure Python (no Triton import): backends and lab scripts build options on a
machine without Triton.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from treebench.harness.errors import ConfigError
from treebench.kernels.tree_attention_plan import WS3_PIPE_MIN_TILES, is_integer

__all__ = ["CVT_ONE_TILE_MAX_ROWS", "FP8_PATHS", "KernelOptions"]

# How the tl kernel turns a tile of fp8 codes into MMA operands (`KernelOptions.fp8_path`);
# the index is the kernel's FP8_PATH.
FP8_PATHS = ("cast", "bits", "fp16", "cvt", "split")
# fp8_path=None's rule: "cvt" in the one-tile build over per-token page lookups up to this many packed rows
CVT_ONE_TILE_MAX_ROWS = 64


@dataclass(frozen=True)
class KernelOptions:
    """How `TreeAttention` launches its plan. The defaults give the tuned launches.

    Attributes:
        kv_desc: load the tl kernel's context tiles through TMA tensor descriptors.
            None (default): wherever `kv_desc_unsupported` finds no reason against it
            (run 5a: 3-7% faster, docs/kernel.md). True: the
            same, but a reason against raises ConfigError. False: pointer loads; the
            warp-specialised kernel loads every tile by TMA, so False selects the tl kernel.
        ws_pipe: the warp-specialised kernel's intra-warpgroup pipelining (its PIPE).
            None (default): the tuned rule, `KernelConfig.ws_pipe_for` (run 10's A/B);
            True / False: forced, for measuring against the rule.
        ws3_pipe_min_tiles: under ws_pipe=None, the KV tiles per work item from which
            3 consumer warpgroups pipeline. Default `WS3_PIPE_MIN_TILES` (32, run 10:
            shorter loops do not earn back the pipelined build's extra spills); a value
            above every split's tiles (1 << 30) gives the earlier rule, 3 warpgroups
            never pipelined.
        ws_persist: the warp-specialised kernel runs one wave of persistent programs,
            each taking work items in turn. True (default: the producer streams the next
            item's first tiles while the consumers finish the last one; run 8c: 3.5% on the
            27-node tree at B 64). False: one program per work item.
        pdl: with split-KV and a separate merge kernel after the tl kernel, launch the
            merge as a programmatic dependent launch (its launch overlaps the forward
            kernel's last programs). None (default): wherever `pdl_unsupported` finds no
            reason against it (run 6d: B 1 cells 2.2-5.8% faster, docs/kernel.md). True: the
            same, but a reason against raises ConfigError. False: an ordinary second launch.
        page_gather: the tl kernel's pointer loads of a tile that spans several whole pages
            (BLOCK_N % P == 0, P < BLOCK_N: P 16 and 32 with 64-token tiles) read one
            block-table entry per page and build each page's P row offsets from it. False
            (default): one block-table lookup per token, the path every P takes otherwise.
            Measured 1.0-2.3x slower than the token lookup (lab/latency_sweep.py), so off.
        early_first: the tl kernel's pointer paths load the block-table entries of a split's
            first tile together with the request's lengths, before the early exit, so a call
            whose splits hold one tile (L_b around 16) waits on two dependent loads before
            its K/V, not three. None (default): with the short-context configs
            (`tree_attention_plan.SHORT_CONFIGS`, measured with it: 0.94-0.98x at L 16, P 16);
            off elsewhere (not measured apart from the sweep's noise at L 2048). True / False: forced.
        short_build: the tl kernel's one-tile build where it can run (one split and every
            S_b <= BLOCK_N): the kernel's ONE_TILE, no loop, the tile loaded once and a plain
            softmax with no rescale, no TMA and no block-table look-ahead (after an L2 flush a
            call fetches its instructions cold; `TreeAttention.kernel` ends in " one-tile").
            None (default): with the short-context configs, as early_first, unless kv_desc=True
            asks for TMA context tiles (at L 16 on the H200 0.90-1.01x of the build without it
            flushed and 0.81-0.96x back to back, `results/h200/kernel/short-build-sweep*.txt`).
            True: wherever it can run (with kv_desc=True: ConfigError). False: never.
        ws_page_tma: the warp-specialised kernel at P < 64 that divides its 64-token tile
            (P 16, 32): one TMA box of P rows per page, BLOCK_N // P per tile, all arriving
            on the tile's barrier. True (default: at P 16, L 2048, B 16-64 0.55-0.72x of the tl
            kernel's gather, within 1-4% of P 128). False: such pages keep the tl kernel.
        fp8_path: how the tl kernel makes MMA operands of a tile of fp8 codes (`FP8_PATHS`;
            no effect on bf16 / fp16 pools). None (default): "cvt" in the one-tile build when it
            looks up each token's page (P not a multiple of the tile) for at most
            `CVT_ONE_TILE_MAX_ROWS` packed rows (on an H100 at B 1 and 16, L 16, P 16, over the trees
            of 1-13 nodes it took 0.87-0.97x of "fp16" flushed in two runs, and 1.09-1.17x on the
            trees of 27 nodes or more; at P 128 0.95-1.06x, `results/h100/kernel/fp8-lat-cvt.txt`,
            `fp8-lat-warps.txt`), "fp16" everywhere else. "fp16": the MMAs run in fp16, the codes
            cast to fp16 (one instruction per two codes on sm_90; on the H200, B 64, L 2048,
            0.72-0.81x of "cast" on the six fp8 target cells before the rows of Q were scaled,
            `results/h200/kernel/latency-sweep-fp8paths.txt`, and 0.75-0.76x after, on full:3:1,
            `fp8-default-sweep.txt`).
            "cvt": fp16 MMAs as "fp16", the codes converted by the same hardware instruction
            written as inline PTX, which Triton leaves beside the load: the tile reaches shared
            memory in fp16 and the MMA operands are read by ldmatrix, where "fp16"'s cast is
            moved past the shared-memory round trip and the fp8 tile is read by plain loads (a
            local sm_90 compile of the 16-row tile over e4m3 at P 16: 1055 SASS instructions
            against 1276 one-tile; with the 64-token, 4-stage context loop 2417 against 3367
            and no spills against 10 spilled loads; `lab/sm90_compile.py --ops`, Triton 3.9).
            Not faster on an H100: 1.05-1.08x of "fp16" on full:3:1 at B 64, L 2048, 0.87-1.16x
            (median 1.04) on the L 16 cells (`results/h100/kernel/fp8-cvt.txt`,
            `fp8-lat-cvt.txt`). The interpreter runs it as "fp16" (no PTX).
            "cast": `.to(Q's dtype)` (to bf16 on sm_90: through fp16 and fp32, about 2
            conversions per code). "bits": fp16 MMAs too, the codes' bit fields moved into fp16
            by integer operations (e5m2: a shift). With "fp16", "cvt" and "bits", bf16 queries are
            rounded to fp16 once, each row first divided by the power of 2 that keeps its
            largest |q| within 32768 (the row's scores multiplied back; 1 for every |q| <= 32768),
            so no query overflows (exact for elements within 2^-24 of the row's largest, i.e.
            down to 2^-17 at scale 1), and the probabilities P are rounded to fp16, not bf16.
            "split" (float8_e4m3fn pools with bf16 queries; "fp16" elsewhere): Q K^T as two fp8
            MMAs against K's codes, Q written as the sum of two e4m3 terms per element (each row
            first scaled by a power of 2; exact for elements within 2^-9 of the row's largest |q|, the
            rest within 2^-16 of it),
            so K is never converted; V is cast to fp16 and P V runs in fp16. On an H100 the 64-row
            tile took 0.85-0.91x of "fp16" at B 64, L 2048 but the plan's 16-row tile 1.03x, and the
            fp8 MMAs accumulate below fp32 (`results/h100/kernel/fp8-split.txt`): not the default.
            Every path is exact for every finite code (docs/kernel.md, "fp8 pools").
        ws_gather: the warp-specialised kernel at page sizes neither of its TMA paths reads
            (P not a multiple of the tile, and not a multiple of 16 that divides it: P 1, 3, 8,
            24, 40, 48, 96 with 64-token tiles): its producer, a warpgroup, gathers each tile
            row by row with cp.async (`tree_attention_gather`). True (default): on an H200 at
            L 2048 it took 0.48-0.70x of the tl kernel's per-token gather at P 1 and 8 on the
            27-node tree, full:3:3 and medusa at B 16 and 64 (`results/h200/kernel/ws-gather-sweep.txt`).
            False: such pages keep the tl kernel. Pools TMA can read keep the TMA paths either way.
        ws_fp8: fp8 pools (float8_e4m3fn / float8_e5m2 codes, any k_scale / v_scale) in the
            warp-specialised kernel: the producer's TMA lands the codes in a ring of their own, a
            converter warpgroup writes each tile once in Q's dtype for all consumer warpgroups
            (V rows past S_b as zeros), and the plan's WS2 / WS3 rows take their fp8 twins
            (`tree_attention_plan.WS_FP8_CONFIGS`), where the plan's `ws_fills` rule takes the
            warp-specialised kernel, as for bf16 pools, and batches of 33-64 rows take WS1_FP8
            (one consumer warpgroup, `tree_attention_plan.ws1_config`).
            True (default): on an H200 at B 64, L 2048 over e4m3 it took 0.70-0.80x of the tl
            kernel's time on the 27-node, eagle and medusa trees (`results/h200/kernel/fp8-ws-fence.txt`),
            and its GPU tests pass (`pytest-ws-fp8-fence.txt`). False: fp8 pools run the tl
            kernel. No effect on bf16 / fp16 pools, whose build is unchanged.
        ws_fp8_fences: the fp8 converter's `fence_async_shared` + barrier pairs per K/V tile
            (`tree_attention_ws_fp8.convert_kv_tile`). 1 (default): both tiles converted and stored,
            then one fence and barrier before the three arrivals (the fp8 slot's release, K's and V's
            readiness). 2: K published behind its own, the rest behind a second. 3: K published,
            the fp8 slot released and V published each behind its own (the first build). In an
            Nsight Compute profile of the 3-pair build (an H100, full:3:2 at B 64, L 2048, e4m3, one
            consumer warpgroup) a third of the converter's stall samples sat on the fences and the
            barriers after them, the consumers' largest stall was the wait for converted K, and
            the producer's the wait for free fp8 slots; 1 pair took 0.92-0.95x of 3 there and
            0.97x on the 27-node tree (`results/h100/kernel/fp8-ws1-fences.txt`,
            `fp8-ws-fences.txt`). No effect on bf16 / fp16 pools or the tl kernel.
        token_pages: the tl kernel's pointer loads look up each token's page in the block table even
            where a tile lies inside one page (P a multiple of BLOCK_N), as they do for smaller pages
            (`TreeAttention.kernel` then says "gather"); no effect on TMA loads. None (default): on for
            fp8 pools in the one-tile build of up to `CVT_ONE_TILE_MAX_ROWS` packed rows, where with
            fp8_path's "cvt" it took 0.90-0.96x of the one-lookup build at P 128 on an H100 (B 1 and
            16, L 16, the trees of 1-13 nodes; with "fp16" 0.96-1.12x,
            `results/h100/kernel/fp8-lat-token-pages.txt`); off elsewhere. True / False: forced.
    Raises:
        ConfigError: a field of the wrong type (see `__post_init__`).
    """

    kv_desc: bool | None = None          # TMA descriptor loads of context tiles (None: wherever possible)
    ws_pipe: bool | None = None          # warp-specialised PIPE (None: KernelConfig.ws_pipe_for)
    ws3_pipe_min_tiles: int = WS3_PIPE_MIN_TILES   # ws_pipe_for's threshold for 3 consumer warpgroups
    ws_persist: bool = True              # warp-specialised kernel as one wave of persistent programs
    pdl: bool | None = None              # merge kernel as a programmatic dependent launch (None: wherever possible)
    page_gather: bool = False            # tl pointer loads: one block-table entry per page, not per token
    early_first: bool | None = None      # tl pointer paths: a split's first tile's pages loaded with the lengths
    short_build: bool | None = None      # tl kernel: one tile, no loop (None: with the short configs)
    ws_page_tma: bool = True             # warp-specialised kernel at P 16 / 32: one TMA box per page
    ws_gather: bool = True               # warp-specialised kernel at pages TMA cannot read: cp.async gathers
    fp8_path: str | None = None          # tl kernel, fp8 pools: None (the rule), or one of FP8_PATHS
    ws_fp8: bool = True                  # fp8 pools in the warp-specialised kernel (a converter warpgroup)
    ws_fp8_fences: int = 1               # the fp8 converter's fence + barrier pairs per K/V tile: 1, 2 or 3
    token_pages: bool | None = None      # tl pointer loads: each token's page looked up (None: the fp8 one-tile rule)

    def __post_init__(self) -> None:
        """Checks every field's type.

        Raises:
            ConfigError: kv_desc, ws_pipe, pdl, early_first, short_build or token_pages not None / True / False;
                short_build=True with kv_desc=True (the short build has no context loop to load by TMA);
                ws_persist, page_gather, ws_page_tma, ws_gather or ws_fp8 not a bool;
                ws3_pipe_min_tiles not a
                positive integer; fp8_path neither None nor one of `FP8_PATHS`; ws_fp8_fences not 1, 2 or 3. The message names the
                field and the value.
        """
        for name in ("kv_desc", "ws_pipe", "pdl", "early_first", "short_build", "token_pages"):
            v = getattr(self, name)
            if not (v is None or isinstance(v, bool)):
                raise ConfigError(f"KernelOptions {name}={v!r}: must be None (the default rule), True or False")
        if self.short_build is True and self.kv_desc is True:
            raise ConfigError("KernelOptions short_build=True with kv_desc=True: the short build has no context loop "
                              "to load by TMA (pass kv_desc=None or False)")
        for name in ("ws_persist", "page_gather", "ws_page_tma", "ws_gather", "ws_fp8"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"KernelOptions {name}={getattr(self, name)!r}: must be True or False")
        if self.fp8_path is not None and self.fp8_path not in FP8_PATHS:
            raise ConfigError(f"KernelOptions fp8_path={self.fp8_path!r}: must be one of {', '.join(FP8_PATHS)}")
        if not is_integer(self.ws_fp8_fences) or self.ws_fp8_fences not in (1, 2, 3):
            raise ConfigError(f"KernelOptions ws_fp8_fences={self.ws_fp8_fences!r}: must be 1, 2 or 3")
        if not is_integer(self.ws3_pipe_min_tiles) or self.ws3_pipe_min_tiles < 1:
            raise ConfigError(f"KernelOptions ws3_pipe_min_tiles={self.ws3_pipe_min_tiles!r}: "
                              "must be a positive integer")

    def short_build_on(self, short_config: bool) -> bool:
        """Whether the tl kernel takes its short build (the `short_build` rule): short_config is
        True where `tree_attention_plan.short_context_config` gave the batch's config. Raises nothing."""
        if self.short_build is None:
            return short_config and self.kv_desc is not True
        return self.short_build

    def changed(self) -> dict[str, object]:
        """The fields that differ from the defaults, {name: value} (for logs and CSV rows)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) != f.default}
