// The stash's per-save options: the sign bits (restored values on their saved side of 0, within
// the bound, wherever the bits are placed) and the codec (asked for, or measured per layer).
#include <kompress/stash.hpp>

#include "support/codec_checks.hpp"
#include "support/stash_views.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <vector>

namespace {

using exec_space = Kokkos::DefaultExecutionSpace;
using memory_space = exec_space::memory_space;
using stash_type = kompress::stash<exec_space>;
using kompress::test::to_vector;
using kompress::test::to_view;

/// Values crowding 0 from both sides at the scale of `bound` (a fraction of the range), with
/// exact zeros, a few -0.0 and large values that set the range; with `special`, NaN and
/// infinities too (which a relative bound leaves out of the range). A block holding -0.0, NaN
/// or an infinity is stored exactly, so they stay rare.
template <class T>
std::vector<T> straddling_zero(std::size_t count, unsigned seed, bool special) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> uniform(-1.0, 1.0);
  std::vector<T> values(count);
  for (std::size_t i = 0; i < count; ++i) {
    const double u = uniform(rng);
    switch (i % 8) {
      case 0: values[i] = T(0); break;
      case 1: values[i] = T(u * 1e-3); break;  // well inside any bound tested here
      case 2: values[i] = T(std::fabs(u) * 2e-2); break;
      case 3: values[i] = i % 4096 == 3 ? T(-0.0) : T(u * 5e-2); break;  // rare: its block is kept exact
      default: values[i] = T(u * 10.0); break;
    }
  }
  if (special && count > 40) {
    values[11] = std::numeric_limits<T>::quiet_NaN();
    values[21] = std::numeric_limits<T>::infinity();
    values[31] = -std::numeric_limits<T>::infinity();
    values[33] = std::numeric_limits<T>::denorm_min();
  }
  return values;
}

template <class T>
std::size_t sign_flips(const std::vector<T>& original, const std::vector<T>& restored) {
  std::size_t flips = 0;
  for (std::size_t i = 0; i < original.size(); ++i) flips += (original[i] > T(0)) != (restored[i] > T(0));
  return flips;
}

template <class T>
void require_within(const std::vector<T>& original, const std::vector<T>& restored, double abs_bound) {
  const auto check = kompress::test::check_bound<T>(std::span<const T>(original), std::span<const T>(restored),
                                                    abs_bound);
  if (check.violations) {
    const std::size_t i = check.first_violation;
    FAIL(check.violations << " values out of bound " << abs_bound << "; first at " << i << ": "
                          << double(original[i]) << " -> " << double(restored[i]));
  }
}

kompress::stash_options options(std::size_t budget, std::size_t segment_bytes) {
  return {.budget_bytes = budget, .segment_bytes = segment_bytes};
}

}  // namespace

TEST_CASE_TEMPLATE("stash keep_sign: x'' > 0 exactly where x > 0, every value within the bound", T, float, double) {
  const exec_space exec;
  // 16 KiB segments: the larger counts span several streams, each with its own sign bits.
  stash_type stash(exec, options(std::size_t(16) << 20, std::size_t(16) << 10));
  for (const auto& bound : {kompress::relative(1e-1), kompress::relative(1e-2), kompress::absolute(0.5),
                            kompress::absolute(1e-4)}) {
    const bool absolute = bound.mode == kompress::bound_mode::absolute;
    for (const std::size_t count : {std::size_t(1), std::size_t(33), std::size_t(4099), std::size_t(100001)}) {
      for (const bool async : {false, true}) {
        CAPTURE(bound.value);
        CAPTURE(count);
        CAPTURE(async);
        const auto values = straddling_zero<T>(count, unsigned(count) + 7, absolute);
        const auto view = to_view(values);
        const kompress::stash_save_options how{.keep_sign = true};
        const auto handle = async ? stash.save_async(exec, view, bound, how) : stash.save(exec, view, bound, how);
        const auto plain = stash.save(exec, view, bound);
        const auto info = stash.info(handle);
        CHECK(info.keeps_sign);
        CHECK_FALSE(stash.info(plain).keeps_sign);
        // One bit per value in 32-bit words (a multiple of 4 of them), and 16 bytes, per stream
        // (16 KiB of values; save_async saves a keep_sign View as save does).
        const std::size_t per_stream = (std::size_t(16) << 10) / sizeof(T);
        std::size_t expected_sign_bytes = 0;
        for (std::size_t first = 0; first < count; first += per_stream)
          expected_sign_bytes += 4 * ((std::min(per_stream, count - first) + 127) / 128 * 4) + 16;
        CHECK(info.sign_bytes == expected_sign_bytes);
        CHECK(info.absolute_bound == doctest::Approx(kompress::test::expected_abs_bound<T>(values, bound)));

        Kokkos::View<T*, memory_space> back("back", count), back_plain("back plain", count);
        stash.restore(exec, handle, back);
        stash.restore_and_drop(exec, plain, back_plain);
        const auto restored = to_vector(back), restored_plain = to_vector(back_plain);
        require_within(values, restored, info.absolute_bound);
        CHECK(sign_flips(values, restored) == 0);
        // Restoring twice gives the same bits (the fix-up is a function of stream and bits).
        stash.restore_and_drop(exec, handle, back);
        CHECK(std::memcmp(to_vector(back).data(), restored.data(), count * sizeof(T)) == 0);
        // The values straddle 0 at the bound's scale: without the bits, some land on the wrong
        // side (the test would not see a missing fix-up otherwise).
        if (count > 1000 && bound.value >= 1e-2) CHECK(sign_flips(values, restored_plain) > 0);
      }
    }
  }
  CHECK(stash.stats().entries == 0);
  CHECK(stash.stats().sign_bytes == 0);
}

