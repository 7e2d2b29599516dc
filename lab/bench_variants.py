"""The variants `lab/bench_kernel.py` checks and times, phase by phase (its docstring
lists the phases): a `Variant` is a case (`treebench.harness.model.cases.Case` fields), a mask mode,
overrides of `TreeAttention`'s plan and its options (`treebench.kernels.options.KernelOptions`).
Pure data: nothing here touches a GPU, so the tables are testable anywhere
(tests/test_scripts.py resolves every variant's plan).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from treebench.kernels.options import KernelOptions
from treebench.kernels.tree_attention_plan import KernelConfig

HEADS = dict(num_q_heads=32, num_kv_heads=8, head_dim=128)
TARGET = dict(batch_size=64, context_len=2048, page_size=128, **HEADS)
PR27 = "vllm:pr_27"
TMA, NO_TMA = KernelOptions(kv_desc=True), KernelOptions(kv_desc=False)   # context tiles by TMA: forced / off
PIPE, NO_PIPE = KernelOptions(ws_pipe=True), KernelOptions(ws_pipe=False)  # warp-specialised PIPE: forced on / off
SEED_TREES = ["full:3:0", "full:3:1", "full:3:2", "full:3:3", PR27, "eagle:mc_sim_7b_63", "medusa:mc_sim_7b_63"]


@dataclass(frozen=True)
class Variant:
    """One thing to check (and maybe time): a case, a mask mode, plan overrides and kernel options."""

    phase: str
    case: dict                                 # Case fields
    mode: str = "tree"                         # tree | bias | causal
    config: KernelConfig | None = None         # None: the tuned table's
    splits: int | None = None                  # None: the heuristic's
    lse: bool = False
    fused: bool = False                        # split-KV merge in the forward kernel (else a 2nd kernel)
    merge_rows: int = 1                        # rows per program of the merge kernel
    ws: bool | None = None                     # TreeAttention's ws (False: always the tl kernel)
    options: KernelOptions = KernelOptions()   # TreeAttention's options: kv_desc, ws_pipe, ws_persist, ...
    time_it: bool = True
    host_time: bool = False

    def compile_key(self) -> tuple:
        c = self.case
        return (c.get("page_size"), c.get("head_dim"), c.get("num_q_heads"), c.get("num_kv_heads"),
                c.get("dtype"), self.mode, self.config, self.splits != 1, self.lse, self.fused,
                self.merge_rows, self.ws, self.options)

    @property
    def ws_pipe(self) -> bool | None:
        """The warp-specialised kernel's PIPE the variant asks for (None: the tuned rule)."""
        return self.options.ws_pipe

    def small(self) -> "Variant":
        """The same kernel specialisation on a 2-request batch (for parallel compiling)."""
        return dataclasses.replace(self, case={**self.case, "batch_size": min(2, self.case["batch_size"])})



def check_variants() -> list[Variant]:
    """Odd cases for correctness (timed only in passing)."""
    out = []
    small = dict(num_q_heads=16, num_kv_heads=4, head_dim=128)
    for P in (16, 32, 48, 64, 128, 256):
        for per in ("same", "mixed"):
            c = dict(batch_size=7, context_len="ragged:0-700", tree="random:30:5", page_size=P,
                     tree_per_request=per, **small)
            out.append(Variant("check", c, splits=1, lse=True, time_it=False))
            out.append(Variant("check", c, splits=5, lse=True, time_it=False))
            out.append(Variant("check", c, splits=7, lse=True, time_it=False, fused=False))
    for hq, hkv in ((8, 8), (16, 8), (32, 8), (64, 8), (12, 4)):
        for d in (64, 128, 256):
            for P in (16, 128):                # P 128: context tiles through TMA descriptors
                c = dict(batch_size=3, context_len="ragged:0-300", tree="random:70:2", tree_per_request="mixed",
                         page_size=P, num_q_heads=hq, num_kv_heads=hkv, head_dim=d, dtype="float16")
                out.append(Variant("check", c, lse=True, time_it=False))
    for mode in ("bias", "causal"):
        for P in (16, 128):
            c = dict(batch_size=5, context_len="ragged:0-1000", tree="full:3:3", page_size=P, **small)
            out.append(Variant("check", c, mode=mode, lse=True, time_it=False))
            out.append(Variant("check", c, mode=mode, splits=3, time_it=False))
    big = dict(batch_size=4, context_len="ragged:1000-3000", tree="random:250:9", tree_per_request="mixed",
               page_size=64, **HEADS)
    out.append(Variant("check", big, lse=True, time_it=False))
    out.append(Variant("check", {**big, "context_len": 128, "page_size": 128}, time_it=False))  # S_b = 128 + T_b
    return out


