#!/usr/bin/env bash
# Virtual hosts on one machine (docs/BACKENDS.md, "Virtual hosts"): N hosts, each with its own
# network namespace, IPC + mount namespaces with a private /dev/shm (and its own /etc/hosts),
# and UTS namespace with its own hostname (vh1..vhN); joined by veth pairs to a bridge that lives
# in a namespace of its own. Addresses exist only on the hosts' veth ends (eth0, 10.77.0.i/24)
# and their loopbacks. mpirun runs inside host vh1 and starts the other hosts' daemons through an
# rsh agent that enters that host's namespaces (OpenMPI's plm_rsh_agent), so every rank sees only
# its own host: host discovery finds N hosts without any forced-host option.
#
# Needs root (or CAP_SYS_ADMIN + CAP_NET_ADMIN), iproute2, util-linux (unshare, nsenter), mpirun.
#
# Usage:
#   vhosts.sh check                         exit 0 if virtual hosts can be made here, else 77 and why
#   vhosts.sh up NAME HOSTS                 make them (state in /run/ubep-vhosts/NAME)
#   vhosts.sh down NAME                     remove everything NAME made (idempotent)
#   vhosts.sh exec NAME HOST CMD...         run CMD inside host HOST (1..N) of NAME
#   vhosts.sh mpirun NAME RANKS_PER_HOST [ARGS...]
#       mpirun -np HOSTS*RANKS_PER_HOST ARGS... from inside vh1: ranks 0..R-1 on vh1, R..2R-1 on
#       vh2, ... (extra mpirun options may come first in ARGS)
#   vhosts.sh run HOSTS RANKS_PER_HOST CMD...
#       up (a fresh NAME), mpirun -np HOSTS*RANKS_PER_HOST CMD..., down -- removed by a trap even
#       when CMD fails or the script is interrupted; exit status of mpirun
#   vhosts.sh launch NAME RANKS_PER_HOST CMD...
#       one launcher per host, no MPI job spanning hosts (ubep/tcp_group.hpp): CMD runs inside
#       every host with UBEP_RENDEZVOUS=10.77.0.1:PORT (UBEP_LAUNCH_PORT, default 29500),
#       UBEP_HOSTS, UBEP_HOST_IPS (10.77.0.1,...), UBEP_HOST_INDEX (0-based) and
#       UBEP_RANKS_PER_HOST set, and starts that many ranks itself; prints each host's exit
#       status, exits with the worst
#   vhosts.sh launch-host NAME RANKS_PER_HOST HOST CMD...
#       host HOST's (1-based) launcher alone, with the same environment (a replacement host:
#       with UBEP_REJOIN=1 set; ubep/tcp_group.hpp TcpLaunch::rejoin)
#   vhosts.sh shell HOSTS CMD...            up, CMD (in the root namespaces, with UBEP_VHOSTS=NAME
#                                           and UBEP_VHOSTS_SCRIPT set for nested calls), down
#   vhosts.sh gc                            remove the hosts of runs that were killed (SIGKILL)
# Faults (for tests of host failures):
#   vhosts.sh link NAME HOST up|down        the host's cable (its veth end)
#   vhosts.sh netem NAME HOST ARGS...       tc qdisc replace dev eth0 root netem ARGS (or "off")
#   vhosts.sh kill-host NAME HOST [SIGNAL]  every process of the host but its namespace holder
set -euo pipefail

STATE_ROOT=/run/ubep-vhosts
SUBNET=10.77.0
SELF=$(readlink -f "$0")

die() { echo "vhosts: $*" >&2; exit 1; }
state_of() { echo "$STATE_ROOT/$1"; }
holder_of() { cat "$(state_of "$1")/holder.$2"; }

check() {
  local why=""
  if ! command -v ip >/dev/null || ! command -v nsenter >/dev/null || ! command -v unshare >/dev/null; then
    why="iproute2 / util-linux (ip, unshare, nsenter) not installed"
  elif ! command -v mpirun >/dev/null; then
    why="mpirun not installed"
  elif ! unshare --net --ipc --mount --uts true 2>/dev/null; then
    why="cannot make namespaces here (needs root, or CAP_SYS_ADMIN and CAP_NET_ADMIN)"
  elif ! ip netns add "ubep-vhosts-probe-$$" 2>/dev/null; then
    why="cannot make a named network namespace (ip netns add; needs CAP_SYS_ADMIN)"
  else
    ip netns del "ubep-vhosts-probe-$$"
    return 0
  fi
  echo "virtual hosts unavailable: $why"
  return 77
}

