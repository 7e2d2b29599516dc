"""Writes the synthetic stored results the gate and report tests read.

    python3 tests/data/make_results.py      # from the repository root; rewrites tests/data/results/

Three runs of the seed suite (B in {1, 16, 64} x L in {16, 1024, 2048} x
full:3:0..3, Hq 32, Hkv 8, D 128, bf16, P 16) on a pretend H200, each a folder
with one JSONL file and its env fingerprint:

- ``h200-baseline``: the reference run.
- ``h200-rerun``: the same code and env run again (new per-run drift and sample noise).
- ``h200-slow10``: a later commit where ``triton_tree`` is planted 10% slower on every case.

Latencies come from a small model (launch floor + bytes / effective bandwidth
+ a per-node mask cost) over the real byte model of `treebench.harness.model.workload`; samples
are log-normal around each median with a few slow outliers, as real GPU
samples look. Every run has the same correctness facts: `flashinfer_mask`
mismatches on one case and `xformers_tree` skips trees over 32 nodes.
Deterministic: numpy's generator with fixed seeds.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np

from treebench.harness.model.cases import Case, expand_axes
from treebench.harness.model.workload import attended_pairs, attention_bytes, attention_flops, rates
from treebench.harness.timing.stats import summarize
from treebench.harness.store.env import env_id_of

OUT = Path(__file__).resolve().parent / "results"
N_SAMPLES = 120          # samples per row (real runs keep up to 1000)
PEAK_BW = 4.31e12        # measured copy bandwidth of the pretend H200, bytes/s
AXES = {"batch_size": [1, 16, 64], "context_len": [16, 1024, 2048],
        "tree": ["full:3:0", "full:3:1", "full:3:2", "full:3:3"]}

# backend -> (launch floor us, fraction of PEAK_BW reached, us per 1000 tree-mask pairs, timer, fallback)
MODEL = {
    "causal_baseline": (6.5, 0.82, 0.00, "cuda_graph", None),
    "triton_tree": (7.5, 0.74, 0.35, "cuda_graph", None),
    "flashinfer_mask": (9.0, 0.79, 0.55, "cuda_graph", None),
    "xformers_tree": (11.0, 0.61, 0.90, "cuda_event",
                      "CUDA graph capture failed: RuntimeError: CUDA error: operation not permitted "
                      "when stream is capturing"),
}
MISMATCH = ("flashinfer_mask", 64, 16, "full:3:3")   # (backend, B, L, tree) that mismatches


def env(commit: str, peak_bw: float) -> dict:
    """A pretend H200 env fingerprint."""
    e = {"gpu_name": "NVIDIA H200", "sm_count": 132, "driver": "570.124.06", "cuda": "12.8",
         "python": "3.12.3", "torch": "2.9.0+cu128", "triton": "3.5.0", "xformers": "0.0.35",
         "flashinfer": "0.6.18.post1", "git_commit": commit, "hostname": "gpu-runner-07",
         "platform": "Linux-6.8.0-x86_64-with-glibc2.39", "peak_bw_bytes_per_s": peak_bw}
    return {"env_id": env_id_of(e), **e}


def true_median_us(backend: str, case: Case, nbytes: int, mask_pairs: int) -> float:
    """The model's latency of one case: floor + bytes / bandwidth + mask cost."""
    floor, eff, mask_cost, _, _ = MODEL[backend]
    return floor + nbytes / (eff * PEAK_BW) * 1e6 + mask_cost * mask_pairs / 1000


def samples(rng: np.random.Generator, median: float) -> list[float]:
    """N_SAMPLES log-normal samples (CV ~1.5%) with ~3% slow outliers (+5..40%)."""
    s = median * rng.lognormal(0.0, 0.015, N_SAMPLES)
    slow = rng.random(N_SAMPLES) < 0.03
    s[slow] *= 1 + rng.uniform(0.05, 0.40, slow.sum())
    return [round(float(x), 3) for x in s]


