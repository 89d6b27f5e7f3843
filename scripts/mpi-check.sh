#!/usr/bin/env bash
# The MPI transport's suite (examples/mpi_world.rs) as an MPI job of NP ranks (default
# 4) on this machine.
#   scripts/mpi-check.sh [NP]          shared memory between the processes disabled:
#                                      every byte between ranks takes the network path
#                                      (TCP), as between nodes
#   scripts/mpi-check.sh NP --shm      MPI's defaults (but osc/rdma, see below): the
#                                      ranks of the node map each other's heaps
#                                      (direct loads and stores)
#   scripts/mpi-check.sh NP --nodes K  nodes of K ranks emulated: each group of K
#                                      consecutive ranks maps its heaps, every byte
#                                      between groups takes the network path (TCP);
#                                      the suite runs placed so (hierarchical
#                                      collectives), then times the flat and the
#                                      hierarchical collectives (the crossover)
#   scripts/mpi-check.sh NP --stopped  a rank that stops (SIGSTOP) once the world
#                                      formed: jobs of NP ranks (2 is enough) on the
#                                      network path as above, in which the others'
#                                      operations on it (compare-and-swap, get, put,
#                                      signal, host barrier; the team's rank 0 stopped
#                                      too) must fail within 20 s naming it and the
#                                      processes end (a 3 s wait timeout); then two on
#                                      MPI's shared-memory defaults, where Open MPI's
#                                      osc/ucx completes atomics inside the call and
#                                      the watchdog ends the waiting process naming it
# Needs an MPI library (Debian: openmpi-bin libopenmpi-dev; scripts/setup.sh installs
# them) and builds the example with `--features mpi`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
command -v cargo >/dev/null 2>&1 || . "$HOME/.cargo/env"
if [ -f .tools/env.sh ]; then
  # shellcheck disable=SC1091
  . .tools/env.sh
fi
NP="${1:-4}"
MODE="${2:-net}"
ARGS=()
PROFILE=debug
command -v mpirun >/dev/null 2>&1 || { echo "mpi-check: no mpirun (install openmpi-bin libopenmpi-dev, or run scripts/setup.sh)" >&2; exit 1; }
# Open MPI refuses root unless told; CI runs as root in a throwaway machine.
if [ "$(id -u)" = 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
case "$MODE" in
  net)
    # ob1 + the TCP and self transports (no `vader` shared memory, no UCX), and the
    # point-to-point one-sided component (no `sm` window sharing): one-sided traffic
    # goes over TCP, and the heaps are not shared (the world says so at `info`).
    MCA=(--mca pml ob1 --mca btl self,tcp --mca osc pt2pt) ;;
  # MPI's defaults but one: Open MPI 4's osc/rdma crashes in MPI_Compare_and_swap
  # over its shared-memory transport (open-mpi/ompi#11349; the world warns).
  --shm) MCA=(--mca osc ^rdma) ;;
  # The TCP transport between processes (no `vader`), window sharing (osc/sm) for
  # each group's heaps, one-sided traffic between groups over TCP (osc/pt2pt).
  --nodes)
    K="${3:?mpi-check: --nodes needs the ranks per node}"
    MCA=(--mca pml ob1 --mca btl self,tcp --mca osc ^rdma)
    ARGS=(--ranks-per-node "$K" --crossover)
    # The crossover sets `Auto`'s threshold, which users meet in release builds
    # (`MPI_CHECK_PROFILE=debug`: CI, which checks that it runs, not its numbers).
    PROFILE="${MPI_CHECK_PROFILE:-release}" ;;
  --stopped) MCA=(--mca pml ob1 --mca btl self,tcp --mca osc pt2pt) ;;
  *) echo "mpi-check: unknown mode $MODE (expected --shm, --nodes K or --stopped)" >&2; exit 2 ;;
esac
if [ "$PROFILE" = release ]; then
  cargo build -q --release -p tessera-examples --features mpi --example mpi_world
else
  cargo build -q -p tessera-examples --features mpi --example mpi_world
