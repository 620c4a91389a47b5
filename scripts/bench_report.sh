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
rm -f "$out"/*.json "$out"/*.txt "$out"/runs.tsv

{
  echo "date: $(date -u +'%Y-%m-%d %H:%M UTC')"
  echo "commit: $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src include tools || echo ' (with uncommitted changes)')"
  echo "cpu: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB"
  echo "os: $(. /etc/os-release; echo "$PRETTY_NAME"), $(g++ --version | head -1), $(mpirun --version | head -1)"
  echo "load_start: $(cut -d' ' -f1-3 /proc/loadavg)"
} > "$out/machine.txt"

run() {  # run <name> <title> <command...>: the bench's table and JSON, under docs/bench/<name>.*
  local name=$1 title=$2
  shift 2
  printf '%s\t%s\t%s --quiet --json %s\n' "$name" "$title" "$*" "$out/$name.json" >> "$out/runs.tsv"
  echo "[bench_report] $name: $*" >&2
  "$@" --quiet --json "$out/$name.json" > "$out/$name.txt" 2>&1
}

run_plain() {  # run_plain <name> <title> <command...>: a tool without --json
  local name=$1 title=$2
  shift 2
  printf '%s\t%s\t%s\n' "$name" "$title" "$*" >> "$out/runs.tsv"
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
run workers1 "decode, 2 thread ranks, --workers 1 for ubep and the baseline (oversubscribed: 4 threads on 2 cores; bsp uses no workers)" \
  $bench --ranks 2 --workload decode --workers 1 --iters 20
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
