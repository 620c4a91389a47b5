#!/usr/bin/env bash
# Lost-host detection trials on virtual hosts (issue 32; docs/ELASTIC.md, "A lost host"): HOSTS
# virtual hosts each run host_heartbeat_probe; per trial the last host is lost, either every
# process of it SIGKILLed (kill) or its cable set down (link), and every other host must judge
# exactly that host lost. Prints each survivor's detection time (fault -> judged, CLOCK_REALTIME,
# shared by the namespaces) and median / p90 / max; for link, also when the cut host judged the
# others lost (its side of the partition).
# Exit 0 when every survivor of every trial named the lost host within BOUND_MS (a correctness cap,
# not the timing target) and no live host was ever judged lost; 1 otherwise; 77 (with the reason)
# when virtual hosts cannot be made here.
# Usage: host_loss_trials.sh PROBE HOSTS TRIALS kill|link [PERIOD_MS THRESHOLD_MS BOUND_MS]
set -uo pipefail
probe=$(readlink -f "$1"); hosts=$2; trials=$3; mode=$4
period=${5:-10}; threshold=${6:-60}; bound=${7:-2000}
vh=$(dirname "$(readlink -f "$0")")/../../scripts/vhosts.sh
[[ $mode == kill || $mode == link ]] || { echo "mode must be kill or link, not '$mode'"; exit 2; }
if [ -z "${UBEP_VHOSTS:-}" ]; then
  "$vh" check || exit 77
  exec "$vh" shell "$hosts" "$(readlink -f "$0")" "$@"
fi
name=$UBEP_VHOSTS
work=$(mktemp -d /tmp/host_loss.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; done
  "$vh" link "$name" "$hosts" up 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
fail=0
: > "$work/times"; : > "$work/cut_side"
for ((k = 1; k <= trials; ++k)); do
  port=$((7300 + k))
  pids=()
  for ((h = 0; h < hosts; ++h)); do
    "$vh" exec "$name" $((h + 1)) "$probe" "$h" "$hosts" 10.77.0 "$port" "$period" "$threshold" 20 \
      > "$work/out.$k.$h" 2>&1 &
    pids+=($!)
  done
  for ((t = 0; t < 500; ++t)); do
    [ "$(cat "$work"/out.$k.* 2>/dev/null | grep -c '^heard all')" -ge "$hosts" ] && break; sleep 0.01
  done
  # Every host has heard every other one (the startup grace is over for them): after a link came
  # back up, the first datagrams can take a while, and a fault before them would be judged by the
  # 3 s grace instead of the threshold.
  [ "$(cat "$work"/out.$k.* | grep -c '^heard all')" -ge "$hosts" ] || { echo "trial $k: hosts never heard each other"; fail=1; }
  sleep 0.1
  t0=$(date +%s.%N)
  if [ "$mode" = kill ]; then "$vh" kill-host "$name" "$hosts" KILL; else "$vh" link "$name" "$hosts" down; fi
  # Times count from the fault's end, once it is in place. In a CI of 6ec0dfa every host of one
  # trial, the cut one too, judged 3485-3492 ms after the command began (a common delay, so the
  # cut itself came late; our reading: `ip link set` waits for the kernel's rtnl lock, which a
  # concurrent test's namespace teardown can hold for seconds under ctest -j2). A slow fault is
  # said.
  t1=$(date +%s.%N)
  fault_ms=$(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.0f", (b - a) * 1000}')
  [ "$fault_ms" -gt 100 ] && echo "trial $k: the fault took $fault_ms ms to make; times from its end"
  t0=$t1
  victim=$((hosts - 1))
  for ((h = 0; h < victim; ++h)); do
    for ((t = 0; t < bound / 10; ++t)); do grep -q "lost host $victim " "$work/out.$k.$h" && break; sleep 0.01; done
  done
  sleep 0.2
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; done
  wait 2>/dev/null
  [ "$mode" = link ] && "$vh" link "$name" "$hosts" up
  for ((h = 0; h < victim; ++h)); do
    line=$(grep "lost host $victim " "$work/out.$k.$h" | head -1)
    if [ -z "$line" ]; then echo "trial $k: host $h never judged host $victim lost"; fail=1; continue; fi
    ms=$(awk -v t0="$t0" '{print ($NF - t0) * 1000}' <<< "$line")
    echo "$ms" >> "$work/times"
    awk -v b="$bound" -v m="$ms" 'BEGIN {exit !(m > b)}' && { echo "trial $k: host $h took $ms ms > $bound"; fail=1; }
    if grep "lost host" "$work/out.$k.$h" | grep -vq "lost host $victim "; then
      echo "trial $k: host $h judged a live host lost: $(grep 'lost host' "$work/out.$k.$h" | grep -v "lost host $victim ")"; fail=1
    fi
  done
  [ "$mode" = link ] && awk -v t0="$t0" '/lost host/ {print ($NF - t0) * 1000}' "$work/out.$k.$victim" >> "$work/cut_side"
done
stats() {
  sort -g "$1" | awk '{v[NR] = $1} END {if (!NR) {print "none"; exit}
    p = int(0.9 * NR + 0.999); printf "n %d  min %.1f  median %.1f  p90 %.1f  max %.1f ms\n", NR, v[1], (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2), v[p], v[NR]}'
}
echo "$mode, $hosts hosts, period $period ms, threshold $threshold ms, $trials trials"
echo "survivors, fault -> lost host named: $(stats "$work/times")"
[ "$mode" = link ] && echo "cut host, fault -> it judged the others lost: $(stats "$work/cut_side")"
[ $fail -eq 0 ] && echo "PASS" || echo "FAIL"
exit $fail