TEST_CASE_TEMPLATE("stash keep_sign: positives rounded to 0 come back at their mean, not biased", T, float, double) {
  // ReLU-like: half zeros, the rest exponential, so a loose bound rounds most positives to 0.
  const exec_space exec;
  const std::size_t count = 200000;
  std::mt19937 rng(9);
  std::exponential_distribution<double> exponential(1.0);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  std::vector<T> values(count);
  for (T& v : values) v = uniform(rng) < 0.5 ? T(0) : T(exponential(rng));
  const auto view = to_view(values);
  stash_type stash(exec, options(std::size_t(16) << 20, std::size_t(64) << 10));
  for (const bool async : {false, true}) {
    CAPTURE(async);
    const auto bound = kompress::relative(1e-1);
    const auto handle = async ? stash.save_async(exec, view, bound, {.keep_sign = true})
                              : stash.save(exec, view, bound, {.keep_sign = true});
    const double e = stash.info(handle).absolute_bound;
    Kokkos::View<T*, memory_space> back("back", count);
    stash.restore_and_drop(exec, handle, back);
    const auto restored = to_vector(back);
    require_within(values, restored, e);
    CHECK(sign_flips(values, restored) == 0);
    double original_sum = 0, restored_sum = 0;
    std::size_t small = 0;
    for (std::size_t i = 0; i < count; ++i)
      if (values[i] > T(0) && double(values[i]) <= e) {  // what the quantizer rounds to 0
        original_sum += double(values[i]);
        restored_sum += double(restored[i]);
        ++small;
      }
    REQUIRE(small > count / 10);
    // Their mean survives (a fixed point such as e / 2 would be off by a tenth of e here).
    CHECK(std::fabs(restored_sum - original_sum) / double(small) < 0.02 * e);
  }
}

TEST_CASE_TEMPLATE("stash rounding: stochastic restores are unbiased per feature, within the bound", T, float,
                   double) {
  // 64 features of 4096 samples each (a row per sample), every feature's values close to its
  // own point of [0, 2e] at REL 1e-1 (one large value sets the range, e about 1). Rounding to
  // nearest moves a feature's values together; stochastic rounding leaves each feature's mean.
  const exec_space exec;
  const std::size_t features = 64, samples = 4096, count = features * samples;
  std::mt19937 rng(5);
  std::uniform_real_distribution<double> jitter(-0.02, 0.02);
  std::vector<T> values(count);
  for (std::size_t i = 0; i < count; ++i) {
    const std::size_t feature = i % features;
    values[i] = T(2.0 * (double(feature) + 0.5) / double(features) + jitter(rng));  // 0..2: e is about 1
  }
  values[0] = T(10.0);
  const auto view = to_view(values);
  stash_type stash(exec, options(std::size_t(16) << 20, std::size_t(64) << 10));
  const auto worst_feature_bias = [&](kompress::rounding_mode rounding, bool async, bool keep_sign) {
    const kompress::stash_save_options how{.keep_sign = keep_sign, .rounding = rounding};
    const auto handle = async ? stash.save_async(exec, view, kompress::relative(1e-1), how)
                              : stash.save(exec, view, kompress::relative(1e-1), how);
    CHECK(stash.info(handle).rounding == rounding);
    const double e = stash.info(handle).absolute_bound;
    Kokkos::View<T*, memory_space> back("back", count);
    stash.restore_and_drop(exec, handle, back);
    const auto restored = to_vector(back);
    require_within(values, restored, e);
    if (keep_sign) CHECK(sign_flips(values, restored) == 0);
    std::vector<double> bias(features, 0.0);
    for (std::size_t i = 1; i < count; ++i) bias[i % features] += double(restored[i]) - double(values[i]);
    double worst = 0.0;
    for (double b : bias) worst = std::max(worst, std::fabs(b) / double(samples) / e);
    return worst;
  };
  for (const bool async : {false, true})
    for (const bool keep_sign : {false, true}) {
      CAPTURE(async);
      CAPTURE(keep_sign);
      // To nearest a feature's mean moves by up to half a step, e; stochastically by a few
      // standard errors of its 4096 values (under 0.01 e each).
      CHECK(worst_feature_bias(kompress::rounding_mode::nearest, async, keep_sign) > 0.3);
      CHECK(worst_feature_bias(kompress::rounding_mode::stochastic, async, keep_sign) < 0.05);
    }
}

