// The stash's bounds relative to each group of 256 values (stash_save_options::group_relative):
// every restored value within r 2^k of its group's value range (2^k the largest power of two at
// most it), computed here from the saved values alone, on adversarial and real data, with and
// without sign bits, for both codecs and roundings.
#include <kompress/stash.hpp>

#include "real_data.hpp"
#include "support/stash_views.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace {

using exec_space = Kokkos::DefaultExecutionSpace;
using memory_space = exec_space::memory_space;
using stash_type = kompress::stash<exec_space>;
using kompress::test::to_vector;
using kompress::test::to_view;

constexpr std::size_t group = 256;

/// The bound of each group: r 2^k, k = floor(log2) of the range of its finite values (of its
/// largest magnitude where they are all equal), clamped to [low, high]; every value non-finite
/// or zero: 2^low.
template <class T>
std::vector<double> group_bounds(const std::vector<T>& values, double r) {
  const int low = std::is_same_v<T, float> ? -100 : -1000, high = std::is_same_v<T, float> ? 127 : 1023;
  std::vector<double> bounds;
  for (std::size_t first = 0; first < values.size(); first += group) {
    double lo = INFINITY, hi = -INFINITY, largest = 0.0;
    for (std::size_t i = first; i < std::min(values.size(), first + group); ++i) {
      if (!std::isfinite(values[i])) continue;
      lo = std::min(lo, double(values[i]));
      hi = std::max(hi, double(values[i]));
      largest = std::max(largest, std::fabs(double(values[i])));
    }
    const double range = hi > lo ? hi - lo : largest;
    int k = low;
    if (range >= 0x1p-1022) k = std::isinf(range) ? high : std::ilogb(range);
    bounds.push_back(r * std::ldexp(1.0, std::clamp(k, low, high)));
  }
  return bounds;
}

template <class T>
void require_within_groups(const std::vector<T>& x, const std::vector<T>& back, double r, bool keep_sign) {
  const std::vector<double> bounds = group_bounds(x, r);
  std::size_t violations = 0, flips = 0, first = x.size();
  for (std::size_t i = 0; i < x.size(); ++i) {
    bool ok;
    if (std::isnan(x[i])) ok = std::isnan(back[i]);
    else if (std::isinf(x[i])) ok = back[i] == x[i];
    else ok = std::fabs(double(x[i]) - double(back[i])) <= bounds[i / group];
    if (!ok && violations++ == 0) first = i;
    flips += keep_sign && (x[i] > T(0)) != (back[i] > T(0));
  }
  if (violations)
    FAIL(violations << " values out of their group's bound; first at " << first << ": " << double(x[first])
                    << " -> " << double(back[first]) << ", bound " << bounds[first / group]);
  CHECK(flips == 0);
}

/// Groups at scales from 1e-30 to 1e30 (a ReLU's output in every third: zeros and positive
/// values), with the values that test a scaling's edges: -0.0, NaN, infinities, subnormals,
/// the largest finite values, constant groups and all-zero ones.
template <class T>
std::vector<T> adversarial(std::size_t count, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::uniform_int_distribution<int> scale(-30, 30);
  std::vector<T> values(count);
  for (std::size_t first = 0; first < count; first += group) {
    const std::size_t g = first / group;
    const double s = std::pow(10.0, scale(rng));
    for (std::size_t i = first; i < std::min(count, first + group); ++i) {
      const double v = normal(rng) * s;
      values[i] = g % 3 == 0 ? T(v > 0 ? v : 0.0) : T(v);
    }
    if (g % 11 == 4) std::fill(values.begin() + first, values.begin() + std::min(count, first + group), T(0));
    if (g % 13 == 5) std::fill(values.begin() + first, values.begin() + std::min(count, first + group), T(3.25));
  }
  const T max = std::numeric_limits<T>::max();
  const T specials[] = {T(-0.0), std::numeric_limits<T>::quiet_NaN(), std::numeric_limits<T>::infinity(),
                        -std::numeric_limits<T>::infinity(), std::numeric_limits<T>::denorm_min(),
                        T(4) * std::numeric_limits<T>::denorm_min(), max, -max, T(0.999) * max};
  for (std::size_t j = 0; j < std::size(specials); ++j) values[(37 + 613 * j) % count] = specials[j];
  // A group of subnormals and zeros, and one of the largest finite values.
  for (std::size_t i = 7 * group; i < 8 * group && i < count; ++i)
    values[i] = i % 2 ? T(i % 7) * std::numeric_limits<T>::denorm_min() : T(0);
  for (std::size_t i = 9 * group; i < 10 * group && i < count; ++i) values[i] = i % 3 ? max : T(-0.5) * max;
  return values;
}

