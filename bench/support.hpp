#pragma once
// What every kompress benchmark shares: option parsing, timing, averages, and the description
// of the machine and build printed beside the numbers.

#include <kompress/kernels/compress_kernels.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace kompress_bench {

using clock_type = std::chrono::steady_clock;

/// The non-empty pieces of `text` between separators ("a,,b" -> a, b).
inline std::vector<std::string> split(std::string_view text, char separator = ',') {
  std::vector<std::string> parts;
  while (true) {
    const auto at = text.find(separator);
    if (!text.substr(0, at).empty()) parts.emplace_back(text.substr(0, at));
    if (at == std::string_view::npos) break;
    text.remove_prefix(at + 1);
  }
  return parts;
}

/// A byte count with an optional binary suffix: "512", "64K", "16M", "1.5G" (KiB, MiB, GiB
/// spelled out are taken too). Throws std::invalid_argument on any other suffix.
inline std::size_t parse_bytes(const std::string& text) {
  std::size_t used = 0;
  const double number = std::stod(text, &used);
  const std::string suffix = text.substr(used);
  double unit = 1.0;
  if (suffix == "K" || suffix == "KiB" || suffix == "k") unit = 1024.0;
  else if (suffix == "M" || suffix == "MiB" || suffix == "m") unit = 1024.0 * 1024.0;
  else if (suffix == "G" || suffix == "GiB" || suffix == "g") unit = 1024.0 * 1024.0 * 1024.0;
  else if (!suffix.empty()) throw std::invalid_argument(text);
  return std::size_t(number * unit);
}

/// "64 MiB", "16 KiB": whole binary units, for tables.
inline std::string human_bytes(std::size_t bytes) {
  char text[32];
  if (bytes >= (1u << 20)) std::snprintf(text, sizeof text, "%zu MiB", bytes >> 20);
  else std::snprintf(text, sizeof text, "%zu KiB", bytes >> 10);
  return text;
}

/// `values` repeated over `out` (`count` floats), rank `rank` of `ranks` starting a fraction of
/// the array further than rank 0, rounded to a 128-value row: each rank sends other data.
inline void fill_tiled(const std::vector<float>& values, float* out, std::size_t count, int rank, int ranks) {
  const std::size_t n = values.size();
  std::size_t at = (n / std::size_t(ranks) * std::size_t(rank)) / 128 * 128 % n;
  for (std::size_t i = 0; i < count;) {
    const std::size_t run = std::min(count - i, n - at);
    std::memcpy(out + i, values.data() + at, run * sizeof(float));
    i += run;
    at = 0;
  }
}

/// The fastest call of `f`: one warm-up call, then `reps` repetitions, each calling `f` until
/// it has run for `min_rep_seconds` (so short calls are timed many times).
template <class F>
double best_seconds(F&& f, int reps, double min_rep_seconds) {
  f();
  double best = std::numeric_limits<double>::infinity();
  for (int r = 0; r < reps; ++r) {
    const auto rep_start = clock_type::now();
    while (true) {
      const auto start = clock_type::now();
      f();
      const auto end = clock_type::now();
      best = std::min(best, std::chrono::duration<double>(end - start).count());
      if (std::chrono::duration<double>(end - rep_start).count() >= min_rep_seconds) break;
    }
  }
  return best;
}

inline double gbs(std::size_t bytes, double seconds) { return double(bytes) / seconds / 1e9; }

/// Geometric mean; NaN if empty or if any value is not a positive finite number.
inline double geomean(const std::vector<double>& xs) {
  constexpr double nan = std::numeric_limits<double>::quiet_NaN();
  if (xs.empty()) return nan;
  double log_sum = 0.0;
  for (double x : xs) {
    if (!(x > 0.0) || !std::isfinite(x)) return nan;
    log_sum += std::log(x);
  }
  return std::exp(log_sum / double(xs.size()));
}

inline std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.starts_with("model name")) {
      const auto colon = line.find(':');
      return colon == std::string::npos ? line : line.substr(line.find_first_not_of(" \t", colon + 1));
    }
  return "unknown";
}

/// "1-min 5-min 15-min", or "unknown".
inline std::string load_average() {
  std::ifstream in("/proc/loadavg");
  std::string one, five, fifteen;
  in >> one >> five >> fifteen;
  return one.empty() ? "unknown" : one + " " + five + " " + fifteen;
}

/// The 1-minute load average, NaN where /proc/loadavg is unreadable.
inline double load_1min() {
  std::ifstream in("/proc/loadavg");
  double one = std::numeric_limits<double>::quiet_NaN();
  in >> one;
  return one;
}

/// The vector instructions the benchmark was compiled for: the codec's loops vectorize for
/// what the compiler may assume, so numbers from different targets differ
/// (bench/CMakeLists.txt, KOMPRESS_BENCH_ARCH).
inline const char* instruction_set() {
#if defined(__AVX512F__)
  return "AVX-512";
#elif defined(__AVX2__) && defined(__FMA__)
  return "AVX2+FMA";
#elif defined(__AVX2__)
  return "AVX2";
#elif defined(__AVX__)
  return "AVX";
#elif defined(__SSE2__)
  return "SSE2 (the x86-64 baseline)";
#elif defined(__ARM_NEON)
  return "NEON";
#else
  return "the compiler's default";
#endif
}

/// What the codec's encoder runs on: the compile target, or AVX2+FMA (and AVX-512 for both
/// encoders and the ratio codec's decoder) where the library chose it at run time
/// (kernels/backend/host.hpp: block size 32 on x86-64).
inline std::string encoder_instruction_set() {
#ifdef KOMPRESS_HOST_AVX2_DISPATCH
  if (kompress::detail::host_has_avx512())
    return "AVX-512 (the fast codec's decoder AVX2+FMA), chosen at run time (block size 32)";
  if (kompress::detail::host_has_avx2_fma())
    return "AVX2+FMA, chosen at run time (block size 32)";
#endif
  return instruction_set();
}

/// Whether the CPU converts float16 in hardware (the float16 baselines use it when so).
inline bool have_f16c() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  return __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx");
#else
  return false;
#endif
}

}  // namespace kompress_bench
