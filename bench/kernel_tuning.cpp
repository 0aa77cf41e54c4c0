// bench_kernel_tuning: the measurements behind the backends' tuning values
// (include/kompress/kernels/backend/host.hpp and cuda.hpp, docs/performance.md "Kernel tuning").
//
// On the build's default execution space (the host in an OpenMP build, the GPU in a CUDA build),
// input and output in its memory. For each file (default: five real arrays of 0.5-9.6 MB;
// --tile N repeats each N times, for a GPU) at REL 1e-3, compression through
// detail::enqueue_compress_kernels and decompression through detail::decompress_chunks with one
// tuning value changed at a time from the backend's own. On the host:
//   host SIMD          the encoder and decoder compiled for the build's target (portable),
//                      for AVX2 + FMA and for AVX-512 (block size 32)
//   assemble           0 (one thread) / 1 / 2 parallel waves (default 4)
//   range segment      1024 / 4096 / 16384 / 65536 values
//   team kernels       a team per chunk (kernels/team_codec.hpp, the CUDA backend's) of 1
//                      thread and of Kokkos's choice (default: the host backend's kernels)
// on a device:
//   team size          32 / 64 / 128 / Kokkos's choice, and 0: a thread per chunk (the
//                      portable kernels, with 4 and 0 assemble waves)
//   range segment      64 / 256 / 1024 / 4096 values
// and on both
//   blocks per chunk   32 / 64 / 128 (changes the bytes: the format's value is 64)
// with a copy as the baseline, in the same run (on the host memcpy split over the threads, on a
// device Kokkos::deep_copy). GB/s is uncompressed bytes over the fastest call; every row is
// also given as a ratio to the backend's default tuning and to the copy; and the share of the
// moved bytes each assemble wave of the portable kernels moves. Variants are timed in turns
// (each round times every variant once), so that load from other processes falls on all
// alike. Streams of the byte-preserving variants are compared with the default's, and decoded
// values with the default decoder's; the run fails if one differs.
//
//   bench_kernel_tuning [--files a,b] [--reps 7] [--min-time-ms 20] [--tile 1]

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
using exec = Kokkos::DefaultExecutionSpace;
using memory = exec::memory_space;
constexpr bool on_host = Kokkos::SpaceAccessibility<Kokkos::HostSpace, memory>::accessible;

struct variant {
  std::string name;
  detail::kernel_tuning tuning;
  int blocks_per_chunk = detail::default_blocks_per_chunk;
  bool same_bytes = true;
};

