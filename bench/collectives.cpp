// bench_collectives: kompress's compressed collectives (alltoall, allreduce, allgather,
// reduce_scatter) against plain MPI, measured
// in the same run, on real data, over whatever link the job runs on. bench/collectives_sweep.sh
// runs it over a rate-limited loopback (tc in a private network namespace) at 1, 2.5, 5 and
// 10 Gb/s and over shared memory; docs/performance.md shows the results.
//
// For each data set (--data), operation (--ops) and message size (4, 16 and 64 KiB, then 1 .. 64
// MiB per peer, --min-bytes/--max-bytes), eight variants:
//   plain       MPI_Alltoall / MPI_Allreduce(MPI_SUM) / MPI_Allgather /
//               MPI_Reduce_scatter_block(MPI_SUM) on the same buffers: the baseline
//   raw         kompress with transfer_mode::raw (what kompress costs when it does nothing)
//   compressed  kompress with transfer_mode::compressed at the fixed REL bound (--bound), each
//               message compressed whole before it leaves (cost_model::pipeline = false)
//   pipelined   the same, each message cut into chunks that are compressed, sent and decoded
//               in a pipeline (the default; chunk size from the cost model)
//   auto        kompress with transfer_mode::automatic, pipelined; its cost model holds the link rate of
//               the run (--link-gbps, or the measured ping-pong rate with --link-gbps measure)
//               and the codec throughputs this bench measures once at start on each data set
//               (one thread, the fastest of several calls), agreed across ranks with
//               MPI_Allreduce(MIN) as the cost model requires
//   mpi-pers    MPI's own persistent collective (MPI_Alltoall_init, MPI_Allreduce_init, ...),
//               set up once, MPI_Start + MPI_Wait per call: a second baseline
//   p-raw       kompress::alltoall_init / allreduce_init / ... in raw mode, set up once (the
//               agreement happens there), persistent_request::run() per call
//   p-auto      the same in automatic mode: the decision (raw or compressed) taken at init
// alltoall moves `bytes` per peer (a send buffer of p x bytes per rank); allreduce sums a
// buffer of `bytes` per rank; allgather gathers `bytes` from every rank (receive: p x bytes);
// reduce_scatter sums blocks of `bytes` (send: p x bytes).
//
// Overlap (alltoall): after the rounds, the three stages of the pipelined variant are timed
// alone, each the fastest of 3: compressing every outgoing block whole, plain MPI_Alltoall of
// the compressed size, decompressing every incoming block whole. The CSV's stage_* columns
// hold them on the pipelined row; the pipelined time against their sum (no overlap) and their
// maximum (perfect overlap) is the overlap achieved.
//
// Data: the real arrays of the data folder (support/real_data.hpp), tiled to the buffer
// size, each rank starting at a different offset: "dlrm" (DLRM embedding lookups,
// dlrm_flights_lookup_fwd_1024x10x128.f32) and "act" (MLP activations after a ReLU,
// act_mlp_relu2_out_1024x1024.f32).
//
// Timing: one untimed call of every variant first (the warm-up, and the error check below),
// then rounds in which every variant runs once after an MPI_Barrier, in an order that changes
// from round to round (a shuffle, seeded alike on every rank). Rounds: 15 for up to 64 KiB, 15, 9, 5 and 3 for 1, 4, 16 and 64 MiB
// (x --reps-scale), and more, up to 25, where the untimed calls say that a round takes less
// than --round-budget-s / that count (fast links get more samples). Small messages are timed
// as a batch of back-to-back calls divided by their number: as many calls as make about 5 ms
// by the untimed calls, at most 1 MiB / size. A sample's time is the maximum over ranks
// (MPI_Allreduce MAX). Reported: the fastest and the median round of each variant, and the
// speedup over plain MPI as the median over rounds of plain's time / the variant's time in the
// same round (--stat paired, the default: the two ran a moment apart, under the same load
// from whatever else shares the machine, so the ratio cancels most of it); --stat min or
// median use the ratio of the fastest or of the median times instead. The CSV holds all three.
//
// Error: the untimed call runs with measure_error (the library's own measure, alltoall) and
// its result is compared element by element with plain MPI's: max |kompress - MPI| over all
// ranks, which must stay within the call's absolute bound (allreduce: p x the per-hop bound,
// plus float summation slack); allreduce results must also be bit-identical across ranks.
// A violation prints "CHECK FAILED" and makes the exit status 1.
//
// Output: a table on rank 0's stdout and a CSV (--csv; --append adds rows to an existing
// file without a second header).
//
//   mpiexec -n 2 bench_collectives [--link-gbps G|measure] [--link-name NAME]
//       [--max-bytes N[KMG]] [--min-bytes N[KMG]] [--ops alltoall,allreduce] [--data dlrm,act]
//       [--bound 1e-2] [--reps-scale 1.0] [--round-budget-s 2] [--stat paired|min|median]
//       [--block-size 32] [--chunk-bytes N[KMG]] [--csv PATH] [--append]
//
// Run ranks with OMP_NUM_THREADS=1: the codec then runs on one core per rank, and 2 ranks fill
// a 2-core machine. More ranks than cores oversubscribe; the header says so.

#include "real_data.hpp"

#include "support.hpp"

#include <kompress/comm.hpp>

#include <Kokkos_Core.hpp>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <numeric>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <sched.h>

