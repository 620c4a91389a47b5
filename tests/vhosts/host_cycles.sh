#!/usr/bin/env bash
# Kill-host, cut-link and rejoin cycles on virtual hosts (issue 32, item 4; host_cycles.cpp has
# the ranks). One launch of HOSTS hosts x RANKS ranks; per cycle: wait until the ranks run
# (ready.N), then the fault on the last host (the replacement of the cycle before, from cycle 2):
#   kill: SIGKILL every process of it;
#   link: set its cable down; every one of its ranks must stop with the partition error
#         (PARTITIONED lines; the minority side), the cable comes back after LINK_DOWN_MS
#         (env, default 1000) and the host's processes must end by themselves;
#   both: kill in odd cycles, link in even ones (so every cut is of a replacement host, which
#         only the heartbeat between live ranks and replacements can name);
# wait until the survivors run masked, count what is left in every host's /dev/shm, start a
# replacement host there (UBEP_REJOIN=1). Prints per cycle the survivors' fault -> first masked
# call, the replacement's launch -> first served call and the survivors' launch -> first full
# call (median / max), and at the end the totals: wrong values, /dev/shm names left per host,
# the survivors' fds per cycle (must be flat), and the verdict.
# Exit 0 on success, 1 on a failed check, 77 (with the reason) without virtual hosts.
# Usage: host_cycles.sh BIN HOSTS RANKS CYCLES [kill|link|both]
set -uo pipefail
bin=$(readlink -f "$1"); hosts=$2; ranks=$3; cycles=$4; fault=${5:-kill}
[[ $fault =~ ^(kill|link|both)$ ]] || { echo "fault must be kill, link or both, not '$fault'"; exit 2; }
down_ms=${LINK_DOWN_MS:-1000}
fault_of() { if [ "$fault" = both ]; then (( $1 % 2 )) && echo kill || echo link; else echo "$fault"; fi; }
vh=$(dirname "$(readlink -f "$0")")/../../scripts/vhosts.sh
if [ -z "${UBEP_VHOSTS:-}" ]; then
  "$vh" check || exit 77
  exec "$vh" shell "$hosts" "$(readlink -f "$0")" "$@"
