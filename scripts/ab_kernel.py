"""Two revisions of treebench's Triton kernel side by side, timed by the harness's own timer.

    git show REV:kernels/tree_attention.py > BASE/tree_attention.py   # ... every kernels/*.py
    python3 scripts/ab_kernel.py --base BASE [--out DIR] [--rounds 3]

BASE holds the `kernels/*.py` files of the base revision. They are loaded as a
second package (`kernels_base`) next to the working tree's `kernels`, so both
run in one process on the same inputs. For each cell (Hq 32, Hkv 8, D 128,
bf16; by default the issue's four speed targets and three neighbours, each at
P 128 and P 16; `--cells` takes others: "B:L:tree", cells separated by commas,
a new cell starting at each "B:L:", so trees with commas work too) the
two `TreeAttention` callables are timed in alternation, `--rounds` times each,
with `harness.timing.time_callable` (CUDA graph, L2 flushed: the timer of
`treebench run`). Each round's median is kept; a side's time is the median of
its rounds, and the ratio is new / base measured in the same run. Both outputs
are checked against the float64 reference first.

Writes DIR/ab.csv (one row per cell and side, flushed as it goes, so a run cut
short keeps what it measured) and prints a table. Exit 2 on bad input (no GPU,
BASE without the kernel files, a cell or page size the harness refuses), one
line, nothing written.
"""

from __future__ import annotations

import argparse
import atexit
import csv
import importlib
import os
import re
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.cases import Case  # noqa: E402
from harness.compare import compare  # noqa: E402
from harness.paged import build_inputs  # noqa: E402
from harness.reference import reference_attention  # noqa: E402
from harness.stats import summarize  # noqa: E402
from harness.timing import time_callable  # noqa: E402

HEADS = dict(num_q_heads=32, num_kv_heads=8, head_dim=128)
CELLS = [(64, 2048, "vllm:pr_27"), (64, 2048, "full:3:3"), (64, 2048, "full:3:1"), (1, 2048, "vllm:pr_27"),
         (1, 1024, "vllm:pr_27"), (1, 2048, "full:3:3"), (16, 2048, "eagle:mc_sim_7b_63")]
KERNEL_FILES = ("__init__.py", "launch.py", "tree_attention.py", "tree_attention_plan.py", "tree_attention_reduce.py")
OPTIONAL_FILES = ("tree_attention_tl.py", "tree_attention_ws.py")   # revisions from session 6 on


def load_base(base: Path):
    """The base revision's `kernels` package, imported as `kernels_base` (its absolute
    `kernels.` imports rewritten) from a temporary copy."""
    tmp = tempfile.mkdtemp(prefix="ab-kernel-")
    atexit.register(shutil.rmtree, tmp, ignore_errors=True)
    pkg = Path(tmp) / "kernels_base"
    pkg.mkdir()
    for name in KERNEL_FILES + tuple(n for n in OPTIONAL_FILES if (base / n).is_file()):
        text = (base / name).read_text().replace("from kernels.", "from kernels_base.").replace(
            "import kernels.", "import kernels_base.")
        (pkg / name).write_text(text)
    sys.path.insert(0, str(pkg.parent))
    return importlib.import_module("kernels_base.tree_attention")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", required=True, help="folder with the base revision's kernels/*.py")
    ap.add_argument("--out", default=os.environ.get("OUT", "results/kernel-dev"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--pages", default="128,16", help="page sizes, comma-separated")
    ap.add_argument("--cells", help="B:L:tree cells, comma-separated (default: the issue's targets and "
                                    "neighbours), e.g. 1:2048:vllm:pr_27,16:1024:full:3:2")
    args = ap.parse_args()
    base = Path(args.base)
    missing = [n for n in KERNEL_FILES if not (base / n).is_file()]
    if missing:
        print(f"ab_kernel: --base {base} lacks {', '.join(missing)} (the base revision's kernels/*.py)",
              file=sys.stderr)
        return 2
    if args.rounds < 1:
        print(f"ab_kernel: --rounds {args.rounds}: must be >= 1", file=sys.stderr)
        return 2
    try:
        pages = [int(p) for p in args.pages.split(",")]
    except ValueError:
        print(f"ab_kernel: --pages {args.pages!r}: comma-separated integers, e.g. 128,16", file=sys.stderr)
        return 2
    cells = CELLS
    if args.cells:
        cells = []
        for cell in re.split(r",(?=\s*-?\d+:-?\d+:)", args.cells):      # a new cell starts at "B:L:"
            m = re.fullmatch(r"\s*(-?\d+):(-?\d+):(.+)", cell)
            if not m:
                print(f"ab_kernel: --cells: {cell!r} is not B:L:tree (e.g. 1:2048:vllm:pr_27)", file=sys.stderr)
                return 2
            cells.append((int(m[1]), int(m[2]), m[3]))
    for b, l, tree in cells:          # every case the harness would refuse, refused before anything is written
        for p in pages:
            try:
                Case(batch_size=b, context_len=l, tree=tree, page_size=p, **HEADS).trees()
            except Exception as e:   # ConfigError or a tree parser's error: one line, exit 2
                print(f"ab_kernel: cell {b}:{l}:{tree} at P {p}: {e}", file=sys.stderr)
                return 2
    if not torch.cuda.is_available():
        print("ab_kernel: no CUDA GPU (both revisions are timed on one)", file=sys.stderr)
        return 2
    sides = {"base": load_base(base).TreeAttention, "new": importlib.import_module("kernels.tree_attention").TreeAttention}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    fields = ["tree", "B", "L", "P", "side", "passed", "median_us", "rounds_us", "ratio_new_base"]
    csv_file = (out / "ab.csv").open("w", newline="")
    writer = csv.DictWriter(csv_file, fieldnames=fields)
    writer.writeheader()
    for b, l, tree in cells:
        for p in pages:
            case = Case(batch_size=b, context_len=l, tree=tree, page_size=p, **HEADS)
            inp = build_inputs(case, "cuda")
            ref = reference_attention(inp)
            fns, passed = {}, {}
            for side, cls in sides.items():
                ta = cls(inp, "tree")
                passed[side] = compare(ta().clone(), ref, inp.qo_indptr, case.dtype).passed
                fns[side] = ta
            medians = {s: [] for s in sides}
            for _ in range(args.rounds):
                for side, fn in fns.items():
                    t = time_callable(fn, device="cuda", mode="cuda_graph", flush_l2=True)
                    medians[side].append(summarize(t.samples_us).median_us)
            for side in sides:
                rows.append(dict(tree=tree, B=b, L=l, P=p, side=side, passed=passed[side],
                                 median_us=round(statistics.median(medians[side]), 2),
                                 rounds_us=" ".join(f"{x:.2f}" for x in medians[side]),
                                 ratio_new_base=round(statistics.median(medians["new"])
                                                      / statistics.median(medians["base"]), 4)))
            writer.writerows(rows[-2:])
            csv_file.flush()
            print(f"{tree:>20} B{b:<3} L{l:<5} P{p:<4} base {rows[-2]['median_us']:8.2f}  "
                  f"new {rows[-1]['median_us']:8.2f}  new/base {rows[-1]['ratio_new_base']:.4f}  "
                  f"passed {passed}", flush=True)
    csv_file.close()
    return 0 if all(r["passed"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
