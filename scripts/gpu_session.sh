#!/usr/bin/env bash
# The GPU results the issues ask for, one stage per device call (each well under the
# 10-minute limit). Run from the repo root on the device machine, e.g.
#   run(kind="nvidia-h200-x2", carry=[".gpu", ".fi-cache"],
#       command="bash scripts/gpu_session.sh A")
# then B, then C. Each stage writes its files into one tarball under $OUT
# (results/h200/<stage>.tgz comes back); unpack it into the repo and commit.
#   A: treebench list, the gpu-marked tests, `treebench check` of triton_tree
#      on the check, seed and random suites, timing fidelity       (~4 min)
#   B: `treebench run --suite seed --backends all` + its HTML report (~6-8 min)
#   C: the seed suite on 1 GPU vs 2 GPUs (torchrun), triton_tree and
#      torch_sdpa, with wall times and identical-correctness check (~4 min)
#   D: split-KV sweep at small batch + kernel/timer gpu tests + check_p64 (~5 min)
#   E: the seed suite, our kernels and the peers side by side, + report (~6 min)
#   F: the flex finding's repro + flex alone on the seed suite (~3 min)
#   K: kernel development: bench_kernel.py's big phase + Nsight Compute, if present (~2 min)
#   L: bench_kernel.py's check and big phases, kernel/timer gpu tests, check_p64 (~5 min)
#   T: the speed-target cells (suites/targets.toml), our kernels and the peers, timed three
#      ways: L2 flushed (default), warm L2, and warm back-to-back (cuda_graph_loop,
#      do_bench_cudagraph's method); + the timer's gpu tests                    (~4 min)
#   W: the seed suite, our kernels and the peers, timed as do_bench_cudagraph does
#      (--l2 warm --timer cuda_graph_loop), for comparing with the reference table (~7 min)
#   V: the warp-specialised kernel (session 6): bench_kernel.py's wscheck phase, the kernel's
#      gpu tests, `treebench check` of triton_tree on the random and seed suites, the target
#      cells three ways and the seed suite back to back, our kernel and the best peers (~8 min)
#   X: the 3-warpgroup kernel's candidates (session 7, compiled for sm_90 on a CPU, not yet
#      run): bench_kernel.py's tiles phase (32-token tiles, the pipelined 3-warpgroup build;
#      checked, then timed against the table's configs on the target cells) and the
#      kernel's gpu tests (~5 min)
#   P: scripts/ab_kernel.py, this tree against BASE_DIR's kernels or a copy of its own changed by a
#      sed script (BASE_SED; default: KernelConfig.ws_pipe_for's rule made BASE_PIPE, itself by
#      default the session-7 rule, 3 warpgroups never pipelined), plus VARIANTS, on the cells that
#      take WS3 and a WS2 control, or CELLS; ROUNDS rounds; WSCHECK=1 checks this tree first (~1-5 min)
#   M: Nsight Compute on full:3:3 at B 64 (the 3-warpgroup kernel, the default plan) with the
#      bitmask, causal and the shared bias: where the bitmask's 6-9% goes (session 8) (~3 min)
#   Q: SM clock, power and throttle reasons (scripts/clock_probe.py) while full:3:3 at B 64 is timed
#      flushed, warm and back to back, triton_tree then triton_causal (~2 min)
#   (D again measures the merge kernel's rows-per-program variants: heuristic-rows2/4)
set -uo pipefail
stage=${1:-}
case $stage in A|B|C|D|E|F|K|L|M|P|Q|T|V|W|X) ;;
  *) echo "gpu_session.sh: unknown stage '$stage': use A, B, C, D, E, F, K, L, M, P, Q, T, V, W or X" >&2; exit 2 ;;
esac
if ! nvidia-smi -L > /dev/null 2>&1; then
  echo "gpu_session.sh: no NVIDIA GPU here (nvidia-smi fails): run it on the device machine" >&2; exit 2
fi
if [ ! -f .gpu/env.sh ]; then
  echo "gpu_session.sh: .gpu/env.sh is missing: run ../shared/gpu/offline-bundle.sh .gpu and carry .gpu" >&2; exit 2
