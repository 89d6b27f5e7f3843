#!/usr/bin/env bash
# The GPU check, prepared here and run on a GPU machine that has a driver, PyTorch
# and Triton but no Rust and no LLVM.
#
#   scripts/gpu-check.sh [--dry-run] [--target sm_90a]
#
# 1. builds examples/gpu_check.rs in release WITHOUT LLVM (`--no-default-features`)
#    and checks that it links no libLLVM;
# 2. precompiles every example kernel for the target with the `aot` example into an
#    artifact store (needs the SIMT lowering; without it this step says so and the
#    rest still runs: the GPU run then reports the kernels missing);
# 3. packs the binary, the kernels, scripts/gpu_bench.py and run.sh into
#    target/gpu-check/ (git-ignored, so pass it in the device tool's `carry`), checks
#    it is under 64 MiB, and checks the pack here: the artifacts are found for the
#    target, and TESSERA_DEVICE=cuda fails cleanly when there is no driver;
# 4. prints the one `run` call to make on the GPU machine. Without --dry-run, when
#    this machine has an NVIDIA GPU, it also runs the pack here.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
command -v cargo >/dev/null 2>&1 || . "$HOME/.cargo/env"
if [ -f .tools/env.sh ]; then
  # shellcheck disable=SC1091
  . .tools/env.sh
fi
dry_run=0
target=sm_90a  # an H200 (compute capability 9.0) runs sm_90a code
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) dry_run=1 ;;
    --target) target="$2"; shift ;;
    *) echo "usage: $0 [--dry-run] [--target sm_90a]" >&2; exit 2 ;;
  esac
  shift
done
tdir="${CARGO_TARGET_DIR:-target}"
pack=target/gpu-check
limit=$((64 * 1024 * 1024))

echo "== 1. gpu_check, release, no LLVM"
cargo build -q --release -p tessera-examples --no-default-features --example gpu_check
bin="$tdir/release/examples/gpu_check"
if readelf -d "$bin" | grep -i 'NEEDED.*llvm'; then
  echo "FAIL: $bin links LLVM" >&2
  exit 1
fi
echo "ok: $(readelf -d "$bin" | grep -c NEEDED) shared libraries, none of them LLVM"

rm -rf "$pack"
mkdir -p "$pack/kernels"
echo "== 2. precompile the example kernels for $target"
aot_log="$(mktemp)"
trap 'rm -f "$aot_log"' EXIT
if cargo run -q --release -p tessera-examples --example aot -- \
    --target "$target" --out "$pack/aot-$target" --store "$pack/kernels" >"$aot_log" 2>&1; then
  cat "$aot_log"
  lowering=1
else
  lowering=0
  sed 's/^/  /' "$aot_log" | tail -8
  echo "NOTE: precompilation failed: the SIMT lowering (codegen/src/lower) is not in" \
       "this branch yet, so the pack has no kernels; the GPU run will report each one" \
       "missing. Everything else is packed."
fi
rm -rf "$pack/aot-$target"

echo "== 3. pack into $pack"
cp "$bin" "$pack/gpu_check"
strip "$pack/gpu_check" 2>/dev/null || true
cp scripts/gpu_bench.py "$pack/"
cat >"$pack/run.sh" <<'EOF'
#!/usr/bin/env bash
# Runs on the GPU machine: bash run.sh [OUT_DIR]   (default: ./report)
# Every step has its own time limit (the whole run stays under the device tool's 10
# minutes); each step's log, the JSON report (ours.json) and steps.txt (one line per
# step with its exit status) go into OUT_DIR, whatever fails.
out="$(realpath -m "${1:-report}")"
cd "$(dirname "${BASH_SOURCE[0]}")"
mkdir -p "$out"
status=0
step() { # name limit_seconds command...
  local name=$1 secs=$2
  shift 2
  echo "== $name (limit ${secs} s)"
  timeout --kill-after=10 "$secs" "$@" >"$out/$name.log" 2>&1
  local rc=$?
  tail -n 60 "$out/$name.log"
  [ "$rc" = 124 ] && echo "$name: TIMED OUT after $secs s"
  echo "$name: exit $rc" | tee -a "$out/steps.txt"
  [ "$rc" = 0 ] || status=1
}
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >"$out/gpu.txt" 2>&1
fi
cat "$out/gpu.txt" 2>/dev/null || echo "no nvidia-smi"
dev="${TESSERA_DEVICE:-cuda:0}"
step suite 150 ./gpu_check --kernels kernels --device "$dev" --json "$out/ours.json"
step baselines 110 python3 gpu_bench.py --ours "$out/ours.json"
if command -v compute-sanitizer >/dev/null 2>&1; then
  # Out-of-bounds and misaligned accesses of every example kernel (no benchmarks, no
  # processes: the sanitizer watches this one). Last: it is the slowest step.
  step memcheck 130 compute-sanitizer --tool memcheck --error-exitcode 3 \
    ./gpu_check --kernels kernels --device "$dev" --no-bench --no-comm
else
  echo "memcheck: skipped (no compute-sanitizer on this machine)" | tee -a "$out/steps.txt"
fi
exit $status
EOF
chmod +x "$pack/run.sh" "$pack/gpu_check"
size=$(du -sb "$pack" | cut -f1)
echo "pack: $(find "$pack" -type f | wc -l) files, $((size / 1024)) KiB"
if [ "$size" -ge "$limit" ]; then
  echo "FAIL: $pack is $size bytes, over the 64 MiB the device tool carries" >&2
  exit 1
fi

echo "== check the pack here (no GPU needed)"
if "$pack/gpu_check" --kernels "$pack/kernels" --target "$target" --check-artifacts; then
  echo "ok: every kernel is in the pack for $target"
elif [ "$lowering" = 1 ]; then
  echo "FAIL: precompiled kernels are missing from the pack" >&2
  exit 1
else
  echo "(expected without the lowering)"
fi
if [ ! -e /dev/nvidiactl ]; then
  set +e
  msg="$(TESSERA_DEVICE=cuda "$pack/gpu_check" --kernels "$pack/kernels" 2>&1)"
  rc=$?
  set -e
  echo "TESSERA_DEVICE=cuda here: exit $rc: $msg"
  if [ "$rc" != 2 ] || ! grep -q "no CUDA driver found" <<<"$msg"; then
    echo "FAIL: expected a clean 'no CUDA driver found' error" >&2
    exit 1
  fi
fi

echo
echo "== on the GPU machine, make this one device-tool call:"
echo "run(command=\"bash $pack/run.sh \\\"\$OUT\\\"\", carry=[\"$pack\"], timeout_s=600)"
echo "(the report, every step's log and steps.txt come back as the call's files)"
if [ "$dry_run" = 0 ] && [ -e /dev/nvidiactl ]; then
  bash "$pack/run.sh" target/gpu-check-report
fi
