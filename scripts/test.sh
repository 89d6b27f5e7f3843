#!/usr/bin/env bash
# Formatting, lints and tests for the whole workspace; exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
command -v cargo >/dev/null 2>&1 || . "$HOME/.cargo/env"
if [ -f .tools/env.sh ]; then
  # shellcheck disable=SC1091
  . .tools/env.sh
fi
set -x
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
cargo test --workspace
# Every example checks its own results and exits non-zero on a mismatch.
for ex in vector_add softmax matmul layernorm; do
  TESSERA_DEVICE=cpu cargo run -q -p tessera --example "$ex"
done
