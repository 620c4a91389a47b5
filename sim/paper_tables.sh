#!/usr/bin/env bash
# Regenerates every simulated table of EXPERIMENTS.md: §1 latency (dispatch and combine, BSP vs
# UBEP, cm384 EP 64/128/256), §2 sync ablation, §3 scheduling ablation and its hot-expert sweep
# (EP64 and EP256), §4 decode TPOT, §5-6 validation on this machine, §7 sensitivity, the
# superpod scale (EP 1,024-8,192 latency on the ubmesh8k preset, TPOT at 8,192 dies) and the
# Speed table (`ubep-sim bench`). Raw tables go to OUT/*.txt, JSON to OUT/*.json; plots with
# sim/plot.py OUT when python3-matplotlib is installed. OUT/paper_tables.log records, per table,
# the command, the git commit, the start and end time and the load average, so that a document
# can say which run each table came from.
#
# usage: sim/paper_tables.sh [--quick] [BUILD_DIR] [OUT_DIR]     (defaults: build, docs/sim)
#   --quick (or QUICK=1): the tables whose points are all small: §1-§3 at EP <= 256 (the EP256
#           sched sweep excluded), TPOT 5 steps, validation re-scored, sensitivity, and the
#           256-die Speed row. Without it, also the EP256 sched sweep, TPOT 20 steps, the
#           superpod points, and the 768 and 8,192-die Speed rows.
# Environment:
#   RESOLVE_NS (default 10): the max-min resolve quantum (docs/sim/MODEL.md: < 1% error, tested).
#   SKIP="latency sync ...": skips tables by name (e.g. ones already regenerated).
#   NICE (default 19): every run is `nice -n $NICE` (the machine is shared).
#   VALIDATE_MEASURE=1: §5-6 re-measures this machine (sim/validate.sh: calibrate + ubep-bench,
#           needs ubep-bench built and a quiet machine); by default `ubep-sim validate` re-scores
#           the latest committed validate.sh run (VALIDATE_DIR) with the current model.
#   SUPERPOD_EP (default "1024 2048 4096 8192"), SUPERPOD_BIG_BS (default none),
#   TPOT_MOE_LAYERS (default 4): see below.
#
# Time on the 2-core Zen 4 VM (one core, load ~1, after issue 28's fourth solver pass; measured
# 2026-12-03): --quick about 2 minutes, the full run 12 minutes (each 8,192-die call is 6-10 s of
# one core at BS 8; the EP256 sweep 2 minutes). Under load, several times that.
set -euo pipefail
quick=${QUICK:-0}
if [[ "${1:-}" == --quick ]]; then
  quick=1
  shift
fi
build=${1:-build}
out=${2:-docs/sim}
sim="$build/sim/ubep-sim"
q=${RESOLVE_NS:-10}
nice_n=${NICE:-19}
[[ -x "$sim" ]] || { echo "paper_tables.sh: $sim not built (cmake --build $build --target ubep-sim)" >&2; exit 2; }
mkdir -p "$out"
log="$out/paper_tables.log"
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
stamp() { echo "$(date -u +%FT%TZ) load $(cut -d' ' -f1-3 /proc/loadavg)"; }
echo "# paper_tables.sh quick=$quick commit $commit (dirty: $(git status --porcelain -uno 2>/dev/null | wc -l) files) start $(stamp)" >>"$log"

skipped() { [[ " ${SKIP:-} " == *" $1 "* ]] && { echo "== $1: skipped (SKIP)" >&2; return 0; }; return 1; }

run() {  # run NAME ARGS...: one table, its text and JSON, with the command on top
  local name=$1
  shift
  skipped "$name" && return 0
  echo "== $name: ubep-sim $*" >&2
  local begin
  begin=$(stamp)
  { echo "# ubep-sim $* --resolve-ns $q --json $out/$name.json"
    nice -n "$nice_n" "$sim" "$@" --resolve-ns "$q" --quiet --json "$out/$name.json"; } >"$out/$name.txt"
  echo "$name: ubep-sim $* --resolve-ns $q | commit $commit | $begin -> $(stamp)" >>"$log"
  cat "$out/$name.txt"
}

speed() {  # speed NAME ARGS...: one Speed row (`bench`, one call each), CPU s and peak memory
  local name=$1
  shift
  skipped "$name" && return 0
  echo "== $name: ubep-sim bench $*" >&2
  local begin
  begin=$(stamp)
  { echo "# ubep-sim bench $* --repeats 1 --resolve-ns $q ($begin)"
    nice -n "$nice_n" "$sim" bench "$@" --repeats 1 --resolve-ns "$q" --quiet 2>&1; } >"$out/$name.txt"
  echo "$name: ubep-sim bench $* --repeats 1 --resolve-ns $q | commit $commit | $begin -> $(stamp)" >>"$log"
  cat "$out/$name.txt"
}

