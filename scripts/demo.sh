#!/usr/bin/env bash
# Sets up the machine (idempotent) and runs the main demo: a fused all-gather + GEMM on
# 4 ranks of the best device present (TESSERA_DEVICE overrides; CPU ranks when there is
# no GPU, and while communicating kernels do not run on GPUs yet). Extra arguments go
# to the example (e.g. --ranks 8 --rows 128 --n 256 --k 256).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
command -v cargo >/dev/null 2>&1 || . "$HOME/.cargo/env"
. .tools/env.sh
cargo run --release --example ag_gemm -- --ranks 4 "$@"
