// bench_collectives_at_scale: one collective at one size, kompress against plain MPI, written
// for many simulated ranks (SimGrid's SMPI; bench/simulated/run builds it with smpicxx and runs
// the grid, docs/scale.md) and built with the real MPI too, where it runs like any MPI program.
//
// For --op (allreduce, alltoall, allgather, reduce_scatter) and --bytes (the whole buffer each
// rank holds: allreduce's vector, alltoall's send buffer, allgather's result, reduce_scatter's
// input; the per-peer block is bytes / p), the variants of --variants:
//   plain        MPI_Allreduce(MPI_SUM) / MPI_Alltoall / MPI_Allgather /
//                MPI_Reduce_scatter_block(MPI_SUM): the baseline (under SMPI, the algorithm
//                its selector picks: --cfg=smpi/coll-selector:mpich or ompi)
//   raw          kompress, transfer_mode::raw
//   compressed   kompress, transfer_mode::compressed, pipelined, at REL --bound; the
//                schedule (allreduce, reduce_scatter, allgather) chosen by the cost model
//   ring, halving  compressed, on the ring / on recursive halving and doubling (allreduce),
//                halving (reduce_scatter), doubling (allgather)
//   auto         kompress, transfer_mode::automatic; its cost model holds --link-gbps and the
//                codec's throughput, fixed cost per call and ratio measured at start on rank 0
//                (calls of 4 MiB and 16 KiB of the data at --bound, real time; throughput times
//                --compute-speedup)
//   auto-init    auto as a persistent collective (kompress::allreduce_init and siblings, set up
//                once before the calls, each call its run()): the agreement and the decision
//                are made once, and a raw call is MPI's own blocking collective
//   homomorphic  allreduce and reduce_scatter: compressed with reduction_method::homomorphic
//   hier, hier-auto  allreduce, reduce_scatter and allgather over kompress::node_groups of
//                --ranks-per-node consecutive ranks (the hierarchical collectives: raw within a
//                node, compressed / automatic across nodes; hier-auto's cost model holds a K-th of
//                --link-gbps, the share of one host's link each of its K ranks gets); with one
//                rank per node the flat collectives
// GPU ranks (--gpu-codec CSV, SMPI only): each codec call is charged a GPU's time for its size
// (the table's throughput by call size, bench/simulated/gpu-codec.csv) instead of its time on
// this core; the size is read from that time at the core's probed rate. Everything else a rank
// computes is charged as it ran here; every variant's cost model holds the GPU's throughput and
// fixed cost per call, fitted to the table's smallest and largest sizes. With --gpu-kernel-gbs G
// every other Kokkos kernel and deep copy (the REL bound's range pass, the sums' adds, copies
// between buffers: device kernels on a GPU rank) is charged its time here times this core's
// copy rate (a Kokkos copy kernel timed at start) over G, a GPU's measured device copy rate, and
// no launch cost: the optimistic side, where the default (this core's time) is the pessimistic.
// Each variant runs once untimed, then --reps times; a call's time is the slowest rank's
// (MPI_Wtime: simulated time under SMPI), and the fastest call is reported.
//
// Check (--check): every rank's buffers are its own, filled with the data at a different
// offset per rank, and each kompress result is compared element by element with plain MPI's
// against the call's absolute_bound (sums: plus the float summation slack 2 p eps sum|x|);
// allreduce and allgather results must be bit-identical across ranks. A violation prints
// "CHECK FAILED" and makes the exit status 1. Without --check and with --shared (SMPI only) the send and result
// buffers come from SMPI_SHARED_MALLOC: one copy for all ranks, so 1024 ranks of 64 MiB fit in
// memory; every rank then sends the same data and the results are not checked.
//
// Output: one line per variant on rank 0 and, with --csv, one CSV row per variant (--label
// names the platform in it): the bytes and messages summed over ranks, the loosest bound any
// rank reported, the largest error any rank saw, and the codec's own time per timed call (the
// slowest rank's, mean over --reps: the real time inside kompress's compression and
// decompression regions, read through Kokkos Tools' region callbacks, divided by
// --compute-speedup as the simulation divides what it charges) with its number of codec calls.
//
//   bench_collectives_at_scale --op allreduce --bytes 64M [--bound 1e-3] [--data FILE]
//       [--variants plain,raw,compressed,auto] [--reps 2] [--link-gbps 10]
//       [--compute-speedup 1] [--check] [--shared] [--csv PATH] [--label NAME]

#include "real_data.hpp"

#include "support.hpp"

#include <kompress/comm.hpp>

#include <Kokkos_Core.hpp>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