TEST_CASE("stash rounding: every save draws afresh, and a stash with the same seed repeats them") {
  const exec_space exec;
  std::vector<float> values(50000);
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = float(std::sin(0.001 * double(i)));
  const auto view = to_view(values);
  auto opts = options(std::size_t(16) << 20, std::size_t(16) << 10);  // several streams per save
  opts.codec.rounding = kompress::rounding_mode::stochastic;
  opts.codec.rounding_seed = 99;
  const auto two_saves = [&](const kompress::stash_options& o) {
    stash_type stash(exec, o);
    std::vector<std::vector<float>> restored;
    for (int save = 0; save < 2; ++save) {
      const auto handle = stash.save(exec, view, kompress::absolute(1e-2));
      CHECK(stash.info(handle).rounding == kompress::rounding_mode::stochastic);
      Kokkos::View<float*, memory_space> back("back", values.size());
      stash.restore_and_drop(exec, handle, back);
      restored.push_back(to_vector(back));
      require_within(values, restored.back(), 1e-2);
    }
    return restored;
  };
  const auto first = two_saves(opts);
  CHECK(first[0] != first[1]);
  CHECK(two_saves(opts) == first);
  opts.codec.rounding_seed = 100;
  CHECK(two_saves(opts)[0] != first[0]);
}

/// A ReLU's output: `zeros` of the values +0, the rest exponential (a few below any bound).
template <class T>
std::vector<T> relu_output(std::size_t count, double zeros, unsigned seed) {
  std::mt19937 rng(seed);
  std::exponential_distribution<double> exponential(1.0);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  std::vector<T> values(count);
  for (T& v : values) v = uniform(rng) < zeros ? T(0) : T(exponential(rng));
  return values;
}

TEST_CASE_TEMPLATE("stash keep_sign of values >= 0: the zeros live in the sign bits, the streams hold the rest", T,
                   float, double) {
  const exec_space exec;
  // 16 KiB segments: counts over one span several, each packed on its own.
  stash_type stash(exec, options(std::size_t(16) << 20, std::size_t(16) << 10));
  for (const auto rounding : {kompress::rounding_mode::nearest, kompress::rounding_mode::stochastic}) {
    for (const auto& bound : {kompress::relative(1e-1), kompress::absolute(1e-3), kompress::lossless()}) {
      for (const double zeros : {0.0, 0.3, 0.7, 1.0}) {
        for (const std::size_t count : {std::size_t(1), std::size_t(45), std::size_t(100003)}) {
          for (const bool async : {false, true}) {
            CAPTURE(int(rounding));
            CAPTURE(bound.value);
            CAPTURE(zeros);
            CAPTURE(count);
            CAPTURE(async);
            auto values = relu_output<T>(count, zeros, unsigned(count + 100 * zeros));
            const auto view = to_view(values);
            const kompress::stash_save_options how{.keep_sign = true, .rounding = rounding};
            const auto handle =
                async ? stash.save_async(exec, view, bound, how) : stash.save(exec, view, bound, how);
            const auto info = stash.info(handle);
            const auto zero_count = std::size_t(std::count(values.begin(), values.end(), T(0)));
            CHECK(info.zeros_in_signs == zero_count);
            Kokkos::View<T*, memory_space> back("back", count);
            stash.restore(exec, handle, back);
            const auto restored = to_vector(back);
            require_within(values, restored, info.absolute_bound);
            CHECK(sign_flips(values, restored) == 0);
            std::size_t inexact_zeros = 0;
            for (std::size_t i = 0; i < count; ++i)
              inexact_zeros += values[i] == T(0) && (restored[i] != T(0) || std::signbit(restored[i]));
            CHECK(inexact_zeros == 0);
            stash.restore_and_drop(exec, handle, back);
            CHECK(std::memcmp(to_vector(back).data(), restored.data(), count * sizeof(T)) == 0);

            // The same values with one -0.0 first: stored whole, zeros and all, in more bytes.
            if (count < 1000 || zeros == 0.0) continue;
            values[0] = T(-0.0);
            const auto whole = stash.save(exec, to_view(values), bound, how);
            const auto whole_info = stash.info(whole);
            CHECK(whole_info.zeros_in_signs == 0);
            CHECK(whole_info.stored_bytes > info.stored_bytes);
            stash.restore_and_drop(exec, whole, back);
            const auto restored_whole = to_vector(back);
            require_within(values, restored_whole, whole_info.absolute_bound);
            CHECK(std::signbit(restored_whole[0]));
          }
        }
      }
    }
  }
  CHECK(stash.stats().entries == 0);
  CHECK(stash.stats().pool_bytes == stash.stats().workspace_bytes);
}