def tune_variants() -> list[Variant]:
    """Split-KV merge in the forward kernel (one launch) against a second merge kernel,
    on the cells that split; graph and host-inclusive timing."""
    out = []
    for b, l, tree in ((1, 2048, PR27), (1, 2048, "full:3:1"), (1, 2048, "full:3:3"), (1, 1024, "full:3:0"),
                       (16, 2048, "full:3:1"), (16, 1024, PR27)):
        for fused in (True, False):
            c = dict(TARGET, batch_size=b, context_len=l, tree=tree)
            out.append(Variant("tune", c, fused=fused, host_time=True))
    return out


def seed_variants() -> list[Variant]:
    return [Variant("seed", dict(batch_size=b, context_len=l, tree=t, page_size=p, **HEADS), host_time=True)
            for p in (128, 16) for t in SEED_TREES for b in (1, 16, 64) for l in (16, 1024, 2048)]


def big_variants() -> list[Variant]:
    """The large-tree speed targets and their neighbours under tile configs x how far
    ahead the block table is read for the TMA loads (bt_ahead), the B 1 target under
    split counts, and the memory-bound cells."""
    K = KernelConfig      # run5c-bt-ahead.csv also has look-ahead 2 and 3 (revision 2416a09): both slower
    cfgs = [K(64, 64, 4, 3, 0, a) for a in (0, 1)] + [K(64, 64, 4, 2, 0, 1), K(64, 64, 4, 4, 0, 1),
                                                      K(128, 64, 8, 3, 0, 1), K(128, 128, 8, 2, 0, 1)]
    out = []
    for b, tree in ((64, PR27), (64, "full:3:3"), (16, "eagle:mc_sim_7b_63"), (64, "full:3:2"),
                    (16, "medusa:mc_sim_7b_63")):
        c = dict(TARGET, batch_size=b, tree=tree)
        out += [Variant("big", c, config=cfg, options=TMA) for cfg in cfgs]
    b1 = dict(TARGET, batch_size=1, tree=PR27)
    out += [Variant("big", b1, config=K(64, 64, 4, 3, 0, a), splits=s, options=TMA) for s in (8, 11) for a in (0, 1)]
    out += [Variant("big", b1, config=K(64, 64, 4, 2, 0, 1), splits=s, options=TMA) for s in (8, 11)]
    for b, tree in ((64, "full:3:1"), (1, "full:3:1")):
        c = dict(TARGET, batch_size=b, tree=tree)
        out += [Variant("big", c, config=cfg, options=TMA) for cfg in (K(16, 64, 2, 4), K(16, 64, 2, 4, 0, 1))]
        out += [Variant("big", c, config=K(16, 64, 2, 4), options=NO_TMA)]
    return out


def wide_variants() -> list[Variant]:
    """BLOCK_M 128 (8 warps: K/V read once per (request, KV head) for up to 128 rows)
    against the default BLOCK_M 64 on the largest trees; the B 1 split counts with the
    TMA kernel; the merge kernel's rows per program at B 16."""
    K = KernelConfig
    out = []
    for b, l, tree in ((64, 2048, "medusa:mc_sim_7b_63"), (16, 2048, "medusa:mc_sim_7b_63"),
                       (64, 1024, "medusa:mc_sim_7b_63"), (1, 2048, "medusa:mc_sim_7b_63"), (64, 1024, PR27)):
        c = dict(TARGET, batch_size=b, context_len=l, tree=tree)
        out += [Variant("wide", c)] + [Variant("wide", c, config=K(128, 64, 8, s, 0, 1)) for s in (2, 3)]
    for tree in ("full:3:2", PR27, "full:3:3", "medusa:mc_sim_7b_63"):
        for l in (1024, 2048):
            c = dict(TARGET, batch_size=1, context_len=l, tree=tree)
            out += [Variant("wide", c, splits=s) for s in (None, 4, 6, 8, 11)]
    for l in (1024, 2048):
        c = dict(TARGET, batch_size=16, context_len=l, tree="full:3:2")
        out += [Variant("wide", c, merge_rows=r) for r in (1, 2, 4)]
    return out


