#!/usr/bin/env bash
# The H200 baseline in stages, each sized for one device call (<= 10 min), results under $OUT/STAGE/:
#   source .gpu/env.sh; [source .fa4b/env.sh;] STAGE=checks OUT=$OUT bash lab/h200_baseline.sh
# Stages: checks (GPU tests, then the default check of every backend available here, one line of
# exit codes each), seed, pages, seed_fp8 (treebench run of that suite over every available backend,
# with its HTML report). Every command and its exit code go to $OUT/STAGE/exit-codes.txt; a stage
# never stops at a failing command. Run from the repository root.
set -uo pipefail
: "${OUT:?set OUT}" "${STAGE:?set STAGE: checks, seed, pages or seed_fp8}"
case $STAGE in checks|seed|pages|seed_fp8) ;; *) echo "h200_baseline.sh: unknown STAGE=$STAGE (checks, seed, pages, seed_fp8)" >&2; exit 2 ;; esac
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
dir=$OUT/$STAGE; mkdir -p "$dir"
tb() { python3 -m treebench "$@"; }
note() { echo "$1 -> exit $2" >> "$dir/exit-codes.txt"; }
available() {   # the backends `treebench list` marks available, comma-separated
  tb list 2>/dev/null | awk -F'│' 'NF > 3 && $3 ~ /yes/ {gsub(/ /, "", $2); printf "%s%s", sep, $2; sep=","}'
}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw --format=csv > "$dir/nvidia-smi.csv" 2>&1
tb list > "$dir/list.txt" 2>&1
case $STAGE in
  checks)
    timeout 240 python3 -m pytest -q -m gpu tests/test_kernel_pages.py tests/test_kernel_fp8.py tests/test_triton_tree.py \
      > "$dir/pytest-kernel-gpu.txt" 2>&1; note "pytest -m gpu (kernel)" $?
    timeout 120 python3 -m pytest -q tests/test_fp8_gpu.py tests/test_fa4_gpu.py > "$dir/pytest-peers-gpu.txt" 2>&1
    note "pytest (fp8 and FA4 peers)" $?
    for b in $(available | tr , ' '); do
      timeout 90 python3 -m treebench check --backend "$b" --out "$dir/default-check.jsonl" > "$dir/check-$b.txt" 2>&1
      note "treebench check --backend $b" $?
    done ;;
  seed|pages|seed_fp8)
    backends=$(available)
    timeout 560 python3 -m treebench run --suite "$STAGE" --backends "$backends" --out "$dir/$STAGE.jsonl" \
      --report "$dir/$STAGE.html" > "$dir/$STAGE.txt" 2>&1
    note "treebench run --suite $STAGE --backends $backends" $? ;;
esac
