#!/usr/bin/env bash
# Tessera vs Triton, compile-only (no GPU needed): sets up .tools/triton-venv with
# triton==3.9.0, makes sure ptxas/cuobjdump/nvdisasm (.tools/bin) and llvm-objdump-22
# are there, then runs compare.py with the given arguments.
# Usage: bash benches/vs_triton/run.sh [--update-benchmarks] [--reps N] [--skip-ours]
#        bash benches/vs_triton/run.sh --loops   # the matmul main-loop table (loop_table.py)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
TOOLS="$ROOT/.tools"
VENV="$TOOLS/triton-venv"
TRITON_VERSION="${TRITON_VERSION:-3.9.0}"
log() { echo "[vs_triton] $*" >&2; }

# ptxas & co from PyPI (scripts/setup.sh puts them in .tools/bin).
if [ ! -x "$TOOLS/bin/ptxas" ] || [ ! -x "$TOOLS/bin/cuobjdump" ] || [ ! -x "$TOOLS/bin/nvdisasm" ]; then
  log "ptxas/cuobjdump/nvdisasm missing: bash scripts/setup.sh --no-llvm"
  bash "$ROOT/scripts/setup.sh" --no-llvm
fi
[ -f "$TOOLS/env.sh" ] && . "$TOOLS/env.sh"
export PATH="$TOOLS/bin:/usr/lib/llvm-22/bin:$PATH"
command -v llvm-objdump-22 >/dev/null 2>&1 || command -v llvm-objdump >/dev/null 2>&1 || {
  echo "run.sh: llvm-objdump-22 not found (bash scripts/setup.sh installs LLVM 22)" >&2; exit 1; }

# Triton in its own project-local venv (the wheel is ~290 MB, ~1.1 GB installed).
venv_ok() {
  "$VENV/bin/python" -c "import triton, sys; sys.exit(triton.__version__ != '$TRITON_VERSION')" 2>/dev/null
}
if ! venv_ok; then
  t0=$(date +%s)
  log "installing triton==$TRITON_VERSION into $VENV"
  rm -rf "$VENV"
  "${PYTHON:-python3}" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check "triton==$TRITON_VERSION"
  venv_ok || { echo "run.sh: triton $TRITON_VERSION did not install" >&2; exit 1; }
  log "triton installed in $(( $(date +%s) - t0 ))s ($(du -sh "$VENV" | cut -f1))"
fi

if [ "${1:-}" = "--loops" ]; then
  # The matmul main loop per unit of matrix work (loop_table.py).
  exec "$VENV/bin/python" "$ROOT/benches/vs_triton/loop_table.py"
fi
exec "$VENV/bin/python" "$ROOT/benches/vs_triton/compare.py" "$@"
