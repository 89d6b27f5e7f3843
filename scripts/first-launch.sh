#!/usr/bin/env bash
# A kernel's first launch in a fresh process on the compiled CPU device against the
# interpreter (examples/first_launch.rs: tracing, compiling or loading, running and
# nothing else timed), each case in RUNS processes per device, alternating:
#   - cpu, cached: the compiled code is in the disk cache (a second process)
#   - cpu, cold:   an empty cache (LLVM compiles the kernel in the launch)
#   - interp:      the reference interpreter
# Prints the medians and the ratios against the interpreter in the same run.
#   scripts/first-launch.sh [RUNS]   (default 9)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
command -v cargo >/dev/null 2>&1 || . "$HOME/.cargo/env"
# shellcheck disable=SC1091
[ -f .tools/env.sh ] && . .tools/env.sh
RUNS="${1:-9}"
cargo build -q --release -p tessera-examples --example first_launch
bin=target/release/examples/first_launch
cache="$(mktemp -d)"
trap 'rm -rf "$cache"' EXIT
ms() { sed -n 's/.*first_ms=\([0-9.]*\).*/\1/p'; }
median() { sort -g | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }
printf '%-8s %12s %12s %12s %14s %14s\n' case interp_ms cpu_cached cpu_cold cached/interp cold/interp
for case in rmsnorm argmax matmul; do
  : >"$cache/i"; : >"$cache/c"; : >"$cache/k"
  for _ in $(seq "$RUNS"); do
    rm -rf "$cache/d"
    TESSERA_CACHE_DIR="$cache/d" "$bin" --device cpu --case "$case" | ms >>"$cache/k"
    TESSERA_CACHE_DIR="$cache/d" "$bin" --device interp --case "$case" | ms >>"$cache/i"
    out="$(TESSERA_CACHE_DIR="$cache/d" "$bin" --device cpu --case "$case")"
    case "$out" in
      *cpu_compilations=0*) ;;
      *) echo "first-launch: the second process compiled again: $out" >&2; exit 1 ;;
    esac
    echo "$out" | ms >>"$cache/c"
  done
  i="$(median <"$cache/i")"; c="$(median <"$cache/c")"; k="$(median <"$cache/k")"
  printf '%-8s %12s %12s %12s %14s %14s\n' "$case" "$i" "$c" "$k" \
    "$(awk -v a="$c" -v b="$i" 'BEGIN {printf "%.2fx", a / b}')" \
    "$(awk -v a="$k" -v b="$i" 'BEGIN {printf "%.2fx", a / b}')"
done