TEST_CASE("stash keep_sign of values >= 0: a segment with a negative value, and those after it, are stored whole") {
  const exec_space exec;
  stash_type stash(exec, options(std::size_t(16) << 20, std::size_t(16) << 10));  // 4096 floats a segment
  const std::size_t count = 5 * 4096;
  auto values = relu_output<float>(count, 0.6, 11);  // too few positive values to cut a segment short
  values[2 * 4096 + 17] = -1.0f;                      // segment 2
  values[3 * 4096 + 5] = std::numeric_limits<float>::quiet_NaN();
  values[4 * 4096 + 8] = std::numeric_limits<float>::infinity();
  // An absolute bound packs segments 0 and 1 and finds the negative value in segment 2; a
  // relative one finds it in the View's range, before any segment, and packs none.
  for (const auto& bound : {kompress::absolute(1e-2), kompress::relative(1e-2)}) {
    CAPTURE(int(bound.mode));
    const auto handle = stash.save(exec, to_view(values), bound, {.keep_sign = true});
    const auto info = stash.info(handle);
    const auto zeros_before = std::size_t(std::count(values.begin(), values.begin() + 2 * 4096, 0.0f));
    CHECK(info.zeros_in_signs == (bound.mode == kompress::bound_mode::absolute ? zeros_before : 0));
    CHECK(info.segments == 5);
    Kokkos::View<float*, memory_space> back("back", count);
    stash.restore_and_drop(exec, handle, back);
    const auto restored = to_vector(back);
    require_within(values, restored, info.absolute_bound);
    CHECK(sign_flips(values, restored) == 0);
    CHECK(restored[2 * 4096 + 17] < 0.0f);
    CHECK(std::isnan(restored[3 * 4096 + 5]));
    CHECK(restored[4 * 4096 + 8] == std::numeric_limits<float>::infinity());
  }
}

namespace {

/// A word-by-word mix of the patterns the restore loops tell apart: words with no positive
/// value, with only positive ones, and mixed; set bits whose restored value is a positive
/// value, +0, NaN or below 0 (a block stored as a constant < 0); clear bits whose restored
/// value is above 0, -0.0 or +0. Returns the bits' bytes (pack_signs's layout: the words,
/// then a sum and count of small positives) and, for unpack_positives, the packed values.
struct sign_case {
  std::vector<std::byte> signs;
  std::vector<float> restored;  // apply_signs's input: one value per bit
  std::vector<float> packed;    // unpack_positives's input: one value per set bit
};

sign_case mixed_signs(std::size_t count, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> pick(0, 99);
  std::uniform_real_distribution<float> magnitude(1e-3f, 4.0f);
  sign_case c;
  const std::size_t words = kompress::detail::sign_words(count);
  std::vector<std::uint32_t> bits(words, 0);
  for (std::size_t w = 0; w * 32 < count; ++w) {
    const int kind = pick(rng);  // 10% no positive value, 10% all positive, else mixed
    for (std::size_t b = 0; b < 32 && 32 * w + b < count; ++b) {
      const bool set = kind < 10 ? false : kind < 20 ? true : pick(rng) < 50;
      if (set) bits[w] |= 1u << b;
      const int r = pick(rng);
      float x;
      if (set)
        x = r < 80 ? magnitude(rng) : r < 92 ? 0.0f : r < 94 ? std::numeric_limits<float>::quiet_NaN()
                                                             : -magnitude(rng) * 1e-3f;
      else
        x = r < 85 ? 0.0f : r < 90 ? -0.0f : magnitude(rng) * 1e-3f;
      c.restored.push_back(x);
      if (set) c.packed.push_back(x);
    }
  }
  c.signs.resize(kompress::detail::sign_bytes(count));
  std::memcpy(c.signs.data(), bits.data(), words * sizeof(std::uint32_t));
  const Kokkos::complex<double> small_positives(0.25 * 37, 37.0);  // mean 0.25 of (0, e]
  std::memcpy(c.signs.data() + words * sizeof(std::uint32_t), &small_positives, sizeof(small_positives));
  c.packed.resize(count, 0.0f);  // the workspace holds room for every value
  return c;
}

template <class T>
Kokkos::View<T*, memory_space> device_copy(const std::vector<T>& host) {
  Kokkos::View<T*, memory_space> view("copy", host.size());
  Kokkos::deep_copy(view, Kokkos::View<const T*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>(host.data(), host.size()));
  return view;
}

}  // namespace

TEST_CASE("stash keep_sign: the host's SIMD restore loops write the portable loops' bytes") {
  // On an x86-64 host with AVX2 the restore takes detail::unpack_word_avx2 and apply_signs's
  // loop compiled for AVX2 (stash_tuning::simd_restore); elsewhere both runs below take the
  // portable loops and agree trivially. Either way every value must be what the portable loop
  // writes, bit for bit.
  const exec_space exec;
  for (const std::size_t count : {std::size_t(31), std::size_t(32), std::size_t(1000), std::size_t(65536 + 77)}) {
    for (const bool stochastic : {false, true}) {
      CAPTURE(count);
      CAPTURE(stochastic);
      const sign_case c = mixed_signs(count, unsigned(count) + (stochastic ? 1u : 0u));
      const auto signs = device_copy(c.signs);
      const auto packed = device_copy(c.packed);
      std::vector<float> results[2][2];  // [unpack, apply][portable, simd]
      for (const bool simd : {false, true}) {
        // Every value is written; filled from the host (kompress::test::filled says why).
        const auto out = device_copy(std::vector<float>(count, 1.0f));
        kompress::detail::unpack_positives(exec, signs.data(), packed.data(), out.data(), count, 0.5, stochastic,
                                           simd);
        exec.fence();
        results[0][simd] = to_vector(out);
        const auto values = device_copy(c.restored);
        kompress::detail::apply_signs(exec, signs.data(), values.data(), count, 0.5, stochastic, simd);
        exec.fence();
        results[1][simd] = to_vector(values);
      }
      for (int which = 0; which < 2; ++which) {
        CAPTURE(which);
        CHECK(std::memcmp(results[which][0].data(), results[which][1].data(), count * sizeof(float)) == 0);
        // And what that is: +0 where a bit is clear, above 0 where it is set.
        const auto* words = reinterpret_cast<const std::uint32_t*>(c.signs.data());
        std::size_t wrong = 0;
        for (std::size_t i = 0; i < count; ++i) {
          const bool set = (words[i / 32] >> (i % 32)) & 1u;
          const float x = results[which][1][i];
          wrong += set ? !(x > 0.0f) : (x != 0.0f || std::signbit(x)) && !(which == 1 && x == 0.0f);
        }
        CHECK(wrong == 0);
      }
    }
  }
}

