#!/usr/bin/env bash
# Builds and runs every test: the unit and thread-rank suites, the multi-process suites under
# mpirun (2 and 4 processes, and 2 forced hosts over TCP), the Python package's pytest suite
# (ctest "python"), then the thread-rank suites again under ThreadSanitizer and AddressSanitizer
# (without the Python package).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
jobs=$(nproc)

cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$jobs"
(cd build && ctest --output-on-failure -j"$jobs")

# The same suites (thread ranks, including the cross-host relay over the in-process transport)
# under ThreadSanitizer and AddressSanitizer. UBEP_SKIP_SANITIZERS=1 skips them.
if [ "${UBEP_SKIP_SANITIZERS:-0}" != 1 ]; then
  for san in thread address; do
    cmake -S . -B "build-$san" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DUBEP_SANITIZE=$san \
          -DUBEP_BUILD_TOOLS=OFF -DUBEP_WITH_MPI=OFF -DUBEP_WITH_PYTHON=OFF -DUBEP_WITH_CUDA=OFF >/dev/null
    cmake --build "build-$san" -j"$jobs"
    (cd "build-$san" && TSAN_OPTIONS=halt_on_error=1 ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure -j"$jobs")
  done
fi
echo "all tests passed"
