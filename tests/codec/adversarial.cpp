// The error bound on inputs built to break it: special values, extreme magnitudes, constant
// arrays, awkward lengths, random bit patterns, and bounds at their limits.

#include "support/codec_checks.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <random>
#include <cstring>
#include <optional>
#include <span>
#include <thread>
#include <vector>

using kompress::test::default_exec;
using kompress::test::default_memory;
using kompress::test::require_round_trip;
using kompress::test::stream_bytes;
using kompress::test::to_default_space;
using kompress::test::to_host;

namespace {

template <class T>
std::vector<T> smooth(std::size_t n, double scale = 1.0) {
  std::vector<T> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = T(scale * std::sin(0.01 * double(i)) + 0.3 * scale * std::cos(0.37 * double(i)));
  return v;
}

template <class T>
void require_bounds(const std::vector<T>& values, std::optional<double> fill = std::nullopt) {
  for (const double bound : {1e-1, 1e-3, 1e-6}) {
    for (const auto mode : {kompress::bound_mode::absolute, kompress::bound_mode::relative}) {
      for (const int block_size : {32, 64, 128}) {
        CAPTURE(bound);
        CAPTURE(block_size);
        require_round_trip<T>(std::span<const T>(values),
                              {.bound = {mode, bound}, .fill_value = fill, .block_size = block_size});
      }
    }
  }
}

template <class T>
bool bit_identical(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

}  // namespace

TEST_CASE_TEMPLATE("codec: NaN, infinities and signed zeros come back bit-exact", T, float, double) {
  using limits = std::numeric_limits<T>;
  auto values = smooth<T>(1000);
  values[3] = limits::quiet_NaN();
  values[40] = -limits::quiet_NaN();
  values[41] = limits::signaling_NaN();
  values[100] = limits::infinity();
  values[101] = -limits::infinity();
  values[200] = T(-0.0);
  values[201] = T(0.0);
  for (std::size_t i = 500; i < 532; ++i) values[i] = limits::quiet_NaN();  // a whole NaN block
  require_bounds(values);
  // A NaN does not poison the relative range: the bound is that of the finite values.
  auto result = require_round_trip<T>(std::span<const T>(values), {.bound = kompress::relative(1e-2)});
  CHECK(std::isfinite(result.info.absolute_bound));
  CHECK(result.info.absolute_bound > 0.0);
}

TEST_CASE_TEMPLATE("codec: zeros of both signs, as land masks have them, stay exact and small", T, float, double) {
  std::mt19937 rng(3);
  auto values = smooth<T>(20000, 5.0);
  for (std::size_t i = 0; i < 12000; ++i) values[i] = (rng() & 3) == 0 ? T(-0.0) : T(0.0);
  auto result = require_round_trip<T>(std::span<const T>(values), {.bound = kompress::absolute(1e-3)});
  for (std::size_t i = 0; i < 12000; ++i) REQUIRE(kompress::test::bits(result.decoded[i]) == kompress::test::bits(values[i]));
  // 12000 zeros cost a sign bit each plus a descriptor byte a block, not 4 or 8 bytes each.
  const auto zeros_only = std::vector<T>(values.begin(), values.begin() + 12000);
  CHECK(require_round_trip<T>(std::span<const T>(zeros_only), {.bound = kompress::absolute(1e-3)}).ratio() > 20.0);
  require_bounds(values);
}

TEST_CASE_TEMPLATE("codec: denormals, zeros and the largest finite values", T, float, double) {
  using limits = std::numeric_limits<T>;
  std::vector<T> values;
  for (int i = 0; i < 300; ++i) {
    values.push_back(limits::denorm_min() * T(i));
    values.push_back(-limits::denorm_min() * T(i % 7));
    values.push_back(i % 3 ? T(0) : limits::min());
  }
  require_bounds(values);
  std::vector<T> extremes = {limits::max(), -limits::max(), T(0), T(1), limits::lowest(),
                             limits::max() / 2, limits::denorm_min()};
  for (int i = 0; i < 100; ++i) extremes.push_back(T(i) * limits::max() / T(128));
  require_bounds(extremes);
  // ABS bounds beyond the data's own magnitude still hold.
  require_round_trip<T>(std::span<const T>(extremes), {.bound = kompress::absolute(1e300)});
}

TEST_CASE_TEMPLATE("codec: values spanning 1e-30 to 1e30", T, float, double) {
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> exponent(-30.0, 30.0);
  std::vector<T> values(5000);
  for (auto& v : values) v = T((rng() & 1 ? 1.0 : -1.0) * std::pow(10.0, exponent(rng)));
  require_bounds(values);
}

TEST_CASE_TEMPLATE("codec: constant arrays", T, float, double) {
  for (const T c : {T(0), T(-0.0), T(1.5), T(-3e7), std::numeric_limits<T>::quiet_NaN()}) {
    for (const std::size_t n : {std::size_t(1), std::size_t(31), std::size_t(4096), std::size_t(100000)}) {
      const std::vector<T> values(n, c);
      require_bounds(values);
      // A REL bound of a constant array is 0: lossless, and still small.
      auto result = require_round_trip<T>(std::span<const T>(values), {.bound = kompress::relative(1e-3)});
      CHECK(kompress::test::bits(result.decoded[0]) == kompress::test::bits(c));
      if (n == 100000) CHECK(result.ratio() > 20.0);
    }
  }
}

TEST_CASE_TEMPLATE("codec: lengths 0, 1 and around block and chunk boundaries", T, float, double) {
  for (const int block_size : {32, 64, 128}) {
    const std::size_t chunk = std::size_t(block_size) * 64;
    for (const std::size_t n : {std::size_t(0), std::size_t(1), std::size_t(2), std::size_t(block_size - 1),
                                std::size_t(block_size), std::size_t(block_size + 1),
                                std::size_t(3 * block_size - 1), std::size_t(3 * block_size + 1),
                                chunk - 1, chunk, chunk + 1, 2 * chunk + 7}) {
      CAPTURE(n);
      const auto values = smooth<T>(n, 100.0);
      for (const double bound : {1e-1, 1e-4}) {
        auto result = require_round_trip<T>(std::span<const T>(values),
                                            {.bound = kompress::relative(bound), .block_size = block_size});
        CHECK(result.info.count == n);
        CHECK(result.stream.size() <= kompress::max_compressed_size<T>(n, block_size));
      }
    }
  }
}

TEST_CASE_TEMPLATE("codec: random bit patterns over the whole range", T, float, double) {
  using bits = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>;
  std::mt19937_64 rng(42);
  std::vector<T> values(20000);
  for (auto& v : values) {
    const bits b = static_cast<bits>(rng());
    std::memcpy(&v, &b, sizeof(T));
  }
  require_bounds(values);
  // Incompressible data stays within max_compressed_size.
  auto result = require_round_trip<T>(std::span<const T>(values), {.bound = kompress::lossless()});
  CHECK(result.stream.size() <= kompress::max_compressed_size<T>(values.size()));
}

TEST_CASE_TEMPLATE("codec: a bound of 0 is lossless", T, float, double) {
  auto values = smooth<T>(10000, 1e3);
  values[17] = std::numeric_limits<T>::quiet_NaN();
  for (const auto bound : {kompress::lossless(), kompress::relative(0.0)}) {
    auto result = require_round_trip<T>(std::span<const T>(values), {.bound = bound});
    CHECK(bit_identical(result.decoded, values));
    CHECK(result.info.absolute_bound == 0.0);
  }
}

TEST_CASE_TEMPLATE("codec: fill values come back bit-exact and stay out of the REL range", T, float, double) {
  const double fill = 9.96921e36;
  auto values = smooth<T>(20000, 10.0);
  for (std::size_t i = 0; i < values.size(); ++i)
    if ((i / 50) % 3 == 0 || i % 97 == 0) values[i] = T(fill);
  require_bounds(values, fill);
  auto result = require_round_trip<T>(std::span<const T>(values),
                                      {.bound = kompress::relative(1e-3), .fill_value = fill});
  CHECK(result.info.absolute_bound < 1.0);  // 1e-3 of the valid range (about 26), not of 1e37
  CHECK(result.info.has_fill_value);
  CHECK(result.ratio() > 3.0);
}

TEST_CASE_TEMPLATE("codec: invalid bounds are rejected with a clear error", T, float, double) {
  const auto in = to_default_space(smooth<T>(100));
  Kokkos::View<std::byte*, default_memory> out("out", kompress::max_compressed_size(in));
  for (const double bad : {-1e-3, std::numeric_limits<double>::quiet_NaN(),
                           std::numeric_limits<double>::infinity()}) {
    CHECK_THROWS_AS(kompress::compress(in, out, kompress::absolute(bad)), kompress::invalid_argument);
    CHECK_THROWS_AS(kompress::compress(in, out, kompress::relative(bad)), kompress::invalid_argument);
  }
  // The bound as given, not rounded to six decimals ("-0.000000").
  CHECK_THROWS_WITH_AS(kompress::compress(in, out, kompress::absolute(-1e-300)),
                       doctest::Contains("(got -1e-300)"), kompress::invalid_argument);
  CHECK_THROWS_WITH_AS(kompress::compress(in, out, kompress::compress_options{.bound = kompress::absolute(1e-3), .block_size = 48}),
                       doctest::Contains("block size"), kompress::invalid_argument);
  Kokkos::View<std::byte*, default_memory> small("small", 64);
  CHECK_THROWS_WITH_AS(kompress::compress(in, small, kompress::absolute(1e-3)),
                       doctest::Contains("output too small"), kompress::invalid_argument);
}

TEST_CASE("codec: Views of any rank and both contiguous layouts; strided Views are rejected") {
  const default_exec exec;
  Kokkos::View<double**, Kokkos::LayoutLeft, default_memory> left("left", 33, 70);
  Kokkos::View<float***, Kokkos::LayoutRight, default_memory> right("right", 5, 7, 61);
  const auto left_values = Kokkos::create_mirror_view(left);
  const auto right_values = Kokkos::create_mirror_view(right);
  for (std::size_t i = 0; i < left.extent(0); ++i)
    for (std::size_t j = 0; j < left.extent(1); ++j) left_values(i, j) = std::sin(0.1 * double(i)) * double(j);
  for (std::size_t i = 0; i < right.size(); ++i) right_values.data()[i] = float(std::cos(0.01 * double(i)));
  Kokkos::deep_copy(left, left_values);
  Kokkos::deep_copy(right, right_values);

  auto stream = kompress::compress(exec, left, kompress::absolute(1e-4));
  Kokkos::View<double**, Kokkos::LayoutLeft, default_memory> left_back("left_back", 33, 70);
  kompress::decompress(exec, stream, left_back);
  const auto left_decoded = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, left_back);
  for (std::size_t i = 0; i < left.extent(0); ++i)
    for (std::size_t j = 0; j < left.extent(1); ++j)
      REQUIRE(std::fabs(left_values(i, j) - left_decoded(i, j)) <= 1e-4);

