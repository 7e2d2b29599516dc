"""Tree attention over a paged KV cache: the launch object, `TreeAttention`.

`TreeAttention` does all host work once (checks, plan, mask packing, buffers,
descriptors, a warm-up launch) and then launches, per call, one of two forward
kernels and, with split-KV, the merge kernel:

- `tree_attention_tl.tree_attn_fwd_kernel`, the tl kernel (Triton's tile
  language): every GPU, and the CPU under TRITON_INTERPRET=1;
- `tree_attention_ws.tree_attn_ws_kernel`, the warp-specialised Gluon kernel
  for sm_90, where the plan's config asks for it (`KernelConfig.ws`) and
  `ws_unsupported` finds no reason against it;
- `tree_attention_reduce.tree_attn_merge_kernel` for split-KV, as a
  programmatic dependent launch where `pdl_unsupported` allows.

docs/kernel.md explains the kernels and the measurements behind every choice.
"""

from __future__ import annotations

import torch
import triton
from triton.tools.tensor_descriptor import TensorDescriptor

from treebench.harness.errors import ConfigError
from treebench.harness.model.paged import BatchInputs, triton_interpret
from treebench.kernels.launch import FixedLaunch, verify_fast_path
from treebench.kernels.options import CVT_ONE_TILE_MAX_ROWS, FP8_PATHS, KernelOptions
from treebench.kernels.tree_attention_plan import (FP8_KV_DTYPES, MASK_MODES, SMEM_PER_SM, WS_CONVERTER_REGS,
                                         WS1, WS_FP8_CONFIGS, WS_MIN_CONSUMER_REGS, KernelConfig, check_inputs,
                                         choose_config, is_integer, make_plan, next_pow2, pack_tree_masks,
                                         short_context_config, tree_bias, ws1_config, ws_fills, ws_page_path,
                                         ws_pool_unsupported)
from treebench.kernels.tree_attention_reduce import HAS_PDL, tree_attn_merge_kernel
from treebench.kernels.tree_attention_tl import LOG2E, tree_attn_fwd_kernel

__all__ = ["KernelOptions", "TreeAttention", "kv_desc_unsupported", "pdl_unsupported", "tree_attn_fwd_kernel",
           "ws_unsupported"]

# ---- host side: prepare once, then launch -------------------------------------------


def pdl_unsupported(device: torch.device) -> str:
    """Why the split-KV merge kernel cannot be a programmatic dependent launch on `device`.

    Args:
        device: the batch's device (`BatchInputs.device`).

    Returns:
        "" when it can (a CUDA device of sm_90 or newer, a Triton with griddepcontrol,
        not the CPU interpreter); else the first reason against, one line. Raises nothing.
    """
    if interpreting() or device.type != "cuda":
        return "programmatic dependent launch needs a CUDA GPU (not the Triton interpreter)"
    if torch.cuda.get_device_capability(device)[0] < 9:
        return "programmatic dependent launch needs sm_90 or newer"
    if not HAS_PDL:
        return f"Triton {triton.__version__} has no griddepcontrol (gdc_wait)"
    return ""


def kv_desc_unsupported(inputs: BatchInputs, block_n: int) -> str:
    """Why the context tiles cannot be loaded through TMA descriptors, or "" when they can.

    Args:
        inputs: the batch; its k_cache / v_cache are the (N, P, Hkv, D) bf16/fp16 pools.
        block_n: BLOCK_N, KV tokens per tile.

    Returns:
        "" when a tile lies in one page (P % BLOCK_N == 0), the pools are contiguous
        NHD with 16-byte aligned bases and fewer than 2**31 token slots (int32 TMA
        coordinates), and the device has TMA (sm_90+, or Triton's CPU interpreter,
        which emulates it); else the first reason against, one line. Raises nothing.
    """
    kc, vc = inputs.k_cache, inputs.v_cache
    n, p, hkv, d = kc.shape
    if p % block_n:
        return f"page size {p} is not a multiple of BLOCK_N {block_n}"
    if not (kc.is_contiguous() and vc.is_contiguous()):
        return "the K/V pools are not contiguous (N, P, Hkv, D)"
    if kc.data_ptr() % 16 or vc.data_ptr() % 16:
        return "the K/V pools are not 16-byte aligned"
    if n * p >= 2**31:
        return f"the pool has {n * p} token slots; TMA coordinates are int32"
    if kc.device.type == "cuda" and torch.cuda.get_device_capability(kc.device)[0] < 9:
        return "TMA needs sm_90 or newer"
    if kc.device.type != "cuda" and not interpreting():
        return "TMA needs a CUDA device or the Triton interpreter"
    return ""