namespace {

using host_exec = Kokkos::DefaultHostExecutionSpace;
using values_view = Kokkos::View<float*, Kokkos::HostSpace>;
using namespace kompress_bench;
constexpr double nan = std::numeric_limits<double>::quiet_NaN();
constexpr std::size_t KiB = 1024, MiB = 1024 * KiB;

int world_rank = 0, world_size = 1;

void check_mpi(int code, const char* call) {
  if (code != MPI_SUCCESS) throw std::runtime_error(std::string("bench_collectives: ") + call + " failed");
}

// ---------------------------------------------------------------------------------------------
// Options

struct options {
  std::size_t min_bytes = 4 * KiB, max_bytes = 64 * MiB;
  std::vector<std::string> ops = {"alltoall", "allreduce", "allgather", "reduce_scatter"};
  std::vector<std::string> data = {"dlrm", "act"};
  double rel_bound = 1e-2;
  double link_gbps = nan;  // NaN: use the measured ping-pong rate
  std::string link_name;   // a label for the table and CSV ("1gbit", "shm", ...)
  double reps_scale = 1.0;
  double round_budget_s = 2.0;  // more rounds where a round is cheap (--round-budget-s)
  std::string stat = "paired";  // --stat: which speedup is the speedup
  int block_size = 32;
  std::size_t chunk_bytes = 0;  ///< pipelined and auto: a fixed chunk size (0: the cost model's)
  std::string csv = "bench_collectives.csv";
  bool append = false;
};

[[noreturn]] void usage(const std::string& complaint) {
  if (world_rank == 0)
    std::fprintf(stderr,
                 "bench_collectives: %s\n"
                 "usage: mpiexec -n P bench_collectives [--link-gbps G|measure] [--link-name NAME]\n"
                 "         [--max-bytes N[K|M|G]] [--min-bytes N[K|M|G]] [--ops alltoall,allreduce,allgather,reduce_scatter]\n"
                 "         [--data dlrm,act] [--bound REL] [--reps-scale X] [--round-budget-s S]\n"
                 "         [--stat paired|min|median] [--block-size 32|64|128] [--chunk-bytes N] [--csv PATH] [--append]\n",
                 complaint.c_str());
  MPI_Finalize();
  std::exit(2);
}

options parse_options(int argc, char** argv) {
  options opts;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "-h" || arg == "--help") usage("help");
    if (arg == "--append") {
      opts.append = true;
      continue;
    }
    if (i + 1 >= argc) usage("missing value after " + arg);
    const std::string value = argv[++i];
    try {
      if (arg == "--link-gbps") {
        opts.link_gbps = value == "measure" ? nan : std::stod(value);
        if (!(opts.link_gbps > 0.0) && value != "measure") usage("--link-gbps must be > 0 or 'measure'");
      } else if (arg == "--link-name") {
        opts.link_name = value;
      } else if (arg == "--max-bytes") {
        opts.max_bytes = parse_bytes(value);
      } else if (arg == "--min-bytes") {
        opts.min_bytes = parse_bytes(value);
      } else if (arg == "--ops") {
        opts.ops = split(value, ',');
        for (const auto& op : opts.ops)
          if (op != "alltoall" && op != "allreduce" && op != "allgather" && op != "reduce_scatter")
            usage("unknown op " + op);
      } else if (arg == "--data") {
        opts.data = split(value, ',');
        for (const auto& d : opts.data)
          if (d != "dlrm" && d != "act") usage("unknown data set " + d + " (dlrm, act)");
      } else if (arg == "--bound") {
        opts.rel_bound = std::stod(value);
        if (!(opts.rel_bound > 0.0)) usage("--bound must be > 0");
      } else if (arg == "--reps-scale") {
        opts.reps_scale = std::stod(value);
        if (!(opts.reps_scale > 0.0)) usage("--reps-scale must be > 0");
      } else if (arg == "--round-budget-s") {
        opts.round_budget_s = std::stod(value);
        if (!(opts.round_budget_s >= 0.0)) usage("--round-budget-s must be >= 0");
      } else if (arg == "--stat") {
        if (value != "paired" && value != "min" && value != "median") usage("--stat is paired, min or median");
        opts.stat = value;
      } else if (arg == "--chunk-bytes") {
        opts.chunk_bytes = parse_bytes(value);
      } else if (arg == "--block-size") {
        opts.block_size = std::stoi(value);
      } else if (arg == "--csv") {
        opts.csv = value;
      } else {
        usage("unknown option " + arg);
      }
    } catch (const std::logic_error&) {
      usage("bad value '" + value + "' for " + arg);
    }
  }
  if (opts.link_name.empty()) {
    std::ostringstream name;
    if (std::isnan(opts.link_gbps)) name << "measured";
    else name << opts.link_gbps << "gbit";
    opts.link_name = name.str();
  }
  return opts;
}

// ---------------------------------------------------------------------------------------------
// The machine

int usable_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return CPU_COUNT(&set);
  return int(std::thread::hardware_concurrency());
}

/// Ranks on this rank's host, by processor name (MPI_COMM_TYPE_SHARED follows the transport:
/// with MPIR_CVAR_NOLOCAL=1 every rank is alone in its shared-memory group).
int host_ranks() {
  char name[MPI_MAX_PROCESSOR_NAME] = {};
  int length = 0;
  check_mpi(MPI_Get_processor_name(name, &length), "MPI_Get_processor_name");
  std::vector<char> names(std::size_t(world_size) * MPI_MAX_PROCESSOR_NAME);
  check_mpi(MPI_Allgather(name, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, names.data(), MPI_MAX_PROCESSOR_NAME, MPI_CHAR,
                          MPI_COMM_WORLD),
            "MPI_Allgather");
  int same = 0;
  for (int r = 0; r < world_size; ++r)
    same += std::strncmp(name, names.data() + std::size_t(r) * MPI_MAX_PROCESSOR_NAME, MPI_MAX_PROCESSOR_NAME) == 0;
  return same;
}

