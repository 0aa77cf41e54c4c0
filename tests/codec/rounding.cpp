// Stochastic rounding (docs/error-bound.md, "Stochastic rounding"): every value within the bound
// on the adversarial shapes and both codecs, unbiased where rounding to nearest is not, the
// same bytes for the same seed on every build of the encoder (golden checksums), other bytes
// for another seed, and the step half as large.

#include "support/codec_checks.hpp"

#include <kompress/detail/checksum.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <span>
#include <vector>

namespace {

using kompress::test::require_round_trip;
using kompress::test::round_trip;
constexpr auto fast = kompress::codec_mode::fast;
constexpr auto ratio = kompress::codec_mode::ratio;
constexpr auto stochastic = kompress::rounding_mode::stochastic;

/// Arrays with the shapes the codec treats specially: lengths around blocks and chunks,
/// specials, constants, zeros, a wide magnitude range, and values on and off the grid.
template <class T>
std::vector<std::vector<T>> cases() {
  std::mt19937_64 random(7);
  std::uniform_real_distribution<double> unit(-1.0, 1.0);
  std::vector<std::vector<T>> all;
  for (std::size_t n : {1u, 31u, 33u, 64u, 127u, 4095u, 4097u, 9000u}) {
    std::vector<T> v(n);
    for (auto& x : v) x = T(unit(random) * 100.0);
    all.push_back(v);
  }
  std::vector<T> mixed(5000);
  for (std::size_t i = 0; i < mixed.size(); ++i) {
    const double x = unit(random);
    mixed[i] = T(i % 97 == 0 ? 0.0 : x * std::pow(10.0, double(i % 13) - 6.0));
  }
  mixed[10] = std::numeric_limits<T>::quiet_NaN();
  mixed[500] = std::numeric_limits<T>::infinity();
  mixed[501] = -std::numeric_limits<T>::infinity();
  mixed[2000] = T(-0.0);
  mixed[3000] = std::numeric_limits<T>::max();
  mixed[3001] = std::numeric_limits<T>::lowest();
  mixed[3002] = std::numeric_limits<T>::denorm_min();
  all.push_back(mixed);
  std::vector<T> relu(6000);  // half zeros, half small positives: activations after a ReLU
  for (std::size_t i = 0; i < relu.size(); ++i) relu[i] = T(i % 2 ? std::fabs(unit(random)) : 0.0);
  all.push_back(relu);
  all.push_back(std::vector<T>(5000, T(0.3)));  // a constant: dithered value by value
  all.push_back(std::vector<T>(300, T(0.0)));
  return all;
}

template <class T>
void check_bounds() {
  for (const auto& values : cases<T>())
    for (auto codec : {fast, ratio})
      for (auto bound : {kompress::absolute(1e-1), kompress::absolute(1e-4), kompress::relative(1e-1),
                         kompress::relative(1e-2), kompress::relative(1e-6)})
        for (std::uint64_t seed : {0ull, 1ull, 0xFFFFFFFF00000001ull}) {
          CAPTURE(values.size());
          CAPTURE(int(codec));
          CAPTURE(bound.value);
          CAPTURE(seed);
          require_round_trip<T>(values,
                                {.bound = bound, .codec = codec, .rounding = stochastic, .rounding_seed = seed});
          require_round_trip<T>(values, {.bound = bound, .fill_value = 0.3, .codec = codec, .rounding = stochastic,
                                         .rounding_seed = seed});
        }
}

TEST_CASE("stochastic rounding: every value within the bound, float and double, both codecs") {
  check_bounds<float>();
  check_bounds<double>();
}

/// Values all below the step: to nearest they all round to 0, stochastically each goes up
/// with probability x / step.
template <class T>
void check_unbiased(kompress::codec_mode codec) {
  constexpr double e = 1e-2;
  std::mt19937_64 random(11);
  std::uniform_real_distribution<double> below(0.0, 0.4 * e);
  std::vector<T> values(1 << 20);
  for (auto& x : values) x = T(below(random));
  const auto mean_error = [&](kompress::rounding_mode rounding) {
    const auto result = require_round_trip<T>(values, {.bound = kompress::absolute(e), .codec = codec,
                                                       .rounding = rounding, .rounding_seed = 5});
    double sum = 0.0;
    for (std::size_t i = 0; i < values.size(); ++i) sum += double(result.decoded[i]) - double(values[i]);
    return sum / double(values.size());
  };
  // Nearest: every value to 0, a mean error of -0.2 e. Stochastic: within a few standard
  // errors (at most e / 2 / sqrt(2^20), under 5e-4 e) of 0.
  CHECK(mean_error(kompress::rounding_mode::nearest) < -0.19 * e);
  CHECK(std::fabs(mean_error(stochastic)) < 3e-3 * e);
}

TEST_CASE("stochastic rounding: unbiased where rounding to nearest is not") {
  for (auto codec : {fast, ratio}) {
    CAPTURE(int(codec));
    check_unbiased<float>(codec);
    check_unbiased<double>(codec);
  }
}

TEST_CASE("stochastic rounding: equal neighbours round on their own, both ways") {
  // 0.3 e with step e: about 30% of the values go up to e, the rest to 0. (Neighbours one ulp
  // apart: a block of one value is smaller as its exact constant, which is exact.)
  constexpr double e = 1.0;
  std::vector<float> values(4096 * 4);
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = i % 2 ? 0.3f : std::nextafter(0.3f, 1.0f);
  for (auto codec : {fast, ratio}) {
    const auto result =
        require_round_trip<float>(values, {.bound = kompress::absolute(e), .codec = codec, .rounding = stochastic});
    std::size_t up = 0;
    for (float y : result.decoded) up += y > 0.5f;
    CHECK(double(up) / double(values.size()) == doctest::Approx(0.3).epsilon(0.05));
  }
  // A block of one value is stored as that value.
  const std::vector<float> constant(4096, 0.3f);
  CHECK(require_round_trip<float>(constant, {.bound = kompress::absolute(e), .rounding = stochastic}).decoded ==
        constant);
}

TEST_CASE("stochastic rounding: the step is the bound, and the stream decodes without the seed") {
  std::vector<double> values(10000);
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = std::sin(0.001 * double(i));
  for (auto codec : {fast, ratio}) {
    const auto nearest = round_trip<double>(values, {.bound = kompress::absolute(1e-3), .codec = codec});
    const auto dithered =
        round_trip<double>(values, {.bound = kompress::absolute(1e-3), .codec = codec, .rounding = stochastic});
    CHECK(nearest.info.quantization_step == doctest::Approx(2e-3).epsilon(1e-9));
    CHECK(dithered.info.quantization_step == doctest::Approx(1e-3).epsilon(1e-9));
    CHECK(dithered.info.absolute_bound == 1e-3);
    // One bit more per code, give or take the blocks' headers.
    CHECK(dithered.stream.size() > nearest.stream.size());
  }
}

TEST_CASE("stochastic rounding: the seed decides the bytes; both codecs pick the same codes") {
  std::vector<float> values(20000);
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = float(std::sin(0.01 * double(i)) * 10.0);
  const kompress::compress_options options{.bound = kompress::absolute(1e-2), .rounding = stochastic,
                                            .rounding_seed = 42};
  const auto first = round_trip<float>(values, options);
  CHECK(round_trip<float>(values, options).stream == first.stream);
  auto other_seed = options;
  other_seed.rounding_seed = 43;
  const auto second = round_trip<float>(values, other_seed);
  CHECK(second.stream != first.stream);
  std::size_t differ = 0;
  for (std::size_t i = 0; i < values.size(); ++i) differ += first.decoded[i] != second.decoded[i];
  CHECK(differ > values.size() / 10);
  auto as_ratio = options;
  as_ratio.codec = ratio;
  CHECK(round_trip<float>(values, as_ratio).decoded == first.decoded);
}

TEST_CASE("stochastic rounding: golden streams") {
  // The same bytes from the run-time encoder, the portable one, the AVX2 + FMA build and the
  // team kernel (this file is built as each): the dither is integer arithmetic on the index.
  std::vector<float> f(9000);
  std::vector<double> d(9000);
  for (std::size_t i = 0; i < f.size(); ++i) {
    f[i] = float(std::sin(0.01 * double(i)) * 100.0 + double(i % 7));
    d[i] = std::cos(0.003 * double(i)) * 1e5 + double(i % 13) * 0.25;
  }
  const auto checksum = [](const std::vector<std::byte>& s) {
    return kompress::detail::checksum_of(s.data(), s.size());
  };
  const auto fs =
      round_trip<float>(f, {.bound = kompress::relative(1e-3), .rounding = stochastic, .rounding_seed = 3}).stream;
  const auto ds =
      round_trip<double>(d, {.bound = kompress::absolute(1e-2), .rounding = stochastic, .rounding_seed = 3}).stream;
  const auto fr = round_trip<float>(f, {.bound = kompress::relative(1e-3), .codec = ratio, .rounding = stochastic,
                                        .rounding_seed = 3})
                      .stream;
  MESSAGE("golden stochastic: fast float " << checksum(fs) << ", fast double " << checksum(ds) << ", ratio float "
                                           << checksum(fr));
  CHECK(checksum(fs) == 11628220907054913035ull);
  CHECK(checksum(ds) == 16694439938633200687ull);
  CHECK(checksum(fr) == 10259566909691681510ull);  // format 1.2 (1.1 wrote 13369140811187037454)
}

TEST_CASE("stochastic rounding: an unknown rounding mode is refused") {
  const std::vector<float> values(10, 1.0f);
  kompress::compress_options options{.bound = kompress::absolute(1e-2)};
  options.rounding = static_cast<kompress::rounding_mode>(7);
  CHECK_THROWS_AS(round_trip<float>(values, options), kompress::invalid_argument);
}

}  // namespace
