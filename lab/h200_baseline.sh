#!/usr/bin/env bash
# The H200 baseline in stages, each within a 10-minute budget, results under $OUT/STAGE/:
#   source .gpu/env.sh; [source .fa4b/env.sh;] STAGE=checks OUT=$OUT bash lab/h200_baseline.sh
# Stages:
#   checks    the default check of triton_tree alone (its time is a budget), then at once: the GPU
#             tests of the kernel and of the fp8 and FA4 peers, and the default check of every other
#             backend (correctness only, so they may share the GPU; FlashInfer's JIT builds use the cores)
#   seed, pages, seed_fp8, fp8_targets
#             `treebench run` of that suite over the backends, one process, the default timer
# Variables: BACKENDS (comma-separated; default every backend `treebench list` marks available, less
# EXCLUDE), EXCLUDE (default reference,triton_tree_bias: the float64 oracle and our own kernel's
# bias-mask mode are no peers), SHARD (I/N: the run's --shard; the file is named STAGE-shardI.jsonl),
# TESTS=0 (checks without the pytest runs), PYTESTS (test files: one pytest run of these instead),
# SUITE_CHECKS (BACKEND:SUITE words: `treebench check` of that suite, beside the default checks),
# BUDGET (s for the whole stage from its start, default 560: every timeout is capped at what is
# left), CHECK_TIMEOUT (s per check, default 400), RUN_TIMEOUT (s for the run, default 560),
# RESUME_FROM (a results file of an earlier call cut by its time limit: copied in, run with --resume),
# SHARDS (N: run shards 0/N ... N-1/N one after another in this call, each resuming its file under
# $OUT/STAGE/ if an earlier call left one, skipping those an earlier call finished (STAGE-shardI.done),
# stopping when under 45 s of BUDGET are left: with OUT a folder that outlives the call, such as /tmp/run
# on a warm machine, the same command repeated finishes the suite; not with SHARD or RESUME_FROM),
# CHECK_JOBS (checks at once, default 6; not MAX_JOBS, which FlashInfer's JIT reads as its ninja -j), TAR (a .tgz path: the stage's folder packed into one file at
# the end).
# Every command and its exit code go to $OUT/STAGE/exit-codes.txt (TAR packs the folder into one
# file to copy back); a stage never stops at a failing
# command. Run from the repository root.
set -uo pipefail
: "${OUT:?set OUT}" "${STAGE:?set STAGE: checks, seed, pages, seed_fp8 or fp8_targets}"
case $STAGE in checks|seed|pages|seed_fp8|fp8_targets) ;;
  *) echo "h200_baseline.sh: unknown STAGE=$STAGE (checks, seed, pages, seed_fp8, fp8_targets)" >&2; exit 2 ;; esac
