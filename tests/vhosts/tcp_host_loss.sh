#!/usr/bin/env bash
# A whole host lost under the TCP transport, one launcher per host (issue 32; tcp_host_loss.cpp):
# per trial HOSTS virtual hosts of RANKS ranks loop on checked ubep calls; once they run, every
# process of the victim host (UBEP_VICTIM_HOST, 0-based; default the last) is SIGKILLed (kill) or
# its cable set down (link). Host 0 too: it serves the rendezvous, and with UBEP_MASK_HOST the
# other hosts (3 or more) go on without it and, with UBEP_REJOIN_HOST, a replacement host 0
# rejoins through the next live host's door (issue 32). Every rank of the
# other hosts must end its call with a PeerFailedError naming that host (or echoing a survivor
# that named it; at least one must name it) within BOUND_MS (a
# correctness cap; the times are printed: median / p90 / max) and then exit cleanly: the
# survivors' processes outlive the host, and nothing is left in their hosts' /dev/shm. No
# completed call may return a wrong value.
# Exit 0 on success, 1 on a failed check, 77 (with the reason) without virtual hosts.
# With UBEP_MASK_HOST=1 the survivors mask the host and go on instead (tcp_host_loss.cpp); the
# time is then to their first masked call, and with link the cut-off host must stop as the
# minority of a partition (no split brain).
# With UBEP_REJOIN_HOST=1 as well, once the survivors masked the host a replacement host is
# started in its namespace (UBEP_REJOIN=1; with link: once the link is back and the cut-off
# ranks have stopped as the minority); it must serve within BOUND_MS of its launch
# (printed: median / p90 / max), the survivors must take it back and every call of every rank,
# masked or full, must be right (tcp_host_loss.cpp); nothing may be left in any host's /dev/shm.
# UBEP_REJOIN_OTHER_CONFIG=1: the replacement's BufferConfig differs, and it must be refused
# with the named error while the survivors go on masked.
# UBEP_KILL_ONE=1 (with UBEP_MASK_HOST=1, kill): only the last rank of the victim host is killed;
# its host-mates must fail at once naming it ("not a host-mate"), and every rank of the other
# hosts must stop with the named error of a partly lost host ("is partly lost"), never mask
# (times: the kill -> that error).
# Usage: tcp_host_loss.sh BIN HOSTS RANKS TRIALS kill|link [BOUND_MS]
set -uo pipefail
bin=$(readlink -f "$1"); hosts=$2; ranks=$3; trials=$4; mode=$5; bound=${6:-2000}
vh=$(dirname "$(readlink -f "$0")")/../../scripts/vhosts.sh
[[ $mode == kill || $mode == link ]] || { echo "mode must be kill or link, not '$mode'"; exit 2; }
if [ -z "${UBEP_VHOSTS:-}" ]; then
  "$vh" check || exit 77
  exec "$vh" shell "$hosts" "$(readlink -f "$0")" "$@"
fi
name=$UBEP_VHOSTS
victim=${UBEP_VICTIM_HOST:-$((hosts - 1))}
[[ $victim =~ ^[0-9]+$ ]] && [ "$victim" -lt "$hosts" ] ||
  { echo "UBEP_VICTIM_HOST '$victim' is not a host of 0..$((hosts - 1))"; exit 2; }
[ "$victim" = 0 ] && [ "$hosts" -lt 3 ] && [ "${UBEP_MASK_HOST:-0}" = 1 ] &&
  { echo "host 0 as the victim with UBEP_MASK_HOST needs 3 hosts or more (the partition rule: with 2, host 1 stops too)"; exit 2; }
export UBEP_VICTIM_HOST=$victim
vn=$((victim + 1))  # its namespace, vh1..vhN
survivors=(); for ((r = 0; r < hosts * ranks; ++r)); do [ $((r / ranks)) -ne "$victim" ] && survivors+=("$r"); done
work=$(mktemp -d /tmp/tcp_host_loss.XXXXXX)
launcher=
replacer=
rejoin=${UBEP_REJOIN_HOST:-0}
other=${UBEP_REJOIN_OTHER_CONFIG:-0}
one=${UBEP_KILL_ONE:-0}
[ "$one" = 1 ] && { [ "${UBEP_MASK_HOST:-0}" = 1 ] && [ "$mode" = kill ] && [ "$rejoin" = 0 ] ||
  { echo "UBEP_KILL_ONE=1 needs UBEP_MASK_HOST=1, kill, and no UBEP_REJOIN_HOST"; exit 2; }; }
[ "$rejoin" = 1 ] && { [ "${UBEP_MASK_HOST:-0}" = 1 ] ||
  { echo "UBEP_REJOIN_HOST=1 needs UBEP_MASK_HOST=1"; exit 2; }; }
