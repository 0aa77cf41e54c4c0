// The ratio codec (codec_mode::ratio, format 1.2) on inputs built to break it: special values,
// extreme magnitudes, constant arrays, lengths around its 4096-value chunks, random bit
// patterns, fill values, and Views of every rank and both layouts (its Lorenzo predictors
// follow the View's shape), checked exactly: |x - x'| <= e, NaN / Inf / -0.0 / fill bit-exact.
// Also: the bytes do not depend on the thread count, the stream says which codec wrote it,
// damage is detected, golden checksums pin the 1.2 bytes and the 1.1 ones (still written
// without flag bit 2, still read), and Rice sections are checked as a reader must.

#include "support/codec_checks.hpp"

#include <kompress/detail/checksum.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#include <unistd.h>
#endif

using kompress::test::require_round_trip;

namespace {

using host = Kokkos::DefaultHostExecutionSpace;
using kompress::test::default_memory;
constexpr auto ratio = kompress::codec_mode::ratio;

template <class T>
std::vector<T> smooth(std::size_t n, double scale = 1.0) {
  std::vector<T> v(n);
  for (std::size_t i = 0; i < n; ++i)
    v[i] = T(scale * std::sin(0.01 * double(i)) + 0.3 * scale * std::cos(0.37 * double(i)));
  return v;
}

/// A smooth field over a grid of `extents` (C order), so the Lorenzo predictors have work.
template <class T>
std::vector<T> field(const std::vector<std::size_t>& extents, double scale = 10.0) {
  std::size_t n = 1;
  for (auto e : extents) n *= e;
  std::vector<T> v(n);
  for (std::size_t i = 0; i < n; ++i) {
    double phase = 0.0, rest = double(i);
    for (std::size_t d = extents.size(); d-- > 0;) {
      const double coordinate = std::fmod(rest, double(extents[d]));
      rest = std::floor(rest / double(extents[d]));
      phase += 0.07 * double(d + 1) * coordinate;
    }
    v[i] = T(scale * std::sin(phase) + 0.01 * scale * std::cos(3.1 * double(i)));
  }
  return v;
}

template <class T, class Layout = Kokkos::LayoutRight>
void require_bounds(const std::vector<T>& values, std::optional<double> fill = std::nullopt,
                    const std::vector<std::size_t>& extents = {}) {
  for (const double bound : {1e-1, 1e-3, 1e-6}) {
    for (const auto mode : {kompress::bound_mode::absolute, kompress::bound_mode::relative}) {
      CAPTURE(bound);
      CAPTURE(int(mode));
      auto result = require_round_trip<T, Layout>(
          std::span<const T>(values), {.bound = {mode, bound}, .fill_value = fill, .codec = ratio},
          extents);
      CHECK(result.info.codec == ratio);
      CHECK(result.info.format_minor == 2);
      CHECK(result.stream.size() <=
            kompress::max_compressed_size<T>(values.size(), kompress::compress_options{.codec = ratio}));
    }
  }
}

template <class T>
bool bit_identical(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

}  // namespace

TEST_CASE_TEMPLATE("ratio codec: NaN, infinities and signed zeros come back bit-exact", T, float, double) {
  using limits = std::numeric_limits<T>;
  auto values = smooth<T>(10000);
  values[0] = limits::quiet_NaN();
  values[3] = limits::quiet_NaN();
  values[40] = -limits::quiet_NaN();
  values[41] = limits::signaling_NaN();
  values[100] = limits::infinity();
  values[101] = -limits::infinity();
  values[200] = T(-0.0);
  values[201] = T(0.0);
  values[4095] = T(-0.0);
  values[4096] = limits::infinity();
  for (std::size_t i = 500; i < 532; ++i) values[i] = limits::quiet_NaN();
  for (std::size_t i = 8192; i < 8192 + 1808; ++i) values[i] = T(-0.0);  // the last chunk: -0.0 only
  require_bounds(values);
  require_bounds(values, std::nullopt, {100, 100});
  auto result = require_round_trip<T>(std::span<const T>(values), {.bound = kompress::relative(1e-2), .codec = ratio});
  CHECK(std::isfinite(result.info.absolute_bound));
  CHECK(result.info.absolute_bound > 0.0);
}

TEST_CASE_TEMPLATE("ratio codec: zeros of both signs, as land masks have them, stay exact and small", T, float, double) {
  std::mt19937 rng(3);
  auto values = smooth<T>(20000, 5.0);
  for (std::size_t i = 0; i < 12000; ++i) values[i] = (rng() & 3) == 0 ? T(-0.0) : T(0.0);
  auto result = require_round_trip<T>(std::span<const T>(values), {.bound = kompress::absolute(1e-3), .codec = ratio});
  for (std::size_t i = 0; i < 12000; ++i)
    REQUIRE(kompress::test::bits(result.decoded[i]) == kompress::test::bits(values[i]));
  // A -0.0 costs about a bit of a position map, not its whole chunk.
  const auto zeros_only = std::vector<T>(values.begin(), values.begin() + 12000);
  CHECK(require_round_trip<T>(std::span<const T>(zeros_only), {.bound = kompress::absolute(1e-3), .codec = ratio})
            .ratio() > 8.0 * sizeof(T) / 1.5);
  require_bounds(values);
}

TEST_CASE_TEMPLATE("ratio codec: denormals, zeros and the largest finite values", T, float, double) {
  using limits = std::numeric_limits<T>;
  std::vector<T> values;
  for (int i = 0; i < 3000; ++i) {
    values.push_back(limits::denorm_min() * T(i));
    values.push_back(-limits::denorm_min() * T(i % 7));
    values.push_back(i % 3 ? T(0) : limits::min());
  }
  require_bounds(values);
  std::vector<T> extremes = {limits::max(), -limits::max(), T(0), T(1), limits::lowest(),
                             limits::max() / 2, limits::denorm_min()};
  for (int i = 0; i < 5000; ++i) extremes.push_back(T(i % 300) * limits::max() / T(512));
  require_bounds(extremes);
  require_round_trip<T>(std::span<const T>(extremes), {.bound = kompress::absolute(1e300), .codec = ratio});
}

TEST_CASE_TEMPLATE("ratio codec: values spanning 1e-30 to 1e30, and codes past 2^28", T, float, double) {
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> exponent(-30.0, 30.0);
  std::vector<T> values(9000);
  for (auto& v : values) v = T((rng() & 1 ? 1.0 : -1.0) * std::pow(10.0, exponent(rng)));
  require_bounds(values);
  // An offset field whose codes exceed 2^28 at tight bounds: those values become exceptions.
  auto offset = smooth<T>(10000, 1.0);
  for (auto& v : offset) v = T(double(v) + 1e4);
  for (const double bound : {1e-5, 1e-7})
    require_round_trip<T>(std::span<const T>(offset), {.bound = kompress::absolute(bound), .codec = ratio});
}

TEST_CASE_TEMPLATE("ratio codec: constant arrays", T, float, double) {
  for (const T c : {T(0), T(-0.0), T(1.5), T(-3e7), std::numeric_limits<T>::quiet_NaN()}) {
    for (const std::size_t n : {std::size_t(1), std::size_t(31), std::size_t(4096), std::size_t(100000)}) {
      const std::vector<T> values(n, c);
      require_bounds(values);
      auto result = require_round_trip<T>(std::span<const T>(values), {.bound = kompress::relative(1e-3), .codec = ratio});
      CHECK(kompress::test::bits(result.decoded[0]) == kompress::test::bits(c));
      if (n == 100000) CHECK(result.ratio() > 20.0);
      // Under an ABS bound a zero or finite constant costs a few bytes per 4096 values.
      if (n == 100000 && std::isfinite(c)) {
        auto abs = require_round_trip<T>(std::span<const T>(values), {.bound = kompress::absolute(1e-3), .codec = ratio});
        CHECK(abs.ratio() > 100.0);
      }
    }
  }
}

TEST_CASE_TEMPLATE("ratio codec: lengths 0, 1 and around group and chunk boundaries", T, float, double) {
  constexpr std::size_t chunk = 4096;
  for (const std::size_t n : {std::size_t(0), std::size_t(1), std::size_t(2), std::size_t(7), std::size_t(8),
                              std::size_t(9), std::size_t(31), std::size_t(32), std::size_t(33),
                              chunk - 1, chunk, chunk + 1, 2 * chunk + 7, 3 * chunk + 4000}) {
    CAPTURE(n);
    const auto values = smooth<T>(n, 100.0);
    for (const double bound : {1e-1, 1e-4}) {
      auto result = require_round_trip<T>(std::span<const T>(values),
                                          {.bound = kompress::relative(bound), .codec = ratio});
      CHECK(result.info.count == n);
      CHECK(result.stream.size() <= kompress::max_compressed_size<T>(n, kompress::compress_options{.codec = ratio}));
      CHECK(result.stream.size() <= kompress::max_compressed_size<T>(n));
    }
  }
}

TEST_CASE_TEMPLATE("ratio codec: random bit patterns over the whole range", T, float, double) {
  using bits = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>;
  std::mt19937_64 rng(42);
  std::vector<T> values(20000);
  for (auto& v : values) {
    const bits b = static_cast<bits>(rng());
    std::memcpy(&v, &b, sizeof(T));
  }
  require_bounds(values);
  auto result = require_round_trip<T>(std::span<const T>(values), {.bound = kompress::lossless(), .codec = ratio});
  CHECK(bit_identical(result.decoded, values));
  CHECK(result.stream.size() <= kompress::max_compressed_size<T>(values.size(), kompress::compress_options{.codec = ratio}));
}

TEST_CASE_TEMPLATE("ratio codec: a bound of 0 is lossless", T, float, double) {
  auto values = smooth<T>(10000, 1e3);
  values[17] = std::numeric_limits<T>::quiet_NaN();
  for (const auto bound : {kompress::lossless(), kompress::relative(0.0)}) {
    auto result = require_round_trip<T>(std::span<const T>(values), {.bound = bound, .codec = ratio});
    CHECK(bit_identical(result.decoded, values));
    CHECK(result.info.absolute_bound == 0.0);
  }
}

TEST_CASE_TEMPLATE("ratio codec: fill values come back bit-exact and stay out of the REL range", T, float, double) {
  const double fill = 9.96921e36;
  auto values = field<T>({40, 500});
  for (std::size_t i = 0; i < values.size(); ++i)
    if ((i / 50) % 3 == 0 || i % 97 == 0) values[i] = T(fill);
  require_bounds(values, fill);
  require_bounds(values, fill, {40, 500});
  auto result = require_round_trip<T>(std::span<const T>(values),
                                      {.bound = kompress::relative(1e-3), .fill_value = fill, .codec = ratio});
  CHECK(result.info.absolute_bound < 1.0);
  CHECK(result.info.has_fill_value);
  CHECK(result.ratio() > 3.0);
  // The fill value named but absent, and the fill value as the whole array.
  const auto plain = field<T>({20, 300});
  require_bounds(plain, fill);
  const std::vector<T> all_fill(5000, T(fill));
  require_bounds(all_fill, fill);
}

TEST_CASE_TEMPLATE("ratio codec: Views of every rank, both layouts, extents of 1, lengths off the tiles", T,
                   float, double) {
  const std::vector<std::vector<std::size_t>> shapes = {
      {5000},          {1, 5000},       {5000, 1},        {63, 65},        {7, 4099},
      {4099, 3},       {2, 3, 4},       {9, 31, 17},      {3, 1, 45, 47},  {1, 1, 1, 1},
      {2, 5, 11, 13},  {4, 14, 48, 48}, {12, 1, 33, 1},   {1, 4096},       {6, 64, 64},
      {2, 2, 2, 2000}, {17, 19, 23}};
  for (const auto& shape : shapes) {
    CAPTURE(shape.size());
    CAPTURE(shape.back());
    CAPTURE(shape.front());
    auto values = field<T>(shape);
    if (values.size() > 10) {
      values[values.size() / 2] = std::numeric_limits<T>::quiet_NaN();
      values[values.size() / 3] = T(-0.0);
    }
    require_bounds<T, Kokkos::LayoutRight>(values, std::nullopt, shape);
    require_bounds<T, Kokkos::LayoutLeft>(values, std::nullopt, shape);
  }
}

TEST_CASE_TEMPLATE("ratio codec: the Lorenzo predictors pay off on smooth 2-D and 3-D fields", T, float, double) {
  const std::vector<std::size_t> shape2 = {256, 200}, shape3 = {40, 24, 24};
  for (const auto& shape : {shape2, shape3}) {
    const auto values = field<T>(shape);
    const kompress::compress_options options{.bound = kompress::relative(1e-4), .codec = ratio};
    const auto flat = require_round_trip<T>(std::span<const T>(values), options);
    const auto shaped = require_round_trip<T>(std::span<const T>(values), options, shape);
    MESSAGE("rank " << shape.size() << ": 1-D ratio " << flat.ratio() << ", shaped " << shaped.ratio());
    CHECK(shaped.ratio() > flat.ratio());
  }
}

// On the host on purpose: the host backend splits the work by thread count.
TEST_CASE("ratio codec: the stream does not depend on the thread count") {
  const std::vector<std::size_t> shape = {30, 100, 100};
  const auto values = field<float>(shape, 50.0);
  Kokkos::View<const float***, Kokkos::HostSpace, Kokkos::MemoryUnmanaged> in(values.data(), 30, 100, 100);
  for (const double bound : {1e-2, 1e-4}) {
    const auto options = kompress::compress_options{.bound = kompress::relative(bound), .codec = ratio};
    host all;
    auto reference = kompress::compress(all, in, options);
    const int threads = all.concurrency();
    if (threads > 1) {
      auto parts = Kokkos::Experimental::partition_space(all, 1, threads - 1);
      for (auto& part : parts) {
        auto stream = kompress::compress(part, in, options);
        REQUIRE(stream.size() == reference.size());
        CHECK(std::memcmp(stream.data(), reference.data(), stream.size()) == 0);
      }
    }
  }
}

// On the host on purpose: both kernels forced there (kernels/team_codec.hpp).
TEST_CASE_TEMPLATE("ratio codec: a team per chunk and each host compilation write the portable bytes and values",
                   T, float, double) {
  namespace detail = kompress::detail;
  const std::vector<std::size_t> shape = {7, 50, 60};  // 21,000 values: 6 chunks, the last short
  auto values = field<T>(shape, 50.0);
  values[100] = std::numeric_limits<T>::quiet_NaN();
  values[9000] = T(-0.0);
  const auto compress_with_tuning = [&](const detail::kernel_tuning& tuning) {
    detail::stream_header header;
    header.type = detail::element_type_of<T>();
    header.mode = kompress::bound_mode::relative;
    header.count = values.size();
    header.user_bound = 1e-3;
    header.block_size = kompress::detail::ratio_block_size;
    header.blocks_per_chunk = kompress::detail::ratio_blocks_per_chunk;
    header.flags = detail::flag_ratio_codec | detail::flag_rice_residuals;
    Kokkos::View<const T***, Kokkos::HostSpace, Kokkos::MemoryUnmanaged> in(values.data(), 7, 50, 60);
    std::vector<std::byte> out(kompress::max_compressed_size<T>(
        values.size(), kompress::compress_options{.codec = ratio}));
    detail::enqueue_compress_kernels<T, detail::ratio_block_size>(
        host{}, values.data(), out.data(), header, nullptr, tuning, detail::ratio_shape_of(in));
    host{}.fence();
    out.resize(detail::load<std::uint64_t>(out.data() + detail::stream_length_offset));
    return out;
  };
  const auto compress_with = [&](int team_size) { return compress_with_tuning({.team_size = team_size}); };
  const auto decompress_with = [&](const std::vector<std::byte>& stream, const detail::kernel_tuning& tuning) {
    const Kokkos::View<const std::byte*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged> in(
        stream.data(), stream.size());
    const detail::stream_header header = detail::read_header(in, "test");
    detail::value_codec<T> codec;
    codec.step = header.quant_step;
    std::vector<T> out(header.count);
    detail::decompress_ratio_chunks<T>(host{}, stream.data(), header, codec, out.data(), "test", tuning);
    return out;
  };
  const auto reference = compress_with(0);
  const auto reference_values = decompress_with(reference, {.team_size = 0});
  for (const int team_size : {1, 2, 64, -1}) {
    CAPTURE(team_size);
    const auto stream = compress_with(team_size);
    REQUIRE(stream.size() == reference.size());
    CHECK(std::memcmp(stream.data(), reference.data(), reference.size()) == 0);
    const auto decoded = decompress_with(reference, {.team_size = team_size});
    CHECK(std::memcmp(decoded.data(), reference_values.data(), values.size() * sizeof(T)) == 0);
  }
  // The host's AVX2 and AVX-512 compilations, where the CPU has them, write the portable
  // encoder's bytes and give the portable decoder's values.
  for (const auto kind : {detail::encoder_kind::avx2_fma, detail::encoder_kind::avx512}) {
    if (!detail::host_runs(kind)) continue;
    CAPTURE(int(kind));
    const auto stream = compress_with_tuning({.encoder = kind, .team_size = 0});
    REQUIRE(stream.size() == reference.size());
    CHECK(std::memcmp(stream.data(), reference.data(), reference.size()) == 0);
    const auto decoded = decompress_with(reference, {.decoder = kind, .team_size = 0});
    CHECK(std::memcmp(decoded.data(), reference_values.data(), values.size() * sizeof(T)) == 0);
  }
}

TEST_CASE("ratio codec: fast-mode streams are unchanged 1.0 streams; the mode is checked") {
  const auto values = smooth<float>(5000, 3.0);
  const auto fast = kompress::test::round_trip<float>(values, {.bound = kompress::relative(1e-3)});
  CHECK(fast.info.format_minor == 0);
  CHECK(fast.info.codec == kompress::codec_mode::fast);
  CHECK(std::to_integer<int>(fast.stream[5]) == 0);
  const auto in = kompress::test::to_default_space(values);
  Kokkos::View<std::byte*, default_memory> out("out", kompress::max_compressed_size(in));
  CHECK_THROWS_WITH_AS(
      kompress::compress(in, out, kompress::compress_options{.bound = kompress::absolute(1e-3),
                                                             .codec = kompress::codec_mode(7)}),
      doctest::Contains("codec mode"), kompress::invalid_argument);
  // A 1.0 stream claiming the ratio flag is rejected (1.0 knows flag bit 0 only).
  auto forged = kompress::test::round_trip<float>(values, {.bound = kompress::relative(1e-3), .codec = ratio}).stream;
  forged[5] = std::byte(0);
  CHECK_THROWS_WITH_AS(kompress::inspect(kompress::test::to_default_space(forged)), doctest::Contains("flag"),
                       kompress::format_error);
}

TEST_CASE("ratio codec: every single-byte corruption and truncation is detected") {
  auto values = smooth<float>(5000, 20.0);
  values[10] = -0.0f;
  values[11] = std::numeric_limits<float>::infinity();
  const auto stream =
      kompress::test::round_trip<float>(values, {.bound = kompress::absolute(1e-2), .codec = ratio}).stream;
  const auto decode = [&](const std::vector<std::byte>& s) {
    kompress::test::decompress_on_default<float>(s, values.size());
  };
  for (std::size_t i = 0; i < stream.size(); ++i) {
    auto damaged = stream;
    damaged[i] ^= std::byte(0x41);
    CAPTURE(i);
    CHECK_THROWS_AS(decode(damaged), kompress::error);
  }
  for (std::size_t length = 0; length < stream.size(); length += 7) {
    const std::vector<std::byte> truncated(stream.begin(), stream.begin() + std::ptrdiff_t(length));
    CAPTURE(length);
    CHECK_THROWS_AS(decode(truncated), kompress::format_error);
  }
}

/// A stream as format 1.1 writes it: the ratio codec's kernels on the host under a header
/// without flag bit 2 (bit planes only).
template <class View>
std::vector<std::byte> compress_as_1_1(const View& in, const kompress::compress_options& options) {
  namespace detail = kompress::detail;
  using T = typename View::non_const_value_type;
  detail::stream_header header = detail::header_fields_of<T>(options, in.size());
  header.flags &= ~detail::flag_rice_residuals;
  std::vector<std::byte> out(kompress::max_compressed_size<T>(in.size(), options));
  detail::enqueue_compress_kernels<T, detail::ratio_block_size>(host{}, in.data(), out.data(), header, nullptr, {},
                                                                detail::ratio_shape_of(in));
  host{}.fence();
  out.resize(detail::load<std::uint64_t>(out.data() + detail::stream_length_offset));
  return out;
}

// Golden ratio-codec streams: format 1.2 as the library writes it, and 1.1 (bit planes only)
// still written byte for byte as before Rice residuals and still read. If one of these
// changes, the bytes the ratio codec writes changed: bump the format version
// (docs/format.md) on purpose, never just the number.
TEST_CASE("ratio codec: golden streams") {
  std::vector<float> f(9000);
  std::vector<double> d(9000);
  for (std::size_t i = 0; i < f.size(); ++i) {
    f[i] = float(std::sin(0.01 * double(i)) * 100.0 + double(i % 7));
    d[i] = std::cos(0.003 * double(i)) * 1e5 + double(i % 13) * 0.25;
  }
  f[100] = std::numeric_limits<float>::quiet_NaN();
  d[200] = -0.0;
  const kompress::compress_options float_options{.bound = kompress::relative(1e-3), .codec = ratio};
  const kompress::compress_options double_options{.bound = kompress::absolute(1e-2), .codec = ratio};
  const kompress::compress_options fill_options{.bound = kompress::absolute(0.5), .fill_value = 6.0, .codec = ratio};
  const kompress::compress_options grid_options{.bound = kompress::relative(1e-4), .codec = ratio};
  const auto fs = kompress::test::round_trip<float>(f, float_options);
  const auto ds = kompress::test::round_trip<double>(d, double_options);
  const auto fills = kompress::test::round_trip<float>(f, fill_options);
  const std::vector<std::size_t> extents = {10, 30, 30};
  const auto grid = kompress::test::with_view<Kokkos::LayoutRight>(
      std::span<const float>(f), extents,
      [&](const auto& view) { return kompress::test::round_trip_view(view, grid_options); });
  const auto checksum = [](const std::vector<std::byte>& s) { return kompress::detail::checksum_of(s.data(), s.size()); };
  MESSAGE("golden ratio 1.2: float " << fs.stream.size() << " bytes, checksum " << checksum(fs.stream) << "; double "
                                     << ds.stream.size() << " bytes, checksum " << checksum(ds.stream) << "; fill "
                                     << fills.stream.size() << " bytes, checksum " << checksum(fills.stream)
                                     << "; grid " << grid.stream.size() << " bytes, checksum "
                                     << checksum(grid.stream));
  CHECK(fs.info.format_minor == 2);
  CHECK(fs.stream.size() == 5462u);
  CHECK(checksum(fs.stream) == 8744856378445023357ull);
  CHECK(ds.stream.size() == 16404u);
  CHECK(checksum(ds.stream) == 5729312308758374071ull);
  CHECK(fills.stream.size() == 4191u);
  CHECK(checksum(fills.stream) == 17949968431130323317ull);
  CHECK(grid.stream.size() == 8805u);
  CHECK(checksum(grid.stream) == 12641826356898909863ull);

  // The same inputs as 1.1: the checksums 1.1 pinned, and the values the 1.2 streams decode to
  // (the codes are the same; only how the residuals are stored differs).
  const auto host_view = [](const auto& values) {
    using T = typename std::decay_t<decltype(values)>::value_type;
    return Kokkos::View<const T*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>(values.data(), values.size());
  };
  const auto fs11 = compress_as_1_1(host_view(f), float_options);
  const auto ds11 = compress_as_1_1(host_view(d), double_options);
  const auto fills11 = compress_as_1_1(host_view(f), fill_options);
  const auto grid11 = compress_as_1_1(
      Kokkos::View<const float***, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>(f.data(), 10, 30, 30), grid_options);
  CHECK(int(fs11[5]) == 1);
  CHECK(fs11.size() == 5993u);
  CHECK(checksum(fs11) == 2663135705541469727ull);
  CHECK(ds11.size() == 16404u);
  CHECK(checksum(ds11) == 5959180741698173752ull);
  CHECK(fills11.size() == 4851u);
  CHECK(checksum(fills11) == 14184677437743771953ull);
  CHECK(grid11.size() == 8805u);
  CHECK(checksum(grid11) == 11076848817714879973ull);
  const auto same_values = [](const auto& stream, const auto& expected) {
    using T = typename std::decay_t<decltype(expected)>::value_type;
    const auto decoded = kompress::test::decompress_on_default<T>(stream, expected.size());
    return std::memcmp(decoded.data(), expected.data(), expected.size() * sizeof(T)) == 0;
  };
  CHECK(same_values(fs11, fs.decoded));
  CHECK(same_values(ds11, ds.decoded));
  CHECK(same_values(fills11, fills.decoded));
  CHECK(same_values(grid11, grid.decoded));
}

namespace {

/// One ratio chunk of `values` (a rank-1 View's first chunk), as a 1.2 stream's encoder writes
/// it (`rice_allowed`) or a 1.1 stream's.
std::vector<std::byte> encode_chunk(const std::vector<float>& values, const kompress::detail::value_codec<float>& codec,
                                    kompress::detail::ratio_scratch& scratch, bool rice_allowed) {
  namespace detail = kompress::detail;
  std::vector<std::byte> chunk(1 + values.size() * sizeof(float));
  // Called through a pointer: inlined here, GCC 16 sees a false maybe-uninitialized in it.
  std::uint64_t (*volatile encode)(const float*, int, std::uint64_t, const detail::ratio_shape&,
                                   const detail::value_codec<float>&, detail::ratio_scratch&, std::byte*, bool) =
      &detail::encode_ratio_chunk<float>;
  chunk.resize(encode(values.data(), int(values.size()), 0, detail::ratio_shape{}, codec, scratch, chunk.data(),
                      rice_allowed));
  return chunk;
}

}  // namespace

TEST_CASE("ratio chunk: a map marking a value past the chunk's end is rejected, not written") {
  // The maps cover 64-value blocks. A chunk encoded for 64 values with -0.0 at value 20, read
  // back as a chunk of fewer values, marks a value past its end: the decoder must say no
  // instead of writing it (the fuzzer found the write past the output's end).
  namespace detail = kompress::detail;
  std::vector<float> values(64);
  for (int i = 0; i < 64; ++i) values[std::size_t(i)] = float(std::sin(0.1 * i));
  values[20] = -0.0f;
  const auto codec = detail::make_value_codec<float>(1e-3, 1.0);
  auto scratch = std::make_unique<detail::ratio_scratch>();
  const auto chunk = encode_chunk(values, codec, *scratch, true);
  const std::uint64_t bytes = chunk.size();
  REQUIRE((std::uint8_t(chunk[0]) & detail::ratio_flag_negative_zeros) != 0);
  std::vector<float> out(64);
  CHECK(detail::decode_ratio_chunk(chunk.data(), bytes, 64, 0, codec, *scratch, out.data(), true));
  CHECK(std::signbit(out[20]));
  for (const int n : {1, 10, 20}) {  // value 20 lies past the end: in the same word or the next
    CAPTURE(n);
    CHECK_FALSE(detail::decode_ratio_chunk(chunk.data(), bytes, n, 0, codec, *scratch, out.data(), true));
  }
}

TEST_CASE_TEMPLATE("ratio chunk: delta-predicted values are the reconstructions of the encoder's codes, at every length",
                   T, float, double) {
  // The host decoder turns delta residuals into values four at a time (codec/ratio_x86.hpp);
  // each value must still be exactly value_codec<T>::reconstruct of the code the encoder
  // chose, whatever the length's remainder by 4, from Rice sections and from bit planes.
  namespace detail = kompress::detail;
  const auto codec = detail::make_value_codec<T>(1e-3, 10.0);
  auto scratch = std::make_unique<detail::ratio_scratch>();
  std::mt19937 rng(17);
  std::normal_distribution<double> step(0.0, 0.05);
  for (const int n : {1, 2, 3, 4, 5, 7, 63, 64, 65, 1001, 4093, 4094, 4095, 4096}) {
    std::vector<T> values(static_cast<std::size_t>(n));
    double walk = 1.0;  // a random walk: the previous value predicts best
    for (auto& v : values) v = T(walk += step(rng));
    for (const bool rice : {true, false}) {
      CAPTURE(n);
      CAPTURE(rice);
      std::vector<std::byte> chunk(1 + values.size() * sizeof(T));
      chunk.resize(detail::encode_ratio_chunk<T>(values.data(), n, 0, detail::ratio_shape{}, codec, *scratch,
                                                 chunk.data(), rice));
      const std::uint8_t kind = std::uint8_t(chunk[0]);
      // A few values may go raw or unpredicted; from a block on, the walk is delta-coded.
      if (kind == detail::ratio_chunk_raw || kind == detail::ratio_chunk_constant ||
          (kind & 3) != detail::predict_delta) {
        CHECK(n < 64);
        continue;
      }
      REQUIRE((kind & detail::ratio_flag_raw_values) == 0);
      const std::vector<std::int32_t> codes(scratch->codes, scratch->codes + n);
      std::vector<T> out(static_cast<std::size_t>(n));
      REQUIRE(detail::decode_ratio_chunk<T>(chunk.data(), chunk.size(), n, 0, codec, *scratch, out.data(), true));
      int mismatches = 0;
      for (int i = 0; i < n; ++i) {
        const T expected = detail::value_codec<T>::reconstruct(double(codes[std::size_t(i)]), codec.step);
        mismatches += std::memcmp(&expected, &out[std::size_t(i)], sizeof(T)) != 0;
        CHECK(std::abs(double(out[std::size_t(i)]) - double(values[std::size_t(i)])) <= 1e-3);
      }
      CHECK(mismatches == 0);
    }
  }
}

// --- the Lorenzo predictors at every boundary ---------------------------------------------------

namespace {

/// The Lorenzo prediction of code i of a chunk by its definition (docs/format.md, "Ratio
/// chunks"): x and y are value i's place in its row and its row's in its plane; a neighbour
/// before the chunk's first value, across a row's start or (3-D) across a plane's first row
/// counts as 0.
std::uint32_t reference_prediction(const std::vector<std::int32_t>& q, int i, std::uint32_t x, std::uint32_t y,
                                   const kompress::detail::ratio_geometry& g) {
  const auto at = [&](int j) { return std::uint32_t(q[std::size_t(j)]); };
  const int r = int(g.row), p = int(g.row * g.plane_rows);
  const bool has_x = x > 0, has_y = g.predictor == kompress::detail::predict_lorenzo2 || y > 0;
  const bool three = g.predictor == kompress::detail::predict_lorenzo3;
  std::uint32_t s = 0;
  if (has_x && i >= 1) s += at(i - 1);
  if (has_y && i >= r) s += at(i - r);
  if (has_x && has_y && i >= r + 1) s -= at(i - r - 1);
  if (three && i >= p) s += at(i - p);
  if (three && has_x && i >= p + 1) s -= at(i - p - 1);
  if (three && has_y && i >= p + r) s -= at(i - p - r);
  if (three && has_x && has_y && i >= p + r + 1) s += at(i - p - r - 1);
  return s;
}

}  // namespace

TEST_CASE("ratio chunk: Lorenzo residuals and their inverse follow the predictors' definition at every boundary") {
  // Every run the walk cuts (a row's first value, the offsets of each term, a plane's first
  // row, chunks starting anywhere in a row and a plane) against the definition term by term.
  namespace detail = kompress::detail;
  std::mt19937 rng(29);
  std::uniform_int_distribution<std::int32_t> code(-(1 << 27), (1 << 27) - 1);
  std::vector<detail::ratio_geometry> geometries;
  for (const std::uint32_t row : {2u, 3u, 7u, 32u, 1000u, 4094u})
    geometries.push_back({detail::predict_lorenzo2, row, 0});
  for (const auto& [row, rows] : {std::pair{2u, 2u}, std::pair{3u, 5u}, std::pair{8u, 8u}, std::pair{17u, 3u},
                                  std::pair{32u, 32u}, std::pair{60u, 60u}, std::pair{2u, 2000u}})
    geometries.push_back({detail::predict_lorenzo3, row, rows});
  std::vector<std::int32_t> q(4096), decoded(4096);
  std::vector<std::uint32_t> residuals(4096);
  for (const auto& g : geometries) {
    const std::uint64_t plane = std::uint64_t(g.row) * std::max(g.plane_rows, 1u);
    for (const std::uint64_t first :
         {std::uint64_t(0), std::uint64_t(1), std::uint64_t(g.row - 1), std::uint64_t(g.row + 3), plane + 5,
          std::uint64_t(12345) * 4096}) {
      for (const int n : {1, 2, 63, 1000, 4095, 4096}) {
        CAPTURE(g.predictor);
        CAPTURE(g.row);
        CAPTURE(g.plane_rows);
        CAPTURE(first);
        CAPTURE(n);
        // Smooth codes with random ones among them, so every term matters.
        for (int i = 0; i < n; ++i) q[std::size_t(i)] = (i % 5 == 0) ? code(rng) : 3 * i + int(first % 7);
        detail::ratio_residuals(q.data(), n, first, g, residuals.data());
        int wrong = 0;
        for (int i = 0; i < n; ++i) {
          const std::uint64_t at = first + std::uint64_t(i);
          const auto x = std::uint32_t(at % g.row);
          const auto y = g.plane_rows ? std::uint32_t((at / g.row) % g.plane_rows) : 0u;
          const std::uint32_t d = std::uint32_t(q[std::size_t(i)]) - reference_prediction(q, i, x, y, g);
          wrong += residuals[std::size_t(i)] != detail::zigzag32(d);
        }
        CHECK(wrong == 0);
        std::fill(decoded.begin(), decoded.end(), -1);
        detail::lorenzo_codes(residuals.data(), n, first, g, decoded.data());
        CHECK(std::equal(q.begin(), q.begin() + n, decoded.begin()));
      }
    }
  }
}

// --- streams that claim more values than their bytes can hold -----------------------------------

namespace {

/// The largest allocation any Kokkos memory space makes while one of these lives, through
/// Kokkos's tools interface (a callback: no tool library needed). The callback in place
/// before, if any, is put back.
class largest_allocation {
 public:
  largest_allocation() : previous_(Kokkos::Tools::Experimental::get_callbacks().allocate_data) {
    largest() = 0;
    Kokkos::Tools::Experimental::set_allocate_data_callback(&record);
  }
  ~largest_allocation() { Kokkos::Tools::Experimental::set_allocate_data_callback(previous_); }
  largest_allocation(const largest_allocation&) = delete;
  largest_allocation& operator=(const largest_allocation&) = delete;
  std::uint64_t bytes() const { return largest(); }

