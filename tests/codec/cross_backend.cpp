// The bytes of a stream do not depend on the backend that writes them: golden streams written
// on the build's default execution space (the GPU in a CUDA build), and streams written on the
// default space and on the host, each decoded on the other, compared bit for bit, on real data
// and on NaN, Inf, -0.0, denormals and the largest finite values. In a host-only build both
// sides are the host and the same checks hold.
//
// The golden inputs come from integer arithmetic and exact scalings only (no libm), so that
// they are the same on every machine. format.cpp and ratio.cpp (beside this file) pin the other
// golden streams; their round trips run on the default space too.

#include "support/codec_checks.hpp"
#include "support/data_checks.hpp"

#include <kompress/detail/checksum.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace {

using kompress::test::default_exec;
using kompress::test::default_memory;
using host_exec = Kokkos::DefaultHostExecutionSpace;
constexpr auto ratio = kompress::codec_mode::ratio;

/// SplitMix64: the same integers on every machine.
struct splitmix {
  std::uint64_t state;
  std::uint64_t next() {
    std::uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  /// An integer in [-half, half).
  std::int64_t centered(int half) { return std::int64_t(next() % std::uint64_t(2 * half)) - half; }
};

/// A random walk of integer steps scaled by 2^-6: every value exact in float and double.
template <class T>
std::vector<T> walk(std::size_t count, std::uint64_t seed) {
  splitmix rng{seed};
  std::vector<T> values(count);
  std::int64_t position = 0;
  for (T& v : values) {
    position += rng.centered(16);
    v = T(double(position) * 0x1p-6);
  }
  return values;
}

/// A smooth field over a grid (C order, slowest extent first): an integer quadratic plus
/// integer noise, scaled by 2^-5; exact in float for the grids below.
template <class T>
std::vector<T> field(const std::vector<std::size_t>& extents, std::uint64_t seed) {
  std::size_t count = 1;
  for (const std::size_t e : extents) count *= e;
  splitmix rng{seed};
  std::vector<T> values(count);
  for (std::size_t i = 0; i < count; ++i) {
    std::int64_t sum = 0, rest = std::int64_t(i);
    for (std::size_t d = extents.size(); d-- > 0;) {
      const std::int64_t coordinate = rest % std::int64_t(extents[d]);
      rest /= std::int64_t(extents[d]);
      sum += std::int64_t(d + 2) * coordinate * coordinate - 37 * coordinate;
    }
    values[i] = T(double(sum + rng.centered(4)) * 0x1p-5);
  }
  return values;
}

/// NaNs (with sign and payload), infinities, signed zeros and denormals at fixed places:
/// single values, a whole NaN block and a run of -0.0.
template <class T>
void plant_specials(std::vector<T>& values) {
  using limits = std::numeric_limits<T>;
  using bits_type = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>;
  const auto from_bits = [](bits_type b) {
    T x;
    std::memcpy(&x, &b, sizeof(T));
    return x;
  };
  const bits_type payload_nan = sizeof(T) == 4 ? bits_type(0x7FC12345u) : bits_type(0xFFF0000000ABCDEFull);
  const std::vector<T> specials = {limits::quiet_NaN(),  -limits::quiet_NaN(),  limits::signaling_NaN(),
                                   from_bits(payload_nan), limits::infinity(),  -limits::infinity(),
                                   T(-0.0),               T(0.0),               limits::denorm_min(),
                                   -limits::denorm_min(),  limits::denorm_min() * T(77), limits::min(),
                                   -limits::min()};
  for (std::size_t i = 0; i < specials.size() && 7 * i + 3 < values.size(); ++i) values[7 * i + 3] = specials[i];
  for (std::size_t i = 640; i < 704 && i < values.size(); ++i) values[i] = limits::quiet_NaN();
  for (std::size_t i = 1000; i < 1300 && i < values.size(); ++i) values[i] = T(-0.0);
}

/// The largest finite values of both signs among `values`: a range past double's.
template <class T>
std::vector<T> with_extremes(std::vector<T> values) {
  using limits = std::numeric_limits<T>;
  for (std::size_t i = 0; i < values.size(); i += 501) values[i] = i % 2 ? limits::max() : limits::lowest();
  return values;
}

/// Denormals only, and denormals next to zeros and the smallest normals.
template <class T>
std::vector<T> denormals(std::size_t count) {
  using limits = std::numeric_limits<T>;
  std::vector<T> values(count);
  for (std::size_t i = 0; i < count; ++i) {
    const T magnitude = limits::denorm_min() * T(i % 1000);
    values[i] = i % 5 == 0 ? limits::min() : i % 3 == 0 ? -magnitude : magnitude;
  }
  return values;
}

std::uint64_t checksum(const std::vector<std::byte>& stream) {
  return kompress::detail::checksum_of(stream.data(), stream.size());
}

/// The stream of `values` written on the default execution space (bound checked too).
template <class T, class Layout = Kokkos::LayoutRight>
std::vector<std::byte> default_stream(const std::vector<T>& values, const kompress::compress_options& options,
                                      const std::vector<std::size_t>& extents = {}) {
  return kompress::test::require_round_trip<T, Layout>(std::span<const T>(values), options, extents).stream;
}

void check_golden(const std::string& name, const std::vector<std::byte>& stream, std::size_t bytes,
                  std::uint64_t sum) {
  MESSAGE("golden " << name << ": " << stream.size() << " bytes, checksum " << checksum(stream));
  CAPTURE(name);
  CHECK(stream.size() == bytes);
  CHECK(checksum(stream) == sum);
}

/// The values `stream` (a View of any memory space) decodes to on `exec`, from a copy of the
/// stream in exec's memory space into a View of that space.
template <class T, class Exec, class Stream>
std::vector<T> decoded_on(const Exec& exec, const Stream& stream, std::size_t count) {
  using memory = typename Exec::memory_space;
  const auto local = Kokkos::create_mirror_view_and_copy(memory{}, stream);
  Kokkos::View<T*, memory> out("decoded", count);
  kompress::decompress(exec, local, out);
  return kompress::test::to_host(out);
}

template <class T>
bool bit_identical(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

/// Compresses `values` (as a View of `extents` in `Layout`, or flat) on the default space and
/// on the host: the same bytes; each stream decoded on both: the same values, within the bound.
template <class T, class Layout = Kokkos::LayoutRight>
void require_backend_independent(const std::vector<T>& values, const kompress::compress_options& options,
                                 const std::vector<std::size_t>& extents = {}) {
  kompress::test::with_view<Layout>(std::span<const T>(values), extents, [&](const auto& host_in) {
    const host_exec host;
    const default_exec exec;
    Kokkos::View<std::byte*, Kokkos::HostSpace> host_buffer("host stream", kompress::max_compressed_size(host_in, options));
    const std::size_t host_length = kompress::compress(host, host_in, host_buffer, options);
    const auto device_in = Kokkos::create_mirror_view_and_copy(default_memory{}, host_in);
    Kokkos::View<std::byte*, default_memory> device_buffer("default stream",
                                                           kompress::max_compressed_size(device_in, options));
    const std::size_t device_length = kompress::compress(exec, device_in, device_buffer, options);
    const auto host_stream = Kokkos::subview(host_buffer, std::pair<std::size_t, std::size_t>(0, host_length));
    const auto device_stream = Kokkos::subview(device_buffer, std::pair<std::size_t, std::size_t>(0, device_length));
    const std::vector<std::byte> host_bytes = kompress::test::to_host(host_stream);
    REQUIRE(device_length == host_length);
    CHECK(kompress::test::to_host(device_stream) == host_bytes);

    const std::size_t count = values.size();
    const auto host_on_host = decoded_on<T>(host, host_stream, count);
    const auto host_on_default = decoded_on<T>(exec, host_stream, count);
    const auto default_on_host = decoded_on<T>(host, device_stream, count);
    const auto default_on_default = decoded_on<T>(exec, device_stream, count);
    CHECK(bit_identical(host_on_default, host_on_host));
    CHECK(bit_identical(default_on_host, host_on_host));
    CHECK(bit_identical(default_on_default, host_on_host));

    const auto info = kompress::inspect(kompress::test::host_unmanaged<const std::byte>(host_bytes.data(), host_length));
    CHECK(info.absolute_bound <= kompress::test::expected_abs_bound<T>(values, options.bound, options.fill_value));
    const auto check = kompress::test::check_bound<T>(values, host_on_host, info.absolute_bound, options.fill_value);
    CHECK(check.violations == 0);
  });
}

/// The codec settings every cross-backend input goes through.
std::vector<kompress::compress_options> settings(std::optional<double> fill = std::nullopt) {
  std::vector<kompress::compress_options> all;
  for (const int block_size : {32, 64, 128}) {
    all.push_back({.bound = kompress::relative(1e-3), .fill_value = fill, .block_size = block_size});
    all.push_back({.bound = kompress::absolute(1e-2), .fill_value = fill, .block_size = block_size});
  }
  all.push_back({.bound = kompress::lossless(), .fill_value = fill});
  for (const auto bound : {kompress::relative(1e-4), kompress::absolute(1e-3), kompress::lossless()})
    all.push_back({.bound = bound, .fill_value = fill, .codec = ratio});
  return all;
}

std::string describe(const kompress::compress_options& options) {
  return std::string(options.codec == ratio ? "ratio" : "fast") + " block " + std::to_string(options.block_size) +
         (options.bound.mode == kompress::bound_mode::relative ? " REL " : " ABS ") +
         std::to_string(options.bound.value) + (options.fill_value ? " with fill" : "");
}

}  // namespace

// The numbers are those the host backend writes. One failing on one backend only: that
// backend's kernels write other bytes, a bug in them. One changing on every backend: the format
// changed; bump its version (docs/format.md) on purpose, never just the number.
TEST_CASE("cross-backend: golden streams written on the default execution space") {
  MESSAGE("default execution space " << std::string(default_exec::name()) << ", host execution space "
                                      << std::string(host_exec::name()));
  auto walk_f = walk<float>(5000, 1);
  plant_specials(walk_f);
  auto walk_d = walk<double>(7000, 2);
  plant_specials(walk_d);
  auto filled_f = walk<float>(6000, 3);
  auto filled_d = walk<double>(6000, 4);
  for (std::size_t i = 0; i < 6000; ++i) {
    if (i % 97 == 0 || (i / 40) % 5 == 0) {
      filled_f[i] = 1e20f;
      filled_d[i] = -9999.0;
    }
  }
  const auto plane_d = field<double>({96, 80}, 5);
  auto cube_f = field<float>({16, 24, 20}, 6);
  plant_specials(cube_f);
  for (std::size_t i = 2000; i < 2400; ++i) cube_f[i] = 1e20f;
  const auto tiny_f = denormals<float>(3000);
  const auto tiny_d = denormals<double>(3000);
  const double four_denormals_f = 4.0 * std::numeric_limits<float>::denorm_min();
  const double four_denormals_d = 4.0 * std::numeric_limits<double>::denorm_min();

  // The fast codec (format 1.0), across the block sizes.
  check_golden("fast float ABS 1e-2 block 64",
               default_stream(walk_f, {.bound = kompress::absolute(1e-2), .block_size = 64}),
               3901u, 9348007970524201137ull);
  check_golden("fast double REL 1e-4 block 32",
               default_stream(walk_d, {.bound = kompress::relative(1e-4)}),
               6772u, 6145005087531722997ull);
  check_golden("fast float REL 1e-2 block 128, fill",
               default_stream(filled_f, {.bound = kompress::relative(1e-2), .fill_value = 1e20, .block_size = 128}),
               1976u, 5694775248958321827ull);
  check_golden("fast double ABS 1e-3 block 64, fill",
               default_stream(filled_d, {.bound = kompress::absolute(1e-3), .fill_value = -9999.0, .block_size = 64}),
               7538u, 12069346468900946706ull);
  check_golden("fast float denormals ABS 4 denorm_min block 32",
               default_stream(tiny_f, {.bound = kompress::absolute(four_denormals_f)}),
               8582u, 17971745847611669634ull);
  check_golden("fast double denormals lossless block 128",
               default_stream(tiny_d, {.bound = kompress::lossless(), .block_size = 128}),
               24128u, 16832769771659224393ull);
  // The ratio codec (format 1.2; ratio.cpp pins 1.1's bytes), with Views of 2 and 3 dimensions.
  check_golden("ratio double REL 1e-5 96x80 LayoutLeft",
               default_stream<double, Kokkos::LayoutLeft>(plane_d, {.bound = kompress::relative(1e-5), .codec = ratio},
                                                          {96, 80}),
               10095u, 11861258700438802882ull);
  check_golden("ratio float ABS 1e-2 16x24x20, fill",
               default_stream(cube_f, {.bound = kompress::absolute(1e-2), .fill_value = 1e20, .codec = ratio}, {16, 24, 20}),
               5690u, 13437733111703782650ull);
  check_golden("ratio double REL 1e-3, fill",
               default_stream(filled_d, {.bound = kompress::relative(1e-3), .fill_value = -9999.0, .codec = ratio}),
               2307u, 726950757282794112ull);
  check_golden("ratio float ABS 1e-3",
               default_stream(walk_f, {.bound = kompress::absolute(1e-3), .codec = ratio}),
               5477u, 10056214817115190356ull);
  check_golden("ratio double denormals ABS 4 denorm_min",
               default_stream(tiny_d, {.bound = kompress::absolute(four_denormals_d), .codec = ratio}),
               24105u, 6836184795074160454ull);
}

TEST_CASE_TEMPLATE("cross-backend: NaN, Inf, -0.0, denormals and extremes, written and decoded on either side",
                   T, float, double) {
  auto values = walk<T>(9013, 11);
  plant_specials(values);
  auto with_fill = values;
  for (std::size_t i = 2000; i < 9013; i += 13) with_fill[i] = T(-999.0);
  for (const auto& options : settings()) {
    CAPTURE(describe(options));
    require_backend_independent(values, options);
  }
  for (const auto& options : settings(-999.0)) {
    CAPTURE(describe(options));
    require_backend_independent(with_fill, options);
  }
  // The largest finite values: ranges past double's, under every bound.
  const auto extremes = with_extremes(values);
  for (const auto& options : settings()) {
    CAPTURE(describe(options));
    require_backend_independent(extremes, options);
  }
  // Denormals under bounds of a few denormals.
  using limits = std::numeric_limits<T>;
  const auto tiny = denormals<T>(5000);
  for (const double multiple : {0.0, 1.0, 4.0, 1000.0}) {
    CAPTURE(multiple);
    const double bound = multiple * double(limits::denorm_min());
    require_backend_independent(tiny, {.bound = kompress::absolute(bound)});
    require_backend_independent(tiny, {.bound = kompress::absolute(bound), .codec = ratio});
  }
  // A ratio-codec View of 2 dimensions in both layouts, specials included.
  auto plane = field<T>({60, 70}, 12);
  plant_specials(plane);
  for (const auto bound : {kompress::relative(1e-4), kompress::absolute(1e-2)}) {
    require_backend_independent<T, Kokkos::LayoutRight>(plane, {.bound = bound, .codec = ratio}, {60, 70});
    require_backend_independent<T, Kokkos::LayoutLeft>(plane, {.bound = bound, .codec = ratio}, {60, 70});
  }
}

namespace {

template <class T>
void require_file_backend_independent(const kompress::test::data_file_info& file) {
  // Whole slices of the slowest extent, at most 2^17 values, to keep the test quick.
  auto values = kompress::test::read_raw<T>(file.name);
  auto shape = file.shape;
  const std::size_t slice = values.size() / shape[0];
  shape[0] = std::clamp<std::size_t>((std::size_t(1) << 17) / slice, 1, shape[0]);
  values.resize(shape[0] * slice);
  const auto fill = file.fill_value;
  require_backend_independent(values, {.bound = kompress::relative(1e-3), .fill_value = fill});
  require_backend_independent(values, {.bound = kompress::absolute(1e-4), .fill_value = fill, .block_size = 128});
  require_backend_independent(values, {.bound = kompress::relative(1e-4), .fill_value = fill, .codec = ratio}, shape);
  require_backend_independent(values, {.bound = kompress::absolute(1e-3), .fill_value = fill, .codec = ratio}, shape);
}

}  // namespace

TEST_CASE("cross-backend: real arrays, written and decoded on either side") {
  // Land-masked ocean fields with fill values, double ocean fields (one with -0.0), 1-D
  // particle velocities, a ReLU activation (exact zeros), and a 4-D double array.
  for (const char* stem : {"nemo_orca2_sst", "pop_temp", "mitgcm_ocean_theta", "mitgcm_ocean_uvel", "hacc_vx",
                           "act_cnn_s3_relu_out", "sz_testdouble"}) {
    CAPTURE(stem);
    if (const auto why = kompress::test::missing_from_sample(stem)) {
      MESSAGE(*why);
      continue;
    }
    const auto file = kompress::test::find_array(stem);
    if (file.dtype == "f32")
      require_file_backend_independent<float>(file);
    else
      require_file_backend_independent<double>(file);
  }
}
