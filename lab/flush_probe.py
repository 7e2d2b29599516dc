"""What the L2 flush leaves behind: the default timer's median under four flushes, on a GPU.

The harness flushes the L2 by writing a 256 MiB buffer (`torch.Tensor.zero_`, as
`triton.testing.do_bench` does). That leaves the L2 full of dirty lines of that buffer, which
the timed call's own reads evict: their write-back to HBM shares the timed region's bandwidth.
Here each case and backend is timed by the harness's CUDA-graph timer with the flush swapped:

- `write`: the harness's flush (the default timer as it is);
- `write+read`: that write, then a read of a second 256 MiB buffer (`torch.sum`), so the L2 holds
  clean lines of the second buffer and none of the first's dirty ones when the call starts;
- `read`: the read alone (clean lines: the L2 a call sees after kernels that only read,
  such as a GEMM streaming its weights);
- `warm`: no flush (back to back, inputs resident where they fit).

Each row also gives the K/V bytes over the measured copy bandwidth (the bandwidth floor).
Prints a Markdown table and writes flush_probe.json under --out.

    python3 lab/flush_probe.py --backends triton_tree,flashinfer_xqa,vllm_triton --out $OUT
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from functools import cache
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from treebench.harness.model.cases import Case
from treebench.harness.model.paged import build_inputs
from treebench.harness.run.loading import load_backend
from treebench.harness.timing import timers
from treebench.harness.timing.bandwidth import measure_peak_bandwidth
from treebench.harness.timing.stats import summarize

log = logging.getLogger("flush_probe")
CASES = (  # seed cells: bandwidth-bound decode, latency-bound B 1, the compute-bound B 64 tree
    Case(batch_size=16, context_len=1024, tree="full:3:0", page_size=128),
    Case(batch_size=16, context_len=2048, tree="full:3:1", page_size=16),
    Case(batch_size=1, context_len=2048, tree="vllm:pr_27", page_size=128),
    Case(batch_size=64, context_len=2048, tree="full:3:3", page_size=128),
)
FLUSHES = ("write", "write+read", "read", "warm")


@cache
def _read_buffers(index: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A second 256 MiB buffer (float32 ones) on CUDA device `index` and the scalar its sum goes to,
    allocated once, as the harness's own flush buffer (`timers._flush_buffer`)."""
    dev = torch.device("cuda", index)
    return (torch.ones(timers.FLUSH_BYTES // 4, dtype=torch.float32, device=dev),
            torch.empty((), dtype=torch.float32, device=dev))


def flusher(kind: str):
    """The flush callable of `kind` (one of FLUSHES but warm); its buffers are allocated once per device."""
    dev = torch.cuda.current_device()
    written = timers._flush_buffer(dev)
    read, total = _read_buffers(dev)

    def read_all() -> None:
        torch.sum(read, dim=0, out=total)

    def write_read() -> None:
        written.zero_()
        read_all()
    return {"write": written.zero_, "write+read": write_read, "read": read_all}[kind]


def time_with(fn, kind: str) -> float:
    """Median µs of fn by the harness's CUDA-graph timer, the flush replaced by `kind`'s."""
    if kind == "warm":
        return summarize(timers.time_callable(fn, device="cuda", mode="cuda_graph", flush_l2=False).samples_us).median_us
    flush = flusher(kind)
    saved = timers._flusher
    timers._flusher = lambda budget: flush if budget.flush_l2 else (lambda: None)
    try:
        return summarize(timers.time_callable(fn, device="cuda", mode="cuda_graph").samples_us).median_us
    finally:
        timers._flusher = saved


def kv_bytes(case: Case) -> int:
    """K and V bytes the call must read: 2 x B x L x Hkv x D x element size (the context only)."""
    size = torch.empty((), dtype=getattr(torch, case.dtype)).element_size()
    return 2 * case.batch_size * case.context_len * case.num_kv_heads * case.head_dim * size


def start(doc: str, prog: str, default_backends: str, argv: list[str] | None):
    """A probe's start: its --backends and --out parsed (usage errors exit 2), logging on, and the named
    backends loaded; (args, [(name, backend)]), or None after one line on stderr (no CUDA GPU, or a
    backend that does not load: the caller exits 2)."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0], allow_abbrev=False)
    p.add_argument("--backends", default=default_backends, help="comma-separated")
    p.add_argument("--out", default=os.environ.get("OUT", "."), help=f"folder for {prog[:-3]}.json (default $OUT)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if not torch.cuda.is_available():
        print(f"{prog}: no CUDA GPU: it times on one", file=sys.stderr)
        return None
    backends = []
    for name in args.backends.split(","):
        try:
            backends.append((name, load_backend(name)))
        except Exception as e:  # noqa: BLE001 -- an unknown or broken backend: one line
            print(f"{prog}: --backends {name!r}: {str(e).splitlines()[0] if str(e) else type(e).__name__}",
                  file=sys.stderr)
            return None
    return args, backends


def main(argv: list[str] | None = None) -> int:
    if (started := start(__doc__, "flush_probe.py", "triton_tree,flashinfer_xqa,vllm_triton", argv)) is None:
        return 2
    args, backends = started
    peak = measure_peak_bandwidth("cuda")
    rows = []
    for name, backend in backends:
        if backend.availability():
            log.warning("%s: %s", name, backend.availability())
            continue
        for case in CASES:
            if backend.supports(case):
                continue
            fn = backend.prepare(build_inputs(case, "cuda"))
            rows.append({"backend": name, "case_id": case.case_id, "floor_us": kv_bytes(case) / peak * 1e6,
                         **{k: time_with(fn, k) for k in FLUSHES}})
            log.info("%s", rows[-1])
    lines = [(f"GPU: {torch.cuda.get_device_name()}, measured copy bandwidth {peak / 1e12:.2f} TB/s; medians in µs "
             "by the CUDA-graph timer"), "", "| backend | case | K/V bytes / bandwidth | " + " | ".join(FLUSHES)
             + " | write+read / write |", "|---|---|---|" + "---|" * (len(FLUSHES) + 1)]
    for r in rows:
        lines.append(f"| {r['backend']} | `{r['case_id']}` | {r['floor_us']:.1f} | "
                     + " | ".join(f"{r[k]:.2f}" for k in FLUSHES) + f" | {r['write+read'] / r['write']:.3f} |")
    text = "\n".join(lines) + "\n"
    sys.stdout.write(text)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "flush_probe.json").write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "peak_bytes_per_s": peak,
                                                      "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
