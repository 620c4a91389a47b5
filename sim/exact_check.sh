#!/bin/bash
# Compares two ubep-sim binaries on bench cases: every count and the finish trace
# (Network::trace) must match, i.e. the same flows finished at the same times to the bit.
# usage: sim/exact_check.sh OLD_BIN NEW_BIN [big]   (big adds the 768- and 8,192-die cases)
# Runs on one core (CORE, default 1) at the lowest priority; exit 1 if any case differs.
# NO_EVENTS=1 leaves the event counts out (a change that drops events without changing a time,
# e.g. sim28g's receive pools; bench's "finish" hash then checks every rank's finish time).
A=$1
B=$2
cases=(
  "--preset cm384 --ranks 64 --batch 256 --resolve-ns 0"
  "--preset cm384 --ranks 32 --batch 64 --hot 8 --resolve-ns 0"
  "--preset cm384 --ranks 256 --batch 128 --resolve-ns 10"
  "--preset cm384 --ranks 256 --batch 128 --resolve-ns 100"
  "--preset cm384 --ranks 128 --batch 32 --hot 8 --hot-weight 8 --resolve-ns 10"
  "--preset ubmesh8k --ranks 1024 --batch 8 --experts 1024 --resolve-ns 10"
  "--preset docs/sim/pod-example.json --ranks 64 --batch 64 --resolve-ns 0"
)
[ "$3" = big ] && cases+=(
  "--preset cm384 --ranks 768 --batch 128 --experts 768 --resolve-ns 10"
  "--preset ubmesh8k --ranks 8192 --batch 8 --experts 8192 --resolve-ns 10")
run() { nice -n 19 taskset -c "${CORE:-1}" "$1" bench $2 --repeats 1 --quiet 2>&1 | grep -v '^#' |
  sed 's/: [0-9.]* s CPU.*GiB;/:/' | if [ -n "$NO_EVENTS" ]; then sed 's/, [0-9]* events,/,/'; else cat; fi; }
rc=0
for c in "${cases[@]}"; do
  a=$(run "$A" "$c")
  b=$(run "$B" "$c")
  if [ "$a" == "$b" ]; then
    echo "SAME $c"
  else
    echo "DIFF $c"
    diff <(echo "$a") <(echo "$b")
    rc=1
  fi
done
exit $rc
