#!/usr/bin/env bash
# Issue 31 measurement on a quiet machine: before/after alternation (absolute medians, and both
# against the AFTER binary's bound of the same alternation pair), then the after binary's breakdown.
set -u
# Usage: measure.sh BEFORE_BENCH AFTER_BENCH OUT_DIR  (RUNS=5; ONECCL_BENCH=a ubep-bench built with -DUBEP_ONECCL_ROOT)
B=$1; A=$2; O=$3; RUNS=${RUNS:-5}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
mkdir -p $O
log() { echo "== $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg): $*" | tee -a $O/log; }
for i in $(seq 1 $RUNS); do
  for w in decode prefill tiny; do
    it=200; [ $w = prefill ] && it=20; [ $w = tiny ] && it=3000
    for bin in B A; do b=$A; [ $bin = B ] && b=$B
      log "alt $i $w $bin"; mpirun -np 2 $b --workload $w --algo bsp,ubep --iters $it --warmup 10 --quiet --json $O/alt-$w-$bin-$i.json > /dev/null 2>&1
    done
  done
done
python3 - $O <<'PY' | tee $O/alt-summary.txt
import glob, json, statistics, sys, collections
O = sys.argv[1]
med = collections.defaultdict(list)
for f in sorted(glob.glob(O + "/alt-*.json")):
    _, w, b, i = f.split("/")[-1][:-5].split("-")
    for r in json.load(open(f))["results"]:
        if r.get("dtype", "bf16") != "bf16": continue
        med[(w, b, int(i), r["impl"], r["op"])].append(r["median_us"])
def get(w, b, i, impl, op):
    v = med.get((w, b, i, impl, op)); return v[0] if v else None
print("ratios over the runs: median [min-max]; 'vs A bound' = the op over the AFTER binary's bound of the same pair")
for w in ("decode", "prefill", "tiny"):
    runs = sorted({k[2] for k in med if k[0] == w})
    for impl in ("ubep", "bsp"):
        for op in ("dispatch", "combine"):
            rows = []
            for i in runs:
                bA = get(w, "A", i, "bound", op); uA = get(w, "A", i, impl, op); uB = get(w, "B", i, impl, op); bB = get(w, "B", i, "bound", op)
                if None in (bA, uA, uB, bB): continue
                rows.append((uB, uA, bA, bB, uB / bA, uA / bA, uB / bB, uA / bB))
            if not rows: continue
            def s(k): xs = [r[k] for r in rows]; return f"{statistics.median(xs):8.3f} [{min(xs):.3f}-{max(xs):.3f}]"
            def su(k): xs = [r[k] for r in rows]; return f"{statistics.median(xs):9.1f}"
            print(f"{w:8} {impl:5} {op:9} before {su(0)} us  after {su(1)} us  boundA {su(2)} boundB {su(3)} | before/boundA {s(4)}  after/boundA {s(5)} | before/boundB {s(6)} after/boundB {s(7)}  n={len(rows)}")
PY
log "decode breakdown A"; mpirun -np 2 $A --workload decode --algo bsp,ubep --dtype bf16,fp8 --repeat 5 --quiet --json $O/decode-A.json > $O/decode-A.txt 2>&1
log "decode compact A"; mpirun -np 2 $A --workload decode --algo ubep --placement compact --repeat 3 --quiet --json $O/decode-compact-A.json > $O/decode-compact-A.txt 2>&1
log "prefill A"; mpirun -np 2 $A --workload prefill --algo bsp,ubep --iters 20 --repeat 3 --quiet --json $O/prefill-A.json > $O/prefill-A.txt 2>&1
log "tiny A"; mpirun -np 2 $A --workload tiny --algo bsp,ubep --iters 3000 --repeat 5 --quiet --json $O/tiny-A.json > $O/tiny-A.txt 2>&1
log "4 ranks"; mpirun -np 4 $A --workload decode --algo bsp,ubep --dtype bf16,fp8 --iters 50 --repeat 2 --quiet --json $O/decode4-A.json > $O/decode4-A.txt 2>&1
log done
# issue 33: ubep vs oneCCL with a core per rank (the helper's build with -DUBEP_ONECCL_ROOT, main at engines33e)
C=${ONECCL_BENCH:-}
if [ -n "$C" ] && [ -x "$C" ]; then
  log "oneccl decode"; mpirun -np 2 $C --workload decode --algo mpi,oneccl,bsp,ubep --iters 40 --warmup 2 --quiet --json $O/oneccl-decode.json > $O/oneccl-decode.txt 2>&1
  log "oneccl prefill"; mpirun -np 2 $C --workload prefill --algo mpi,oneccl,bsp,ubep --iters 8 --warmup 1 --quiet --json $O/oneccl-prefill.json > $O/oneccl-prefill.txt 2>&1
  log done-oneccl
fi
