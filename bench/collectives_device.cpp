// bench_collectives_device: alltoall, allreduce and the DLRM forward exchange on Views in the
// default execution space's memory (device memory in a CUDA build: ranks may share one GPU),
// against what a GPU program does without kompress, in the same run on the same buffers:
//   kompress  the collective on the Views at --bound (REL), transport automatic: staged through
//             pinned host memory unless the MPI moves device memory (--transport direct|staged)
//   mpi       plain MPI on the same buffers, staged as a GPU program without a CUDA-aware MPI
//             does it: the whole send buffer to pinned host memory, MPI's collective, the
//             result back (with a CUDA-aware MPI, --transport direct, MPI reads the Views)
//   fp16      cast to Kokkos::Experimental::half_t on the device, the halves moved as above
//             (alltoall: MPI_Alltoall of the halves; allreduce: MPI_Allreduce with an op that
//             adds halves in float), cast back: half the bytes, about 3 significant digits
// The data: a real file's values (--file, ../shared/data) tiled to --mib MiB per peer, each
// rank's copy shifted so that ranks send different values.
// Time: each call's wall time, the slowest rank's (MPI_MAX), the median of --reps after one
// warm-up; kompress and its baselines alternate within each repetition. Every kompress result
// is checked on the host against plain MPI's within the call's absolute bound (exit 1 if not).
//
//   mpiexec -n P bench_collectives_device [--mib 16] [--bound 1e-2] [--reps 5]
//                                         [--file act_mlp_relu2_out_1024x1024.f32]
//                                         [--ops alltoall,allreduce,dlrm] [--transport automatic]

#include "real_data.hpp"

#include "support.hpp"

#include <kompress/comm.hpp>
#include <kompress/dlrm.hpp>

#include <Kokkos_Core.hpp>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace {

using exec = Kokkos::DefaultExecutionSpace;
using memory = exec::memory_space;
using values = Kokkos::View<float*, memory>;
using pinned = Kokkos::View<float*, Kokkos::SharedHostPinnedSpace>;
using half = Kokkos::Experimental::half_t;
using halves = Kokkos::View<half*, memory>;
using pinned_halves = Kokkos::View<half*, Kokkos::SharedHostPinnedSpace>;

struct options {
  std::size_t mib = 16;
  double bound = 1e-2;
  int reps = 5;
  std::string file = "act_mlp_relu2_out_1024x1024.f32";
  std::vector<std::string> ops = {"alltoall", "allreduce", "dlrm"};
  kompress::transport_mode transport = kompress::transport_mode::automatic;
};

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr,
               "bench_collectives_device: %s\nusage: mpiexec -n P bench_collectives_device [--mib 16] "
               "[--bound 1e-2] [--reps 5] [--file NAME] [--ops alltoall,allreduce,dlrm] "
               "[--transport automatic|direct|staged]\n",
               why);
  std::exit(2);
}

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (i + 1 >= argc) usage(("missing value after " + arg).c_str());
    const std::string value = argv[++i];
    if (arg == "--mib") o.mib = std::stoul(value);
    else if (arg == "--bound") o.bound = std::stod(value);
    else if (arg == "--reps") o.reps = std::max(1, std::stoi(value));
    else if (arg == "--file") o.file = value;
    else if (arg == "--ops") o.ops = kompress_bench::split(value);
    else if (arg == "--transport") {
      if (value == "automatic") o.transport = kompress::transport_mode::automatic;
      else if (value == "direct") o.transport = kompress::transport_mode::direct;
      else if (value == "staged") o.transport = kompress::transport_mode::staged;
      else usage("--transport is automatic, direct or staged");
    } else {
      usage(("unknown option " + arg).c_str());
    }
  }
  return o;
}

int rank_of() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
int size_of() {
  int s = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &s);
  return s;
}

