// make_fuzz_seeds <directory>: writes the seed corpus of the decompress fuzzer, small valid
// streams that between them reach every kind of block and header: float and double; absolute,
// relative and lossless bounds; fill values; NaN, Inf and -0.0; block sizes 32, 64 and 128;
// 0, 1, odd and multi-chunk lengths. Every stream is decoded again before it is written, so a
// seed is known to be valid. The values are a deterministic function of the index (no
// std::*_distribution, whose output differs between standard libraries), so the corpus is the
// same on every machine.
//
// Two more seeds are decompression bombs, which decompress must reject (write_bomb_seed).
//
// Files are named <case>.kmpz; existing *.kmpz files in the directory are removed first so the
// corpus never keeps the seeds of an older version of this program.

#include <kompress/kompress.hpp>
#include <kompress/detail/checksum.hpp>

#include <Kokkos_Core.hpp>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using host = Kokkos::DefaultHostExecutionSpace;
using bytes_view = Kokkos::View<std::byte*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>;
using const_bytes_view = Kokkos::View<const std::byte*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>;
template <class T>
using values_view = Kokkos::View<T*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>;

/// A uniform number in [0, 1) from the index alone (a 64-bit mix, splitmix64's finalizer).
double noise(std::uint64_t i) {
  std::uint64_t z = i * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return double(z >> 11) * 0x1p-53;
}

template <class T>
std::vector<T> generate(std::size_t count, const std::function<double(std::size_t)>& value) {
  std::vector<T> values(count);
  for (std::size_t i = 0; i < count; ++i) values[i] = static_cast<T>(value(i));
  return values;
}

/// Compresses `values`, checks the stream decodes to the same count, writes <dir>/<name>.kmpz.
template <class T>
void write_seed(const std::filesystem::path& directory, const std::string& name,
                const std::vector<T>& values, const kompress::compress_options& options) {
  const values_view<const T> in(values.data(), values.size());
  std::vector<std::byte> stream(kompress::max_compressed_size(in, options));
  const std::size_t length =
      kompress::compress(host{}, in, bytes_view(stream.data(), stream.size()), options);
  stream.resize(length);

  const const_bytes_view compressed(stream.data(), stream.size());
  const kompress::stream_info info = kompress::inspect(compressed);
  if (info.count != values.size())
    throw std::runtime_error("make_fuzz_seeds: " + name + ": inspect reports " +
                             std::to_string(info.count) + " values, expected " +
                             std::to_string(values.size()));
  std::vector<T> decoded(values.size());
  kompress::decompress(host{}, compressed, values_view<T>(decoded.data(), decoded.size()));

  const std::filesystem::path path = directory / (name + ".kmpz");
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  file.write(reinterpret_cast<const char*>(stream.data()), std::streamsize(stream.size()));
  if (!file) throw std::runtime_error("make_fuzz_seeds: cannot write " + path.string());
  std::printf("  %-28s %6zu values -> %6zu bytes\n", path.filename().c_str(), values.size(),
              stream.size());
}

