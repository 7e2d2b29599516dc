#!/usr/bin/env python3
"""Split-KV sweep of the triton_tree kernel at small batch, timed by the harness's
own timer, side by side with FlashInfer on the same inputs.

For each cell (B, L, tree, P) it builds the inputs once (shuffled pages), checks
every variant against the float64 reference, and times it with
`treebench.harness.timing.timers.time_callable` (CUDA graph, L2 flushed before each call): the
heuristic's split count, fixed split counts, and the fused merge. One profiler
pass per cell gives each kernel's duration (forward, merge) for the heuristic's
variant, and the merge kernel with 2 and 4 rows per program. Used to choose
`kernels/tree_attention_plan.choose_num_splits`
(docs/kernel.md; the sweep's CSV at 76e284d: lab/runs.md, run4-splits).

    PYTHONPATH=. python lab/splits_sweep.py --out $OUT     # on the H200
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from treebench.harness.run.loading import load_backend  # noqa: E402
from treebench.harness.model.cases import Case  # noqa: E402
from treebench.harness.model.compare import compare  # noqa: E402
from treebench.harness.model.paged import build_inputs  # noqa: E402
from treebench.harness.model.reference import reference_attention  # noqa: E402
from treebench.harness.timing.stats import summarize  # noqa: E402
from treebench.harness.timing.timers import time_callable  # noqa: E402
from treebench.kernels.tree_attention import TreeAttention  # noqa: E402

TREES = ("full:3:0", "full:3:1", "full:3:2", "vllm:pr_27", "full:3:3", "medusa:mc_sim_7b_63")
SPLITS = (4, 6, 8, 11, 16, 24)
FUSED_SPLITS = (8, 16)
MERGE_ROWS = (2, 4)      # rows per merge program (the default is 1); G = 4 groups a KV head's rows


def cells() -> list[Case]:
    """The sweep's cases: B 1 over L 1024/2048 x TREES x P 128/16, and B 16 at P 128."""
    out = [Case(batch_size=1, context_len=L, tree=t, page_size=p)
           for p in (128, 16) for L in (1024, 2048) for t in TREES]
    out += [Case(batch_size=16, context_len=L, tree=t, page_size=128)
            for L in (1024, 2048) for t in ("full:3:1", "full:3:2", "vllm:pr_27")]
    return out


def kernel_times(fn) -> dict:
    """Median device time of each kernel of one call, over 20 profiled calls (name -> us)."""
    from torch.profiler import ProfilerActivity, profile
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(20):
            fn()
        torch.cuda.synchronize()
    per: dict[str, list[float]] = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            per.setdefault(e.name.split("(")[0][:40], []).append(e.time_range.elapsed_us())
    return {k: sorted(v)[len(v) // 2] for k, v in per.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                 allow_abbrev=False)
    ap.add_argument("--out", default=os.environ.get("OUT", "results/local/lab"))
    ap.add_argument("--budget-s", type=float, default=300.0)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t_end = time.time() + args.budget_s
    fi = load_backend("flashinfer_mask")
    fi_ok = fi.availability() is None
    f = open(out / "splits_sweep.csv", "w", newline="")
    w = csv.writer(f)
    w.writerow(["B", "L", "tree", "P", "variant", "splits", "fused", "status", "max_abs_err",
                "median_us", "p25_us", "p75_us", "kernels"])
    for case in cells():
        if time.time() > t_end:
            print("budget spent; stopping", flush=True)
            break
        inputs = build_inputs(case, "cuda")
        ref = reference_attention(inputs)
        variants = [("heuristic", None, False, 1)] + [(f"s{s}", s, False, 1) for s in SPLITS] \
            + [(f"s{s}-fused", s, True, 1) for s in FUSED_SPLITS] \
            + [(f"heuristic-rows{r}", None, False, r) for r in MERGE_ROWS]
        base = [case.batch_size, case.context_len, case.tree, case.page_size]
        for name, splits, fused, merge_rows in variants:
            try:
                ta = TreeAttention(inputs, num_splits=splits, fused_merge=fused, merge_rows=merge_rows)
                rec = compare(ta(), ref, inputs.qo_indptr, case.dtype)
                s = summarize(time_callable(ta, device="cuda").samples_us)
                kt = kernel_times(ta) if name == "heuristic" else {}
                w.writerow(base + [name, ta.plan.num_splits, fused, ("pass" if rec.passed else "mismatch"), f"{rec.max_abs_err:.3g}",
                                   f"{s.median_us:.2f}", f"{s.p25_us:.2f}", f"{s.p75_us:.2f}",
                                   ";".join(f"{k}={v:.2f}" for k, v in kt.items())])
            except Exception as e:  # noqa: BLE001 -- record and go on
                w.writerow(base + [name, splits, fused, f"error: {type(e).__name__}: {e}"[:200], "", "", "", "", ""])
        if fi_ok and not fi.supports(case):
            try:
                fn = fi.prepare(inputs)
                rec = compare(fn()[0], ref, inputs.qo_indptr, case.dtype)      # (out, lse)
                s = summarize(time_callable(fn, device="cuda").samples_us)
                w.writerow(base + ["flashinfer_mask", "", "", ("pass" if rec.passed else "mismatch"), f"{rec.max_abs_err:.3g}",
                                   f"{s.median_us:.2f}", f"{s.p25_us:.2f}", f"{s.p75_us:.2f}",
                                   ";".join(f"{k}={v:.2f}" for k, v in kernel_times(fn).items())])
            except Exception as e:  # noqa: BLE001
                w.writerow(base + ["flashinfer_mask", "", "", f"error: {e}"[:200], "", "", "", "", ""])
        f.flush()
        print("done", case.batch_size, case.context_len, case.tree, case.page_size, flush=True)
    f.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