  auto right_stream = kompress::compress(exec, right, kompress::absolute(1e-3));
  const auto flat = to_host(kompress::decompress<float>(exec, right_stream));
  REQUIRE(flat.size() == right.size());
  for (std::size_t i = 0; i < right.size(); ++i)
    REQUIRE(std::fabs(double(right_values.data()[i]) - double(flat[i])) <= 1e-3);

  auto strided = Kokkos::subview(left, 3, Kokkos::ALL);  // a row of a LayoutLeft matrix
  Kokkos::View<std::byte*, default_memory> out("out", kompress::max_compressed_size(strided));
  CHECK_THROWS_WITH_AS(kompress::compress(exec, strided, out, kompress::absolute(1e-3)),
                       doctest::Contains("contiguous"), kompress::invalid_argument);

  Kokkos::View<float*, default_memory> wrong_type("wrong", left.size());
  CHECK_THROWS_WITH_AS(kompress::decompress(exec, stream, wrong_type), doctest::Contains("double"),
                       kompress::invalid_argument);
  Kokkos::View<double*, default_memory> wrong_count("wrong", left.size() + 1);
  CHECK_THROWS_WITH_AS(kompress::decompress(exec, stream, wrong_count), doctest::Contains("values"),
                       kompress::invalid_argument);
}

