#!/usr/bin/env bash
# usage: abthp.sh OUT RUNS bin [bench args...]: A = shmem THP never, B = force (same binary)
set -u
O=$1; RUNS=$2; BIN=$3; shift 3
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
S=/sys/kernel/mm/transparent_hugepage/shmem_enabled
trap 'echo never > $S' EXIT
mkdir -p $O
for i in $(seq 1 $RUNS); do for n in A B; do
  if [ $n = A ]; then echo never > $S; else echo force > $S; fi
  echo "== $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg) run $i $n $(cat $S)" >> $O/log
  mpirun -np 2 $BIN "$@" --quiet --json $O/$n-$i.json > $O/$n-$i.txt 2>&1
  grep -i shmemhuge /proc/meminfo >> $O/log
done; done
