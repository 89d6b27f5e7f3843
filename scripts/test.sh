#!/usr/bin/env bash
# Formatting, lints and tests for the whole workspace; exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if [ -f .tools/env.sh ]; then
  # shellcheck disable=SC1091
  . .tools/env.sh
fi
set -x
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
cargo test --workspace