// On the host on purpose: the host backend splits the work by thread count, and runs it on the
// calling thread where the instance has one thread or the kernel one item.
TEST_CASE("codec: the stream, the decoded values and the damage found do not depend on the thread count") {
  // 147 chunks: launched on every instance; 10 chunks: on one thread, run on the calling thread.
  for (const std::size_t count : {std::size_t(300000), std::size_t(20000)}) {
    CAPTURE(count);
    const auto values = smooth<float>(count, 50.0);
    Kokkos::View<const float*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged> in(values.data(), values.size());
    const auto options = kompress::compress_options{.bound = kompress::relative(1e-4)};
    Kokkos::DefaultHostExecutionSpace all;
    const auto reference = kompress::compress(all, in, options);
    Kokkos::View<float*, Kokkos::HostSpace> expected("expected", values.size());
    kompress::decompress(all, reference, expected);
    // One byte three quarters into the stream, in a chunk's data far from the first: its
    // checksum no longer matches, and the error names that chunk.
    const auto damaged = Kokkos::create_mirror(Kokkos::HostSpace{}, reference);
    Kokkos::deep_copy(damaged, reference);
    damaged(reference.size() * 3 / 4) ^= std::byte{0x10};
    std::string reference_damage;
    try {
      Kokkos::View<float*, Kokkos::HostSpace> scratch("scratch", values.size());
      kompress::decompress(all, damaged, scratch);
    } catch (const kompress::format_error& e) {
      reference_damage = e.what();
    }
    REQUIRE(reference_damage.find("checksum mismatch in chunk") != std::string::npos);
    REQUIRE(reference_damage.find("in chunk 0 ") == std::string::npos);

    std::vector<Kokkos::DefaultHostExecutionSpace> instances{all};
    const int threads = all.concurrency();
    if (threads > 1)
      for (const auto& part : Kokkos::Experimental::partition_space(all, 1, threads - 1)) instances.push_back(part);
    for (const auto& exec : instances) {
      CAPTURE(exec.concurrency());
      auto stream = kompress::compress(exec, in, options);
      REQUIRE(stream.size() == reference.size());
      CHECK(std::memcmp(stream.data(), reference.data(), stream.size()) == 0);
      Kokkos::View<float*, Kokkos::HostSpace> decoded("decoded", values.size());
      kompress::decompress(exec, stream, decoded);
      CHECK(std::memcmp(decoded.data(), expected.data(), values.size() * sizeof(float)) == 0);
      CHECK_THROWS_WITH_AS(kompress::decompress(exec, damaged, decoded), reference_damage.c_str(),
                           kompress::format_error);
    }
  }
}

TEST_CASE_TEMPLATE("codec: a value range read beforehand (the collectives' REL pass) gives the same stream", T,
                   float, double) {
  namespace detail = kompress::detail;
  using limits = std::numeric_limits<T>;
  const default_exec exec;
  auto values = smooth<T>(70000, 20.0);
  values[5] = limits::quiet_NaN();
  values[6] = limits::infinity();
  for (std::size_t i = 100; i < 300; ++i) values[i] = T(-999);
  const auto in = to_default_space(values);
  for (const std::optional<double> fill : {std::optional<double>{}, std::optional<double>{-999.0}}) {
    for (const auto codec : {kompress::codec_mode::fast, kompress::codec_mode::ratio}) {
      for (const auto bound : {kompress::relative(1e-3), kompress::absolute(1e-2), kompress::absolute(0.0)}) {
        CAPTURE(fill.has_value());
        CAPTURE(int(codec));
        CAPTURE(bound.value);
        const kompress::compress_options options{.bound = bound, .fill_value = fill, .codec = codec};
        const auto reference = kompress::compress(exec, in, options);
        const auto keys = detail::range_keys(exec, in.data(), in.size(), fill.has_value(),
                                             detail::fill_bits_of<T>(options));
        Kokkos::View<std::byte*, default_memory> out("out", kompress::max_compressed_size<T>(values.size(), options));
        const std::size_t length = detail::compress_known_range(exec, in, out, options, keys);
        REQUIRE(length == reference.size());
        CHECK(stream_bytes(out, length) == to_host(reference));
      }
    }
  }
}