TEST_CASE("stash keep_sign: a stochastic save's sign pass packs the same bits and writes nothing after them") {
  // Also: with the host's AVX2 (where it has it) both passes write the portable loops' bytes.
  // Restore gives a stochastic save's positive values that came back <= 0 the smallest positive
  // value, not the mean of (0, e]: the save packs the bits alone (detail::pack_signs without
  // mean_of_small) and must write the words the full pass writes, and nothing after them: the
  // stash stores its bits without the sum (sign_bytes(count, false)).
  const exec_space exec;
  for (const std::size_t count : {std::size_t(1), std::size_t(31), std::size_t(32), std::size_t(4097)}) {
    CAPTURE(count);
    const auto values = to_view(straddling_zero<float>(count, 7, true));  // NaN and infinities from 41 on
    const std::size_t bytes = kompress::detail::sign_bytes(count);
    // Every word is written, nothing after them. Filled from the host (kompress::test::filled
    // says why).
    Kokkos::View<std::byte*, memory_space> with_mean("with_mean", bytes);
    const auto bits_only = to_view(std::vector<std::byte>(bytes, std::byte{0xA5}));
    for (const bool simd : {false, true}) {  // the host's AVX2 loops write the portable loops' bytes
      CAPTURE(simd);
      Kokkos::View<std::byte*, memory_space> full_simd("full_simd", bytes);
      const auto bits_simd = to_view(std::vector<std::byte>(bytes, std::byte{0xA5}));
      kompress::detail::pack_signs(exec, values.data(), count, with_mean.data(), 0.5, true, false);
      kompress::detail::pack_signs(exec, values.data(), count, full_simd.data(), 0.5, true, simd);
      kompress::detail::pack_signs(exec, values.data(), count, bits_only.data(), 0.5, false, false);
      kompress::detail::pack_signs(exec, values.data(), count, bits_simd.data(), 0.5, false, simd);
      exec.fence();
      CHECK(to_vector(with_mean) == to_vector(full_simd));
      CHECK(to_vector(bits_only) == to_vector(bits_simd));
    }
    const auto full = to_vector(with_mean), bits = to_vector(bits_only);
    const std::size_t word_bytes = kompress::detail::sign_words(count) * sizeof(std::uint32_t);
    CHECK(std::memcmp(full.data(), bits.data(), word_bytes) == 0);
    CHECK(word_bytes == kompress::detail::sign_bytes(count, false));
    CHECK(std::all_of(bits.begin() + std::ptrdiff_t(word_bytes), bits.end(),
                      [](std::byte b) { return b == std::byte{0xA5}; }));
    // The full pass's count of (0, 0.5] is there, so the comparison above compared real bits.
    Kokkos::complex<double> small;
    std::memcpy(&small, full.data() + word_bytes, sizeof(small));
    std::size_t expected = 0, positive = 0;
    const auto host = to_vector(values);
    for (const float x : host) {
      expected += x > 0.0f && x <= 0.5f;
      positive += x > 0.0f;
    }
    CHECK(small.imag() == double(expected));
    if (count >= 32) CHECK(positive > 0);
  }
}

