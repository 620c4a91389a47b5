#!/usr/bin/env bash
# Kill-host, cut-link and rejoin cycles on virtual hosts (issue 32, item 4; host_cycles.cpp has
# the ranks). One launch of HOSTS hosts x RANKS ranks; per cycle: wait until the ranks run
# (ready.N), then the fault on the cycle's victim host (VICTIM: last, the default: the last host,
# so from cycle 2 the replacement of the cycle before; N or N,M,...: host N (0-based) every cycle,
# or the list in turn; any: a random host per cycle, host 0 included from 3 hosts on; the seed is
# printed, SEED sets it):
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
# Usage: host_cycles.sh BIN HOSTS RANKS CYCLES [kill|link|both] [last|any|N[,M...]]
set -uo pipefail
bin=$(readlink -f "$1"); hosts=$2; ranks=$3; cycles=$4; fault=${5:-kill}; victim=${6:-last}
[[ $fault =~ ^(kill|link|both)$ ]] || { echo "fault must be kill, link or both, not '$fault'"; exit 2; }
[[ $victim =~ ^(last|any|[0-9]+(,[0-9]+)*)$ ]] ||
  { echo "victim must be last, any or hosts N[,M...], not '$victim'"; exit 2; }
list=(); [[ $victim =~ ^[0-9] ]] && IFS=, read -ra list <<< "$victim"
for v in "${list[@]}"; do
  [ "$v" -lt "$hosts" ] || { echo "victim host $v is not a host of 0..$((hosts - 1))"; exit 2; }
  # Losing host 0 of 2 stops host 1 too (the partition rule: a tie, and host 1 is not the lowest).
  [ "$v" = 0 ] && [ "$hosts" -lt 3 ] && { echo "victim host 0 needs 3 hosts or more (the partition rule)"; exit 2; }
done
down_ms=${LINK_DOWN_MS:-1000}
fault_of() { if [ "$fault" = both ]; then (( $1 % 2 )) && echo kill || echo link; else echo "$fault"; fi; }
vh=$(dirname "$(readlink -f "$0")")/../../scripts/vhosts.sh
if [ -z "${UBEP_VHOSTS:-}" ]; then
  "$vh" check || exit 77
  exec "$vh" shell "$hosts" "$(readlink -f "$0")" "$@"
fi
name=$UBEP_VHOSTS
work=$(mktemp -d /tmp/host_cycles.XXXXXX)
launcher=; repl=()  # repl[h]: the launcher of host h's latest replacement
cleanup() {
  [ -n "$launcher" ] && kill -TERM "$launcher" 2>/dev/null
  for p in "${repl[@]}"; do kill -TERM "$p" 2>/dev/null; done
  for ((h = 1; h <= hosts; ++h)); do "$vh" link "$name" "$h" up 2>/dev/null; done
  rm -rf "$work"
}
trap cleanup EXIT
fail=0
wait_file() { for ((t = 0; t < $2; ++t)); do [ -e "$1" ] && return 0; sleep 0.01; done; return 1; }
stamp() { date +%s%N > "$1.tmp" && mv "$1.tmp" "$1"; }
export UBEP_CYCLE_DIR=$work UBEP_CYCLES=$cycles UBEP_LAUNCH_PORT=${UBEP_LAUNCH_PORT:-29700}
# Every cycle's victim host (0-based), known to the ranks before they start (victim.N).
if [ "$victim" = any ]; then
  seed=${SEED:-$((RANDOM * 32768 + RANDOM))}
  RANDOM=$seed
  echo "victims: any host per cycle, seed $seed (SEED=$seed repeats them)"
