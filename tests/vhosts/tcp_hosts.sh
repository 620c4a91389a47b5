#!/usr/bin/env bash
# Runs BIN with one launcher per host (ubep/tcp_group.hpp; issue 32): no MPI job spans the hosts.
#   tcp_hosts.sh vhosts HOSTS RANKS_PER_HOST BIN [ARGS...]    virtual hosts (scripts/vhosts.sh
#       launch: every host its own network, /dev/shm and hostname); exit 77 naming why when they
#       cannot be made here
#   tcp_hosts.sh loopback HOSTS RANKS_PER_HOST BIN [ARGS...]  HOSTS launchers on this machine,
#       joined on 127.0.0.1 (a free port; the doors of an elastic group at free ports too,
#       UBEP_DOOR_PORTS)
# BIN starts UBEP_RANKS_PER_HOST ranks itself (tests/vhosts/host_launcher.hpp). Exit status: the
# worst launcher's.
set -uo pipefail
where=$1 hosts=$2 per_host=$3
shift 3
vh=$(dirname "$(readlink -f "$0")")/../../scripts/vhosts.sh
case $where in
  vhosts)
    "$vh" check || exit 77
    exec "$vh" shell "$hosts" bash -c '"$UBEP_VHOSTS_SCRIPT" launch "$UBEP_VHOSTS" "$@"' _ \
      "$per_host" "$@" ;;
  loopback)
    # HOSTS distinct free ports, all held while probing: the rendezvous (host 0's door), then
    # every other host's door (UBEP_DOOR_PORTS: an elastic group's doors, not port + h, which
    # another socket of this machine may hold).
    ports=$(python3 -c 'import socket, sys
s = [socket.socket() for _ in range(int(sys.argv[1]))]
for x in s: x.bind(("127.0.0.1", 0))
print(",".join(str(x.getsockname()[1]) for x in s))' "$hosts")
    pids=()
    for ((h = 0; h < hosts; ++h)); do
      UBEP_RENDEZVOUS=127.0.0.1:${ports%%,*} UBEP_DOOR_PORTS=$ports UBEP_HOSTS=$hosts \
        UBEP_HOST_INDEX=$h UBEP_RANKS_PER_HOST=$per_host "$@" &
      pids+=($!)
    done
    trap 'kill -KILL "${pids[@]}" 2>/dev/null' EXIT INT TERM
    worst=0
    for p in "${pids[@]}"; do
      rc=0
      wait "$p" || rc=$?
      [ "$rc" -gt "$worst" ] && worst=$rc
    done
    exit "$worst" ;;
  *) echo "tcp_hosts.sh: where must be vhosts or loopback, not '$where'" >&2; exit 2 ;;
esac