/// The slowest rank's wall time of one call.
double seconds_of(const std::function<void()>& call) {
  MPI_Barrier(MPI_COMM_WORLD);
  const auto t0 = std::chrono::steady_clock::now();
  call();
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  MPI_Allreduce(MPI_IN_PLACE, &s, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return s;
}

double median(std::vector<double> times) {
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

/// MPI_Allreduce's sum of half_t values, added in float.
void add_halves(void* in, void* inout, int* count, MPI_Datatype*) {
  const half* a = static_cast<const half*>(in);
  half* b = static_cast<half*>(inout);
  for (int i = 0; i < *count; ++i) b[i] = half(float(a[i]) + float(b[i]));
}

/// One MPI collective on `in` and `out` (host, or device under a CUDA-aware MPI) of a type and,
/// for a sum, its op.
using mpi_collective = std::function<void(void* in, void* out, MPI_Datatype type, MPI_Op sum)>;

/// The plain-MPI and fp16 baselines of one collective on `n` values in, `n` values out
/// (alltoall or allreduce), staged through pinned host memory unless MPI reads the Views.
struct baselines {
  bool direct = false;
  pinned host_in, host_out;
  halves half_in, half_out;
  pinned_halves host_half_in, host_half_out;
  MPI_Datatype half_type = MPI_DATATYPE_NULL;
  MPI_Op half_sum = MPI_OP_NULL;

  baselines(std::size_t n, bool mpi_reads_views) : direct(mpi_reads_views) {
    host_in = pinned("bench::host_in", n);
    host_out = pinned("bench::host_out", n);
    half_in = halves("bench::half_in", n);
    half_out = halves("bench::half_out", n);
    host_half_in = pinned_halves("bench::host_half_in", n);
    host_half_out = pinned_halves("bench::host_half_out", n);
    MPI_Type_contiguous(int(sizeof(half)), MPI_BYTE, &half_type);
    MPI_Type_commit(&half_type);
    MPI_Op_create(add_halves, 1, &half_sum);
  }
  ~baselines() {
    MPI_Op_free(&half_sum);
    MPI_Type_free(&half_type);
  }

  void mpi(const values& in, const values& out, const mpi_collective& collective) {
    if (direct) {
      exec().fence();
      collective(in.data(), out.data(), MPI_FLOAT, MPI_SUM);
      return;
    }
    Kokkos::deep_copy(exec(), host_in, in);
    exec().fence();
    collective(host_in.data(), host_out.data(), MPI_FLOAT, MPI_SUM);
    Kokkos::deep_copy(exec(), out, host_out);
    exec().fence();
  }
  /// `staged_only`: the halves go through host memory even where MPI reads the Views (a
  /// user-defined MPI_Op runs on the host).
  void fp16(const values& in, const values& out, const mpi_collective& collective, bool staged_only = false) {
    const auto down = half_in;
    const auto from = in;
    Kokkos::parallel_for("bench::to_half", Kokkos::RangePolicy<exec>(0, in.size()),
                         KOKKOS_LAMBDA(std::size_t i) { down(i) = Kokkos::Experimental::cast_to_half(from(i)); });
    if (direct && !staged_only) {
      exec().fence();
      collective(half_in.data(), half_out.data(), half_type, half_sum);
    } else {
      Kokkos::deep_copy(exec(), host_half_in, half_in);
      exec().fence();
      collective(host_half_in.data(), host_half_out.data(), half_type, half_sum);
      Kokkos::deep_copy(exec(), half_out, host_half_out);
    }
    const auto up = half_out;
    const auto to = out;
    Kokkos::parallel_for("bench::from_half", Kokkos::RangePolicy<exec>(0, in.size()),
                         KOKKOS_LAMBDA(std::size_t i) { to(i) = Kokkos::Experimental::cast_from_half<float>(up(i)); });
    exec().fence();
  }
};

/// The largest |a - b| over two Views (on the host).
double max_difference(const values& a, const values& b) {
  const auto ha = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, a);
  const auto hb = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, b);
  double worst = 0.0;
  for (std::size_t i = 0; i < ha.size(); ++i) worst = std::max(worst, std::fabs(double(ha(i)) - double(hb(i))));
  return worst;
}

