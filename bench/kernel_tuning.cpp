// bench_kernel_tuning: the measurements behind the host backend's tuning values
// (include/kompress/kernels/backend/host.hpp, docs/performance.md "Kernel tuning").
//
// For each file (default: five real arrays of 0.5-9.6 MB) at REL 1e-3, compression through
// detail::enqueue_compress_kernels with one tuning value changed at a time from the backend's
// own, on all Kokkos threads:
//   encoder            portable / avx2_fma (block size 32)
//   assemble           0 (one thread) / 1 / 2 parallel waves (default 4)
//   range segment      1024 / 4096 / 16384 / 65536 values
//   blocks per chunk   32 / 64 / 128 (changes the bytes: the format's value is 64)
//   team kernels       a team per chunk (kernels/team_codec.hpp, the CUDA backend's) of 1
//                      thread and of Kokkos's choice (default: the host backend's kernels)
// and memcpy (split over the threads) as the baseline, in the same run. GB/s is uncompressed
// bytes over the fastest call; every row is also given as a ratio to the backend's default
// tuning and to memcpy; and the share of the moved bytes each assemble wave moves. Variants are timed in turns (each round times every variant once),
// so that load from other processes falls on all alike. Streams of the byte-preserving variants are compared with the
// default's, and the run fails if one differs.
//
//   bench_kernel_tuning [--files a,b] [--reps 7] [--min-time-ms 20]

#include "real_data.hpp"

#include "support.hpp"

#include <kompress/kompress.hpp>

#include <Kokkos_Core.hpp>

#include <cstdio>
#include <cstring>
#include <exception>
#include <limits>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

namespace detail = kompress::detail;
using host = Kokkos::DefaultHostExecutionSpace;

struct variant {
  std::string name;
  detail::kernel_tuning tuning;
  int blocks_per_chunk = detail::default_blocks_per_chunk;
  bool same_bytes = true;
};

template <class T>
void run_file(const std::string& name, int reps, double min_seconds, std::vector<std::vector<double>>& speedups,
              const std::vector<variant>& variants) {
  const std::vector<T> values = kompress::test::read_raw<T>(name);
  const std::size_t bytes = values.size() * sizeof(T);

  // memcpy split over the threads, as the kernels are.
  std::vector<T> copy(values.size());
  const auto memcpy_all = [&] {
    Kokkos::parallel_for(Kokkos::RangePolicy<host>(0, host().concurrency()), [&](int t) {
      const std::size_t per = (values.size() + host().concurrency() - 1) / host().concurrency();
      const std::size_t begin = std::min(values.size(), per * std::size_t(t));
      const std::size_t end = std::min(values.size(), begin + per);
      std::memcpy(copy.data() + begin, values.data() + begin, (end - begin) * sizeof(T));
    });
    host().fence();
  };
  double memcpy_s = std::numeric_limits<double>::infinity();

  // Variants are timed in turns, one call each per round, each keeping its fastest: load
  // from other processes then falls on all of them alike.
  std::vector<detail::stream_header> headers(variants.size());
  std::vector<std::vector<std::byte>> outs(variants.size());
  std::vector<double> best(variants.size(), std::numeric_limits<double>::infinity());
  for (std::size_t v = 0; v < variants.size(); ++v) {
    detail::stream_header& header = headers[v];
    header.type = detail::element_type_of<T>();
    header.mode = kompress::bound_mode::relative;
    header.user_bound = 1e-3;
    header.count = values.size();
    header.block_size = 32;
    header.blocks_per_chunk = variants[v].blocks_per_chunk;
    outs[v].resize(header.layout().max_stream_bytes());
  }
  const auto compress = [&](std::size_t v) {
    detail::enqueue_compress_kernels<T, 32>(host{}, values.data(), outs[v].data(), headers[v],
                                            nullptr, variants[v].tuning);
    host().fence();
  };
  for (int round = 0; round < reps; ++round) {
    memcpy_s = std::min(memcpy_s, kompress_bench::best_seconds(memcpy_all, 1, min_seconds));
    for (std::size_t v = 0; v < variants.size(); ++v)
      best[v] = std::min(best[v], kompress_bench::best_seconds([&] { compress(v); }, 1, min_seconds));
  }

  std::printf("%-42s %9.2f GB/s memcpy\n", name.c_str(), kompress_bench::gbs(bytes, memcpy_s));
  const auto stream = [&](std::size_t v) {
    const auto length = detail::load<std::uint64_t>(outs[v].data() + detail::stream_length_offset);
    return std::vector<std::byte>(outs[v].begin(), outs[v].begin() + std::ptrdiff_t(length));
  };
  const auto reference = stream(0);
  {
    // How much of the assembly the parallel strategy takes off the serial thread: a property
    // of the chunk lengths, free of timing noise.
    const detail::stream_layout layout = headers[0].layout();
    const detail::chunk_moves moves{outs[0].data() + layout.data_offset(),
                                    outs[0].data() + layout.chunk_end_table_offset(),
                                    layout.max_chunk_bytes(layout.values_per_chunk())};
    std::uint64_t wave_bytes[detail::max_assemble_waves + 1] = {}, moved_bytes = 0;
    for (std::uint64_t c = 1; c < layout.chunk_count(); ++c) {
      const std::uint64_t length = moves.end(c) - moves.begin(c);
      moved_bytes += length;
      wave_bytes[moves.wave<detail::max_assemble_waves>(c)] += length;
    }
    std::printf("  assemble: %.2f MB moved; by wave 0..%d, then on one thread:", double(moved_bytes) / 1e6,
                detail::max_assemble_waves - 1);
    for (const std::uint64_t b : wave_bytes)
      std::printf(" %.1f%%", moved_bytes ? 100.0 * double(b) / double(moved_bytes) : 0.0);
    std::printf("\n");
  }
  for (std::size_t v = 0; v < variants.size(); ++v) {
    const auto out = stream(v);
    if (variants[v].same_bytes && out != reference)
      throw std::runtime_error(name + ": " + variants[v].name + " wrote different bytes");
    speedups[v].push_back(best[0] / best[v]);
    std::printf("  %-40s %9.3f GB/s  %5.3f x memcpy  %5.3f x default  ratio %.2f\n",
                variants[v].name.c_str(), kompress_bench::gbs(bytes, best[v]), memcpy_s / best[v],
                best[0] / best[v], double(bytes) / double(out.size()));
  }
}

}  // namespace

