#!/usr/bin/env python3
"""Runs the triton_tree kernel on one case a few times, for a profiler such as
Nsight Compute to attach to:

    ncu -k regex:tree_attn_fwd --launch-skip 3 -c 1 --section SpeedOfLight \\
        python lab/profile_case.py --tree vllm:pr_27 --batch-size 64 --config 64,64,4,3

Case: Hq 32, Hkv 8, D 128, bf16, P 128 unless given; --kv-dtype float8_e4m3fn / float8_e5m2 with
--k-scale / --v-scale for an fp8 pool; --config is
BLOCK_M,BLOCK_N,warps,stages[,max_regs[,bt_ahead[,ws[,fp8_stages]]]]; --ws on / off forces the
warp-specialised kernel or the tl kernel (`TreeAttention`'s ws); --mode the mask mode
(tree: the per-request bitmask, bias: the shared fp32 qq_bias, causal: j <= i,
as the triton_tree, triton_tree_bias and triton_causal backends run it).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from treebench.harness.model.cases import Case  # noqa: E402
from treebench.harness.errors import ConfigError  # noqa: E402
from treebench.harness.model.paged import build_inputs, triton_interpret  # noqa: E402
from treebench.kernels.options import KernelOptions  # noqa: E402
from treebench.kernels.tree_attention import TreeAttention  # noqa: E402
from treebench.kernels.tree_attention_plan import parse_kernel_config  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                 allow_abbrev=False)
    ap.add_argument("--tree", default="vllm:pr_27")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--context-len", type=int, default=2048)
    ap.add_argument("--page-size", type=int, default=128)
    ap.add_argument("--config", help="BLOCK_M,BLOCK_N,warps,stages[,max_regs[,bt_ahead[,ws[,fp8_stages]]]] "
                                     "(default: the tuned table's)")
    ap.add_argument("--kv-dtype", choices=["float8_e4m3fn", "float8_e5m2"], help="an fp8 pool (default: bf16)")
    ap.add_argument("--k-scale", type=float, default=1.0)
    ap.add_argument("--v-scale", type=float, default=1.0)
    ap.add_argument("--ws", choices=["on", "off", "auto"], default="auto", help="warp-specialised kernel (default auto)")
    ap.add_argument("--splits", type=int)
    ap.add_argument("--kv-desc", choices=["on", "off", "auto"], default="auto")
    ap.add_argument("--calls", type=int, default=5)
    ap.add_argument("--mode", choices=["tree", "bias", "causal"], default="tree", help="mask mode (default tree)")
    args = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        if args.calls < 1:
            raise ConfigError(f"--calls {args.calls}: must be >= 1")
        if device == "cpu" and not triton_interpret():
            raise ConfigError("no CUDA GPU: profile on a GPU, or set TRITON_INTERPRET=1 for a (slow) CPU run")
        case = Case(batch_size=args.batch_size, context_len=args.context_len, tree=args.tree,
                    page_size=args.page_size, kv_dtype=args.kv_dtype, k_scale=args.k_scale, v_scale=args.v_scale)
        cfg = parse_kernel_config(args.config) if args.config else None
        inputs = build_inputs(case, device)
        ta = TreeAttention(inputs.causal() if args.mode == "causal" else inputs, args.mode, config=cfg,
                           num_splits=args.splits, ws={"on": True, "off": False, "auto": None}[args.ws],
                           options=KernelOptions(kv_desc={"on": True, "off": False, "auto": None}[args.kv_desc]))
    except ConfigError as e:
        print(f"profile_case: {e}", file=sys.stderr)
        return 2
    for _ in range(args.calls):
        ta()
    if device == "cuda":
        torch.cuda.synchronize()
    print(f"kernel {ta.kernel}, plan {ta.plan}, kv_desc {ta.kv_desc}, ws {ta.ws}, ws_pipe {ta.ws_pipe}, mode {args.mode}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
