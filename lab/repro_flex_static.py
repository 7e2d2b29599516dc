#!/usr/bin/env python3
"""Reproduces suites/findings/flex_static_no_choices.toml: FlexAttention compiled
with static shapes (dynamo's default for a first compile) fails in inductor on
the finding's cases, while `dynamic=True` (the flex adapter's setting) compiles
and matches the float64 reference.

Each (case, dynamic) pair runs in a fresh process, so no earlier compile
decides what dynamo specialises. Prints one line per pair; exit 0 always (the
finding is the printed outcome).

    PYTHONPATH=. python lab/repro_flex_static.py       # on a CUDA GPU
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SUITE = ROOT / "suites" / "findings" / "flex_static_no_choices.toml"

CHILD = r"""
import sys, torch
sys.path.insert(0, {root!r})
import treebench.backends.flex as flex
from treebench.harness.model.compare import compare
from treebench.harness.model.paged import build_inputs
from treebench.harness.model.reference import reference_attention
from treebench.harness.model.suites import load_suite
flex.DYNAMIC = {dynamic}
case = load_suite({suite!r}).cases[{index}]
inputs = build_inputs(case, "cuda")
try:
    out = flex.FlexTree().prepare(inputs)()
    rec = compare(out, reference_attention(inputs), inputs.qo_indptr, case.dtype)
    print("pass" if rec.passed else f"mismatch max_abs_err={{rec.max_abs_err:.3g}}")
except Exception as e:
    print(f"{{type(e).__name__}}: {{str(e).strip().splitlines()[0][:160]}}")
"""


def main() -> int:
    sys.path.insert(0, str(ROOT))
    import torch

    from treebench.harness.model.suites import load_suite
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name() if torch.cuda.is_available() else 'no GPU'}")
    for i, case in enumerate(load_suite(SUITE).cases):
        for dynamic in (None, True):
            code = CHILD.format(root=str(ROOT), dynamic=dynamic, suite=str(SUITE), index=i)
            res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
            line = (res.stdout.strip().splitlines() or [f"exit {res.returncode}: {res.stderr.strip()[-200:]}"])[-1]
            print(f"B{case.batch_size} L{case.context_len} {case.tree} P{case.page_size} "
                  f"dynamic={dynamic}: {line}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
