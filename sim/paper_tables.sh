#!/usr/bin/env bash
# Regenerates every table of EXPERIMENTS.md that compares with the UBEP paper (issue 30):
# latency (dispatch and combine, BSP vs UBEP), sync ablation, scheduling ablation and its
# hot-expert sweep, decode TPOT, and the superpod scale (EP 1,024-8,192 latency on the ubmesh8k
# preset, TPOT at 8,192 dies). Raw tables go to OUT/*.txt, JSON to OUT/*.json; plots with
# sim/plot.py OUT when python3-matplotlib is installed.
#
# usage: sim/paper_tables.sh [BUILD_DIR] [OUT_DIR]     (defaults: build, docs/sim)
# Environment: QUICK=1 keeps only the small points (EP <= 256, TPOT 5 steps), for a smoke run;
# RESOLVE_NS (default 10) is the max-min resolve quantum (docs/sim/MODEL.md: < 1% error, tested).
#
# CPU time on the 2-core Zen 4 VM: the cm384 tables take tens of minutes; the ubmesh8k points
# take the longest (each 8,192-die call is ~20 s of one core at BS 8; see `ubep-sim bench`).
# SKIP="latency sync ..." skips tables by name (e.g. ones already regenerated).
set -euo pipefail
build=${1:-build}
out=${2:-docs/sim}
sim="$build/sim/ubep-sim"
q=${RESOLVE_NS:-10}
[[ -x "$sim" ]] || { echo "paper_tables.sh: $sim not built (cmake --build $build --target ubep-sim)" >&2; exit 2; }
mkdir -p "$out"

run() {  # run NAME ARGS...: one table, its text and JSON, with the command on top
  local name=$1
  shift
  [[ " ${SKIP:-} " == *" $name "* ]] && { echo "== $name: skipped (SKIP)" >&2; return 0; }
  echo "== $name: ubep-sim $*" >&2
  { echo "# ubep-sim $* --resolve-ns $q --json $out/$name.json"; "$sim" "$@" --resolve-ns "$q" --quiet --json "$out/$name.json"; } >"$out/$name.txt"
  cat "$out/$name.txt"
}

run latency latency --op dispatch
run latency-combine latency --op combine
run sync sync
run sched sched
run sched-sweep sched-sweep
if [[ "${QUICK:-0}" == 1 ]]; then
  run tpot tpot --steps 5 --batch 8
  exit 0
fi
run tpot tpot --steps 20 --batch 8
# Superpod scale: the ubmesh8k preset (8,192 NPUs), experts = dies, top-8, BS 8 and 32 per die,
# dispatch and combine, bsp and ubep. SUPERPOD_EP (default "1024 2048 4096 8192") trims it.
for ep in ${SUPERPOD_EP:-1024 2048 4096 8192}; do
  run "latency-$ep" latency --preset ubmesh8k --ranks "$ep" --experts "$ep" --batch 8,32 --op dispatch
  run "latency-combine-$ep" latency --preset ubmesh8k --ranks "$ep" --experts "$ep" --batch 8,32 --op combine
done
# TPOT at 8,192 dies: one step of TPOT_MOE_LAYERS MoE layers (default 4; every 8,192-die call
# is ~20 s of one core, so the full 58 layers x 2 calls x 2 algorithms would take ~80 minutes).
# With uniform routing the MoE layers are alike: the full model's step is 3 dense layers plus 58
# times the mean MoE layer (EXPERIMENTS.md shows the extrapolation next to the measured figures).
run tpot-8192 tpot --preset ubmesh8k --ranks 8192 --experts 8192 --steps 1 --batch 8 \
  --moe-layers "${TPOT_MOE_LAYERS:-4}"
if /usr/bin/python3 -c 'import matplotlib' 2>/dev/null; then /usr/bin/python3 sim/plot.py "$out"; fi