/// Bytes per second between ranks 0 and 1, one direction, from a ping-pong of `bytes`: the
/// fastest of a few round trips (each counted as 2 x bytes). The other ranks wait.
double ping_pong_rate(std::size_t bytes) {
  std::vector<char> buffer(bytes, 1);
  double best = std::numeric_limits<double>::infinity();
  const int count = int(bytes);
  for (int round = 0; round < 4; ++round) {
    check_mpi(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier");
    const auto start = clock_type::now();
    if (world_rank == 0) {
      check_mpi(MPI_Send(buffer.data(), count, MPI_BYTE, 1, 7, MPI_COMM_WORLD), "MPI_Send");
      check_mpi(MPI_Recv(buffer.data(), count, MPI_BYTE, 1, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE), "MPI_Recv");
    } else if (world_rank == 1) {
      check_mpi(MPI_Recv(buffer.data(), count, MPI_BYTE, 0, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE), "MPI_Recv");
      check_mpi(MPI_Send(buffer.data(), count, MPI_BYTE, 0, 7, MPI_COMM_WORLD), "MPI_Send");
    }
    const double seconds = std::chrono::duration<double>(clock_type::now() - start).count();
    if (round > 0) best = std::min(best, seconds);  // round 0 sets up the connection
  }
  double rate = 2.0 * double(bytes) / best;
  check_mpi(MPI_Bcast(&rate, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD), "MPI_Bcast");
  return rate;
}

// ---------------------------------------------------------------------------------------------
// Data

struct dataset {
  std::string key, file, family;
  std::vector<float> values;
  // Measured at start on this data (one thread, fastest call), MIN over ranks.
  double compress_bytes_per_second = nan, decompress_bytes_per_second = nan, probe_ratio = nan;
};

std::string file_of(const std::string& key) {
  if (key == "dlrm") return "dlrm_flights_lookup_fwd_1024x10x128.f32";
  return "act_mlp_relu2_out_1024x1024.f32";
}

/// Fastest of a warm-up plus `calls` calls of f, in seconds.
template <class F>
double fastest(F&& f, int calls) {
  f();
  double best = std::numeric_limits<double>::infinity();
  for (int i = 0; i < calls; ++i) {
    const auto start = clock_type::now();
    f();
    best = std::min(best, std::chrono::duration<double>(clock_type::now() - start).count());
  }
  return best;
}

/// The codec's throughput on 4 MiB of this rank's tiled data at the run's REL bound (resolved
/// over the tile, as alltoall resolves it over the send buffer), on the calling thread's
/// execution space; then the slowest rank's numbers, so that every rank's cost model agrees.
void measure_codec(dataset& data, const options& opts) {
  const std::size_t count = 4 * MiB / sizeof(float);
  values_view tile(Kokkos::view_alloc(Kokkos::WithoutInitializing, "bench::probe"), count);
  fill_tiled(data.values, tile.data(), count, world_rank, world_size);
  const kompress::compress_options copts{.bound = kompress::relative(opts.rel_bound), .block_size = opts.block_size};
  Kokkos::View<std::byte*, Kokkos::HostSpace> stream("bench::probe_stream", kompress::max_compressed_size(tile, copts));
  values_view back(Kokkos::view_alloc(Kokkos::WithoutInitializing, "bench::probe_back"), count);
  const host_exec exec;
  std::size_t length = 0;
  const double c = fastest([&] { length = kompress::compress(exec, tile, stream, copts); }, 5);
  const auto packed = Kokkos::subview(stream, std::pair<std::size_t, std::size_t>(0, length));
  const double d = fastest([&] { kompress::decompress(exec, packed, back); }, 5);
  double local[3] = {double(count * sizeof(float)) / c, double(count * sizeof(float)) / d,
                     double(count * sizeof(float)) / double(length)};
  check_mpi(MPI_Allreduce(MPI_IN_PLACE, local, 3, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD), "MPI_Allreduce");
  data.compress_bytes_per_second = local[0];
  data.decompress_bytes_per_second = local[1];
  data.probe_ratio = local[2];
}

// ---------------------------------------------------------------------------------------------
// The variants

enum class variant {
  plain, raw, compressed, pipelined, automatic,
  mpi_persistent,   // MPI's own persistent collective (MPI_Allreduce_init ...; MPI_Start + MPI_Wait)
  persistent_raw,   // kompress::*_init in raw mode, each round persistent_request::run()
  persistent_auto,  // kompress::*_init in automatic mode, each round run()
};
constexpr variant all_variants[] = {variant::plain,     variant::raw,           variant::compressed,
                                    variant::pipelined, variant::automatic,     variant::mpi_persistent,
                                    variant::persistent_raw, variant::persistent_auto};
const char* name_of(variant v) {
  switch (v) {
    case variant::plain: return "plain";
    case variant::raw: return "raw";
    case variant::compressed: return "compressed";
    case variant::pipelined: return "pipelined";
    case variant::mpi_persistent: return "mpi-pers";
    case variant::persistent_raw: return "p-raw";
    case variant::persistent_auto: return "p-auto";
    default: return "auto";
  }
}


struct run_context {
  const options& opts;
  kompress::cost_model cost;
  double link_gbps_used = nan, link_gbps_measured = nan;
  bool oversubscribed = false;
  int threads = 1;
  double load = nan;  // 1-minute load average at the end of the run
  kompress::comm_workspace* workspace = nullptr;  // reused by every kompress call, as a training loop would
};

kompress::collective_options options_for(variant v, const run_context& ctx, bool measure_error) {
  kompress::collective_options o;
  o.codec = {.bound = kompress::relative(ctx.opts.rel_bound), .block_size = ctx.opts.block_size};
  o.cost = ctx.cost;
  o.cost.pipeline = v != variant::compressed;  // compressed: whole messages, the previous path
  o.cost.fixed_chunk_bytes = ctx.opts.chunk_bytes;
  o.measure_error = measure_error;
  o.mode = v == variant::raw || v == variant::persistent_raw         ? kompress::transfer_mode::raw
           : v == variant::compressed || v == variant::pipelined ? kompress::transfer_mode::compressed
                                                                     : kompress::transfer_mode::automatic;
  return o;
}

/// The persistent variants of one operation on one pair of buffers, set up once (as a training
/// loop would) and run every round.
struct persistent_set {
  MPI_Request mpi = MPI_REQUEST_NULL;  // MPI's own persistent collective
  kompress::persistent_request raw, automatic;

  persistent_set(const std::string& op, const values_view& send, const values_view& recv, const run_context& ctx) {
    const auto make = [&](variant v) {
      const auto o = options_for(v, ctx, false);
      if (op == "alltoall") return kompress::alltoall_init(host_exec(), send, recv, MPI_COMM_WORLD, o);
      if (op == "allgather") return kompress::allgather_init(host_exec(), send, recv, MPI_COMM_WORLD, o);
      if (op == "reduce_scatter") return kompress::reduce_scatter_init(host_exec(), send, recv, MPI_COMM_WORLD, o);
      return kompress::allreduce_init(host_exec(), send, recv, MPI_COMM_WORLD, o);
    };
    raw = make(variant::persistent_raw);
    automatic = make(variant::persistent_auto);
    const int p = world_size;
    if (op == "alltoall") {
      const int count = int(send.size() / std::size_t(p));
      check_mpi(MPI_Alltoall_init(send.data(), count, MPI_FLOAT, recv.data(), count, MPI_FLOAT, MPI_COMM_WORLD,
                                  MPI_INFO_NULL, &mpi),
                "MPI_Alltoall_init");
    } else if (op == "allgather") {
      check_mpi(MPI_Allgather_init(send.data(), int(send.size()), MPI_FLOAT, recv.data(), int(send.size()), MPI_FLOAT,
                                   MPI_COMM_WORLD, MPI_INFO_NULL, &mpi),
                "MPI_Allgather_init");
    } else if (op == "reduce_scatter") {
      check_mpi(MPI_Reduce_scatter_block_init(send.data(), recv.data(), int(recv.size()), MPI_FLOAT, MPI_SUM,
                                              MPI_COMM_WORLD, MPI_INFO_NULL, &mpi),
                "MPI_Reduce_scatter_block_init");
    } else {
      check_mpi(MPI_Allreduce_init(send.data(), recv.data(), int(send.size()), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD,
                                   MPI_INFO_NULL, &mpi),
                "MPI_Allreduce_init");
    }
  }
  persistent_set(const persistent_set&) = delete;
  persistent_set& operator=(const persistent_set&) = delete;
  ~persistent_set() {
    if (mpi != MPI_REQUEST_NULL) MPI_Request_free(&mpi);
  }
};

kompress::collective_report plain_report(const std::string& op, const values_view& send);

/// One call of `v`; returns the library's report (plain MPI: a report of what it moves).
kompress::collective_report call(const std::string& op, variant v, const values_view& send, const values_view& recv,
                                 const run_context& ctx, bool measure_error, persistent_set& persistent) {
  if (v == variant::mpi_persistent) {
    check_mpi(MPI_Start(&persistent.mpi), "MPI_Start");
    check_mpi(MPI_Wait(&persistent.mpi, MPI_STATUS_IGNORE), "MPI_Wait");
    return plain_report(op, send);
  }
  if (v == variant::persistent_raw) return persistent.raw.run();
  if (v == variant::persistent_auto) return persistent.automatic.run();
  const int p = world_size;
  const std::uint64_t bytes = send.size() * sizeof(float);
  if (v == variant::plain) {
    kompress::collective_report r;
    if (op == "alltoall") {
      const int count = int(send.size() / std::size_t(p));
      check_mpi(MPI_Alltoall(send.data(), count, MPI_FLOAT, recv.data(), count, MPI_FLOAT, MPI_COMM_WORLD),
                "MPI_Alltoall");
      r.payload_bytes = r.wire_bytes = bytes / std::uint64_t(p) * std::uint64_t(p - 1);
      r.messages = std::uint64_t(p - 1);
    } else if (op == "allgather") {
      check_mpi(MPI_Allgather(send.data(), int(send.size()), MPI_FLOAT, recv.data(), int(send.size()), MPI_FLOAT,
                              MPI_COMM_WORLD),
                "MPI_Allgather");
      r.payload_bytes = r.wire_bytes = bytes * std::uint64_t(p - 1);  // a ring's volume
      r.messages = std::uint64_t(p - 1);
    } else if (op == "reduce_scatter") {
      check_mpi(MPI_Reduce_scatter_block(send.data(), recv.data(), int(recv.size()), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD),
                "MPI_Reduce_scatter_block");
      r.payload_bytes = r.wire_bytes = bytes / std::uint64_t(p) * std::uint64_t(p - 1);  // a ring's volume
      r.messages = std::uint64_t(p - 1);
    } else {
      check_mpi(MPI_Allreduce(send.data(), recv.data(), int(send.size()), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD),
                "MPI_Allreduce");
      // What a bandwidth-optimal allreduce (reduce-scatter + allgather, MPICH's choice for large
      // messages) sends per rank: a model, MPI does not say.
      r.payload_bytes = r.wire_bytes = bytes * std::uint64_t(2 * (p - 1)) / std::uint64_t(p);
      r.messages = std::uint64_t(2 * (p - 1));
    }
    return r;
  }
  const auto o = options_for(v, ctx, measure_error);
  if (op == "alltoall") return kompress::alltoall(host_exec(), send, recv, MPI_COMM_WORLD, o, ctx.workspace);
  if (op == "allgather") return kompress::allgather(host_exec(), send, recv, MPI_COMM_WORLD, o, ctx.workspace);
  if (op == "reduce_scatter")
    return kompress::reduce_scatter(host_exec(), send, recv, MPI_COMM_WORLD, o, ctx.workspace);
  return kompress::allreduce(host_exec(), send, recv, MPI_COMM_WORLD, o, ctx.workspace);
}

/// What plain MPI moves, as call() reports it (a model; MPI does not say).
kompress::collective_report plain_report(const std::string& op, const values_view& send) {
  const int p = world_size;
  const std::uint64_t bytes = send.size() * sizeof(float);
  kompress::collective_report r;
  if (op == "alltoall") r.payload_bytes = bytes / std::uint64_t(p) * std::uint64_t(p - 1);
  else if (op == "allgather") r.payload_bytes = bytes * std::uint64_t(p - 1);
  else if (op == "reduce_scatter") r.payload_bytes = bytes / std::uint64_t(p) * std::uint64_t(p - 1);
  else r.payload_bytes = bytes * std::uint64_t(2 * (p - 1)) / std::uint64_t(p);
  r.wire_bytes = r.payload_bytes;
  r.messages = std::uint64_t(op == "allreduce" ? 2 * (p - 1) : p - 1);
  return r;
}

struct row {
  std::string op, data;
  std::size_t bytes = 0;
  variant v = variant::plain;
  int reps = 0, calls = 1;
  double median = nan, best = nan;
  double speedup = nan, speedup_paired = nan, speedup_median = nan, speedup_best = nan;
  std::uint64_t payload = 0, wire = 0, messages = 0, compressed_messages = 0;  // sums over ranks
  double abs_bound = 0.0, max_error = nan, library_max_error = nan;
  std::uint64_t chunks = 0;  // MPI messages, sum over ranks
  double stage_compress = nan, stage_wire = nan, stage_decompress = nan;  // seconds (alltoall, pipelined)
  double stage_prepare = nan;  // the REL bound's range pass, before any chunk can leave
  bool ok = true;
  std::string problem;
};

/// Calls per timed sample: small messages are timed as a batch of back-to-back calls, so that
/// a sample is well above the timer's and the barrier's noise: enough calls for about 5 ms of
/// the variants' untimed calls (`round_seconds`, all variants), at most 1 MiB per peer in all.
int calls_per_sample(std::size_t bytes, double round_seconds, std::size_t variants) {
  const int most = int(std::max<std::size_t>(1, MiB / bytes));
  const double per_call = round_seconds / double(variants);
  if (!(per_call > 0.0)) return most;
  return std::clamp(int(std::ceil(0.005 / per_call)), 1, most);
}

int reps_for(std::size_t bytes, double scale) {
  int reps = bytes <= 64 * KiB ? 15 : bytes <= 1 * MiB ? 15 : bytes <= 4 * MiB ? 9 : bytes <= 16 * MiB ? 5 : 3;
  return std::max(1, int(std::lround(reps * scale)));
}

double median_of(std::vector<double> xs) {
  std::sort(xs.begin(), xs.end());
  const std::size_t n = xs.size();
  return n % 2 ? xs[n / 2] : 0.5 * (xs[n / 2 - 1] + xs[n / 2]);
}

std::uint64_t fnv1a(const float* values, std::size_t count) {
  std::uint64_t hash = 1469598103934665603ull;
  const auto* bytes = reinterpret_cast<const unsigned char*>(values);
  for (std::size_t i = 0; i < count * sizeof(float); ++i) hash = (hash ^ bytes[i]) * 1099511628211ull;
  return hash;
}

/// The pipelined alltoall's three stages, each alone (the fastest of 3, the slowest rank):
/// compress every outgoing block whole, plain MPI_Alltoall of the compressed size (the
/// pipelined row's wire bytes), decompress every incoming block whole.
void time_stages(row& r, const values_view& send, const values_view& recv, std::size_t per_peer,
                 const run_context& ctx) {
  const int p = world_size;
  const host_exec exec;
  kompress::compress_options copts{.bound = kompress::relative(ctx.opts.rel_bound), .block_size = ctx.opts.block_size};
  double bound = 0.0;
  // Before the pipeline starts: the REL bound's range pass (the block to itself, copied while
  // the last chunks travel, is left out: plain MPI_Alltoall copies it too).
  // The library's own range pass: the blocks to the other ranks, by the backend's reduction
  // (kompress::absolute_bound would read the block to itself too).
  std::vector<std::size_t> displs(std::size_t(p), 0);
  for (int peer = 0; peer < p; ++peer) displs[std::size_t(peer)] = std::size_t(peer) * per_peer;
  const double prepare = fastest(
      [&] {
        namespace kd = kompress::detail;
        auto keys = kd::range_keys(exec, send.data(), 0, false, 0u);
        for (int peer = 0; peer < p; ++peer)
          if (peer != world_rank)
            keys = kd::join_keys(keys, kd::range_keys(exec, send.data() + displs[std::size_t(peer)], per_peer, false, 0u));
        bound = kd::bound_for(copts, keys);
      },
      3);
  copts.bound = kompress::absolute(bound);
  const std::size_t room = kompress::max_compressed_size<float>(per_peer, ctx.opts.block_size);
  Kokkos::View<std::byte*, Kokkos::HostSpace> streams("bench::stages", room * std::size_t(p));
  std::vector<std::size_t> lengths(std::size_t(p), 0);
  const auto block = [&](const values_view& v, int peer) {
    return Kokkos::subview(v, std::pair<std::size_t, std::size_t>(std::size_t(peer) * per_peer,
                                                                  std::size_t(peer + 1) * per_peer));
  };
  const auto stream = [&](int peer, std::size_t length) {
    return Kokkos::subview(streams, std::pair<std::size_t, std::size_t>(std::size_t(peer) * room,
                                                                        std::size_t(peer) * room + length));
  };
  const auto others = [&](auto&& f) {
    for (int step = 1; step < p; ++step) f((world_rank + step) % p);
  };
  double t[4] = {
      fastest([&] { others([&](int peer) { lengths[std::size_t(peer)] = kompress::compress(exec, block(send, peer), stream(peer, room), copts); }); }, 3),
      0.0,
      fastest([&] { others([&](int peer) { kompress::decompress(exec, stream(peer, lengths[std::size_t(peer)]), block(recv, peer)); }); }, 3),
      prepare};
  const int wire_per_peer = int(std::max<std::uint64_t>(1, r.wire / std::uint64_t(p) / std::uint64_t(std::max(1, p - 1))));
  std::vector<char> out(std::size_t(wire_per_peer) * std::size_t(p)), in(out.size());
  t[1] = fastest([&] {
    check_mpi(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier");
    check_mpi(MPI_Alltoall(out.data(), wire_per_peer, MPI_BYTE, in.data(), wire_per_peer, MPI_BYTE, MPI_COMM_WORLD),
              "MPI_Alltoall");
  }, 3);
  check_mpi(MPI_Allreduce(MPI_IN_PLACE, t, 4, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD), "MPI_Allreduce");
  r.stage_compress = t[0];
  r.stage_wire = t[1];
  r.stage_decompress = t[2];
  r.stage_prepare = t[3];
}

/// Every variant of one operation at one size: the untimed checked call, then the rounds.
std::vector<row> measure(const std::string& op, const dataset& data, std::size_t bytes, const run_context& ctx) {
  const int p = world_size;
  const std::size_t per_peer = bytes / sizeof(float);
  const bool sums = op == "allreduce" || op == "reduce_scatter";
  const std::size_t count = op == "alltoall" || op == "reduce_scatter" ? per_peer * std::size_t(p) : per_peer;
  const std::size_t recv_count = op == "alltoall" || op == "allgather" ? per_peer * std::size_t(p) : per_peer;
  values_view send(Kokkos::view_alloc(Kokkos::WithoutInitializing, "bench::send"), count);
  values_view recv(Kokkos::view_alloc(Kokkos::WithoutInitializing, "bench::recv"), recv_count);
  values_view reference(Kokkos::view_alloc(Kokkos::WithoutInitializing, "bench::reference"), recv_count);
  fill_tiled(data.values, send.data(), count, world_rank, p);
  // The sum's magnitude, for the float summation slack of the allreduce check.
  double abs_sum_bound = 0.0;
  if (sums) {
    float local_max = 0.0f;
    for (std::size_t i = 0; i < count; ++i) local_max = std::max(local_max, std::fabs(send.data()[i]));
    double m = local_max;
    check_mpi(MPI_Allreduce(MPI_IN_PLACE, &m, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD), "MPI_Allreduce");
    abs_sum_bound = m * p;
  }

  persistent_set persistent(op, send, recv, ctx);  // init: checked and agreed once
  std::vector<row> rows;
  for (variant v : all_variants) {
    row r;
    r.op = op;
    r.data = data.key;
    r.bytes = bytes;
    r.v = v;
    rows.push_back(r);
  }

  // The untimed call of each variant: warm-up and error check against plain MPI's result.
  double round_estimate = 0.0;  // seconds, this rank's untimed calls (the check included)
  for (row& r : rows) {
    std::fill_n(recv.data(), recv_count, std::numeric_limits<float>::quiet_NaN());
    const auto check_start = clock_type::now();
    const kompress::collective_report report = call(op, r.v, send, recv, ctx, true, persistent);
    round_estimate += std::chrono::duration<double>(clock_type::now() - check_start).count();
    if (r.v == variant::plain) {
      std::memcpy(reference.data(), recv.data(), recv_count * sizeof(float));
      r.max_error = 0.0;
      continue;
    }
    double local[3] = {0.0, std::isnan(report.max_error) ? -1.0 : report.max_error, report.absolute_bound};
    std::size_t nonfinite = 0;
    for (std::size_t i = 0; i < recv_count; ++i) {
      const double got = recv.data()[i], want = reference.data()[i];
      if (!std::isfinite(got)) ++nonfinite;
      else local[0] = std::max(local[0], std::fabs(got - want));
    }
    if (nonfinite) local[0] = std::numeric_limits<double>::infinity();
    check_mpi(MPI_Allreduce(MPI_IN_PLACE, local, 3, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD), "MPI_Allreduce");
    r.max_error = local[0];
    r.library_max_error = local[1] < 0.0 ? nan : local[1];
    r.abs_bound = local[2];
    // allreduce: MPI sums in another order; allow float rounding of a p-term sum on top.
    const double slack = sums ? 2.0 * p * std::numeric_limits<float>::epsilon() * abs_sum_bound : 0.0;
    if (!(r.max_error <= r.abs_bound + slack)) {
      r.ok = false;
      r.problem += "max |kompress - MPI| above the bound; ";
    }
    if (op == "allreduce" || op == "allgather") {
      const std::uint64_t hash = fnv1a(recv.data(), recv_count);
      std::uint64_t extremes[2] = {hash, ~hash};
      check_mpi(MPI_Allreduce(MPI_IN_PLACE, extremes, 2, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD), "MPI_Allreduce");
      if (extremes[0] != ~extremes[1]) {
        r.ok = false;
        r.problem += "results differ across ranks; ";
      }
    }
  }

  // The timed rounds: every variant once per round, after a barrier, in a new random order each
  // round (seeded alike on every rank) so that no variant always runs after the same one: a
  // call right after a compressed one finds its buffers evicted from the caches, and one right
  // after plain MPI over a tc-shaped link finds the token bucket drained (a cyclic rotation
  // kept auto always after compressed, and the permutations in lexicographic order kept plain
  // and raw first in every round of the 5 taken at 16 MiB).
  check_mpi(MPI_Allreduce(MPI_IN_PLACE, &round_estimate, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD), "MPI_Allreduce");
  const std::size_t variants = rows.size();
  const int calls = calls_per_sample(bytes, round_estimate, variants);
  int reps = reps_for(bytes, ctx.opts.reps_scale);
  if (round_estimate > 0.0)
    reps = std::max(reps, std::min(25, int(ctx.opts.round_budget_s / (round_estimate * calls))));
  std::vector<double> seconds(variants * std::size_t(reps));
  std::vector<kompress::collective_report> last(variants);
  std::vector<std::size_t> order(variants);
  std::iota(order.begin(), order.end(), std::size_t(0));
  std::mt19937 shuffler{std::uint32_t(bytes)};  // the same seed, so the same orders, on every rank
  for (int rep = 0; rep < reps; ++rep) {
    std::shuffle(order.begin(), order.end(), shuffler);
    for (const std::size_t k : order) {
      check_mpi(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier");
      const auto start = clock_type::now();
      for (int c = 0; c < calls; ++c) last[k] = call(op, rows[k].v, send, recv, ctx, false, persistent);
      seconds[std::size_t(rep) * variants + k] =
          std::chrono::duration<double>(clock_type::now() - start).count() / calls;
    }
  }
  check_mpi(MPI_Allreduce(MPI_IN_PLACE, seconds.data(), int(seconds.size()), MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD),
            "MPI_Allreduce");
  for (std::size_t k = 0; k < variants; ++k) {
    std::vector<double> mine;
    for (int rep = 0; rep < reps; ++rep) mine.push_back(seconds[std::size_t(rep) * variants + k]);
    row& r = rows[k];
    r.reps = reps;
    r.calls = calls;
    r.median = median_of(mine);
    r.best = *std::min_element(mine.begin(), mine.end());
    std::uint64_t totals[5] = {last[k].payload_bytes, last[k].wire_bytes, last[k].messages,
                               last[k].compressed_messages, last[k].chunks};
    check_mpi(MPI_Allreduce(MPI_IN_PLACE, totals, 5, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD), "MPI_Allreduce");
    r.payload = totals[0];
    r.wire = totals[1];
    r.messages = totals[2];
    r.compressed_messages = totals[3];
    r.chunks = totals[4];
  }
  for (std::size_t k = 0; k < variants; ++k) {
    row& r = rows[k];
    std::vector<double> ratios;  // plain's time / this variant's, round by round
    for (int rep = 0; rep < reps; ++rep)
      ratios.push_back(seconds[std::size_t(rep) * variants] / seconds[std::size_t(rep) * variants + k]);
    r.speedup_paired = median_of(ratios);
    r.speedup_median = rows[0].median / r.median;
    r.speedup_best = rows[0].best / r.best;
    r.speedup = ctx.opts.stat == "paired" ? r.speedup_paired
                : ctx.opts.stat == "median" ? r.speedup_median
                                            : r.speedup_best;
  }
  if (op == "alltoall") time_stages(rows[3], send, recv, per_peer, ctx);
  return rows;
}

// ---------------------------------------------------------------------------------------------
// Output

const char* auto_decision(const row& r) {
  if (r.v == variant::plain || r.v == variant::raw || r.v == variant::mpi_persistent ||
      r.v == variant::persistent_raw)
    return "";
  if (r.compressed_messages == 0) return "raw";
  if (r.compressed_messages == r.messages) return "compressed";
  return "mixed";
}

void print_row(const row& r) {
  std::printf("%-14s %-4s %7s  %-10s %10.3f %10.3f %7.2fx %11.2f %6.2f %7llu %10.3g %10.3g %-10s %s\n", r.op.c_str(),
              r.data.c_str(), human_bytes(r.bytes).c_str(), name_of(r.v), r.best * 1e3, r.median * 1e3, r.speedup,
              double(r.wire) / double(MiB), r.wire ? double(r.payload) / double(r.wire) : 1.0,
              static_cast<unsigned long long>(r.chunks), r.max_error, r.abs_bound, auto_decision(r),
              r.ok ? "" : ("CHECK FAILED: " + r.problem).c_str());
  if (!std::isnan(r.stage_compress)) {
    // Serial: range pass + the three stages; perfect overlap: range pass + the slowest stage.
    const double sum = r.stage_prepare + r.stage_compress + r.stage_wire + r.stage_decompress;
    const double most = r.stage_prepare + std::max({r.stage_compress, r.stage_wire, r.stage_decompress});
    std::printf("%-14s   stages alone (ms): range %.2f, compress %.2f, wire %.2f, decompress %.2f; serial %.2f, "
                "overlapped %.2f; pipelined best %.2f: overlap %.0f%% of the possible\n",
                "", r.stage_prepare * 1e3, r.stage_compress * 1e3, r.stage_wire * 1e3, r.stage_decompress * 1e3,
                sum * 1e3, most * 1e3, r.best * 1e3, sum > most ? 100.0 * (sum - r.best) / (sum - most) : 0.0);
  }
}

void write_csv(const std::vector<row>& rows, const std::vector<dataset>& sets, const run_context& ctx) {
  bool header = true;
  if (ctx.opts.append) {
    std::ifstream existing(ctx.opts.csv);
    header = !existing || existing.peek() == std::ifstream::traits_type::eof();
  }
  std::ofstream out(ctx.opts.csv, ctx.opts.append ? std::ios::app : std::ios::trunc);
  if (!out) throw std::runtime_error("bench_collectives: cannot write " + ctx.opts.csv);
  if (header)
    out << "link,link_gbps,link_gbps_measured,ranks,oversubscribed,threads,op,data,rel_bound,bytes_per_peer,"
           "variant,reps,calls_per_sample,time_s_median,time_s_min,speedup_vs_plain,speedup_paired,speedup_median,"
           "speedup_min,"
           "payload_bytes,wire_bytes,ratio,messages,"
           "compressed_messages,decision,abs_bound,max_error,library_max_error,ok,codec_comp_gbs,"
           "codec_decomp_gbs,load_1min,chunks,stage_range_s,stage_compress_s,stage_wire_s,stage_decompress_s\n";
  out.precision(6);
  for (const row& r : rows) {
    const dataset& d = *std::find_if(sets.begin(), sets.end(), [&](const dataset& s) { return s.key == r.data; });
    out << ctx.opts.link_name << ',' << ctx.link_gbps_used << ',' << ctx.link_gbps_measured << ',' << world_size << ','
        << (ctx.oversubscribed ? 1 : 0) << ',' << ctx.threads << ',' << r.op << ',' << r.data << ','
        << ctx.opts.rel_bound << ',' << r.bytes << ',' << name_of(r.v) << ',' << r.reps << ',' << r.calls << ','
        << r.median << ',' << r.best << ',' << r.speedup << ',' << r.speedup_paired << ',' << r.speedup_median << ','
        << r.speedup_best << ',' << r.payload << ',' << r.wire << ','
        << (r.wire ? double(r.payload) / double(r.wire) : 1.0) << ',' << r.messages << ',' << r.compressed_messages
        << ',' << auto_decision(r) << ',' << r.abs_bound << ',' << r.max_error << ',' << r.library_max_error << ','
        << (r.ok ? 1 : 0) << ',' << d.compress_bytes_per_second / 1e9 << ',' << d.decompress_bytes_per_second / 1e9
        << ',' << ctx.load << ',' << r.chunks << ',' << r.stage_prepare << ',' << r.stage_compress << ',' << r.stage_wire << ','
        << r.stage_decompress << '\n';
  }
}

int run(int argc, char** argv) {
  const options opts = parse_options(argc, argv);
  if (world_size < 2) usage("needs at least 2 ranks (mpiexec -n 2)");

  run_context ctx{opts, {}};
  kompress::comm_workspace workspace(MPI_COMM_WORLD);
  ctx.workspace = &workspace;
  ctx.threads = host_exec().concurrency();
  const int cores = usable_cores();
  const int local_ranks = host_ranks();
  int oversubscribed = local_ranks * ctx.threads > cores ? 1 : 0;
  check_mpi(MPI_Allreduce(MPI_IN_PLACE, &oversubscribed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD), "MPI_Allreduce");
  ctx.oversubscribed = oversubscribed != 0;

  {  // Connect every pair of ranks (TCP connections are made on first use), outside the timings.
    std::vector<float> out(std::size_t(world_size) * 1024, 1.0f), in(out.size());
    for (int i = 0; i < 3; ++i) {
      check_mpi(MPI_Alltoall(out.data(), 1024, MPI_FLOAT, in.data(), 1024, MPI_FLOAT, MPI_COMM_WORLD), "MPI_Alltoall");
      check_mpi(MPI_Allreduce(out.data(), in.data(), int(out.size()), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD),
                "MPI_Allreduce");
    }
  }
  ctx.link_gbps_measured = ping_pong_rate(8 * MiB) * 8.0 / 1e9;
  ctx.link_gbps_used = std::isnan(opts.link_gbps) ? ctx.link_gbps_measured : opts.link_gbps;

  std::vector<dataset> sets;
  for (const auto& key : opts.data) {
    dataset d;
    d.key = key;
    d.file = file_of(key);
    d.values = kompress::test::read_raw<float>(d.file);
    measure_codec(d, opts);
    sets.push_back(std::move(d));
  }

  if (world_rank == 0) {
    std::printf("bench_collectives: %d ranks (%d on this host), %d thread(s) each, %d usable core(s)%s\n", world_size,
                local_ranks, ctx.threads, cores,
                ctx.oversubscribed ? " -- OVERSUBSCRIBED: more ranks x threads than cores, times include "
                                     "ranks waiting for a core"
                                   : "");
    std::printf("link: %s; ping-pong (8 MiB, ranks 0-1) %.2f Gb/s; auto mode's cost model uses %.2f Gb/s%s\n",
                opts.link_name.c_str(), ctx.link_gbps_measured, ctx.link_gbps_used,
                std::isnan(opts.link_gbps) ? " (the measured rate)" : " (stated with --link-gbps)");
    std::printf("bound: REL %g; block size %d; load average %.2f\n", opts.rel_bound, opts.block_size, load_1min());
    for (const auto& d : sets)
      std::printf("codec on %s (%s), measured once at start, %d thread(s), slowest rank (MPI_Allreduce MIN): "
                  "compress %.2f GB/s, decompress %.2f GB/s, ratio %.2f\n",
                  d.key.c_str(), d.file.c_str(), ctx.threads, d.compress_bytes_per_second / 1e9,
                  d.decompress_bytes_per_second / 1e9, d.probe_ratio);
    std::printf("time = the slowest rank's call, fastest and median over rounds; speedup over plain MPI: %s; "
                "wire = all ranks' bytes sent\n\n",
                opts.stat == "paired"   ? "median over rounds of plain's time / the variant's in the same round"
                : opts.stat == "median" ? "median time of plain / median time of the variant"
                                        : "fastest time of plain / fastest time of the variant");
    std::printf("%-14s %-4s %7s  %-10s %10s %10s %8s %11s %6s %7s %10s %10s %-10s\n", "op", "data", "bytes", "variant",
                "best ms", "median ms", "speedup", "wire MiB", "ratio", "chunks", "max err", "abs bound", "auto sent");
    std::fflush(stdout);
  }

  std::vector<row> all_rows;
  bool all_ok = true;
  const std::size_t sizes[] = {4 * KiB, 16 * KiB, 64 * KiB, 1 * MiB, 4 * MiB, 16 * MiB, 64 * MiB};
  for (auto& d : sets) {
    ctx.cost = kompress::cost_model{};
    ctx.cost.link_bytes_per_second = ctx.link_gbps_used * 1e9 / 8.0;
    ctx.cost.compress_bytes_per_second = d.compress_bytes_per_second;
    ctx.cost.decompress_bytes_per_second = d.decompress_bytes_per_second;
    for (const auto& op : opts.ops) {
      for (const std::size_t bytes : sizes) {
        if (bytes < opts.min_bytes || bytes > opts.max_bytes) continue;
        const auto rows = measure(op, d, bytes, ctx);
        for (const auto& r : rows) {
          if (world_rank == 0) print_row(r);
          all_ok = all_ok && r.ok;
          all_rows.push_back(r);
        }
        if (world_rank == 0) std::fflush(stdout);
      }
    }
  }
  ctx.load = load_1min();
  if (world_rank == 0) {
    std::printf("load average at the end: %.2f (above the rank count: other work shared the cores)\n", ctx.load);
    write_csv(all_rows, sets, ctx);
    std::printf("\nCSV: %s\n", opts.csv.c_str());
    if (!all_ok) std::printf("CHECK FAILED: kompress's result left the bound somewhere above\n");
  }
  return all_ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  int status = 0;
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    try {
      status = run(argc, argv);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "bench_collectives (rank %d): %s\n", world_rank, e.what());
      std::fflush(stderr);
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
  }
  MPI_Finalize();
  return status;
}
