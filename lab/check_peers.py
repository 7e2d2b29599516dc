"""Checks the peer adapters on a GPU and times them roughly, in one process.

For a handful of cases (B > 1, ragged contexts, mixed trees, P 16/64/128, an
empty context, a seed-size B 64 L 2048 T 28 case) every peer adapter goes
through the harness pieces (build_inputs -> reference_attention -> prepare ->
compare) and prints pass / mismatch / skip / error with its reason, the prepare
time and a median time (CUDA-graph replay, or CUDA events when capture fails,
through treebench.harness.timing.timers, the runner's timer; fewer samples than a run). Then
it runs the `check` suite and part of the `seed` suite through
treebench.harness.run.runner in check mode, as `treebench check` would.

Usage (on the GPU host, see docs/peers.md):
    python lab/check_peers.py --out $OUT [--budget-s 240] [--seed-cases 24]
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from treebench.harness.model.cases import Case  # noqa: E402
from treebench.harness.model.compare import compare  # noqa: E402
from treebench.harness.model.paged import build_inputs  # noqa: E402
from treebench.harness.model.reference import reference_attention  # noqa: E402

log = logging.getLogger("check_peers")
PEERS = ("xformers_tree", "flashinfer_mask", "flex", "causal_baseline", "vllm_triton")
HEADS = dict(num_q_heads=32, num_kv_heads=8, head_dim=128, dtype="bfloat16")

CASES = {  # label -> case; every case bf16, Hq 32, Hkv 8, D 128 unless stated
    "ragged-mixed-P16": Case(batch_size=5, context_len="ragged:1-300", tree="full:3:2",
                             tree_per_request="mixed", page_size=16, **HEADS),
    "ragged-same-P64": Case(batch_size=6, context_len="ragged:0-300", tree="full:2:3", page_size=64, **HEADS),
    "empty-context-P64": Case(batch_size=2, context_len=0, tree="full:3:1", page_size=64, **HEADS),
    "ragged-T28-P128-interleaved": Case(batch_size=3, context_len="ragged:100-400", tree="random:27:3",
                                        page_size=128, layout="interleaved", **HEADS),
    "mixed-P128-gqa-D64": Case(batch_size=4, context_len="ragged:1-200", tree="full:3:2",
                               tree_per_request="mixed", page_size=128, num_q_heads=8,
                               num_kv_heads=2, head_dim=64, dtype="bfloat16"),
    "seed-B64-L2048-T28-P16": Case(batch_size=64, context_len=2048, tree="random:27:7", page_size=16, **HEADS),
    "seed-B64-L2048-T28-P128": Case(batch_size=64, context_len=2048, tree="random:27:7", page_size=128, **HEADS),
}


def versions() -> dict:
    """Versions of the packages the adapters use, 'missing' when absent."""
    out = {"torch": torch.__version__, "cuda": torch.version.cuda,
           "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None}
    for mod in ("triton", "xformers", "flashinfer", "flash_attn", "vllm"):
        try:
            out[mod] = getattr(importlib.import_module(mod), "__version__", "?")
        except Exception as e:  # noqa: BLE001 -- any import failure is worth printing
            out[mod] = f"missing ({type(e).__name__}: {str(e).splitlines()[0][:80] if str(e) else ''})"
    try:
        import inspect

        from torch.nn.attention.varlen import varlen_attn
        out["varlen_attn"] = str(inspect.signature(varlen_attn))
    except ImportError as e:
        out["varlen_attn"] = f"missing ({e})"
    return out


def rough_time(fn, device) -> dict:
    """treebench.harness.timing.timers.time_callable's median (the runner's timer: a CUDA-graph
    replay on a GPU, falling back to CUDA events when capture fails)."""
    from treebench.harness.timing.timers import time_callable
    t = time_callable(fn, device=device, rep_ms=40.0)
    samples = sorted(t.samples_us)
    return {"median_us": samples[len(samples) // 2], "timer": t.timer, "timer_fallback": t.fallback_reason}


def check_case(label: str, case: Case, adapters: dict) -> list[dict]:
    """Rows for every adapter on one case."""
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    inputs = build_inputs(case, dev)
    refs = {"tree": (inputs, reference_attention(inputs))}
    causal = inputs.causal()
    refs["causal"] = (causal, reference_attention(causal))
    rows = []
    for name, backend in adapters.items():
        row = {"case": label, "backend": name, "case_id": case.case_id}
        row.update(run_adapter(backend, case, *refs[backend.mask_kind]))
        rows.append(row)
        log.info("%-28s %-16s %-8s %s", label, name, row["status"], row.get("reason") or
                 f"err {row['max_abs_err']:.2e}  prepare {row['prepare_s']:.1f}s  "
                 f"{row['median_us']:.1f} us ({row['timer']}{', ' + row['timer_fallback'] if row['timer_fallback'] else ''})")
    return rows


def run_adapter(backend, case: Case, inputs, ref) -> dict:
    """status/reason/error/times of one adapter on one case; never raises."""
    reason = backend.availability() or backend.supports(case)
    if reason:
        return {"status": "skipped", "reason": reason}
    try:
        t0 = time.perf_counter()
        fn = backend.prepare(inputs)
        out = fn()
        out = out[0] if getattr(backend, "returns_lse", False) else out    # (out, lse): the output here
        torch.cuda.synchronize() if torch.cuda.is_available() else None
        prep = time.perf_counter() - t0
        rec = compare(out, ref, inputs.qo_indptr, case.dtype)
        row = {"status": "pass" if rec.passed else "mismatch", "prepare_s": prep, **rec.as_row()}
        row["reason"] = None if rec.passed else f"worst {rec.worst}, nonfinite {rec.nonfinite}"
        row.update(rough_time(fn, inputs.device))
        return row
    except Exception as e:  # noqa: BLE001 -- an adapter's failure is a row
        log.debug("adapter raised", exc_info=True)
        return {"status": "error", "reason": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}


def suite_rows(suite: str, adapters: dict, limit: int | None, deadline: float) -> list[dict]:
    """The runner in check mode on a suite (`limit` cases spread evenly over it), until the deadline."""
    from treebench.harness.run.config import RunConfig
    from treebench.harness.run.runner import run_cases
    from treebench.harness.model.suites import load_suite

    cases = load_suite(suite).cases
    if limit and limit < len(cases):
        cases = cases[::-(-len(cases) // limit)]
    rows = []
    for case in cases:
        if time.perf_counter() > deadline:
            log.warning("suite %s: budget spent after %d of %d cases", suite, len(rows) // len(adapters), len(cases))
            break
        rows += run_cases([case], list(adapters.values()), RunConfig(mode="check", quiet=True))
    for r in rows:
        if r["status"] != "pass":
            log.info("%s %-16s %-8s %s %s", suite, r["backend"], r["status"], r["case_id"], r["reason"])
    return rows


def summary(rows: list[dict]) -> str:
    """status counts per (suite/case group, backend)."""
    import collections
    c = collections.Counter((r.get("group", "cases"), r["backend"], r["status"]) for r in rows)
    return "\n".join(f"{g:8s} {b:16s} {s:9s} {n}" for (g, b, s), n in sorted(c.items()))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    ap.add_argument("--out", default="results/local/peers", help="folder for check_peers.records.ndjson and the log")
    ap.add_argument("--budget-s", type=float, default=240.0, help="stop starting suite cases after this")
    ap.add_argument("--seed-cases", type=int, default=24, help="seed-suite cases to check (0: none)")
    ap.add_argument("--only", default="", help="comma-separated case labels (default: all)")
    ap.add_argument("--skip-check-suite", action="store_true", help="do not run the check suite")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S",
                        handlers=[logging.StreamHandler(), logging.FileHandler(out / "check_peers.log")])
    deadline = time.perf_counter() + args.budget_s
    log.info("versions %s", json.dumps(versions()))
    for n in PEERS:
        importlib.import_module(f"backends.{n}")   # registers it (backends/__init__ may not yet)
    from treebench.harness.adapter.contract import REGISTRY
    adapters = {n: REGISTRY[n]() for n in PEERS}
    for n, b in adapters.items():
        log.info("list %-16s %s", n, b.availability() or "available")
    labels = [s for s in args.only.split(",") if s] or list(CASES)
    rows = [r for lb in labels for r in check_case(lb, CASES[lb], adapters)]
    if not args.skip_check_suite:
        rows += [{**r, "group": "check"} for r in suite_rows("check", adapters, None, deadline + 1e9)]
    if args.seed_cases:
        for r in suite_rows("seed", adapters, args.seed_cases, deadline):
            rows.append({**r, "group": "seed"})
    with open(out / "check_peers.records.ndjson", "w") as f:
        for r in rows:
            f.write(json.dumps({k: v for k, v in r.items() if k != "samples_us"}, default=str) + "\n")
    log.info("summary\n%s", summary(rows))
    return 1 if any(r["status"] in ("mismatch", "error") for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