fi
# --oversubscribe: more ranks than cores is fine here. Every socket on the loopback
# interface: the job's own TCP traffic (the BTL's and the launcher's) never leaves
# this machine.
LO=(--mca btl_tcp_if_include lo --mca oob_tcp_if_include lo)
if [ "$MODE" = --stopped ]; then
  # One job per case: "STOPPED OP [shm]". Each must end well within its 60 s bound
  # (a hang is a failure, not a wait); what is left of it is killed by pid after.
  failed=0
  for case in "1 cas" "1 get" "1 put" "1 signal" "1 barrier" "0 cas" "0 barrier" \
      "1 cas shm" "1 barrier shm"; do
    read -r R OP SHM <<<"$case"
    if [ -n "$SHM" ]; then MCA_CASE=(--mca osc ^rdma); else MCA_CASE=("${MCA[@]}"); fi
    start=$(date +%s)
    set +e
    TESSERA_LOG=warn timeout --kill-after=10 60 mpirun -np "$NP" --oversubscribe \
      "${LO[@]}" "${MCA_CASE[@]}" "target/$PROFILE/examples/mpi_world" \
      --stop-rank "$R" --stop-op "$OP" < /dev/null > "$log" 2>&1
    rc=$?
    set -e
    secs=$(( $(date +%s) - start ))
    # What is left of the job (the stopped rank; every rank after a hang), by pid.
    for pid in $(sed -n 's/^stop-test: rank [0-9]* is pid \([0-9]*\)$/\1/p' "$log"); do
      if grep -qs mpi_world "/proc/$pid/cmdline"; then kill -KILL "$pid" 2>/dev/null || true; fi
    done
    # Every live rank reports; on shared memory the watchdog may end it first.
    want=$(( NP - 1 ))
    ok=$(grep -c "^stop-test ok: the $OP failed" "$log" || true)
    left=$(grep -c "^stop-test ok: left the world" "$log" || true)
    ended=$(grep -c "^error: rank $R stopped answering" "$log" || true)
    if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
      verdict="FAIL (still running after 60 s: a hang)"
    elif grep -q "^stop-test FAIL" "$log"; then
      verdict="FAIL"
    # A rank whose call is stuck inside MPI (a flush the stopped rank never
    # acknowledges: timing decides whether the call or the watchdog sees it first)
    # is ended by the watchdog, naming the stopped rank: as bounded, and as clear.
    elif [ -z "$SHM" ] && { [ $(( ok + ended )) != "$want" ] || [ $(( left + ended )) != "$want" ]; }; then
      verdict="FAIL ($ok of $want ranks failed naming rank $R, $left left, $ended ended by the watchdog)"
    elif [ -n "$SHM" ] && [ $(( ok + ended )) -lt "$want" ]; then
      verdict="FAIL ($ok of $want ranks failed naming rank $R, $ended ended by the watchdog)"
    else
      verdict="ok"
    fi
    echo "mpi-check --stopped: rank $R stopped, the others' $OP${SHM:+ (shared memory)}: $verdict in ${secs} s"
    if [ "$verdict" != ok ]; then
      failed=1
      grep -v "^ok " "$log" | tail -n 40 >&2
    fi
  done
  exit "$failed"
fi
# A hang is bounded: a clear message after 10 minutes.
set +e
TESSERA_LOG=info timeout --kill-after=10 600 mpirun -np "$NP" --oversubscribe \
  "${LO[@]}" "${MCA[@]}" \
  "target/$PROFILE/examples/mpi_world" "${ARGS[@]}" < /dev/null 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
set -e
if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
  echo "mpi-check: the MPI job did not finish within 10 minutes (a hang)" >&2
  exit 1
elif [ "$rc" != 0 ]; then
  echo "mpi-check: the MPI job failed (exit $rc)" >&2
  exit 1
fi
# Which path the heaps took: every peer through MPI calls, or the node's mapped.
said=0
grep -q "the heaps are not shared between the processes of a node" "$log" && said=1
if [ "$MODE" = net ] && [ "$said" = 0 ]; then
  echo "mpi-check: the heaps were shared although shared memory was disabled" >&2
  exit 1
elif [ "$MODE" != net ] && [ "$said" = 1 ]; then
  echo "mpi-check: the node's heaps were not shared (MPI's defaults allow it)" >&2
  exit 1
fi