# Host i: netns NAME-vh<i>; a holder process (sleep) in it with its own IPC, mount and UTS
# namespaces, /dev/shm a private tmpfs, /etc/hosts naming every host. Entered with nsenter.
up() {
  local name=$1 hosts=$2 state
  [[ $name =~ ^[A-Za-z0-9_-]{1,20}$ ]] || die "bad NAME '$name' (letters, digits, - and _; <= 20)"
  [[ $hosts =~ ^[0-9]+$ ]] && [ "$hosts" -ge 1 ] && [ "$hosts" -le 200 ] || die "bad HOSTS '$hosts'"
  state=$(state_of "$name")
  [ -e "$state" ] && die "$name is up already (vhosts.sh down $name)"
  mkdir -p "$state"
  echo "$hosts" > "$state/hosts.count"
  {
    echo "127.0.0.1 localhost"
    for ((i = 1; i <= hosts; ++i)); do echo "$SUBNET.$i vh$i"; done
  } > "$state/etc-hosts"
  ip netns add "$name-br"
  echo "$name-br" >> "$state/netns"
  ip -n "$name-br" link add br0 type bridge
  ip -n "$name-br" link set br0 up
  for ((i = 1; i <= hosts; ++i)); do
    local ns="$name-vh$i"
    ip netns add "$ns"
    echo "$ns" >> "$state/netns"
    ip -n "$name-br" link add "vh$i" type veth peer name eth0 netns "$ns"
    ip -n "$name-br" link set "vh$i" master br0 up
    ip -n "$ns" addr add "$SUBNET.$i/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$ns" link set lo up
    # The holder: setns into the netns (ip netns exec), new IPC/mount/UTS namespaces (unshare,
    # private mount propagation), then a shell that names the host, mounts its private /dev/shm
    # and /etc/hosts, says it is ready and becomes `sleep` (same pid: every exec keeps it).
    ip netns exec "$ns" unshare --ipc --mount --uts --propagation private \
      sh -c "hostname vh$i && mount -t tmpfs -o mode=1777 tmpfs /dev/shm &&
             mount --bind '$state/etc-hosts' /etc/hosts && touch '$state/ready.$i' &&
             exec sleep infinity" </dev/null >/dev/null 2>"$state/holder.$i.err" &
    echo $! > "$state/holder.$i"
    disown $!  # down kills it: no job-control notice of that
  done
  for ((i = 1; i <= hosts; ++i)); do
    local t=0
    until [ -e "$state/ready.$i" ]; do
      kill -0 "$(holder_of "$name" "$i")" 2>/dev/null ||
        die "host vh$i failed: $(cat "$state/holder.$i.err")"
      ((++t > 500)) && die "host vh$i not ready after 5 s"
      sleep 0.01
    done
  done
  # The rsh agent: "agent HOST COMMAND..." as ssh would run COMMAND on HOST.
  cat > "$state/agent" <<EOF
#!/bin/sh
# plm_rsh_agent of virtual hosts '$name' (scripts/vhosts.sh): enter HOST's namespaces, run the rest.
host=\$1; shift
i=\${host#vh}
exec nsenter -t "\$(cat '$state/holder.'\$i)" -n -i -m -u -- /bin/sh -c "\$*"
EOF
  chmod +x "$state/agent"
}

down() {
  local name=$1 state
  state=$(state_of "$name")
  [ -d "$state" ] || return 0
  local f pid
  for f in "$state"/holder.*; do
    [[ $f =~ holder\.[0-9]+$ ]] || continue
    pid=$(cat "$f")
    # Every process still in the host (ranks, daemons) first, then the holder.
    kill_host_pids "$name" "${f##*.}" KILL || true
    kill -KILL "$pid" 2>/dev/null || true
  done
  if [ -e "$state/netns" ]; then
    while read -r ns; do ip netns del "$ns" 2>/dev/null || true; done < "$state/netns"
  fi
  rm -rf "$state"
}

kill_host_pids() {
  local name=$1 host=$2 sig=${3:-KILL} holder pids
  holder=$(holder_of "$name" "$host")
  pids=$(ip netns pids "$name-vh$host" 2>/dev/null | grep -vx "$holder" || true)
  [ -z "$pids" ] || kill -"$sig" $pids 2>/dev/null || true
}

in_host() {
  local name=$1 host=$2
  shift 2
  nsenter -t "$(holder_of "$name" "$host")" -n -i -m -u --wd="$PWD" -- "$@"
}

# mpirun inside vh1 over the veth subnet only; daemons on the other hosts through the agent.
vmpirun() {
  local name=$1 per_host=$2 state hosts
  shift 2
  [[ $per_host =~ ^[0-9]+$ ]] && [ "$per_host" -ge 1 ] || die "bad RANKS_PER_HOST '$per_host'"
  state=$(state_of "$name")
  hosts=$(cat "$state/hosts.count")
  for ((i = 1; i <= hosts; ++i)); do echo "vh$i slots=$per_host"; done > "$state/hostfile.$per_host"
  # Every host is given per_host slots, so Open MPI does not know that the machine under them is
  # oversubscribed when hosts * per_host > its cores: tell it (idle ranks yield the core),
  # as it decides by itself for the same ranks on one host.
  local extra=()
  [ $((hosts * per_host)) -gt "$(nproc)" ] && extra=(--mca mpi_yield_when_idle 1)
  # The heartbeat's setting reaches every host's ranks (the tests set it: tests/vhosts/CMakeLists.txt).
  [ -z "${UBEP_HOST_HEARTBEAT:-}" ] || extra+=(-x UBEP_HOST_HEARTBEAT)
  in_host "$name" 1 mpirun --allow-run-as-root --hostfile "$state/hostfile.$per_host" \
    -np $((hosts * per_host)) "${extra[@]}" \
    --map-by slot --mca plm_rsh_agent "$state/agent" \
    --mca oob_tcp_if_include "$SUBNET.0/24" --mca btl_tcp_if_include "$SUBNET.0/24" \
    --mca btl tcp,vader,self "$@"
}

# Every host's address, host order (UBEP_HOST_IPS: a replacement of host 0 asks the others' doors).
host_ips() {
  local i out=
  for ((i = 1; i <= $1; ++i)); do out+=${out:+,}$SUBNET.$i; done
  echo "$out"
}

# One launcher per host (ubep/tcp_group.hpp): every host runs CMD, which starts its own ranks.
launch() {
  local name=$1 per_host=$2 state hosts i rc worst=0
  shift 2
  [[ $per_host =~ ^[0-9]+$ ]] && [ "$per_host" -ge 1 ] || die "bad RANKS_PER_HOST '$per_host'"
  state=$(state_of "$name")
  hosts=$(cat "$state/hosts.count")
  local pids=()
  for ((i = 1; i <= hosts; ++i)); do
    UBEP_RENDEZVOUS=$SUBNET.1:${UBEP_LAUNCH_PORT:-29500} UBEP_HOSTS=$hosts \
      UBEP_HOST_IPS=$(host_ips "$hosts") \
      UBEP_HOST_INDEX=$((i - 1)) UBEP_RANKS_PER_HOST=$per_host in_host "$name" "$i" "$@" &
    pids+=($!)
  done
  for ((i = 1; i <= hosts; ++i)); do
    rc=0
    wait "${pids[i - 1]}" || rc=$?
    echo "vhosts: host vh$i's launcher exited $rc" >&2
    [ "$rc" -gt "$worst" ] && worst=$rc
  done
  return "$worst"
}

# One host's launcher alone (a replacement host, issue 32: run with UBEP_REJOIN=1), with the
# same environment as `launch` gives it.
launch_host() {
  local name=$1 per_host=$2 i=$3 hosts
  shift 3
  hosts=$(cat "$(state_of "$name")/hosts.count")
  [[ $i =~ ^[0-9]+$ ]] && [ "$i" -ge 1 ] && [ "$i" -le "$hosts" ] || die "bad HOST '$i' (1..$hosts)"
  UBEP_RENDEZVOUS=$SUBNET.1:${UBEP_LAUNCH_PORT:-29500} UBEP_HOSTS=$hosts \
    UBEP_HOST_IPS=$(host_ips "$hosts") \
    UBEP_HOST_INDEX=$((i - 1)) UBEP_RANKS_PER_HOST=$per_host in_host "$name" "$i" "$@"
}

# A fresh name per run: the pid of this script (unique while it lives), in a short form.
fresh_name() { echo "ubv$$"; }

# Hosts of runs whose script is gone (killed with SIGKILL, say, by a test's timeout: no trap
# runs then) are removed by the next run.
gc() {
  local d n
  for d in "$STATE_ROOT"/ubv*; do
    [ -d "$d" ] || continue
    n=${d##*/}
    kill -0 "${n#ubv}" 2>/dev/null || { echo "vhosts: removing $n (its run is gone)" >&2; down "$n"; }
  done
}

cmd=${1:-}
[ -n "$cmd" ] || { sed -n '2,35p' "$SELF"; exit 2; }
shift
case $cmd in
  check) check ;;
  up) [ $# -eq 2 ] || die "usage: up NAME HOSTS"
    name=$1
    trap '[ $? -eq 0 ] || down "$name"' EXIT  # a half-made set of hosts is removed
    up "$@" ;;
  down) [ $# -eq 1 ] || die "usage: down NAME"; down "$1" ;;
  exec) [ $# -ge 3 ] || die "usage: exec NAME HOST CMD..."; in_host "$@" ;;
  mpirun) [ $# -ge 2 ] || die "usage: mpirun NAME RANKS_PER_HOST ARGS..."; vmpirun "$@" ;;
  launch) [ $# -ge 3 ] || die "usage: launch NAME RANKS_PER_HOST CMD..."; launch "$@" ;;
  launch-host) [ $# -ge 4 ] || die "usage: launch-host NAME RANKS_PER_HOST HOST CMD..."; launch_host "$@" ;;
  run | shell)
    if [ "$cmd" = run ]; then
      [ $# -ge 3 ] || die "usage: run HOSTS RANKS_PER_HOST CMD..."
    else
      [ $# -ge 2 ] || die "usage: shell HOSTS CMD..."
    fi
    check >&2 || exit 77
    gc
    name=$(fresh_name)
    child=
    trap 'down "$name"' EXIT
    # The command runs in the background and this shell waits for it, so a signal runs the trap
    # at once (bash defers traps while a foreground child runs): the command is ended, then
    # everything is removed by the EXIT trap.
    trap '[ -n "$child" ] && kill -TERM "$child" 2>/dev/null; exit 130' INT TERM HUP
    up "$name" "$1"
    set +e
    if [ "$cmd" = run ]; then
      per_host=$2
      shift 2
      vmpirun "$name" "$per_host" "$@" &
    else
      shift
      UBEP_VHOSTS=$name UBEP_VHOSTS_SCRIPT=$SELF "$@" &
    fi
    child=$!
    wait "$child"
    rc=$?
    set -e
    exit $rc
    ;;
  gc) gc ;;
  link) [ $# -eq 3 ] || die "usage: link NAME HOST up|down"
    ip -n "$1-vh$2" link set eth0 "$3" ;;
  netem) [ $# -ge 3 ] || die "usage: netem NAME HOST ARGS...|off"
    name=$1 host=$2; shift 2
    if [ "$*" = off ]; then
      ip netns exec "$name-vh$host" tc qdisc del dev eth0 root 2>/dev/null || true
    else
      ip netns exec "$name-vh$host" tc qdisc replace dev eth0 root netem "$@" ||
        die "tc netem failed on vh$host (is sch_netem in this kernel? tc qdisc add dev lo root netem delay 1ms; without it, tests/vhosts/netem_calls.sh splices a user-space relay into a host's cable)"
    fi ;;
  kill-host) [ $# -ge 2 ] || die "usage: kill-host NAME HOST [SIGNAL]"; kill_host_pids "$@" ;;
  *) die "unknown command '$cmd' (check, up, down, exec, mpirun, launch, run, shell, gc, link, netem, kill-host)" ;;
esac