fi
for ((n = 1; n <= cycles; ++n)); do
  case $victim in
    last) v=$((hosts - 1)) ;;
    any) if [ "$hosts" -ge 3 ]; then v=$((RANDOM % hosts)); else v=$((1 + RANDOM % (hosts - 1))); fi ;;
    *) v=${list[(n - 1) % ${#list[@]}]} ;;
  esac
  echo "$v" > "$work/victim.$n"
done
"$vh" launch "$name" "$ranks" "$bin" > "$work/out" 2>&1 &
launcher=$!
shm_left=0
for ((n = 1; n <= cycles; ++n)); do
  v=$(cat "$work/victim.$n"); vn=$((v + 1))  # its namespace, vh1..vhN
  holder=$(cat "/run/ubep-vhosts/$name/holder.$vn")
  wait_file "$work/ready.$n" 2000 || { echo "cycle $n: the ranks never got ready"; fail=1; break; }
  victims=$(ip netns pids "$name-vh$vn" | grep -vx "$holder" | tr '\n' ' ')
  stamp "$work/fault.$n"
  if [ "$(fault_of "$n")" = kill ]; then
    kill -KILL $victims
  else
    ip -n "$name-vh$vn" link set eth0 down
  fi
  wait_file "$work/masked.$n" 1000 || { echo "cycle $n: the survivors never ran masked"; fail=1; break; }
  if [ "$(fault_of "$n")" = link ]; then
    # The cable comes back after down_ms from the fault; the cut-off ranks (the minority) stop
    # and end by themselves: the replacement starts once they are gone.
    sleep "$(awk -v d="$down_ms" -v t="$(( ($(date +%s%N) - $(cat "$work/fault.$n")) / 1000000 ))" \
      'BEGIN {x = (d - t) / 1000; print (x > 0 ? x : 0)}')"
    "$vh" link "$name" "$vn" up
    for ((t = 0; t < 1000; ++t)); do
      [ -z "$(ip netns pids "$name-vh$vn" | grep -vx "$holder")" ] && break; sleep 0.01
    done
    [ -z "$(ip netns pids "$name-vh$vn" | grep -vx "$holder")" ] ||
      { echo "cycle $n: the cut-off host's processes did not end within 10 s"; fail=1; break; }
  fi
  [ -n "${repl[v]:-}" ] && wait "${repl[v]}" 2>/dev/null  # the victim's launcher, if a replacement
  unset "repl[v]"
  for ((h = 1; h <= hosts; ++h)); do
    left=$("$vh" exec "$name" "$h" sh -c 'ls /dev/shm | wc -l')
    [ "$left" -eq 0 ] || { echo "cycle $n: $left names left in vh$h's /dev/shm"; fail=1; }
    shm_left=$((shm_left + left))
  done
  stamp "$work/launch.$n"
  UBEP_REJOIN=1 UBEP_CYCLE=$n "$vh" launch-host "$name" "$ranks" "$vn" "$bin" > "$work/rout.$n" 2>&1 &
  repl[v]=$!
done
wait "$launcher" 2>/dev/null; launcher=
for p in "${repl[@]}"; do wait "$p" 2>/dev/null; done
repl=()
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
  echo "cycle $n ($(fault_of "$n") host $(cat "$work/victim.$n")): fault -> masked $(awk '{print $6}' <<< "$c" | stats); replacement launch -> served" \
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
  echo "$f cycles: fault -> survivors' first failed call (before they ran masked): $(grep '^CYCLE ' "$work/out" | of 12 | pct)"
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
# Per process (a rank's replacement is another process): its fds at the end of every cycle it
# survived, flat from the first to the last.
for pid in $(grep '^CYCLE ' "$work/out" | awk '{print $14}' | sort -un); do
  lines=$(grep "^CYCLE .* pid $pid\$" "$work/out" | sort -n -k2)
  r=$(awk 'NR == 1 {print $4}' <<< "$lines")
  fds=$(awk '{print $10}' <<< "$lines" | tr '\n' ' ')
  first=${fds%% *}; last=$(awk '{print $NF}' <<< "$fds")
  echo "rank $r (pid $pid) fds per cycle survived: $fds"
  [ -n "$first" ] && [ "$first" = "$last" ] || { echo "rank $r (pid $pid): fds not flat"; fail=1; }
done
for ((r = 0; r < hosts * ranks; ++r)); do  # its last process, at least
  grep -q "^EXIT rank $r clean" "$work/out" || { echo "rank $r did not exit cleanly"; fail=1; }
done
echo "totals: $cycles cycles ($fault; victims $(cat "$work"/victim.* 2>/dev/null | sort -n | uniq -c | awk '{printf "%shost %s x%s", (NR > 1 ? ", " : ""), $2, $1}')), $hosts hosts x $ranks ranks: wrong values $wrong, /dev/shm names left $shm_left (every host, every cycle)"
[ $fail -eq 0 ] || { echo "--- output:"; tail -50 "$work/out"; }
[ $fail -eq 0 ] && echo "PASS" || echo "FAIL"
exit $fail
