#!/usr/bin/env bash
# Nsight Compute profile of one triton_tree call (lab/profile_case.py) and where its stall samples sit.
#
#   lab/ncu_profile.sh OUTDIR NAME [profile_case.py arguments]
#
# Profiles the 9th launch of the forward kernel (the first ones compile and
# warm up) with the clocks left alone, then writes OUTDIR/NAME-details.csv (every section's metrics),
# OUTDIR/NAME-sass.csv.gz (per-instruction SASS with stall samples) and OUTDIR/NAME-segments.txt
# (lab/ncu_sass_segments.py over it). Needs ncu on the PATH and a GPU.
set -euo pipefail
out=$1; name=$2; shift 2
mkdir -p "$out"
here=$(cd "$(dirname "$0")" && pwd)
ncu --clock-control none -k 'regex:tree_attn_(fwd|ws)_kernel' --launch-skip 8 -c 1 \
    --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section SourceCounters \
    --section MemoryWorkloadAnalysis --section LaunchStats --section Occupancy \
    -o "$out/$name" -f python3 "$here/profile_case.py" --calls 8 "$@" > "$out/$name-run.txt" 2>&1
ncu --import "$out/$name.ncu-rep" --page details --csv > "$out/$name-details.csv"
ncu --import "$out/$name.ncu-rep" --page source --csv --print-source sass | gzip > "$out/$name-sass.csv.gz"
python3 "$here/ncu_sass_segments.py" --min 20 "$out/$name-sass.csv.gz" > "$out/$name-segments.txt" || true
rm -f "$out/$name.ncu-rep"