int main(int argc, char** argv) {
  Kokkos::ScopeGuard kokkos(argc, argv);
  std::vector<std::string> files = {"act_mlp_fc1_out_1024x1024.f32", "emb_word2vec_googlenews_8000x300.f32",
                                    "erai_z_2x3x241x480.f32", "cesm_trefht_4x110x64x128.f32",
                                    "mpas_surface_pressure_163842.f64"};
  int reps = 7;
  double min_seconds = 0.02;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string option = argv[i];
    if (option == "--files") files = kompress_bench::split(argv[i + 1]);
    else if (option == "--reps") reps = std::stoi(argv[i + 1]);
    else if (option == "--min-time-ms") min_seconds = std::stod(argv[i + 1]) / 1e3;
    else {
      std::fprintf(stderr, "usage: bench_kernel_tuning [--files a,b] [--reps 7] [--min-time-ms 20]\n");
      return 2;
    }
  }
  const detail::kernel_tuning base = detail::backend<host>::tuning();
  const auto with = [&](auto change) {
    detail::kernel_tuning t = base;
    change(t);
    return t;
  };
  std::vector<variant> variants = {
      {"default (backend<host>::tuning())", base},
      {"encoder portable", with([](auto& t) { t.encoder = detail::encoder_kind::portable; })},
      {"encoder avx2_fma", with([](auto& t) { t.encoder = detail::encoder_kind::avx2_fma; })},
      {"assemble on one thread (0 waves)", with([](auto& t) { t.assemble_waves = 0; })},
      {"assemble in 1 parallel wave", with([](auto& t) { t.assemble_waves = 1; })},
      {"assemble in 2 parallel waves", with([](auto& t) { t.assemble_waves = 2; })},
      {"range segment 1024", with([](auto& t) { t.range_segment = 1024; })},
      {"range segment 16384", with([](auto& t) { t.range_segment = 16384; })},
      {"range segment 65536", with([](auto& t) { t.range_segment = 65536; })},
      {"team kernels, 1 thread per team", with([](auto& t) { t.team_size = 1; })},
      {"team kernels, Kokkos's team size", with([](auto& t) { t.team_size = -1; })},
      {"blocks per chunk 32 (other bytes)", base, 32, false},
      {"blocks per chunk 128 (other bytes)", base, 128, false},
  };
  std::printf("bench_kernel_tuning: %d threads, %s, encoder %s, load average %s\n",
              host().concurrency(), kompress_bench::cpu_model().c_str(),
              kompress_bench::encoder_instruction_set().c_str(), kompress_bench::load_average().c_str());
  std::vector<std::vector<double>> speedups(variants.size());
  try {
    for (const auto& file : files) {
      if (file.ends_with(".f64"))
        run_file<double>(file, reps, min_seconds, speedups, variants);
      else
        run_file<float>(file, reps, min_seconds, speedups, variants);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_kernel_tuning: %s\n", e.what());
    return 1;
  }
  std::printf("geometric mean over the files, speed vs the default tuning (load average now %s):\n",
              kompress_bench::load_average().c_str());
  for (std::size_t v = 0; v < variants.size(); ++v)
    std::printf("  %-40s %5.3f\n", variants[v].name.c_str(), kompress_bench::geomean(speedups[v]));
  return 0;
}
