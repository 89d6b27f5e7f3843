#!/usr/bin/env bash
# Formatting, lints and tests for the whole workspace; exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
command -v cargo >/dev/null 2>&1 || . "$HOME/.cargo/env"
if [ -f .tools/env.sh ]; then
  # shellcheck disable=SC1091
  . .tools/env.sh
fi
# One build from scratch (CI): incremental caches would only take disk.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
# Each traced command carries the seconds since the start (where CI's time goes).
export PS4='+ [${SECONDS}s] '
set -x
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --all-features -- -D warnings
# The runtime and the examples build without LLVM (feature `jit` off), and with HIP
# (libamdhip64).
cargo clippy -p tessera -p tessera-examples --all-targets --no-default-features -- -D warnings
cargo clippy -p tessera -p tessera-examples --all-targets --no-default-features --features hip -- -D warnings
# Documentation: every intra-doc link resolves.
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps -q \
  -p tessera -p tessera-ir -p tessera-codegen -p tessera-macros
# Every crate packages for crates.io (versions on the path dependencies, manifests and
# readmes that cargo accepts). The unpublished workspace crates are packaged together,
# each resolving the others locally (crates.io is still read for the rest); the
# `publish = false` ones (tessera-examples, tessera-tests) are packaged too.
# `--no-verify`: the builds are the steps above and below.
cargo package --workspace --no-verify --allow-dirty -q
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
# The test binaries test the CPU device's compiled code: a launch waits for LLVM
# (`TESSERA_CPU_JIT=wait`) instead of starting on the interpreter while it compiles
# (the default, which the examples below run with, and tests/cpu_first_launch.rs
# tests).
export TESSERA_CPU_JIT=wait
cargo test --workspace 2>&1 | tee "$log"
# The host's code at each x86-64 level this machine executes (the CPU device and the
# emulators JIT-compile for the host): results must not depend on the host's vector
# extensions, so the bit-exact and cross-backend suites run at each lower level
# (`native`, AVX512-BF16/FP16 where the host has them, is the workspace run's
# default: `TESSERA_CPU_TARGET` unset).
flags="$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null || true)"
has() { for f in "$@"; do grep -qw "$f" <<<"$flags" || return 1; done; }
levels=()
has sse4_2 popcnt ssse3 cx16 && levels+=(x86-64-v2)
has avx2 bmi1 bmi2 fma f16c movbe abm && levels+=(x86-64-v3)
has avx512f avx512bw avx512cd avx512dq avx512vl && levels+=(x86-64-v4)
echo "CPU levels: ${levels[*]} (host: $(grep -ow -e avx512_bf16 -e avx512_fp16 -e avx512f -e avx2 <<<"$flags" | sort -u | tr '\n' ' '))"
for lvl in "${levels[@]}"; do
  # (The newer AMD emulator flavours differ from emu-amd in their matrix
  # instructions only; the workspace run above took them at this host's level.)
  TESSERA_CPU_TARGET=$lvl TESSERA_TEST_MATRIX_FLAVORS=emu-sm90a \
    cargo test -p tessera-tests --test bit_math --test cross_backend \
    --test cpu_bounds 2>&1 | tee -a "$log"
done
# (The HIP backend is a default feature: the workspace run above covers its clean
# "unavailable" path and the fallback; the run below, without it, the build without.)
# Without `jit`: the runtime tests pass and a binary using it links no LLVM.
cargo test -p tessera --no-default-features --lib --test devices 2>&1 | tee -a "$log"
scripts/check-no-llvm.sh
unset TESSERA_CPU_JIT
# A missing CUDA driver is a clean error, not a panic.
if [ ! -e /dev/nvidiactl ]; then
  out="$(TESSERA_DEVICE=cuda cargo run -q -p tessera-examples --example vector_add 2>&1 || true)"
  grep -q "no CUDA driver found (libcuda.so could not be loaded)" <<<"$out"
