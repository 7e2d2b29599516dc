"""How close a cell's time is to what any kernel pays for it under the default timer, on a GPU.

A flushed call (the harness's default timer: CUDA graph, the L2 flushed by a 256 MiB write) costs
a kernel its launch, the flush's dirty lines that its reads evict, and its bytes. Here each case is
timed by that timer, beside three calls that do no attention:

- `empty`: one launch of a Triton kernel of one program that stores one value (the fixed cost
  of a flushed call);
- `empty x2`: two such launches in one call (the fixed cost of a forward kernel followed by a
  split-KV merge kernel);
- `read`: one launch of a Triton kernel that reads the case's K/V pages' bytes (the pages the
  batch uses, rounded up to whole pages, read from each pool as one contiguous span) and sums
  them, the fastest of a few grid and block sizes: a floor for any kernel that must read them
  once, under the same timer.

For each backend the table gives its median, and its median minus `read` (what the attention
costs beyond reading its bytes once). Prints a Markdown table and writes floor_probe.json under
--out.

    python3 lab/floor_probe.py --backends triton_tree,flashinfer_xqa --out $OUT
"""

from __future__ import annotations

import json
import logging
import math
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from treebench.harness.model.cases import Case
from treebench.harness.model.paged import build_inputs
from treebench.harness.timing import timers
from treebench.harness.timing.bandwidth import measure_peak_bandwidth
from treebench.harness.timing.stats import summarize

from flush_probe import start   # lab/ is this script's folder, first on sys.path

log = logging.getLogger("floor_probe")
CASES = (  # the seed cells of the targets: B 1 at L 2048 (latency), the B 16 decode tie, B 64 trees (roofline)
    Case(batch_size=1, context_len=2048, tree="vllm:pr_27", page_size=128),
    Case(batch_size=1, context_len=2048, tree="vllm:pr_27", page_size=16),
    Case(batch_size=16, context_len=1024, tree="full:3:0", page_size=128),
    Case(batch_size=16, context_len=2048, tree="full:3:1", page_size=16),
    Case(batch_size=64, context_len=2048, tree="full:3:3", page_size=128),
    Case(batch_size=64, context_len=2048, tree="medusa:mc_sim_7b_63", page_size=128),
)
READ_SHAPES = ((1024, 4), (2048, 4), (4096, 2), (2048, 8))   # (floats per program step, programs per SM)


@triton.jit
def _empty_kernel(OUT):
    tl.store(OUT, 1.0)


@triton.jit
def _read_kernel(X, Y, OUT, n, BLOCK: tl.constexpr, STEPS: tl.constexpr):
    """Program p sums X[j] + Y[j] for j = (s * grid + p) * BLOCK + i, s < STEPS, i < BLOCK (masked to
    n), into OUT[p]: the K and V spans in one launch."""
    pid = tl.program_id(0)
    grid = tl.num_programs(0)
    acc = tl.zeros((BLOCK,), tl.float32)
    for s in range(STEPS):
        offs = (s * grid + pid).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        acc += tl.load(X + offs, mask=offs < n, other=0.0) + tl.load(Y + offs, mask=offs < n, other=0.0)
    tl.store(OUT + pid, tl.sum(acc, 0))


def page_bytes(case: Case) -> int:
    """The bytes of the K and V pages the batch uses: per request ceil((S_b + T_b) / P) pages of
    P x Hkv x D elements, twice (K and V)."""
    size = torch.empty((), dtype=getattr(torch, case.dtype)).element_size()
    pages = sum(math.ceil((l + t.size) / case.page_size) for l, t in zip(case.context_lens(), case.trees()))
    return 2 * pages * case.page_size * case.num_kv_heads * case.head_dim * size


def reader(k_pool: torch.Tensor, v_pool: torch.Tensor, nbytes: int, block: int, per_sm: int, num_sms: int):
    """One launch that reads the first `nbytes` (bytes) of each pool, K and V pools of shape (N, P, Hkv, D)
    in any dtype of an even element count, read as float32 words, with `per_sm` programs per SM of
    `block` words a step from each (fewer programs where the span is small); returns (call, out, grid,
    steps): out is a (grid,) float32 tensor on the pools' device, and after the call out[p] holds
    program p's sum. Raises nothing itself (a pool that cannot be viewed as float32 raises torch's
    RuntimeError)."""
    words, v_words = k_pool.view(-1).view(torch.float32), v_pool.view(-1).view(torch.float32)
    n = min(nbytes // 4, words.numel(), v_words.numel())
    grid = max(1, min(per_sm * num_sms, triton.cdiv(n, block)))
    steps = triton.cdiv(n, grid * block)
    out = torch.empty(grid, dtype=torch.float32, device=k_pool.device)

    def call() -> None:
        _read_kernel[(grid,)](words, v_words, out, n, BLOCK=block, STEPS=steps, num_warps=8)
    return call, out, grid, steps


def median_us(fn) -> float:
    """Median µs of fn by the harness's default timer (CUDA graph, L2 flushed)."""
    return summarize(timers.time_callable(fn, device="cuda", mode="cuda_graph").samples_us).median_us


def main(argv: list[str] | None = None) -> int:
    if (started := start(__doc__, "floor_probe.py", "triton_tree", argv)) is None:
        return 2
    args, backends = started
    peak = measure_peak_bandwidth("cuda")
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    sink = torch.empty(1, dtype=torch.float32, device="cuda")
    empty = {"empty": median_us(lambda: _empty_kernel[(1,)](sink)),
             "empty x2": median_us(lambda: (_empty_kernel[(1,)](sink), _empty_kernel[(1,)](sink)))}
    rows = []
    for case in CASES:
        inputs = build_inputs(case, "cuda")
        nbytes = page_bytes(case)
        reads = []
        for block, per_sm in READ_SHAPES:
            call, _, grid, steps = reader(inputs.k_cache, inputs.v_cache, nbytes // 2, block, per_sm, num_sms)
            reads.append((median_us(call), f"{block}x{grid}x{steps}"))
        read_us, read_shape = min(reads)
        row = {"case_id": case.case_id, "bytes": nbytes, "bytes_over_bw_us": nbytes / peak * 1e6,
               "read_us": read_us, "read_shape": read_shape, **empty, "backends": {}}
        for name, backend in backends:
            if backend.availability() or backend.supports(case):
                continue
            row["backends"][name] = median_us(backend.prepare(inputs))
        rows.append(row)
        log.info("%s", row)
    lines = [(f"GPU: {torch.cuda.get_device_name()}, {num_sms} SMs, measured copy bandwidth {peak / 1e12:.2f} TB/s; "
              f"medians in µs by the default timer (CUDA graph, L2 flushed); empty launch {empty['empty']:.2f}, "
              f"two empty launches {empty['empty x2']:.2f}"), "",
             "| case | K/V page bytes / bandwidth | read | backend | median | median - read |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        for name, us in r["backends"].items() or [("-", float("nan"))]:
            lines.append(f"| `{r['case_id']}` | {r['bytes_over_bw_us']:.1f} | {r['read_us']:.2f} | {name} | "
                         f"{us:.2f} | {us - r['read_us']:.2f} |")
    text = "\n".join(lines) + "\n"
    sys.stdout.write(text)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "floor_probe.json").write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "num_sms": num_sms,
                                                      "peak_bytes_per_s": peak, "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