kompress::stash_options options(std::size_t budget, std::size_t segment_bytes) {
  return {.budget_bytes = budget, .segment_bytes = segment_bytes};
}

}  // namespace

TEST_CASE_TEMPLATE("stash group_relative: every value within r 2^k of its group's range", T, float, double) {
  const exec_space exec;
  const std::size_t count = 40 * group + 77;  // a last group of 77
  const std::vector<T> x = adversarial<T>(count, 5);
  const auto view = to_view(x);
  // 4 KiB segments cut groups; 1 MiB holds the View whole.
  for (std::size_t segment_bytes : {std::size_t(4) << 10, std::size_t(1) << 20}) {
    stash_type stash(exec, options(std::size_t(8) << 20, segment_bytes));
    for (double r : {1.0 / 3, 0.1, 1e-3, 0x1p-28}) {
      for (bool keep_sign : {false, true}) {
        for (auto codec : {kompress::stash_codec::fast, kompress::stash_codec::ratio}) {
          for (auto rounding : {kompress::rounding_mode::nearest, kompress::rounding_mode::stochastic}) {
            CAPTURE(segment_bytes);
            CAPTURE(r);
            CAPTURE(keep_sign);
            CAPTURE(int(codec));
            CAPTURE(int(rounding));
            const auto handle = stash.save(
                exec, view, kompress::relative(r),
                {.codec = codec, .keep_sign = keep_sign, .rounding = rounding, .group_relative = true});
            const auto info = stash.info(handle);
            CHECK(info.group_relative);
            const std::vector<double> bounds = group_bounds(x, r);
            CHECK(info.absolute_bound == *std::max_element(bounds.begin(), bounds.end()));
            CHECK(info.stored_bytes >= (count + group - 1) / group * 2);  // the exponents are counted
            auto back = stash.restore<Kokkos::View<T*, memory_space>>(exec, handle);
            require_within_groups(x, to_vector(back), r, keep_sign);
            stash.drop(handle);
          }
        }
      }
    }
    CHECK(stash.stats().entries == 0);
  }
}

TEST_CASE("stash group_relative: a ReLU's output with all its values positive or +0, cut into segments") {
  // The positive values are packed and scaled by their groups' exponents, in segments that start
  // anywhere in a group (4 KiB segments, values placed from the sign bits).
  const exec_space exec;
  std::mt19937 rng(3);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::vector<float> x(100 * group + 5);
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double v = normal(rng) * std::pow(2.0, double(int(i / group % 17) - 8));
    x[i] = v > 0 ? float(v) : 0.0f;
  }
  const auto view = to_view(x);
  for (std::size_t segment_bytes : {std::size_t(1) << 10, std::size_t(4) << 10, std::size_t(1) << 20}) {
    stash_type stash(exec, options(std::size_t(8) << 20, segment_bytes));
    for (auto rounding : {kompress::rounding_mode::nearest, kompress::rounding_mode::stochastic}) {
      CAPTURE(segment_bytes);
      const auto handle = stash.save(exec, view, kompress::relative(0.125),
                                     {.keep_sign = true, .rounding = rounding, .group_relative = true});
      const auto info = stash.info(handle);
      CHECK(info.zeros_in_signs > 0);  // the positives-only layout
      auto back = stash.restore<Kokkos::View<float*, memory_space>>(exec, handle);
      require_within_groups(x, to_vector(back), 0.125, true);
      // The groups of small values keep their digits: the View's range would give them all a
      // bound some 2^15 times their own.
      const auto whole = stash.save(exec, view, kompress::relative(0.125), {.keep_sign = true, .rounding = rounding});
      const std::vector<double> bounds = group_bounds(x, 0.125);
      CHECK(stash.info(whole).absolute_bound > 0x1p12 * *std::min_element(bounds.begin(), bounds.end()));
      stash.drop(whole);
      stash.drop(handle);
    }
  }
}

