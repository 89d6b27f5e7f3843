#!/usr/bin/env bash
# Idempotent project setup: LLVM/MLIR 22 + HIP from Debian apt, ptxas/nvdisasm/cuobjdump
# from PyPI into a project-local venv, and .tools/env.sh for later scripts.
# Usage: bash scripts/setup.sh [--no-llvm] [--no-py]
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TOOLS="$ROOT/.tools"
DO_LLVM=1
DO_PY=1
for arg in "$@"; do
  case "$arg" in
    --no-llvm) DO_LLVM=0 ;;
    --no-py) DO_PY=0 ;;
    -h|--help) sed -n '2,4p' "$0"; exit 0 ;;
    *) echo "setup.sh: unknown option: $arg" >&2; exit 2 ;;
  esac
done

log() { echo "[setup] $*"; }
now() { date +%s; }

# Run privileged commands directly as root, otherwise through sudo.
SUDO=()
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then SUDO=(sudo); else SUDO=(false); fi
fi

# ---------------------------------------------------------------- Rust (1.95+)
# The project needs Rust 1.95 (edition 2024). Debian's own cargo is too old, so a missing
# or old toolchain is installed through rustup.
rust_ok() {
  command -v cargo >/dev/null 2>&1 || return 1
  local v
  v="$(rustc --version 2>/dev/null | awk '{print $2}')"
  [ "$(printf '%s\n%s\n' "1.95.0" "$v" | sort -V | head -n1)" = "1.95.0" ]
}
if ! rust_ok; then
  [ -f "$HOME/.cargo/env" ] && . "$HOME/.cargo/env"
fi
if ! rust_ok; then
  if command -v rustup >/dev/null 2>&1; then
    log "rust: updating the stable toolchain with rustup"
    rustup toolchain install stable --profile minimal -c clippy,rustfmt
    rustup default stable
  else
    log "rust: installing rustup (stable, minimal + clippy, rustfmt)"
    command -v curl >/dev/null 2>&1 || {
      "${SUDO[@]}" apt-get update -qq
      "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq curl ca-certificates
    }
    curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs |
      sh -s -- -y --profile minimal -c clippy,rustfmt
    . "$HOME/.cargo/env"
  fi
  rust_ok || { echo "setup.sh: Rust 1.95 or newer is required" >&2; exit 1; }
fi
if ! command -v cc >/dev/null 2>&1; then
  log "apt: installing a C toolchain (build-essential)"
  "${SUDO[@]}" apt-get update -qq
  "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends build-essential
fi

# ---------------------------------------------------------------- apt (LLVM/MLIR 22, HIP)
# On Debian 12 the *-22 packages come from bookworm-security (1:22.1.8-1~deb12u1);
# libamdhip64-dev (5.2.3) from bookworm main. No extra apt source is needed.
# Open MPI (4.1 on bookworm) for the MPI transport (feature `mpi`: its bindings are
# generated at build time with libclang) and its suite, run by `mpirun`.
APT_PKGS=(llvm-22-dev libmlir-22-dev mlir-22-tools lld-22 libpolly-22-dev clang-22
          libzstd-dev libz3-dev libxml2-dev zlib1g-dev libamdhip64-dev
          libclang1-22 openmpi-bin libopenmpi-dev)

pkg_installed() {
  [ "$(dpkg-query -W -f='${db:Status-Status}' "$1" 2>/dev/null || true)" = "installed" ]
}

if [ "$DO_LLVM" = 1 ]; then
  t0=$(now)
  missing=()
  for p in "${APT_PKGS[@]}"; do pkg_installed "$p" || missing+=("$p"); done
  if [ "${#missing[@]}" -gt 0 ]; then
    log "apt: installing ${missing[*]}"
    "${SUDO[@]}" apt-get update -qq
    "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive \
      apt-get install -y -qq -o Dpkg::Use-Pty=0 --no-install-recommends "${missing[@]}"
  else
    log "apt: all packages present"
  fi
  log "apt part: $(( $(now) - t0 ))s"
fi

