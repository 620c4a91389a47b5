#!/usr/bin/env bash
# usage: rr.sh OUT ROUNDS "bin1 bin2 ..." [bench args]: round-robin over binaries
set -u
O=$1; N=$2; BINS=$3; shift 3
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
mkdir -p $O
for i in $(seq 1 $N); do for b in $BINS; do n=$(basename $b)
  echo "== $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg) run $i $n" >> $O/log
  flock /work/wt/notes/bench.lock mpirun -np 2 $b "$@" --quiet --json $O/$n-$i.json > $O/$n-$i.txt 2>&1
done; done
