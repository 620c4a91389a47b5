#!/usr/bin/env bash
# Runs the benchmark suite and prints docs/BENCHMARKS.md (markdown) to stdout; every number in
# it comes from this run: the tables are the bench's own output, the targets and attribution
# tables and the picture are computed from the runs' JSON by tools/bench/report.py.
#   scripts/bench_report.sh > docs/BENCHMARKS.md
# Raw outputs (JSON, text, the plot) go to docs/bench/ (UBEP_REPORT_DIR to change).
# Needs a built tree (build/, Release) and Debian's python3-matplotlib for the plot.
# Timings on shared machines are noisy: compare ratios within a run.
set -euo pipefail
cd "$(dirname "$0")/.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
bench=build/tools/ubep-bench
out=${UBEP_REPORT_DIR:-docs/bench}
mkdir -p "$out"
rm -f "$out"/*.json "$out"/*.txt "$out"/*.quiet "$out"/runs.tsv

{
  echo "date: $(date -u +'%Y-%m-%d %H:%M UTC')"
  echo "commit: $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src include tools || echo ' (with uncommitted changes)')"
  echo "cpu: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB"
  echo "os: $(. /etc/os-release; echo "$PRETTY_NAME"), $(g++ --version | head -1), $(mpirun --version | head -1)"
  echo "load_start: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "cpu_pressure_start: $(sed -n 's/^some avg10=\([0-9.]*\).*/\1%/p' /proc/pressure/cpu 2>/dev/null || echo unknown)"
  echo "wait_s: ${UBEP_REPORT_WAIT:-120}"
} > "$out/machine.txt"

# The machine is shared: before each run, wait (up to UBEP_REPORT_WAIT seconds, default 120)
# until no other task is runnable, sampled 10 times over 2 s; the mean number of other runnable
# tasks seen just before the run is kept in <name>.quiet and printed with its table.
quiet() {
  local deadline=$((SECONDS + ${UBEP_REPORT_WAIT:-120})) others
  while :; do
    others=$(for _ in 1 2 3 4 5 6 7 8 9 10; do cut -d' ' -f4 /proc/loadavg; sleep 0.2; done |
             awk -F/ '{s += $1 - 1} END {printf "%.1f", s / NR}')
    if awk -v o="$others" 'BEGIN {exit !(o < 0.3)}' || [ $SECONDS -ge $deadline ]; then
      echo "$others"
      return
    fi
    sleep 3
  done
}

run() {  # run <name> <title> <command...>: the bench's table and JSON, under docs/bench/<name>.*
  local name=$1 title=$2
  shift 2
  printf '%s\t%s\t%s --quiet --json %s\n' "$name" "$title" "$*" "$out/$name.json" >> "$out/runs.tsv"
  quiet > "$out/$name.quiet"
  echo "[bench_report] $name (other runnable tasks before: $(cat "$out/$name.quiet")): $*" >&2
  "$@" --quiet --json "$out/$name.json" > "$out/$name.txt" 2>&1
}

run_plain() {  # run_plain <name> <title> <command...>: a tool without --json
  local name=$1 title=$2
  shift 2
  printf '%s\t%s\t%s\n' "$name" "$title" "$*" >> "$out/runs.tsv"
  quiet > "$out/$name.quiet"
  echo "[bench_report] $name: $*" >&2
  "$@" > "$out/$name.txt" 2>&1
}

two="mpirun -np 2"
run decode "decode, 2 process ranks" $two $bench --workload decode
run prefill "prefill, 2 process ranks" $two $bench --workload prefill
run tiny "tiny (1 token), 2 process ranks" $two $bench --workload tiny
run sync_decode "sync ablation, decode, 2 process ranks" \
  $two $bench --workload decode --algo ubep --sync fused,stop-and-wait
run sync_tiny "sync ablation, tiny, 2 process ranks" \
  $two $bench --workload tiny --algo ubep --sync fused,stop-and-wait
run tcp2x2 "forced 2 hosts x 2 ranks, every MPI byte over TCP (no bound: it would be the network)" \
  mpirun --mca btl tcp,self -np 4 $bench --workload decode --topology 2x2
run threads2 "decode, 2 thread ranks" $bench --ranks 2 --workload decode
run workers1 "decode, 2 thread ranks, --workers 1 for every implementation (oversubscribed: 4 threads on 2 cores)" \
  $bench --ranks 2 --workload decode --workers 1 --iters 20
run fp8_decode "fp8 (e4m3, per-128-channel scales) against bf16 dispatch, decode, 2 process ranks; fp8-cast: ubep casts bf16 inputs on send" \
  $two $bench --workload decode --algo ubep --dtype bf16,fp8,fp8-cast
run straggler_threads4 "rank 0 late before every call, 4 thread ranks (oversubscribed: 2 per core)" \
  $bench --ranks 4 --workload decode --tokens 32 --straggler-us 0,2000 --iters 30
run straggler_procs4 "rank 0 late before every call, 4 process ranks (oversubscribed: 2 per core)" \
  mpirun -np 4 $bench --workload decode --tokens 32 --straggler-us 0,2000 --iters 30
for pl in compact per-source; do
  run "placement_${pl/-/_}" "no delay, decode, 4 thread ranks, ubep with $pl placement" \
    $bench --ranks 4 --workload decode --tokens 32 --algo ubep --placement "$pl" --iters 50
done
run_plain kernels "the row kernels alone (one thread, in cache): what a tiny call's copies and reduction cost" \
  build/tools/ubep-kernel-timing 7168 20000
run threads8 "decode, 8 thread ranks (oversubscribed: 4 ranks per core)" \
  $bench --ranks 8 --workload decode --iters 20

# The picture: tokens per rank 1 .. 4096, throughput layout (the latency layout's receive
# buffer at 4096 tokens would need 15 GB per rank), 2 process ranks.
for t in 1 2 4 8 16 32 64 128 256 512 1024 2048 4096; do
  if [ "$t" -le 16 ]; then it=200; elif [ "$t" -le 256 ]; then it=50; elif [ "$t" -le 1024 ]; then it=20; else it=10; fi
  run "sweep_$t" "sweep" $two $bench --workload decode --layout throughput --tokens "$t" --iters "$it" --warmup 3
done
echo "load_end: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$out/machine.txt"

/usr/bin/python3 tools/bench/report.py "$out"
