#!/usr/bin/env python3
"""SM clock, power and throttle reasons while one triton_tree case is timed by the harness's
timers, to test whether a warm, back-to-back run is slower than an L2-flushed one because the
GPU clocks down (docs/kernel.md: full:3:3 at B 64 read 212 us flushed, 224 us back to back at 4a38cee):

    python lab/clock_probe.py --tree full:3:3 --out results/local/clocks

For each timer in --timers (cuda_graph with the L2 flushed, cuda_graph with a warm L2,
cuda_graph_loop: the harness's three, `treebench.harness.timing.timers.time_callable`), it times the case
again and again for --seconds, while `nvidia-smi` samples the GPU every --interval-ms ms. It
writes `clocks.csv` (nvidia-smi's samples, with the timer each fell in) and `summary.md` (per
timer: the median of the per-call medians, the samples' median SM clock, mean and max power,
and which throttle reasons were set), and prints the summary.

Case: Hq 32, Hkv 8, D 128, bf16, P 128 unless given, --mode tree|bias|causal. Needs a CUDA GPU
and nvidia-smi; bad input gives one line and exit 2.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from treebench.harness.timing import stats  # noqa: E402
from treebench.harness.model.cases import Case  # noqa: E402
from treebench.harness.errors import ConfigError  # noqa: E402

TIMERS = {"flushed": ("cuda_graph", True), "warm": ("cuda_graph", False), "loop": ("cuda_graph_loop", False)}
FIELDS = "timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_event_reasons.active"


def parse_smi_line(line: str) -> tuple[float, float, float, float, float, int] | None:
    """One `nvidia-smi --query-gpu=FIELDS --format=csv,noheader,nounits` line -> (unix time s,
    SM MHz, memory MHz, power W, temperature C, throttle-reason bitmask), or None when it does
    not parse (a header, '[N/A]')."""
    parts = [p.strip() for p in line.split(",")]
    if len(parts) != 6:
        return None
    try:
        ts = time.mktime(time.strptime(parts[0].split(".")[0], "%Y/%m/%d %H:%M:%S"))
        frac = float("0." + parts[0].split(".")[1]) if "." in parts[0] else 0.0
        return (ts + frac, float(parts[1]), float(parts[2]), float(parts[3]), float(parts[4]), int(parts[5], 16))
    except (ValueError, IndexError):
        return None


def summarize(name: str, medians_us: list[float], samples: list[tuple]) -> dict:
    """One timer's row of summary.md: calls_median_us (the median of its timings' medians, us),
    timings, smi_samples, sm_mhz_median / sm_mhz_min (MHz), power_w_mean / power_w_max (W),
    temp_c_max (C) and throttle_reasons (the samples' reason bitmasks OR-ed, hex); `samples`
    are `parse_smi_line` tuples, NaN where there are none."""
    reasons = 0
    for s in samples:
        reasons |= s[5]
    return {"timer": name, "calls_median_us": statistics.median(medians_us) if medians_us else float("nan"),
            "timings": len(medians_us), "smi_samples": len(samples),
            "sm_mhz_median": statistics.median(s[1] for s in samples) if samples else float("nan"),
            "sm_mhz_min": min((s[1] for s in samples), default=float("nan")),
            "power_w_mean": statistics.fmean(s[3] for s in samples) if samples else float("nan"),
            "power_w_max": max((s[3] for s in samples), default=float("nan")),
            "temp_c_max": max((s[4] for s in samples), default=float("nan")),
            "throttle_reasons": f"0x{reasons:x}"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                 allow_abbrev=False)
    ap.add_argument("--tree", default="full:3:3")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--context-len", type=int, default=2048)
    ap.add_argument("--page-size", type=int, default=128)
    ap.add_argument("--mode", choices=["tree", "bias", "causal"], default="tree")
    ap.add_argument("--timers", default="flushed,loop,warm,flushed,loop",
                    help=f"comma-separated, in order, from {', '.join(TIMERS)} (default: %(default)s)")
    ap.add_argument("--seconds", type=float, default=4.0, help="seconds per timer (default 4)")
    ap.add_argument("--interval-ms", type=int, default=20, help="nvidia-smi sampling period (default 20)")
    ap.add_argument("--out", required=True, help="folder for clocks.csv and summary.md")
    args = ap.parse_args()
    try:
        timers = [t.strip() for t in args.timers.split(",") if t.strip()]
        bad = [t for t in timers if t not in TIMERS]
        if bad or not timers:
            raise ConfigError(f"--timers {args.timers!r}: use names from {', '.join(TIMERS)}")
        if args.seconds <= 0 or args.interval_ms < 1:
            raise ConfigError("--seconds and --interval-ms must be positive")
        import torch
        if not torch.cuda.is_available():
            raise ConfigError("no CUDA GPU: this probe reads a GPU's clocks")
        from treebench.harness.model.paged import build_inputs
        from treebench.harness.timing.timers import time_callable
        from treebench.kernels.tree_attention import TreeAttention
        case = Case(batch_size=args.batch_size, context_len=args.context_len, tree=args.tree,
                    page_size=args.page_size)
        inputs = build_inputs(case, "cuda")
        ta = TreeAttention(inputs.causal() if args.mode == "causal" else inputs, args.mode)
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        smi = subprocess.Popen(["nvidia-smi", f"--query-gpu={FIELDS}", "--format=csv,noheader,nounits",
                                f"-lms={args.interval_ms}"], stdout=subprocess.PIPE, text=True, bufsize=1)
        lines: list[str] = []                      # read as they come: nothing is lost in a pipe buffer
        reader = threading.Thread(target=lambda: lines.extend(smi.stdout), daemon=True)
        reader.start()
    except (ConfigError, OSError) as e:
        print(f"clock_probe: {e}", file=sys.stderr)
        return 2
    windows = []                                   # (timer, start, end, per-call medians)
    try:
        ta()
        torch.cuda.synchronize()
        time.sleep(1.0)                            # an idle baseline before the first timer
        for name in timers:
            mode, flush = TIMERS[name]
            t0, meds = time.time(), []
            while time.time() - t0 < args.seconds:
                t = time_callable(ta, device="cuda", mode=mode, flush_l2=flush, rep_ms=200)
                meds.append(stats.summarize(t.samples_us).median_us)
            windows.append((name, t0, time.time(), meds))
            time.sleep(1.0)
    finally:
        smi.terminate()
        smi.wait(timeout=10)
        reader.join(timeout=10)
    samples = [s for s in map(parse_smi_line, lines) if s]
    with open(out / "clocks.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["unix_s", "timer", "sm_mhz", "mem_mhz", "power_w", "temp_c", "throttle_reasons"])
        for s in samples:
            where = next((n for n, a, b, _ in windows if a <= s[0] <= b), "idle")
            w.writerow([f"{s[0]:.3f}", where, s[1], s[2], s[3], s[4], f"0x{s[5]:x}"])
    rows = [summarize(n, m, [s for s in samples if a <= s[0] <= b]) for n, a, b, m in windows]
    head = list(rows[0])
    text = [f"tree {args.tree}, B {args.batch_size}, "
            f"L {args.context_len}, P {args.page_size}, mode {args.mode}, plan {ta.plan}",
            "", "| " + " | ".join(head) + " |", "| " + " | ".join("---" for _ in head) + " |"]
    for r in rows:
        text.append("| " + " | ".join(f"{v:.1f}" if isinstance(v, float) else str(v) for v in r.values()) + " |")
    (out / "summary.md").write_text("\n".join(text) + "\n")
    print("\n".join(text))
    return 0


if __name__ == "__main__":
    sys.exit(main())