TEST_CASE("stash group_relative: segments stored whole after packed ones start anywhere in a group") {
  // A ReLU's output, mostly positive (packed pieces end where their positive values fill the
  // workspace), with a stretch without zeros past its middle: the segments from there are
  // stored whole, the first of them starting where a packed piece ended.
  const exec_space exec;
  std::mt19937 rng(9);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::vector<float> x(60 * group + 13);
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double v = (normal(rng) + 0.4) * std::pow(2.0, double(int(i / group % 9) - 4));
    x[i] = v > 0 ? float(v) : 0.0f;
  }
  for (std::size_t i = x.size() * 3 / 5; i < x.size() * 3 / 5 + 1000; ++i) x[i] = std::fabs(x[i]) + 0.01f;
  const auto view = to_view(x);
  for (std::size_t segment_bytes : {std::size_t(1) << 10, std::size_t(2) << 10}) {
    stash_type stash(exec, options(std::size_t(8) << 20, segment_bytes));
    for (auto rounding : {kompress::rounding_mode::nearest, kompress::rounding_mode::stochastic}) {
      CAPTURE(segment_bytes);
      const auto handle = stash.save(exec, view, kompress::relative(0.125),
                                     {.keep_sign = true, .rounding = rounding, .group_relative = true});
      const auto info = stash.info(handle);
      CHECK(info.zeros_in_signs > 0);
      CHECK(info.zeros_in_signs < std::size_t(std::count(x.begin(), x.end(), 0.0f)));  // some stored whole
      auto back = stash.restore<Kokkos::View<float*, memory_space>>(exec, handle);
      require_within_groups(x, to_vector(back), 0.125, true);
      stash.drop(handle);
    }
  }
}

TEST_CASE("stash group_relative: every real activation and gradient within its groups' bounds, and smaller") {
  const exec_space exec;
  for (const auto& file : kompress::test::float_data_files()) {
    if (file.family != "activation" || file.dtype != "f32") continue;
    CAPTURE(file.name);
    const std::vector<float> x = kompress::test::read_raw<float>(file.name);
    const auto view = to_view(x);
    stash_type stash(exec, options(std::size_t(64) << 20, std::size_t(64) << 10));
    for (auto codec : {kompress::stash_codec::fast, kompress::stash_codec::ratio}) {
      const bool relu = std::all_of(x.begin(), x.end(), [](float v) { return v >= 0.0f && !std::signbit(v); });
      const auto handle = stash.save(exec, view, kompress::relative(0.1),
                                     {.codec = codec, .keep_sign = relu, .group_relative = true});
      auto back = stash.restore<Kokkos::View<float*, memory_space>>(exec, handle);
      require_within_groups(x, to_vector(back), 0.1, relu);
      const std::string codec_name = codec == kompress::stash_codec::ratio ? "ratio" : "fast";
      MESSAGE(file.name << ", " << codec_name << " codec: " << stash.info(handle).ratio()
                        << "x at a tenth of each group's range");
      stash.drop(handle);
    }
  }
}

TEST_CASE("stash group_relative: asked of an absolute bound, or of a relative one below 2^-28, it is refused") {
  const exec_space exec;
  stash_type stash(exec, options(std::size_t(1) << 20, std::size_t(64) << 10));
  const std::vector<float> x(1000, 1.5f);
  const auto view = to_view(x);
  const kompress::stash_save_options grouped{.group_relative = true};
  CHECK_THROWS_WITH_AS(stash.save(exec, view, kompress::absolute(1e-3), grouped),
                       doctest::Contains("group_relative needs a relative bound"), kompress::invalid_argument);
  CHECK_THROWS_WITH_AS(stash.save_async(exec, view, kompress::relative(1e-9), grouped),
                       doctest::Contains("at least 2^-28"), kompress::invalid_argument);
  CHECK(stash.stats().entries == 0);
  // 0 is lossless: nothing is scaled.
  const auto handle = stash.save(exec, view, kompress::relative(0.0), grouped);
  CHECK_FALSE(stash.info(handle).group_relative);
  auto back = stash.restore<Kokkos::View<float*, memory_space>>(exec, handle);
  CHECK(to_vector(back) == x);
}

TEST_CASE("stash group_relative: save_async saves at once; a pool without room throws and keeps nothing") {
  const exec_space exec;
  std::vector<double> x(5000);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.01 * double(i)) * double(1 + i / group);
  const auto view = to_view(x);
  {
    stash_type stash(exec, options(std::size_t(4) << 20, std::size_t(16) << 10));
    const auto handle = stash.save_async(exec, view, kompress::relative(0.01), {.group_relative = true});
    auto back = stash.restore<Kokkos::View<double*, memory_space>>(exec, handle);
    require_within_groups(x, to_vector(back), 0.01, false);
  }
  // A pool of little more than its workspace: the scaled values of a 16 KiB segment cannot be
  // held beside it.
  stash_type small(exec, options(std::size_t(20) << 10, std::size_t(16) << 10));
  const std::size_t in_use = small.stats().pool_bytes;
  CHECK_THROWS_WITH_AS(small.save(exec, view, kompress::relative(0.01), {.group_relative = true}),
                       doctest::Contains("budget exceeded"), kompress::budget_exceeded);
  CHECK(small.stats().pool_bytes == in_use);
  CHECK(small.stats().entries == 0);
}