struct result {
  std::string op;
  double kompress_s = 0, mpi_s = 0, fp16_s = 0, ratio = 0, error_over_bound = 0;
};

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int status = 0;
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    const options opts = parse(argc, argv);
    const int p = size_of(), me = rank_of();
    const auto how = kompress::detail::transport_for<exec, memory>(opts.transport);
    const bool mpi_reads_views = !how.staged;

    // Each rank's send buffer: --mib MiB per peer of the file's values, tiled, shifted by rank.
    const std::vector<float> file = kompress::test::read_raw<float>(opts.file);
    const std::size_t per_peer = opts.mib * (std::size_t(1) << 20) / sizeof(float);
    const std::size_t n = per_peer * std::size_t(p);
    std::vector<float> host(n);
    for (std::size_t i = 0; i < n; ++i) host[i] = file[(i + std::size_t(me) * 7919) % file.size()];
    const values send("bench::send", n), got("bench::got", n), reference("bench::reference", n);
    Kokkos::deep_copy(send, Kokkos::View<const float*, Kokkos::HostSpace>(host.data(), n));
    double max_abs = 0.0;  // for the rounding of two summation orders in the allreduce check
    for (const float x : host) max_abs = std::max(max_abs, double(std::fabs(x)));
    MPI_Allreduce(MPI_IN_PLACE, &max_abs, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    std::unique_ptr<kompress::dlrm::embedding_exchange> exchange;
    baselines base(n, mpi_reads_views);
    kompress::comm_workspace workspace(MPI_COMM_WORLD);
    kompress::collective_options options{.codec = {.bound = kompress::relative(opts.bound)}};
    options.transport = opts.transport;

    std::vector<result> results;
    for (const std::string& op : opts.ops) {
      result r{op};
      std::vector<double> tk, tm, tf;
      kompress::collective_report report;
      std::function<void()> run_kompress, run_mpi, run_fp16;
      if (op == "alltoall" || op == "dlrm") {
        const int count = int(per_peer);
        const auto alltoall = [count](void* in, void* out, MPI_Datatype type, MPI_Op) {
          MPI_Alltoall(in, count, type, out, count, type, MPI_COMM_WORLD);
        };
        run_mpi = [&, alltoall] { base.mpi(send, reference, alltoall); };
        run_fp16 = [&, alltoall] { base.fp16(send, got, alltoall); };
        if (op == "alltoall") {
          run_kompress = [&] { report = kompress::alltoall(exec(), send, got, MPI_COMM_WORLD, options, &workspace); };
        } else {
          // One table per rank, dim 256: the forward sends each peer its batch slice of this
          // rank's table, per_peer values, as the alltoall above does.
          const std::size_t dim = 256, local_batch = per_peer / dim;
          std::vector<kompress::dlrm::table> tables;
          for (int t = 0; t < p; ++t) tables.push_back({t, dim});
          kompress::dlrm::exchange_options dlrm_options;
          dlrm_options.forward.bound = kompress::relative(opts.bound);
          dlrm_options.transport = opts.transport;
          exchange = std::make_unique<kompress::dlrm::embedding_exchange>(MPI_COMM_WORLD, tables, local_batch,
                                                                            dlrm_options);
          using matrix = Kokkos::View<float**, Kokkos::LayoutRight, memory>;
          const matrix in(send.data(), local_batch * std::size_t(p), dim);
          const matrix out(got.data(), local_batch, dim * std::size_t(p));
          run_kompress = [&, in, out] { report = exchange->forward(exec(), in, out); };
        }
      } else if (op == "allreduce") {
        const auto allreduce = [n](void* in, void* out, MPI_Datatype type, MPI_Op sum) {
          MPI_Allreduce(in, out, int(n), type, sum, MPI_COMM_WORLD);
        };
        run_mpi = [&, allreduce] { base.mpi(send, reference, allreduce); };
        run_fp16 = [&, allreduce] { base.fp16(send, got, allreduce, true); };
        run_kompress = [&] { report = kompress::allreduce(exec(), send, got, MPI_COMM_WORLD, options, &workspace); };
      } else {
        usage(("unknown op " + op).c_str());
      }
      run_mpi();  // warm-up: allocations, MPI's connections, the workspace
      run_fp16();
      run_kompress();
      for (int rep = 0; rep < opts.reps; ++rep) {
        tm.push_back(seconds_of(run_mpi));
        tf.push_back(seconds_of(run_fp16));
        tk.push_back(seconds_of(run_kompress));
      }
      r.mpi_s = median(tm);
      r.fp16_s = median(tf);
      r.kompress_s = median(tk);
      r.ratio = report.ratio();
      // The DLRM forward's layout differs from the alltoall's: it is checked by its own tests.
      if (op != "dlrm") {
        // Each rank against the bound of what it received (alltoall: its senders' bounds).
        run_mpi();
        const double error = max_difference(got, reference);
        const double sum_slack = op == "allreduce" ? 2.0 * p * p * 1.2e-7 * max_abs : 0.0;
        int violated = error > report.absolute_bound + sum_slack;
        r.error_over_bound = report.absolute_bound > 0 ? error / report.absolute_bound : 0.0;
        MPI_Allreduce(MPI_IN_PLACE, &violated, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
        MPI_Allreduce(MPI_IN_PLACE, &r.error_over_bound, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        if (violated) status = 1;
      }
      results.push_back(r);
    }
    if (me == 0) {
      std::printf("bench_collectives_device: %d ranks, %s, %zu MiB per peer of %s, REL %g, transport %s, "
                  "load %s, median of %d\n",
                  p, exec::name(), opts.mib, opts.file.c_str(), opts.bound,
                  how.staged ? "staged" : "direct", kompress_bench::load_average().c_str(), opts.reps);
      std::printf("%-10s %12s %12s %12s %10s %10s %8s %10s\n", "op", "kompress ms", "mpi ms", "fp16 ms",
                  "vs mpi", "vs fp16", "ratio", "err/bound");
      for (const result& r : results)
        std::printf("%-10s %12.3f %12.3f %12.3f %9.2fx %9.2fx %8.2f %10.3f\n", r.op.c_str(), 1e3 * r.kompress_s,
                    1e3 * r.mpi_s, 1e3 * r.fp16_s, r.mpi_s / r.kompress_s, r.fp16_s / r.kompress_s, r.ratio,
                    r.error_over_bound);
      if (status) std::printf("BOUND VIOLATED\n");
    }
  }
  MPI_Finalize();
  return status;
}