TEST_CASE_TEMPLATE("codec: compress_async writes the bytes compress does, at any output alignment", T,
                   float, double) {
  using limits = std::numeric_limits<T>;
  const default_exec exec;
  auto values = smooth<T>(70000, 3.0);
  values[10] = limits::quiet_NaN();
  values[11] = limits::infinity();
  values[12] = T(-0.0);
  for (std::size_t i = 2048; i < 4096; ++i) values[i] = T(0);  // constant blocks
  const auto all_values = to_default_space(values);
  for (const std::size_t count : {std::size_t(0), std::size_t(1), std::size_t(33), values.size()}) {
    for (const kompress::error_bound bound :
         {kompress::absolute(1e-3), kompress::relative(1e-2), kompress::relative(0.0)}) {
      for (const std::optional<double> fill : {std::optional<double>(), std::optional<double>(3.0)}) {
        CAPTURE(count);
        CAPTURE(bound.value);
        const auto in = Kokkos::subview(all_values, std::pair<std::size_t, std::size_t>(0, count));
        const kompress::compress_options options{.bound = bound, .fill_value = fill};
        const std::size_t worst = kompress::max_compressed_size(in, options);
        Kokkos::View<std::byte*, default_memory> reference("reference", worst);
        const std::size_t length = kompress::compress(exec, in, reference, options);
        const auto expected = stream_bytes(reference, length);
        for (const std::size_t misalignment : {0, 1, 3}) {
          CAPTURE(misalignment);
          Kokkos::View<std::byte*, default_memory> buffer("buffer", worst + misalignment);
          auto out = Kokkos::subview(buffer, std::pair<std::size_t, std::size_t>(misalignment, worst + misalignment));
          Kokkos::View<std::uint64_t, default_memory> async_length("length");
          kompress::compress_async(exec, in, out, options, async_length);
          exec.fence();
          std::uint64_t reported = 0;
          Kokkos::deep_copy(reported, async_length);
          REQUIRE(reported == length);
          CHECK(kompress::inspect(out).compressed_bytes == length);
          CHECK(stream_bytes(out, length) == expected);
        }
      }
    }
  }
}

TEST_CASE("codec: compress_async rejects bad arguments before enqueueing anything") {
  const default_exec exec;
  const auto in = to_default_space(std::vector<float>(1000, 1.5f));
  // Filled through host mirrors, not Kokkos's fill, which nvcc 13 miscompiles without the
  // layout definitions (docs/gpu.md, "nvcc 13 and Kokkos's Views"): the test is about
  // compress_async.
  const auto fill = [](const Kokkos::View<std::byte*, default_memory>& view) {
    const auto host = Kokkos::create_mirror_view(view);
    for (std::size_t i = 0; i < host.size(); ++i) host(i) = std::byte{0x5A};
    Kokkos::deep_copy(view, host);
  };
  Kokkos::View<std::byte*, default_memory> small("small", 100);
  fill(small);
  CHECK_THROWS_WITH_AS(kompress::compress_async(exec, in, small, {.bound = kompress::absolute(1e-3)}),
                       doctest::Contains("output too small"), kompress::invalid_argument);
  Kokkos::View<std::byte*, default_memory> out("out", kompress::max_compressed_size<float>(in.size()));
  fill(out);
  CHECK_THROWS_AS(kompress::compress_async(exec, in, out, {.bound = kompress::absolute(-1.0)}),
                  kompress::invalid_argument);
  exec.fence();
  for (const std::byte b : to_host(small)) REQUIRE(b == std::byte{0x5A});
  for (const std::byte b : to_host(out)) REQUIRE(b == std::byte{0x5A});
}

TEST_CASE("codec: compress_async on two execution space instances at once") {
  const auto in_a = to_default_space(smooth<float>(200000, 10.0)), in_b = to_default_space(smooth<float>(150000, 0.5));
  const kompress::compress_options options{.bound = kompress::relative(1e-3)};
  const default_exec all;
  const auto expect_a = to_host(kompress::compress(all, in_a, options));
  const auto expect_b = to_host(kompress::compress(all, in_b, options));
  const int threads = all.concurrency();
  auto parts = Kokkos::Experimental::partition_space(all, 1, threads > 1 ? threads - 1 : 1);
  Kokkos::View<std::byte*, default_memory> out_a("a", kompress::max_compressed_size(in_a, options)),
      out_b("b", kompress::max_compressed_size(in_b, options));
  Kokkos::View<std::uint64_t, default_memory> length_a("la"), length_b("lb");
  std::thread other([&] { kompress::compress_async(parts[1], in_b, out_b, options, length_b); });
  kompress::compress_async(parts[0], in_a, out_a, options, length_a);
  other.join();
  parts[0].fence();
  parts[1].fence();
  std::uint64_t reported_a = 0, reported_b = 0;
  Kokkos::deep_copy(reported_a, length_a);
  Kokkos::deep_copy(reported_b, length_b);
  REQUIRE(reported_a == expect_a.size());
  REQUIRE(reported_b == expect_b.size());
  CHECK(stream_bytes(out_a, expect_a.size()) == expect_a);
  CHECK(stream_bytes(out_b, expect_b.size()) == expect_b);
}

// --- reproducers: inputs and streams that once broke the codec --------------------------------

namespace {

/// Doubles of magnitude in [2^1000, DBL_MAX], both signs, in runs of 128 whose spread stays
/// within 2^29 quantization steps of a 1e293 bound, so that their blocks are quantized.
std::vector<double> above_2_to_1000(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  const auto uniform = [&] { return double(rng() >> 11) * 0x1p-53; };
  std::vector<double> values(n);
  double center = 0.0;
  for (std::size_t i = 0; i < n; ++i) {
    if (i % 128 == 0)
      center = (rng() & 1 ? 1.0 : -1.0) * std::ldexp(1.0 + uniform(), 1000 + int(rng() % 24));
    const double v = center * (1.0 + 2e-7 * (uniform() - 0.5));
    values[i] = std::fmin(std::fmax(v, -std::numeric_limits<double>::max()),
                          std::numeric_limits<double>::max());
  }
  return values;
}

}  // namespace

