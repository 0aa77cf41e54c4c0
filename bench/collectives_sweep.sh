#!/usr/bin/env bash
# The network-limited sweep of bench_collectives (docs/performance.md, "The test bed"): for
# every link and rank count, the MPI job runs in a private network namespace of its own; for
# the TCP links its loopback is rate-limited with tc and MPICH is forced onto TCP over it.
# Writes one CSV, one log per run, and plots speedup vs message size per link rate.
#
#   bench/collectives_sweep.sh <build_dir> [options] [-- args for bench_collectives]
#     --links "1 2.5 5 10 shm"  link rates in Gb/s; "shm" = unlimited shared memory (no tc, MPICH's
#                               default transports); "tcp" = unlimited TCP over loopback
#     --ranks "2 4"             rank counts
#     --max-bytes-4 16M         largest message per peer for runs of more than 2 ranks
#                               (4 ranks at 64 MiB per peer need ~5 GiB and ~10 min at 1 Gb/s)
#     --out DIR                 where the CSV, logs and plots go (default <build_dir>/collectives)
#     --img DIR                 where the PNGs go too (e.g. docs/img); default: only DIR
#     --plot-only CSV           skip the runs; plot (and summarize) an existing CSV
#     --priority                run the ranks at the highest priority (root: nice -19 and, since
#                               mpiexec makes every rank a session and so an autogroup of its
#                               own, autogroup nice -19), for a machine shared with builds
#
# Outputs in DIR: collectives.csv (all runs), logs/<link>_<ranks>.txt, summary.md (tables of the
# 2-rank speedups, persistent auto included), collectives_{alltoall,allreduce,allgather,reduce_scatter}.png (2 ranks; one
# colour per link rate; pipelined solid, auto dashed, compressed whole dotted; one panel per
# data set).
#
# How the namespace works: `unshare --net` gives the job a network namespace with nothing but a
# loopback device, down; the script brings it up, adds `tc qdisc add dev lo root tbf rate <R>gbit
# burst <B> latency 50ms` and runs mpiexec inside with MPIR_CVAR_NOLOCAL=1 UCX_TLS=tcp
# UCX_NET_DEVICES=lo, so every byte between ranks crosses the shaped loopback. Nothing leaves the
# namespace, and it disappears with the job. Loopback is one queue for all ranks: the rate is
# shared by every message in flight (2 ranks sending to each other get R in total, R/2 each), as
# if all ranks sat behind one link of rate R. Needs CAP_SYS_ADMIN and CAP_NET_ADMIN: run it as
# root inside the dev environment (scripts/dev run, or bench/run <build> collectives; bwrap keeps
# root's capabilities there). Started outside the dev environment, it re-runs itself inside it.
#
# Ranks run with OMP_NUM_THREADS=1; more ranks than cores oversubscribe and the bench says so.
set -euo pipefail

usage() { sed -n '2,30p' "$0" >&2; exit 2; }
[ $# -ge 1 ] || usage
build_dir=$1; shift
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

links="1 2.5 5 10 shm"
ranks_list="2 4"
max_bytes_many=16M
out_dir=""
img_dir=""
plot_only=""
priority=""
bench_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --links) links=$2; shift 2 ;;
    --ranks) ranks_list=$2; shift 2 ;;
    --max-bytes-4) max_bytes_many=$2; shift 2 ;;
    --out) out_dir=$2; shift 2 ;;
    --img) img_dir=$2; shift 2 ;;
    --plot-only) plot_only=$2; shift 2 ;;
    --priority) priority=1; shift ;;
    --) shift; bench_args=("$@"); break ;;
    -h|--help) usage ;;
    *) echo "collectives_sweep: unknown option $1" >&2; usage ;;
  esac
done
out_dir=${out_dir:-$build_dir/collectives}

log() { printf 'collectives_sweep: %s\n' "$*" >&2; }

