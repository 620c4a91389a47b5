#!/usr/bin/env bash
cd /work/wt/sim28b
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
o=/tmp/30h/pin
{ date -u; uptime; cat /proc/pressure/cpu; } > $o/before
for i in 1 2; do
  /usr/bin/time -f "%e s" timeout 200 build/sim/ubep-sim calibrate --out $o/cal_$i.json > $o/cal_$i.txt 2>&1
  timeout 100 mpirun -np 2 build/tools/ubep-bench --workload decode --algo bsp,ubep --quiet --json $o/decode_$i.json > /dev/null 2>&1
done
{ date -u; uptime; cat /proc/pressure/cpu; } > $o/after