if [ -n "${SHARDS:-}" ] && { [ -n "${SHARD:-}${RESUME_FROM:-}" ] || ! [[ $SHARDS =~ ^[1-9][0-9]*$ ]] || [ "$STAGE" = checks ]; }; then
  echo "h200_baseline.sh: SHARDS=$SHARDS: give a count of at least 1 for a run stage, and neither SHARD nor RESUME_FROM" >&2; exit 2
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
T_START=$(date +%s)
left() { echo $(( ${BUDGET:-560} - ($(date +%s) - T_START) )); }   # seconds of the stage's budget left
cap() { local l; l=$(left); echo $(( $1 < l ? $1 : l )); }          # a timeout, at most what is left
dir=$OUT/$STAGE; mkdir -p "$dir"
tb() { python3 -m treebench "$@"; }
note() { echo "$1 -> exit $2" >> "$dir/exit-codes.txt"; }
available() {   # the backends `treebench list` marks available, less EXCLUDE, comma-separated
  local skip=",${EXCLUDE-reference,triton_tree_bias},"
  tb list 2>/dev/null | awk -F'│' -v skip="$skip" \
    'NF > 3 && $3 ~ /yes/ {gsub(/ /, "", $2); if (index(skip, "," $2 ",") == 0) {printf "%s%s", sep, $2; sep=","}}'
}
run_suite() {   # treebench run of STAGE into $dir/$name.* with the options in shard; notes and returns its exit code
  local rc
  timeout -k 10 "$(cap "${RUN_TIMEOUT:-560}")" python3 -m treebench run --suite "$STAGE" --backends "$backends" "${shard[@]}" \
    --out "$dir/$name.jsonl" --report "$dir/$name.html" > "$dir/$name.txt" 2>&1
  rc=$?; note "treebench run --suite $STAGE --backends $backends ${shard[*]}" $rc; return $rc
}
backends=${BACKENDS:-$(available)}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw --format=csv > "$dir/nvidia-smi.csv" 2>&1
tb list > "$dir/list.txt" 2>&1
echo "$(date -u +%FT%TZ) $STAGE backends=$backends" >> "$dir/exit-codes.txt"
case $STAGE in
  checks)
    t=${CHECK_TIMEOUT:-400}
    if [[ ",$backends," == *,triton_tree,* ]]; then
      s=$(date +%s)
      timeout -k 10 "$(cap "$t")" python3 -m treebench check --backend triton_tree --out "$dir/default-check-triton_tree.jsonl" \
        > "$dir/check-triton_tree.txt" 2>&1; rc=$?
      note "treebench check --backend triton_tree (alone, $(( $(date +%s) - s )) s with start-up)" $rc
    fi
    # The jobs, longest first (FlashInfer's JIT builds: its adapters' checks), at most CHECK_JOBS at once
    # (16 builds side by side starved each other past the limit); none starts with under 60 s of
    # the stage's BUDGET left, and each gets at most what is left.
    jobs_list=()
    if [ -n "${PYTESTS:-}" ]; then jobs_list+=("pytest-gpu|python3 -m pytest -q $PYTESTS")
    elif [ "${TESTS:-1}" = 1 ]; then
      jobs_list+=("pytest-kernel-gpu|python3 -m pytest -q -m gpu tests/test_kernel_pages.py tests/test_kernel_fp8.py tests/test_triton_tree.py"
                  "pytest-peers-gpu|python3 -m pytest -q tests/test_fp8_gpu.py tests/test_fa4_gpu.py")
    fi
    for b in $(echo "$backends" | tr , ' '); do
      [ "$b" = triton_tree ] || jobs_list+=("check-$b|python3 -m treebench check --backend $b --out $dir/default-check-$b.jsonl")
    done
    for bs in ${SUITE_CHECKS:-}; do   # BACKEND:SUITE, e.g. sglang_triton:seed
      b=${bs%%:*} su=${bs#*:}; f=check-$b-$(basename "${su%.toml}")
      jobs_list+=("$f|python3 -m treebench check --backend $b --suite $su --out $dir/$f.jsonl")
    done
    ordered=(); for j in "${jobs_list[@]}"; do [[ $j == *flashinfer* ]] && ordered+=("$j"); done
    for j in "${jobs_list[@]}"; do [[ $j == *flashinfer* ]] || ordered+=("$j"); done
    for j in "${ordered[@]}"; do
      while (( $(jobs -rp | wc -l) >= ${CHECK_JOBS:-6} )); do wait -n; done
      f=${j%%|*} cmd=${j#*|}
      if (( $(left) < 60 )); then note "$cmd (not started: under 60 s of BUDGET left)" -; continue; fi
      ( s=$(date +%s); timeout -k 10 "$(cap "$t")" $cmd > "$dir/$f.txt" 2>&1; rc=$?
        note "$cmd (beside the others, $(( $(date +%s) - s )) s)" $rc ) &
    done
    wait ;;
  seed|pages|seed_fp8|fp8_targets)
    if [ -n "${SHARDS:-}" ]; then
      for (( i = 0; i < SHARDS; i++ )); do
        name=$STAGE-shard$i
        [ -f "$dir/$name.done" ] && continue
        if (( $(left) < 45 )); then note "shards $i-$(( SHARDS - 1 )) of $SHARDS (not started: under 45 s of BUDGET left)" -; break; fi
        shard=(--shard "$i/$SHARDS")
        if [ -f "$dir/$name.jsonl" ]; then
          shard+=(--resume); [ -f "$dir/$name.txt" ] && mv "$dir/$name.txt" "$dir/$name.txt.$(date +%s)"
        fi
        if run_suite; then touch "$dir/$name.done"; else break; fi
      done
    else
    name=$STAGE; shard=()
    if [ -n "${SHARD:-}" ]; then shard=(--shard "$SHARD"); name=$STAGE-shard${SHARD%%/*}; fi
    if [ -n "${RESUME_FROM:-}" ]; then cp "$RESUME_FROM" "$dir/$name.jsonl"; shard+=(--resume); fi
    run_suite
    fi ;;
esac
if [ -n "${TAR:-}" ]; then tar czf "$TAR" -C "$OUT" "$STAGE"; fi   # the stage's folder as one file