# Outside the dev environment (no mpiexec or gnuplot here), go in.
if ! command -v mpiexec >/dev/null || ! command -v gnuplot >/dev/null || ! command -v tc >/dev/null; then
  if [ -x "$repo/scripts/dev" ] && [ -z "${KOMPRESS_SWEEP_INSIDE:-}" ]; then
    log "mpiexec, tc or gnuplot missing here: re-running inside scripts/dev"
    exec "$repo/scripts/dev" run env KOMPRESS_SWEEP_INSIDE=1 "$repo/bench/collectives_sweep.sh" \
      "$build_dir" --links "$links" --ranks "$ranks_list" --max-bytes-4 "$max_bytes_many" \
      --out "$out_dir" ${img_dir:+--img "$img_dir"} ${plot_only:+--plot-only "$plot_only"} \
      ${priority:+--priority} -- "${bench_args[@]}"
  fi
  echo "collectives_sweep: needs mpiexec, tc (iproute2) and gnuplot" >&2
  exit 1
fi

mkdir -p "$out_dir/logs"
csv=$out_dir/collectives.csv

# --- the runs ---------------------------------------------------------------------------------

# tbf burst: 512 KiB at 1 Gb/s, growing with the rate (at least 4 MiB at 10 Gb/s, or the
# shaper cannot reach the rate: one burst must cover a timer tick).
burst_for() { awk -v r="$1" 'BEGIN { kb = r * 410; if (kb < 512) kb = 512; printf "%dkb", kb }'; }

# run_one <link> <ranks>: one bench_collectives job in a fresh network namespace.
run_one() {
  local link=$1 ranks=$2
  local exe=$build_dir/bench/bench_collectives
  local max_bytes=64M
  [ "$ranks" -gt 2 ] && max_bytes=$max_bytes_many
  local setup env_tcp link_args
  case "$link" in
    shm)
      setup="ip link set lo up"
      env_tcp=""
      link_args="--link-gbps measure --link-name shm" ;;
    tcp)
      setup="ip link set lo up"
      env_tcp="MPIR_CVAR_NOLOCAL=1 UCX_TLS=tcp UCX_NET_DEVICES=lo"
      link_args="--link-gbps measure --link-name tcp" ;;
    *)
      setup="ip link set lo up && tc qdisc add dev lo root tbf rate ${link}gbit burst $(burst_for "$link") latency 50ms"
      env_tcp="MPIR_CVAR_NOLOCAL=1 UCX_TLS=tcp UCX_NET_DEVICES=lo"
      link_args="--link-gbps $link --link-name ${link}gbit" ;;
  esac
  # Each rank raises its own autogroup's priority, then runs the bench.
  local launch=""
  [ -n "$priority" ] &&
    launch="sh -c 'echo -19 > /proc/self/autogroup 2>/dev/null || true; exec nice -n -19 \"\$0\" \"\$@\"'"
  local logfile=$out_dir/logs/${link}_${ranks}.txt
  log "link $link, $ranks ranks, up to $max_bytes per peer -> $logfile"
  local start=$SECONDS
  # The inner shell: set up the namespace, show the qdisc, run, show what the qdisc passed.
  local inner="set -e; $setup; tc qdisc show dev lo; \
    env OMP_NUM_THREADS=1 OMP_PROC_BIND=false KOKKOS_DISABLE_WARNINGS=1 $env_tcp \
      mpiexec -n $ranks $launch $exe $link_args --max-bytes $max_bytes --csv $csv --append ${bench_args[*]:-}; \
    tc -s qdisc show dev lo"
  local rc=0
  unshare --net sh -c "$inner" >"$logfile" 2>&1 || rc=$?
  if [ $rc -ne 0 ]; then
    if grep -q "unshare failed\|Operation not permitted" "$logfile"; then
      log "unshare --net failed (no CAP_SYS_ADMIN?): run as root inside scripts/dev, or wrap the"
      log "whole command on the host: unshare --net scripts/dev run bench/collectives_sweep.sh ..."
      cat "$logfile" >&2
      exit 1
    fi
    log "link $link, $ranks ranks: exit status $rc (see $logfile)"
    status=1
  fi
  log "  done in $((SECONDS - start)) s; load average $(cut -d' ' -f1-3 /proc/loadavg)"
}

