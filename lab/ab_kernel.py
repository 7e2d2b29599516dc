"""Two revisions, or two sets of kernel options, of treebench's Triton kernel side by side,
timed by the harness's own timer.

    git show REV:kernels/tree_attention.py > BASE/tree_attention.py   # ... every kernels/*.py
    python3 lab/ab_kernel.py --base BASE [--variant NAME=DIR ...] [--out DIR] [--rounds 3]
    python3 lab/ab_kernel.py --base-options ws_pipe=false [--options NAME=SPEC ...]

BASE holds the `kernels/*.py` files of the base revision. They are loaded as a
second package (`kernels_base`) next to the working tree's `kernels`, so both
run in one process on the same inputs; each --variant folder (the same files)
is loaded alike (`kernels_NAME`) and timed as a third, fourth, ... side.
--base-options SPEC makes the base this tree's kernel with other `KernelOptions`
instead (SPEC: field=value pairs separated by commas, values true / false / none
or an integer; e.g. `ws3_pipe_min_tiles=1073741824` never pipelines 3 warpgroups,
the earlier rule); each --options NAME=SPEC is one more such side. For each cell (Hq 32, Hkv 8, D 128,
bf16; by default the four speed-target cells and three neighbours, each at
P 128 and P 16; `--cells` takes others: "B:L:tree", cells separated by commas,
a new cell starting at each "B:L:", so trees with commas work too) the
`TreeAttention` callables are timed in turn, `--rounds` times each (base, variants,
new in even rounds, the reverse in odd ones, so no side always runs last),
with `treebench.harness.timing.timers.time_callable` (CUDA graph, L2 flushed: the timer of
`treebench run`; `--timer loop`: back to back with a warm L2, as do_bench_cudagraph).
Each round's median is kept; a side's time is the median of its rounds, and each
side's ratio is side / base measured in the same run. Both outputs are checked
against the float64 reference first.

Writes DIR/ab.csv (one row per cell and side, flushed as it goes, so a run cut
short keeps what it measured) and prints a table. Exit 2 on bad input (no GPU,
BASE or a variant without the kernel files, a side name that is not an identifier
or repeats, options KernelOptions refuses, a cell or page size the harness refuses),
one line, nothing written.
"""

from __future__ import annotations

import argparse
import atexit
import csv
import dataclasses
import functools
import importlib
import os
import re
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import NoReturn

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from treebench.harness.model.cases import Case  # noqa: E402
from treebench.harness.model.compare import compare  # noqa: E402
from treebench.harness.errors import ConfigError  # noqa: E402
from treebench.harness.model.paged import build_inputs  # noqa: E402
from treebench.harness.model.reference import reference_attention  # noqa: E402
from treebench.harness.timing.stats import summarize  # noqa: E402
from treebench.harness.timing.timers import time_callable  # noqa: E402
from treebench.kernels.options import KernelOptions  # noqa: E402

HEADS = dict(num_q_heads=32, num_kv_heads=8, head_dim=128)
CELLS = [(64, 2048, "vllm:pr_27"), (64, 2048, "full:3:3"), (64, 2048, "full:3:1"), (1, 2048, "vllm:pr_27"),
         (1, 1024, "vllm:pr_27"), (1, 2048, "full:3:3"), (16, 2048, "eagle:mc_sim_7b_63")]
TIMERS = {"flushed": ("cuda_graph", True), "loop": ("cuda_graph_loop", False)}   # --timer: (mode, flush_l2)
KERNEL_FILES = ("__init__.py", "launch.py", "tree_attention.py", "tree_attention_plan.py", "tree_attention_reduce.py")
# every other module of the base's kernels folder is copied too (the tl, warp-specialised, options, gather
# and fp8 modules of later revisions), so the base imports its own modules, never this tree's


def load_base(base: Path, name: str = "base"):
    """A revision's `kernels` package from folder `base` (every `*.py` in it), imported as
    `kernels_<name>` from a temporary copy, its absolute imports of the package
    (`treebench.kernels.` and, in older revisions, `kernels.`) rewritten to the copy."""
    tmp = tempfile.mkdtemp(prefix="ab-kernel-")
    atexit.register(shutil.rmtree, tmp, ignore_errors=True)
    pkg = Path(tmp) / f"kernels_{name}"
    pkg.mkdir()
    for file in sorted({*KERNEL_FILES, *(p.name for p in base.glob("*.py"))}):
        text = (base / file).read_text().replace("treebench.kernels.", f"{pkg.name}.")
        text = text.replace("from kernels.", f"from {pkg.name}.").replace("import kernels.", f"import {pkg.name}.")
        (pkg / file).write_text(text)
    sys.path.insert(0, str(pkg.parent))
    return importlib.import_module(f"{pkg.name}.tree_attention")


