#!/bin/bash
# pyab.sh OUT ROUNDS WORKLOAD ITERS "DIR1 DIR2": python3 -m ubep.bench alternated between builds
out=$1; rounds=$2; wl=$3; iters=$4; dirs=$5
mkdir -p $out
for i in $(seq 1 $rounds); do
  for d in $dirs; do
    n=$(basename $(dirname $d))
    PYTHONPATH=$d/python ${PY:-/usr/bin/python3} -m ubep.bench --workload $wl --algo ${ALGO:-ubep,deep_ep} --no-ubep-bench --iters $iters ${EXTRA} --json $out/$n-$i.json > $out/$n-$i.txt 2>&1
  done
done
