// bench_allreduce_side_by_side: kompress's allreduce (sum) on one real array at one absolute
// bound, in the shape a peer library's own driver can reproduce exactly, so the two run on the
// same data, the same bound and the same link (docs/performance.md, "Side by side with ZCCL").
//
// Data: a float32 file of the data folder (--file), tiled to --bytes per rank, rank r starting
// at offset (n / p * r) / 128 * 128 (bench_collectives' tiling). Bound: --abs E, or REL --rel R
// over the value range of all ranks' buffers (one MPI_Allreduce), printed, so the peer's driver
// can be given the same absolute number. Variants, in turn, each after an MPI_Barrier:
//   plain        MPI_Allreduce(MPI_SUM)
//   recompress   kompress::allreduce, transfer_mode::compressed, ABS E per compression
//   homomorphic  the same with reduction_method::homomorphic (ABS E per rank's quantization)
// One untimed call of each, then --reps rounds; a sample is the max over ranks. Reported per
// variant: median and fastest time, wire ratio (kompress's report), max |result - MPI's|.
// Output: a table and CSV lines ("csv,tool,variant,file,bytes,abs_bound,median_ms,min_ms,
// ratio,max_error") on rank 0.
//
//   mpiexec -n 2 bench_allreduce_side_by_side [--file NAME] [--bytes N[KMG]] [--rel R | --abs E]
//       [--reps 9] [--block-size 32]

#include "real_data.hpp"

#include "support.hpp"

#include <kompress/comm.hpp>

#include <Kokkos_Core.hpp>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

namespace {

struct settings {
  std::string file = "act_mlp_relu2_out_1024x1024.f32";
  std::size_t bytes = 16u << 20;
  double rel = 1e-2, abs = NAN;
  int reps = 9, block_size = 32;
};

std::size_t parse_bytes(const std::string& text) {
  const char unit = text.empty() ? '\0' : text.back();
  const double number = std::stod(text);
  const double scale = unit == 'K' ? 1024.0 : unit == 'M' ? 1048576.0 : unit == 'G' ? 1073741824.0 : 1.0;
  return std::size_t(number * scale);
}

int run(int argc, char** argv) {
  settings s;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string arg = argv[i], value = argv[i + 1];
    if (arg == "--file") s.file = value;
    else if (arg == "--bytes") s.bytes = parse_bytes(value);
    else if (arg == "--rel") s.rel = std::stod(value);
    else if (arg == "--abs") s.abs = std::stod(value);
    else if (arg == "--reps") s.reps = std::stoi(value);
    else if (arg == "--block-size") s.block_size = std::stoi(value);
    else throw std::runtime_error("unknown argument " + arg);
  }
  int rank = 0, p = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &p);
  using view = Kokkos::View<float*, Kokkos::HostSpace>;
  const std::vector<float> values = kompress::test::read_raw<float>(s.file);
  const std::size_t count = s.bytes / sizeof(float), n = values.size();
  view send("send", count), expected("expected", count), got("got", count);
  std::size_t at = (n / std::size_t(p) * std::size_t(rank)) / 128 * 128 % n;
  for (std::size_t i = 0; i < count; ++i, at = (at + 1) % n) send(i) = values[at];

  double e = s.abs;
  if (std::isnan(e)) {
    double range[2] = {-INFINITY, -INFINITY};  // -min, max
    for (std::size_t i = 0; i < count; ++i) {
      range[0] = std::max(range[0], -double(send(i)));
      range[1] = std::max(range[1], double(send(i)));
    }
    MPI_Allreduce(MPI_IN_PLACE, range, 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    e = s.rel * (range[1] + range[0]);
  }
  MPI_Allreduce(send.data(), expected.data(), int(count), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);

  const Kokkos::DefaultHostExecutionSpace exec;
  kompress::comm_workspace workspace(MPI_COMM_WORLD);
  const auto options_for = [&](kompress::reduction_method method) {
    return kompress::collective_options{.codec = {.bound = kompress::absolute(e), .block_size = s.block_size},
                                        .reduction = method};
  };
  struct variant {
    std::string name;
    std::vector<double> seconds;
    double ratio = 1.0, max_error = 0.0;
  };
  std::vector<variant> variants = {{"plain", {}}, {"recompress", {}}, {"homomorphic", {}}};
  const auto call = [&](std::size_t v) -> double {  // returns the wire ratio
    if (v == 0) {
      MPI_Allreduce(send.data(), got.data(), int(count), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      return 1.0;
    }
    const auto method = v == 1 ? kompress::reduction_method::recompress : kompress::reduction_method::homomorphic;
    return kompress::allreduce(exec, send, got, MPI_COMM_WORLD, options_for(method), &workspace).ratio();
  };
  for (std::size_t v = 0; v < variants.size(); ++v) {
    variants[v].ratio = call(v);
    double error = 0.0;
    for (std::size_t i = 0; i < count; ++i) error = std::max(error, std::fabs(double(got(i)) - double(expected(i))));
    MPI_Allreduce(MPI_IN_PLACE, &error, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    variants[v].max_error = error;
  }
  for (int round = 0; round < s.reps; ++round)
    for (std::size_t v = 0; v < variants.size(); ++v) {
      MPI_Barrier(MPI_COMM_WORLD);
      const double start = MPI_Wtime();
      call(v);
      double seconds = MPI_Wtime() - start;
      MPI_Allreduce(MPI_IN_PLACE, &seconds, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      variants[v].seconds.push_back(seconds);
    }
  if (rank == 0) {
    std::printf("bench_allreduce_side_by_side: %d ranks, %s tiled to %zu bytes per rank, ABS %.6g "
                "(per compression / per rank), block %d, %d rounds, load %s\n",
                p, s.file.c_str(), s.bytes, e, s.block_size, s.reps, kompress_bench::load_average().c_str());
    std::printf("%-12s %10s %10s %8s %12s\n", "variant", "median ms", "min ms", "ratio", "max error");
    for (auto& v : variants) {
      std::sort(v.seconds.begin(), v.seconds.end());
      const double median = v.seconds[v.seconds.size() / 2] * 1e3, fastest = v.seconds.front() * 1e3;
      std::printf("%-12s %10.1f %10.1f %8.2f %12.4g\n", v.name.c_str(), median, fastest, v.ratio, v.max_error);
      std::printf("csv,kompress,%s,%s,%zu,%.9g,%.3f,%.3f,%.3f,%.6g\n", v.name.c_str(), s.file.c_str(), s.bytes, e,
                  median, fastest, v.ratio, v.max_error);
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int status = 0;
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    try {
      status = run(argc, argv);
    } catch (const std::exception& error) {
      std::fprintf(stderr, "bench_allreduce_side_by_side: %s\n", error.what());
      status = 1;
    }
  }
  MPI_Finalize();
  return status;
}