def merge_variants() -> list[Variant]:
    """The merge kernel's rows per program (1, 2) on every split cell of the seed grid at
    P 128: B 1 (both tile kinds) and B 16 with 2 splits."""
    out = []
    for b, trees in ((1, SEED_TREES), (16, ("full:3:2",))):
        for tree in trees:
            for l in (1024, 2048):
                c = dict(TARGET, batch_size=b, context_len=l, tree=tree)
                out += [Variant("merge", c, merge_rows=r) for r in (1, 2)]
    return out


def pair_variants() -> list[Variant]:
    """BLOCK_M 128 with 8 warps under a 128-register cap (BLOCK_N 32: 2 CTAs per SM, so
    4 warpgroups per SM, each K/V tile read once per 128 rows) against the default
    BLOCK_M 64 and the 1-CTA BLOCK_M 128 on the large trees at B 64 and B 16."""
    K = KernelConfig
    cfgs = [None, K(128, 32, 8, 3, 128, 1), K(128, 32, 8, 4, 128, 1), K(128, 32, 8, 3, 128, 0),
            K(128, 64, 8, 2, 0, 1)]
    out = []
    for b, tree in ((64, PR27), (64, "full:3:3"), (16, "eagle:mc_sim_7b_63"), (64, "full:3:2"),
                    (16, "medusa:mc_sim_7b_63"), (64, "medusa:mc_sim_7b_63")):
        c = dict(TARGET, batch_size=b, tree=tree)
        out += [Variant("pair", c, config=cfg) for cfg in cfgs]
    return out


def deep_variants() -> list[Variant]:
    """BLOCK_M 128 in one CTA per SM (8 warps) with 4 and 5 pipeline stages (the shared
    memory a second CTA would have used), and BLOCK_M 128 in one warpgroup (4 warps,
    BLOCK_N 32, 2 CTAs per SM), against the default tiles on the large trees."""
    K = KernelConfig
    cfgs = [None, K(128, 64, 8, 3, 0, 1), K(128, 64, 8, 4, 0, 1), K(128, 64, 8, 5, 0, 1),
            K(128, 32, 4, 3, 0, 1), K(128, 32, 4, 4, 0, 1)]
    out = []
    for b, tree in ((64, PR27), (64, "full:3:3"), (64, "full:3:2"), (64, "medusa:mc_sim_7b_63"),
                    (16, "eagle:mc_sim_7b_63"), (16, PR27)):
        c = dict(TARGET, batch_size=b, tree=tree)
        out += [Variant("deep", c, config=cfg) for cfg in cfgs]
    return out


def fuse_variants() -> list[Variant]:
    """B 1: the split-KV merge in a second launch against the single-launch merge in the
    forward kernel's last split program (unrolled over the splits), across split counts
    and tile shapes (BLOCK_M 128 halves the M-tiles, so each split is shorter)."""
    K = KernelConfig
    out = []
    for tree, l in ((PR27, 2048), ("full:3:3", 2048), (PR27, 1024), ("full:3:2", 2048)):
        c = dict(TARGET, batch_size=1, context_len=l, tree=tree)
        for cfg, splits in ((None, (None, 11, 16)), (K(128, 64, 8, 2, 0, 1), (8, 16)),
                            (K(128, 32, 8, 3, 128, 1), (8, 16))):
            out += [Variant("fuse", c, config=cfg, splits=s, fused=f) for s in splits for f in (False, True)]
    c = dict(TARGET, batch_size=1, tree="full:3:1")
    out += [Variant("fuse", c, splits=s, fused=f) for s in (None, 24) for f in (False, True)]
    return out