fi
# A bad launch-watchdog setting is an error naming it; a good one changes nothing.
out="$(TESSERA_DEVICE=cpu TESSERA_LAUNCH_TIMEOUT=abc cargo run -q -p tessera-examples --example vector_add 2>&1 || true)"
grep -q 'TESSERA_LAUNCH_TIMEOUT=`abc`: expected a positive duration' <<<"$out"
TESSERA_DEVICE=emu-nv TESSERA_LAUNCH_TIMEOUT=600 cargo run -q -p tessera-examples --example checked_gather
# Every example checks its own results and exits non-zero on a mismatch.
for ex in vector_add softmax dropout argmax topk checked_gather matmul matmul_i8 matmul_fp8 matmul_mx matmul_desc layernorm layernorm_backward attention ping_pong interop; do
  TESSERA_DEVICE=cpu cargo run -q -p tessera-examples --example "$ex"
done
# The first-launch benchmark's driver checks its results too (scripts/first-launch.sh
# times it): each case on the CPU device and the interpreter, with a cache of its own.
fl_cache="$(mktemp -d)"
for c in rmsnorm argmax matmul; do
  for d in cpu interp; do
    TESSERA_CACHE_DIR="$fl_cache" cargo run -q -p tessera-examples --example first_launch -- --device "$d" --case "$c"
  done
done
rm -rf "$fl_cache"
# Communicating examples on CPU ranks (small sizes: debug build).
TESSERA_DEVICE=cpu cargo run -q -p tessera-examples --example ping_pong -- --ranks 4 --laps 100
TESSERA_DEVICE=cpu cargo run -q -p tessera-examples --example ag_gemm -- --ranks 3 --rows 40 --n 70 --k 50 --iters 1
TESSERA_DEVICE=cpu cargo run -q -p tessera-examples --example custom_collective -- --ranks 3 --n 700
TESSERA_DEVICE=cpu cargo run -q -p tessera-examples --example allreduce -- --ranks 3
TESSERA_DEVICE=cpu cargo run -q -p tessera-examples --example moe_all_to_all -- --ranks 3
TESSERA_DEVICE=cpu cargo run -q -p tessera-examples --example sp_attention -- --ranks 3 --seq 40 --heads 1 --iters 1
# The MPI transport: 4 ranks as an MPI job with shared memory disabled (every byte
# over TCP), each case compared bit-for-bit with the threads' transport ...
bash scripts/mpi-check.sh 4
# ... and with MPI's defaults: a node's ranks map each other's heaps.
bash scripts/mpi-check.sh 3 --shm
# ... and on 2 emulated nodes of 2 (heaps mapped within, TCP between): the suite
# with the hierarchical collectives, then the flat-against-hierarchical crossover
# table (in the debug build here: that it runs; the table that sets `Auto`'s
# threshold is the release build's, `bash scripts/mpi-check.sh 4 --nodes 2`).
MPI_CHECK_PROFILE=debug bash scripts/mpi-check.sh 4 --nodes 2
# ... and with a rank that stops (SIGSTOP): the others' operations on it fail within
# their wait timeout naming it, and their processes end.
bash scripts/mpi-check.sh 2 --stopped
# The same examples on the SIMT emulator (the real GPU lowering of the communication
# ops, both vendors' flavours), at their default sizes on 4 ranks.
for emu in emu-nv emu-amd; do
  TESSERA_DEVICE=$emu cargo run -q -p tessera-examples --example ag_gemm -- --ranks 4 --iters 1
  TESSERA_DEVICE=$emu cargo run -q -p tessera-examples --example custom_collective -- --ranks 4
  TESSERA_DEVICE=$emu cargo run -q -p tessera-examples --example allreduce -- --ranks 4 --iters 1
  TESSERA_DEVICE=$emu cargo run -q -p tessera-examples --example moe_all_to_all -- --ranks 4
  TESSERA_DEVICE=$emu cargo run -q -p tessera-examples --example ping_pong -- --ranks 4 --laps 20
  TESSERA_DEVICE=$emu cargo run -q -p tessera-examples --example sp_attention -- --ranks 4 --seq 64 --heads 1 --iters 1
