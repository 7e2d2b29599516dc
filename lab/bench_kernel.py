"""Checks and times treebench's Triton tree-attention kernel on one GPU, in one call.

    python lab/bench_kernel.py [--out DIR] [--phases env,check,tune,seed] [--budget-s 420]
    python lab/bench_kernel.py report RUN.csv [--peers PEERS.csv]

Phases (their variants: lab/bench_variants.py):
  env    versions, GPU, copy bandwidth (bytes read + written per second), launch overhead
  check  correctness against the float64 reference over odd cases (ragged and
         zero contexts, S_b an exact multiple of P, mixed per-request trees,
         GQA G 1..8, D 64/128/256, P 16..256, bf16/fp16, LSE, split-KV on/off,
         the three mask modes), each also replayed from a CUDA graph
  tune   config x split variants of the target cases, each checked, then timed
         with triton.testing.do_bench_cudagraph
  seed   the seed grid (B 1/16/64 x L 16/1024/2048 x 7 trees x P 16/128) with the
         tuned plan: checked, timed from a CUDA graph and host-inclusive
  big    the speed-target cells (P 128, L 2048) and neighbours: tile configs x TMA
         descriptor loads on/off (kv_desc), block-table look-ahead (bt_ahead)
  wide   BLOCK_M 128 against 64 on the largest trees, B 1 split counts, merge rows
  merge  the merge kernel's rows per program (1, 2) on the seed grid's split cells
  pair   BLOCK_M 128 / BLOCK_N 32 / 8 warps under a 128-register cap (2 CTAs per SM)
         against the default tiles on the large trees
  fuse   B 1: split-KV merge in a second launch vs in the forward kernel, x splits, tiles
  gather P 16 (K/V gathered by pointer loads): block table read one tile ahead or not
  deep   BLOCK_M 128 in one CTA per SM with 4-5 pipeline stages, and in one warpgroup
         (4 warps, BLOCK_N 32), against the default tiles on the large trees
  wscheck  the warp-specialised Gluon kernel (KernelConfig.ws) on odd cases: correctness
  ws     the warp-specialised kernel's configs against the default on the target cells
  tiles  32-token tiles, and the 3-warpgroup build pipelined or not (KernelConfig.ws_pipe_for),
         against the table's warp-specialised configs: checked on wscheck's
         odd cases, then timed on the target cells the 2- and 3-warpgroup rows serve

Writes DIR/kernel.csv (--smoke: DIR/kernel-smoke.csv; DIR is --out, else $OUT, else
results/local/lab, or results/local for --smoke; results/local is git-ignored) with one row per measurement,
flushed as it goes, so a run cut short keeps what it measured, and prints a short table. Exit status: 1 when
any variant failed its check (a run, or `report` of a CSV that holds one), 2 on
bad input, else 0. The HBM floor of a
case is its KV bytes (sum_b S_b * Hkv * D * 2 tensors * itemsize) over the
measured copy bandwidth. `report` prints that table again from a CSV, with the
best peer of each cell when given a peers CSV (columns tree, batch_size, context_len,
page_size, timer, median_us; timer cuda_graph or host_inclusive).
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import importlib.util
import logging
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from multiprocessing import get_context
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from treebench.harness.model.cases import Case  # noqa: E402
from treebench.harness.model.compare import compare  # noqa: E402
from treebench.harness.timing.timers import capture_graph  # noqa: E402
from treebench.harness.model.paged import BatchInputs, build_inputs  # noqa: E402
from treebench.harness.model.reference import reference_attention  # noqa: E402
from treebench.kernels.tree_attention_plan import choose_config, make_plan, ws_fills  # noqa: E402
from bench_variants import HEADS, PHASE_VARIANTS, PR27, Variant  # noqa: E402  (lab/, beside this file)

log = logging.getLogger("bench_kernel")
FIELDS = ["phase", "tree", "B", "L", "T", "P", "D", "Hq", "Hkv", "dtype", "mode", "per_request", "block_m", "block_n",
          "warps", "stages", "splits", "m_tiles", "fused", "kv_desc", "merge_rows", "bt_ahead", "max_regs",
          "fast_launch", "passed", "max_abs_err", "nonfinite", "lse_err", "graph_ok", "ws", "ws_pipe", "ws_persist",
          "median_us", "host_us", "kv_bytes", "floor_us", "pct_floor", "error"]


# ---- inputs ---------------------------------------------------------------------------


def gpu_inputs(case: Case, device: str = "cuda") -> BatchInputs:
    """treebench.harness.model.paged.build_inputs on the GPU (it draws on the device)."""
    return build_inputs(case, device)


def kv_bytes(inputs: BatchInputs) -> int:
    """Bytes of K and V the batch must read at least once: sum_b S_b * Hkv * D * 2 * itemsize."""
    _, _, ss = inputs.host_lists()
    _, _, hkv, d = inputs.k_cache.shape
    return sum(ss) * hkv * d * 2 * inputs.k_cache.element_size()


# ---- one variant ----------------------------------------------------------------------


@dataclass
class Bench:
    """Shared state of a run: caches, output file, deadline."""

    out_csv: Path
    deadline: float
    device: str = "cuda"
    peak_bw: float = 4.3e12
    rows: list = field(default_factory=list)
    _inputs: dict = field(default_factory=dict)
    _refs: dict = field(default_factory=dict)

    def inputs(self, case_kw: dict, mode: str) -> BatchInputs:
        key = (tuple(sorted(case_kw.items())), mode == "causal")
        if key not in self._inputs:
            if len(self._inputs) > 6:
                self._inputs.clear()
                self._refs.clear()
            inp = gpu_inputs(Case(**case_kw), self.device)
            self._inputs[key] = inp.causal() if mode == "causal" else inp
        return self._inputs[key]

    def reference(self, case_kw: dict, mode: str):
        key = (tuple(sorted(case_kw.items())), mode == "causal")
        if key not in self._refs:
            self._refs[key] = reference_attention(self.inputs(case_kw, mode), return_lse=True)
        return self._refs[key]

    def write(self, row: dict) -> None:
        self.rows.append(row)
        new = not self.out_csv.exists()
        with self.out_csv.open("a", newline="") as f:
            w = csv.DictWriter(f, fieldnames=FIELDS, restval="")
            if new:
                w.writeheader()
            w.writerow(row)


def graph_replay_ok(ta, expect: torch.Tensor) -> bool:
    """Captures the prepared callable in a CUDA graph, poisons the output, replays, compares."""
    g = capture_graph(ta)                  # ta was launched once in its constructor (warm)
    ta.out.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    return bool(torch.equal(ta.out, expect))


def run_variant(bench: Bench, v: Variant) -> dict:
    """Checks one variant against the float64 reference, then times it."""
    import triton.testing
    from treebench.kernels.tree_attention import TreeAttention

    case = Case(**v.case)
    row = dict(phase=v.phase, fused=v.fused, tree=case.tree, B=case.batch_size, L=case.context_len, P=case.page_size,
               D=case.head_dim, Hq=case.num_q_heads, Hkv=case.num_kv_heads, dtype=case.dtype, mode=v.mode,
               per_request=case.tree_per_request)
    try:
        inp = bench.inputs(v.case, v.mode)
        ta = TreeAttention(inp, v.mode, return_lse=v.lse, config=v.config, num_splits=v.splits,
                           fused_merge=v.fused, merge_rows=v.merge_rows, ws=v.ws, options=v.options)
        cfg, plan = ta.plan.config, ta.plan
        row.update(kv_desc=ta.kv_desc, merge_rows=v.merge_rows, bt_ahead=cfg.bt_ahead, max_regs=cfg.max_regs,
                   ws=cfg.ws, ws_pipe=ta.ws_pipe if cfg.ws else "",
                   ws_persist=v.options.ws_persist if cfg.ws else "")
        row.update(T=max(t.size for t in inp.trees), block_m=cfg.block_m, block_n=cfg.block_n,
                   warps=cfg.num_warps, stages=cfg.num_stages, splits=plan.num_splits, m_tiles=plan.m_tiles,
                   fast_launch=ta.fast_launch)
        ta.out.fill_(float("nan"))
        out = ta().clone()
        ref, ref_lse = bench.reference(v.case, v.mode)
        rec = compare(out, ref, inp.qo_indptr, case.dtype)
        row.update(passed=rec.passed, max_abs_err=f"{rec.max_abs_err:.3g}", nonfinite=rec.nonfinite,
                   lse_err=f"{(ta.lse.double() - ref_lse).abs().max().item():.3g}" if v.lse else "")
        row["graph_ok"] = graph_replay_ok(ta, out) if bench.device == "cuda" else ""
        if v.time_it:
            us = triton.testing.do_bench_cudagraph(ta, rep=40, return_mode="median") * 1e3
            kb = kv_bytes(inp)
            row.update(median_us=round(us, 2), kv_bytes=kb, floor_us=round(kb / bench.peak_bw * 1e6, 2),
                       pct_floor=round(100 * kb / bench.peak_bw * 1e6 / us, 1))
        if v.host_time:
            row["host_us"] = round(triton.testing.do_bench(ta, warmup=25, rep=100, return_mode="median") * 1e3, 2)
    except Exception as e:  # a failed variant is a row, not the end of the run
        log.exception("variant failed: %s", v)
        row.update(passed=False, error=f"{type(e).__name__}: {e}"[:300])
    return row


# ---- phases ---------------------------------------------------------------------------


def phase_env(bench: Bench) -> None:
    """Versions, copy bandwidth, launch overhead of the two launch paths."""
    import triton
    import triton.testing

    props = torch.cuda.get_device_properties(0)
    log.info("GPU %s, %d SMs, torch %s, triton %s", props.name, props.multi_processor_count,
             torch.__version__, triton.__version__)
    x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")   # 1 GiB
    y = torch.empty_like(x)
    ms = triton.testing.do_bench(lambda: y.copy_(x), warmup=25, rep=200, return_mode="median")
    bench.peak_bw = 2 * x.numel() / (ms * 1e-3)
    log.info("copy bandwidth %.3g B/s (read + write)", bench.peak_bw)
    bench.write(dict(phase="env", tree="copy", median_us=round(ms * 1e3, 2), kv_bytes=2 * x.numel(),
                     error=f"peak_bw={bench.peak_bw:.4g};gpu={props.name};sms={props.multi_processor_count};"
                           f"torch={torch.__version__};triton={triton.__version__}"))
    launch_overhead(bench)


def launch_overhead(bench: Bench) -> None:
    """Host microseconds per call, ordinary Triton launch vs the compiled launcher (B 1, L 16)."""
    from treebench.kernels.tree_attention import TreeAttention

    inp = bench.inputs(dict(batch_size=1, context_len=16, tree="full:3:1", page_size=16, **HEADS), "tree")
    for fast, splits, fused in ((False, 1, True), (True, 1, True), (True, 4, True), (True, 4, False)):
        ta = TreeAttention(inp, "tree", fast_launch=fast, num_splits=splits, fused_merge=fused)
        for _ in range(50):
            ta()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(2000):
            ta()
        torch.cuda.synchronize()
        us = (time.perf_counter() - t0) / 2000 * 1e6
        used = ta.fast_launch
        log.info("launch: fast_launch=%s (used %s), splits %d, fused %s: %.2f us per call", fast, used, splits,
                 fused, us)
        bench.write(dict(phase="launch", tree="full:3:1", B=1, L=16, splits=splits, fused=fused, fast_launch=used,
                         host_us=round(us, 2)))




def _compile_one(v: Variant) -> str:
    """Worker: builds the variant's kernels on a 2-request batch (fills Triton's disk cache)."""
    from treebench.kernels.tree_attention import TreeAttention

    try:
        inp = gpu_inputs(Case(**v.case))
        TreeAttention(inp.causal() if v.mode == "causal" else inp, v.mode, return_lse=v.lse,
                      config=v.config, num_splits=v.splits, fast_launch=False, fused_merge=v.fused,
                      merge_rows=v.merge_rows, ws=v.ws, options=v.options)
        torch.cuda.synchronize()
        return ""
    except Exception as e:
        return f"{type(e).__name__}: {e}"[:200]


def resolve(v: Variant, num_sms: int) -> Variant:
    """The variant with the config and split count its own batch would get (a
    2-request copy of it must compile the same specialisation)."""
    case = Case(**v.case)
    trees, lens = case.trees(), case.context_lens()
    rows = case.group_size * max(t.size for t in trees)
    cfg = v.config or choose_config(rows, case.head_dim, False, ws=v.ws is not False)
    if v.config is None and not ws_fills(cfg, case.batch_size, case.num_kv_heads, rows, num_sms):
        cfg = choose_config(rows, case.head_dim, False, ws=False)
    tma = v.options.kv_desc is not False and case.page_size % cfg.block_n == 0      # as on an sm_90 GPU
    plan = make_plan(case.batch_size, case.num_kv_heads, case.group_size, [t.size for t in trees],
                     [l + t.size for l, t in zip(lens, trees)], case.head_dim, num_sms=num_sms,
                     interpret=False, config=cfg, num_splits=v.splits, tma_tiles=tma)
    return dataclasses.replace(v, config=plan.config, splits=plan.num_splits)


def precompile(variants: list[Variant], workers: int) -> None:
    """Compiles every distinct kernel specialisation in parallel processes."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    todo = {}
    for v in variants:
        r = resolve(v, sms)
        todo.setdefault(r.compile_key(), r.small())
    t0 = time.time()
    with ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn")) as pool:
        errors = [e for e in pool.map(_compile_one, todo.values()) if e]
    log.info("precompiled %d specialisations in %.1f s (%d errors %s)", len(todo), time.time() - t0,
             len(errors), errors[:3])


