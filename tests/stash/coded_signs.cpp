// The sign bits of packed segments coded by their rare value's gaps (detail/sign_code.hpp):
// decoding gives back every bit and the sum after them exactly, at every density and length,
// in fewer bytes where one value is rare; codes that are not the encoder's never make decoding
// write outside its range; and a stash that codes its bits restores the bytes of one that does
// not, in fewer stored bytes.
#include <kompress/stash.hpp>

#include "support/stash_views.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

namespace {

using exec_space = Kokkos::DefaultExecutionSpace;
using memory_space = exec_space::memory_space;
using stash_type = kompress::stash<exec_space>;
using kompress::test::to_vector;
using kompress::test::to_view;
namespace detail = kompress::detail;

/// sign_bits.hpp's layout of `count` bits, bit i set with probability `density` (in runs of
/// `run` equal bits), then 16 bytes standing for the sum and count of (0, e].
std::vector<std::byte> raw_bits(std::size_t count, double density, std::size_t run, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  std::vector<std::byte> bytes(detail::sign_bytes(count), std::byte{0});
  auto* const words = reinterpret_cast<std::uint32_t*>(bytes.data());
  bool set = false;
  for (std::size_t i = 0; i < count; ++i) {
    if (i % run == 0) set = uniform(rng) < density;
    if (set) words[i / 32] |= std::uint32_t(1) << (i % 32);
  }
  for (std::size_t i = detail::sign_words(count) * 4; i < bytes.size(); ++i) bytes[i] = std::byte(rng());
  return bytes;
}

std::size_t set_bits(const std::vector<std::byte>& bytes, std::size_t count) {
  std::size_t set = 0;
  for (std::size_t i = 0; i < count; ++i) set += (std::uint8_t(bytes[i / 8]) >> (i % 8)) & 1u;
  return set;
}

/// Codes `raw` and decodes the codes; returns the coded length (0: kept as it was) and checks
/// that what decoding wrote is `raw`, and that nothing after it changed.
std::size_t round_trip(const std::vector<std::byte>& raw, std::size_t count) {
  const exec_space exec;
  const auto plan = detail::plan_sign_code(count, set_bits(raw, count));
  const auto from = to_view(raw);
  Kokkos::View<std::byte*, memory_space> coded("coded", detail::sign_bytes(count));
  const std::size_t length = detail::encode_sign_bits(exec, from.data(), count, plan, coded.data());
  if (length == 0) return 0;
  CHECK(length < raw.size());
  constexpr std::size_t guard = 64;
  std::vector<std::byte> filled(raw.size() + guard, std::byte{0xA5});
  const auto out = to_view(filled);
  detail::decode_sign_bits(exec, coded.data(), count, out.data());
  exec.fence();
  const auto back = to_vector(out);
  CHECK(std::memcmp(back.data(), raw.data(), raw.size()) == 0);
  CHECK(std::all_of(back.begin() + std::ptrdiff_t(raw.size()), back.end(),
                    [](std::byte b) { return b == std::byte{0xA5}; }));
  // Without the sum (a stochastic save's bits): 16 bytes shorter, and zeros stand for it.
  const auto plan_without = detail::plan_sign_code(count, set_bits(raw, count), false);
  if (plan.estimate_bytes != std::size_t(-1)) CHECK(plan_without.estimate_bytes + 16 == plan.estimate_bytes);
  const std::size_t without = detail::encode_sign_bits(exec, from.data(), count, plan, coded.data(), false);
  if (without != 0) {
    CHECK(without + 16 == length);
    const auto out_without = to_view(filled);
    detail::decode_sign_bits(exec, coded.data(), count, out_without.data(), false);
    exec.fence();
    const auto words = to_vector(out_without);
    const std::size_t word_bytes = detail::sign_bytes(count, false);
    CHECK(std::memcmp(words.data(), raw.data(), word_bytes) == 0);
    CHECK(std::all_of(words.begin() + std::ptrdiff_t(word_bytes), words.begin() + std::ptrdiff_t(raw.size()),
                      [](std::byte b) { return b == std::byte{0}; }));
  }
  return length;
}

}  // namespace

