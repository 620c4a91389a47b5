#!/usr/bin/env bash
# The CUDA backend's checks on a GPU machine, in one go (docs/CUDA.md). Writes everything under
# $OUT (default build-gpu/out): per-step logs, ptxas register/spill report, GPU test results, the
# 2-process CUDA IPC smoke test, compute-sanitizer memcheck and racecheck, the bench table
# (single-GPU loopback, thread ranks sharing one GPU: NOT NVLink) and summary.txt. Every step
# drives ubep::Buffer on a CUDA device (the one API; docs/CUDA.md). A failing step does not stop
# the others; the exit status is non-zero if any step failed. Budget: < 10 minutes on one H200
# (the step time limits add up to 580 s; expected total is well under). Placement: the GPU
# tests cover compact and per-source for both layouts (auto = per-source for latency); the
# per-source cases also run as a step of their own (gpu_persource: its PASS/FAIL is visible in
# the summary) and under memcheck; the bench times both placements and compact().
# Python (steps python_build, python_gpu): the package built for this machine's python3 (the
# one with torch, pybind11 and pytest) in the same build folder, then python/tests/test_gpu.py
# (device="cuda" Buffers on CUDA tensors, bit-identical to the NumPy reference and a CPU
# buffer); SKIPPED where that python3 lacks torch, pybind11, pytest or its headers. With them
# the step limits add up to 790 s (python_build 90, python_gpu 120); expected total is well
# under 10 minutes.
#
# Configures without Debian -dev packages: no MPI, no GoogleTest (the GPU tests are
# self-contained), no hwloc/OpenBLAS (optional), only CMake, a C++20 compiler and nvcc.
#   UBEP_CUDA_ARCH=90a (default: the local GPU's, else 90a)   UBEP_GPU_BUILD=build-gpu
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${UBEP_GPU_BUILD:-build-gpu}
OUT=${OUT:-$PWD/$BUILD/out}
mkdir -p "$OUT"
SUMMARY="$OUT/summary.txt"
: >"$SUMMARY"
failed=0
t_start=$(date +%s)

# step NAME TIMEOUT_S CMD...: runs CMD with a timeout, log in $OUT/NAME.log, status in summary.
step() {
  local name=$1 limit=$2
  shift 2
  local t0 rc
  t0=$(date +%s)
  echo "=== $name: $*" | tee "$OUT/$name.log"
  set +e
  timeout --kill-after=10 "$limit" "$@" >>"$OUT/$name.log" 2>&1
  rc=$?
  set -e
  local status=PASS
  if [ "$rc" = 77 ]; then status=SKIPPED; elif [ "$rc" = 124 ] || [ "$rc" = 137 ]; then status="TIMEOUT(${limit}s)"; elif [ "$rc" != 0 ]; then status="FAIL(rc=$rc)"; fi
  [ "$status" = PASS ] || [ "$status" = SKIPPED ] || failed=1
  printf '%-22s %-14s %4ss\n' "$name" "$status" "$(( $(date +%s) - t0 ))" | tee -a "$SUMMARY"
  tail -n 5 "$OUT/$name.log" | sed 's/^/    /'
}

{
  echo "ubep gpu_check $(date -u +%Y-%m-%dT%H:%M:%SZ) commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 || true
  nvcc --version 2>&1 | tail -n 2 || true
} | tee -a "$SUMMARY"

arch=${UBEP_CUDA_ARCH:-}
if [ -z "$arch" ]; then
  cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n1 | tr -d ' .' || true)
  case "$cc" in 90) arch=90a ;; "") arch=90a ;; *) arch=$cc ;; esac
fi
gen=()
command -v ninja >/dev/null && gen=(-G Ninja)
jobs=$(nproc)

# The Python package for the python3 on PATH (here the one holding torch); configured into the
# same build (PIC static libraries), built and tested after the C++ steps.
PY=$(command -v python3 || true)
py_cfg=(-DUBEP_WITH_PYTHON=OFF)
py_why="python3 not found"
if [ -n "$PY" ]; then
  if "$PY" -c "import torch, pybind11, pytest, numpy" >/dev/null 2>&1; then
    py_cfg=(-DUBEP_WITH_PYTHON=ON -DPython3_EXECUTABLE="$PY"
            -Dpybind11_DIR="$("$PY" -m pybind11 --cmakedir)")
  else
    py_why="$PY lacks one of torch, pybind11, pytest, numpy"
  fi