// The verification `x - q*s` was contracted into an FMA on the AVX2 + FMA encoder: it tested
// the exact product, while the decoder rounds it (to +Inf next to DBL_MAX). This file is also
// built as codec_adversarial.portable (no run-time dispatch) and, where the CPU has AVX2 + FMA,
// as codec_adversarial.fma (the whole test, decoder included, compiled with -mavx2 -mfma).
TEST_CASE("codec: doubles above 2^1000 under ABS bounds near 1e300 stay within the bound") {
  const double max = std::numeric_limits<double>::max();
  std::vector<double> near_max(32);
  for (std::size_t i = 0; i < near_max.size(); ++i) near_max[i] = max - double(i) * 1e303;
  for (const int block_size : {32, 64, 128}) {
    CAPTURE(block_size);
    auto result = require_round_trip<double>(near_max, {.bound = kompress::absolute(1e300),
                                                        .block_size = block_size});
    CHECK(std::isfinite(result.decoded[0]));
  }
  // Where q * s rounds past DBL_MAX, and across the binades above 2^1000.
  std::mt19937_64 rng(5);
  std::vector<double> values = above_2_to_1000(8192, 1013);
  for (const double step : {1e299, 1e301, 1e303, 1e304})
    for (std::size_t i = 0; i < 2048; ++i)
      values.push_back((i / 32 % 2 ? -1.0 : 1.0) * (max - double(rng() % 4096) * step));
  for (const double bound : {1e293, 1e295, 1e297, 1e299, 1e300, 3e300, 1e301}) {
    for (const int block_size : {32, 64, 128}) {
      CAPTURE(bound);
      CAPTURE(block_size);
      require_round_trip<double>(values, {.bound = kompress::absolute(bound), .block_size = block_size});
    }
  }
}

// max - min overflowed double, and the REL bound became infinite (errors up to 2e4 x the
// promised r * (max - min)). require_round_trip checks the stream's bound against r * (max - min)
// computed in long double.
TEST_CASE_TEMPLATE("codec: REL bounds over ranges that overflow double hold as r x (max - min)", T,
                   float, double) {
  using limits = std::numeric_limits<T>;
  std::vector<T> values(5000);
  for (std::size_t i = 0; i < values.size(); ++i)
    values[i] = T(double(limits::max()) * (0.999 * std::sin(0.01 * double(i)) + 0.0005 * std::cos(1.7 * double(i))));
  values[0] = limits::max();
  values[1] = limits::lowest();
  for (const double r : {1e-1, 1e-3, 1e-6, 1e-9, 1e-12, 1.0, 4.0}) {
    for (const int block_size : {32, 128}) {
      CAPTURE(r);
      CAPTURE(block_size);
      auto result = require_round_trip<T>(values, {.bound = kompress::relative(r), .block_size = block_size});
      CHECK(std::isfinite(result.info.absolute_bound));
    }
  }
}

namespace {

using device_bytes = Kokkos::View<std::byte*, default_memory, Kokkos::MemoryUnmanaged>;
using device_stream = Kokkos::View<const std::byte*, default_memory, Kokkos::MemoryUnmanaged>;
template <class T>
using device_values = Kokkos::View<T*, default_memory, Kokkos::MemoryUnmanaged>;

/// A buffer of `bytes` bytes, 8-aligned, filled with a pattern.
std::vector<std::uint64_t> patterned(std::size_t bytes) {
  std::vector<std::uint64_t> words((bytes + 7) / 8);
  for (std::size_t i = 0; i < words.size(); ++i) words[i] = 0x9E3779B97F4A7C15ull * (i + 1);
  return words;
}

}  // namespace

// Overlapping input and output: compress silently broke the bound, decompress crashed (the
// kernels read the chunk table while overwriting it). Each throws before touching anything.
// The Views alias one buffer of the default memory space.
TEST_CASE_TEMPLATE("codec: overlapping input and output Views are rejected, and nothing is written", T,
                   float, double) {
  const default_exec exec;
  const std::size_t count = 5000;
  const std::size_t worst = kompress::max_compressed_size<T>(count);
  const std::size_t buffer_bytes = worst + count * sizeof(T) + 64;
  const kompress::compress_options options{.bound = kompress::absolute(1e-3)};
  const auto storage = to_default_space(patterned(buffer_bytes));
  auto* const base = reinterpret_cast<std::byte*>(storage.data());
  const auto contents = [&] { return to_host(device_bytes(base, buffer_bytes)); };
  const std::vector<std::byte> before = contents();
  const auto unchanged = [&] { return contents() == before; };
  const auto values_at = [&](std::size_t offset) {
    return device_values<T>(reinterpret_cast<T*>(base + offset), count);
  };
  // The output starting inside the input, the input inside the output, and identical starts.
  for (const std::size_t in_offset : {std::size_t(0), std::size_t(64), count * sizeof(T) - 8}) {
    for (const std::size_t out_offset : {std::size_t(0), std::size_t(64)}) {
      CAPTURE(in_offset);
      CAPTURE(out_offset);
      const auto in = values_at(in_offset);
      const device_bytes out(base + out_offset, worst);
      CHECK_THROWS_WITH_AS(kompress::compress(exec, in, out, options),
                           doctest::Contains("kompress::compress: the input and output Views overlap"),
                           kompress::invalid_argument);
      CHECK_THROWS_WITH_AS(kompress::compress_async(exec, in, out, options),
                           doctest::Contains("kompress::compress_async: the input and output Views overlap"),
                           kompress::invalid_argument);
      exec.fence();
      CHECK(unchanged());
    }
  }
  // Adjacent but disjoint is fine.
  {
    std::vector<T> values(count);
    for (std::size_t i = 0; i < count; ++i) values[i] = T(std::sin(0.01 * double(i)));
    const auto in = values_at(0);
    Kokkos::deep_copy(in, kompress::test::host_unmanaged<const T>(values.data(), count));
    const device_bytes out(base + count * sizeof(T), worst);
    const std::size_t length = kompress::compress(exec, in, out, options);
    // Decompressing a stream over itself, or over part of it, is rejected with the stream intact.
    const std::vector<std::byte> stream = stream_bytes(out, length);
    for (const std::size_t offset : {std::size_t(0), std::size_t(8), length / 2}) {
      CAPTURE(offset);
      const device_values<T> onto(reinterpret_cast<T*>(out.data() + (offset & ~std::size_t(7))), count);
      CHECK_THROWS_WITH_AS(kompress::decompress(exec, device_stream(out.data(), length), onto),
                           doctest::Contains("kompress::decompress: the input and output Views overlap"),
                           kompress::invalid_argument);
      CHECK(stream_bytes(out, length) == stream);
    }
    // The output just before the stream is disjoint: accepted.
    const device_values<T> before_stream(reinterpret_cast<T*>(base), count);
    kompress::decompress(exec, device_stream(out.data(), length), before_stream);
    const auto decoded = to_host(before_stream);
    for (std::size_t i = 0; i < count; ++i) REQUIRE(std::fabs(double(decoded[i]) - double(values[i])) <= 1e-3);
  }
  // The length View of compress_async inside the output or the input is rejected too.
  {
    const auto in = values_at(0);
    const device_bytes out(base + count * sizeof(T) + 8, worst);
    Kokkos::View<std::uint64_t, default_memory, Kokkos::MemoryUnmanaged> length_in_out(
        reinterpret_cast<std::uint64_t*>(out.data() + 16));
    const std::vector<std::byte> snapshot = contents();
    CHECK_THROWS_WITH_AS(kompress::compress_async(exec, in, out, options, length_in_out),
                         doctest::Contains("overlap"), kompress::invalid_argument);
    exec.fence();
    CHECK(contents() == snapshot);
  }
}

