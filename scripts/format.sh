#!/usr/bin/env bash
# Formats the C++ sources with the checked-in .clang-format; --check only reports.
set -euo pipefail
cd "$(dirname "$0")/.."
files=$(git ls-files '*.cpp' '*.hpp' '*.h' '*.inl')
if [ "${1:-}" = --check ]; then
  clang-format --dry-run --Werror $files
else
  clang-format -i $files
fi