/// A decompression bomb: valid checksums, a header claiming `count` values, every
/// chunk 0 bytes long (block size 128 and 65535 blocks per chunk keep the tables small). It
/// must be rejected before anything is allocated; the fuzzer mutates it towards streams that
/// are barely long enough. Checked to be rejected before it is written.
void write_bomb_seed(const std::filesystem::path& directory, const std::string& name,
                     std::uint64_t count, kompress::element_type type) {
  namespace detail = kompress::detail;
  detail::stream_header h;
  h.type = type;
  h.count = count;
  h.user_bound = h.abs_bound = 1e-3;
  h.quant_step = 2e-3;
  h.block_size = 128;
  h.blocks_per_chunk = 65535;
  h.value_min = 0.0;
  h.value_max = 1.0;
  const detail::stream_layout layout = h.layout();
  h.stream_bytes = layout.data_offset();
  std::vector<std::byte> stream(h.stream_bytes);
  detail::write_header_fields(stream.data(), h);
  for (std::uint64_t c = 0; c < layout.chunk_count(); ++c) {
    detail::store<std::uint64_t>(stream.data() + layout.chunk_end_table_offset() + 8 * c, 0);
    detail::store<std::uint64_t>(stream.data() + layout.chunk_checksum_table_offset() + 8 * c,
                                 detail::checksum_of(stream.data(), 0));
  }
  detail::store<std::uint64_t>(stream.data() + detail::header_checksum_offset,
                               detail::header_checksum(stream.data(), layout.data_offset()));
  try {
    kompress::inspect(const_bytes_view(stream.data(), stream.size()));
    throw std::runtime_error("make_fuzz_seeds: " + name + ": inspect accepted a decompression bomb");
  } catch (const kompress::format_error&) {
  }
  const std::filesystem::path path = directory / (name + ".kmpz");
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  file.write(reinterpret_cast<const char*>(stream.data()), std::streamsize(stream.size()));
  if (!file) throw std::runtime_error("make_fuzz_seeds: cannot write " + path.string());
  std::printf("  %-28s %6s claims %llu values\n", path.filename().c_str(), "",
              static_cast<unsigned long long>(count));
}