status=0
if [ -z "$plot_only" ]; then
  [ -x "$build_dir/bench/bench_collectives" ] ||
    { log "$build_dir/bench/bench_collectives not built (needs MPI and -DKOMPRESS_ENABLE_BENCHMARKS=ON)"; exit 2; }
  rm -f "$csv"
  sweep_start=$SECONDS
  for ranks in $ranks_list; do
    for link in $links; do
      run_one "$link" "$ranks"
    done
  done
  log "sweep done in $((SECONDS - sweep_start)) s; CSV: $csv"
else
  csv=$plot_only
fi

# --- summary tables and plots -----------------------------------------------------------------

# Columns by name, so the CSV may grow.
col() { head -1 "$csv" | tr ',' '\n' | grep -nx "$1" | cut -d: -f1; }
c_link=$(col link); c_ranks=$(col ranks); c_op=$(col op); c_data=$(col data)
c_bytes=$(col bytes_per_peer); c_variant=$(col variant); c_speedup=$(col speedup_vs_plain)
c_time=$(col time_s_min); c_ratio=$(col ratio); c_err=$(col max_error); c_decision=$(col decision)
c_bound=$(col abs_bound)

# summary.md: for 2 ranks, per op and data set, speedup of compressed / pipelined / auto /
# persistent auto (p-auto) per size and link.
awk -F, -v L="$c_link" -v R="$c_ranks" -v O="$c_op" -v D="$c_data" -v B="$c_bytes" -v V="$c_variant" \
    -v S="$c_speedup" -v DEC="$c_decision" -v links="$links" '
  NR == 1 { next }
  $R == 2 {
    key = $O SUBSEP $D SUBSEP $B SUBSEP $L
    if ($V == "compressed") comp[key] = $S
    if ($V == "pipelined") pipe[key] = $S
    if ($V == "auto") { auto[key] = $S; dec[key] = $DEC }
    if ($V == "p-auto") pauto[key] = $S
    sizes[$B] = 1; sets[$O SUBSEP $D] = 1
  }
  function human(b) { return b >= 1048576 ? b / 1048576 " MiB" : b / 1024 " KiB" }
  function label(l) { return l == "shm" ? "shm" : (l == "tcp" ? "tcp" : l "gbit") }
  END {
    n = split(links, ls, " ")
    ns = 0; for (s in sizes) sorted[++ns] = s + 0
    for (i = 1; i <= ns; i++) for (j = i + 1; j <= ns; j++) if (sorted[j] < sorted[i]) { t = sorted[i]; sorted[i] = sorted[j]; sorted[j] = t }
    split("alltoall allreduce allgather reduce_scatter", ops, " "); split("dlrm act", ds, " ")
    for (oi = 1; oi <= 4; oi++) for (di = 1; di <= 2; di++) {
      if (!((ops[oi] SUBSEP ds[di]) in sets)) continue
      printf "\n%s, %s, 2 ranks: speedup over plain MPI, compressed whole / pipelined / auto / persistent auto (auto: r = sent raw, c = compressed)\n\n", ops[oi], ds[di]
      printf "| per peer |"; for (k = 1; k <= n; k++) printf " %s |", (ls[k] == "shm" ? "shm" : ls[k] " Gb/s"); printf "\n"
      printf "|---:|"; for (k = 1; k <= n; k++) printf "---:|"; printf "\n"
      for (i = 1; i <= ns; i++) {
        printf "| %s |", human(sorted[i])
        for (k = 1; k <= n; k++) {
          key = ops[oi] SUBSEP ds[di] SUBSEP sorted[i] SUBSEP label(ls[k])
          if (key in comp) printf " %.2f / %.2f / %.2f%s / %s |", comp[key], pipe[key], auto[key], (dec[key] == "raw" ? " r" : (dec[key] == "compressed" ? " c" : " m")), (key in pauto ? sprintf("%.2f", pauto[key]) : "-")
          else printf " |"
        }
        printf "\n"
      }
    }
  }' "$csv" >"$out_dir/summary.md"

