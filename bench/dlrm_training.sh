#!/usr/bin/env bash
# The DLRM training comparison (python/examples/dlrm_training.py, docs/dlrm.md) on N ranks over
# a rate-limited link or shared memory, with Open MPI (the MPI of Debian's torch and mpi4py).
#
#   bench/dlrm_training.sh <python_build_dir> [--link GBPS|shm] [--ranks N] [--program FILE] [args...]
#
# --program runs another training program of python/examples on the same test bed, started by
# mpirun the same way (ddp_training.py: DDP's gradient hooks on gloo, docs/performance.md).
# <python_build_dir> is the package's build tree (build/python: scripts/dev's python_tests step,
# docs/python.md). With --link GBPS (default 1) the job runs in a private network namespace
# (`unshare --net`: nothing but its own loopback) whose loopback tc limits to GBPS Gb/s, and
# Open MPI is forced onto TCP over it (pml ob1, btl tcp,self on lo), so every byte between
# ranks crosses the shaped link; the test bed of bench/dlrm_exchange_demo.sh. Before training,
# a two-rank ping-pong measures the rate the ranks really get and prints it. With --link shm,
# Open MPI's defaults (shared memory). Ranks run one thread each (torch, Kokkos, BLAS).
set -euo pipefail

log() { printf 'dlrm_training: %s\n' "$*" >&2; }

[ $# -ge 1 ] || { sed -n '2,15p' "$0" >&2; exit 2; }
build_dir=$(cd "$1" && pwd); shift
link=1
ranks=4
program=""
inside=""
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --link) link=$2; shift 2 ;;
    --ranks) ranks=$2; shift 2 ;;
    --program) program=$(cd "$(dirname "$2")" && pwd)/$(basename "$2"); shift 2 ;;
    --inside-namespace) inside=1; shift ;;  # internal: we are in the namespace already
    --) shift; args+=("$@"); break ;;
    *) args+=("$1"); shift ;;
  esac
done
set -- ${args[@]+"${args[@]}"}
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
package=$build_dir/python/package
[ -d "$package/kompress" ] || { log "$package/kompress not built (cmake --build $build_dir)"; exit 2; }
export PYTHONPATH=$package OMP_NUM_THREADS=1 OMP_PROC_BIND=false KOMPRESS_NUM_THREADS=1 \
  OPENBLAS_NUM_THREADS=1 KOKKOS_DISABLE_WARNINGS=1 PYTHONWARNINGS=ignore \
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
program=${program:-$repo/python/examples/dlrm_training.py}
mpirun=(mpirun.openmpi --oversubscribe -n "$ranks")

burst_for() { awk -v r="$1" 'BEGIN { kb = r * 410; if (kb < 512) kb = 512; printf "%dkb", kb }'; }
shape="tc qdisc add dev lo root tbf rate ${link}gbit burst $(burst_for "${link/shm/1}") latency 50ms"

if [ -n "$inside" ]; then
  ip link set lo up
  $shape
  tcp=(--mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include lo)
  mpirun=("${mpirun[@]}" "${tcp[@]}")
  # What the ranks really get over the shaped loopback: 2 ranks, 8 MB each way.
  mpirun.openmpi --oversubscribe -n 2 "${tcp[@]}" python3 -c '
import numpy as np, time
from mpi4py import MPI
c = MPI.COMM_WORLD; r = c.Get_rank(); b = np.ones(8 << 20, np.uint8); t = []
for i in range(4):
    t0 = time.perf_counter()
    if r == 0: c.Send(b, 1); c.Recv(b, 1)
    else: c.Recv(b, 0); c.Send(b, 0)
    t.append(time.perf_counter() - t0)
if r == 0:
    print(f"dlrm_training: ping-pong, 2 ranks, 8 MB each way: {2 * b.size * 8 / min(t[1:]) / 1e9:.3f} Gb/s", flush=True)
'
  status=0
  "${mpirun[@]}" python3 "$program" --link "${link} Gb/s (tc on loopback, Open MPI TCP)" "$@" || status=$?
  tc -s qdisc show dev lo | awk '/Sent/ { printf "dlrm_training: the %s Gb/s loopback carried %.1f MB in %d packets\n", "'"$link"'", $2 / 1e6, $4 }' >&2
  exit $status
fi

if [ "$link" != shm ]; then
  if unshare --net sh -c "ip link set lo up && $shape" 2>/dev/null; then
    log "$ranks ranks in a private network namespace, loopback limited to $link Gb/s with tc, Open MPI over TCP"
    exec unshare --net "$0" "$build_dir" --link "$link" --ranks "$ranks" --program "$program" \
      --inside-namespace -- "$@"
  fi
  log "could not set up a private network namespace with a rate-limited loopback here (needs root"
  log "with CAP_SYS_ADMIN and CAP_NET_ADMIN, and tc); running over shared memory instead"
  link=shm
fi
exec "${mpirun[@]}" python3 "$program" --link "shared memory (Open MPI defaults)" "$@"