TEST_CASE("stash keep_sign: the host's SIMD packing of positive values writes the portable loop's, and no more") {
  // On an x86-64 host with AVX2 a whole word of bits that is neither full nor empty takes
  // detail::pack_word_avx2; elsewhere both runs take the portable loop. Either way the packed
  // values are the positive ones in order, and nothing past them is written (the workspace
  // holds them at its top: a lane past them would write into the pool).
  const exec_space exec;
  for (const std::size_t count : {std::size_t(31), std::size_t(64), std::size_t(1000), std::size_t(65536 + 77)}) {
    for (const double zeros : {0.05, 0.5, 0.95}) {
      CAPTURE(count);
      CAPTURE(zeros);
      const auto host_values = relu_output<float>(count, zeros, unsigned(count + 1000 * zeros));
      std::vector<float> expected;
      for (const float x : host_values)
        if (x > 0.0f) expected.push_back(x);
      const auto values = to_view(host_values);
      Kokkos::View<std::byte*, memory_space> signs("signs", kompress::detail::sign_bytes(count));
      const auto classified = kompress::detail::classify_signs(exec, values.data(), count, signs.data());
      REQUIRE(classified.count == expected.size());
      CHECK(classified.others_zero);
      {  // the portable loop: the same words and answer
        Kokkos::View<std::byte*, memory_space> portable("portable", kompress::detail::sign_bytes(count));
        const auto again = kompress::detail::classify_signs(exec, values.data(), count, portable.data(), false);
        CHECK(again.count == classified.count);
        CHECK(again.others_zero);
        const std::size_t word_bytes = kompress::detail::sign_words(count) * sizeof(std::uint32_t);
        const auto a = to_vector(signs), b = to_vector(portable);
        CHECK(std::memcmp(a.data(), b.data(), word_bytes) == 0);
      }
      for (const bool simd : {false, true}) {
        CAPTURE(simd);
        const std::size_t room = expected.size() + 64;
        const auto out = to_view(std::vector<float>(room, -7.0f));  // what stays past the packed values
        kompress::detail::pack_positives(exec, values.data(), count, signs.data(), out.data(), simd);
        const auto packed = to_vector(out);
        CHECK(std::memcmp(packed.data(), expected.data(), expected.size() * sizeof(float)) == 0);
        CHECK(std::all_of(packed.begin() + std::ptrdiff_t(expected.size()), packed.end(),
                          [](float x) { return x == -7.0f; }));
      }
    }
  }
}

TEST_CASE("stash keep_sign: a stash with the host's SIMD loops saves and restores the portable loops' bytes") {
  const exec_space exec;
  auto simd = kompress::detail::tuned_stash(exec, options(std::size_t(16) << 20, std::size_t(16) << 10), {});
  auto portable = kompress::detail::tuned_stash(exec, options(std::size_t(16) << 20, std::size_t(16) << 10),
                                                {.simd_restore = false, .simd_save = false});
  const std::size_t count = 100003;
  for (const double zeros : {0.0, 0.5, 0.9}) {
    for (const bool negative : {false, true}) {  // packed positives, or whole streams and the fix-up
      for (const auto rounding : {kompress::rounding_mode::nearest, kompress::rounding_mode::stochastic}) {
        CAPTURE(zeros);
        CAPTURE(negative);
        CAPTURE(int(rounding));
        auto values = negative ? straddling_zero<float>(count, 5, false) : relu_output<float>(count, zeros, 5);
        const auto view = to_view(values);
        const kompress::stash_save_options how{.keep_sign = true, .rounding = rounding};
        Kokkos::View<float*, memory_space> a("a", count), b("b", count);
        simd.restore_and_drop(exec, simd.save(exec, view, kompress::relative(1e-1), how), a);
        portable.restore_and_drop(exec, portable.save(exec, view, kompress::relative(1e-1), how), b);
        const auto from_simd = to_vector(a), from_portable = to_vector(b);
        CHECK(std::memcmp(from_simd.data(), from_portable.data(), count * sizeof(float)) == 0);
        CHECK(sign_flips(values, from_simd) == 0);
      }
    }
  }
}

TEST_CASE("stash keep_sign: the bits are counted, one per value per stream, and freed with the entry") {
  const exec_space exec;
  stash_type stash(exec, options(std::size_t(4) << 20, std::size_t(16) << 10));  // 4096 floats a segment
  const std::size_t count = 10000;  // streams of 4096, 4096 and 1808 values
  const auto values = straddling_zero<float>(count, 3, false);
  const auto view = to_view(values);
  const auto before = stash.stats();
  const auto handle = stash.save(exec, view, kompress::relative(1e-2), {.keep_sign = true});
  const auto info = stash.info(handle);
  CHECK(info.segments == 3);
  CHECK(info.placement.pool_segments == 3);
  CHECK(info.sign_bytes == 4 * (128 + 128 + 60) + 3 * 16);  // words by fours, then sum and count
  const auto during = stash.stats();
  CHECK(during.sign_bytes == info.sign_bytes);
  CHECK(during.stored_bytes == info.stored_bytes);
  CHECK(during.stored_bytes > info.sign_bytes);
  CHECK(during.pool_bytes > before.pool_bytes + info.stored_bytes - 1);
  stash.drop(handle);
  const auto after = stash.stats();
  CHECK(after.sign_bytes == 0);
  CHECK(after.stored_bytes == 0);
  CHECK(after.pool_bytes == before.pool_bytes);
}

