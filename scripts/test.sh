#!/usr/bin/env bash
# Builds and runs every test: the unit and thread-rank suites, the multi-process suites under
# mpirun (2 and 4 processes), then the concurrency suites again under ThreadSanitizer.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
jobs=$(nproc)

cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$jobs"
(cd build && ctest --output-on-failure -j"$jobs")

if [ "${UBEP_SKIP_TSAN:-0}" != 1 ]; then
  cmake -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DUBEP_SANITIZE=thread \
        -DUBEP_BUILD_TOOLS=OFF -DUBEP_WITH_MPI=OFF >/dev/null
  cmake --build build-tsan -j"$jobs"
  (cd build-tsan && TSAN_OPTIONS=halt_on_error=1 ctest --output-on-failure -j"$jobs")
fi
echo "all tests passed"