def smoke(out_dir: Path) -> int:
    """Runs three tiny check variants on the CPU under the interpreter (no timing):
    the script's plumbing, testable without a GPU."""
    os.environ["TRITON_INTERPRET"] = "1"
    bench = Bench(out_dir / "kernel-smoke.csv", time.time() + 600, device="cpu")
    tiny = dict(batch_size=2, context_len="ragged:0-40", tree="full:2:2", num_q_heads=4, num_kv_heads=2,
                head_dim=64, tree_per_request="mixed", page_size=16)
    rows = [run_variant(bench, Variant("smoke", tiny, mode=m, splits=s, lse=True, time_it=False))
            for m, s in (("tree", 1), ("tree", 2), ("causal", 1))]
    for row in rows:
        bench.write(row)
    log.info("smoke: %s", [(r["mode"], r.get("splits"), r["passed"], r.get("error", "")) for r in rows])
    return 0 if all(r["passed"] for r in rows) else 1


# ---- report ---------------------------------------------------------------------------


def report(csv_path: str, peers_path: str | None) -> int:
    """Prints the failed variants of every phase, the tune winners and the seed grid (with
    the best peer when given); returns how many variants failed."""
    import pandas as pd

    df = pd.read_csv(csv_path)
    pd.set_option("display.width", 200)
    pd.set_option("display.max_rows", 500)
    bad = df[~df.phase.isin(["env", "launch"]) & (df.passed != True)]  # noqa: E712   (env / launch rows check nothing)
    print(f"rows {len(df)}, failed {len(bad)}")
    if len(bad):
        print(bad[["phase", "tree", "B", "L", "P", "D", "Hq", "mode", "splits", "max_abs_err", "error"]])
    tune = df[df.phase == "tune"].dropna(subset=["median_us"])
    if len(tune):
        cols = ["tree", "B", "P", "block_m", "block_n", "warps", "stages", "splits", "median_us", "pct_floor"]
        print(tune.sort_values("median_us").groupby(["tree", "B", "P"]).head(3)[cols].to_string())
    seed = df[df.phase == "seed"].copy()
    seed["L"] = pd.to_numeric(seed.L, errors="coerce")
    if len(seed) and peers_path:
        seed = seed.merge(best_peers(peers_path), on=["tree", "B", "L", "P"], how="left")
        seed["vs_graph_peer"] = (seed.median_us / seed.peer_graph_us).round(2)
        seed["vs_host_peer"] = (seed.host_us / seed.peer_host_us).round(2)
    if len(seed):
        keep = [c for c in ["tree", "P", "B", "L", "splits", "median_us", "pct_floor", "host_us", "peer_graph_us",
                            "vs_graph_peer", "peer_host_us", "vs_host_peer"] if c in seed]
        print(seed[keep].to_string())
    return len(bad)


