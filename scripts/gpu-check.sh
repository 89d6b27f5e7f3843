#!/usr/bin/env bash
# The GPU check, prepared here and run on a GPU machine that has a driver, PyTorch
# and Triton but no Rust and no LLVM. One pack per vendor:
#
#   scripts/gpu-check.sh [--dry-run [--quick]] [--vendor nvidia|amd|both]
#
#   nvidia: target/gpu-check/      kernels for sm_90a (an H100/H200), device cuda:0,
#                                  and the same through Tile IR (cubins for sm_90)
#   amd:    target/gpu-check-amd/  kernels for gfx942 (MI300), gfx90a (MI200),
#                                  gfx950 (MI350), gfx1200 (RDNA4),
#                                  device hip:0, built with the `hip` feature
#
# For each pack:
# 1. builds examples/gpu_check.rs in release WITHOUT LLVM (`--no-default-features`)
#    and checks that it links no libLLVM, and no vendor library (libcuda and
#    libamdhip64 are loaded at run time);
# 2. precompiles every example kernel for the pack's targets with the `aot` example
#    into an artifact store;
# 3. packs the binary, the kernels (compressed), scripts/gpu_bench.py and run.sh
#    (git-ignored, so pass the folder in the device tool's `carry`), checks it is
#    under 64 MiB, and
#    checks the pack here: the artifacts are found for every target, and the device
#    fails cleanly when there is no driver;
# 4. prints the one `run` call to make on the GPU machine. Without --dry-run, when
#    this machine has the vendor's GPU, it also runs the pack here.
#
# --dry-run checks both packs unless --vendor says otherwise; without it, the default
# is nvidia.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
command -v cargo >/dev/null 2>&1 || . "$HOME/.cargo/env"
if [ -f .tools/env.sh ]; then
  # shellcheck disable=SC1091
  . .tools/env.sh
fi
dry_run=0
quick=0
vendor=""
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) dry_run=1 ;;
    # CI's dry run (with --dry-run): each pack for its first target only, and no
    # Tile IR precompile. The rest is what test.sh and the tests compile already
    # (every example kernel for every target in tests/codegen_offline.rs, through
    # Tile IR in tests/tileir.rs and test.sh's aot runs); the packs themselves,
    # their run scripts and checks are what this covers.
    --quick) quick=1 ;;
    --vendor) vendor="${2:-}"; shift ;;
    *) echo "usage: $0 [--dry-run [--quick]] [--vendor nvidia|amd|both]" >&2; exit 2 ;;
  esac
  shift
done
if [ "$quick" = 1 ] && [ "$dry_run" = 0 ]; then
  echo "gpu-check: --quick is for --dry-run (a pack to run holds every target)" >&2
  exit 2
fi
if [ -z "$vendor" ]; then
  if [ "$dry_run" = 1 ]; then vendor=both; else vendor=nvidia; fi
fi
case "$vendor" in
  nvidia|amd|both) ;;
  *) echo "gpu-check: --vendor must be nvidia, amd or both, not '$vendor'" >&2; exit 2 ;;
esac
tdir="${CARGO_TARGET_DIR:-target}"
limit=$((64 * 1024 * 1024))
aot_log="$(mktemp)"
trap 'rm -f "$aot_log"' EXIT

