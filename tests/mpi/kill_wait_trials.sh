#!/usr/bin/env bash
# Kill-during-wait trials (issue 29; docs/ELASTIC.md, "Measured"): runs test_mpi_kill_wait.sh
# TRIALS times per kind of wait and launch, and prints the time from the kill to each survivor's
# named error (min / median / max over all survivors), or the failure.
# Usage: kill_wait_trials.sh <build dir> [trials] [launch...]   (launch as test_mpi_kill_wait.sh;
#        default: local:3 forced:4:2 vhosts:2:2)
set -uo pipefail
build=$1 trials=${2:-5}
shift $(($# >= 2 ? 2 : 1))
launches=("$@")
[ ${#launches[@]} -gt 0 ] || launches=(local:3 forced:4:2 vhosts:2:2)
here=$(cd "$(dirname "$0")" && pwd)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
for launch in "${launches[@]}"; do
  for mode in barrier allgather setup; do
    ms=() fails=0
    for ((i = 0; i < trials; ++i)); do
      out=$("$here/test_mpi_kill_wait.sh" "$(command -v mpiexec)" "$build/tests/mpi/test_mpi_kill_wait" \
            "$mode" "$launch" 2>/dev/null)
      rc=$?
      [ $rc -eq 77 ] && { echo "$launch $mode: skipped ($(echo "$out" | tail -1))"; continue 2; }
      [ $rc -eq 0 ] || { fails=$((fails + 1)); echo "$out" | grep FAIL; }
      while read -r v; do ms+=("$v"); done < <(echo "$out" | sed -n 's/^survivor [0-9]*: PeerFailedError \([0-9.]*\) ms.*/\1/p')
    done
    printf '%s\n' "${ms[@]}" | sort -n | awk -v l="$launch" -v m="$mode" -v t="$trials" -v f="$fails" '
      { v[NR] = $1 } END { if (NR == 0) { print l, m, "no data"; exit }
        printf "%-11s %-9s trials %d (failed %d), survivors %d: kill -> named error min %.1f median %.1f max %.1f ms\n",
               l, m, t, f, NR, v[1], v[int((NR + 1) / 2)], v[NR] }'
  done
done