def gather_variants() -> list[Variant]:
    """P 16 (vLLM's default page size; a 64-token tile spans 4 pages, so its K/V are
    gathered by pointer loads, not TMA): the block table read in the tile's own
    iteration (bt_ahead 0) against one tile ahead (1), on the seed grid's large trees
    and the memory-bound T 4 cells; the P 128 TMA default alongside for the ratio; and
    16-token one-page tiles loaded by TMA (BLOCK_N 16, 3-4 CTAs per SM)."""
    K = KernelConfig
    out = []
    for b, tree in ((64, PR27), (64, "full:3:3"), (16, "eagle:mc_sim_7b_63"), (16, "medusa:mc_sim_7b_63"),
                    (1, PR27), (1, "full:3:3")):
        c = dict(TARGET, batch_size=b, tree=tree, page_size=16)
        out += [Variant("gather", c, config=K(64, 64, 4, 3, 0, a)) for a in (0, 1)]
        out += [Variant("gather", dict(c, page_size=128))]
        # one-page 16-token tiles through TMA (3-4 CTAs per SM) against the 64-token gather
        out += [Variant("gather", c, config=cfg, options=TMA)
                for cfg in (K(64, 16, 4, 4, 0, 1), K(64, 16, 4, 6, 0, 1), K(64, 16, 4, 4, 128, 1))]
    for b in (64, 16, 1):
        c = dict(TARGET, batch_size=b, tree="full:3:1", page_size=16)
        out += [Variant("gather", c, config=K(16, 64, 2, 4, 0, a)) for a in (0, 1)]
    return out


K = KernelConfig
WS_VARIANTS = (dict(ws=False), dict(config=K(128, 64, 4, 4, 168, 0, 2)), dict(config=K(128, 64, 4, 3, 168, 0, 2)),
               dict(config=K(128, 64, 4, 4, 168, 0, 2), options=NO_PIPE),
               dict(config=K(192, 64, 4, 3, 128, 0, 3)))


def ws_odd_cases(phase: str, cfg: KernelConfig, ws_pipe: bool | None = None) -> list[Variant]:
    """The odd cases a warp-specialised config is checked on against the float64 reference
    (17 variants, none timed): ragged and zero contexts, mixed per-request trees up to 250
    nodes (several M-tiles), G 1..8, D 64/128, P 64..256, fp16, the bias and causal modes,
    LSE, split-KV. ws_pipe: the variants' PIPE (None: the tuned choice)."""
    kw = dict(config=cfg, time_it=False, options=KernelOptions(ws_pipe=ws_pipe))
    small = dict(num_q_heads=16, num_kv_heads=4, head_dim=128)
    out = []
    for P in (64, 128, 256):
        c = dict(batch_size=7, context_len="ragged:0-700", tree="random:30:5", page_size=P,
                 tree_per_request="mixed", **small)
        out += [Variant(phase, c, splits=s, lse=True, **kw) for s in (1, 5)]
    for hq, hkv, d in ((8, 8, 128), (16, 8, 64), (64, 8, 128), (12, 4, 64)):
        c = dict(batch_size=3, context_len="ragged:0-300", tree="random:70:2", tree_per_request="mixed",
                 page_size=128, num_q_heads=hq, num_kv_heads=hkv, head_dim=d, dtype="float16")
        out.append(Variant(phase, c, lse=True, **kw))
    for mode in ("bias", "causal"):
        c = dict(batch_size=5, context_len="ragged:0-1000", tree="full:3:3", page_size=128, **small)
        out.append(Variant(phase, c, mode=mode, lse=True, **kw))
        out.append(Variant(phase, c, mode=mode, splits=3, **kw))
    big = dict(batch_size=4, context_len="ragged:1000-3000", tree="random:250:9", tree_per_request="mixed",
               page_size=64, **HEADS)
    out.append(Variant(phase, big, lse=True, **kw))
    out.append(Variant(phase, {**big, "context_len": 128, "page_size": 128}, **kw))
    return out