TEST_CASE("coded sign bits: every bit and the sum come back, at every density and length") {
  for (const std::size_t count : {std::size_t(1), std::size_t(31), std::size_t(32), std::size_t(33),
                                  std::size_t(4095), std::size_t(4096), std::size_t(4097), std::size_t(100003)}) {
    for (const double density : {0.0, 1e-4, 0.01, 0.13, 0.2, 0.5, 0.8, 0.87, 0.99, 1.0}) {
      for (const std::size_t run : {std::size_t(1), std::size_t(7), std::size_t(300)}) {
        CAPTURE(count);
        CAPTURE(density);
        CAPTURE(run);
        const auto raw = raw_bits(count, density, run, unsigned(count * 7 + run + 1000 * density));
        const std::size_t length = round_trip(raw, count);
        // One value rare enough: coded, within 10% of what the plan expected.
        if (count >= 4096 && run == 1 && (density <= 0.13 || density >= 0.87)) {
          const auto plan = detail::plan_sign_code(count, set_bits(raw, count));
          REQUIRE(length > 0);
          CHECK(double(length) < 0.7 * double(raw.size()));
          CHECK(double(length) < 1.1 * double(plan.estimate_bytes));
        }
      }
    }
  }
}

TEST_CASE("coded sign bits: the plan codes the rare value, near the entropy of the bits") {
  const std::size_t count = 1 << 20;
  for (const double density : {0.02, 0.13, 0.2, 0.8, 0.87, 0.98}) {
    CAPTURE(density);
    const auto raw = raw_bits(count, density, 1, 7);
    const std::size_t positives = set_bits(raw, count);
    const auto plan = detail::plan_sign_code(count, positives);
    CHECK(plan.rare_set == (density < 0.5));
    CHECK(plan.rare == (plan.rare_set ? positives : count - positives));
    const std::size_t length = round_trip(raw, count);
    const double d = std::min(density, 1 - density);
    const double entropy_bytes = double(count) / 8 * -(d * std::log2(d) + (1 - d) * std::log2(1 - d));
    CHECK(double(length) > entropy_bytes);
    // Rice codes' excess over the entropy, then per chunk of 4096 bits its end (4 bytes) and
    // its codes' rounding to a word (2 bytes on average).
    CHECK(double(length) < 1.05 * entropy_bytes + 6.0 * double(detail::sign_code_chunks(count)) + 64);
  }
}

TEST_CASE("coded sign bits: codes that are not the encoder's never write outside the bits") {
  const exec_space exec;
  std::mt19937 rng(11);
  for (const std::size_t count : {std::size_t(33), std::size_t(5000), std::size_t(20000)}) {
    for (int trial = 0; trial < 20; ++trial) {
      CAPTURE(count);
      CAPTURE(trial);
      // A valid header and chunk table (ends growing, the last one in range), random codes.
      const std::size_t chunks = detail::sign_code_chunks(count);
      const std::size_t code_words = 1 + rng() % detail::sign_words(count);
      std::vector<std::byte> coded(detail::sign_code_bytes(count, code_words));
      for (auto& b : coded) b = std::byte(rng());
      auto* const header = reinterpret_cast<std::uint32_t*>(coded.data());
      header[2] = std::uint32_t(rng() % 25) | (std::uint32_t(rng() & 1) << 8);
      std::vector<std::uint32_t> ends(chunks);
      for (auto& e : ends) e = std::uint32_t(rng() % (code_words + 1));
      std::sort(ends.begin(), ends.end());
      ends.back() = std::uint32_t(code_words);
      std::memcpy(coded.data() + detail::sign_code_header_bytes, ends.data(), 4 * chunks);
      constexpr std::size_t guard = 64;
      const std::size_t bytes = detail::sign_bytes(count);
      const auto out = to_view(std::vector<std::byte>(bytes + guard, std::byte{0xA5}));
      detail::decode_sign_bits(exec, to_view(coded).data(), count, out.data());
      exec.fence();
      const auto back = to_vector(out);
      CHECK(std::all_of(back.begin() + std::ptrdiff_t(bytes), back.end(),
                        [](std::byte b) { return b == std::byte{0xA5}; }));
      // Padding bits past `count` stay 0 whatever the codes say.
      const auto* const words = reinterpret_cast<const std::uint32_t*>(back.data());
      for (std::size_t i = count; i < 32 * detail::sign_words(count); ++i)
        CHECK(((words[i / 32] >> (i % 32)) & 1u) == 0);
    }
  }
}