cleanup() {
  [ -n "$launcher" ] && kill -TERM "$launcher" 2>/dev/null
  [ -n "$replacer" ] && kill -TERM "$replacer" 2>/dev/null
  "$vh" link "$name" "$vn" up 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
fail=0
: > "$work/times"; : > "$work/cmd_times"; : > "$work/rejoin_times"; : > "$work/mate_times"
for ((k = 1; k <= trials; ++k)); do
  mkdir -p "$work/pids.$k"
  UBEP_LAUNCH_PORT=$((29500 + 10 * k)) UBEP_FAULT_FILE=$work/fault.$k UBEP_READY_FILE=$work/ready.$k \
    UBEP_PID_DIR=$work/pids.$k \
    UBEP_MASKED_FILE=$work/masked.$k UBEP_REJOIN_FILE=$work/rejoin.$k UBEP_REJOIN_OTHER_CONFIG=$other \
    "$vh" launch "$name" "$ranks" "$bin" > "$work/out.$k" 2>&1 &
  launcher=$!
  for ((t = 0; t < 2000; ++t)); do [ -e "$work/ready.$k" ] && break; sleep 0.01; done
  [ -e "$work/ready.$k" ] || { echo "trial $k: the ranks never got going"; cat "$work/out.$k"; fail=1; }
  sleep 0.2
  # The fault itself, timed at its system call: the host's processes listed first, then one
  # kill(2) each (bash's builtin); or one `ip link set down` (a few ms of it inside the time).
  if [ "$mode" = kill ]; then
    holder=$(cat "/run/ubep-vhosts/$name/holder.$vn")
    victims=$(ip netns pids "$name-vh$vn" | grep -vx "$holder" | tr '\n' ' ')
    [ "$one" = 1 ] && victims=$(cat "$work/pids.$k/pid.$(((victim + 1) * ranks - 1))")
  fi
  date +%s%N > "$work/fault.$k.tmp" && mv "$work/fault.$k.tmp" "$work/fault.$k"
  if [ "$mode" = kill ]; then kill -KILL $victims; else ip -n "$name-vh$vn" link set eth0 down; fi
  echo "$(( ($(date +%s%N) - $(cat "$work/fault.$k")) / 1000 ))" | awk '{print $1 / 1000}' >> "$work/cmd_times"
  # Masking: the cable comes back after 1 s while the survivors still run (a partition healed).
  if [ "${UBEP_MASK_HOST:-0}" = 1 ] && [ "$mode" = link ]; then sleep 1; "$vh" link "$name" "$vn" up; fi
  # A replacement host, once the survivors run masked: its launch time first, then the launcher.
  if [ "$rejoin" = 1 ]; then
    for ((t = 0; t < 1000; ++t)); do [ -e "$work/masked.$k" ] && break; sleep 0.01; done
    sleep 0.1  # a few masked calls first
    # link: the cut-off host's ranks stopped as the minority (the link is back by now); the
    # replacement takes their place once they are gone.
    if [ "$mode" = link ]; then
      holder=$(cat "/run/ubep-vhosts/$name/holder.$vn")
      for ((t = 0; t < 1000; ++t)); do
        [ -z "$(ip netns pids "$name-vh$vn" | grep -vx "$holder")" ] && break; sleep 0.01
      done
    fi
    date +%s%N > "$work/rejoin.$k.tmp" && mv "$work/rejoin.$k.tmp" "$work/rejoin.$k"
    UBEP_REJOIN=1 UBEP_LAUNCH_PORT=$((29500 + 10 * k)) UBEP_REJOIN_FILE=$work/rejoin.$k \
      UBEP_REJOIN_OTHER_CONFIG=$other "$vh" launch-host "$name" "$ranks" "$vn" "$bin" \
      > "$work/rout.$k" 2>&1 &
    replacer=$!
  fi
  # The ranks' own cap is 60 s (tcp_host_loss.cpp, kCap): a starved core slows them, not fails them.
  for ((t = 0; t < 7000; ++t)); do kill -0 "$launcher" 2>/dev/null || break; sleep 0.01; done
  kill -0 "$launcher" 2>/dev/null && { echo "trial $k: the launchers did not end within 70 s"; fail=1; kill -TERM "$launcher"; }
  wait "$launcher" 2>/dev/null
  launcher=
  if [ -n "$replacer" ]; then
    for ((t = 0; t < 1000; ++t)); do kill -0 "$replacer" 2>/dev/null || break; sleep 0.01; done
    kill -0 "$replacer" 2>/dev/null && { echo "trial $k: the replacement did not end"; fail=1; kill -TERM "$replacer"; }
    wait "$replacer" 2>/dev/null
    replacer=
    cat "$work/rout.$k" >> "$work/out.$k"
    for ((r = victim * ranks; r < (victim + 1) * ranks; ++r)); do
      line=$(grep "^RESULT rank $r " "$work/rout.$k")
      if [ "$other" = 1 ]; then  # refused, named; the survivors went on masked
        grep -q "BufferConfig differs from live rank" <<< "$line" ||
          { echo "trial $k: replacement rank $r was not refused for its config: $line"; fail=1; }
        continue
      fi
      ms=$(awk '{print $9}' <<< "$line")
      echo "$ms" >> "$work/rejoin_times"
      grep -qE " ok: rejoined" <<< "$line" && awk -v b="$bound" -v m="$ms" 'BEGIN {exit !(m >= 0 && m <= b)}' ||
        { echo "trial $k: replacement: ${line:-rank $r printed no result}"; fail=1; }
      grep -q "^EXIT rank $r clean" "$work/rout.$k" || { echo "trial $k: replacement rank $r did not exit cleanly"; fail=1; }
    done
  fi
  [ "$mode" = link ] && "$vh" link "$name" "$vn" up
  for r in "${survivors[@]}"; do
    line=$(grep "^RESULT rank $r " "$work/out.$k")
    if [ -z "$line" ]; then echo "trial $k: survivor rank $r printed no result"; fail=1; continue; fi
    ms=$(awk '{print $9}' <<< "$line")
    echo "$ms" >> "$work/times"
    grep -q "^EXIT rank $r clean" "$work/out.$k" || { echo "trial $k: survivor rank $r did not exit cleanly"; fail=1; }
    if [ "$rejoin" = 1 ] && [ "$other" = 0 ] && ! grep -q " back after " <<< "$line"; then
      echo "trial $k: survivor rank $r never took the replacement back: $line"; fail=1
    fi
    want=" (ok|echo): "; [ "$one" = 1 ] && want=" partly: .*is partly lost"
    if ! grep -qE "$want" <<< "$line" || awk -v b="$bound" -v m="$ms" 'BEGIN {exit !(m < 0 || m > b)}'; then
      echo "trial $k: $line"; fail=1
    fi
  done
  if [ "$one" = 1 ]; then  # the victim's host-mates: named at once, then a clean exit
    for ((r = victim * ranks; r < (victim + 1) * ranks - 1; ++r)); do
      line=$(grep "^RESULT rank $r " "$work/out.$k")
      echo "$(awk '{print $9}' <<< "$line")" >> "$work/mate_times"
      grep -qE " partly: .*rank $(((victim + 1) * ranks - 1)) .*not a host-mate" <<< "$line" ||
        { echo "trial $k: host-mate: ${line:-rank $r printed no result}"; fail=1; }
      grep -q "^EXIT rank $r clean" "$work/out.$k" || { echo "trial $k: host-mate rank $r did not exit cleanly"; fail=1; }
    done
  fi
  for ((h = 1; h <= hosts; ++h)); do  # the survivors' hosts: every segment unlinked
    # and the replacement's (or the host-mates') host
    [ "$h" = "$vn" ] && [ "$rejoin" = 0 ] && [ "$one" = 0 ] && continue
    left=$("$vh" exec "$name" "$h" sh -c 'ls /dev/shm | wc -l')
    [ "$left" -eq 0 ] || { echo "trial $k: $left names left in vh$h's /dev/shm"; fail=1; }
  done
  if [ "${UBEP_MASK_HOST:-0}" = 1 ] && [ "$mode" = link ]; then
    # No split brain: the cut-off host is the minority (or the tie without host 0) and stops
    # with the partition error; it never completes a call with the others masked.
    for ((r = victim * ranks; r < (victim + 1) * ranks; ++r)); do
      grep -q "^RESULT rank $r .* minority: .*partitioned" "$work/out.$k" ||
        { echo "trial $k: rank $r of the cut-off host did not stop as the minority"; fail=1; }
    done
  fi
  named=0; [ "$one" = 1 ] && named=1  # checked above, rank by rank
  for r in "${survivors[@]}"; do grep -q "^RESULT rank $r .* ok: " "$work/out.$k" && named=1; done
  [ $named -eq 1 ] || { echo "trial $k: no survivor named the lost host itself"; fail=1; }
  [ $fail -eq 0 ] || { echo "--- trial $k output:"; cat "$work/out.$k"; }
  [ "${VERBOSE:-0}" = 1 ] && grep '^RESULT' "$work/out.$k"
done
stats() {
  sort -g "$1" | awk '{v[NR] = $1} END {if (!NR) {print "none"; exit}
    p = int(0.9 * NR + 0.999); printf "n %d  min %.1f  median %.1f  p90 %.1f  max %.1f ms\n", NR, v[1], (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2), v[p], v[NR]}'
}
echo "tcp transport, $mode, $hosts hosts x $ranks ranks, victim host $victim, $trials trials"
if [ "$one" = 1 ]; then
  echo "other hosts' ranks, kill of one rank -> the partly-lost host's named error: $(stats "$work/times")"
  echo "its host-mates, kill -> their named error: $(stats "$work/mate_times")"
elif [ "${UBEP_MASK_HOST:-0}" = 1 ]; then
  echo "survivors, fault -> end of the first call with the host masked: $(stats "$work/times")"
else
  echo "survivors, fault -> PeerFailedError naming the host: $(stats "$work/times")"
fi
echo "the fault command itself (start -> returned): $(stats "$work/cmd_times")"
[ "$rejoin" = 1 ] && [ "$other" = 0 ] &&
  echo "replacement ranks, launch -> end of their first served call: $(stats "$work/rejoin_times")"
[ $fail -eq 0 ] && echo "PASS" || echo "FAIL"
exit $fail