namespace {

using host_exec = Kokkos::DefaultHostExecutionSpace;
using values_view = Kokkos::View<float*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;

struct options {
  std::string op = "allreduce";
  std::uint64_t bytes = 64ull << 20;
  double bound = 1e-3;
  std::string data = "act_mlp_relu2_out_1024x1024.f32";
  std::vector<std::string> variants = {"plain", "raw", "compressed", "auto"};
  int reps = 2;
  double link_gbps = 10.0;
  double compute_speedup = 1.0;
  std::string gpu_codec;  ///< a table of the GPU codec's throughput by call size (SMPI only)
  double gpu_kernel_gbs = 0.0;  ///< with gpu_codec: other kernels at this copy rate (0: this core's time)
  int ranks_per_node = 1;  ///< consecutive ranks that share a node (the hier variants' groups)
  std::size_t exchange_window = 0;  ///< alltoall: collective_options::exchange_window (0: all peers)
  bool check = false;
  bool shared = false;
  std::string csv;
  std::string label = "-";
};

[[noreturn]] void usage(const std::string& complaint) {
  std::fprintf(stderr,
               "bench_collectives_at_scale: %s\n"
               "usage: bench_collectives_at_scale --op allreduce|alltoall|allgather|reduce_scatter --bytes N[KMG]\n"
               "       [--bound REL] [--data FILE]\n"
               "       [--variants plain,raw,compressed,ring,halving,auto,auto-init,homomorphic,hier,hier-auto]\n"
               "       [--reps N] [--ranks-per-node K] [--exchange-window W]\n"
               "       [--link-gbps G] [--compute-speedup K | --gpu-codec CSV [--gpu-kernel-gbs G]] [--check]\n"
               "       [--shared] [--csv PATH]\n"
               "       [--label NAME]\n",
               complaint.c_str());
  std::exit(2);
}

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--check") { o.check = true; continue; }
    if (arg == "--shared") { o.shared = true; continue; }
    if (i + 1 >= argc) usage("missing value after " + arg);
    const std::string value = argv[++i];
    try {
      if (arg == "--op") o.op = value;
      else if (arg == "--bytes") o.bytes = kompress_bench::parse_bytes(value);
      else if (arg == "--bound") o.bound = std::stod(value);
      else if (arg == "--data") o.data = value;
      else if (arg == "--variants") o.variants = kompress_bench::split(value, ',');
      else if (arg == "--reps") o.reps = std::stoi(value);
      else if (arg == "--ranks-per-node") o.ranks_per_node = std::stoi(value);
      else if (arg == "--exchange-window") o.exchange_window = std::stoul(value);
      else if (arg == "--link-gbps") o.link_gbps = std::stod(value);
      else if (arg == "--compute-speedup") o.compute_speedup = std::stod(value);
      else if (arg == "--gpu-codec") o.gpu_codec = value;
      else if (arg == "--gpu-kernel-gbs") o.gpu_kernel_gbs = std::stod(value);
      else if (arg == "--csv") o.csv = value;
      else if (arg == "--label") o.label = value;
      else usage("unknown option " + arg);
    } catch (const std::logic_error&) {
      usage("bad value '" + value + "' for " + arg);
    }
  }
  if (o.op != "allreduce" && o.op != "alltoall" && o.op != "allgather" && o.op != "reduce_scatter")
    usage("--op takes allreduce, alltoall, allgather or reduce_scatter");
  for (const auto& v : o.variants)
    if (v != "plain" && v != "raw" && v != "compressed" && v != "ring" && v != "halving" && v != "auto" &&
        v != "auto-init" && v != "homomorphic" && v != "hier" && v != "hier-auto")
      usage("unknown variant " + v);
    else if (v.starts_with("hier") && o.op == "alltoall")
      usage("the hier variants are allreduce's, reduce_scatter's and allgather's");
  if (o.reps < 1 || o.ranks_per_node < 1 || !(o.link_gbps > 0.0) || !(o.compute_speedup > 0.0) || o.bytes < 4)
    usage("bad numbers");
  if (o.shared && o.check) usage("--shared buffers hold every rank's data at once: they cannot be checked");
  if (!o.gpu_codec.empty() && o.compute_speedup != 1.0)
    usage("--gpu-codec charges the codec's calls themselves: leave out --compute-speedup");
  if (o.gpu_kernel_gbs != 0.0 && (o.gpu_codec.empty() || !(o.gpu_kernel_gbs > 0.0)))
    usage("--gpu-kernel-gbs takes a positive rate, with --gpu-codec");
#ifndef SMPI_SHARED_MALLOC
  if (!o.gpu_codec.empty()) usage("--gpu-codec needs SimGrid's SMPI (build with smpicxx)");
  if (o.shared) usage("--shared needs SimGrid's SMPI (build with smpicxx)");
#endif
  return o;
}

/// Which buffer: SMPI shares the allocations of one line of code between ranks, so each role
/// allocates on its own line.
enum class role { send, result, reference };