namespace {

/// A stream with valid checksums whose header claims `count` values while every chunk is
/// empty: `blocks_per_chunk` 65535 and block size 128 keep the chunk tables small.
std::vector<std::byte> bomb_stream(std::uint64_t count, kompress::element_type type) {
  kompress::detail::stream_header h = kompress::test::crafted_header(count, type);
  h.block_size = 128;
  h.blocks_per_chunk = 65535;
  h.value_max = 1.0;
  return kompress::test::uniform_chunk_stream(h, 0);
}

}  // namespace

// Decompression bombs: a header claiming far more values than its bytes can hold (chunks of 0
// bytes passed the table checks) made the allocating decompress allocate first and fail later
// (4 GiB for a 2 KB stream), or throw Kokkos's allocation error instead of format_error.
TEST_CASE("codec: a stream too short for its element count is rejected before any allocation") {
  const auto check_rejected = [](const std::vector<std::byte>& stream, auto element) {
    using T = decltype(element);
    const auto view = to_default_space(stream);
    CHECK_THROWS_WITH_AS(kompress::inspect(view), doctest::Contains("too short"), kompress::format_error);
    CHECK_THROWS_AS(kompress::decompress<T>(default_exec{}, view), kompress::format_error);
  };
  const auto small = bomb_stream(std::uint64_t(1) << 30, kompress::element_type::float32);
  CHECK(small.size() < 2300);
  check_rejected(small, float{});
  const auto large = bomb_stream(std::uint64_t(1) << 33, kompress::element_type::float64);
  CHECK(large.size() < 17000);
  check_rejected(large, double{});
  // Small counts the same way: a chunk is at least one descriptor byte per block.
  const auto tiny = bomb_stream(1000, kompress::element_type::float32);
  check_rejected(tiny, float{});
}

// --- where the kernels put their working data -------------------------------------------------
// A GPU faults on what a host forgives (an unaligned word, a null team scratch); these check on
// the host the two rules that keep it from happening there.

namespace {
struct elsewhere_space {};
/// An execution space whose memory is not the host's, as Kokkos::Cuda's is not.
struct device_like_exec {
  using memory_space = elsewhere_space;
};
}  // namespace

TEST_CASE_TEMPLATE("kernels: a device's value range waits 4-aligned inside the header, whatever the output's alignment",
                   T, float, double) {
  namespace detail = kompress::detail;
  alignas(16) std::byte header[detail::header_bytes + 16] = {};
  for (std::size_t offset = 0; offset < 16; ++offset) {
    CAPTURE(offset);
    std::byte* const out = header + offset;
    const auto* const device = reinterpret_cast<std::byte*>(detail::range_slot<T, device_like_exec>(out));
    CHECK(reinterpret_cast<std::uintptr_t>(device) % 4 == 0);
    CHECK(device >= out);
    CHECK(device + sizeof(detail::packed_range<T>) <= out + detail::header_bytes);
    // The team compression runs on 8-aligned outputs only, where its counters follow the range.
    if (offset % 8 == 0) CHECK(device == out);
    CHECK(reinterpret_cast<std::byte*>(detail::range_slot<T, Kokkos::DefaultHostExecutionSpace>(out)) == out);
  }
}

TEST_CASE("kernels: team scratch is asked for in whole 16 bytes, so every team's base stays 16-aligned") {
  namespace detail = kompress::detail;
  for (const std::size_t bytes : {std::size_t(1), std::size_t(15), std::size_t(16), std::size_t(17),
                                  sizeof(detail::ratio_scratch)}) {
    CAPTURE(bytes);
    const std::size_t request = detail::team_scratch_request(bytes);
    CHECK(request % 16 == 0);
    CHECK(request >= bytes);
    CHECK(request < bytes + 16);
  }
}

// --- the kernels' backends (kernels/backend/) -------------------------------------------------
// On the host on purpose: these force the host backend's encoders, decoders and worker counts.