template <class T>
void run_file(const std::string& name, int reps, double min_seconds, int tile,
              std::vector<std::vector<double>>& speedups, std::vector<std::vector<double>>& decode_speedups,
              const std::vector<variant>& variants) {
  const std::vector<T> file_values = kompress::test::read_raw<T>(name);
  const std::size_t count = file_values.size() * std::size_t(tile);
  const std::size_t bytes = count * sizeof(T);
  Kokkos::View<T*, memory> values(Kokkos::view_alloc("values", Kokkos::WithoutInitializing), count);
  {
    const auto staged = Kokkos::create_mirror_view(values);
    for (std::size_t i = 0; i < count; ++i) staged(i) = file_values[i % file_values.size()];
    Kokkos::deep_copy(values, staged);
  }

  // The copy: memcpy split over the threads on the host, as the kernels are; deep_copy on a device.
  Kokkos::View<T*, memory> copy(Kokkos::view_alloc("copy", Kokkos::WithoutInitializing), count);
  const auto copy_all = [&] {
    if constexpr (on_host) {
      Kokkos::parallel_for(Kokkos::RangePolicy<host>(0, host().concurrency()), [&](int t) {
        const std::size_t per = (count + host().concurrency() - 1) / host().concurrency();
        const std::size_t begin = std::min(count, per * std::size_t(t));
        const std::size_t end = std::min(count, begin + per);
        std::memcpy(copy.data() + begin, values.data() + begin, (end - begin) * sizeof(T));
      });
    } else {
      Kokkos::deep_copy(exec{}, copy, values);
    }
    exec().fence();
  };
  double copy_s = std::numeric_limits<double>::infinity();

  // Variants are timed in turns, one call each per round, each keeping its fastest: load
  // from other processes then falls on all of them alike.
  std::vector<detail::stream_header> headers(variants.size());
  std::vector<Kokkos::View<std::byte*, memory>> outs(variants.size());
  std::vector<double> best(variants.size(), std::numeric_limits<double>::infinity());
  std::vector<double> best_decode(variants.size(), std::numeric_limits<double>::infinity());
  for (std::size_t v = 0; v < variants.size(); ++v) {
    detail::stream_header& header = headers[v];
    header.type = detail::element_type_of<T>();
    header.mode = kompress::bound_mode::relative;
    header.user_bound = 1e-3;
    header.count = count;
    header.block_size = 32;
    header.blocks_per_chunk = variants[v].blocks_per_chunk;
    outs[v] = Kokkos::View<std::byte*, memory>(
        Kokkos::view_alloc("stream", Kokkos::WithoutInitializing), header.layout().max_stream_bytes());
  }
  const auto compress = [&](std::size_t v) {
    detail::enqueue_compress_kernels<T, 32>(exec{}, values.data(), outs[v].data(), headers[v],
                                            nullptr, variants[v].tuning);
    exec().fence();
  };
  for (std::size_t v = 0; v < variants.size(); ++v) compress(v);
  // What decompression needs from each stream's header, read once on the host.
  std::vector<detail::stream_header> written(variants.size());
  std::vector<detail::value_codec<T>> codecs(variants.size());
  for (std::size_t v = 0; v < variants.size(); ++v) {
    written[v] = detail::read_header(outs[v], "bench_kernel_tuning");
    codecs[v].step = written[v].quant_step;
  }
  Kokkos::View<T*, memory> decoded(Kokkos::view_alloc("decoded", Kokkos::WithoutInitializing), count);
  const auto decompress = [&](std::size_t v) {
    detail::decompress_chunks<T, 32>(exec{}, outs[v].data(), written[v], codecs[v], decoded.data(),
                                     "bench_kernel_tuning", variants[v].tuning);
    exec().fence();
  };
  for (int round = 0; round < reps; ++round) {
    copy_s = std::min(copy_s, kompress_bench::best_seconds(copy_all, 1, min_seconds));
    for (std::size_t v = 0; v < variants.size(); ++v) {
      best[v] = std::min(best[v], kompress_bench::best_seconds([&] { compress(v); }, 1, min_seconds));
      best_decode[v] =
          std::min(best_decode[v], kompress_bench::best_seconds([&] { decompress(v); }, 1, min_seconds));
    }
  }

  std::printf("%-42s %9.2f GB/s copy (%zu MB)\n", name.c_str(), kompress_bench::gbs(bytes, copy_s),
              bytes / 1000000);
  const auto stream = [&](std::size_t v) {
    const auto all = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, outs[v]);
    return std::vector<std::byte>(all.data(), all.data() + written[v].stream_bytes);
  };
  const auto decode_on_host = [&](std::size_t v) {
    decompress(v);
    const auto all = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, decoded);
    return std::vector<T>(all.data(), all.data() + count);
  };
  const auto reference = stream(0);
  const auto reference_values = decode_on_host(0);
  {
    // How much of the portable kernels' assembly the parallel waves take off the serial
    // thread: a property of the chunk lengths, free of timing noise.
    const detail::stream_layout layout = headers[0].layout();
    std::vector<std::byte> tables(reference);
    const detail::chunk_moves moves{tables.data() + layout.data_offset(),
                                    tables.data() + layout.chunk_end_table_offset(),
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
    if (variants[v].same_bytes) {
      if (out != reference)
        throw std::runtime_error(name + ": " + variants[v].name + " wrote different bytes");
      if (std::memcmp(decode_on_host(v).data(), reference_values.data(), bytes) != 0)
        throw std::runtime_error(name + ": " + variants[v].name + " decoded different values");
    }
    speedups[v].push_back(best[0] / best[v]);
    decode_speedups[v].push_back(best_decode[0] / best_decode[v]);
    std::printf("  %-40s %9.3f GB/s  %5.3f x copy  %5.3f x default | decompress %9.3f GB/s  %5.3f x default  ratio %.2f\n",
                variants[v].name.c_str(), kompress_bench::gbs(bytes, best[v]), copy_s / best[v],
                best[0] / best[v], kompress_bench::gbs(bytes, best_decode[v]),
                best_decode[0] / best_decode[v], double(bytes) / double(out.size()));
  }
}

}  // namespace

