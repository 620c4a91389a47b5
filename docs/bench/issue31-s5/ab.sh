#!/usr/bin/env bash
# usage: ab.sh OUT RUNS binA binB [bench args...]
set -u
O=$1; RUNS=$2; A=$3; B=$4; shift 4
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
mkdir -p $O
for i in $(seq 1 $RUNS); do for n in A B; do b=$A; [ $n = B ] && b=$B
  echo "== $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg) run $i $n" >> $O/log
  flock /work/wt/notes/bench.lock mpirun -np 2 $b "$@" --quiet --json $O/$n-$i.json > $O/$n-$i.txt 2>&1
done; done
python3 - $O <<'PY'
import json,glob,sys,statistics as st,collections
O=sys.argv[1]; rat=collections.defaultdict(list); us=collections.defaultdict(list)
for f in sorted(glob.glob(O+'/[AB]-*.json')):
    n=f.split('/')[-1][0]; res=json.load(open(f))['results']
    for r in res:
        k=(n,r['dtype'],r['impl'],r['op']); us[k].append(r['median_us']); rat[k].append(r.get('x_bound',0))
for k in sorted(us):
    if k[2] in ('ubep','bsp'):
        print(k, 'us med %.1f'%st.median(us[k]), 'x_bound med %.3f [%.3f-%.3f]'%(st.median(rat[k]),min(rat[k]),max(rat[k])), 'n=%d'%len(us[k]))
PY
