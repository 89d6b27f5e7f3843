#!/usr/bin/env bash
# The runtime without the `jit` feature links no LLVM: builds a binary that uses it
# (examples/gpu_check.rs, `--no-default-features`) and checks its dynamic section.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
profile="${1:-debug}"
flag=()
[ "$profile" = release ] && flag=(--release)
cargo build -q "${flag[@]}" -p tessera-examples --no-default-features --example gpu_check
bin="${CARGO_TARGET_DIR:-target}/$profile/examples/gpu_check"
needed="$(readelf -d "$bin" | grep NEEDED || true)"
if grep -qi llvm <<<"$needed" || ldd "$bin" | grep -qi llvm; then
  echo "FAIL: $bin links LLVM:" >&2
  echo "$needed" >&2
  exit 1
fi
if nm -D --undefined-only "$bin" 2>/dev/null | grep -q 'LLVM'; then
  echo "FAIL: $bin references LLVM symbols" >&2
  exit 1
fi
echo "ok: $bin links no LLVM ($(grep -c NEEDED <<<"$needed") libraries: $(sed -E 's/.*\[(.*)\]/\1/' <<<"$needed" | tr '\n' ' '))"