# ---------------------------------------------------------------- PyPI (ptxas & co)
# Unsuffixed names are the CUDA 13 wheels (the -cu13 names are placeholders).
CUDA_PY_VERSION="${CUDA_PY_VERSION:-13.5.37}"
PY_REQS=("nvidia-cuda-nvcc==$CUDA_PY_VERSION" "nvidia-cuda-nvdisasm==$CUDA_PY_VERSION"
         "nvidia-cuda-cuobjdump==$CUDA_PY_VERSION"
         "nvidia-cuda-tileiras==$CUDA_PY_VERSION")
PY_STAMP="$TOOLS/py.stamp"
# tileiras and tileirdisasm: NVIDIA's Tile IR compiler and reader (the Tile IR backend).
CUDA_BINS=(ptxas nvdisasm cuobjdump tileiras tileirdisasm)

py_ok() {
  [ -f "$PY_STAMP" ] && [ "$(cat "$PY_STAMP")" = "${PY_REQS[*]}" ] || return 1
  local b
  for b in "${CUDA_BINS[@]}"; do
    [ -x "$TOOLS/bin/$b" ] || return 1
  done
  "$TOOLS/bin/ptxas" --version >/dev/null 2>&1
}

if [ "$DO_PY" = 1 ]; then
  t0=$(now)
  if py_ok; then
    log "py: ${PY_REQS[*]} present"
  else
    mkdir -p "$TOOLS/bin"
    PY="${PYTHON:-python3}"
    PYROOT=""
    venv_ok() { "$TOOLS/venv/bin/python" -m pip --version >/dev/null 2>&1; }
    # A venv made without ensurepip has a python but no pip: remake it.
    venv_ok || { rm -rf "$TOOLS/venv"; "$PY" -m venv "$TOOLS/venv" >/dev/null 2>&1 || true; }
    if venv_ok; then
      PYROOT="$TOOLS/venv"
      "$PYROOT/bin/python" -m pip install -q --disable-pip-version-check "${PY_REQS[@]}"
    else
      rm -rf "$TOOLS/venv"
      # No working venv module: try python3-venv, else fall back to pip --target.
      if "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
           --no-install-recommends python3-venv >/dev/null 2>&1 \
         && "$PY" -m venv "$TOOLS/venv" && venv_ok; then
        PYROOT="$TOOLS/venv"
        "$PYROOT/bin/python" -m pip install -q --disable-pip-version-check "${PY_REQS[@]}"
      else
        PYROOT="$TOOLS/py"
        "$PY" -m pip install -q --disable-pip-version-check --upgrade \
          --target "$PYROOT" "${PY_REQS[@]}"
      fi
    fi
    for b in "${CUDA_BINS[@]}"; do
      # The wheels put binaries under site-packages/nvidia/cu13/bin/ (layout differs
      # across CUDA versions, so search for it).
      src="$(find "$PYROOT" -type f -path "*/nvidia/*/bin/$b" | head -n1)"
      if [ -z "$src" ]; then echo "setup.sh: $b not found under $PYROOT" >&2; exit 1; fi
      chmod +x "$src"
      # Relative link, so a moved/copied checkout keeps working.
      ln -sfn "../${src#"$TOOLS"/}" "$TOOLS/bin/$b"
    done
    "$TOOLS/bin/ptxas" --version >/dev/null
    echo "${PY_REQS[*]}" > "$PY_STAMP"
  fi
  log "py part: $(( $(now) - t0 ))s"
fi

# ---------------------------------------------------------------- NVSHMEM device library
# The communicating kernels compiled for other nodes link NVSHMEM's device bitcode
# (tests/tests/comm_nodes.rs assembles them): the two families the tests use, taken
# from NVIDIA's PyPI wheel; and the host library with its unique-id bootstrap plugin
# (the tests draw and distribute a unique id; no GPU needed). Only those files are
# kept: about 280 MB.
NVSHMEM_PY_VERSION="${NVSHMEM_PY_VERSION:-3.8.0}"
NVSHMEM_DIR="$TOOLS/nvshmem"
NVSHMEM_STAMP="$NVSHMEM_DIR/stamp"
NVSHMEM_FILES=(libnvshmem_device_sm_80.bc libnvshmem_device_sm_90.bc libnvshmem_host.so.3
  nvshmem_bootstrap_uid.so.3)
nvshmem_ok() {
  [ -f "$NVSHMEM_STAMP" ] && [ "$(cat "$NVSHMEM_STAMP")" = "$NVSHMEM_PY_VERSION" ] || return 1
  local f
  for f in "${NVSHMEM_FILES[@]}"; do [ -s "$NVSHMEM_DIR/lib/$f" ] || return 1; done
}
if [ "$DO_PY" = 1 ]; then
  t0=$(now)
  if nvshmem_ok; then
    log "nvshmem: device bitcode $NVSHMEM_PY_VERSION present"
  else
    PYBIN="$TOOLS/venv/bin/python"
    [ -x "$PYBIN" ] || PYBIN="${PYTHON:-python3}"
    tmp="$(mktemp -d)"
    "$PYBIN" -m pip download -q --disable-pip-version-check --no-deps -d "$tmp" \
      "nvidia-nvshmem-cu12==$NVSHMEM_PY_VERSION"
    mkdir -p "$NVSHMEM_DIR/lib"
    "$PYBIN" - "$tmp" "$NVSHMEM_DIR" "${NVSHMEM_FILES[@]}" <<'PYEOF'
import glob, os, sys, zipfile
tmp, dest, files = sys.argv[1], sys.argv[2], sys.argv[3:]
whl = glob.glob(os.path.join(tmp, "*.whl"))[0]
with zipfile.ZipFile(whl) as z:
    names = z.namelist()
    for f in files:
        src = "nvidia/nvshmem/lib/" + f
        if src not in names:
            sys.exit("setup.sh: %s is not in %s" % (src, whl))
        with z.open(src) as i, open(os.path.join(dest, "lib", f), "wb") as o:
            while True:
                b = i.read(1 << 20)
                if not b:
                    break
                o.write(b)
    lic = [n for n in names if n.endswith("License.txt")]
    if lic:
        with z.open(lic[0]) as i, open(os.path.join(dest, "License.txt"), "wb") as o:
            o.write(i.read())
PYEOF
    rm -rf "$tmp"
    echo "$NVSHMEM_PY_VERSION" > "$NVSHMEM_STAMP"
  fi
  log "nvshmem part: $(( $(now) - t0 ))s"
fi

# ---------------------------------------------------------------- env.sh
mkdir -p "$TOOLS"
cat > "$TOOLS/env.sh.tmp" <<ENV
# Generated by scripts/setup.sh; source it: . .tools/env.sh
export PATH="$TOOLS/bin:/usr/lib/llvm-22/bin:\$PATH"
export LLVM_SYS_221_PREFIX=/usr/lib/llvm-22
export MLIR_SYS_220_PREFIX=/usr/lib/llvm-22
export TABLEGEN_220_PREFIX=/usr/lib/llvm-22
export HIP_PATH=/usr
export TESSERA_NVSHMEM_HOME="$TOOLS/nvshmem"
ENV
if cmp -s "$TOOLS/env.sh.tmp" "$TOOLS/env.sh"; then rm "$TOOLS/env.sh.tmp"
else mv "$TOOLS/env.sh.tmp" "$TOOLS/env.sh"; fi

# ---------------------------------------------------------------- summary
log "rustc:       $(rustc --version 2>/dev/null || echo n/a)"
log "llvm-config: $(llvm-config-22 --version 2>/dev/null || echo n/a)"
log "ld.lld:      $(ld.lld-22 --version 2>/dev/null | head -n1 || echo n/a)"
if [ -x "$TOOLS/bin/ptxas" ]; then
  log "ptxas:       $("$TOOLS/bin/ptxas" --version 2>&1 | grep -m1 -i release || true)"
  log "tileiras:    $("$TOOLS/bin/tileiras" --version 2>&1 | grep -m1 -i release || echo n/a)"
else
  log "ptxas:       n/a"
fi