# One data file per (op, data, variant, link) for gnuplot: bytes per peer, speedup (2 ranks).
plot_dir=$out_dir/plot
rm -rf "$plot_dir"; mkdir -p "$plot_dir"
awk -F, -v L="$c_link" -v R="$c_ranks" -v O="$c_op" -v D="$c_data" -v B="$c_bytes" -v V="$c_variant" \
    -v S="$c_speedup" -v dir="$plot_dir" '
  NR > 1 && $R == 2 && ($V == "compressed" || $V == "pipelined" || $V == "auto") {
    f = dir "/" $O "_" $D "_" $V "_" $L ".dat"; print $B, $S >> f; close(f)
  }' "$csv"

gnuplot_script() {
  local op=$1 png=$2
  cat <<EOF
set terminal pngcairo size 1400,620 font "sans,11" noenhanced
set output "$png"
set multiplot layout 1,2 title "$op, 2 ranks: speedup over plain MPI vs message size per peer, by link rate (REL 1e-2; solid: pipelined, dotted: compressed whole, dashed: auto)" font "sans,13"
set logscale x 2
set xlabel "bytes per peer"
set ylabel "speedup over plain MPI (x)"
set xtics ("4K" 4096, "16K" 16384, "64K" 65536, "1M" 1048576, "4M" 4194304, "16M" 16777216, "64M" 67108864)
set xrange [3000:90000000]
set grid
set key below horizontal
set logscale y
set ytics (0.05, 0.1, 0.2, 0.5, 1, 1.5, 2, 3, 4, 6, 8, 12)
set yrange [0.04:12]
set arrow from graph 0, first 1 to graph 1, first 1 nohead lc rgb "black" lw 1.5
EOF
  local data title
  for data in dlrm act; do
    if [ "$data" = dlrm ]; then title="DLRM embedding lookups (dlrm_flights_lookup_fwd)"; else title="MLP activations after ReLU (act_mlp_relu2_out)"; fi
    echo "set title \"$title\""
    local plots=() i=0 link label file
    local colors=("#7b3294" "#1b9e77" "#2c7bb6" "#d95f02" "#555555" "#e7298a")
    for link in $links; do
      i=$((i + 1))
      case "$link" in shm) label="shm" ;; tcp) label="tcp" ;; *) label="${link}gbit" ;; esac
      local name=$label; [ "$link" = shm ] && name="shared memory"; [ "$link" = tcp ] || [ "$link" = shm ] || name="$link Gb/s"
      file=$plot_dir/${op}_${data}_pipelined_${label}.dat
      [ -f "$file" ] && plots+=("\"$file\" using 1:2 with linespoints lw 2 pt 7 lc rgb \"${colors[$(( (i - 1) % 6 ))]}\" dt 1 title \"$name\"")
      file=$plot_dir/${op}_${data}_compressed_${label}.dat
      [ -f "$file" ] && plots+=("\"$file\" using 1:2 with lines lw 1.5 lc rgb \"${colors[$(( (i - 1) % 6 ))]}\" dt 3 notitle")
      file=$plot_dir/${op}_${data}_auto_${label}.dat
      [ -f "$file" ] && plots+=("\"$file\" using 1:2 with linespoints lw 2 pt 6 lc rgb \"${colors[$(( (i - 1) % 6 ))]}\" dt 2 notitle")
    done
    plots+=("NaN with lines lw 2 lc rgb \"black\" dt 1 title \"pipelined\"" "NaN with lines lw 1.5 lc rgb \"black\" dt 3 title \"compressed whole\"" "NaN with lines lw 2 lc rgb \"black\" dt 2 title \"auto\"")
    local joined
    joined=$(printf '%s, ' "${plots[@]}")
    echo "plot ${joined%, }"
  done
  echo "unset multiplot"
}

for op in alltoall allreduce allgather reduce_scatter; do
  grep -q ",$op," "$csv" || continue
  png=$out_dir/collectives_$op.png
  gnuplot_script "$op" "$png" >"$plot_dir/$op.gp"
  gnuplot "$plot_dir/$op.gp" || { log "gnuplot failed on $plot_dir/$op.gp"; status=1; }
  if [ -n "$img_dir" ] && [ -f "$png" ]; then mkdir -p "$img_dir"; cp "$png" "$img_dir/"; fi
done
log "summary: $out_dir/summary.md; plots: $out_dir/collectives_<op>.png${img_dir:+ (copied to $img_dir)}"
exit $status