namespace {

/// The stream enqueue_compress_kernels writes with `tuning` forced, as compress would set up.
template <class T, int BlockSize>
std::vector<std::byte> compress_with(const std::vector<T>& values, double abs_bound,
                                     const kompress::detail::kernel_tuning& tuning) {
  namespace detail = kompress::detail;
  using host = Kokkos::DefaultHostExecutionSpace;
  detail::stream_header header;
  header.type = detail::element_type_of<T>();
  header.mode = kompress::bound_mode::absolute;
  header.count = values.size();
  header.user_bound = abs_bound;
  header.block_size = BlockSize;
  std::vector<std::byte> out(kompress::max_compressed_size<T>(values.size(), BlockSize));
  detail::enqueue_compress_kernels<T, BlockSize>(host{}, values.data(), out.data(), header,
                                                 nullptr, tuning);
  host{}.fence();
  out.resize(detail::load<std::uint64_t>(out.data() + detail::stream_length_offset));
  return out;
}

/// The values decompress_chunks decodes from `stream` with `tuning` forced, as decompress
/// would set up.
template <class T, int BlockSize>
std::vector<T> decompress_with(const std::vector<std::byte>& stream,
                               const kompress::detail::kernel_tuning& tuning) {
  namespace detail = kompress::detail;
  using host = Kokkos::DefaultHostExecutionSpace;
  const Kokkos::View<const std::byte*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged> in(
      stream.data(), stream.size());
  const detail::stream_header header = detail::read_header(in, "test");
  detail::value_codec<T> codec;
  codec.step = header.quant_step;
  std::vector<T> out(header.count);
  detail::decompress_chunks<T, BlockSize>(host{}, stream.data(), header, codec, out.data(), "test",
                                          tuning);
  return out;
}

}  // namespace

TEST_CASE_TEMPLATE("codec: every encoder, assemble wave count, fused worker count and range segment writes the same bytes, every decoder decodes the same values", T,
                   float, double) {
  namespace detail = kompress::detail;
  // Chunks of very different lengths, so that destinations hit earlier chunks' sources in
  // every way: runs of incompressible, smooth and constant chunks.
  std::mt19937_64 rng(11);
  std::vector<T> values(300000);
  for (std::size_t i = 0; i < values.size(); ++i) {
    const std::size_t run = (i / 2048) % 7;
    if (run == 0 || run == 3) {
      values[i] = T((double(rng() >> 11) * 0x1p-53 - 0.5) * 1e3);
    } else if (run == 5) {
      values[i] = T(2.5);
    } else {
      values[i] = T(100.0 * std::sin(1e-3 * double(i)));
    }
  }
  std::vector<detail::encoder_kind> encoders = {detail::encoder_kind::portable};
  for (const auto kind : {detail::encoder_kind::avx2_fma, detail::encoder_kind::avx512})
    if (detail::host_runs(kind)) encoders.push_back(kind);
  const auto reference_tuning = detail::kernel_tuning{.encoder = detail::encoder_kind::portable,
                                                      .assemble_waves = 0, .team_size = 0};
  for (const double bound : {1e-1, 1e-4, 0.0}) {
    const auto reference = compress_with<T, 32>(values, bound, reference_tuning);
    Kokkos::View<const T*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged> in(values.data(), values.size());
    const auto library = kompress::compress(Kokkos::DefaultHostExecutionSpace{}, in, kompress::absolute(bound));
    REQUIRE(library.size() == reference.size());
    CHECK(std::memcmp(library.data(), reference.data(), reference.size()) == 0);
    for (const auto encoder : encoders) {
      for (const int waves : {0, 1, 2, detail::max_assemble_waves}) {
        for (const std::uint64_t segment : {std::uint64_t(1000), std::uint64_t(4096), std::uint64_t(1) << 20}) {
          CAPTURE(bound);
          CAPTURE(int(encoder));
          CAPTURE(waves);
          CAPTURE(segment);
          const auto stream = compress_with<T, 32>(
              values, bound,
              {.range_segment = segment, .encoder = encoder, .assemble_waves = waves, .team_size = 0});
          REQUIRE(stream.size() == reference.size());
          CHECK(std::memcmp(stream.data(), reference.data(), reference.size()) == 0);
        }
      }
      // The host backend's fused compression, with any number of workers (more than the
      // chunks' 147 included, and more than the threads: a worker only waits for workers that
      // have started, so they need not run at once), and one more than it takes.
      for (const int workers : {1, 2, 3, 4, 5, 8, detail::max_fused_workers, detail::max_fused_workers + 1}) {
        CAPTURE(bound);
        CAPTURE(int(encoder));
        CAPTURE(workers);
        const auto stream = compress_with<T, 32>(values, bound, {.encoder = encoder, .fused_workers = workers, .team_size = 0});
        REQUIRE(stream.size() == reference.size());
        CHECK(std::memcmp(stream.data(), reference.data(), reference.size()) == 0);
      }
    }
    // Fewer chunks than workers, down to one chunk of one value.
    for (const std::size_t count : {std::size_t(1), std::size_t(2047), std::size_t(2049), std::size_t(5000)}) {
      const std::vector<T> head(values.begin(), values.begin() + std::ptrdiff_t(count));
      const auto head_reference = compress_with<T, 32>(head, bound, reference_tuning);
      for (const int workers : {1, 2, 3, 7}) {
        CAPTURE(count);
        CAPTURE(workers);
        const auto stream = compress_with<T, 32>(head, bound, {.encoder = encoders.back(), .fused_workers = workers, .team_size = 0});
        REQUIRE(stream.size() == head_reference.size());
        CHECK(std::memcmp(stream.data(), head_reference.data(), head_reference.size()) == 0);
      }
    }
    // A team per chunk (kernels/team_codec.hpp), with every team size the host can run, here
    // and on the short inputs: the same bytes, and the same values decoded.
    for (const int team_size : {1, 2, 64, -1}) {
      CAPTURE(bound);
      CAPTURE(team_size);
      const auto stream = compress_with<T, 32>(values, bound, {.team_size = team_size});
      REQUIRE(stream.size() == reference.size());
      CHECK(std::memcmp(stream.data(), reference.data(), reference.size()) == 0);
      const auto decoded = decompress_with<T, 32>(reference, {.team_size = team_size});
      const auto portable = decompress_with<T, 32>(reference, {.team_size = 0});
      CHECK(std::memcmp(decoded.data(), portable.data(), values.size() * sizeof(T)) == 0);
      for (const std::size_t count : {std::size_t(1), std::size_t(33), std::size_t(2047), std::size_t(2049), std::size_t(5000)}) {
        CAPTURE(count);
        const std::vector<T> head(values.begin(), values.begin() + std::ptrdiff_t(count));
        const auto head_stream = compress_with<T, 32>(head, bound, {.team_size = team_size});
        const auto head_reference = compress_with<T, 32>(head, bound, reference_tuning);
        REQUIRE(head_stream.size() == head_reference.size());
        CHECK(std::memcmp(head_stream.data(), head_reference.data(), head_reference.size()) == 0);
        const auto head_decoded = decompress_with<T, 32>(head_reference, {.team_size = team_size});
        const auto head_portable = decompress_with<T, 32>(head_reference, reference_tuning);
        CHECK(std::memcmp(head_decoded.data(), head_portable.data(), count * sizeof(T)) == 0);
      }
    }
    // Every decoder gives the same values, bit for bit (and so does the library's choice).
    for (const auto decoder : encoders) {
      CAPTURE(bound);
      CAPTURE(int(decoder));
      const auto decoded = decompress_with<T, 32>(reference, {.decoder = decoder, .team_size = 0});
      std::vector<T> library_decoded(values.size());
      kompress::decompress(Kokkos::DefaultHostExecutionSpace{},
                           Kokkos::View<const std::byte*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>(
                               reference.data(), reference.size()),
                           Kokkos::View<T*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>(
                               library_decoded.data(), library_decoded.size()));
      const auto portable = decompress_with<T, 32>(reference, {.decoder = detail::encoder_kind::portable, .team_size = 0});
      CHECK(std::memcmp(decoded.data(), portable.data(), values.size() * sizeof(T)) == 0);
      CHECK(std::memcmp(library_decoded.data(), portable.data(), values.size() * sizeof(T)) == 0);
    }
    // Block sizes without an AVX2 variant take the portable encoder whatever is asked.
    const auto serial_128 = compress_with<T, 128>(values, bound, reference_tuning);
    const auto parallel_128 = compress_with<T, 128>(
        values, bound,
        {.encoder = encoders.back(), .assemble_waves = detail::max_assemble_waves, .team_size = 0});
    REQUIRE(serial_128.size() == parallel_128.size());
    CHECK(std::memcmp(serial_128.data(), parallel_128.data(), serial_128.size()) == 0);
    const auto team_128 = compress_with<T, 128>(values, bound, {.team_size = -1});
    REQUIRE(team_128.size() == serial_128.size());
    CHECK(std::memcmp(team_128.data(), serial_128.data(), serial_128.size()) == 0);
  }
}

