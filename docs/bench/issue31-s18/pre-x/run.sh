#!/bin/bash
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
for i in 1 2 3; do for v in base x18-1 x18-2 x18-3 x18-4; do
  b=/work/wt/bin/$v; [ $v = base ] && b=/work/wt/bin/bench-s18base
  echo "== $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg) run $i $v" >> log
  mpirun -np 2 $b --workload prefill --algo ubep --dtype fp8 --iters 20 --quiet --json $v-$i.json > $v-$i.txt 2>&1
done; done