/// A buffer of floats: the rank's own, or (--shared, SMPI) one copy shared by all ranks.
class buffer {
 public:
  buffer(std::size_t count, bool shared, [[maybe_unused]] role r = role::reference) : count_(count), shared_(shared) {
    const std::size_t bytes = std::max<std::size_t>(count, 1) * sizeof(float);
#ifdef SMPI_SHARED_MALLOC
    if (shared_ && r == role::send) data_ = static_cast<float*>(SMPI_SHARED_MALLOC(bytes));
    if (shared_ && r == role::result) data_ = static_cast<float*>(SMPI_SHARED_MALLOC(bytes));
#endif
    if (!data_) {
      shared_ = false;
      data_ = new float[bytes / sizeof(float)]();
    }
  }
  buffer(const buffer&) = delete;
  buffer& operator=(const buffer&) = delete;
  ~buffer() {
#ifdef SMPI_SHARED_MALLOC
    if (shared_) { SMPI_SHARED_FREE(data_); return; }
#endif
    delete[] data_;
  }
  float* data() const { return data_; }
  values_view view() const { return values_view(data_, count_); }

 private:
  float* data_ = nullptr;
  std::size_t count_;
  bool shared_;
};

/// A GPU's codec time per call by the call's size (--gpu-codec: bench/simulated/gpu-codec.csv,
/// the GPU's compression and decompression throughput measured at sizes from 16 KiB to 64 MiB).
/// Between two sizes the throughput is interpolated in log2 of the size; below the smallest a
/// call costs what the smallest does (the launch floor), above the largest the rate holds.
struct gpu_codec_model {
  std::vector<double> bytes, compress_rate, decompress_rate;  // bytes/s

  static gpu_codec_model read(const std::string& path) {
    std::ifstream in(path);
    if (!in) throw std::runtime_error("cannot open " + path);
    gpu_codec_model m;
    for (std::string line; std::getline(in, line);) {
      if (line.empty() || line[0] == '#' || line.starts_with("bytes")) continue;
      const std::vector<std::string> f = kompress_bench::split(line, ',');
      if (f.size() < 4) throw std::runtime_error(path + ": a row needs bytes,gpu_compress_gbs,cpu_compress_gbs,"
                                                 "gpu_decompress_gbs");
      m.bytes.push_back(std::stod(f[0]));
      m.compress_rate.push_back(std::stod(f[1]) * 1e9);
      m.decompress_rate.push_back(std::stod(f[3]) * 1e9);
    }
    if (m.bytes.empty()) throw std::runtime_error(path + ": no rows");
    return m;
  }
  double rate(bool compress, double size) const {
    const std::vector<double>& r = compress ? compress_rate : decompress_rate;
    if (size <= bytes.front()) return r.front();
    for (std::size_t i = 1; i < bytes.size(); ++i)
      if (size <= bytes[i]) {
        const double t = std::log2(size / bytes[i - 1]) / std::log2(bytes[i] / bytes[i - 1]);
        return r[i - 1] + t * (r[i] - r[i - 1]);
      }
    return r.back();
  }
  double seconds(bool compress, double size) const {
    return std::max(size, bytes.front()) / rate(compress, std::max(size, bytes.front()));
  }
};