int main(int argc, char** argv) {
  Kokkos::ScopeGuard kokkos(argc, argv);
  std::vector<std::string> files = {"act_mlp_fc1_out_1024x1024.f32", "emb_word2vec_googlenews_8000x300.f32",
                                    "erai_z_2x3x241x480.f32", "cesm_trefht_4x110x64x128.f32",
                                    "mpas_surface_pressure_163842.f64"};
  int reps = 7;
  int tile = 1;
  double min_seconds = 0.02;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string option = argv[i];
    if (option == "--files") files = kompress_bench::split(argv[i + 1]);
    else if (option == "--reps") reps = std::stoi(argv[i + 1]);
    else if (option == "--min-time-ms") min_seconds = std::stod(argv[i + 1]) / 1e3;
    else if (option == "--tile") tile = std::stoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "usage: bench_kernel_tuning [--files a,b] [--reps 7] [--min-time-ms 20] [--tile 1]\n");
      return 2;
    }
  }
  if (tile < 1) {
    std::fprintf(stderr, "bench_kernel_tuning: --tile must be at least 1\n");
    return 2;
  }
  const detail::kernel_tuning base = detail::backend<exec>::tuning();
  const auto with = [&](auto change) {
    detail::kernel_tuning t = base;
    change(t);
    return t;
  };
  std::vector<variant> variants = {{"default (backend<exec>::tuning())", base}};
  if constexpr (on_host) {
    variants.insert(variants.end(), {
        {"host SIMD portable", with([](auto& t) { t.encoder = t.decoder = detail::encoder_kind::portable; })},
        {"host SIMD avx2_fma", with([](auto& t) { t.encoder = t.decoder = detail::encoder_kind::avx2_fma; })},
        {"host SIMD avx512", with([](auto& t) { t.encoder = t.decoder = detail::encoder_kind::avx512; })},
        {"assemble on one thread (0 waves)", with([](auto& t) { t.assemble_waves = 0; })},
        {"assemble in 1 parallel wave", with([](auto& t) { t.assemble_waves = 1; })},
        {"assemble in 2 parallel waves", with([](auto& t) { t.assemble_waves = 2; })},
        {"range segment 1024", with([](auto& t) { t.range_segment = 1024; })},
        {"range segment 16384", with([](auto& t) { t.range_segment = 16384; })},
        {"range segment 65536", with([](auto& t) { t.range_segment = 65536; })},
        {"team kernels, 1 thread per team", with([](auto& t) { t.team_size = 1; })},
        {"team kernels, Kokkos's team size", with([](auto& t) { t.team_size = -1; })},
    });
  } else {
    variants.insert(variants.end(), {
        {"team size 32", with([](auto& t) { t.team_size = 32; })},
        {"team size 64", with([](auto& t) { t.team_size = 64; })},
        {"team size 128", with([](auto& t) { t.team_size = 128; })},
        {"team size: Kokkos's choice", with([](auto& t) { t.team_size = -1; })},
        {"a thread per chunk, 4 assemble waves", with([](auto& t) { t.team_size = 0; })},
        {"a thread per chunk, one thread assembles",
         with([](auto& t) { t.team_size = 0; t.assemble_waves = 0; })},
        {"range segment 64", with([](auto& t) { t.range_segment = 64; })},
        {"range segment 256", with([](auto& t) { t.range_segment = 256; })},
        {"range segment 1024", with([](auto& t) { t.range_segment = 1024; })},
        {"range segment 4096", with([](auto& t) { t.range_segment = 4096; })},
    });
  }
  variants.push_back({"blocks per chunk 32 (other bytes)", base, 32, false});
  variants.push_back({"blocks per chunk 128 (other bytes)", base, 128, false});
  std::printf("bench_kernel_tuning: %s, %d host threads, %s, encoder %s, load average %s\n",
              exec::name(), host().concurrency(), kompress_bench::cpu_model().c_str(),
              kompress_bench::encoder_instruction_set().c_str(), kompress_bench::load_average().c_str());
  std::vector<std::vector<double>> speedups(variants.size()), decode_speedups(variants.size());
  try {
    for (const auto& file : files) {
      if (file.ends_with(".f64"))
        run_file<double>(file, reps, min_seconds, tile, speedups, decode_speedups, variants);
      else
        run_file<float>(file, reps, min_seconds, tile, speedups, decode_speedups, variants);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_kernel_tuning: %s\n", e.what());
    return 1;
  }
  std::printf("geometric mean over the files, speed vs the default tuning (load average now %s):\n",
              kompress_bench::load_average().c_str());
  std::printf("  %-40s %10s %10s\n", "", "compress", "decompress");
  for (std::size_t v = 0; v < variants.size(); ++v)
    std::printf("  %-40s %10.3f %10.3f\n", variants[v].name.c_str(), kompress_bench::geomean(speedups[v]),
                kompress_bench::geomean(decode_speedups[v]));
  return 0;
}