fi
name=$UBEP_VHOSTS
work=$(mktemp -d /tmp/host_cycles.XXXXXX)
launcher=; repl=
cleanup() {
  [ -n "$launcher" ] && kill -TERM "$launcher" 2>/dev/null
  [ -n "$repl" ] && kill -TERM "$repl" 2>/dev/null
  "$vh" link "$name" "$hosts" up 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
fail=0
wait_file() { for ((t = 0; t < $2; ++t)); do [ -e "$1" ] && return 0; sleep 0.01; done; return 1; }
stamp() { date +%s%N > "$1.tmp" && mv "$1.tmp" "$1"; }
export UBEP_CYCLE_DIR=$work UBEP_CYCLES=$cycles UBEP_LAUNCH_PORT=${UBEP_LAUNCH_PORT:-29700}
"$vh" launch "$name" "$ranks" "$bin" > "$work/out" 2>&1 &
launcher=$!
holder=$(cat "/run/ubep-vhosts/$name/holder.$hosts")
shm_left=0
for ((n = 1; n <= cycles; ++n)); do
  wait_file "$work/ready.$n" 2000 || { echo "cycle $n: the ranks never got ready"; fail=1; break; }
  victims=$(ip netns pids "$name-vh$hosts" | grep -vx "$holder" | tr '\n' ' ')
  stamp "$work/fault.$n"
  if [ "$(fault_of "$n")" = kill ]; then
    kill -KILL $victims
  else
    ip -n "$name-vh$hosts" link set eth0 down
  fi
  wait_file "$work/masked.$n" 1000 || { echo "cycle $n: the survivors never ran masked"; fail=1; break; }
  if [ "$(fault_of "$n")" = link ]; then
    # The cable comes back after down_ms from the fault; the cut-off ranks (the minority) stop
    # and end by themselves: the replacement starts once they are gone.
    sleep "$(awk -v d="$down_ms" -v t="$(( ($(date +%s%N) - $(cat "$work/fault.$n")) / 1000000 ))" \
      'BEGIN {x = (d - t) / 1000; print (x > 0 ? x : 0)}')"
    "$vh" link "$name" "$hosts" up
    for ((t = 0; t < 1000; ++t)); do
      [ -z "$(ip netns pids "$name-vh$hosts" | grep -vx "$holder")" ] && break; sleep 0.01
    done
    [ -z "$(ip netns pids "$name-vh$hosts" | grep -vx "$holder")" ] ||
      { echo "cycle $n: the cut-off host's processes did not end within 10 s"; fail=1; break; }
  fi
  [ -n "$repl" ] && wait "$repl" 2>/dev/null
  repl=
  for ((h = 1; h <= hosts; ++h)); do
    left=$("$vh" exec "$name" "$h" sh -c 'ls /dev/shm | wc -l')
    [ "$left" -eq 0 ] || { echo "cycle $n: $left names left in vh$h's /dev/shm"; fail=1; }
    shm_left=$((shm_left + left))
  done
  stamp "$work/launch.$n"
  UBEP_REJOIN=1 UBEP_CYCLE=$n "$vh" launch-host "$name" "$ranks" "$hosts" "$bin" > "$work/rout.$n" 2>&1 &
  repl=$!
done
wait "$launcher" 2>/dev/null; launcher=
[ -n "$repl" ] && { wait "$repl" 2>/dev/null; repl=; }
for ((h = 1; h <= hosts; ++h)); do  # after the end too
  left=$("$vh" exec "$name" "$h" sh -c 'ls /dev/shm | wc -l')
  [ "$left" -eq 0 ] || { echo "at the end: $left names left in vh$h's /dev/shm"; fail=1; }
  shm_left=$((shm_left + left))
done
cat "$work"/rout.* >> "$work/out" 2>/dev/null
stats() { sort -g | awk '{v[NR] = $1} END {if (!NR) {print "none"; exit}
  printf "median %.1f max %.1f ms (n %d)", (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2), v[NR], NR}'; }
survivors=$(( (hosts - 1) * ranks ))
for ((n = 1; n <= cycles; ++n)); do
  c=$(grep "^CYCLE $n " "$work/out")
  [ "$(grep -c . <<< "$c")" -eq "$survivors" ] || { echo "cycle $n: not every survivor finished it"; fail=1; }
  s=$(grep "^SERVED $n " "$work/out")
  [ "$(grep -c . <<< "$s")" -eq "$ranks" ] || { echo "cycle $n: not every replacement rank served"; fail=1; }
  echo "cycle $n ($(fault_of "$n")): fault -> masked $(awk '{print $6}' <<< "$c" | stats); replacement launch -> served" \
    "$(awk '{print $6}' <<< "$s" | stats); launch -> survivors' first full call $(awk '{print $8}' <<< "$c" | stats)"
  if [ "$(fault_of "$n")" = link ]; then
    p=$(grep "^PARTITIONED $n " "$work/out")
    [ "$(grep -c . <<< "$p")" -eq "$ranks" ] || { echo "cycle $n: not every cut-off rank stopped with the partition error"; fail=1; }
    echo "cycle $n: cut -> the cut-off ranks' partition error $(awk '{print $6}' <<< "$p" | stats)"
  fi
done
pct() { sort -g | awk '{v[NR] = $1} END {if (!NR) {print "none"; exit}
  p = int(0.9 * NR + 0.999); printf "min %.1f median %.1f p90 %.1f max %.1f ms (n %d)", v[1],
  (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2), v[p], v[NR], NR}'; }
for f in kill link; do
  ns=" $(for ((n = 1; n <= cycles; ++n)); do [ "$(fault_of "$n")" = $f ] && echo -n "$n "; done)"
  [ "$ns" = " " ] && continue
  of() { awk -v ns="$ns" -v col="$1" 'index(ns, " " $2 " ") && $col >= 0 {print $col}'; }
  echo "$f cycles: fault -> survivors' first failed call: $(grep '^CYCLE ' "$work/out" | of 12 | pct)"
  echo "$f cycles: fault -> survivors' first masked call: $(grep '^CYCLE ' "$work/out" | of 6 | pct)"
  echo "$f cycles: replacement launch -> its ranks' first served call: $(grep '^SERVED ' "$work/out" | of 6 | pct)"
  [ $f = link ] && echo "link cycles: cut -> the cut-off ranks' partition error: $(grep '^PARTITIONED ' "$work/out" | of 6 | pct)"
done
echo "all cycles: fault -> survivors' first masked call: $(grep '^CYCLE ' "$work/out" | awk '{print $6}' | pct)"
echo "all cycles: replacement launch -> its ranks' first served call: $(grep '^SERVED ' "$work/out" | awk '{print $6}' | pct)"
echo "all cycles: replacement launch -> survivors' first full call: $(grep '^CYCLE ' "$work/out" | awk '{print $8}' | pct)"
wrong=$(grep -c "^RESULT .* wrong" "$work/out")
ok=$(grep -c "^RESULT .* ok" "$work/out")
[ "$wrong" -eq 0 ] && [ "$ok" -eq $((hosts * ranks)) ] || { echo "results: $ok ok, $wrong wrong"; fail=1; }
grep "^RESULT .* wrong" "$work/out"
for ((r = 0; r < survivors; ++r)); do
  fds=$(grep "^CYCLE [0-9]* rank $r " "$work/out" | sort -n -k2 | awk '{print $10}' | tr '\n' ' ')
  first=${fds%% *}; last=$(awk '{print $NF}' <<< "$fds")
  echo "survivor rank $r fds per cycle: $fds"
  [ -n "$first" ] && [ "$first" = "$last" ] || { echo "rank $r: fds not flat"; fail=1; }
  grep -q "^EXIT rank $r clean" "$work/out" || { echo "rank $r did not exit cleanly"; fail=1; }
done
echo "totals: $cycles cycles ($fault), $hosts hosts x $ranks ranks: wrong values $wrong, /dev/shm names left $shm_left (every host, every cycle)"
[ $fail -eq 0 ] || { echo "--- output:"; tail -50 "$work/out"; }
[ $fail -eq 0 ] && echo "PASS" || echo "FAIL"
exit $fail
