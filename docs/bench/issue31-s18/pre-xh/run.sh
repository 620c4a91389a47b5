#!/bin/bash
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
for i in 1 2 3; do for v in xh-16 xh-64 xh-256 xh-1024; do
  echo "== $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg) run $i $v" >> log
  mpirun -np 2 /work/wt/bin/$v --workload prefill --algo ubep --dtype fp8 --iters 20 --quiet --json $v-$i.json > $v-$i.txt 2>&1
done; done