TEST_CASE("stash keep_sign: bits spilled to host memory restore the same; bits that fit nowhere throw") {
  const exec_space exec;
  const std::size_t count = std::size_t(1) << 20;
  // Constant blocks, tiny streams, full-size bits; one negative value, so that the zeros are
  // stored in the streams (values >= 0 would be stored as their sign bits alone).
  std::vector<float> zeros(count, 0.0f);
  zeros[0] = -1e-4f;
  const auto view = to_view(zeros);
  const auto bound = kompress::absolute(1e-3);
  // 16 KiB segments: 256 streams of a few dozen bytes (aligned to 16) and 256 x 512 bytes of bits.
  auto o = options(0, std::size_t(16) << 10);
  {
    stash_type probe(exec, options(std::size_t(8) << 20, std::size_t(16) << 10));
    (void)probe.save(exec, view, bound);
    o.budget_bytes = probe.stats().pool_bytes + (std::size_t(48) << 10);  // the streams, a third of the bits
  }
  SUBCASE("throw_error: budget_exceeded names the sign bits, and the stash is unchanged") {
    // Whether the pool runs out in a stream's place or in its bits' depends on their sizes; of
    // budgets 16 bytes apart over one piece's span, most run out in the bits'. Every failure
    // leaves the stash as it was.
    bool named_the_bits = false;
    for (std::size_t extra = 0; extra < 1024 && !named_the_bits; extra += 16) {
      CAPTURE(extra);
      auto budget = o;
      budget.budget_bytes += extra;
      stash_type stash(exec, budget);
      const auto before = stash.stats();
      try {
        (void)stash.save(exec, view, bound, {.keep_sign = true});
        FAIL("the save fitted");
      } catch (const kompress::budget_exceeded& e) {
        named_the_bits = std::string(e.what()).find("a range of sign bits") != std::string::npos;
      }
      const auto after = stash.stats();
      CHECK(after.entries == 0);
      CHECK(after.pool_bytes == before.pool_bytes);
      CHECK(after.sign_bytes == 0);
    }
    CHECK(named_the_bits);
  }
  SUBCASE("spill_to_host: the bits that do not fit go to host memory") {
    o.policy = kompress::budget_policy::spill_to_host();
    stash_type stash(exec, o);
    std::vector<float> values = zeros;
    for (std::size_t i = 0; i < count; i += 3) values[i] = 1e-4f;  // positive, below the bound
    const auto small_positives = to_view(values);
    const auto handle = stash.save(exec, small_positives, bound, {.keep_sign = true});
    CHECK(stash.stats().spilled_segments > 0);
    CHECK(stash.stats().host_spilled_bytes > 0);
    Kokkos::View<float*, memory_space> back("back", count);
    stash.restore_and_drop(exec, handle, back);
    const auto restored = to_vector(back);
    require_within(values, restored, 1e-3);
    CHECK(sign_flips(values, restored) == 0);
  }
}

TEST_CASE("stash codec: asked for, or measured on the first segment and remembered per layer") {
  const exec_space exec;
  const std::size_t count = 50000;
  const auto bound = kompress::relative(1e-3);
  // A smooth field (the ratio codec's predictor wins by far) and white noise (nothing to win).
  std::vector<float> smooth(count), noise(count);
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  for (std::size_t i = 0; i < count; ++i) {
    smooth[i] = float(std::sin(double(i) * 1e-3) + 0.3 * std::sin(double(i) * 7e-3));
    noise[i] = uniform(rng);
  }
  const auto smooth_view = to_view(smooth), noise_view = to_view(noise);
  auto o = options(std::size_t(8) << 20, std::size_t(64) << 10);
  o.codec_remeasure_saves = 3;

  // The rule, from the codec's own lengths on the first segment (16384 floats): the data must
  // land on both sides of it, or the choices below would not show it is applied.
  const auto first_segment_length = [&](const Kokkos::View<float*, memory_space>& v, kompress::codec_mode mode) {
    const auto sample = Kokkos::subview(v, std::pair<std::size_t, std::size_t>(0, 16384));
    return double(kompress::compress(exec, sample, kompress::compress_options{.bound = bound, .codec = mode}).size());
  };
  const auto rule = [&](const Kokkos::View<float*, memory_space>& v) {
    const double ratio = first_segment_length(v, kompress::codec_mode::ratio);
    const double fast = first_segment_length(v, kompress::codec_mode::fast);
    return ratio <= 0.8 * fast ? kompress::codec_mode::ratio : kompress::codec_mode::fast;
  };
  REQUIRE(rule(smooth_view) == kompress::codec_mode::ratio);
  REQUIRE(rule(noise_view) == kompress::codec_mode::fast);

  stash_type stash(exec, o);
  const kompress::stash_save_options smooth_layer{.codec = kompress::stash_codec::automatic, .layer = 1};
  const kompress::stash_save_options noise_layer{.codec = kompress::stash_codec::automatic, .layer = 2};
  std::vector<kompress::stash_handle> handles;
  handles.push_back(stash.save(exec, smooth_view, bound, smooth_layer));
  CHECK(stash.stats().codec_measurements == 1);
  handles.push_back(stash.save(exec, noise_view, bound, noise_layer));
  CHECK(stash.stats().codec_measurements == 2);
  handles.push_back(stash.save_async(exec, smooth_view, bound, smooth_layer));  // remembered
  handles.push_back(stash.save(exec, smooth_view, bound, smooth_layer));
  CHECK(stash.stats().codec_measurements == 2);
  handles.push_back(stash.save(exec, smooth_view, bound, smooth_layer));  // 3 saves on: measured again
  CHECK(stash.stats().codec_measurements == 3);
  handles.push_back(stash.save(exec, noise_view, bound, {.codec = kompress::stash_codec::automatic}));  // no layer
  handles.push_back(stash.save(exec, noise_view, bound, {.codec = kompress::stash_codec::automatic}));
  CHECK(stash.stats().codec_measurements == 5);
  handles.push_back(stash.save(exec, noise_view, bound, {.codec = kompress::stash_codec::ratio}));
  handles.push_back(stash.save(exec, smooth_view, bound));  // the stash's codec: fast
  CHECK(stash.stats().codec_measurements == 5);

  const std::vector<kompress::codec_mode> expected = {
      kompress::codec_mode::ratio, kompress::codec_mode::fast, kompress::codec_mode::ratio,
      kompress::codec_mode::ratio, kompress::codec_mode::ratio, kompress::codec_mode::fast,
      kompress::codec_mode::fast,  kompress::codec_mode::ratio, kompress::codec_mode::fast};
  REQUIRE(handles.size() == expected.size());
  std::uint64_t ratio_saves = 0;
  for (std::size_t i = 0; i < handles.size(); ++i) {
    CAPTURE(i);
    CHECK(stash.info(handles[i]).codec == expected[i]);
    ratio_saves += expected[i] == kompress::codec_mode::ratio;
  }
  CHECK(stash.stats().ratio_codec_saves == ratio_saves);
  // The ratio codec's smooth entry is the shorter, and both restore within the bound.
  CHECK(stash.info(handles[0]).stored_bytes < stash.info(handles.back()).stored_bytes);
  for (std::size_t i = 0; i < handles.size(); ++i) {
    const bool is_smooth = i == 0 || (i >= 2 && i <= 4) || i == 8;
    Kokkos::View<float*, memory_space> back("back", count);
    stash.restore_and_drop(exec, handles[i], back);
    const auto& original = is_smooth ? smooth : noise;
    require_within(original, to_vector(back), kompress::test::expected_abs_bound<float>(original, bound));
  }
}

