#!/usr/bin/env bash
# A replacement host joins while another host is cut off (issue 32; the ranks and the rule are in
# rejoin_while_cut.cpp). On HOSTS (>= 3) virtual hosts of RANKS ranks: kill every process of the
# last host K; once the others run masked, cut the cable of host C (the one before K) and keep it
# down; once they run with C masked too, start K's replacement; once the live ranks made 50 calls
# with it, C still cut off, bring C's cable back, wait until C's old ranks are gone (they stopped
# as the partition's minority), start C's replacement. Checks: every surviving and replacement
# rank "ok" (every call right, the masked sets in order, then the group's collectives and a new
# Buffer right), every rank of C's first processes stopped with the partition error (no split
# brain), every process exited cleanly, nothing left in any host's /dev/shm; prints the times
# (fault or launch -> each stage's first call, per rank).
# Exit 0 on success, 1 on a failed check, 77 (with the reason) without virtual hosts.
# Usage: rejoin_while_cut.sh BIN HOSTS RANKS
set -uo pipefail
bin=$(readlink -f "$1"); hosts=$2; ranks=$3
[ "$hosts" -ge 3 ] || { echo "needs 3 hosts or more (one killed, one cut, one to go on), not $hosts"; exit 2; }
vh=$(dirname "$(readlink -f "$0")")/../../scripts/vhosts.sh
if [ -z "${UBEP_VHOSTS:-}" ]; then
  "$vh" check || exit 77
  exec "$vh" shell "$hosts" "$(readlink -f "$0")" "$@"
fi
name=$UBEP_VHOSTS
kn=$hosts; cn=$((hosts - 1))  # K's and C's namespaces (vh1..vhN)
work=$(mktemp -d /tmp/rejoin_while_cut.XXXXXX)
launcher=; rk=; rc=
cleanup() {
  for p in $launcher $rk $rc; do kill -TERM "$p" 2>/dev/null; done
  "$vh" link "$name" "$cn" up 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
fail=0
step() { echo "$(date +%T.%N | cut -c1-12) $*"; }
wait_file() { for ((t = 0; t < $2; ++t)); do [ -e "$work/$1" ] && return 0; sleep 0.01; done
  echo "no $1 within $(($2 / 100)) s"; return 1; }
stamp() { date +%s%N > "$work/$1.tmp" && mv "$work/$1.tmp" "$work/$1"; }
others() { ip netns pids "$name-vh$1" | grep -vx "$(cat "/run/ubep-vhosts/$name/holder.$1")"; }
export UBEP_WORK=$work UBEP_LAUNCH_PORT=${UBEP_LAUNCH_PORT:-29800}
"$vh" launch "$name" "$ranks" "$bin" > "$work/out" 2>&1 &
launcher=$!
run() {
  wait_file ready 2000 || return 1
  step "kill host $((kn - 1))"; victims=$(others "$kn" | tr '\n' ' ')
  stamp kill; kill -KILL $victims
  wait_file stage.1 1000 || return 1
  step "cut host $((cn - 1))"; stamp cut; ip -n "$name-vh$cn" link set eth0 down
  wait_file stage.2 1000 || return 1
  step "replacement of host $((kn - 1)), host $((cn - 1)) still cut off"; stamp launch.K
  UBEP_REJOIN=1 "$vh" launch-host "$name" "$ranks" "$kn" "$bin" > "$work/rout.K" 2>&1 &
  rk=$!
  wait_file stage.3 1000 && wait_file stage3.calls 2000 || return 1
  ip -n "$name-vh$cn" link show eth0 | grep -q "state DOWN" ||
    { echo "host $((cn - 1))'s cable came up before its time"; return 1; }
  step "host $((cn - 1))'s cable back"; "$vh" link "$name" "$cn" up
  for ((t = 0; t < 1000; ++t)); do [ -z "$(others "$cn")" ] && break; sleep 0.01; done
  [ -z "$(others "$cn")" ] || { echo "host $((cn - 1))'s cut-off processes did not end within 10 s"; return 1; }
  step "replacement of host $((cn - 1))"; stamp launch.C
  UBEP_REJOIN=1 "$vh" launch-host "$name" "$ranks" "$cn" "$bin" > "$work/rout.C" 2>&1 &
  rc=$!
}
run || fail=1
for p in $launcher $rk $rc; do
  for ((t = 0; t < 4000; ++t)); do kill -0 "$p" 2>/dev/null || break; sleep 0.01; done
  kill -0 "$p" 2>/dev/null && { echo "a launcher did not end within 40 s"; fail=1; kill -TERM "$p"; }
  wait "$p" 2>/dev/null
done
launcher=; rk=; rc=
step "all ended"
cat "$work"/rout.* >> "$work/out" 2>/dev/null
for ((r = 0; r < hosts * ranks; ++r)); do
  h=$((r / ranks))
  lines=$(grep "^RESULT rank $r " "$work/out")
  if [ "$h" -eq $((cn - 1)) ]; then  # its cut-off first processes, then its replacement
    grep -q " minority: .*partitioned" <<< "$lines" ||
      { echo "rank $r of the cut-off host did not stop as the minority: $lines"; fail=1; }
  fi
  if [ "$h" -ge $((cn - 1)) ]; then want=2; else want=1; fi  # K's killed ranks print nothing
  [ "$h" -eq $((kn - 1)) ] && want=1
  [ "$(grep -c " ok: " <<< "$lines")" -eq 1 ] || { echo "rank $r: no ok: $lines"; fail=1; }
  [ "$(grep -c "^EXIT rank $r clean" "$work/out")" -eq "$want" ] ||
    { echo "rank $r: not every process of it exited cleanly"; fail=1; }
done
grep "^RESULT .* wrong" "$work/out" && fail=1
for ((h = 1; h <= hosts; ++h)); do
  left=$("$vh" exec "$name" "$h" sh -c 'ls /dev/shm | wc -l')
  [ "$left" -eq 0 ] || { echo "$left names left in vh$h's /dev/shm"; fail=1; }
done
stats() { sort -g | awk '{v[NR] = $1} END {if (!NR) {print "none"; exit}
  printf "median %.1f max %.1f ms (n %d)", (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2), v[NR], NR}'; }
for s in 1 2 3 4; do
  from=(x "kill of host $((kn - 1))" "cut of host $((cn - 1))" "launch of host $((kn - 1))'s replacement" "launch of host $((cn - 1))'s replacement")
  echo "${from[s]} -> the live ranks' first call of stage $s: $(grep "^TIMES .* stage $s " "$work/out" | awk '{print $7}' | stats)"
done
[ $fail -eq 0 ] || { echo "--- output:"; cat "$work/out"; }
[ $fail -eq 0 ] && echo "PASS" || echo "FAIL"
exit $fail
