// bench_compress_batch: many arrays compressed at once, as a collective compresses the pieces
// it sends together, through the batched kernels (three launches whatever their number) and
// through the single-stream kernels (a compression per array, each enqueued without a wait),
// both by detail::compress_batch with one wait at the end, on the build's default execution
// space with the data in its memory.
//
// For each file (default: three real float arrays, named without their shape), each piece
// count P and piece size S, the file is tiled to P x S bytes and cut into P pieces; fast
// codec, REL 1e-3. Rows:
//   batched        compress_batch as the collectives call it (on the host with the team
//                  kernels, which the batched kernels are, and Kokkos's team size)
//   one by one     the same pieces, kernel_tuning::batch_compression off: each through
//                  compress's own kernels (the team kernels on a device, a thread per chunk
//                  on the host)
//   copy           Kokkos::deep_copy of the P x S bytes: the bandwidth limit
//   decode         the batched streams decoded together by detail::decompress_batch, their
//                  headers and chunk tables read stream by stream (a copy and a wait each in
//                  device memory) and gathered (kernel_tuning::batch_headers: two waits in all);
//                  in host memory "per stream" reads them in place
// GB/s is uncompressed bytes over the fastest call; rounds time every row once each, so load
// from other processes falls on all alike. The batched streams must be the one-by-one
// streams' bytes, and both decodings the same values: the program exits 1 where one differs.
//
//   bench_compress_batch [--files a,b] [--pieces 8,64,512] [--piece-kib 16,256] [--reps 5]

#include "real_data.hpp"

#include "support.hpp"

#include <kompress/detail/compress_batch.hpp>
#include <kompress/detail/decompress_batch.hpp>

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <exception>
#include <limits>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

namespace detail = kompress::detail;
using exec = Kokkos::DefaultExecutionSpace;
using memory = exec::memory_space;
constexpr bool on_host = Kokkos::SpaceAccessibility<Kokkos::HostSpace, memory>::accessible;
constexpr double min_seconds = 0.02;

/// The .f32 file of the data folder whose name is `prefix` or starts with it followed by "_"
/// (the full set and the repository's sample cut the same field to other shapes).
std::string float_file(const std::string& prefix) {
  for (const auto& file : kompress::test::float_data_files())
    if (file.dtype == "f32" && (file.name == prefix || file.name.starts_with(prefix + "_"))) return file.name;
  throw std::runtime_error("no .f32 file named " + prefix + "_* in " + kompress::test::data_dir().string());
}

