#!/usr/bin/env bash
# Sets up the machine (idempotent) and runs the main demo: a fused all-gather + GEMM on
# 4 ranks (threads) of the best device present: one GPU per rank where the machine has
# 4 GPUs, else the 4 ranks on parts of one GPU (each its own stream and SMs; the
# output says so), else the CPU (TESSERA_DEVICE=cpu|emu-nv|emu-amd chooses). Extra
# arguments go to the example (e.g. --ranks 8 --rows 128 --n 256 --k 256).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
command -v cargo >/dev/null 2>&1 || . "$HOME/.cargo/env"
. .tools/env.sh
cargo run --release --example ag_gemm -- --ranks 4 "$@"