TEST_CASE("stash codec: options out of range are rejected when the stash is made") {
  const exec_space exec;
  for (const double saving : {-0.1, 1.0, std::nan("")}) {
    auto o = options(std::size_t(1) << 20, std::size_t(16) << 10);
    o.ratio_codec_min_saving = saving;
    CHECK_THROWS_WITH_AS(stash_type(exec, o), doctest::Contains("ratio_codec_min_saving"),
                         kompress::invalid_argument);
  }
  auto o = options(std::size_t(1) << 20, std::size_t(16) << 10);
  o.codec_remeasure_saves = 0;
  CHECK_THROWS_WITH_AS(stash_type(exec, o), doctest::Contains("codec_remeasure_saves"), kompress::invalid_argument);
}

TEST_CASE("stash: a forward pass fits in a pool of the peak it reported, and stores the same there") {
  // peak_pool_bytes is the budget a run needs: the worst-case ranges a save borrows while it
  // compresses in place are ones the workspace could have served, and a packed segment with
  // more positive values than fit beside their stream's worst case in the workspace (the 30%
  // zeros below) is cut short (16 KiB segments) or, where even 128 values hold too many
  // (512-byte segments), written into a reservation that counts while it is held.
  const exec_space exec;
  for (const std::size_t segment : {std::size_t(16) << 10, std::size_t(512)}) {
    const std::size_t count = segment / sizeof(float) * 25 - (segment > 512 ? 1000 : 0);  // about 25 segments
    std::vector<std::vector<float>> layers{straddling_zero<float>(count / 2, 5, false)};
    for (const double zeros : {0.75, 0.5, 0.3})
      layers.push_back(relu_output<float>(count, zeros, unsigned(10 * zeros)));
    for (const bool keep_sign : {true, false}) {
      for (const auto rounding : {kompress::rounding_mode::nearest, kompress::rounding_mode::stochastic}) {
        CAPTURE(segment);
        CAPTURE(keep_sign);
        CAPTURE(int(rounding));
        const kompress::stash_save_options how{.keep_sign = keep_sign, .rounding = rounding};
        std::size_t last_segments = 0;
        const auto forward = [&](std::size_t budget) {
          stash_type stash(exec, options(budget, segment));
          std::vector<std::size_t> zeros_in_signs;
          for (const auto& values : layers) {
            const auto info = stash.info(stash.save(exec, to_view(values), kompress::relative(5e-2), how));
            zeros_in_signs.push_back(info.zeros_in_signs);
            last_segments = info.segments;
          }
          return std::pair{stash.stats(), zeros_in_signs};
        };
        const auto [roomy, roomy_zeros] = forward(std::size_t(16) << 20);
        if (keep_sign && segment > 512) CHECK(last_segments > 25);  // the 70% positive layer, cut short
        const auto [tight, tight_zeros] = forward(roomy.peak_pool_bytes);
        CHECK(tight.spilled_segments == 0);
        CHECK(tight_zeros == roomy_zeros);
        CHECK(tight.stored_bytes == roomy.stored_bytes);
        CHECK(tight.peak_pool_bytes == roomy.peak_pool_bytes);
        if (keep_sign) CHECK(roomy_zeros[3] > 0);  // ... and packed
      }
    }
  }
}