def best_peers(path: str):
    """Best peer median per (tree, B, L, P), one column per timer."""
    import pandas as pd

    p = pd.read_csv(path).replace({"tree": {"vllm_pr_27_node_tree": PR27}})
    best = p.groupby(["tree", "batch_size", "context_len", "page_size", "timer"]).median_us.min().unstack("timer")
    best = best.rename(columns={"cuda_graph": "peer_graph_us", "host_inclusive": "peer_host_us"}).reset_index()
    return best.rename(columns={"batch_size": "B", "context_len": "L", "page_size": "P"})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                 allow_abbrev=False)
    ap.add_argument("cmd", nargs="?", default="run", choices=["run", "report"])
    ap.add_argument("csv", nargs="?", help="report: the CSV to read")
    ap.add_argument("--peers", help="report: a peers CSV (tree, batch_size, context_len, page_size, timer, median_us)")
    ap.add_argument("--out", default=None, help="folder of kernel.csv (default $OUT if set, else results/local/lab; "
                                                "--smoke: $OUT if set, else results/local, which git ignores)")
    ap.add_argument("--phases", default="env,check,tune,seed")
    ap.add_argument("--budget-s", type=float, default=420.0, help="stop starting variants after this")
    ap.add_argument("--workers", type=int, default=max(1, min(15, (os.cpu_count() or 2) - 1)))
    ap.add_argument("--smoke", action="store_true",
                    help="a few tiny checks on the CPU (TRITON_INTERPRET=1); --phases does not apply")
    args = ap.parse_args()
    args.out = args.out or os.environ.get("OUT") or ("results/local" if args.smoke else "results/local/lab")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    if args.cmd == "report":
        for what, path in (("the CSV to read", args.csv), ("--peers", args.peers)):
            if what == "--peers" and path is None:
                continue
            if not path or not Path(path).is_file():
                problem = f"{path} is not a file" if path else "none given"
                print(f"bench_kernel report: {what}: {problem} (bench_kernel.py report RUN.csv [--peers PEERS.csv])",
                      file=sys.stderr)
                return 2
        return 1 if report(args.csv, args.peers) else 0
    if importlib.util.find_spec("triton") is None:
        print("bench_kernel: Triton is not installed (pip install -e '.[dev]')", file=sys.stderr)
        return 2
    if args.smoke:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        return smoke(Path(args.out))
    unknown = set(args.phases.split(",")) - {"env", *PHASE_VARIANTS}
    if unknown:      # refused before anything is created
        print(f"bench_kernel: unknown phase(s) {', '.join(sorted(p or repr(p) for p in unknown))}: use "
              f"{', '.join(['env', *PHASE_VARIANTS])}", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("bench_kernel: no CUDA GPU (the phases run on one; "
              "--smoke runs on the CPU)", file=sys.stderr)
        return 2
    Path(args.out).mkdir(parents=True, exist_ok=True)
    bench = Bench(Path(args.out) / "kernel.csv", time.time() + args.budget_s)
    phases = args.phases.split(",")
    variants = [v for p in phases if p in PHASE_VARIANTS for v in PHASE_VARIANTS[p]()]
    if "env" in phases:
        phase_env(bench)
    precompile(variants, args.workers)
    for v in variants:
        if time.time() > bench.deadline:
            log.warning("budget spent: %d variants not run", len(variants) - len(bench.rows))
            break
        bench.write(run_variant(bench, v))
    if not bench.rows:
        return 0
    return 1 if report(str(bench.out_csv), None) else 0     # a failed variant fails the run


if __name__ == "__main__":
    sys.exit(main())