def wscheck_variants() -> list[Variant]:
    """The warp-specialised kernel against the float64 reference: the table's configs and
    the 1-warpgroup one on `ws_odd_cases`, PIPE and the persistent wave off, and the
    default plan on three target cells."""
    K = KernelConfig
    out = [v for cfg in (K(128, 64, 4, 3, 168, 0, 2), K(64, 64, 4, 2, 128, 0, 1), K(192, 64, 4, 3, 128, 0, 3))
           for v in ws_odd_cases("wscheck", cfg)]
    c = dict(batch_size=7, context_len="ragged:0-700", tree="random:30:5", page_size=128, tree_per_request="mixed",
             num_q_heads=16, num_kv_heads=4, head_dim=128)
    out += [Variant("wscheck", c, config=K(128, 64, 4, 3, 168, 0, 2), splits=s, lse=True, time_it=False,
                    options=NO_PIPE) for s in (1, 5)]
    out += [Variant("wscheck", c, config=K(128, 64, 4, 4, 168, 0, 2), splits=s, lse=True, time_it=False,
                    options=KernelOptions(ws_persist=False)) for s in (1, 5)]
    for b, tree in ((64, "vllm:pr_27"), (64, "full:3:3"), (16, "medusa:mc_sim_7b_63")):   # the default plan
        out.append(Variant("wscheck", dict(TARGET, batch_size=b, tree=tree), lse=True, time_it=False))
    return out


def ws_variants() -> list[Variant]:
    """The default plan against the warp-specialised kernel's configs on the target cells
    (P 128, L 2048) and their neighbours."""
    out = []
    for b, tree in ((64, PR27), (64, "full:3:3"), (64, "full:3:2"), (64, "medusa:mc_sim_7b_63"),
                    (64, "eagle:mc_sim_7b_63"), (16, PR27), (16, "full:3:3"), (16, "medusa:mc_sim_7b_63"),
                    (1, PR27), (1, "full:3:3"), (64, "full:3:1")):
        c = dict(TARGET, batch_size=b, tree=tree)
        out += [Variant("ws", c, **kw) for kw in (dict(), *WS_VARIANTS)]
    return out


def tiles_variants() -> list[Variant]:
    """32-token tiles (half the score tile's registers: the 3-warpgroup build spills 10
    values pipelined, against 59 for 64-token tiles; sm_90 compiles with Triton 3.6) and
    the pipelined 3-warpgroup build, against the table's configs: first checked on
    `ws_odd_cases`, as `wscheck` checks the table's, then timed on the target cells."""
    K = KernelConfig
    out = [v for cfg, pipe in ((K(192, 32, 4, 4, 128, 0, 3), True), (K(192, 64, 4, 3, 128, 0, 3), True),
                               (K(128, 32, 4, 4, 168, 0, 2), None))
           for v in ws_odd_cases("tiles", cfg, pipe)]
    three = (dict(), dict(config=K(192, 64, 4, 3, 128, 0, 3), options=NO_PIPE),
             dict(config=K(192, 32, 4, 4, 128, 0, 3), options=NO_PIPE),
             dict(config=K(192, 32, 4, 4, 128, 0, 3), options=PIPE),
             dict(config=K(192, 32, 4, 6, 128, 0, 3), options=PIPE))
    two = (dict(), dict(config=K(128, 32, 4, 4, 168, 0, 2)), dict(config=K(128, 32, 4, 6, 168, 0, 2)))
    for b, tree, kws in ((64, "full:3:3", three), (16, "full:3:3", three), (64, PR27, two),
                         (64, "medusa:mc_sim_7b_63", two)):
        out += [Variant("tiles", dict(TARGET, batch_size=b, tree=tree), **kw) for kw in kws]
    return out


# phase name -> its variants (the phases besides "env"), in the docstring's order
PHASE_VARIANTS = {"check": check_variants, "tune": tune_variants, "seed": seed_variants, "big": big_variants,
                  "wide": wide_variants, "merge": merge_variants, "pair": pair_variants, "fuse": fuse_variants,
                  "gather": gather_variants, "deep": deep_variants, "wscheck": wscheck_variants,
                  "ws": ws_variants, "tiles": tiles_variants}
