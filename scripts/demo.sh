#!/usr/bin/env bash
# Sets up the machine (idempotent) and runs the main demo on the best device present
# (TESSERA_DEVICE overrides; the CPU when there is no GPU).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
command -v cargo >/dev/null 2>&1 || . "$HOME/.cargo/env"
. .tools/env.sh
cargo run --release --example ag_gemm -- --ranks 4 "$@"