def ws_unsupported(inputs: BatchInputs, block_n: int = 64, page_tma: bool = False, gather: bool = False,
                   fp8: bool = False) -> str:
    """Why the warp-specialised Gluon kernel (`tree_attention_ws`) cannot run this batch, or "".

    Args:
        inputs: the batch.
        block_n: the config's KV tokens per tile (32 or 64).
        page_tma: one TMA box per page where a tile spans several pages
            (`KernelOptions.ws_page_tma`): P a multiple of 16 that divides block_n is taken too.
        gather: cp.async page gathers where neither TMA path reads the pool
            (`KernelOptions.ws_gather`): any other P is taken too (`ws_page_path`).
        fp8: fp8 pools through the converter warpgroup (`KernelOptions.ws_fp8`; TMA paths only).

    Returns:
        "" for pools `ws_pool_unsupported` takes (with fp8: fp8 codes, any scales) on an sm_90
        GPU (wgmma is Hopper's; sm_100 has none) with a Triton whose Gluon has the Hopper API,
        D 64 or 128 and pools TMA can read in block_n-token tiles (`kv_desc_unsupported`, or
        with page_tma in P-token boxes) or, with gather, contiguous 16-byte aligned bf16/fp16
        pools of any P; else the first reason against, one line. Raises nothing.
    """
    why = ws_pool_unsupported(inputs.q.dtype, inputs.k_cache.dtype, inputs.k_scale, inputs.v_scale, fp8)
    if why:
        return why
    if interpreting() or inputs.device.type != "cuda":
        return "the warp-specialised kernel needs a CUDA GPU (Gluon does not run in the Triton interpreter)"
    if torch.cuda.get_device_capability(inputs.device) != (9, 0):
        return "the warp-specialised kernel needs sm_90 (wgmma)"
    d, p = inputs.q.shape[-1], inputs.k_cache.shape[1]
    if d not in (64, 128):
        return f"head dim {d}: the warp-specialised kernel takes D 64 or 128 (shared memory)"
    path = ws_page_path(p, block_n, page_tma, gather)
    if path == "gather" and inputs.k_cache.dtype in FP8_KV_DTYPES:
        return (f"page size {p} with an fp8 pool: the warp-specialised kernel's gathers read bf16/fp16 pools "
                "(its fp8 converter reads TMA tiles)")
    # TMA boxes of a tile (tma) or of a page (tma-page); the gathers need only the pools' layout,
    # which the same checks with P-token boxes give
    why = kv_desc_unsupported(inputs, p if path in ("tma-page", "gather") else block_n)
    if why and not path:
        why += " (KernelOptions.ws_gather=True reads any page size)"
    if why:
        return why
    try:
        import treebench.kernels.tree_attention_ws  # noqa: F401
    except ImportError as e:
        return f"Triton {triton.__version__} has no Gluon Hopper API ({e})"
    return ""


def interpreting() -> bool:
    """True under TRITON_INTERPRET=1 (or true, yes, on: Triton's CPU interpreter; `paged.triton_interpret`)."""
    return triton_interpret()