/// The codec's throughput (bytes/s, compress and decompress), fixed cost per call and ratio on
/// the data at the run's bound, timed in real time on rank 0 (under SMPI, the core that runs
/// the simulation) by kompress::measure_cost_model's probe (the fastest of 3 calls of 4 MiB and
/// of 16 KiB, fitted); broadcast so that every rank's cost model agrees. With
/// `gpu`, the model holds the GPU's throughput and per-call cost fitted to its table instead,
/// and `core_rates` this core's throughput at 4 MiB.
kompress::cost_model measured_cost_model(const std::vector<float>& values, const options& o, int rank,
                                         const gpu_codec_model* gpu, double* core_rates) {
  double rates[5] = {0.0, 0.0, 0.0, 0.0, 0.0};  // compress, decompress, ratio, their calls' seconds
  if (rank == 0) {
    const std::size_t count = (4u << 20) / sizeof(float);
    buffer tile(count, false);
    kompress_bench::fill_tiled(values, tile.data(), count, 0, 1);
    const kompress::compress_options copts{.bound = kompress::relative(o.bound), .block_size = 32};
    const auto probe = kompress::detail::probe_codec(host_exec{}, tile.view(), copts, "bench::probe");
    rates[0] = probe.compress * o.compute_speedup;
    rates[1] = probe.decompress * o.compute_speedup;
    rates[2] = probe.ratio;
    rates[3] = probe.compress_call;
    rates[4] = probe.decompress_call;
    if (gpu) {  // the size estimates read a call's size from its time at the core's rate
      const double bytes = double(count * sizeof(float));
      core_rates[0] = bytes / (probe.compress_call + bytes / probe.compress);
      core_rates[1] = bytes / (probe.decompress_call + bytes / probe.decompress);
    }
  }
  MPI_Bcast(rates, 5, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  if (gpu) {
    MPI_Bcast(core_rates, 2, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    const double small = gpu->bytes.front(), large = gpu->bytes.back();
    std::tie(rates[0], rates[3]) =
        kompress::detail::affine_codec_cost(small, gpu->seconds(true, small), large, gpu->seconds(true, large));
    std::tie(rates[1], rates[4]) =
        kompress::detail::affine_codec_cost(small, gpu->seconds(false, small), large, gpu->seconds(false, large));
  }
  kompress::cost_model model;
  model.link_bytes_per_second = o.link_gbps * 1e9 / 8.0;
  model.compress_bytes_per_second = rates[0];
  model.decompress_bytes_per_second = rates[1];
  model.expected_ratio = rates[2];
  model.compress_call_seconds = rates[3];
  model.decompress_call_seconds = rates[4];
  return model;
}

/// The codec's time on one rank: the real time inside kompress's codec regions
/// (kompress::compress, kompress::compress_async, kompress::decompress; nested ones count once),
/// or with a GPU model the GPU's time for each call, which is then what SMPI charges.
struct codec_clock {
  std::vector<bool> open;  ///< per open region: whether it is a codec region
  int depth = 0;           ///< open codec regions
  bool compressing = false;  ///< what the outermost open codec region does
  double start = 0.0;      ///< when the outermost open codec region began
  double seconds = 0.0;
  std::uint64_t calls = 0;
  /// With a GPU model: each call's size is estimated from its real time at this core's probed
  /// rates (bytes/s; compress, decompress), and SMPI charges the model's time in its place.
  const gpu_codec_model* gpu = nullptr;
  double core_rate[2] = {0.0, 0.0};
  /// --gpu-kernel-gbs: what a kernel outside the codec's regions takes on the GPU per second
  /// it takes here (this core's copy rate over the GPU's; 0: charged as it ran here).
  double kernel_time_factor = 0.0;
  int kernel_depth = 0;      ///< open kernels and deep copies outside codec regions
  double kernel_start = 0.0;
};

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

#ifndef SMPI_SHARED_MALLOC
codec_clock* process_clock = nullptr;
#endif
/// This rank's clock: under SMPI every simulated rank's own (its process data), with a real MPI
/// the process's.
void set_rank_clock(codec_clock* clock_of_rank) {
#ifdef SMPI_SHARED_MALLOC
  smpi_process_set_user_data(clock_of_rank);
#else
  process_clock = clock_of_rank;
#endif
}
codec_clock* rank_clock() {
#ifdef SMPI_SHARED_MALLOC
  return static_cast<codec_clock*>(smpi_process_get_user_data());
#else
  return process_clock;
#endif
}

void region_pushed(const char* name) {
  codec_clock* const mine = rank_clock();
  if (!mine) return;
  const std::string_view region(name);
  const bool decompress = region == "kompress::decompress";
  const bool codec = decompress || region == "kompress::compress" || region == "kompress::compress_async";
  mine->open.push_back(codec);
  if (!codec || mine->depth++ > 0) return;
  mine->compressing = !decompress;
#ifdef SMPI_SHARED_MALLOC
  if (mine->gpu) smpi_bench_end();  // the time so far is charged; the codec's is not
#endif
  mine->start = now_seconds();
}

void region_popped() {
  const double end = now_seconds();
  codec_clock* const mine = rank_clock();
  if (!mine || mine->open.empty()) return;
  const bool codec = mine->open.back();
  mine->open.pop_back();
  if (!codec || --mine->depth > 0) return;
  double seconds = end - mine->start;
#ifdef SMPI_SHARED_MALLOC
  if (mine->gpu) {
    const double size = seconds * mine->core_rate[mine->compressing ? 0 : 1];
    seconds = mine->gpu->seconds(mine->compressing, size);
    smpi_execute(seconds);
    smpi_bench_begin();
  }
#endif
  mine->seconds += seconds;
  ++mine->calls;
}

/// A Kokkos kernel or deep copy begins or ends on this rank: with --gpu-kernel-gbs, one outside
/// the codec's regions is charged at the GPU's rate instead of its time here (nested ones, a
/// deep copy's own kernel, count once).
void kernel_begun() {
  codec_clock* const mine = rank_clock();
  if (!mine || mine->kernel_time_factor == 0.0 || mine->depth > 0 || mine->kernel_depth++ > 0) return;
#ifdef SMPI_SHARED_MALLOC
  smpi_bench_end();
#endif
  mine->kernel_start = now_seconds();
}
void kernel_ended() {
  const double end = now_seconds();
  codec_clock* const mine = rank_clock();
  if (!mine || mine->kernel_time_factor == 0.0 || mine->depth > 0 || mine->kernel_depth == 0 ||
      --mine->kernel_depth > 0)
    return;
  [[maybe_unused]] const double seconds = (end - mine->kernel_start) * mine->kernel_time_factor;
#ifdef SMPI_SHARED_MALLOC
  smpi_execute(seconds);
  smpi_bench_begin();
#endif
}
void kernel_begun(const char*, std::uint32_t, std::uint64_t*) { kernel_begun(); }
void kernel_ended(std::uint64_t) { kernel_ended(); }
void copy_begun(Kokkos_Profiling_SpaceHandle, const char*, const void*, Kokkos_Profiling_SpaceHandle, const char*,
                const void*, std::uint64_t) {
  kernel_begun();
}

/// This core's rate for a memory-bound kernel: a Kokkos copy of 64 MiB of floats, the fastest
/// of 5, bytes copied per second.
double core_copy_rate() {
  const std::size_t count = (64u << 20) / sizeof(float);
  Kokkos::View<float*, Kokkos::HostSpace> from("bench::copy_from", count), to("bench::copy_to", count);
  const host_exec exec;
  double best = std::numeric_limits<double>::infinity();
  for (int i = 0; i < 6; ++i) {
    const auto start = std::chrono::steady_clock::now();
    Kokkos::parallel_for("bench::copy", Kokkos::RangePolicy<host_exec>(exec, 0, count),
                         KOKKOS_LAMBDA(std::size_t j) { to(j) = from(j); });
    exec.fence("bench::copy");
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (i > 0) best = std::min(best, seconds);
  }
  return double(count * sizeof(float)) / best;
}

struct result {
  std::string variant;
  double seconds = 0.0;  // the fastest call's slowest rank
  kompress::collective_report report;
  double max_error = std::numeric_limits<double>::quiet_NaN();
  double codec_seconds = std::numeric_limits<double>::quiet_NaN();  // per timed call, the slowest rank's
  std::uint64_t codec_calls = 0;                                     // per timed call, summed over ranks
  bool ok = true;
  std::string problem;
};

/// The element counts of send and result buffers for `o.op` on `p` ranks (a multiple of p).
std::pair<std::size_t, std::size_t> counts_of(const options& o, int p) {
  const std::size_t whole = std::max<std::size_t>(o.bytes / sizeof(float) / std::size_t(p), 1) * std::size_t(p);
  if (o.op == "allgather") return {whole / std::size_t(p), whole};
  if (o.op == "reduce_scatter") return {whole, whole / std::size_t(p)};
  return {whole, whole};
}

void run_plain(const options& o, const buffer& send, const buffer& recv, std::size_t send_count, int p) {
  const int block = int(send_count / std::size_t(o.op == "allgather" ? 1 : p));
  if (o.op == "allreduce")
    MPI_Allreduce(send.data(), recv.data(), int(send_count), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  else if (o.op == "alltoall")
    MPI_Alltoall(send.data(), block, MPI_FLOAT, recv.data(), block, MPI_FLOAT, MPI_COMM_WORLD);
  else if (o.op == "allgather")
    MPI_Allgather(send.data(), block, MPI_FLOAT, recv.data(), block, MPI_FLOAT, MPI_COMM_WORLD);
  else
    MPI_Reduce_scatter_block(send.data(), recv.data(), block, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
}

/// One kompress call, its scratch from `workspace` (reused by every call, as a training loop
/// reuses it: without one each call allocates and first-touches its scratch).
/// The hier variants run over `groups`, their scratch from `hierarchical`.
kompress::collective_report run_kompress(const options& o, const kompress::collective_options& copts,
                                         const buffer& send, const buffer& recv, kompress::comm_workspace& workspace,
                                         const kompress::node_groups* groups = nullptr,
                                         kompress::hierarchical_workspace* hierarchical = nullptr) {
  const host_exec exec;
  const MPI_Comm comm = MPI_COMM_WORLD;
  if (groups && o.op == "allreduce")
    return kompress::allreduce(exec, send.view(), recv.view(), *groups, copts, hierarchical);
  if (groups && o.op == "allgather")
    return kompress::allgather(exec, send.view(), recv.view(), *groups, copts, hierarchical);
  if (groups) return kompress::reduce_scatter(exec, send.view(), recv.view(), *groups, copts, hierarchical);
  if (o.op == "allreduce") return kompress::allreduce(exec, send.view(), recv.view(), comm, copts, &workspace);
  if (o.op == "alltoall") return kompress::alltoall(exec, send.view(), recv.view(), comm, copts, &workspace);
  if (o.op == "allgather") return kompress::allgather(exec, send.view(), recv.view(), comm, copts, &workspace);
  return kompress::reduce_scatter(exec, send.view(), recv.view(), comm, copts, &workspace);
}

/// The persistent form of the call run_kompress makes (flat, on MPI_COMM_WORLD).
kompress::persistent_request init_kompress(const options& o, const kompress::collective_options& copts,
                                           const buffer& send, const buffer& recv) {
  const host_exec exec;
  const MPI_Comm comm = MPI_COMM_WORLD;
  if (o.op == "allreduce") return kompress::allreduce_init(exec, send.view(), recv.view(), comm, copts);
  if (o.op == "alltoall") return kompress::alltoall_init(exec, send.view(), recv.view(), comm, copts);
  if (o.op == "allgather") return kompress::allgather_init(exec, send.view(), recv.view(), comm, copts);
  return kompress::reduce_scatter_init(exec, send.view(), recv.view(), comm, copts);
}

double slowest_rank(double seconds) {
  MPI_Allreduce(MPI_IN_PLACE, &seconds, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return seconds;
}

/// Compares `got` with plain MPI's `want` within `bound` (+ the summation slack for sums, from
/// `abs_sum`, the plain sum of |x|); allreduce and allgather: also bit-identical on every rank.
void check(const options& o, const float* got, const float* want, const float* abs_sum, std::size_t count,
           int p, result& r) {
  const bool sums = o.op == "allreduce" || o.op == "reduce_scatter";
  double worst = 0.0, worst_excess = -std::numeric_limits<double>::infinity();
  std::uint64_t hash = 1469598103934665603ull;
  for (std::size_t i = 0; i < count; ++i) {
    const double error = std::fabs(double(got[i]) - double(want[i]));
    const double slack = sums ? 2.0 * p * double(std::numeric_limits<float>::epsilon()) * double(abs_sum[i]) : 0.0;
    worst = std::max(worst, error);
    worst_excess = std::max(worst_excess, error - (r.report.absolute_bound + slack));
    if (!(error == error)) worst_excess = std::numeric_limits<double>::infinity();
    std::uint32_t bits;
    std::memcpy(&bits, &got[i], sizeof bits);
    hash = (hash ^ bits) * 1099511628211ull;
  }
  double reduced[2] = {worst, worst_excess};
  MPI_Allreduce(MPI_IN_PLACE, reduced, 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  r.max_error = reduced[0];
  if (reduced[1] > 0.0) {
    r.ok = false;
    r.problem += "an element off plain MPI's result by more than the bound; ";
  }
  if (o.op == "allreduce" || o.op == "allgather") {
    std::uint64_t low = hash, high = hash;
    MPI_Allreduce(MPI_IN_PLACE, &low, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, &high, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
    if (low != high) {
      r.ok = false;
      r.problem += "ranks ended with different results; ";
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, p = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &p);
  // Under SMPI all ranks share one process and one Kokkos: the first rank initialises it, and
  // it is finalised by the process's exit, after the last rank.
  const bool owns_kokkos = !Kokkos::is_initialized();
  if (owns_kokkos) Kokkos::initialize(Kokkos::InitializationSettings().set_num_threads(1));
  // The codec's clock (no Kokkos tool loaded: its callbacks are left alone, the column is NaN).
  // Under SMPI the first rank, rank 0, installs the callbacks for all (the later ones see them
  // loaded and leave them): rank 0's verdict is the run's.
  const bool timing_codec = !Kokkos::Tools::profileLibraryLoaded();
  if (owns_kokkos && timing_codec) {
    Kokkos::Tools::Experimental::set_push_region_callback(region_pushed);
    Kokkos::Tools::Experimental::set_pop_region_callback(region_popped);
    Kokkos::Tools::Experimental::set_begin_parallel_for_callback(kernel_begun);
    Kokkos::Tools::Experimental::set_end_parallel_for_callback(kernel_ended);
    Kokkos::Tools::Experimental::set_begin_parallel_reduce_callback(kernel_begun);
    Kokkos::Tools::Experimental::set_end_parallel_reduce_callback(kernel_ended);
    Kokkos::Tools::Experimental::set_begin_parallel_scan_callback(kernel_begun);
    Kokkos::Tools::Experimental::set_end_parallel_scan_callback(kernel_ended);
    Kokkos::Tools::Experimental::set_begin_deep_copy_callback(copy_begun);
    Kokkos::Tools::Experimental::set_end_deep_copy_callback(kernel_ended);
  }
  codec_clock codec_time;
  set_rank_clock(&codec_time);
  int status = 0;
  try {
    const options o = parse(argc, argv);
    std::vector<float> values = kompress::test::read_raw<float>(o.data);
    const auto [send_count, recv_count] = counts_of(o, p);
    buffer send(send_count, o.shared, role::send), recv(recv_count, o.shared, role::result);
    if (o.shared) kompress_bench::fill_tiled(values, send.data(), send_count, 0, 1);
    else kompress_bench::fill_tiled(values, send.data(), send_count, rank, p);
    // Only rank 0 reads the file again (the codec probe): at 1,024 simulated ranks the others'
    // copies of a 4 MiB field would hold 4 GiB for nothing.
    if (rank != 0) std::vector<float>().swap(values);
    // SMPI does not deliver the bytes of a message sent from shared memory: the hierarchical
    // allreduce's reduce_scatter within a node would leave its blocks holding whatever they
    // held, and the allreduce across nodes would compress that (ratio 1.03 where each rank's
    // own buffer gives 1.22). The hier variants' input is the rank's own, holding what the
    // shared one holds.
    const bool any_hierarchical = std::any_of(o.variants.begin(), o.variants.end(),
                                              [](const std::string& v) { return v.starts_with("hier"); });
    std::optional<buffer> own_send;
    if (o.shared && any_hierarchical) {
      own_send.emplace(send_count, false);
      std::copy(send.data(), send.data() + send_count, own_send->data());
    }

    // The reference for --check: plain MPI's result, and the sum of |x| for the slack.
    std::vector<float> want, abs_sum;
    if (o.check) {
      buffer plain_out(recv_count, false), abs_in(send_count, false), abs_out(recv_count, false);
      run_plain(o, send, plain_out, send_count, p);
      want.assign(plain_out.data(), plain_out.data() + recv_count);
      for (std::size_t i = 0; i < send_count; ++i) abs_in.data()[i] = std::fabs(send.data()[i]);
      if (o.op == "allreduce" || o.op == "reduce_scatter") {
        run_plain(o, abs_in, abs_out, send_count, p);
        abs_sum.assign(abs_out.data(), abs_out.data() + recv_count);
      }
    }

    kompress::collective_options base;
    base.codec.bound = kompress::relative(o.bound);
    // The GPU model charges from here on: the probe above ran at this core's rate.
    const gpu_codec_model gpu = o.gpu_codec.empty() ? gpu_codec_model{} : gpu_codec_model::read(o.gpu_codec);
    base.cost = measured_cost_model(values, o, rank, o.gpu_codec.empty() ? nullptr : &gpu, codec_time.core_rate);
    if (!o.gpu_codec.empty()) codec_time.gpu = &gpu;
    double copy_rate = 0.0;
    if (o.gpu_kernel_gbs > 0.0) {
      int callbacks_ours = timing_codec;
      MPI_Bcast(&callbacks_ours, 1, MPI_INT, 0, MPI_COMM_WORLD);
      if (!callbacks_ours)
        throw std::runtime_error("--gpu-kernel-gbs needs the Kokkos Tools callbacks: no tool loaded");
      if (rank == 0) copy_rate = core_copy_rate();
      MPI_Bcast(&copy_rate, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
      codec_time.kernel_time_factor = copy_rate / (o.gpu_kernel_gbs * 1e9);
    }

    std::vector<result> results;
    kompress::comm_workspace workspace(MPI_COMM_WORLD);
    const kompress::node_groups groups(MPI_COMM_WORLD, o.ranks_per_node);
    kompress::hierarchical_workspace hierarchical_scratch(groups);
    for (const std::string& variant : o.variants) {
      const bool sums = o.op == "allreduce" || o.op == "reduce_scatter";
      if (variant == "homomorphic" && !sums) continue;
      result r;
      r.variant = variant;
      kompress::collective_options copts = base;
      copts.exchange_window = o.exchange_window;
      const bool hierarchical = variant.starts_with("hier");
      copts.mode = variant == "raw"                             ? kompress::transfer_mode::raw
                   : variant == "auto" || variant == "auto-init" || variant == "hier-auto"
                       ? kompress::transfer_mode::automatic
                       : kompress::transfer_mode::compressed;
      // The simulated hosts have one network link: the K ranks of a node share it, so each of
      // the K allreduces across nodes gets a K-th of it (kompress::cost_model: the link a
      // rank's messages get).
      if (variant == "hier-auto") copts.cost.link_bytes_per_second /= o.ranks_per_node;
      if (variant == "homomorphic") copts.reduction = kompress::reduction_method::homomorphic;
      if (variant == "ring") copts.schedule = kompress::collective_schedule::ring;
      if (variant == "halving") copts.schedule = kompress::collective_schedule::halving_doubling;
      // Set up once, as a loop would before its first call; destroyed (collectively) with the
      // iteration, on every rank.
      std::optional<kompress::persistent_request> persistent;
      if (variant == "auto-init") persistent.emplace(init_kompress(o, copts, send, recv));
      const auto call = [&] {
        if (variant == "plain") run_plain(o, send, recv, send_count, p);
        else if (persistent) r.report = persistent->run();
        else if (hierarchical) r.report = run_kompress(o, copts, own_send ? *own_send : send, recv, workspace, &groups,
                                                  &hierarchical_scratch);
        else r.report = run_kompress(o, copts, send, recv, workspace);
      };
      call();  // untimed: the warm-up, and the result the check reads
      if (o.check && variant != "plain") check(o, recv.data(), want.data(), abs_sum.data(), recv_count, p, r);
      r.seconds = std::numeric_limits<double>::infinity();
      codec_time.seconds = 0.0;
      codec_time.calls = 0;
      for (int i = 0; i < o.reps; ++i) {
        MPI_Barrier(MPI_COMM_WORLD);
        const double start = MPI_Wtime();
        call();
        r.seconds = std::min(r.seconds, slowest_rank(MPI_Wtime() - start));
      }
      // Totals over ranks; the bound is the loosest any rank reports (alltoall's REL bound
      // resolves per sender).
      std::uint64_t bytes[3] = {r.report.payload_bytes, r.report.wire_bytes, r.report.compressed_messages};
      MPI_Allreduce(MPI_IN_PLACE, bytes, 3, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
      r.report.payload_bytes = bytes[0];
      r.report.wire_bytes = bytes[1];
      r.report.compressed_messages = bytes[2];
      MPI_Allreduce(MPI_IN_PLACE, &r.report.absolute_bound, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      double codec_seconds = codec_time.seconds / o.reps / o.compute_speedup;
      std::uint64_t codec_calls = codec_time.calls;
      MPI_Allreduce(MPI_IN_PLACE, &codec_seconds, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      MPI_Allreduce(MPI_IN_PLACE, &codec_calls, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
      if (timing_codec) {
        r.codec_seconds = codec_seconds;
        r.codec_calls = codec_calls / std::uint64_t(o.reps);
      }
      results.push_back(r);
    }

    if (rank == 0) {
      double plain = std::numeric_limits<double>::quiet_NaN();
      for (const auto& r : results)
        if (r.variant == "plain") plain = r.seconds;
      std::printf("%s p=%d %s per rank, REL %g, %s, link %g Gb/s, compute x%g, codec %.2f / %.2f GB/s "
                  "+ %.1f / %.1f us per call\n",
                  o.op.c_str(), p, kompress_bench::human_bytes(o.bytes).c_str(), o.bound, o.data.c_str(),
                  o.link_gbps, o.compute_speedup, base.cost.compress_bytes_per_second / 1e9,
                  base.cost.decompress_bytes_per_second / 1e9, base.cost.compress_call_seconds * 1e6,
                  base.cost.decompress_call_seconds * 1e6);
      if (o.gpu_kernel_gbs > 0.0)
        std::printf("other kernels at %g GB/s: this core's copy kernel %.2f GB/s, its kernels' time x%.4g\n",
                    o.gpu_kernel_gbs, copy_rate / 1e9, codec_time.kernel_time_factor);
      std::FILE* csv = nullptr;
      if (!o.csv.empty()) {
        const bool fresh = !std::ifstream(o.csv).good();
        csv = std::fopen(o.csv.c_str(), "a");
        if (!csv) throw std::runtime_error("cannot open " + o.csv);
        if (fresh)
          std::fprintf(csv, "label,op,ranks,bytes,rel_bound,data,link_gbps,compute_speedup,variant,seconds,"
                            "speedup,ratio,compressed_messages,absolute_bound,max_error,ok,codec_seconds,codec_calls\n");
      }
      for (const auto& r : results) {
        const double speedup = plain / r.seconds;
        std::printf("  %-12s %12.3f ms  %6.2fx plain  ratio %6.2f  bound %-10.3g err %-10.3g codec %.3f ms in %llu "
                    "calls %s%s\n",
                    r.variant.c_str(), r.seconds * 1e3, speedup, r.report.ratio(), r.report.absolute_bound,
                    r.max_error, r.codec_seconds * 1e3, static_cast<unsigned long long>(r.codec_calls),
                    r.ok ? "" : "CHECK FAILED: ", r.problem.c_str());
        if (csv)
          std::fprintf(csv, "%s,%s,%d,%llu,%g,%s,%g,%g,%s,%.9g,%.6g,%.6g,%llu,%.6g,%.6g,%d,%.6g,%llu\n",
                       o.label.c_str(), o.op.c_str(), p, static_cast<unsigned long long>(o.bytes), o.bound,
                       o.data.c_str(), o.link_gbps, o.compute_speedup, r.variant.c_str(), r.seconds, speedup,
                       r.report.ratio(), static_cast<unsigned long long>(r.report.compressed_messages),
                       r.report.absolute_bound, r.max_error, r.ok ? 1 : 0, r.codec_seconds,
                       static_cast<unsigned long long>(r.codec_calls));
        if (!r.ok) status = 1;
      }
      if (csv) std::fclose(csv);
    }
    MPI_Bcast(&status, 1, MPI_INT, 0, MPI_COMM_WORLD);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_collectives_at_scale (rank %d): %s\n", rank, e.what());
    status = 1;
  }
  set_rank_clock(nullptr);  // before its clock leaves the stack
  MPI_Finalize();
#ifndef SMPI_SHARED_MALLOC
  if (owns_kokkos) Kokkos::finalize();
#endif  // under SMPI the other simulated ranks may still use it: the process's exit ends it
  return status;
}
