#!/usr/bin/env bash
# A slow, lossy link and the host heartbeat (issue 32, item 3): HOSTS virtual hosts of RANKS
# ranks in one TCP group (one launcher per host) make CALLS checked ubep calls while the last
# host's cable delays every frame, both ways, by DELAY_MS +- JITTER_MS (uniform) and drops
# LOSS percent of them. This kernel has no sch_netem (nor sch_fq or act_bpf for a BPF delay), so
# netem_relay.py does it in user space, spliced between the host's veth and the bridge.
# Every rank must end "clean" (CALLS calls, each checked against the reference): a host
# declared dead (a false heartbeat verdict) or any other error fails the run and is counted.
# Prints the relay's frame and drop counts and each rank's time per call, with and without the
# relay (a first run without it, the baseline).
# Exit 0 on success, 1 on a failed check, 77 (with the reason) without virtual hosts.
# Usage: netem_calls.sh BIN HOSTS RANKS CALLS [DELAY_MS JITTER_MS LOSS]   (default 2 1 1)
set -uo pipefail
bin=$(readlink -f "$1"); hosts=$2; ranks=$3; calls=$4
delay=${5:-2}; jitter=${6:-1}; loss=${7:-1}
here=$(dirname "$(readlink -f "$0")")
vh=$here/../../scripts/vhosts.sh
if [ -z "${UBEP_VHOSTS:-}" ]; then
  "$vh" check || exit 77
  command -v python3 > /dev/null || { echo "python3 not installed (netem_relay.py)"; exit 77; }
  exec "$vh" shell "$hosts" "$(readlink -f "$0")" "$@"
fi
name=$UBEP_VHOSTS
work=$(mktemp -d /tmp/netem_calls.XXXXXX)
relay=
cleanup() {
  [ -n "$relay" ] && { kill -TERM "$relay" 2>/dev/null; wait "$relay" 2>/dev/null; }
  rm -rf "$work"
}
trap cleanup EXIT
fail=0
run() {  # $1: label
  UBEP_CALLS=$calls UBEP_LAUNCH_PORT=$((29600 + RANDOM % 100)) "$vh" launch "$name" "$ranks" "$bin" \
    > "$work/out.$1" 2>&1
  local clean false_deaths
  clean=$(grep -c "^RESULT .* clean: $calls calls right" "$work/out.$1")
  false_deaths=$(grep -c "^RESULT .*lost with host" "$work/out.$1")
  echo "$1: $clean of $((hosts * ranks)) ranks clean after $calls calls; ranks that saw a host declared dead: $false_deaths"
  grep "^RESULT" "$work/out.$1" | sed 's/^/  /'
  [ "$clean" -eq $((hosts * ranks)) ] || { echo "--- $1 output:"; tail -20 "$work/out.$1"; fail=1; }
}
run baseline
# The relay: the last host's bridge port leaves the bridge; a new veth pair's far end takes its
# place; the relay joins the two (the namespace and its links go with vhosts.sh's down).
br=$name-br
ip -n "$br" link set "vh$hosts" nomaster
ip -n "$br" link add nm0 type veth peer name nm1
ip -n "$br" link set nm1 master br0 up
ip -n "$br" link set nm0 up
# The relay stands in for the kernel's netem, which no user process could starve: it runs at a
# higher priority than the ranks, so a loaded machine (CI's parallel builds) delays calls, not
# the emulated link's frames (at nice 0 it once held frames past the 60 ms heartbeat threshold
# while another build ran, and a host was declared dead).
ip netns exec "$br" nice -n -10 python3 "$here/netem_relay.py" "vh$hosts" nm0 "$delay" "$jitter" \
  "$loss" "$work/relay.stats" &
relay=$!
sleep 0.5
kill -0 "$relay" 2>/dev/null || { echo "the relay did not start"; exit 1; }
run "netem(delay ${delay}ms +-${jitter}ms, loss ${loss}%)"
kill -TERM "$relay"; wait "$relay" 2>/dev/null; relay=
echo "relay on vh$hosts's cable, both ways: $(cat "$work/relay.stats" 2>/dev/null)"
[ $fail -eq 0 ] && echo "PASS" || echo "FAIL"
exit $fail
