#!/usr/bin/env bash
# Alternating runs of two ubep-bench binaries (e.g. the commit before a change and after it), so
# that the machine's load drifts hit both alike: decode and prefill on 2 process ranks, bsp and
# ubep, each op's ratio to the measured bound (x_bound), median and range over the runs.
#   scripts/compare_commits.sh BEFORE_BIN AFTER_BIN [RUNS]     (default 5 runs of each)
set -euo pipefail
before=$1 after=$2 runs=${3:-5}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for i in $(seq 1 "$runs"); do
  for w in decode prefill; do
    iters=200; [ $w = prefill ] && iters=30
    for which in before after; do
      bin=$before; [ $which = after ] && bin=$after
      mpirun -np 2 "$bin" --workload $w --algo bsp,ubep --iters $iters --warmup 10 --quiet \
        --json "$out/$which-$w-$i.json" >/dev/null
    done
  done
done
python3 - "$out" <<'PY'
import collections, glob, json, statistics, sys
ratios = collections.defaultdict(list)
for f in glob.glob(sys.argv[1] + "/*.json"):
    which, workload, _ = f.split("/")[-1][:-5].split("-")
    for r in json.load(open(f))["results"]:
        if r["impl"] in ("bsp", "ubep") and r.get("x_bound"):
            ratios[(workload, r["impl"], r["op"], which)].append(r["x_bound"])
print(f"{'workload':8} {'impl':5} {'op':9} {'before x_bound':>22} {'after x_bound':>22} {'after/before':>12}")
for key in sorted({k[:3] for k in ratios}):
    b, a = ratios[key + ("before",)], ratios[key + ("after",)]
    mb, ma = statistics.median(b), statistics.median(a)
    print(f"{key[0]:8} {key[1]:5} {key[2]:9} {mb:8.3f} ({min(b):.2f}-{max(b):.2f}) "
          f"{ma:8.3f} ({min(a):.2f}-{max(a):.2f}) {ma / mb:12.3f}")
PY