TEST_CASE_TEMPLATE("stash keep_sign: coded bits restore the bytes of bits kept as they are, in fewer bytes", T,
                   float, double) {
  const exec_space exec;
  kompress::stash_options o;
  o.budget_bytes = std::size_t(16) << 20;
  o.segment_bytes = std::size_t(16) << 10;
  auto coding = detail::tuned_stash(exec, o, {});
  auto plain = detail::tuned_stash(exec, o, {.code_sign_bits = false});
  std::mt19937 rng(5);
  std::exponential_distribution<double> exponential(1.0);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  const std::size_t count = 100003;
  for (const double zeros : {0.02, 0.13, 0.5, 0.87, 0.98}) {
    for (const auto rounding : {kompress::rounding_mode::nearest, kompress::rounding_mode::stochastic}) {
      CAPTURE(zeros);
      CAPTURE(int(rounding));
      std::vector<T> values(count);
      for (T& v : values) v = uniform(rng) < zeros ? T(0) : T(exponential(rng));
      const auto view = to_view(values);
      const kompress::stash_save_options how{.keep_sign = true, .rounding = rounding};
      const auto a = coding.save(exec, view, kompress::relative(5e-2), how);
      const auto b = plain.save(exec, view, kompress::relative(5e-2), how);
      const auto coded_info = coding.info(a), plain_info = plain.info(b);
      CHECK(coded_info.zeros_in_signs == plain_info.zeros_in_signs);
      CHECK(coded_info.stored_bytes - coded_info.sign_bytes == plain_info.stored_bytes - plain_info.sign_bytes);
      CHECK(coding.stats().sign_bytes == coded_info.sign_bytes);
      if (zeros != 0.5) CHECK(double(coded_info.sign_bytes) < 0.8 * double(plain_info.sign_bytes));
      else CHECK(coded_info.sign_bytes == plain_info.sign_bytes);
      Kokkos::View<T*, memory_space> from_coded("from_coded", count), from_plain("from_plain", count);
      coding.restore_and_drop(exec, a, from_coded);
      plain.restore_and_drop(exec, b, from_plain);
      const auto x = to_vector(from_coded), y = to_vector(from_plain);
      CHECK(std::memcmp(x.data(), y.data(), count * sizeof(T)) == 0);
      const auto errors = kompress::test::count_errors(values, x, coded_info.absolute_bound);
      CHECK(errors.flips == 0);
      CHECK(errors.outside == 0);
    }
  }
  CHECK(coding.stats().pool_bytes == coding.stats().workspace_bytes);
}

TEST_CASE_TEMPLATE("stash keep_sign: a stochastic save's bits are stored without the sum it does not read", T, float,
                   double) {
  const exec_space exec;
  kompress::stash_options o;
  o.budget_bytes = std::size_t(16) << 20;
  o.segment_bytes = std::size_t(1) << 20;
  auto plain = detail::tuned_stash(exec, o, {.code_sign_bits = false});
  std::mt19937 rng(3);
  std::uniform_real_distribution<double> uniform(-1.0, 1.0);
  const std::size_t count = 5000;  // one segment, a third positive: one piece, never cut
  std::vector<T> relu(count), signed_values(count);
  for (std::size_t i = 0; i < count; ++i) {
    const double x = uniform(rng);
    signed_values[i] = T(x);
    relu[i] = x > 1.0 / 3.0 ? T(x) : T(0);
  }
  for (const auto& values : {relu, signed_values}) {  // a packed piece's bits, a whole stream's
    for (const auto rounding : {kompress::rounding_mode::nearest, kompress::rounding_mode::stochastic}) {
      CAPTURE(int(rounding));
      const auto view = to_view(values);
      const auto h = plain.save(exec, view, kompress::relative(1e-2), {.keep_sign = true, .rounding = rounding});
      const auto info = plain.info(h);
      CHECK(info.sign_bytes == detail::sign_bytes(count, rounding == kompress::rounding_mode::nearest));
      Kokkos::View<T*, memory_space> back("back", count);
      plain.restore_and_drop(exec, h, back);
      const auto x = to_vector(back);
      const auto errors = kompress::test::count_errors(values, x, info.absolute_bound);
      CHECK(errors.flips == 0);
      CHECK(errors.outside == 0);
    }
  }
}