class TreeAttention:
    """Tree attention for one prepared batch; call it to launch.

    Attributes:
        plan: the tile config, split-KV and grid chosen for the batch.
        options: the `KernelOptions` it was prepared with.
        out: (sum T_b, Hq, D) in the input dtype, written by every call.
        lse: (sum T_b, Hq) fp32 natural-log LSE when prepared with return_lse, else None.
        kernel: the path taken, e.g. "ws tma splits=1" or "tl gather splits=4": the forward
            kernel (tl / ws), its page path (tma: TMA boxes of whole tiles; tma-page: one
            TMA box per page; tile: a tile inside one page, pointer loads; gather: page
            lookups per token, on ws by cp.async; gather-page: per page) and the KV split count,
            then the tl kernel's short build if it takes one ("tl tile splits=1 one-tile").
        short_build: that build (`KernelOptions.short_build`): "one-tile" or "".
        kv_desc: the context tiles are loaded through TMA descriptors.
        ws_path: the warp-specialised kernel's page path (`ws_page_path`); "" on the tl kernel.
        pdl: the split-KV merge kernel is a programmatic dependent launch.
        ws: the forward kernel is the warp-specialised Gluon one (`tree_attention_ws`).
        ws_pipe: that kernel pipelines within each consumer warpgroup (its PIPE:
            `KernelConfig.ws_pipe_for`, or `options.ws_pipe` when set); None on the tl kernel.
    """

    def __init__(self, inputs: BatchInputs, mask_mode: str = "tree", *, return_lse: bool = False,
                 config: KernelConfig | None = None, num_splits: int | None = None,
                 fast_launch: bool = True, fused_merge: bool = False, merge_rows: int = 1,
                 ws: bool | None = None, options: KernelOptions | None = None):
        """Does all host work: checks, plan, mask packing, buffers, a warm-up launch.

        Args:
            inputs: the batch (adapter contract); its tensors stay referenced.
            mask_mode: "tree" (per-request bitmask), "bias" (one shared (T, T)
                fp32 qq_bias) or "causal" (j <= i, no tree mask).
            return_lse: also write `lse`.
            config: a KernelConfig instead of the tuned table's.
            num_splits: KV splits instead of the heuristic's (1 = split-KV off).
            fast_launch: replay through the compiled launcher after the warm-up.
            fused_merge: with split-KV, merge in the forward kernel's last split
                program (one launch) instead of a second merge kernel; off by
                default: its serial merge measured slower on the H200 (docs/kernel.md).
            merge_rows: (sum T, Hq) rows per program of the split-KV merge kernel, a
                power of 2 from 1 to 16 (1, the measured default; G groups a KV head's rows).
            ws: the warp-specialised Gluon kernel (`tree_attention_ws`). None (default):
                where the tuned table's config is a warp-specialised one (`KernelConfig.ws`
                > 0), `ws_unsupported` finds no reason against it and the batch is large
                enough (`ws_fills`), or with one consumer warpgroup where `ws1_config` gives it
                (33-64 rows over P 16 / 32 in one wave that fills the SMs, no short-context
                config); else the table's tl-kernel config. True: the table's
                warp-specialised config whatever the batch size. False: always the tl
                kernel. A `config` with ws > 0 is run as given. The warp-specialised
                kernel loads every tile by TMA (options.ws_gather: by cp.async where TMA cannot
                read the pool) and merges splits in a second kernel, so
                options.kv_desc=False or fused_merge=True select the tl kernel. ws=True, or a
                warp-specialised `config`, where it cannot run raises ConfigError.
            options: the launch choices outside the plan (`treebench.kernels.options.KernelOptions`:
                TMA descriptor loads of the context tiles, `triton.tools.tensor_descriptor.
                TensorDescriptor` over the pools viewed as (N * P, Hkv * D); the
                warp-specialised kernel's PIPE and persistent wave; the merge kernel as a
                programmatic dependent launch, Triton's launch_pdl). None: KernelOptions(),
                the tuned launches. Only this object's options are read, no module state.

        Raises:
            ConfigError: a config that is not a KernelConfig, unsupported dtype, head dim, mask
                mode, mixed trees in bias mode, merge_rows not a power of 2 in [1, 16], num_splits
                not an integer in [1, 64], options not a KernelOptions, options.kv_desc=True where
                `kv_desc_unsupported` gives a reason, options.pdl=True where `pdl_unsupported` does,
                ws not None / True / False, ws=True where the table has no warp-specialised
                config for the rows and D, or ws=True / a warp-specialised `config` that
                cannot run here (see ws).
        """
        check_inputs(inputs.dtype, inputs.q.shape[-1], mask_mode, inputs.k_cache.dtype)
        if inputs.v_cache.dtype != inputs.k_cache.dtype:
            raise ConfigError(f"v_cache dtype {inputs.v_cache.dtype} differs from k_cache's {inputs.k_cache.dtype}")
        if options is not None and not isinstance(options, KernelOptions):
            raise ConfigError(f"options={options!r}: must be a KernelOptions (treebench.kernels.options)")
        self.options = opts = options or KernelOptions()
        kv_desc, pdl = opts.kv_desc, opts.pdl
        self.inputs, self.mask_mode, self.return_lse = inputs, mask_mode, return_lse
        self.fused_merge = fused_merge
        if not is_integer(merge_rows) or not 1 <= merge_rows <= 16 or merge_rows & (merge_rows - 1):
            raise ConfigError(f"merge_rows={merge_rows!r}: must be an integer power of 2 from 1 to 16")
        self.merge_rows = int(merge_rows)
        ls, ts, ss = inputs.host_lists()
        dev = inputs.device
        hq, d = inputs.q.shape[1], inputs.q.shape[2]
        hkv = inputs.k_cache.shape[2]
        sms = torch.cuda.get_device_properties(dev).multi_processor_count if dev.type == "cuda" else 1
        if not (ws is None or isinstance(ws, bool)):
            raise ConfigError(f"ws={ws!r}: must be None (the plan decides), True or False")
        if config is not None and not isinstance(config, KernelConfig):
            raise ConfigError(f"config={config!r}: must be a KernelConfig (treebench.kernels.tree_attention_plan)")
        rows = hq // hkv * max(ts)
        cfg = config or choose_config(rows, d, interpreting(), ws=ws is not False)
        fp8_ws = opts.ws_fp8 and inputs.k_cache.dtype in FP8_KV_DTYPES
        cfg = WS_FP8_CONFIGS.get(cfg, cfg) if config is None and fp8_ws else cfg   # a converter and two rings
        tl_cfg = choose_config(rows, d, interpreting(), ws=False)       # the table's tl-kernel config
        short_cfg = short_context_config(rows, d, max(ss), len(ts), hkv, sms, interpreting(),
                                         fp8=inputs.k_cache.dtype in FP8_KV_DTYPES)   # or None
        # one consumer warpgroup where the tl kernel's 64-row tile would gather P 16 / 32 per token,
        # or convert an fp8 pool's tiles in its own warps over several waves (`ws1_config`)
        ws1 = None
        if config is None and ws is None and short_cfg is None and cfg == tl_cfg and not interpreting():
            ws1 = ws1_config(rows, d, len(ts), hkv, sms,
                             ws_page_path(inputs.k_cache.shape[1], WS1.block_n, opts.ws_page_tma),
                             fp8=inputs.k_cache.dtype in FP8_KV_DTYPES, fp8_ws=opts.ws_fp8)
        cfg = ws1 or cfg
        if ws is True or cfg.ws:
            why_ws = ("ws=False" if ws is False
                      else "kv_desc=False (it loads every tile by TMA)" if kv_desc is False
                      else "fused_merge (it merges in a second kernel)" if fused_merge
                      else ws_unsupported(inputs, cfg.block_n, opts.ws_page_tma, opts.ws_gather, opts.ws_fp8))
            if not why_ws and cfg.ws and bool(cfg.fp8_stages) != fp8_ws:
                why_ws = f"fp8_stages={cfg.fp8_stages}: > 0 for fp8 pools with ws_fp8 (the converter's ring), else 0"
            if not why_ws and cfg.ws and cfg.ws_shared_bytes(d, inputs.q.element_size()) > SMEM_PER_SM:
                why_ws = (f"{cfg.ws_shared_bytes(d, inputs.q.element_size())} bytes of shared memory at D {d} "
                          f"(one CTA has {SMEM_PER_SM})")
            if (not why_ws and cfg.ws and cfg.ws_regs_for(True)[0] < WS_MIN_CONSUMER_REGS
                    and ws_page_path(inputs.k_cache.shape[1], cfg.block_n, opts.ws_page_tma, opts.ws_gather) == "gather"):
                why_ws = f"max_regs {cfg.max_regs}: the gathering producer leaves its consumers too few registers"
            if why_ws and (config is not None or ws is True):
                raise ConfigError(f"config ws={cfg.ws}: {why_ws}" if config is not None else f"ws=True: {why_ws}")
            if ws is True and not cfg.ws:
                raise ConfigError(f"ws=True: no warp-specialised config for {rows} packed rows at D {d} (the "
                                  "table has them above 64 rows at D 128; pass config=KernelConfig(..., ws=N))")
            if not why_ws and config is None and ws is None and short_cfg is not None:
                why_ws = "a short-context config holds every S_b (SHORT_CONFIGS)"
            if not why_ws and config is None and ws is None and ws1 is None:
                tl_tma = kv_desc is not False and not kv_desc_unsupported(inputs, tl_cfg.block_n)
                if not ws_fills(cfg, len(ts), hkv, rows, sms, tl_tma=tl_tma):
                    why_ws = "the tl kernel's programs fit one wave"
            if why_ws:
                cfg = tl_cfg
        short = None if config is not None or cfg.ws else short_cfg
        cfg = short or cfg
        # a split's first tile's pages loaded with the lengths: measured with the short configs
        self.early_first = bool(short) if opts.early_first is None else opts.early_first
        self.ws = bool(cfg.ws)
        # the one-tile build: one split, every S_b within one tile (so no context loop and no TMA)
        one_tile = not self.ws and num_splits in (None, 1) and max(ss) <= cfg.block_n and \
            opts.short_build_on(short is not None)
        # the warp-specialised kernel's page path ("tma", "tma-page" or "gather"; "" on the tl kernel)
        self.ws_path = ws_page_path(inputs.k_cache.shape[1], cfg.block_n, opts.ws_page_tma,
                                    opts.ws_gather) if self.ws else ""
        why_not = kv_desc_unsupported(inputs, cfg.block_n)
        if kv_desc and why_not:
            raise ConfigError(f"kv_desc: {why_not}")
        self.kv_desc = self.ws_path.startswith("tma") or not (self.ws or one_tile) and kv_desc is not False \
            and not why_not
        why_not_pdl = pdl_unsupported(inputs.device)
        if pdl and why_not_pdl:
            raise ConfigError(f"pdl: {why_not_pdl}")
        pdl_on = pdl is not False and not why_not_pdl
        self.plan = make_plan(len(ts), hkv, hq // hkv, ts, ss, d, num_sms=sms, interpret=interpreting(),
                              config=cfg, num_splits=1 if one_tile else num_splits, tma_tiles=self.kv_desc)
        self.short_build = "one-tile" if one_tile else ""
        # the fp8 one-tile build of few rows: by default each token's page looked up (KernelOptions.token_pages)
        # and, over those lookups, the "cvt" operand path (`fp8_path_choice`)
        self._fp8_few_rows = one_tile and inputs.k_cache.dtype in FP8_KV_DTYPES and rows <= CVT_ONE_TILE_MAX_ROWS
        self.token_pages = self._fp8_few_rows if opts.token_pages is None else opts.token_pages
        self.out = torch.empty(inputs.q.shape, dtype=inputs.dtype, device=dev)
        self.lse = torch.empty(inputs.q.shape[:2], dtype=torch.float32, device=dev) if return_lse else None
        # a merge kernel to launch early; the warp-specialised kernel does not signal its
        # dependents (griddepcontrol), so after it the merge is an ordinary launch
        self.pdl = pdl_on and self.plan.num_splits > 1 and not fused_merge and not self.ws
        # the warp-specialised kernel's intra-warpgroup pipelining (None on the tl kernel)
        self.ws_pipe = ((cfg.ws_pipe_for(self.plan.tiles_per_split, opts.ws3_pipe_min_tiles)
                         if opts.ws_pipe is None else opts.ws_pipe) if self.ws else None)
        self._launches = self._build_ws_launches(ts) if self.ws else self._build_launches(ls, ts)
        self.kernel = f"{'ws' if self.ws else 'tl'} {self._page_path()} splits={self.plan.num_splits}" + \
            (f" {self.short_build}" if self.short_build else "")
        self()                                   # warm-up: compiles
        self.fast_launch = fast_launch and not interpreting() and verify_fast_path(self._launches, self)

    def _page_path(self) -> str:
        """How the forward kernel reads K/V pages (the `kernel` attribute's middle word)."""
        p, bn = self.inputs.k_cache.shape[1], self.plan.config.block_n
        if self.ws:
            return self.ws_path
        if self.kv_desc:
            return "tma"
        if p % bn == 0 and not self.token_pages:
            return "tile"
        return "gather-page" if self.options.page_gather and bn % p == 0 else "gather"

    def __call__(self) -> torch.Tensor:
        """Launches the kernel(s); returns `out`. No allocation, no host sync."""
        for launch in self._launches:
            launch()
        return self.out

    def _mask_args(self, ts: list[int]):
        """(mask words, bias, stride_mw, stride_bias) for the mask mode; unused ones are dummies."""
        dev, dummy = self.inputs.device, self.inputs.context_lens
        if self.mask_mode == "tree":
            words = pack_tree_masks(self.inputs.trees).to(dev)       # (sum T, W) int64
            return words, dummy, words.stride(0), 0
        if self.mask_mode == "bias":
            bias = tree_bias(self.inputs.trees).to(dev)              # (T, T) fp32
            return dummy, bias, 0, bias.stride(0)
        return dummy, dummy, 0, 0

    def _partials(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(o_part, lse_part, lse) for the forward kernels: with split-KV the fp32 partials
        (num_splits, sum T, Hq, D) and (num_splits, sum T, Hq); without, `out` and the LSE
        buffer (a dummy when no LSE is written). lse is where the final LSE goes."""
        q, splits = self.inputs.q, self.plan.num_splits
        if splits > 1:
            o_part = torch.empty((splits, *q.shape), dtype=torch.float32, device=q.device)
            lse_part = torch.empty((splits, *q.shape[:2]), dtype=torch.float32, device=q.device)
        else:
            o_part, lse_part = self.out, self.lse if self.lse is not None else self.inputs.context_lens
        return o_part, lse_part, self.lse if self.lse is not None else lse_part

    def _build_launches(self, ls: list[int], ts: list[int]) -> list[FixedLaunch]:
        inp, plan, cfg = self.inputs, self.plan, self.plan.config
        q, kc, vc = inp.q, inp.k_cache, inp.v_cache
        if q.stride(-1) != 1 or kc.stride() != vc.stride() or kc.stride(-1) != 1:
            q, kc, vc = q.contiguous(), kc.contiguous(), vc.contiguous()
        hkv, d = kc.shape[2], q.shape[2]
        g = q.shape[1] // hkv
        words, bias, stride_mw, stride_bias = self._mask_args(ts)
        split = plan.num_splits > 1
        rows = q.shape[0] * q.shape[1]                                  # sum T * Hq
        o_part, lse_part, lse = self._partials()
        fused = split and self.fused_merge
        fp8_path = self._fp8_path()                                     # how fp8 codes become MMA operands
        sem = torch.zeros(len(ts) * hkv * plan.m_tiles, dtype=torch.int32, device=q.device) if fused \
            else inp.context_lens
        k_desc = v_desc = None
        if self.kv_desc:
            rows_kv = kc.shape[0] * kc.shape[1]
            k_desc, v_desc = (TensorDescriptor(t, [rows_kv, hkv * d], [hkv * d, 1], [cfg.block_n, d])
                              for t in (kc, vc))
        fwd = FixedLaunch(tree_attn_fwd_kernel, (plan.num_programs,), [
            q, kc, vc, inp.block_table, inp.context_lens, inp.qo_indptr, words, bias,
            self.out, lse, o_part, lse_part, sem, k_desc, v_desc, inp.sm_scale * inp.k_scale * LOG2E, inp.v_scale,
            q.stride(0), q.stride(1), kc.stride(0), kc.stride(1), kc.stride(2),
            inp.block_table.stride(0), stride_mw, stride_bias, rows, plan.m_tiles, plan.num_splits,
            plan.tiles_per_split, inp.block_table.shape[1]],
            dict(HKV=hkv, G=g, D=d, P=kc.shape[1], BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, SPLIT=split,
                 FUSED_MERGE=fused, MASK_MODE=MASK_MODES.index(self.mask_mode), WRITE_LSE=self.lse is not None,
                 DOT_FP32=interpreting(), KV_DESC=self.kv_desc,
                 BT_AHEAD=bool(cfg.bt_ahead) and not self.short_build, PDL=self.pdl,
                 PAGE_GATHER=self.options.page_gather, ONE_TILE=self.short_build == "one-tile",
                 TOKEN_PAGES=self.token_pages and not self.kv_desc,
                 EARLY_FIRST=self.early_first, FP8_PATH=FP8_PATHS.index(fp8_path),
                 Q_ROW_SCALE=fp8_path not in ("cast", "split") and kc.dtype in FP8_KV_DTYPES
                 and q.dtype == torch.bfloat16),
            dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages,
                 **({"maxnreg": cfg.max_regs} if cfg.max_regs and not interpreting() else {})))
        if not split or fused:
            return [fwd]
        return [fwd, self._merge_launch(o_part, lse_part, lse, rows)]

    def fp8_path_choice(self) -> str:
        """The tl kernel's fp8 operand path (`KernelOptions.fp8_path`): the options', or with None the
        rule: "cvt" in the one-tile build over per-token page lookups ("gather") for at most
        `CVT_ONE_TILE_MAX_ROWS` packed rows, "fp16" elsewhere. Meaningful for fp8 pools only."""
        if self.options.fp8_path is not None:
            return self.options.fp8_path
        return "cvt" if self._fp8_few_rows and self._page_path() == "gather" else "fp16"

    def _fp8_path(self) -> str:
        """`fp8_path_choice`, but the interpreter runs no inline PTX, so "cvt" (the hardware
        conversion in PTX) runs as "fp16" there, the same values (every fp8 code is exact in fp16,
        and both paths round Q to fp16 alike); "split" needs float8_e4m3fn codes and bf16 queries
        and runs as "fp16" otherwise."""
        path, inp = self.fp8_path_choice(), self.inputs
        if path == "cvt" and interpreting():
            return "fp16"
        if path == "split" and (inp.k_cache.dtype != torch.float8_e4m3fn or inp.q.dtype != torch.bfloat16):
            return "fp16"
        return path

    def _build_ws_launches(self, ts: list[int]) -> list[FixedLaunch]:
        """The warp-specialised forward kernel (and the merge kernel with split-KV)."""
        from triton.experimental.gluon import language as gl
        from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as GluonDescriptor

        from treebench.kernels.tree_attention_ws import tree_attn_ws_kernel

        inp, plan, cfg = self.inputs, self.plan, self.plan.config
        q, kc, vc = inp.q, inp.k_cache, inp.v_cache
        if q.stride(-1) != 1:
            q = q.contiguous()
        hkv, d = kc.shape[2], q.shape[2]
        words, bias, stride_mw, stride_bias = self._mask_args(ts)
        split = plan.num_splits > 1
        rows = q.shape[0] * q.shape[1]                                  # sum T * Hq
        o_part, lse_part, lse = self._partials()
        gather = self.ws_path == "gather"         # cp.async gathers from the pools: no descriptors
        fp8 = bool(cfg.fp8_stages)               # the pool's codes: their own ring, a converter warpgroup
        k_desc = v_desc = None
        if not gather:
            gl_kv = {torch.float8_e4m3fn: gl.float8e4nv, torch.float8_e5m2: gl.float8e5, torch.bfloat16: gl.bfloat16}
            layout = gl.NVMMASharedLayout.get_default_for([cfg.block_n, d], gl_kv.get(kc.dtype, gl.float16))
            rows_kv, box = kc.shape[0] * kc.shape[1], min(kc.shape[1], cfg.block_n)   # box: a page when P < BLOCK_N
            k_desc, v_desc = (GluonDescriptor(t, [rows_kv, hkv * d], [hkv * d, 1], [box, d], layout)
                              for t in (kc, vc))
        consumer_regs, producer_regs = cfg.ws_regs_for(gather)
        sms = torch.cuda.get_device_properties(q.device).multi_processor_count
        programs = min(plan.num_programs, sms * cfg.ctas_per_sm(d)) if self.options.ws_persist \
            else plan.num_programs
        fwd = FixedLaunch(tree_attn_ws_kernel, (programs,), [
            q, k_desc, v_desc, inp.block_table, inp.context_lens, inp.qo_indptr, words, bias,
            self.out, lse, o_part, lse_part, inp.sm_scale * inp.k_scale * LOG2E, inp.v_scale if fp8 else None,
            q.stride(0), q.stride(1),
            inp.block_table.stride(0), stride_mw, stride_bias, rows, plan.m_tiles, plan.num_splits,
            plan.tiles_per_split, plan.num_programs],
            dict(HKV=hkv, G=q.shape[1] // hkv, D=d, P=kc.shape[1], BLOCK_N=cfg.block_n, NUM_WG=cfg.ws,
                 STAGES=cfg.num_stages, MASK_MODE=MASK_MODES.index(self.mask_mode), SPLIT=split,
                 WRITE_LSE=self.lse is not None, CONSUMER_REGS=consumer_regs, PRODUCER_REGS=producer_regs,
                 PIPE=self.ws_pipe, GATHER=gather, K=kc if gather else None, V=vc if gather else None,
                 F8_STAGES=cfg.fp8_stages, CONVERTER_REGS=WS_CONVERTER_REGS if fp8 else 0,
                 CVT_FENCES=self.options.ws_fp8_fences if fp8 else 1,
                 CONVERTERS=cfg.fp8_converters),   # every constexpr
            dict(num_warps=4, maxnreg=cfg.max_regs))
        if not split:
            return [fwd]
        return [fwd, self._merge_launch(o_part, lse_part, lse, rows)]

    def _merge_launch(self, o_part: torch.Tensor, lse_part: torch.Tensor, lse: torch.Tensor,
                      rows: int) -> FixedLaunch:
        """The split-KV merge kernel over the partials (rows = sum T * Hq)."""
        plan, d = self.plan, o_part.shape[-1]
        per = self.merge_rows
        return FixedLaunch(tree_attn_merge_kernel, (-(-rows // per),),
                           [o_part, lse_part, self.out, lse, rows, plan.num_splits],
                           dict(BLOCK_S=next_pow2(plan.num_splits), ROWS=per, D=d, WRITE_LSE=self.lse is not None,
                                PDL=self.pdl),
                           dict(num_warps=4 if plan.num_splits * per * d >= 2048 else 2, num_stages=1,
                                **({"launch_pdl": True} if self.pdl else {})))
