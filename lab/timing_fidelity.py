"""Timing fidelity on a GPU: does the CUDA-graph timer report what the kernels take?

For three seed cases (small, medium, large) and each chosen backend it measures

- the CUDA-graph median (treebench.harness.timing.timers, L2 flushed, the default timer) in
  three independent runs, and the run-to-run CV of that median;
- the kernels' own durations from the PyTorch profiler (CUPTI) while the same
  graph is replayed, flushed the same way: their sum per call (median over 30
  calls) and their span (first kernel start to last kernel end);
- for context, the eager kernel sum, and the CUDA-event and host-inclusive
  medians (launch overhead).

It prints a Markdown table (paste it into docs/timing.md) and writes
timing_fidelity.json and .md under $OUT (or --out). The agreement target is
5%: |graph median / kernel sum - 1| < 0.05. A backend of many small kernels
also shows the gaps between them here, which the kernel sum leaves out.

    python3 lab/timing_fidelity.py                       # first available of triton_tree, flashinfer_mask, ...
    python3 lab/timing_fidelity.py --backends flashinfer_mask,xformers_tree
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
from pathlib import Path

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from treebench.harness.run.loading import load_backend  # noqa: E402
from treebench.harness.model.cases import Case  # noqa: E402
from treebench.harness.model.paged import build_inputs  # noqa: E402
from treebench.harness.timing.stats import cv_of_medians, summarize  # noqa: E402
from treebench.harness.timing.bandwidth import measure_peak_bandwidth  # noqa: E402
from treebench.harness.timing.timers import _flush_buffer, time_callable  # noqa: E402

log = logging.getLogger("timing_fidelity")
PREFERRED = ("triton_tree", "flashinfer_mask", "xformers_tree", "torch_sdpa")
CASES = (  # small (launch-bound), medium, large (bandwidth-bound) seed cases
    Case(batch_size=1, context_len=1024, tree="full:3:1"),
    Case(batch_size=16, context_len=2048, tree="full:3:2"),
    Case(batch_size=64, context_len=2048, tree="full:3:3"),
)
RUNS = 3          # independent CUDA-graph timings per case
PROFILED = 30     # calls under the profiler
TARGET = 0.05     # agreement target, graph median vs kernel sum


def pick_backends(spec: str | None) -> list:
    """Backends named in `spec` (comma-separated), else the first available of PREFERRED."""
    names = [n.strip() for n in spec.split(",")] if spec else list(PREFERRED)
    found = []
    for n in names:
        try:
            b = load_backend(n)
        except Exception as e:  # noqa: BLE001 -- not registered yet / import failure: try the next
            log.warning("backend %s: %s", n, e)
            continue
        reason = b.availability()
        if reason:
            log.warning("backend %s unavailable: %s", n, reason)
            continue
        found.append(b)
        if not spec:
            break
    if not found:
        raise SystemExit(f"no usable backend among {', '.join(names)}")
    return found


MARKER = "spin_kernel"   # the kernel of torch.cuda._sleep: a backend never launches it


def profile_device(step, label: str) -> dict:
    """Device work of each call of `step` under torch.profiler (CUPTI), L2 flushed before each.

    The device timeline per call is [flush][marker][step's kernels]: the work of
    call i is every device event between marker i and the flush of call i + 1.

    Returns:
        {label}_kernel_sum_us (sum of kernel/memcpy/memset durations, median over
        calls), {label}_span_us (first start to last end), {label}_kernels (count),
        {label}_names (distinct names, first call).
    """
    flush = _flush_buffer(torch.cuda.current_device()).zero_
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(PROFILED + 1):            # the extra flush + marker closes the last call
            flush()
            torch.cuda._sleep(1)
            if _ < PROFILED:
                step()
            torch.cuda.synchronize()
    dev = sorted((e for e in prof.events() if e.device_type == DeviceType.CUDA),
                 key=lambda e: e.time_range.start)
    marks = [i for i, e in enumerate(dev) if MARKER in e.name]
    calls = [dev[a + 1:b - 1] for a, b in zip(marks, marks[1:])]   # drop the next call's flush
    calls = [c for c in calls if c]
    if not calls:
        log.warning("%s: no device work between markers; device events seen: %s", label,
                    sorted({e.name[:60] for e in dev})[:12])
        return {f"{label}_kernel_sum_us": None, f"{label}_span_us": None, f"{label}_kernels": 0, f"{label}_names": []}
    return {f"{label}_kernel_sum_us": statistics.median(sum(e.time_range.elapsed_us() for e in c) for c in calls),
            f"{label}_span_us": statistics.median(c[-1].time_range.end - c[0].time_range.start for c in calls),
            f"{label}_kernels": statistics.median(len(c) for c in calls),
            f"{label}_names": sorted({e.name[:80] for e in calls[0]})}


def graph_of(fn):
    """fn captured in a CUDA graph (warmed up on a side stream first), or None when it cannot be."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(g):
            fn()
    except Exception as e:  # noqa: BLE001 -- report it, keep measuring eagerly
        log.warning("capture failed: %s", e)
        return None
    return g


def measure(backend, case: Case) -> dict:
    """All figures for one backend on one case."""
    inputs = build_inputs(case, "cuda")
    reason = backend.supports(case)
    if reason:
        return {"backend": backend.name, "case_id": case.case_id, "skipped": reason}
    fn = backend.prepare(inputs)
    runs = [time_callable(fn, device="cuda", mode="cuda_graph") for _ in range(RUNS)]
    medians = [summarize(t.samples_us).median_us for t in runs]
    graph = statistics.median(medians)
    g = graph_of(fn) if runs[0].timer == "cuda_graph" else None
    prof = {**profile_device(fn, "eager"), **(profile_device(g.replay, "graph") if g else {})}
    ref = prof.get("graph_kernel_sum_us") or prof["eager_kernel_sum_us"]
    row = {"backend": backend.name, "case_id": case.case_id, "B": case.batch_size, "L": case.context_len,
           "tree": case.tree, "timer": runs[0].timer, "fallback": runs[0].fallback_reason,
           "graph_medians_us": medians, "graph_median_us": graph, "cv_of_median": cv_of_medians(
               [t.samples_us for t in runs]), "n_samples": [len(t.samples_us) for t in runs], **prof,
           "event_median_us": summarize(time_callable(fn, device="cuda", mode="cuda_event").samples_us).median_us,
           "host_median_us": summarize(time_callable(fn, device="cuda", mode="host_inclusive").samples_us).median_us}
    row["graph_vs_kernels"] = graph / ref - 1 if ref else None
    row["within_target"] = row["graph_vs_kernels"] is not None and abs(row["graph_vs_kernels"]) < TARGET
    return row


def timer_floor() -> float:
    """CUDA-graph median of an empty call: the cost of the two event nodes around a call, us."""
    return summarize(time_callable(lambda: None, device="cuda", mode="cuda_graph").samples_us).median_us


def _f(x, spec=".2f") -> str:
    return "—" if x is None else format(x, spec)


def markdown(rows: list[dict], env: dict) -> str:
    """The Markdown table for docs/timing.md."""
    lines = [f"GPU: {env['gpu']}, torch {env['torch']}, measured copy bandwidth {env['peak_tb_per_s']:.2f} TB/s; "
             f"{RUNS} timer runs per case, profiler over {PROFILED} calls, L2 flushed before every call in both; "
             f"CUDA-graph median of an empty call (the timer's floor): {env['floor_us']:.2f} µs.", "",
             "| backend | B | L | tree | timer | kernels/call | timer median µs (3 runs) | profiler kernel sum µs "
             "(in graph) | median / kernel sum − 1 | kernel span µs (in graph) | CV of median (3 runs) "
             "| eager kernel sum µs | CUDA events µs | host-inclusive µs |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "skipped" in r:
            lines.append(f"| {r['backend']} | `{r['case_id']}` | skipped: {r['skipped']} | | | | | | | | | | | |")
            continue
        diff = r["graph_vs_kernels"]
        verdict = "—" if diff is None else f"{100 * diff:+.1f}% {'✓' if r['within_target'] else '✗'}"
        lines.append(
            f"| {r['backend']} | {r['B']} | {r['L']} | {r['tree']} | {r['timer']} | "
            f"{_f(r.get('graph_kernels', r['eager_kernels']), 'g')} | "
            f"{r['graph_median_us']:.2f} ({', '.join(f'{m:.2f}' for m in r['graph_medians_us'])}) | "
            f"{_f(r.get('graph_kernel_sum_us'))} | {verdict} | {_f(r.get('graph_span_us'))} | "
            f"{100 * r['cv_of_median']:.2f}% | {_f(r['eager_kernel_sum_us'])} | {r['event_median_us']:.2f} | "
            f"{r['host_median_us']:.2f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    p.add_argument("--backends", default=None, help=f"comma-separated (default: first available of {PREFERRED})")
    p.add_argument("--out", default=os.environ.get("OUT", "."), help="folder for timing_fidelity.json (default $OUT)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if not torch.cuda.is_available():
        raise SystemExit("timing_fidelity.py needs a CUDA GPU")
    env = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
           "peak_tb_per_s": measure_peak_bandwidth("cuda") / 1e12,
           "floor_us": timer_floor()}
    rows = [measure(b, c) for b in pick_backends(args.backends) for c in CASES]
    text = markdown(rows, env)
    sys.stdout.write(text)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "timing_fidelity.json").write_text(json.dumps({"env": env, "rows": rows}, indent=2) + "\n")
    (out / "timing_fidelity.md").write_text(text)
    return 0 if all(r.get("within_target", True) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
