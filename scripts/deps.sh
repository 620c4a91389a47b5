#!/usr/bin/env bash
# Installs the Debian 12 packages ubep builds and tests with, if any is missing (run as root).
set -euo pipefail
packages=(build-essential cmake ninja-build pkg-config libgtest-dev libgmock-dev
          openmpi-bin libopenmpi-dev libhwloc-dev libopenblas-dev python3 python3-numpy
          clang libclang-rt-14-dev  # the libFuzzer target (docs/FUZZING.md)
          python3-matplotlib  # matplotlib: the plots of bench_report.sh and sim/plot.py
          pybind11-dev python3-pybind11 python3-dev python3-torch python3-pytest python3-mpi4py
          python3-venv  # scripts/venv.sh: PyPI packages go into venvs, never the system Python
          libsimgrid-dev)  # SimGrid: the oracle of ubep-sim's network model (tests/sim)
missing=()
for p in "${packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