// --- the block codec's uniform-block fast path (codec/block.hpp) ------------------------------

namespace {

/// One block through encode_block with and without the uniform fast path: descriptor, payload,
/// length and the updated base must agree.
template <class T, int BlockSize>
void check_uniform_block(T value, int m, const kompress::detail::value_codec<T>& codec,
                         std::int64_t previous_base) {
  namespace detail = kompress::detail;
  std::vector<T> in(BlockSize, value);
  std::vector<std::byte> fast(BlockSize * sizeof(T) + 8, std::byte{0xA5});
  std::vector<std::byte> general(fast);
  std::int64_t fast_base = previous_base, general_base = previous_base;
  std::uint8_t fast_descriptor = 0, general_descriptor = 0;
  const int fast_bytes = detail::encode_block<T, BlockSize, true>(in.data(), m, 0, codec, fast_base,
                                                                  fast_descriptor, fast.data());
  const int general_bytes = detail::encode_block<T, BlockSize, false>(
      in.data(), m, 0, codec, general_base, general_descriptor, general.data());
  CAPTURE(double(value));
  CAPTURE(m);
  CAPTURE(codec.step);
  CAPTURE(codec.has_fill);
  CAPTURE(previous_base);
  REQUIRE(fast_bytes == general_bytes);
  CHECK(int(fast_descriptor) == int(general_descriptor));
  CHECK(fast_base == general_base);
  CHECK(std::memcmp(fast.data(), general.data(), fast.size()) == 0);
}

template <class T, int BlockSize>
void check_uniform_blocks() {
  namespace detail = kompress::detail;
  using limits = std::numeric_limits<T>;
  const std::vector<T> values = {
      T(0.0), T(-0.0), T(1.0), T(-3.5), T(20.0), T(1e-3), limits::denorm_min(), -limits::denorm_min(),
      limits::min(), limits::max(), limits::lowest(), limits::quiet_NaN(), -limits::quiet_NaN(),
      limits::infinity(), -limits::infinity(), T(1e30), T(-1e30), T(0x1p60), T(9.969209968386869e+36)};
  const std::vector<double> bounds = {0.0, 1e-3, 0.5, 1e-30, 1e-44, 1e30, 1e300};
  for (const double bound : bounds)
    for (const double max_abs : {0.0, 1.0, 1e30, double(limits::max())})
      for (const bool fill : {false, true}) {
        detail::value_codec<T> codec = detail::make_value_codec<T>(bound, max_abs);
        codec.has_fill = fill;
        codec.fill_bits = detail::to_bits(T(9.969209968386869e+36));
        for (const T value : values)
          for (const int m : {1, BlockSize - 1, BlockSize})
            for (const std::int64_t previous : {std::int64_t(0), std::int64_t(-5), std::int64_t(1) << 40,
                                                -(std::int64_t(1) << 49)})
              check_uniform_block<T, BlockSize>(value, m, codec, previous);
      }
  // A uniform block whose value the previous quantized block shares: base length 0, no payload.
  const auto codec = detail::make_value_codec<T>(0.5, 100.0);
  std::int64_t base = std::int64_t(codec.quantize(42.0));
  check_uniform_block<T, BlockSize>(T(42.0), BlockSize, codec, base);
}

}  // namespace

TEST_CASE_TEMPLATE("codec: a block of one repeated value encodes as the general path does", T, float,
                   double) {
  check_uniform_blocks<T, 32>();
  check_uniform_blocks<T, 64>();
  check_uniform_blocks<T, 128>();
}