done
# The single-device examples on the emulator too.
for ex in vector_add softmax dropout argmax topk checked_gather matmul matmul_i8 matmul_fp8 matmul_mx matmul_desc layernorm layernorm_backward attention interop; do
  TESSERA_DEVICE=emu-nv cargo run -q -p tessera-examples --example "$ex"
  TESSERA_DEVICE=emu-amd cargo run -q -p tessera-examples --example "$ex"
done
# The kernels with a `dot` on the Hopper flavour (wgmma from shared memory).
for ex in matmul matmul_i8 matmul_fp8 matmul_desc attention; do
  TESSERA_DEVICE=emu-sm90a cargo run -q -p tessera-examples --example "$ex"
done
# The matmul and attention examples' autotuned paths (what they run on a GPU at 4096
# tokens), small: every configuration timed, the winner checked, then (matmul) found
# in the cache.
tune_cache="$(mktemp -d)"
TESSERA_DEVICE=emu-nv TESSERA_CACHE_DIR="$tune_cache" cargo run -q -p tessera-examples --example matmul -- --tune 128
out="$(TESSERA_DEVICE=emu-nv TESSERA_CACHE_DIR="$tune_cache" cargo run -q -p tessera-examples --example matmul -- --tune 128)"
grep -q "(Disk," <<<"$out" || { echo "matmul --tune: the second run did not find the winner in the cache: $out" >&2; exit 1; }
TESSERA_DEVICE=emu-nv TESSERA_CACHE_DIR="$tune_cache" cargo run -q -p tessera-examples --example attention -- --tune 1 128
# The descriptor GEMM's sm_90a schedules (warp specialization, clusters, persistent).
TESSERA_DEVICE=emu-sm90a TESSERA_CACHE_DIR="$tune_cache" cargo run -q -p tessera-examples --example matmul_desc -- --tune 256
rm -rf "$tune_cache"
# The GPU check's own cases (bf16, f64, system-scope atomics, prefix sums) and its
# communication check as 2 processes (ping_pong, every all-reduce algorithm, the fused
# all-gather + GEMM), on both emulators (the real run is on a GPU, see README).
# Then 4 ranks as threads on parts of the one device (the one-GPU world), and the
# memory-model litmus tests on 2 of them.
for d in emu-nv emu-amd; do
  cargo run -q -p tessera-examples --example gpu_check -- --device "$d" --no-bench \
    --case bf16 --case f64 --case histogram --case cumsum --threads 4 --litmus-iters 300
done
# The one-device world's benchmark (all-reduce sweeps, fused vs unfused plans) runs
# end to end, at the small sizes it takes off a GPU.
cargo run -q -p tessera-examples --example gpu_check -- --device emu-nv --no-bench --no-comm \
  --no-suite --threads 2 --threads-bench --litmus-iters 50
# Compile-only: every example kernel for an NVIDIA and an AMD target.
aot_dir="$(mktemp -d)"
trap 'rm -f "$log"; rm -rf "$aot_dir"' EXIT
for t in sm_90 sm_90a gfx942; do
  cargo run -q -p tessera-examples --example aot -- --target "$t" --out "$aot_dir/$t"
done
# ... and through the Tile IR backend (NVIDIA's tileiras) for Hopper and consumer
# Blackwell (sm_100's, every example kernel, is tests/tileir.rs's; `--target sm_100`
# choosing that path is the aot example's own test).
for gpu in sm_90 sm_120; do
  cargo run -q -p tessera-examples --example aot -- --tileir "$gpu" --out "$aot_dir/tileir-$gpu"
done
set +x
# One closing line for the whole run, summed over every test binary.
awk '/^test result:/ { p += $4; f += $6 } END { printf "%d passed, %d failed\n", p, f }' "$log"