fi

step configure 45 cmake -S . -B "$BUILD" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DUBEP_WITH_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$arch" -DUBEP_WITH_MPI=OFF \
  -DUBEP_BUILD_TESTS=OFF -DUBEP_BUILD_TOOLS=OFF -DUBEP_WITH_EXTRAS=OFF -DUBEP_INSTALL=OFF \
  -DUBEP_BUILD_CUDA_TESTS=ON "${py_cfg[@]}"
step build 150 cmake --build "$BUILD" -j"$jobs" --target ubep ubep_cuda_gpu_tests \
  ubep_cuda_ipc_smoke ubep-cuda-bench
grep -E "Compiling entry|registers|spill" "$OUT/build.log" >"$OUT/ptxas_registers.txt" 2>/dev/null || true

T="$BUILD/tests/cuda"
step gpu_tests 90 "$T/ubep_cuda_gpu_tests"
step gpu_persource 30 "$T/ubep_cuda_gpu_tests" --filter "per-source placement"
step ipc_smoke 50 "$T/ubep_cuda_ipc_smoke"
step bench 75 "$BUILD/tools/cuda_bench/ubep-cuda-bench" --placement both --iters 50 --warmup 5 \
  --json "$OUT/bench.json"
cp "$OUT/bench.log" "$OUT/bench_table.txt" 2>/dev/null || true

# Python on the GPU: CUDA tensors through ubep.Buffer(device="cuda"). The configure step leaves
# the package out (a warning in configure.log) where pybind11 or the headers are not found: then
# there is no ubep_python target.
if [ "${py_cfg[0]}" = -DUBEP_WITH_PYTHON=ON ] &&
   cmake --build "$BUILD" --target help 2>/dev/null | grep -q "ubep_python"; then
  step python_build 90 cmake --build "$BUILD" -j"$jobs" --target ubep_python
  step python_gpu 120 env PYTHONPATH="$PWD/$BUILD/python" UBEP_BUILD_DIR="$PWD/$BUILD" \
    PYTHONUNBUFFERED=1 "$PY" -m pytest -q -rs -p no:cacheprovider python/tests/test_gpu.py
else
  [ "${py_cfg[0]}" = -DUBEP_WITH_PYTHON=ON ] &&
    py_why="pybind11 or the Python headers not found by CMake (see configure.log)"
  printf '%-22s %-14s %4ss  (%s)\n' python_gpu SKIPPED 0 "$py_why" | tee -a "$SUMMARY"
fi

if command -v compute-sanitizer >/dev/null; then
  # The sanitizers slow the kernels' spin-waits: a longer bound on every wait of a case.
  export UBEP_GPU_TEST_TIMEOUT_S=${UBEP_GPU_TEST_TIMEOUT_S:-30}
  step memcheck 60 compute-sanitizer --tool memcheck --error-exitcode 3 "$T/ubep_cuda_gpu_tests" --quick
  step memcheck_persource 30 compute-sanitizer --tool memcheck --error-exitcode 3 \
    "$T/ubep_cuda_gpu_tests" --quick --filter "per-source placement"
  step racecheck 50 compute-sanitizer --tool racecheck --error-exitcode 3 "$T/ubep_cuda_gpu_tests" --quick
  unset UBEP_GPU_TEST_TIMEOUT_S
else
  echo "compute-sanitizer        not found      (memcheck/racecheck not run)" | tee -a "$SUMMARY"
fi

echo "total $(( $(date +%s) - t_start ))s; bench: single-GPU loopback (thread ranks), not NVLink" | tee -a "$SUMMARY"
[ "$failed" = 0 ] && echo "gpu_check: all steps passed or skipped" | tee -a "$SUMMARY" || echo "gpu_check: SOME STEPS FAILED" | tee -a "$SUMMARY"
exit "$failed"
