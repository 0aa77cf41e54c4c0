#!/usr/bin/env bash
# The main demo (scripts/dev demo): the DLRM embedding exchange on 4 ranks over a 1 Gb/s link.
#
#   bench/dlrm_exchange_demo.sh <build_dir> [--link GBPS|shm] [--ranks N] [example args...]
#
# Runs <build_dir>/bench/bench_dlrm_exchange (bench/dlrm_exchange.cpp) in a private
# network namespace whose loopback is rate-limited with tc to GBPS Gb/s (default 1), with
# MPICH forced onto TCP over it, so every byte between ranks crosses the shaped link; the
# example reads the rate from KOMPRESS_LINK_GBPS and says so in its header. This is the test
# bed of bench/collectives_sweep.sh (docs/collectives.md): `unshare --net` gives the job a
# namespace holding nothing but its own loopback, so nothing outside is touched or reachable,
# and the namespace disappears with the job. Loopback is one queue: all ranks share the rate,
# as if they sat behind one link.
#
# It needs root (CAP_SYS_ADMIN for unshare, CAP_NET_ADMIN for tc), which scripts/dev has. Where
# the namespace or tc cannot be set up, or with --link shm, it runs over shared memory instead
# and says so. Ranks run one OpenMP thread each.
set -euo pipefail

log() { printf 'dlrm_exchange_demo: %s\n' "$*" >&2; }

[ $# -ge 1 ] || { sed -n '2,19p' "$0" >&2; exit 2; }
build_dir=$1; shift
link=1
ranks=4
inside=""
args=()  # everything else goes to the example
while [ $# -gt 0 ]; do
  case "$1" in
    --link) link=$2; shift 2 ;;
    --ranks) ranks=$2; shift 2 ;;
    --inside-namespace) inside=1; shift ;;  # internal: we are in the namespace already
    --) shift; args+=("$@"); break ;;
    *) args+=("$1"); shift ;;
  esac
done
set -- ${args[@]+"${args[@]}"}
exe=$build_dir/bench/bench_dlrm_exchange
[ -x "$exe" ] || { log "$exe not built (it needs MPI)"; exit 2; }
export OMP_NUM_THREADS=1 OMP_PROC_BIND=false KOKKOS_DISABLE_WARNINGS=1

# tbf burst: 512 KiB at 1 Gb/s, more at higher rates (one burst must cover a timer tick);
# bench/collectives_sweep.sh's rule.
burst_for() { awk -v r="$1" 'BEGIN { kb = r * 410; if (kb < 512) kb = 512; printf "%dkb", kb }'; }
shape="tc qdisc add dev lo root tbf rate ${link}gbit burst $(burst_for "${link/shm/1}") latency 50ms"

if [ -n "$inside" ]; then
  ip link set lo up
  $shape
  status=0
  KOMPRESS_LINK_GBPS=$link MPIR_CVAR_NOLOCAL=1 UCX_TLS=tcp UCX_NET_DEVICES=lo \
    mpiexec -n "$ranks" "$exe" "$@" || status=$?
  # What crossed the shaped loopback: every message between ranks.
  tc -s qdisc show dev lo | awk '/Sent/ { printf "dlrm_exchange_demo: the %s Gb/s loopback carried %.1f MB in %d packets\n", "'"$link"'", $2 / 1e6, $4 }' >&2
  exit $status
fi

if [ "$link" != shm ]; then
  # Probe first: a namespace of our own with a shaped loopback, then nothing else.
  if unshare --net sh -c "ip link set lo up && $shape" 2>/dev/null; then
    log "$ranks ranks in a private network namespace, loopback limited to $link Gb/s with tc, MPICH over TCP"
    exec unshare --net "$0" "$build_dir" --link "$link" --ranks "$ranks" --inside-namespace -- "$@"
  fi
  log "could not set up a private network namespace with a rate-limited loopback here (needs root"
  log "with CAP_SYS_ADMIN and CAP_NET_ADMIN, and tc); running over shared memory instead"
fi
exec mpiexec -n "$ranks" "$exe" "$@"