 private:
  static std::uint64_t& largest() {
    static std::uint64_t bytes = 0;
    return bytes;
  }
  static void record(Kokkos::Profiling::SpaceHandle, const char*, const void*, std::uint64_t bytes) {
    largest() = std::max(largest(), bytes);
  }
  Kokkos::Tools::allocateDataFunction previous_;
};

/// A format-1.1 stream with valid checksums whose header claims `count` values (a multiple of
/// 4096) while every chunk is `chunk_bytes` bytes: a coded chunk (kind 0, no predictor, no
/// exception maps) whose bit planes are all zero. From 5 bytes on, that is a well-formed
/// chunk of 4096 zeros; shorter, it cannot be decoded.
std::vector<std::byte> zero_chunk_stream(std::uint64_t count, kompress::element_type type,
                                         std::uint64_t chunk_bytes) {
  namespace detail = kompress::detail;
  REQUIRE(count % detail::ratio_chunk_values == 0);
  detail::stream_header h = kompress::test::crafted_header(count, type);
  h.block_size = detail::ratio_block_size;
  h.blocks_per_chunk = detail::ratio_blocks_per_chunk;
  h.flags = detail::flag_ratio_codec;
  return kompress::test::uniform_chunk_stream(h, chunk_bytes);  // zeros: every kind byte and plane
}

}  // namespace

// 2^32 doubles are 32 GiB; 2-byte chunks made that a 19 MB stream, and the allocating
// decompress allocated the 32 GiB (or failed to, with Kokkos's exception) before the decoder
// found that no chunk can be decoded.
TEST_CASE("ratio codec: chunks shorter than the shortest well-formed chunk are rejected before any allocation") {
  const std::uint64_t count = std::uint64_t(1) << 32;
  for (const std::uint64_t chunk_bytes : {std::uint64_t(2), std::uint64_t(4)}) {
    CAPTURE(chunk_bytes);
    const auto stream = zero_chunk_stream(count, kompress::element_type::float64, chunk_bytes);
    CHECK(stream.size() < 21'000'000);
    const auto view = kompress::test::to_default_space(stream);
    CHECK_THROWS_WITH_AS(kompress::inspect(view), doctest::Contains("too short"), kompress::format_error);
    const largest_allocation watch;
    CHECK_THROWS_WITH_AS(kompress::decompress<double>(kompress::test::default_exec{}, view),
                         doctest::Contains("too short"), kompress::format_error);
    CHECK(watch.bytes() < stream.size());  // at most a host copy of the tables
  }
}

TEST_CASE_TEMPLATE("ratio chunk: no chunk shorter than ratio_min_chunk_bytes decodes, and one that long does", T, float,
                   double) {
  // The readers' lower bound must be exact: any longer and valid streams are refused, any
  // shorter and a header may claim values its bytes cannot hold. Chunks of every kind filled
  // with zeros are the shortest of their kind (a coded chunk's all-zero planes, a constant or
  // raw chunk of zeros), at every length up to the bound.
  namespace detail = kompress::detail;
  const auto codec = detail::make_value_codec<T>(1e-3, 1.0);
  auto scratch = std::make_unique<detail::ratio_scratch>();
  std::vector<T> out(detail::ratio_chunk_values);
  CHECK(detail::ratio_min_chunk_bytes(detail::ratio_chunk_values, sizeof(T)) == 5);
  const std::uint8_t kinds[] = {detail::predict_none, detail::predict_delta, detail::ratio_chunk_constant,
                                detail::ratio_chunk_raw, detail::ratio_flag_rice};
  for (int n = 1; n <= detail::ratio_chunk_values; ++n) {
    CAPTURE(n);
    const std::uint64_t shortest = detail::ratio_min_chunk_bytes(std::uint64_t(n), sizeof(T));
    CHECK(shortest >= 3);
    CHECK(shortest <= 9);
    bool decoded_at_shortest = false;
    for (const std::uint8_t kind : kinds) {
      for (std::uint64_t bytes = 1; bytes <= shortest; ++bytes) {
        std::vector<std::byte> chunk(bytes);
        chunk[0] = std::byte(kind);
        // Rice residuals, all zero: kind, shift 0, then every block's parameter 15.
        if (kind == detail::ratio_flag_rice)
          for (std::uint64_t i = 2; i < bytes; ++i) chunk[i] = std::byte(0xFF);
        const bool decoded =
            detail::decode_ratio_chunk<T>(chunk.data(), bytes, n, 0, codec, *scratch, out.data(), true);
        CAPTURE(int(kind));
        CAPTURE(bytes);
        if (bytes < shortest) CHECK_FALSE(decoded);
        else decoded_at_shortest = decoded_at_shortest || decoded;
      }
    }
    CHECK(decoded_at_shortest);
  }
}

TEST_CASE_TEMPLATE("ratio codec: the shortest chunks the encoder writes pass the header's checks", T, float, double) {
  // Values of distinct bit patterns that all quantize to 0: a whole chunk codes to 5 bytes
  // (kind byte, 4-byte top level of its planes' bitmaps), the 200 values after it to 3.
  std::vector<T> values(std::size_t(kompress::detail::ratio_chunk_values) + 200);
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = T(1e-7 * double(i % 5));
  const auto result = require_round_trip<T>(std::span<const T>(values), {.bound = kompress::absolute(1e-3), .codec = ratio});
  CHECK(result.stream.size() == 88 + 2 * 16 + 5 + 3);
}

TEST_CASE("ratio codec: decompress_options::max_output_bytes refuses a larger output before allocating it") {
  const kompress::test::default_exec exec;
  // Well-formed: 2^32 zeros, 32 GiB of doubles, in 22 MB (1560x).
  const std::uint64_t count = std::uint64_t(1) << 32;
  const auto stream = zero_chunk_stream(count, kompress::element_type::float64, 5);
  const auto view = kompress::test::to_default_space(stream);
  const auto info = kompress::inspect(view);
  CHECK(info.count == count);
  CHECK(info.ratio() > 1500.0);
  {
    const largest_allocation watch;
    const kompress::decompress_options at_most_1_gib{.max_output_bytes = std::size_t(1) << 30};
    CHECK_THROWS_WITH_AS(kompress::decompress<double>(exec, view, at_most_1_gib),
                         doctest::Contains("34359738368 bytes"), kompress::resource_error);
    try {
      kompress::decompress<double>(exec, view, at_most_1_gib);
    } catch (const kompress::resource_error& e) {
      CHECK(e.requested_bytes() == count * sizeof(double));
    }
    // The wrong element type is refused before allocating too.
    CHECK_THROWS_WITH_AS(kompress::decompress<float>(exec, view), doctest::Contains("double values"),
                         kompress::invalid_argument);
    CHECK(watch.bytes() < stream.size());  // at most a host copy of the tables
  }

  // At the limit it decodes; one byte below, it does not.
  const std::uint64_t small_count = 3 * std::uint64_t(kompress::detail::ratio_chunk_values);
  const auto small = kompress::test::to_default_space(
      zero_chunk_stream(small_count, kompress::element_type::float64, 5));
  const std::size_t exact = small_count * sizeof(double);
  const auto zeros = kompress::test::to_host(kompress::decompress<double>(exec, small, {.max_output_bytes = exact}));
  CHECK(zeros == std::vector<double>(small_count, 0.0));
  CHECK_THROWS_AS(kompress::decompress<double>(exec, small, {.max_output_bytes = exact - 1}),
                  kompress::resource_error);

  // A stream the encoder wrote, under a limit it fits.
  const auto values = smooth<float>(10000, 5.0);
  const auto written = kompress::test::round_trip<float>(values, {.bound = kompress::absolute(1e-3), .codec = ratio});
  const auto decoded = kompress::test::to_host(kompress::decompress<float>(
      exec, kompress::test::to_default_space(written.stream), {.max_output_bytes = values.size() * sizeof(float)}));
  CHECK(bit_identical(decoded, written.decoded));
}

namespace {
#if defined(__SANITIZE_ADDRESS__)
constexpr bool address_sanitizer = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool address_sanitizer = true;
#else
constexpr bool address_sanitizer = false;
#endif
#else
constexpr bool address_sanitizer = false;
#endif
}  // namespace

// ASan's allocator aborts on an allocation this large instead of failing it (unless run with
// allocator_may_return_null=1), so this runs in the builds without it.
TEST_CASE("ratio codec: an allocation that fails is a resource_error naming its size" *
          doctest::skip(address_sanitizer)) {
  // An input View claiming 2^55 doubles (over a few real ones, never read): its worst-case
  // stream, 2^58 bytes and more, is beyond any address space.
  const std::size_t count = std::size_t(1) << 55;
  const auto real = kompress::test::to_default_space(std::vector<double>(16, 1.0));
  const Kokkos::View<const double*, default_memory, Kokkos::MemoryUnmanaged> claimed(real.data(), count);
  const std::size_t worst = kompress::max_compressed_size(claimed, {.codec = ratio});
  CHECK(worst > (std::size_t(1) << 58));
  try {
    kompress::compress(kompress::test::default_exec{}, claimed, kompress::compress_options{.codec = ratio});
    FAIL("the allocation of " << worst << " bytes succeeded");
  } catch (const kompress::resource_error& e) {
    CHECK(e.requested_bytes() == worst);
    CHECK(std::string(e.what()).find(std::to_string(worst) + " bytes") != std::string::npos);
  }
}

// --- Rice residuals (format 1.2) -----------------------------------------------------------------

namespace {

/// Positive values spread as a ReLU's outputs are (half-normal), as the stash packs them.
std::vector<float> relu_positives(std::size_t count, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> values(count);
  for (auto& v : values) v = std::abs(normal(rng)) + 1e-3f;
  return values;
}

}  // namespace

TEST_CASE("Rice residuals: each block's parameter is the smallest that minimises its bits") {
  namespace detail = kompress::detail;
  std::mt19937 rng(7);
  std::vector<std::uint32_t> residuals(detail::ratio_chunk_values);
  std::vector<std::uint8_t> parameters(detail::ratio_chunk_values / detail::rice_block);
  for (int trial = 0; trial < 40; ++trial) {
    const int shift = trial % 4;
    const int padded = trial % 5 == 0 ? 128 : detail::ratio_chunk_values;
    const int blocks = padded / detail::rice_block;
    // Each block's spread drawn anew, so the search from the previous block's parameter goes
    // both ways, far; means up to e^20 give blocks whose sums need more than 32 bits.
    for (int b = 0; b < blocks; ++b) {
      const double mean = std::exp(std::uniform_real_distribution<double>(-2.0, 20.0)(rng));
      std::geometric_distribution<std::uint32_t> geometric(1.0 / (1.0 + mean));
      const bool zero = rng() % 10 == 0;
      for (int i = 0; i < detail::rice_block; ++i) {
        const std::uint32_t z = zero ? 0u : std::min<std::uint32_t>(geometric(rng), (1u << (31 - shift)) - 1);
        residuals[std::size_t(detail::rice_block * b + i)] = z << shift;
      }
    }
    const std::uint64_t size = detail::rice_size(residuals.data(), padded, shift, parameters.data());
    std::uint64_t remainder_bytes = 0, quotient_bits = 0;
    for (int b = 0; b < blocks; ++b) {
      const std::uint32_t* z = residuals.data() + detail::rice_block * b;
      const auto bits = [&](int k) {
        std::uint64_t total = 0;
        for (int i = 0; i < detail::rice_block; ++i) total += std::uint64_t(k) + 1 + ((z[i] >> shift) >> k);
        return total;
      };
      std::uint32_t block_any = 0;
      for (int i = 0; i < detail::rice_block; ++i) block_any |= z[i];
      CAPTURE(trial);
      CAPTURE(b);
      if (block_any == 0) {
        CHECK(parameters[std::size_t(b)] == detail::rice_zero_block);
        continue;
      }
      int best = 0;
      for (int k = 1; k <= detail::rice_max_parameter; ++k)
        if (bits(k) < bits(best)) best = k;
      CHECK(int(parameters[std::size_t(b)]) == best);
      remainder_bytes += 4 * std::uint64_t(best);
      quotient_bits += bits(best) - std::uint64_t(best) * detail::rice_block;
    }
    CHECK(size == 1 + std::uint64_t(blocks / 2) + remainder_bytes + (quotient_bits + 7) / 8);
  }
}

TEST_CASE("zero elimination: buffers of every length and density come back, and a section cut short is refused") {
  // The reader expands a bitmap byte's kept bytes with a byte shuffle where the CPU has one
  // (this build on x86-64) and a byte at a time elsewhere (the portable build): both run this.
  namespace detail = kompress::detail;
  std::mt19937 rng(23);
  for (const std::uint32_t length : {1u, 7u, 8u, 9u, 63u, 64u, 65u, 255u, 256u, 1000u, 2048u, 16384u}) {
    for (const double density : {0.0, 0.01, 0.1, 0.5, 0.9, 1.0}) {
      std::vector<std::uint8_t> buffer(length), levels(length / 7 + 64), read_levels(length / 7 + 64), back(length);
      for (auto& byte : buffer)
        byte = std::uniform_real_distribution<double>(0.0, 1.0)(rng) < density ? std::uint8_t(1 + rng() % 255) : 0;
      const std::uint64_t size = detail::zero_eliminated_size(buffer.data(), length, levels.data());
      std::vector<std::byte> section(size + 8);
      CAPTURE(length);
      CAPTURE(density);
      REQUIRE(detail::write_zero_eliminated(buffer.data(), length, levels.data(), section.data(), section.size()) ==
              size);
      // Exactly the section's bytes, so a read past them is one past the allocation.
      std::vector<std::byte> exact(section.begin(), section.begin() + std::ptrdiff_t(size));
      CHECK(detail::read_zero_eliminated(exact.data(), size, length, read_levels.data(), back.data()) ==
            std::int64_t(size));
      CHECK(back == buffer);
      if (size > 0) {
        exact.pop_back();
        CHECK(detail::read_zero_eliminated(exact.data(), size - 1, length, read_levels.data(), back.data()) == -1);
      }
    }
  }
}

TEST_CASE("Rice residuals: the writer's bytes are the section's bit string, for quotients of every length") {
  namespace detail = kompress::detail;
  std::mt19937 rng(19);
  const int padded = detail::ratio_chunk_values;
  const int blocks = padded / detail::rice_block;
  const auto values = static_cast<std::size_t>(padded);
  std::vector<std::uint32_t> residuals(values, 0), decoded(values), ends(values);
  std::vector<std::uint8_t> parameters(static_cast<std::size_t>(blocks));
  std::vector<std::byte> written(8 * values + 64);
  int long_groups = 0;
  for (int trial = 0; trial < 60; ++trial) {
    const int shift = trial % 3;
    for (int b = 0; b < blocks; ++b) {
      const double mean = std::exp(std::uniform_real_distribution<double>(-2.0, 6.0)(rng));
      std::geometric_distribution<std::uint32_t> geometric(1.0 / (1.0 + mean));
      const bool zero = rng() % 8 == 0;
      std::uint32_t any = 0;
      for (int i = 0; i < detail::rice_block; ++i) {
        std::uint32_t z = zero ? 0u : std::min<std::uint32_t>(geometric(rng), 1u << 20);
        if (!zero && rng() % 97 == 0) z = 1000 + rng() % 5000;  // outliers: quotients past a word
        residuals[std::size_t(detail::rice_block * b + i)] = z << shift;
        any |= z;
      }
      // Parameters from the smallest (long quotients everywhere) to the largest the format has
      // (every width of the remainders' unpacking).
      parameters[std::size_t(b)] =
          any == 0 ? detail::rice_zero_block : std::uint8_t(rng() % (trial % 2 == 0 ? 8 : detail::rice_max_parameter + 1));
    }
    // The reference: the bit string of docs/format.md, "Rice residuals", one bit at a time.
    std::vector<std::uint8_t> reference = {std::uint8_t(shift)};
    for (int b = 0; b < blocks; b += 2)
      reference.push_back(std::uint8_t(parameters[std::size_t(b)] | (parameters[std::size_t(b) + 1] << 4)));
    std::vector<bool> remainders, quotients;
    for (int b = 0; b < blocks; ++b) {
      const int k = parameters[std::size_t(b)];
      if (k == detail::rice_zero_block) continue;
      std::uint64_t group_bits = 0;
      for (int i = 0; i < detail::rice_block; ++i) {
        const std::uint32_t z = residuals[std::size_t(detail::rice_block * b + i)] >> shift;
        for (int j = 0; j < k; ++j) remainders.push_back(((z >> j) & 1u) != 0);
        quotients.insert(quotients.end(), z >> k, false);
        quotients.push_back(true);
        group_bits += (z >> k) + 1;
        if (i % 8 == 7) {
          long_groups += group_bits > 64 ? 1 : 0;
          group_bits = 0;
        }
      }
    }
    for (const auto* bits : {&remainders, &quotients})
      for (std::size_t at = 0; at < bits->size(); at += 8) {
        std::uint8_t byte = 0;
        for (std::size_t j = 0; j < 8 && at + j < bits->size(); ++j) byte |= std::uint8_t((*bits)[at + j] ? 1u << j : 0u);
        reference.push_back(byte);
      }
    const std::uint64_t length =
        detail::write_rice(residuals.data(), padded, shift, parameters.data(), written.data());
    CAPTURE(trial);
    REQUIRE(length == reference.size());
    CHECK(std::equal(reference.begin(), reference.end(), written.begin(),
                     [](std::uint8_t r, std::byte w) { return r == std::uint8_t(w); }));
    REQUIRE(detail::read_rice(written.data(), length, padded, decoded.data(), ends.data()));
    CHECK(decoded == residuals);
  }
  MESSAGE(long_groups << " groups of eight quotients longer than a word");
  CHECK(long_groups > 100);
}

#if defined(__linux__)
TEST_CASE("Rice residuals: the writer and the reader touch nothing past the section, whatever its parameters") {
  // Each section ends where a page that cannot be read or written begins, so an access past it
  // faults. The host reader loads and the host writer stores 16 bytes from a block's
  // remainders; with few coded blocks and small parameters the section ends sooner.
  namespace detail = kompress::detail;
  const auto page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  const std::size_t readable = (16384 + page - 1) / page * page;
  void* const mapping = mmap(nullptr, readable + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  REQUIRE(mapping != MAP_FAILED);
  std::byte* const guard = static_cast<std::byte*>(mapping) + readable;
  REQUIRE(mprotect(guard, page, PROT_NONE) == 0);
  std::mt19937 rng(23);
  int sections = 0;
  for (const int padded : {64, 128, 4096}) {
    const int blocks = padded / detail::rice_block;
    const auto values = static_cast<std::size_t>(padded);
    std::vector<std::uint32_t> residuals(values), decoded(values), ends(values);
    std::vector<std::uint8_t> parameters(static_cast<std::size_t>(blocks));
    std::vector<std::byte> written(8 * values + 64);
    for (int k = 0; k <= detail::rice_max_parameter; ++k)
      for (const int coded : {1, 2, blocks}) {  // the last `coded` blocks, the others all zero
        const int shift = (k + coded) % 3;
        for (int b = 0; b < blocks; ++b) {
          const bool is_coded = b >= blocks - coded;
          parameters[std::size_t(b)] = is_coded ? std::uint8_t(k) : detail::rice_zero_block;
          for (int i = 0; i < detail::rice_block; ++i) {
            const std::uint32_t z = is_coded ? ((rng() % 3) << k) | (rng() & ((1u << k) - 1u)) : 0u;
            residuals[std::size_t(detail::rice_block * b + i)] = z << shift;
          }
        }
        const std::uint64_t length =
            detail::write_rice(residuals.data(), padded, shift, parameters.data(), written.data());
        REQUIRE(length <= readable);
        // Written again where it ends at the page: the writer too stays inside it.
        std::byte* const section = guard - length;
        std::memset(section, 0xA5, length);
        REQUIRE(detail::write_rice(residuals.data(), padded, shift, parameters.data(), section) == length);
        CHECK(std::memcmp(section, written.data(), length) == 0);
        CAPTURE(padded);
        CAPTURE(k);
        CAPTURE(coded);
        REQUIRE(detail::read_rice(section, length, padded, decoded.data(), ends.data()));
        CHECK(decoded == residuals);
        ++sections;
      }
  }
  CHECK(sections == 3 * 15 * 3);
  munmap(mapping, readable + page);
}
#endif

TEST_CASE("Rice residuals: a ReLU's positive values take them, within the bound, smaller than bit planes") {
  namespace detail = kompress::detail;
  const auto values = relu_positives(3 * 4096 + 1000, 3);
  for (const auto rounding : {kompress::rounding_mode::nearest, kompress::rounding_mode::stochastic}) {
    CAPTURE(int(rounding));
    const kompress::compress_options options{.bound = kompress::relative(5e-2), .codec = ratio, .rounding = rounding};
    const auto result = require_round_trip<float>(values, options);
    const auto& stream = result.stream;
    const auto header = detail::read_header(
        Kokkos::View<const std::byte*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>(stream.data(), stream.size()),
        "test");
    const auto layout = header.layout();
    for (std::uint64_t c = 0; c < layout.chunk_count(); ++c) {
      const std::uint64_t begin =
          c ? detail::load<std::uint64_t>(stream.data() + layout.chunk_end_table_offset() + 8 * (c - 1)) : 0;
      CAPTURE(c);
      CHECK((std::uint8_t(stream[layout.data_offset() + begin]) & detail::ratio_flag_rice) != 0);
    }
    const auto planes = compress_as_1_1(
        Kokkos::View<const float*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>(values.data(), values.size()), options);
    MESSAGE("ReLU positives, REL 5e-2: Rice " << stream.size() << " bytes, bit planes " << planes.size());
    CHECK(double(stream.size()) < 0.95 * double(planes.size()));
    CHECK(kompress::test::decompress_on_default<float>(planes, values.size()) == result.decoded);
  }
}

TEST_CASE("Rice residuals: every malformed section is rejected") {
  namespace detail = kompress::detail;
  const auto values = relu_positives(4096, 5);
  const auto codec = detail::make_value_codec<float>(5e-2, 4.0);
  auto scratch = std::make_unique<detail::ratio_scratch>();
  const auto chunk = encode_chunk(values, codec, *scratch, true);
  REQUIRE((std::uint8_t(chunk[0]) & detail::ratio_flag_rice) != 0);
  std::vector<float> out(4096), reference(4096);
  const auto decodes = [&](const std::vector<std::byte>& c, bool rice_allowed = true) {
    return detail::decode_ratio_chunk<float>(c.data(), c.size(), 4096, 0, codec, *scratch, out.data(), rice_allowed);
  };
  REQUIRE(decodes(chunk));
  reference = out;
  for (std::size_t i = 0; i < values.size(); ++i) REQUIRE(std::abs(double(out[i]) - double(values[i])) <= 5e-2);
  // Without flag bit 2 (a 1.1 stream) the same chunk is malformed; and the encoder writes bit planes.
  CHECK_FALSE(decodes(chunk, false));
  const auto planes = encode_chunk(values, codec, *scratch, false);
  CHECK((std::uint8_t(planes[0]) & detail::ratio_flag_rice) == 0);
  CHECK(planes.size() > chunk.size());
  CHECK(decodes(planes, false));
  CHECK(out == reference);

  SUBCASE("every shorter length and one byte more") {
    for (std::size_t length = 1; length < chunk.size(); ++length) {
      const std::vector<std::byte> truncated(chunk.begin(), chunk.begin() + std::ptrdiff_t(length));
      CAPTURE(length);
      CHECK_FALSE(decodes(truncated));
    }
    auto longer = chunk;
    longer.push_back(std::byte(0));
    CHECK_FALSE(decodes(longer));
  }
  SUBCASE("a shift past 31 or a parameter that shifts a residual past 32 bits") {
    auto bad = chunk;
    bad[1] = std::byte(32);
    CHECK_FALSE(decodes(bad));
    bad[1] = std::byte(30);  // the first block's k (at least 1 here) plus 30 stays <= 32 only for k <= 2
    const int k = int(std::uint8_t(chunk[2]) & 0xF);
    REQUIRE(k != detail::rice_zero_block);
    bad[2] = std::byte((std::uint8_t(chunk[2]) & 0xF0) | 3);
    CHECK_FALSE(decodes(bad));
  }
  SUBCASE("a padding bit set after the last quotient") {
    // The last byte holds the last terminator; set every bit above it.
    auto bad = chunk;
    const std::uint8_t last = std::uint8_t(bad.back());
    REQUIRE(last != 0);
    const int top = 7 - std::countl_zero(last);
    if (top < 7) {
      bad.back() = std::byte(last | std::uint8_t(0xFF << (top + 1)));
      CHECK_FALSE(decodes(bad));
    }
    auto zero_last = chunk;
    zero_last.back() = std::byte(0);  // the last quotient runs past the end
    CHECK_FALSE(decodes(zero_last));
  }
}

TEST_CASE("Rice residuals: a quotient that does not fit 32 bits after its shift is rejected") {
  namespace detail = kompress::detail;
  // 64 values, no predictor, shift 31: block 0 with k = 0, block 1 all zero. Each quotient may
  // be 0 or 1 (a residual of 0 or 2^31); 2 overflows.
  const auto codec = detail::make_value_codec<float>(1e-3, 1.0);
  auto scratch = std::make_unique<detail::ratio_scratch>();
  std::vector<float> out(64);
  const auto chunk_with = [](std::uint8_t quotient_bits_per_value) {
    std::vector<std::byte> c = {std::byte(detail::ratio_flag_rice), std::byte(31), std::byte(0xF0)};
    // 32 quotients: 1 as "01", 2 as "001", each little-endian from bit 0.
    std::uint64_t bits = 0;
    int used = 0;
    std::vector<std::byte> q;
    for (int i = 0; i < 32; ++i) {
      used += quotient_bits_per_value - 1;
      bits |= std::uint64_t(1) << used;
      ++used;
      while (used >= 8) {
        q.push_back(std::byte(std::uint8_t(bits)));
        bits >>= 8;
        used -= 8;
      }
    }
    if (used) q.push_back(std::byte(std::uint8_t(bits)));
    c.insert(c.end(), q.begin(), q.end());
    return c;
  };
  const auto ones = chunk_with(2);
  REQUIRE(detail::decode_ratio_chunk<float>(ones.data(), ones.size(), 64, 0, codec, *scratch, out.data(), true));
  // Residual 2^31 is zigzag(2^30): the code 2^30.
  CHECK(out[0] == float(detail::value_codec<float>::reconstruct(0x1p30, codec.step)));
  const auto twos = chunk_with(3);
  CHECK_FALSE(detail::decode_ratio_chunk<float>(twos.data(), twos.size(), 64, 0, codec, *scratch, out.data(), true));
}

namespace {

/// The Rice section as docs/format.md describes it, read a bit at a time: the reader the
/// library's two-pass one must agree with on every section, well formed or not.
bool read_rice_bit_by_bit(const std::vector<std::byte>& in, int padded, std::vector<std::uint32_t>& residuals) {
  namespace detail = kompress::detail;
  const int blocks = padded / detail::rice_block;
  std::size_t header = 1 + std::size_t(blocks / 2);
  if (in.size() < header) return false;
  const int shift = int(std::uint8_t(in[0]));
  if (shift > 31) return false;
  const auto bit_at = [&](std::size_t byte_offset, std::uint64_t bit) {
    return (std::uint8_t(in[byte_offset + bit / 8]) >> (bit % 8)) & 1u;
  };
  std::vector<int> k(static_cast<std::size_t>(blocks));
  std::size_t remainder_bytes = 0;
  for (int b = 0; b < blocks; ++b) {
    k[std::size_t(b)] = (std::uint8_t(in[1 + std::size_t(b) / 2]) >> (4 * (b & 1))) & 0xF;
    if (k[std::size_t(b)] == detail::rice_zero_block) continue;
    if (k[std::size_t(b)] + shift > 32) return false;
    remainder_bytes += std::size_t(k[std::size_t(b)]) * 4;
  }
  if (in.size() - header < remainder_bytes) return false;
  const std::size_t quotients = header + remainder_bytes;
  const std::uint64_t quotient_bits = 8 * std::uint64_t(in.size() - quotients);
  std::uint64_t remainder_bit = 0, bit = 0;
  residuals.assign(std::size_t(padded), 0);
  for (int b = 0; b < blocks; ++b) {
    const int kb = k[std::size_t(b)];
    if (kb == detail::rice_zero_block) continue;
    for (int i = 0; i < detail::rice_block; ++i) {
      std::uint64_t remainder = 0, quotient = 0;
      for (int j = 0; j < kb; ++j) remainder |= std::uint64_t(bit_at(header, remainder_bit++)) << j;
      for (;; ++bit) {
        if (bit >= quotient_bits) return false;
        if (bit_at(quotients, bit)) break;
        ++quotient;
      }
      ++bit;
      const std::uint64_t residual = ((quotient << kb) | remainder) << shift;
      if (residual >> 32) return false;
      residuals[std::size_t(detail::rice_block * b + i)] = std::uint32_t(residual);
    }
  }
  // Whole bytes, the bits after the last quotient 0.
  if ((bit + 7) / 8 != quotient_bits / 8) return false;
  for (; bit < quotient_bits; ++bit)
    if (bit_at(quotients, bit)) return false;
  return true;
}

}  // namespace

TEST_CASE("Rice residuals: the reader agrees with a bit-by-bit one on every mutated section") {
  namespace detail = kompress::detail;
  const auto values = relu_positives(4096, 11);
  const auto codec = detail::make_value_codec<float>(2e-2, 4.0);
  auto scratch = std::make_unique<detail::ratio_scratch>();
  const auto chunk = encode_chunk(values, codec, *scratch, true);
  REQUIRE((std::uint8_t(chunk[0]) & detail::ratio_flag_rice) != 0);
  REQUIRE((std::uint8_t(chunk[0]) & 3) < detail::predict_lorenzo2);  // the section starts at byte 1
  const std::vector<std::byte> section(chunk.begin() + 1, chunk.end());
  std::vector<std::uint32_t> expected, residuals(4096), ends(4096);
  const auto agree = [&](const std::vector<std::byte>& s) {
    const bool reference = read_rice_bit_by_bit(s, 4096, expected);
    const bool library = detail::read_rice(s.data(), s.size(), 4096, residuals.data(), ends.data());
    CHECK(library == reference);
    if (library && reference) CHECK(residuals == expected);
    return reference;
  };
  REQUIRE(agree(section));
  std::mt19937 rng(3);
  int accepted = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    auto mutated = section;
    // One to three flipped bits anywhere, the parameters and the last bytes more often.
    const int flips = 1 + int(rng() % 3);
    for (int f = 0; f < flips; ++f) {
      const std::size_t at = trial % 3 == 0   ? 1 + rng() % 64
                             : trial % 3 == 1 ? mutated.size() - 1 - rng() % std::min<std::size_t>(16, mutated.size())
                                              : rng() % mutated.size();
      mutated[at] ^= std::byte(std::uint8_t(1u << (rng() % 8)));
    }
    if (trial % 7 == 0) mutated.resize(mutated.size() - 1 - rng() % 8);
    if (trial % 11 == 0) mutated.push_back(std::byte(std::uint8_t(rng())));
    CAPTURE(trial);
    accepted += agree(mutated) ? 1 : 0;
  }
  MESSAGE(accepted << " of 3000 mutated sections well formed");
  CHECK(accepted > 0);
  CHECK(accepted < 3000);
  // Quotients at their limit: shift 31 and k = 0 allow 0 and 1 only. Blocks 0, 2, 4, ... are
  // coded, the others zero; every quotient 1, then one of them 2.
  for (const int too_large_at : {-1, 0, 31, 2047}) {
    std::vector<std::byte> limit = {std::byte(31)};
    for (int b = 0; b < 4096 / 64; ++b) limit.push_back(std::byte(0xF0));
    std::vector<bool> bits;
    for (int q = 0; q < 2048; ++q) {
      bits.insert(bits.end(), q == too_large_at ? 2 : 1, false);
      bits.push_back(true);
    }
    for (std::size_t at = 0; at < bits.size(); at += 8) {
      std::uint8_t byte = 0;
      for (std::size_t j = 0; j < 8 && at + j < bits.size(); ++j) byte |= std::uint8_t(bits[at + j] ? 1u << j : 0u);
      limit.push_back(std::byte(byte));
    }
    CAPTURE(too_large_at);
    CHECK(agree(limit) == (too_large_at < 0));
  }
}

TEST_CASE("Rice residuals: the header says which streams may hold them") {
  namespace detail = kompress::detail;
  const auto values = relu_positives(5000, 9);
  const kompress::compress_options options{.bound = kompress::relative(5e-2), .codec = ratio};
  const auto result = require_round_trip<float>(values, options);
  const std::uint32_t flags = detail::flag_ratio_codec | detail::flag_rice_residuals;
  REQUIRE(detail::load<std::uint32_t>(result.stream.data() + 52) == flags);
  const auto decode = [&](std::vector<std::byte> stream, int minor, std::uint32_t with_flags) {
    stream[5] = std::byte(minor);
    detail::store<std::uint32_t>(stream.data() + 52, with_flags);
    const auto layout = detail::read_header(
        Kokkos::View<const std::byte*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>(result.stream.data(),
                                                                                  result.stream.size()),
        "test").layout();
    detail::store<std::uint64_t>(stream.data() + detail::header_checksum_offset,
                                 detail::header_checksum(stream.data(), layout.data_offset()));
    return kompress::test::decompress_on_default<float>(stream, values.size());
  };
  CHECK(decode(result.stream, 2, flags) == result.decoded);
  // A 1.1 reader's view: flag bit 2 is unknown in 1.1; a 1.1 stream's chunks cannot be Rice.
  CHECK_THROWS_WITH_AS(decode(result.stream, 1, flags), doctest::Contains("unknown flag bits"), kompress::format_error);
  CHECK_THROWS_WITH_AS(decode(result.stream, 2, detail::flag_ratio_codec), doctest::Contains("malformed ratio chunk"),
                       kompress::format_error);
  CHECK_THROWS_WITH_AS(decode(result.stream, 2, detail::flag_rice_residuals), doctest::Contains("without flag bit 1"),
                       kompress::format_error);
}