def parse_args(argv: list[str] | None = None):
    """The command line -> (args, pages, cells); exits 2 with one line on bad input."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                 allow_abbrev=False)
    base = ap.add_mutually_exclusive_group(required=True)
    base.add_argument("--base", help="folder with the base revision's kernels/*.py")
    base.add_argument("--base-options", metavar="SPEC",
                      help="the base is this tree's kernel with KernelOptions(SPEC), e.g. ws_pipe=false")
    ap.add_argument("--variant", action="append", default=[], metavar="NAME=DIR",
                    help="another revision's kernels/*.py in DIR, timed as side NAME (repeatable)")
    ap.add_argument("--options", action="append", default=[], metavar="NAME=SPEC",
                    help="this tree's kernel with KernelOptions(SPEC), timed as side NAME (repeatable)")
    ap.add_argument("--out", default=os.environ.get("OUT", "results/local/lab"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--timer", choices=sorted(TIMERS), default="flushed",
                    help="flushed: the CUDA-graph timer with the L2 flushed (treebench run's default); loop: "
                         "back to back with a warm L2 (cuda_graph_loop, do_bench_cudagraph's method)")
    ap.add_argument("--pages", default="128,16", help="page sizes, comma-separated")
    ap.add_argument("--cells", help="B:L:tree cells, comma-separated (default: the speed targets and "
                                    "neighbours), e.g. 1:2048:vllm:pr_27,16:1024:full:3:2")
    args = ap.parse_args(argv)
    if args.base is not None:
        missing = missing_kernel_files(Path(args.base))
        if missing:
            refuse(f"--base {args.base} lacks {missing} (the base revision's kernels/*.py)")
    else:
        args.base_options = parse_options(args.base_options, "--base-options")
    args.variants = parse_variants(args.variant)
    args.option_sides = parse_option_sides(args.options, taken=set(args.variants))
    if args.rounds < 1:
        refuse(f"--rounds {args.rounds}: must be >= 1")
    try:
        pages = [int(p) for p in args.pages.split(",")]
    except ValueError:
        refuse(f"--pages {args.pages!r}: comma-separated integers, e.g. 128,16")
    cells = parse_cells(args.cells) if args.cells else CELLS
    for b, l, tree in cells:          # every case the harness would refuse, refused before anything is written
        for p in pages:
            try:
                Case(batch_size=b, context_len=l, tree=tree, page_size=p, **HEADS).trees()
            except Exception as e:   # ConfigError or a tree parser's error: one line, exit 2
                refuse(f"cell {b}:{l}:{tree} at P {p}: {e}")
    return args, pages, cells


def missing_kernel_files(folder: Path) -> str:
    """The KERNEL_FILES that `folder` lacks, comma-separated ('' when none)."""
    return ", ".join(n for n in KERNEL_FILES if not (folder / n).is_file())


def refuse(message: str) -> NoReturn:
    """One line on stderr, exit 2."""
    print(f"ab_kernel: {message}", file=sys.stderr)
    sys.exit(2)


def parse_variants(specs: list[str]) -> dict[str, Path]:
    """--variant NAME=DIR specs -> {NAME: DIR}; exits 2 on a bad name, a repeated or
    reserved one (base, new), or a folder without the kernel files."""
    variants = {}
    for spec in specs:
        name, sep, folder = spec.partition("=")
        if not sep or not name.isidentifier():
            refuse(f"--variant {spec!r}: NAME=DIR with NAME an identifier, e.g. v1=ab/v1")
        if name in variants or name in ("base", "new"):
            refuse(f"--variant {spec!r}: the side name {name!r} is taken")
        missing = missing_kernel_files(Path(folder))
        if missing:
            refuse(f"--variant {spec!r}: {folder} lacks {missing}")
        variants[name] = Path(folder)
    return variants


def parse_options(spec: str, flag: str) -> KernelOptions:
    """'field=value,...' (values true / false / none or an integer) -> KernelOptions;
    exits 2 naming `flag` on a pair of another form, an unknown field or a value
    KernelOptions refuses."""
    kw = {}
    for pair in filter(None, (p.strip() for p in spec.split(","))):
        field, sep, text = pair.partition("=")
        if not sep:
            refuse(f"{flag} {spec!r}: {pair!r} is not field=value (e.g. ws_pipe=false)")
        kw[field.strip()] = option_value(text.strip())
    try:
        return KernelOptions(**kw)
    except TypeError as e:     # an unknown field
        known = ", ".join(f.name for f in dataclasses.fields(KernelOptions))
        refuse(f"{flag} {spec!r}: {e} (the fields: {known})")
    except ConfigError as e:
        refuse(f"{flag} {spec!r}: {e}")


def option_value(text: str):
    """An option's value from the command line: true / false / none (any case), an
    integer, else the text itself (for KernelOptions to refuse, naming it)."""
    words = {"true": True, "false": False, "none": None}
    if text.lower() in words:
        return words[text.lower()]
    return int(text) if re.fullmatch(r"-?\d+", text) else text


def parse_option_sides(specs: list[str], taken: set[str]) -> dict[str, KernelOptions]:
    """--options NAME=SPEC specs -> {NAME: KernelOptions}; exits 2 on a bad name, one
    repeated or taken (base, new, a --variant's), or options KernelOptions refuses."""
    sides: dict[str, KernelOptions] = {}
    for spec in specs:
        name, sep, options = spec.partition("=")
        if not sep or not name.isidentifier():
            refuse(f"--options {spec!r}: NAME=SPEC with NAME an identifier, e.g. nopipe=ws_pipe=false")
        if name in sides or name in taken or name in ("base", "new"):
            refuse(f"--options {spec!r}: the side name {name!r} is taken")
        sides[name] = parse_options(options, f"--options {name}")
    return sides


def parse_cells(text: str) -> list[tuple[int, int, str]]:
    """'B:L:tree' cells separated by commas (a new cell starts at each "B:L:", so
    trees with commas work) -> [(B, L, tree)]; exits 2 on a cell of another form."""
    cells = []
    for cell in re.split(r",(?=\s*-?\d+:-?\d+:)", text):
        m = re.fullmatch(r"\s*(-?\d+):(-?\d+):(.+)", cell)
        if not m:
            refuse(f"--cells: {cell!r} is not B:L:tree (e.g. 1:2048:vllm:pr_27)")
        cells.append((int(m[1]), int(m[2]), m[3]))
    return cells


def time_sides(fns: dict, rounds: int, timer: str = "flushed") -> dict[str, list[float]]:
    """Each side's per-round median (us) with the harness's timer (`TIMERS[timer]`); the
    order of the sides reverses from round to round, so no side always runs last."""
    mode, flush = TIMERS[timer]
    medians = {s: [] for s in fns}
    for r in range(rounds):
        for side in (list(fns) if r % 2 == 0 else list(fns)[::-1]):
            t = time_callable(fns[side], device="cuda", mode=mode, flush_l2=flush)
            medians[side].append(summarize(t.samples_us).median_us)
    return medians


def measure_cell(sides: dict, b: int, l: int, tree: str, p: int, rounds: int, timer: str = "flushed") -> list[dict]:
    """One cell: every side checked against the float64 reference, then timed -> a row per side."""
    case = Case(batch_size=b, context_len=l, tree=tree, page_size=p, **HEADS)
    inp = build_inputs(case, "cuda")
    ref = reference_attention(inp)
    fns, passed = {}, {}
    for side, cls in sides.items():
        ta = cls(inp, "tree")
        passed[side] = compare(ta().clone(), ref, inp.qo_indptr, case.dtype).passed
        fns[side] = ta
    medians = time_sides(fns, rounds, timer)
    base = statistics.median(medians["base"])
    return [dict(tree=tree, B=b, L=l, P=p, side=side, passed=passed[side],
                 median_us=round(statistics.median(medians[side]), 2),
                 rounds_us=" ".join(f"{x:.2f}" for x in medians[side]),
                 ratio_vs_base=round(statistics.median(medians[side]) / base, 4)) for side in sides]


def main() -> int:
    args, pages, cells = parse_args()
    if not torch.cuda.is_available():
        refuse("no CUDA GPU (every side is timed on one)")
    new = importlib.import_module("treebench.kernels.tree_attention").TreeAttention
    sides = {"base": load_base(Path(args.base)).TreeAttention if args.base is not None
             else functools.partial(new, options=args.base_options)}
    for name, folder in args.variants.items():
        sides[name] = load_base(folder, name).TreeAttention
    for name, options in args.option_sides.items():
        sides[name] = functools.partial(new, options=options)
    sides["new"] = new
    for name, side in sides.items():
        if isinstance(side, functools.partial):
            print(f"{name}: this tree, KernelOptions {side.keywords['options'].changed() or 'defaults'}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    fields = ["tree", "B", "L", "P", "side", "passed", "median_us", "rounds_us", "ratio_vs_base"]
    with (out / "ab.csv").open("w", newline="") as csv_file:
        writer = csv.DictWriter(csv_file, fieldnames=fields)
        writer.writeheader()
        for b, l, tree in cells:
            for p in pages:
                cell_rows = measure_cell(sides, b, l, tree, p, args.rounds, args.timer)
                rows += cell_rows
                writer.writerows(cell_rows)
                csv_file.flush()
                print(f"{tree:>20} B{b:<3} L{l:<5} P{p:<4} " + "  ".join(
                    f"{r['side']} {r['median_us']:8.2f} ({r['ratio_vs_base']:.4f}{'' if r['passed'] else ' FAIL'})"
                    for r in cell_rows), flush=True)
    return 0 if all(r["passed"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
