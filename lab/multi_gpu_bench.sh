#!/usr/bin/env bash
# Scaling measurement: the seed suite on 1 GPU, then on 2 GPUs through torchrun
# (`treebench run --gpus 2`), with both wall times, and a check that the two
# runs give identical correctness results: the same (case_id, backend) pairs
# with the same status and max_abs_err (per-case seeds make the inputs
# independent of the number of ranks).
#
# Usage (on a machine with >= 2 GPUs, from anywhere):
#   OUT=results/local/scaling BACKENDS=triton_tree,torch_sdpa lab/multi_gpu_bench.sh
# Environment:
#   OUT       folder for the rows, env files, reports and summary (default results/local/multi-gpu, git-ignored)
#   BACKENDS  --backends value (default triton_tree,torch_sdpa)
#   SUITE     suite name or file (default seed)
# Writes to $OUT: 1gpu.jsonl, 2gpu.jsonl, env-*.json, 1gpu.html, 2gpu.html,
# summary.json and summary.md. Exit 0 when the correctness results are
# identical, 1 when they differ, 2 on bad input or a failed launch.
set -euo pipefail
cd "$(dirname "$0")/.."

OUT=${OUT:-results/local/multi-gpu}
BACKENDS=${BACKENDS:-triton_tree,torch_sdpa}
SUITE=${SUITE:-seed}
mkdir -p "$OUT"
for f in 1gpu.jsonl 2gpu.jsonl; do
  if [ -s "$OUT/$f" ]; then
    echo "multi_gpu_bench: $OUT/$f exists; give a fresh OUT folder" >&2
    exit 2
  fi
done

gpus=$(python3 -c 'import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)')
if [ "$gpus" -lt 2 ]; then
  echo "multi_gpu_bench: needs 2 GPUs, torch sees $gpus" >&2
  exit 2
fi

# run LABEL ARGS...: one `treebench run`; prints its wall seconds; exit codes 0/1 are results, others abort
run() {
  local label=$1; shift
  local t0 t1 rc=0
  t0=$(date +%s.%N)
  python3 -m treebench run --suite "$SUITE" --backends "$BACKENDS" --out "$OUT/$label.jsonl" \
    --report "$OUT/$label.html" --quiet "$@" >"$OUT/$label.log" 2>&1 || rc=$?
  t1=$(date +%s.%N)
  if [ "$rc" -gt 1 ]; then
    echo "multi_gpu_bench: the $label run failed (exit $rc); see $OUT/$label.log" >&2
    tail -n 20 "$OUT/$label.log" >&2
    exit 2
  fi
  python3 -c "print(f'{$t1 - $t0:.1f}')"
}

wall1=$(run 1gpu)
echo "1 GPU: ${wall1} s"
wall2=$(run 2gpu --gpus 2)
echo "2 GPUs: ${wall2} s"

WALL1=$wall1 WALL2=$wall2 OUT=$OUT SUITE=$SUITE BACKENDS=$BACKENDS python3 - <<'PY'
"""Compares the two runs' correctness results and writes summary.json and summary.md."""
import json
import os
import sys
from pathlib import Path

from treebench.harness.store.rows import read_envs, read_rows

out = Path(os.environ["OUT"])
wall1, wall2 = float(os.environ["WALL1"]), float(os.environ["WALL2"])


def results(path):
    """(case_id, backend) -> (status, max_abs_err); a duplicated pair is itself a difference."""
    rows = read_rows([path])
    got = {(r["case_id"], r["backend"]): (r["status"], r["max_abs_err"]) for r in rows}
    return got, len(rows) - len(got)


one, dup1 = results(out / "1gpu.jsonl")
two, dup2 = results(out / "2gpu.jsonl")
diffs = [{"case_id": k[0], "backend": k[1], "1gpu": one.get(k), "2gpu": two.get(k)}
         for k in sorted(set(one) | set(two)) if one.get(k) != two.get(k)]
identical = not diffs and dup1 == dup2 == 0
envs = read_envs([out])
gpus = sorted({e.get("gpu_name") or "cpu" for e in envs.values()})
statuses = {s: sum(v[0] == s for v in one.values()) for s in ("pass", "mismatch", "error", "skipped")}
summary = {
    "suite": os.environ["SUITE"], "backends": os.environ["BACKENDS"].split(","), "gpus": gpus,
    "pairs": len(one), "statuses_1gpu": statuses,
    "wall_s_1gpu": wall1, "wall_s_2gpu": wall2, "speedup": wall1 / wall2 if wall2 > 0 else None,
    "identical_correctness": identical, "duplicates": [dup1, dup2], "differences": diffs[:50],
    "n_differences": len(diffs),
}
(out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
md = [
    f"# {summary['suite']} suite on 1 vs 2 GPUs ({', '.join(gpus)})", "",
    f"Backends: {', '.join(summary['backends'])}; {len(one)} case x backend pairs "
    f"({', '.join(f'{v} {k}' for k, v in statuses.items())}).", "",
    "| GPUs | wall time (s) |", "| --- | --- |", f"| 1 | {wall1:.1f} |", f"| 2 | {wall2:.1f} |", "",
    f"Speedup: {summary['speedup']:.2f}x. Correctness results (status, max_abs_err per (case_id, backend)) "
    f"{'identical' if identical else f'DIFFER in {len(diffs)} pairs'}.",
]
md += [f"- {d['case_id']} / {d['backend']}: 1 GPU {d['1gpu']}, 2 GPUs {d['2gpu']}" for d in diffs[:20]]
(out / "summary.md").write_text("\n".join(md) + "\n")
print("\n".join(md))
sys.exit(0 if identical else 1)
PY