/// GB/s of the batched and one-by-one compressions, of the copy and of the two decodings, for
/// one file cut into `pieces` pieces of `piece_bytes`; false where the two compressions' streams
/// or the two decodings' values differ.
bool run(const std::string& name, std::size_t pieces, std::size_t piece_bytes, int reps) {
  const std::vector<float> file_values = kompress::test::read_raw<float>(float_file(name));
  const std::size_t per_piece = piece_bytes / sizeof(float), count = per_piece * pieces;
  Kokkos::View<float*, memory> values(Kokkos::view_alloc("values", Kokkos::WithoutInitializing), count);
  {
    const auto staged = Kokkos::create_mirror_view(values);
    kompress_bench::fill_tiled(file_values, staged.data(), count, 0, 1);
    Kokkos::deep_copy(values, staged);
  }
  Kokkos::View<float*, memory> copy(Kokkos::view_alloc("copy", Kokkos::WithoutInitializing), count);

  const kompress::compress_options options{.bound = kompress::relative(1e-3)};
  const std::size_t room = (kompress::max_compressed_size<float>(per_piece, options) + 7) / 8 * 8;
  detail::kernel_tuning batched = detail::backend<exec>::tuning(), one_by_one = batched;
  one_by_one.batch_compression = false;
  if constexpr (on_host) {
    batched.team_size = -1;  // the host's codec takes no team kernels, so no batched ones either
    one_by_one.team_size = 0;
  }
  const detail::kernel_tuning tunings[2] = {batched, one_by_one};
  Kokkos::View<std::byte*, memory> outs[2];
  std::vector<detail::stream_to_compress<float>> streams[2];
  for (int v = 0; v < 2; ++v) {
    outs[v] = Kokkos::View<std::byte*, memory>(Kokkos::view_alloc("streams", Kokkos::WithoutInitializing),
                                               room * pieces);
    for (std::size_t p = 0; p < pieces; ++p)
      streams[v].push_back({values.data() + p * per_piece, per_piece, outs[v].data() + p * room});
  }
  std::vector<std::size_t> lengths[2];
  const auto compress = [&](int v) {
    lengths[v] = detail::compress_batch<float>(exec{}, std::span<const detail::stream_to_compress<float>>(streams[v]),
                                               options, "bench_compress_batch", tunings[v]);
  };
  const auto copy_all = [&] {
    Kokkos::deep_copy(exec{}, copy, values);
    exec().fence();
  };
  // Decoding the batched streams into one output per way of reading their headers.
  compress(0);
  const detail::header_reading readings[2] = {detail::header_reading::per_stream, detail::header_reading::gathered};
  Kokkos::View<float*, memory> decoded[2];
  std::vector<detail::stream_to_decode<float>> received[2];
  for (int r = 0; r < 2; ++r) {
    decoded[r] = Kokkos::View<float*, memory>(Kokkos::view_alloc("decoded", Kokkos::WithoutInitializing), count);
    for (std::size_t p = 0; p < pieces; ++p)
      received[r].push_back({outs[0].data() + p * room, lengths[0][p], decoded[r].data() + p * per_piece, per_piece});
  }
  const auto decode = [&](int r) {
    detail::kernel_tuning tuning = detail::backend<exec>::tuning();
    tuning.batch_headers = readings[r];
    detail::decompress_batch<memory>(exec{}, std::span<const detail::stream_to_decode<float>>(received[r]),
                                     "bench_compress_batch", tuning);
    exec().fence();
  };
  double best[5];
  std::fill(best, best + 5, std::numeric_limits<double>::infinity());
  for (int round = 0; round < reps; ++round) {
    for (int v = 0; v < 2; ++v)
      best[v] = std::min(best[v], kompress_bench::best_seconds([&] { compress(v); }, 1, min_seconds));
    best[2] = std::min(best[2], kompress_bench::best_seconds(copy_all, 1, min_seconds));
    for (int r = 0; r < 2; ++r)
      best[3 + r] = std::min(best[3 + r], kompress_bench::best_seconds([&] { decode(r); }, 1, min_seconds));
  }

  // The batched streams against the one-by-one streams, byte for byte.
  const auto first = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, outs[0]);
  const auto second = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, outs[1]);
  std::size_t differing = 0, compressed = 0;
  for (std::size_t p = 0; p < pieces; ++p) {
    compressed += lengths[0][p];
    if (lengths[0][p] != lengths[1][p] ||
        std::memcmp(first.data() + p * room, second.data() + p * room, lengths[0][p]) != 0)
      ++differing;
  }
  const auto per_stream = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, decoded[0]);
  const auto gathered = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, decoded[1]);
  const bool same_values = std::memcmp(per_stream.data(), gathered.data(), count * sizeof(float)) == 0;
  const std::size_t bytes = count * sizeof(float);
  std::printf("%-34s %6zu x %8s %9.2f %11.2f %7.2fx %9.2f %7.2f %10.2f %9.2f %7.2fx%s%s\n",
              name.substr(0, 34).c_str(), pieces, kompress_bench::human_bytes(piece_bytes).c_str(),
              kompress_bench::gbs(bytes, best[0]), kompress_bench::gbs(bytes, best[1]), best[1] / best[0],
              kompress_bench::gbs(bytes, best[2]), double(bytes) / double(compressed),
              kompress_bench::gbs(bytes, best[3]), kompress_bench::gbs(bytes, best[4]), best[3] / best[4],
              differing ? "  STREAMS DIFFER" : "", same_values ? "" : "  DECODED VALUES DIFFER");
  if (differing)
    std::fprintf(stderr, "bench_compress_batch: %s, %zu pieces of %zu bytes: %zu batched streams differ\n",
                 name.c_str(), pieces, piece_bytes, differing);
  if (!same_values)
    std::fprintf(stderr, "bench_compress_batch: %s, %zu pieces of %zu bytes: the two decodings differ\n",
                 name.c_str(), pieces, piece_bytes);
  return differing == 0 && same_values;
}

}  // namespace

int main(int argc, char** argv) {
  Kokkos::ScopeGuard kokkos(argc, argv);
  std::vector<std::string> files = {"act_mlp_relu2_out", "era5_t2m_uk", "grad_mlp_fc1_out"};
  std::vector<std::size_t> piece_counts = {8, 64, 512}, piece_bytes = {16 << 10, 256 << 10};
  int reps = 5;
  try {
    for (int i = 1; i + 1 < argc; i += 2) {
      const std::string option = argv[i], value = argv[i + 1];
      if (option == "--files") {
        files = kompress_bench::split(value);
      } else if (option == "--pieces" || option == "--piece-kib") {
        std::vector<std::size_t>& list = option == "--pieces" ? piece_counts : piece_bytes;
        list.clear();
        for (const auto& item : kompress_bench::split(value))
          list.push_back(std::stoul(item) * (option == "--pieces" ? 1 : 1024));
      } else if (option == "--reps") {
        reps = std::stoi(value);
      } else {
        throw std::invalid_argument(option);
      }
    }
  } catch (const std::exception&) {
    std::fprintf(stderr, "usage: bench_compress_batch [--files a,b] [--pieces 8,64,512] [--piece-kib 16,256] "
                         "[--reps 5]\n");
    return 2;
  }
  std::printf("bench_compress_batch: %s, %s, load average %s, fast codec, REL 1e-3\n", exec::name(),
              kompress_bench::cpu_model().c_str(), kompress_bench::load_average().c_str());
  std::printf("%-34s %17s %9s %11s %8s %9s %7s %10s %9s %8s\n", "file", "pieces", "batched", "one by one",
              "speedup", "copy", "ratio", "decode:", "decode:", "speedup");
  std::printf("%-34s %17s %9s %11s %8s %9s %7s %10s %9s %8s\n", "", "", "GB/s", "GB/s", "", "GB/s", "",
              "per stream", "gathered", "");
  bool same = true;
  try {
    for (const auto& file : files)
      for (const std::size_t pieces : piece_counts)
        for (const std::size_t bytes : piece_bytes) same = run(file, pieces, bytes, reps) && same;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_compress_batch: %s\n", e.what());
    return 1;
  }
  std::printf("load average now %s\n", kompress_bench::load_average().c_str());
  return same ? 0 : 1;
}
