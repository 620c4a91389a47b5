#!/usr/bin/env bash
# The main job: build, then one decode-sized MoE step on in-process ranks, checked against the
# reference, followed by the comparison table (MPI-style baseline, bsp, ubep, copy bound).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)" --target ubep-demo
exec build/tools/ubep-demo "${@:-4}"