void write_all(const std::filesystem::path& dir) {
  using kompress::absolute;
  using kompress::lossless;
  using kompress::relative;
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const auto smooth = [](std::size_t i) {
    return 20.0 * std::sin(0.05 * double(i)) + (i % 11 == 0 ? 3.0 : 0.0);
  };
  const auto rough = [](std::size_t i) { return 1000.0 * (noise(i) - 0.5); };
  const auto ramp = [](std::size_t i) { return 1e-3 * double(i); };
  // Smooth data with runs of a fill value (land masks) and a constant stretch.
  const auto masked = [&](std::size_t i) {
    if ((i / 40) % 3 == 1) return 1e20;
    if (i >= 300 && i < 500) return 7.25;
    return smooth(i);
  };
  const auto masked_double = [&](std::size_t i) { return masked(i) == 1e20 ? -9999.0 : masked(i); };
  // Specials scattered through smooth data: each forces its block to be stored exactly.
  const auto special = [&](std::size_t i) {
    switch (i % 97) {
      case 5: return nan;
      case 17: return inf;
      case 40: return -inf;
      case 66: return -0.0;
      default: return smooth(i);
    }
  };
  const auto steps = [](std::size_t i) { return double((i / 16) % 5) * 2.5; };
  const auto huge = [](std::size_t i) { return 1e30 * (1.0 + 1e-3 * double(i % 17)); };

  // float
  write_seed(dir, "f32_empty_lossless", generate<float>(0, smooth), {.bound = lossless()});
  write_seed(dir, "f32_one_abs_bs32", generate<float>(1, smooth), {.bound = absolute(1e-3)});
  write_seed(dir, "f32_odd_abs_bs32", generate<float>(31, smooth), {.bound = absolute(1e-2)});
  write_seed(dir, "f32_rel_bs64", generate<float>(1000, smooth),
             {.bound = relative(1e-3), .block_size = 64});
  write_seed(dir, "f32_abs_bs128", generate<float>(4097, smooth),
             {.bound = absolute(1e-4), .block_size = 128});
  write_seed(dir, "f32_multichunk_rel_bs32", generate<float>(10000, smooth),
             {.bound = relative(1e-4)});
  write_seed(dir, "f32_lossless_bs64", generate<float>(700, rough),
             {.bound = lossless(), .block_size = 64});
  write_seed(dir, "f32_fill_rel_bs32", generate<float>(2500, masked),
             {.bound = relative(1e-3), .fill_value = 1e20});
  write_seed(dir, "f32_specials_abs_bs64", generate<float>(1500, special),
             {.bound = absolute(1e-2), .block_size = 64});
  write_seed(dir, "f32_constant_bs128", generate<float>(777, [](std::size_t) { return 3.5; }),
             {.bound = absolute(1e-3), .block_size = 128});
  write_seed(dir, "f32_steps_abs_bs32", generate<float>(513, steps), {.bound = absolute(0.5)});
  write_seed(dir, "f32_huge_abs_bs32", generate<float>(200, huge), {.bound = absolute(1e-3)});
  // double
  write_seed(dir, "f64_empty_abs_bs64", generate<double>(0, smooth),
             {.bound = absolute(1e-3), .block_size = 64});
  write_seed(dir, "f64_one_lossless", generate<double>(1, smooth), {.bound = lossless()});
  write_seed(dir, "f64_odd_abs_bs32", generate<double>(257, smooth), {.bound = absolute(1e-6)});
  write_seed(dir, "f64_rel_bs64", generate<double>(5000, smooth),
             {.bound = relative(1e-5), .block_size = 64});
  write_seed(dir, "f64_multichunk_abs_bs128", generate<double>(10000, smooth),
             {.bound = absolute(1e-3), .block_size = 128});
  write_seed(dir, "f64_fill_abs_bs32", generate<double>(2000, masked_double),
             {.bound = absolute(1e-2), .fill_value = -9999.0});
  write_seed(dir, "f64_specials_abs_bs128", generate<double>(1000, special),
             {.bound = absolute(1e-3), .block_size = 128});
  write_seed(dir, "f64_lossless_bs32", generate<double>(600, rough), {.bound = lossless()});
  write_seed(dir, "f64_ramp_abs_bs64", generate<double>(2049, ramp),
             {.bound = absolute(1e-9), .block_size = 64});
  write_seed(dir, "f64_rough_rel_bs32", generate<double>(3001, rough),
             {.bound = relative(1e-2), .fill_value = 0.0});
  // The ratio codec (format 1.2): exceptions of every kind, several chunks, constant chunks.
  constexpr auto ratio = kompress::codec_mode::ratio;
  write_seed(dir, "f32_ratio_specials_abs", generate<float>(1500, special),
             {.bound = absolute(1e-2), .codec = ratio});
  write_seed(dir, "f32_ratio_fill_rel", generate<float>(5000, masked),
             {.bound = relative(1e-3), .fill_value = 1e20, .codec = ratio});
  write_seed(dir, "f32_ratio_constant", generate<float>(4200, [](std::size_t) { return 3.5; }),
             {.bound = relative(1e-3), .codec = ratio});
  write_seed(dir, "f64_ratio_multichunk_abs", generate<double>(9000, smooth),
             {.bound = absolute(1e-4), .codec = ratio});
  write_seed(dir, "f64_ratio_rough_rel", generate<double>(3001, rough),
             {.bound = relative(1e-2), .fill_value = 0.0, .codec = ratio});
  // Rice residuals (format 1.2): small positive codes spread like a ReLU's outputs.
  write_seed(dir, "f32_ratio_rice_rel", generate<float>(4500, [](std::size_t i) {
               const double u = std::fmod(std::abs(std::sin(double(i) * 12.9898) * 43758.5453), 1.0);
               return 4.0 * u * u;
             }),
             {.bound = relative(5e-2), .codec = ratio, .rounding = kompress::rounding_mode::stochastic});
  // rejected: more values claimed than the bytes can hold
  write_bomb_seed(dir, "f32_bomb_2e30", std::uint64_t(1) << 30, kompress::element_type::float32);
  write_bomb_seed(dir, "f64_bomb_2e33", std::uint64_t(1) << 33, kompress::element_type::float64);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <directory>\n", argc > 0 ? argv[0] : "make_fuzz_seeds");
    return 2;
  }
  try {
    const std::filesystem::path dir = argv[1];
    std::filesystem::create_directories(dir);
    for (const auto& entry : std::filesystem::directory_iterator(dir))
      if (entry.is_regular_file() && entry.path().extension() == ".kmpz")
        std::filesystem::remove(entry.path());
    Kokkos::ScopeGuard kokkos(
        Kokkos::InitializationSettings().set_num_threads(1).set_disable_warnings(true));
    std::printf("make_fuzz_seeds: writing the seed corpus into %s\n", dir.c_str());
    write_all(dir);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "make_fuzz_seeds: %s\n", e.what());
    return 1;
  }
  return 0;
}
