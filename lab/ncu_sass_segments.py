#!/usr/bin/env python3
"""Where a kernel's warp-stall samples sit, from Nsight Compute's per-instruction SASS export
(`ncu --import R.ncu-rep --page source --csv --print-source sass | gzip > sass.csv.gz`):

    python lab/ncu_sass_segments.py sass-tree.csv.gz

Groups consecutive instructions that executed the same number of times (so a tile loop's
body, once per KV tile, and a work item's prologue and epilogue, once per item, fall in
separate segments) and prints each segment holding at least --min samples: its range,
execution count, instruction count, samples and top stall reasons. Exit 2 with one line
when the file is missing or not such an export.
"""

from __future__ import annotations

import argparse
import collections
import csv
import gzip
import sys


def segments(path: str, min_samples: int) -> list[str]:
    """The printed lines for one export; raises ValueError when it lacks the columns."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        rows = list(csv.reader(f))
    hdr = next((r for r in rows if "Warp Stall Sampling (All Samples)" in r), None)
    if hdr is None:
        raise ValueError("no 'Warp Stall Sampling (All Samples)' column: not an ncu SASS source export")
    ix = {h: i for i, h in enumerate(hdr)}
    stalls = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]
    data = [r for r in rows[rows.index(hdr) + 1:] if len(r) >= len(hdr)]
    num = lambda r, h: int(r[ix[h]] or 0)   # noqa: E731
    total = sum(num(r, "Warp Stall Sampling (All Samples)") for r in data) or 1
    out, start = [f"{path}: {len(data)} instructions, {total} samples"], 0
    for i in range(1, len(data) + 1):
        if i < len(data) and num(data[i], "Instructions Executed") == num(data[start], "Instructions Executed"):
            continue
        seg = data[start:i]
        s = sum(num(r, "Warp Stall Sampling (All Samples)") for r in seg)
        if s >= min_samples:
            agg = collections.Counter({h[6:]: sum(num(r, h) for r in seg) for h in stalls})
            out.append(f"[{start},{i}) executed {num(seg[0], 'Instructions Executed'):6d} n {len(seg):4d} "
                       f"samples {s:5d} ({s / total:5.1%})  {dict(agg.most_common(3))}  "
                       f"first: {seg[0][ix['Source']].strip()[:50]}")
        start = i
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                 allow_abbrev=False)
    ap.add_argument("export", nargs="+", help="sass-*.csv(.gz) files")
    ap.add_argument("--min", type=int, default=40, help="smallest segment printed, in samples (default 40)")
    args = ap.parse_args()
    for path in args.export:
        try:
            print("\n".join(segments(path, args.min)))
        except (OSError, ValueError, StopIteration) as e:
            print(f"ncu_sass_segments: {path}: {e}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