# pack VENDOR: builds, packs and checks one vendor's pack (see the top).
pack_vendor() {
local vendor=$1 pack targets features dev_env dev no_driver
if [ "$vendor" = nvidia ]; then
  pack=target/gpu-check
  targets="sm_90a"  # an H200 (compute capability 9.0) runs sm_90a code
  features=""
  dev=cuda:0
  dev_env=cuda
  no_driver="no CUDA driver found"
else
  pack=target/gpu-check-amd
  # MI300X/MI300A, MI200, MI350X/MI355X, RX 9070 XT (RDNA4)
  targets="gfx942 gfx90a gfx950 gfx1200"
  features="--features hip"
  dev=hip:0
  dev_env=hip
  # Where a HIP runtime is installed without a GPU (some build machines), it is
  # loaded and says there is no device.
  no_driver="no HIP (runtime|device) found"
fi
if [ "$quick" = 1 ]; then
  targets="${targets%% *}"
fi

echo "== [$vendor] 1. gpu_check, release, no LLVM (${SECONDS}s)"
# shellcheck disable=SC2086  # $features is empty or two words
cargo build -q --release -p tessera-examples --no-default-features $features --example gpu_check
bin="$tdir/release/examples/gpu_check"
if readelf -d "$bin" | grep -iE 'NEEDED.*(llvm|libcuda|amdhip)'; then
  echo "FAIL: $bin links LLVM or a vendor library (they must be loaded at run time)" >&2
  exit 1
fi
echo "ok: $(readelf -d "$bin" | grep -c NEEDED) shared libraries, none of them LLVM, CUDA or HIP"
rm -rf "$pack"
mkdir -p "$pack/kernels"
cp "$bin" "$pack/gpu_check"

# The NVSHMEM world's kernels (linked with NVSHMEM's device library) where the
# library is here: scripts/setup.sh installs it.
# They are large (NVSHMEM's transport code: about 0.6 MB of PTX each), so they are
# packed compressed and run.sh unpacks them into the store.
off_node=""
if [ "$vendor" = nvidia ] && [ -e "${TESSERA_NVSHMEM_HOME:-/nonexistent}/lib/libnvshmem_device_sm_90.bc" ]; then
  off_node="--off-node $pack/off_node"
fi
for target in $targets; do
  echo "== [$vendor] 2. precompile the example kernels for $target (${SECONDS}s)"
  # shellcheck disable=SC2086  # $off_node is empty or two words
  if ! cargo run -q --release -p tessera-examples --example aot -- \
      --target "$target" --out "$pack/aot-$target" --store "$pack/kernels" $off_node >"$aot_log" 2>&1; then
    sed 's/^/  /' "$aot_log" | tail -8
    echo "FAIL: precompiling the example kernels for $target" >&2
    exit 1
  fi
  cat "$aot_log"
  rm -rf "$pack/aot-$target"
done

if [ "$vendor" = nvidia ] && [ "$quick" = 0 ]; then
  # The same kernels through NVIDIA's Tile IR (tileiras, cubins for the H100/H200's
  # sm_90), into the same store under their own keys: run.sh runs the suite a
  # second time on that path (TESSERA_KERNEL_BACKEND=tileir) beside the LLVM one.
  echo "== [$vendor] 2b. precompile the example kernels through Tile IR for sm_90 (${SECONDS}s)"
  if ! cargo run -q --release -p tessera-examples --example aot -- \
      --tileir sm_90 --out "$pack/aot-tileir" --store "$pack/kernels" >"$aot_log" 2>&1; then
    sed 's/^/  /' "$aot_log" | tail -8
    echo "FAIL: precompiling the example kernels through Tile IR" >&2
    exit 1
  fi
  grep -E "not lowered|kernels not" "$aot_log" || true
  echo "Tile IR: $(grep -c '\.cubin' "$aot_log") kernels"
  rm -rf "$pack/aot-tileir"
fi
echo "== [$vendor] 3. pack into $pack (${SECONDS}s)"
if [ -d "$pack/off_node" ]; then
  tar -C "$pack/off_node" -czf "$pack/off_node.tgz" .
  rm -rf "$pack/off_node"
  echo "off-node kernels: $(tar -tzf "$pack/off_node.tgz" | grep -c '\.tkb$') artifacts, $(($(stat -c %s "$pack/off_node.tgz") / 1024)) KiB compressed"
fi
strip "$pack/gpu_check" 2>/dev/null || true
# The store, compressed (PTX is text; about 60 MiB becomes 14): run.sh unpacks it.
# The folder stays here for the checks below and goes at the end.
tar -C "$pack/kernels" -czf "$pack/kernels.tgz" .
cp scripts/gpu_bench.py "$pack/"
# What run.sh needs to know about its vendor (run.sh itself is the same for both).
{
  echo "default_dev=$dev"
  if [ "$vendor" = nvidia ]; then
    echo "smi=(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader)"
  else
    echo "smi=(rocm-smi --showproductname --showdriverversion --showmeminfo vram)"
  fi
} >"$pack/pack.env"
cat >"$pack/run.sh" <<'EOF'
#!/usr/bin/env bash
# Runs on the GPU machine: bash run.sh [OUT_DIR]   (default: ./report)
# STEPS="name ..." runs only the steps named (suite, one_gpu, suite_tileir, baselines,
# one_gpu_bench, comm_mps, nvshmem, nvshmem_world, memcheck).
# Every step has its own time limit (the whole run stays under the device tool's 10
# minutes); each step's log, the JSON report (ours.json) and steps.txt (one line per
# step with its exit status) go into OUT_DIR, whatever fails.
out="$(realpath -m "${1:-report}")"
cd "$(dirname "${BASH_SOURCE[0]}")"
# shellcheck disable=SC1091
. ./pack.env
mkdir -p "$out" kernels
tar -C kernels -xzf kernels.tgz
status=0
# STEPS="suite one_gpu ..." runs those steps only (the run can be split over calls).
step() { # name limit_seconds command...
  local name=$1 secs=$2
  shift 2
  if [ -n "${STEPS:-}" ] && [[ " $STEPS " != *" $name "* ]]; then
    echo "$name: not in STEPS" >>"$out/steps.txt"
    return 0
  fi
  echo "== $name (limit ${secs} s)"
  timeout --kill-after=10 "$secs" "$@" >"$out/$name.log" 2>&1
  local rc=$?
  tail -n 60 "$out/$name.log"
  [ "$rc" = 124 ] && echo "$name: TIMED OUT after $secs s"
  echo "$name: exit $rc" | tee -a "$out/steps.txt"
  [ "$rc" = 0 ] || status=1
}
if command -v "${smi[0]}" >/dev/null 2>&1; then
  "${smi[@]}" >"$out/gpu.txt" 2>&1
fi
cat "$out/gpu.txt" 2>/dev/null || echo "no ${smi[0]}"
dev="${TESSERA_DEVICE:-$default_dev}"
step suite 150 ./gpu_check --kernels kernels --device "$dev" --json "$out/ours.json"
# Ranks as threads on parts of this one GPU (green contexts / CU masks / sized
# launches: the log names which), 2, 4 and 8 of them, every rank's kernels at once:
# ping-pong latency, every all-reduce algorithm, the fused all-gather + GEMM; then
# the memory-model litmus tests on 2 ranks, strong (must show 0 forbidden outcomes)
# and weakened (how often this GPU shows them).
step one_gpu 120 ./gpu_check --kernels kernels --device "$dev" --no-bench --no-comm \
  --no-suite --threads 2 --threads 4 --threads 8 --litmus-iters 20000
tileir=()
if [ "${dev%%:*}" = cuda ] && ls kernels/*.cubin >/dev/null 2>&1; then
  # The same suite through NVIDIA's Tile IR, without the communication cases (the
  # collectives' kernels are packed for the LLVM path only): a kernel Tile IR
  # cannot express fails its case, naming the op.
  TESSERA_KERNEL_BACKEND=tileir step suite_tileir 100 ./gpu_check --kernels kernels \
    --device "$dev" --no-comm --json "$out/ours-tileir.json"
  tileir=(--tileir "$out/ours-tileir.json")
fi
# torch and Triton on the same shapes (ROCm's torch answers to torch.cuda too), with
# our LLVM path and (NVIDIA) our Tile IR path side by side.
step baselines 110 python3 gpu_bench.py --ours "$out/ours.json" "${tileir[@]}"
# The same one-GPU worlds timed (issue 44): all-reduce latency (4 KiB - 1 MiB) and
# bus bandwidth (16 - 256 MiB) with each algorithm beside the GPU's own copy, and the
# fused plans against their unfused sequences, for 2, 4 and 8 ranks.
step one_gpu_bench 150 ./gpu_check --kernels kernels --device "$dev" --no-bench --no-comm \
  --no-suite --threads 2 --threads 4 --threads 8 --threads-bench --litmus-iters 1000 \
  --json "$out/one-gpu.json"
# Processes on one GPU run at once only under MPS: where the machine has its control
# daemon, it is started for the next steps (its pipes and logs under $out/mps) and
# stopped after them; without it the 2-process world of the suite step was
# time-sliced by the driver, and this says so.
mps=0
if [ "${dev%%:*}" = cuda ] && command -v nvidia-cuda-mps-control >/dev/null 2>&1; then
  export CUDA_MPS_PIPE_DIRECTORY="$out/mps/pipe" CUDA_MPS_LOG_DIRECTORY="$out/mps/log"
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  if nvidia-cuda-mps-control -d; then
    mps=1
    echo "mps: control daemon started" | tee -a "$out/steps.txt"
    step comm_mps 90 ./gpu_check --kernels kernels --device "$dev" --no-bench --no-suite
  else
    echo "mps: the control daemon did not start; process worlds stay time-sliced" | tee -a "$out/steps.txt"
  fi
else
  echo "mps: no nvidia-cuda-mps-control here; the 2-process world of the suite step was time-sliced" | tee -a "$out/steps.txt"
fi
# NVSHMEM's host side (issue 19): 2 processes, one PE each (on one GPU, NVSHMEM's
# multiple processes per GPU, under MPS where it started above), with the unique id
# handed out by Tessera's TCP rendezvous. The host library comes with PyTorch's
# nvidia-nvshmem-cu12 wheel.
if [ "${dev%%:*}" = cuda ]; then
  nvhome="${TESSERA_NVSHMEM_HOME:-$(python3 -c 'import nvidia.nvshmem as m; print(list(m.__path__)[0])' 2>/dev/null)}"
  if [ -n "$nvhome" ] && [ -e "$nvhome/lib/libnvshmem_host.so.3" ]; then
    export TESSERA_NVSHMEM_HOME="$nvhome"
    step nvshmem 60 ./gpu_check --nvshmem 2
    # A world on NVSHMEM (World::nvshmem): 2 ranks whose every peer is off-node, so
    # every access to a peer is an NVSHMEM device call: ping-pong, all-reduces.
    if [ -e off_node.tgz ]; then
      tar -C kernels -xzf off_node.tgz
      step nvshmem_world 90 ./gpu_check --kernels kernels --nvshmem-world 2
    fi
  else
    echo "nvshmem: skipped (no NVSHMEM host library: pip install nvidia-nvshmem-cu12, or set TESSERA_NVSHMEM_HOME)" | tee -a "$out/steps.txt"
  fi
fi
if [ "$mps" = 1 ]; then
  echo quit | nvidia-cuda-mps-control
  echo "mps: control daemon stopped" | tee -a "$out/steps.txt"
  unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
fi
if [ "${dev%%:*}" = cuda ] && command -v compute-sanitizer >/dev/null 2>&1; then
  # Out-of-bounds and misaligned accesses of every example kernel (no benchmarks, no
  # processes: the sanitizer watches this one). Last: it is the slowest step.
  step memcheck 130 compute-sanitizer --tool memcheck --error-exitcode 3 \
    ./gpu_check --kernels kernels --device "$dev" --no-bench --no-comm
else
  echo "memcheck: skipped (no compute-sanitizer for $dev on this machine)" | tee -a "$out/steps.txt"
fi
exit $status
EOF
chmod +x "$pack/run.sh" "$pack/gpu_check"
size=$(( $(du -sb "$pack" | cut -f1) - $(du -sb "$pack/kernels" | cut -f1) ))
echo "pack: $(find "$pack" -path "$pack/kernels" -prune -o -type f -print | wc -l) files ($(find "$pack/kernels" -type f | wc -l) kernels in kernels.tgz), $((size / 1024)) KiB"
if [ "$size" -ge "$limit" ]; then
  echo "FAIL: $pack is $size bytes, over the 64 MiB the device tool carries" >&2
  exit 1
fi

echo "== [$vendor] check the pack here (no GPU needed) (${SECONDS}s)"
for target in $targets; do
  if "$pack/gpu_check" --kernels "$pack/kernels" --target "$target" --check-artifacts; then
    echo "ok: every kernel is in the pack for $target"
  else
    echo "FAIL: precompiled kernels are missing from the pack for $target" >&2
    exit 1
  fi
done
if [ ! -e /dev/nvidiactl ] && [ ! -e /dev/kfd ]; then
  set +e
  msg="$(TESSERA_DEVICE=$dev_env "$pack/gpu_check" --kernels "$pack/kernels" 2>&1)"
  rc=$?
  set -e
  echo "TESSERA_DEVICE=$dev_env here: exit $rc: $msg"
  if [ "$rc" != 2 ] || ! grep -qE "$no_driver" <<<"$msg"; then
    echo "FAIL: expected a clean '$no_driver' error" >&2
    exit 1
  fi
  if [ "$vendor" = nvidia ] && [ -e "${TESSERA_NVSHMEM_HOME:-/nonexistent}/lib/libnvshmem_host.so.3" ]; then
    # The NVSHMEM step: the unique id is drawn and handed out, then each rank
    # fails cleanly for want of a GPU.
    set +e
    msg="$(timeout 120 "$pack/gpu_check" --nvshmem 2 2>&1)"
    rc=$?
    set -e
    echo "gpu_check --nvshmem 2 here: exit $rc: $msg"
    if [ "$rc" = 0 ] || [ "$(grep -c 'FAIL.*no CUDA driver' <<<"$msg")" != 2 ]; then
      echo "FAIL: expected both NVSHMEM ranks to stop cleanly at the missing CUDA driver" >&2
      exit 1
    fi
    set +e
    msg="$(timeout 120 "$pack/gpu_check" --kernels "$pack/kernels" --nvshmem-world 2 2>&1)"
    rc=$?
    set -e
    echo "gpu_check --nvshmem-world 2 here: exit $rc: $msg"
    if [ "$rc" = 0 ] || [ "$(grep -c 'nvshmem_world FAIL.*no CUDA driver' <<<"$msg")" != 2 ]; then
      echo "FAIL: expected both NVSHMEM world ranks to stop cleanly at the missing CUDA driver" >&2
      exit 1
    fi
  fi
fi
rm -rf "$pack/kernels"
echo
echo "== [$vendor] on the GPU machine, make this one device-tool call: (${SECONDS}s)"
echo "run(command=\"bash $pack/run.sh \\\"\$OUT\\\"\", carry=[\"$pack\"], timeout_s=600)"
echo "(the report, every step's log and steps.txt come back as the call's files)"
local gpu_here=/dev/nvidiactl
[ "$vendor" = amd ] && gpu_here=/dev/kfd
if [ "$dry_run" = 0 ] && [ -e "$gpu_here" ]; then
  bash "$pack/run.sh" "target/gpu-check-report-$vendor"
fi
}

if [ "$vendor" = both ]; then
  pack_vendor nvidia
  pack_vendor amd
else
  pack_vendor "$vendor"
fi