fi
source .gpu/env.sh
export PYTHONPATH=.:${PYTHONPATH:-} PYTHONUNBUFFERED=1
if [ -f .fi-cache/fi-cache.tgz ]; then   # FlashInfer's prebuilt bf16 kernels: skips ~70 s of JIT
  mkdir -p /tmp/gpu-site/flashinfer/data/aot
  tar xzf .fi-cache/fi-cache.tgz --strip-components=5 -C /tmp/gpu-site/flashinfer/data/aot || true
fi
R=/tmp/h200-$stage; mkdir -p "$R"
# Every step runs under `timeout` against one deadline per call, so the tarball
# below is always written and comes back even when a step runs long.
DEADLINE=$(( $(date +%s) + ${STAGE_BUDGET_S:-540} ))
left() { local l=$(( DEADLINE - $(date +%s) - ${1:-0} )); [ "$l" -gt 5 ] && echo "$l" || echo 5; }
tb() { timeout "$(left)" python3 -m harness.cli "$@"; }
# B resumes from a carried partial run (results/h200-partial/seed.jsonl), if one is there
[ -f results/h200-partial/seed.jsonl ] && cp results/h200-partial/seed.jsonl "$R/seed.jsonl" && RESUME=--resume
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$R/nvidia-smi.csv"
case $stage in
  A)
    tb list > "$R/list.txt" 2>&1
    timeout 150 python3 -m pytest -q -m gpu tests > "$R/pytest-gpu.txt" 2>&1
    for s in check seed random; do
      tb check --suite $s --backend triton_tree --out "$R/check-triton_tree-$s.jsonl" > "$R/check-triton_tree-$s.txt" 2>&1
      echo "check $s triton_tree exit $?" >> "$R/exit-codes.txt"
    done
    for b in triton_tree_bias triton_causal xformers_tree flashinfer_mask flex causal_baseline; do
      tb check --suite check --backend $b --out "$R/check-peers.jsonl" > "$R/check-$b.txt" 2>&1
      echo "check check $b exit $?" >> "$R/exit-codes.txt"
    done
    timeout "$(left 10)" python3 scripts/timing_fidelity.py --backends triton_tree,flashinfer_mask > "$R/fidelity.md" 2>&1
    ;;
  B)
    tb run --suite seed --backends all --out "$R/seed.jsonl" --report "$R/seed.html" --quiet ${RESUME:-} > "$R/seed.txt" 2>&1
    echo "run seed exit $?" >> "$R/exit-codes.txt"
    ;;
  D)  # split-KV sweep at small B (scripts/splits_sweep.py), the gpu tests of the kernel and
      # timer, and every adapter on the check suite at P 64 (xformers skips P 16)
    timeout "$(left 200)" python3 scripts/splits_sweep.py --out "$R" --budget-s 240 > "$R/sweep.log" 2>&1
    echo "sweep exit $?" >> "$R/exit-codes.txt"
    timeout "$(left 90)" python3 -m pytest -q -m gpu tests/test_timing.py tests/test_triton_tree.py > "$R/pytest-gpu.txt" 2>&1
    echo "pytest exit $?" >> "$R/exit-codes.txt"
    for b in triton_tree xformers_tree flashinfer_mask flex causal_baseline; do
      tb check --suite check_p64 --backend $b --out "$R/check_p64.jsonl" > "$R/check_p64-$b.txt" 2>&1
      echo "check check_p64 $b exit $?" >> "$R/exit-codes.txt"
    done
    ;;
  E)  # the seed suite, our kernels and every peer side by side (no reference/torch_sdpa timing), + report
    tb run --suite seed --backends triton_tree,triton_tree_bias,triton_causal,xformers_tree,flashinfer_mask,flex,causal_baseline,vllm_triton \
      --out "$R/seed.jsonl" --report "$R/seed.html" --quiet ${RESUME:-} > "$R/seed.txt" 2>&1
    echo "run seed exit $?" >> "$R/exit-codes.txt"
    for s in check random; do
      tb check --suite $s --backend triton_tree --out "$R/check-triton_tree-$s.jsonl" > "$R/check-triton_tree-$s.txt" 2>&1
      echo "check $s triton_tree exit $?" >> "$R/exit-codes.txt"
    done
    timeout "$(left 10)" python3 scripts/timing_fidelity.py --backends triton_tree,flashinfer_mask > "$R/fidelity.md" 2>&1
    ;;
  K)  # kernel development: the big phase of scripts/bench_kernel.py (tile configs x TMA
      # descriptor loads, B 1 splits, merge rows), and Nsight Compute on the 27-node tree at B 64
    timeout "$(left 150)" python3 scripts/bench_kernel.py --phases env,${PHASES:-big} --out "$R" --budget-s 240 > "$R/big.log" 2>&1
    echo "bench big exit $?" >> "$R/exit-codes.txt"
    NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
    echo "ncu: ${NCU:-none}" > "$R/ncu.txt"
    if [ -n "$NCU" ] && [ -z "${NO_NCU:-}" ]; then   # stall reasons per instruction, at the GPU's own clocks
      M='regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio'
      for v in "64,64,4,3,0,1 a" "64,64,4,2,0,1 b"; do set -- $v
        timeout "$(left 10)" "$NCU" -k regex:tree_attn_fwd --launch-skip 3 -c 1 --clock-control none \
          --section SpeedOfLight --section WarpStateStats --section SourceCounters --section Occupancy --metrics "$M" \
          -o "$R/prof-$2" python3 scripts/profile_case.py --config "$1" --kv-desc on >> "$R/ncu.txt" 2>&1
        timeout "$(left 5)" "$NCU" --import "$R/prof-$2.ncu-rep" --print-details all > "$R/ncu-$2.txt" 2>&1
        timeout "$(left 5)" "$NCU" --import "$R/prof-$2.ncu-rep" --page source --csv --print-source sass > "$R/sass-$2.csv" 2>&1
        rm -f "$R/prof-$2.ncu-rep"
      done
    fi
    ;;
  L)  # the kernel's odd-case checks (TMA at P 128, D 64-256) and big phase with the final
      # configs, the gpu tests of the kernel and timer, and check_p64 for triton_tree
    timeout "$(left 150)" python3 scripts/bench_kernel.py --phases env,check,big --out "$R" --budget-s 260 > "$R/bench.log" 2>&1
    echo "bench check,big exit $?" >> "$R/exit-codes.txt"
    timeout "$(left 40)" python3 -m pytest -q -m gpu tests/test_timing.py tests/test_triton_tree.py > "$R/pytest-gpu.txt" 2>&1
    echo "pytest exit $?" >> "$R/exit-codes.txt"
    tb check --suite check_p64 --backend triton_tree --out "$R/check_p64.jsonl" > "$R/check_p64-triton_tree.txt" 2>&1
    echo "check check_p64 triton_tree exit $?" >> "$R/exit-codes.txt"
    ;;
  T)  # the speed-target cells timed three ways, our kernels and every peer side by side
    for t in "cold auto" "warm auto" "warm cuda_graph_loop"; do set -- $t
      tb run --suite targets --backends triton_tree,triton_causal,xformers_tree,flashinfer_mask,flex,causal_baseline \
        --l2 "$1" --timer "$2" --out "$R/targets-$1-$2.jsonl" --report "$R/targets-$1-$2.html" --quiet > "$R/targets-$1-$2.txt" 2>&1
      echo "run targets $1 $2 exit $?" >> "$R/exit-codes.txt"
    done
    timeout "$(left 5)" python3 -m pytest -q -m gpu tests/test_timing.py > "$R/pytest-gpu-timing.txt" 2>&1
    echo "pytest timing exit $?" >> "$R/exit-codes.txt"
    ;;
  W)  # the seed suite timed back to back with a warm L2 (the reference table's method)
    tb run --suite seed --backends triton_tree,triton_tree_bias,triton_causal,xformers_tree,flashinfer_mask,flex,causal_baseline \
      --l2 warm --timer cuda_graph_loop --out "$R/seed-loop.jsonl" --report "$R/seed-loop.html" --quiet ${RESUME:-} > "$R/seed-loop.txt" 2>&1
    echo "run seed warm cuda_graph_loop exit $?" >> "$R/exit-codes.txt"
    ;;
  V)  # the warp-specialised kernel: correctness, then the targets and the seed suite side by side
    timeout "$(left 400)" python3 scripts/bench_kernel.py --phases env,wscheck --budget-s 80 --out "$R/wscheck" > "$R/wscheck.log" 2>&1
    echo "bench wscheck exit $?" >> "$R/exit-codes.txt"
    timeout "$(left 330)" python3 -m pytest -q -m gpu tests/test_triton_tree.py > "$R/pytest-gpu.txt" 2>&1
    echo "pytest exit $?" >> "$R/exit-codes.txt"
    for s in random seed; do
      tb check --suite "$s" --backend triton_tree --out "$R/check-$s.jsonl" > "$R/check-$s.txt" 2>&1
      echo "check $s triton_tree exit $?" >> "$R/exit-codes.txt"
    done
    for t in "cold auto" "warm auto" "warm cuda_graph_loop"; do set -- $t
      tb run --suite targets --backends triton_tree,triton_causal,xformers_tree,flashinfer_mask \
        --l2 "$1" --timer "$2" --out "$R/targets-$1-$2.jsonl" --report "$R/targets-$1-$2.html" --quiet > "$R/targets-$1-$2.txt" 2>&1
      echo "run targets $1 $2 exit $?" >> "$R/exit-codes.txt"
    done
    tb run --suite seed --backends triton_tree,xformers_tree,flashinfer_mask --l2 warm --timer cuda_graph_loop \
      --out "$R/seed-loop.jsonl" --report "$R/seed-loop.html" --quiet > "$R/seed-loop.txt" 2>&1
    echo "run seed warm cuda_graph_loop exit $?" >> "$R/exit-codes.txt"
    ;;
  X)  # the 3-warpgroup kernel's candidates: checked and timed side by side with the table's configs
    timeout "$(left 150)" python3 scripts/bench_kernel.py --phases env,tiles --budget-s 240 --out "$R/tiles" \
      > "$R/tiles.log" 2>&1
    echo "bench tiles exit $?" >> "$R/exit-codes.txt"
    timeout "$(left 10)" python3 -m pytest -q -m gpu tests/test_triton_tree.py > "$R/pytest-gpu.txt" 2>&1
    echo "pytest exit $?" >> "$R/exit-codes.txt"
    ;;
  M)  # Nsight Compute: the warp-specialised kernel on full:3:3, B 64, L 2048, P 128, per mask mode
    NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
    echo "ncu: ${NCU:-none}" > "$R/ncu.txt"
    for m in $([ -n "$NCU" ] && echo tree causal bias); do   # none without ncu: the tarball still comes back
      timeout "$(left 10)" "$NCU" -k regex:tree_attn_ws --launch-skip 3 -c 1 --clock-control none \
        --section SpeedOfLight --section WarpStateStats --section SourceCounters --section Occupancy \
        -o "$R/prof-$m" python3 scripts/profile_case.py --tree full:3:3 --mode $m >> "$R/ncu.txt" 2>&1
      echo "ncu $m exit $?" >> "$R/exit-codes.txt"
      timeout "$(left 5)" "$NCU" --import "$R/prof-$m.ncu-rep" --print-details all > "$R/ncu-$m.txt" 2>&1
      timeout "$(left 5)" "$NCU" --import "$R/prof-$m.ncu-rep" --page source --csv --print-source sass \
        | gzip > "$R/sass-$m.csv.gz"
      rm -f "$R/prof-$m.ncu-rep"
    done
    ;;
  P)  # A/B with the harness's timer: base = BASE_DIR's kernels/*.py if given, else these kernels with
      # a sed script applied to their tree_attention_plan.py: BASE_SED, else ws_pipe_for's rule made
      # `return $BASE_PIPE` (default `self.ws < 3`, the session-7 rule: 3 warpgroups never pipelined;
      # `False`: never); VARIANTS="name=dir ..." more sides; AB_TIMER=loop times back to back (into
      # $R/loop/); WSCHECK=1 first checks this tree's
      # warp-specialised kernel (bench_kernel.py's wscheck phase)
    if [ -n "${WSCHECK:-}" ]; then
      timeout "$(left 200)" python3 scripts/bench_kernel.py --phases env,wscheck --budget-s 80 --out "$R/wscheck" \
        > "$R/wscheck.log" 2>&1
      echo "bench wscheck exit $?" >> "$R/exit-codes.txt"
    fi
    VARGS=(); for v in ${VARIANTS:-}; do VARGS+=(--variant "$v"); done
    if [ -n "${BASE_DIR:-}" ]; then
      BASE=$BASE_DIR; echo "base: $BASE_DIR" > "$R/base-patch.txt"
    else
      BASE=$R/base; mkdir -p "$BASE" && cp kernels/*.py "$BASE/"
      sed -i "${BASE_SED:-/def ws_pipe_for/,/return / s/return self.ws < 3 or .*/return ${BASE_PIPE:-self.ws < 3}/}" \
        "$BASE/tree_attention_plan.py"
      if diff kernels/tree_attention_plan.py "$BASE/tree_attention_plan.py" > "$R/base-patch.txt"; then
        echo "ab: the base patch changed nothing (BASE_SED / BASE_PIPE)" >> "$R/exit-codes.txt"; BASE=
      fi
    fi
    if [ -n "$BASE" ]; then
      timeout "$(left 5)" python3 scripts/ab_kernel.py --base "$BASE" "${VARGS[@]}" --out "$R${AB_TIMER:+/$AB_TIMER}" \
        --rounds ${ROUNDS:-5} --timer ${AB_TIMER:-flushed} \
        --pages 128 --cells "${CELLS:-64:2048:full:3:3,16:2048:full:3:3,64:1024:full:3:3,16:1024:full:3:3,64:2048:vllm:pr_27}" \
        > "$R/ab${AB_TIMER:+-$AB_TIMER}.txt" 2>&1
      echo "ab exit $?" >> "$R/exit-codes.txt"
    fi
    rm -rf "$R/base"
    ;;
  Q)  # the GPU's clocks and power under each timer (session 10: is back to back slower because it clocks down?)
    for m in tree causal; do
      timeout "$(left 5)" python3 scripts/clock_probe.py --tree "${TREE:-full:3:3}" --mode $m --out "$R/clocks-$m" \
        > "$R/clocks-$m.txt" 2>&1
      echo "clock_probe $m exit $?" >> "$R/exit-codes.txt"
    done
    ;;
  F)  # the flex finding reproduced in fresh processes, and flex alone on the seed suite
    timeout "$(left 300)" python3 scripts/repro_flex_static.py > "$R/repro.txt" 2>&1
    tb run --suite seed --backends flex --out "$R/flex-seed.jsonl" --quiet > "$R/flex-seed.txt" 2>&1
    echo "run seed flex exit $?" >> "$R/exit-codes.txt"
    ;;
  C)
    OUT_SAVE=$OUT; OUT=$R/scaling BACKENDS=triton_tree,torch_sdpa timeout "$(left 90)" bash scripts/multi_gpu_bench.sh > "$R/scaling.txt" 2>&1
    echo "scaling exit $?" >> "$R/exit-codes.txt"; OUT=$OUT_SAVE
    tb run --suite check --backends triton_tree --isolate --quiet --out "$R/isolate.jsonl" > "$R/isolate.txt" 2>&1
    ;;
esac
cat "$R"/exit-codes.txt 2>/dev/null
tar czf "$OUT/$stage.tgz" -C /tmp "h200-$stage"
ls -la "$OUT"
