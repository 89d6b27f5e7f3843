#!/usr/bin/env bash
# Sets up the machine (idempotent) and runs the main demo: a fused all-gather + GEMM on
# 4 ranks (threads) of the best device present that can host them: the CPU, or the
# SIMT emulator with TESSERA_DEVICE=emu-nv|emu-amd (GPU ranks need one GPU per rank and
# have not run on hardware yet, so a GPU machine runs CPU ranks). Extra arguments go
# to the example (e.g. --ranks 8 --rows 128 --n 256 --k 256).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
command -v cargo >/dev/null 2>&1 || . "$HOME/.cargo/env"
. .tools/env.sh
cargo run --release --example ag_gemm -- --ranks 4 "$@"