validation() {  # §5-6: re-score the committed measurements, or re-measure (VALIDATE_MEASURE=1)
  skipped validate && return 0
  local begin
  begin=$(stamp)
  if [[ "${VALIDATE_MEASURE:-0}" == 1 ]]; then
    echo "== validate: sim/validate.sh (measures this machine)" >&2
    nice -n "$nice_n" sim/validate.sh | tee "$out/validate.txt"
    echo "validate: sim/validate.sh (re-measured) | commit $commit | $begin -> $(stamp)" >>"$log"
    return 0
  fi
  # The latest committed run of sim/validate.sh with the current library and model (VALIDATE_DIR
  # picks another; EXPERIMENTS.md §6.6 lists every run), scored as validate.sh scores: the
  # calibrated shapes' rates from its own bench rounds where it has them.
  local dir=${VALIDATE_DIR:-docs/sim/validate-30m-run3} files cal
  cal=$dir/calibration-bench.json
  [ -f "$cal" ] || cal=$dir/calibration.json
  files=$(ls "$dir"/*_r[0-9]*.json | grep -v calibration_r | paste -sd, -)
  echo "== validate: ubep-sim validate on the committed measurements in $dir" >&2
  { echo "# ubep-sim validate --calibration $cal --measured $dir/<case>_r<round>.json,... (re-scored, not re-measured)"
    nice -n "$nice_n" "$sim" validate --calibration "$cal" --measured "$files" \
      --json "$out/validate-rescored.json"; } >"$out/validate-rescored.txt"
  echo "validate: ubep-sim validate on $dir (re-scored) | commit $commit | $begin -> $(stamp)" >>"$log"
  cat "$out/validate-rescored.txt"
}

run latency latency --op dispatch
run latency-combine latency --op combine
run sync sync
# §2's deferred sentinel reset (the reset after the call, not charged to it): ubep column only
run sync-sentinel-deferred latency --ranks 64 --op dispatch --sync sentinel-deferred
run sched sched
run sched-sweep-64 sched-sweep --ranks 64
validation
run sensitivity sensitivity
speed speed-256 --preset cm384 --ranks 256 --batch 128
if [[ "$quick" == 1 ]]; then
  run tpot tpot --steps 5 --batch 8
  echo "# end (quick) $(stamp)" >>"$log"
  exit 0
fi
run sched-sweep-256 sched-sweep --ranks 256
run tpot tpot --steps 20 --batch 8
speed speed-768 --preset cm384 --ranks 768 --batch 128 --experts 768
speed speed-8192 --preset ubmesh8k --ranks 8192 --batch 8 --experts 8192
# Superpod scale: the ubmesh8k preset (8,192 NPUs), experts = dies, top-8, BS 8 and 32 per die,
# dispatch and combine, bsp and ubep. SUPERPOD_EP (default "1024 2048 4096 8192") trims it.
for ep in ${SUPERPOD_EP:-1024 2048 4096 8192}; do
  run "latency-$ep" latency --preset ubmesh8k --ranks "$ep" --experts "$ep" --batch 8,32 --op dispatch
  run "latency-combine-$ep" latency --preset ubmesh8k --ranks "$ep" --experts "$ep" --batch 8,32 --op combine
done
# BS 64-256 (SUPERPOD_BIG_BS, default empty: at 8,192 dies each point is many CPU minutes), one
# table per (EP, BS, op) as docs/sim/latency-EP-bBS-OP.txt, e.g. SUPERPOD_BIG_BS="64 128 256".
for ep in ${SUPERPOD_EP:-1024 2048 4096 8192}; do
  for bs in ${SUPERPOD_BIG_BS:-}; do
    for op in dispatch combine; do
      run "latency-$ep-b$bs-$op" latency --preset ubmesh8k --ranks "$ep" --experts "$ep" --batch "$bs" --op "$op"
    done
  done
done
# TPOT at 8,192 dies: one step of TPOT_MOE_LAYERS MoE layers (default 4, under 2 minutes; the
# full 58 took 25 minutes of one core on 2026-12-03, docs/sim/tpot-8192-58.txt). With uniform routing the MoE layers
# are alike: the full model's step is 3 dense layers plus 58 times the mean MoE layer
# (EXPERIMENTS.md shows the extrapolation next to the measured figures).
run tpot-8192 tpot --preset ubmesh8k --ranks 8192 --experts 8192 --steps 1 --batch 8 \
  --moe-layers "${TPOT_MOE_LAYERS:-4}"
if /usr/bin/python3 -c 'import matplotlib' 2>/dev/null; then /usr/bin/python3 sim/plot.py "$out"; fi
echo "# end $(stamp)" >>"$log"
