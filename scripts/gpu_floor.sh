#!/usr/bin/env bash
# Where the CUDA bench's ~400 us per-op floor comes from (docs/CUDA.md, "First run on a GPU"):
# the tiny and decode shapes at 1, 2, 4 and 8 thread ranks sharing the GPU (does the floor grow
# with the ranks that launch and synchronise concurrently, or is it there at one rank?), then
# Nsight Compute on the first dispatch and combine kernels of a 2-rank tiny run (the kernels' own
# durations, apart from the host's launch and wait). Run after scripts/gpu_check.sh, in the same
# build; writes $OUT/floor_*.log and $OUT/floor_summary.txt. Budget: under 4 minutes on an H200.
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${UBEP_GPU_BUILD:-build-gpu}
OUT=${OUT:-$PWD/$BUILD/out}
mkdir -p "$OUT"
BENCH=$BUILD/tools/cuda_bench/ubep-cuda-bench
[ -x "$BENCH" ] || { echo "gpu_floor: $BENCH not built (run scripts/gpu_check.sh first)"; exit 2; }
SUMMARY=$OUT/floor_summary.txt
: >"$SUMMARY"
for w in tiny decode; do
  for r in 1 2 4 8; do
    log=$OUT/floor_${w}_r$r.log
    timeout 60 "$BENCH" --workload "$w" --layout throughput --placement compact --ranks "$r" \
      --iters 100 --warmup 10 >"$log" 2>&1
    echo "== $w, $r ranks (rc $?)" >>"$SUMMARY"
    grep -E "^$w .* (ubep|bsp|copy_bound|pack_copy) " "$log" >>"$SUMMARY"
  done
done
if command -v ncu >/dev/null; then
  timeout 120 ncu --launch-count 4 --kernel-name regex:"dispatch_kernel|combine_kernel" \
    --section LaunchStats --section SpeedOfLight --clock-control none \
    "$BENCH" --workload tiny --layout throughput --placement compact --ranks 2 --iters 2 \
    --warmup 0 >"$OUT/floor_ncu.log" 2>&1
  echo "== ncu (rc $?): kernel durations" >>"$SUMMARY"
  grep -E "dispatch_kernel|combine_kernel|Duration|Grid Size|Block Size" "$OUT/floor_ncu.log" \
    >>"$SUMMARY"
else
  echo "== ncu not found" >>"$SUMMARY"
fi
cat "$SUMMARY"