def correctness(backend: str, case: Case, rng: np.random.Generator) -> dict:
    """The correctness fields: a pass, the planted mismatch, or the xformers skip."""
    if backend == "xformers_tree" and case.trees()[0].size > 32:
        return {"status": "skipped", "reason": "tree of 40 nodes exceeds the backend's maximum 32"}
    if (backend, case.batch_size, case.context_len, case.tree) == MISMATCH:
        return {"status": "mismatch", "reason": "max_abs_err 0.412 at (request 37, node 12, head 5); "
                "1.2% of elements out of tolerance", "max_abs_err": 0.412, "max_rel_err": 3.87,
                "mismatch_frac": 0.0123, "worst": [37, 12, 5], "nonfinite": 0}
    err = float(rng.uniform(2e-3, 7.8e-3))
    return {"status": "pass", "reason": None, "max_abs_err": err, "max_rel_err": err * 1.9,
            "mismatch_frac": 0.0, "worst": [int(rng.integers(case.batch_size)), 0, int(rng.integers(32))],
            "nonfinite": 0}


def row(backend: str, case: Case, e: dict, run: str, rng: np.random.Generator, slow: float) -> dict:
    """One schema-1 result row."""
    ls, trees = case.context_lens(), case.trees()
    ts = [t.size for t in trees]
    depths = [range(t.size) if backend == "causal_baseline" else t.depths for t in trees]  # causal: chains
    flops = attention_flops(attended_pairs(ls, depths), 32, 128)
    nbytes = attention_bytes(ls, ts, 32, 8, 128, 16, 2)
    base = {"schema": 1, "run_id": run, "env": e["env_id"], "timestamp": f"{run[:10]}T12:00:00Z",
            "backend": backend, "case": case.axes, "case_id": case.case_id, "context_lens": ls, "tree_sizes": ts,
            "max_abs_err": None, "max_rel_err": None, "mismatch_frac": None, "worst": None, "nonfinite": None,
            "atol": 1.6e-2, "rtol": 1.6e-2, **correctness(backend, case, rng)}
    if base["status"] == "skipped":
        return base
    pairs = sum(t.size * (t.depth + 1) for t in trees)          # rough mask work (ancestor scan)
    median = true_median_us(backend, case, nbytes, pairs) * slow * rng.lognormal(0, 0.008)  # run drift
    s = samples(rng, median)
    st = summarize(s)
    base.update(timer=MODEL[backend][3], timer_fallback=MODEL[backend][4], median_us=st.median_us,
                p25_us=st.p25_us, p75_us=st.p75_us, cv=st.cv, n_samples=st.n, samples_us=s,
                flops=flops, bytes=nbytes, **rates(flops, nbytes, st.median_us, e["peak_bw_bytes_per_s"]))
    return base


def write_run(name: str, commit: str, seed: int, slow_backend: str | None = None, factor: float = 1.0) -> None:
    """Writes results/<name>/seed.jsonl and its env file."""
    rng = np.random.default_rng(seed)
    e = env(commit, PEAK_BW * rng.uniform(0.995, 1.005))
    folder = OUT / name
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    run_id = f"2025-06-{10 + seed:02d}-seed-{commit[:7]}"
    lines = [json.dumps(row(b, c, e, run_id, rng, factor if b == slow_backend else 1.0))
             for c in expand_axes(AXES) for b in MODEL]
    (folder / "seed.jsonl").write_text("\n".join(lines) + "\n")
    (folder / f"env-{e['env_id']}.json").write_text(json.dumps(e, indent=2, sort_keys=True) + "\n")


def main() -> None:
    write_run("h200-baseline", "3f1c2a9d8e7b6a5c4d3e2f1a0b9c8d7e6f5a4b3c", seed=1)
    write_run("h200-rerun", "3f1c2a9d8e7b6a5c4d3e2f1a0b9c8d7e6f5a4b3c", seed=2)
    write_run("h200-slow10", "9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f1a0b", seed=3,
              slow_backend="triton_tree", factor=1.10)


if __name__ == "__main__":
    main()
