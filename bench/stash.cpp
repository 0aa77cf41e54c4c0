// bench_stash: the activation stash on the real activations and gradients, beside the
// alternatives users pick, measured in the same run on the same arrays.
//
// For each act_* and grad_* file of the data folder:
//   memcpy      std::memcpy into a preallocated buffer (one thread), and one memcpy per thread
//               (all threads): the bandwidth limit
//   stash       kompress::stash save and restore (restore into a preallocated View) at each
//               REL bound (default 1e-2): ratio, GB/s on one thread and on all threads, max
//               abs error and max error / bound (must be <= 1); plus, on one thread, the codec
//               alone (kompress::compress into a preallocated buffer: the stash's overhead is
//               the difference) and a save through the workspace instead of in place (the
//               detail::stash_tuning choice); "sign": the same saves with keep_sign (the
//               sign bits packed and their mean reduced on save, applied on restore); "sign
//               stoch": with keep_sign and stochastic rounding (step e, dithered); "group":
//               that, with the bound relative to each group of 256 values' range
//               (group_relative; max error / bound is then over each value's group bound);
//               "sign stoch, bits uncoded": the "sign stoch" saves with a packed segment's
//               sign bits stored as they are (detail::stash_tuning::code_sign_bits off), to
//               time and size the coded bits against; "sign stoch, streams whole": the same
//               with every stream whole in the pool, its 88-byte header kept, compressed in
//               place where the pool has room (detail::stash_tuning::frame_streams off); every
//               stream and the codec-alone row in the codec --codec names (default fast), in
//               segments of --segment-bytes (default the stash's, 4 MiB)
//   float16     cast to IEEE binary16 and back (F16C where the CPU has it), ratio 2
//   bfloat16    the upper 16 bits, rounded to nearest even, ratio 2
//   actnn8      ActNN-style per-group quantizer: groups of 256 values, each with its min and
//               scale as two floats, 8-bit codes with stochastic rounding (counter-based
//               random numbers), ratio 1024/264
//   actnn2      the same with 2-bit codes (ActNN's default), ratio 1024/72
// The baselines are measured on one thread and on all threads as well ("save" = encode,
// "restore" = decode). GB/s is uncompressed bytes / the fastest call of --reps repetitions
// after a warm-up, each repetition lasting --min-time-ms. Max error / range is the max abs
// error over the file's value range: comparable to a REL bound.
//
// Output: a table on stdout, a CSV (--csv), then the targets at REL 1e-2 over the act_*
// files (ratio >= 6x each, save >= 1.5 GB/s and restore >= 4 GB/s on one core) marked MET / NOT
// MET. Targets not met are reported, not failed; a broken bound fails the run.
//
//   bench_stash [--files a,b] [--bounds 1e-2[,1e-3...]] [--reps 5] [--min-time-ms 10] [--codec ratio]
//               [--block-size 32] [--segment-bytes N] [--positive-share P] [--csv bench_stash.csv]
//
// --positive-share P (in (0, 1)): each file's values x become max(x - t, 0), t the quantile
// that leaves a share P of them positive: a ReLU's output at that density (the MNIST MLP's
// hidden outputs are 80-87% positive at its peak step), where the sign bits are coded. A file
// with more zeros than 1 - P already (a ReLU's output) has t = 0 and stays as it is.
//
// The thread count is Kokkos's (OMP_NUM_THREADS); bench/run sets it to 2.

#include "activation_baselines.hpp"
#include "real_data.hpp"

#include "support.hpp"

#include <kompress/kompress.hpp>
#include <kompress/stash.hpp>

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#ifdef KOKKOS_ENABLE_OPENMP
#include <omp.h>
#endif
#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace {

using host_exec = Kokkos::DefaultHostExecutionSpace;
using host_view = Kokkos::View<float*, Kokkos::HostSpace>;
using namespace kompress_bench;
constexpr double inf = std::numeric_limits<double>::infinity();
constexpr double nan = std::numeric_limits<double>::quiet_NaN();

inline void keep(const void* p) { asm volatile("" : : "r"(p) : "memory"); }

/// Seconds of the fastest call of `f`: a warm-up call, then `reps` repetitions of at least
/// min_seconds each (on a shared machine the fastest call is the code's own speed).
struct options {
  std::vector<std::string> file_filters;
  std::vector<double> bounds{1e-2};
  int reps = 5;
  double min_seconds = 0.01;
  int block_size = 32;
  kompress::codec_mode codec = kompress::codec_mode::fast;
  double positive_share = 0;  ///< 0: the files as they are
  std::size_t segment_bytes = kompress::stash_options{}.segment_bytes;
  std::string csv = "bench_stash.csv";
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "bench_stash: %s\nusage: bench_stash [--files SUBSTR[,SUBSTR...]] [--bounds REL[,REL...]]\n"
               "                   [--reps N] [--min-time-ms MS] [--block-size 32|64|128] [--codec fast|ratio]\n"
               "                   [--segment-bytes N] [--positive-share P] [--csv PATH]\n",
               why.c_str());
  std::exit(why == "help" ? 0 : 2);
}

options parse_options(int argc, char** argv) {
  options opts;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "-h" || arg == "--help") usage("help");
    if (i + 1 >= argc) usage(arg + " needs a value");
    const std::string value = argv[++i];
    try {
      if (arg == "--files") opts.file_filters = split(value);
      else if (arg == "--bounds") {
        opts.bounds.clear();
        for (const auto& b : split(value)) opts.bounds.push_back(std::stod(b));
        if (opts.bounds.empty()) usage("--bounds needs at least one value");
      } else if (arg == "--reps") opts.reps = std::max(1, std::stoi(value));
      else if (arg == "--min-time-ms") opts.min_seconds = std::stod(value) / 1e3;
      else if (arg == "--block-size") opts.block_size = std::stoi(value);
      else if (arg == "--codec") {
        if (value == "fast") opts.codec = kompress::codec_mode::fast;
        else if (value == "ratio") opts.codec = kompress::codec_mode::ratio;
        else usage("--codec is fast or ratio");
      } else if (arg == "--positive-share") {
        opts.positive_share = std::stod(value);
        if (!(opts.positive_share > 0 && opts.positive_share < 1)) usage("--positive-share is in (0, 1)");
      } else if (arg == "--segment-bytes") {
        opts.segment_bytes = std::stoul(value);
        if (opts.segment_bytes < 1024) usage("--segment-bytes is at least 1024");
      } else if (arg == "--csv") opts.csv = value;
      else usage("unknown argument " + arg);
    } catch (const std::invalid_argument&) {
      usage("bad value for " + arg + ": " + value);
    }
  }
  return opts;
}

/// Threads a parallel_for on `exec` really runs on (an OpenMP instance can silently be wider).
int threads_used(const host_exec& exec) {
#ifdef KOKKOS_ENABLE_OPENMP
  const int slots = 256;
  Kokkos::View<int*, Kokkos::HostSpace> seen("bench::seen", slots);
  Kokkos::parallel_for("bench::threads_used", Kokkos::RangePolicy<host_exec>(exec, 0, 1 << 16),
                       [=](int) { seen(omp_get_thread_num() % slots) = 1; });
  exec.fence();
  int used = 0;
  for (int i = 0; i < slots; ++i) used += seen(i);
  return used;
#else
  return exec.concurrency();
#endif
}

/// Runs f(begin, end) over [0, n) split into one piece per thread of `exec` (in multiples of
/// `align` values), and waits.
template <class F>
void for_pieces(const host_exec& exec, std::size_t n, std::size_t align, F&& f) {
  const std::size_t pieces = std::size_t(exec.concurrency());
  const std::size_t piece = (n / pieces + align) / align * align;
  Kokkos::parallel_for("bench::pieces", Kokkos::RangePolicy<host_exec>(exec, 0, pieces), [&](std::size_t p) {
    const std::size_t begin = std::min(n, p * piece), end = std::min(n, begin + piece);
    if (begin < end) f(begin, end);
  });
  exec.fence();
}

// ---------------------------------------------------------------------------------------------
// The baselines

#if defined(__x86_64__) && defined(__GNUC__)
#define KOMPRESS_BENCH_F16C 1
__attribute__((target("avx,f16c"))) void to_half_f16c(const float* in, std::uint16_t* out, std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT));
  for (; i < n; ++i) {
    const _Float16 h = static_cast<_Float16>(in[i]);
    std::memcpy(out + i, &h, 2);
  }
}
__attribute__((target("avx,f16c"))) void from_half_f16c(const std::uint16_t* in, float* out, std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i))));
  for (; i < n; ++i) {
    _Float16 h;
    std::memcpy(&h, in + i, 2);
    out[i] = static_cast<float>(h);
  }
}
#endif

void to_half(const float* in, std::uint16_t* out, std::size_t n) {
#ifdef KOMPRESS_BENCH_F16C
  if (have_f16c()) return to_half_f16c(in, out, n);
#endif
  for (std::size_t i = 0; i < n; ++i) {
    const _Float16 h = static_cast<_Float16>(in[i]);
    std::memcpy(out + i, &h, 2);
  }
}

void from_half(const std::uint16_t* in, float* out, std::size_t n) {
#ifdef KOMPRESS_BENCH_F16C
  if (have_f16c()) return from_half_f16c(in, out, n);
#endif
  for (std::size_t i = 0; i < n; ++i) {
    _Float16 h;
    std::memcpy(&h, in + i, 2);
    out[i] = static_cast<float>(h);
  }
}

/// bfloat16: the upper half of the float, rounded to nearest even (NaN kept quiet).
void to_bfloat(const float* in, std::uint16_t* out, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    std::uint32_t bits;
    std::memcpy(&bits, in + i, 4);
    const bool is_nan = (bits & 0x7FFFFFFFu) > 0x7F800000u;
    const std::uint32_t rounded = bits + 0x7FFFu + ((bits >> 16) & 1u);
    out[i] = static_cast<std::uint16_t>(is_nan ? (bits >> 16) | 0x40u : rounded >> 16);
  }
}

void from_bfloat(const std::uint16_t* in, float* out, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint32_t bits = std::uint32_t(in[i]) << 16;
    std::memcpy(out + i, &bits, 4);
  }
}

using kompress_bench::group_quantizer;

// ---------------------------------------------------------------------------------------------
// Results

struct method_result {
  std::string method;  // "stash REL 0.01", "float16", ...
  double bound = nan;  // REL bound (stash rows)
  double ratio = nan;
  double save_1t = nan, restore_1t = nan, save_all = nan, restore_all = nan;
  double max_abs = nan, max_over_range = nan, max_over_bound = nan;
  double codec_1t = nan, workspace_save_1t = nan;  // stash rows
  bool ok = true;
};

struct file_result {
  kompress::test::data_file_info file;
  std::size_t bytes = 0;
  double range = 0;
  double memcpy_1t = nan, memcpy_all = nan;
  std::vector<method_result> methods;
  std::string error;
};

double max_abs_error(const std::vector<float>& a, const float* b) {
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double e = std::fabs(double(a[i]) - double(b[i]));
    worst = std::isnan(e) ? inf : std::max(worst, e);
  }
  return worst;
}

/// The largest |a - b| over its group's bound, r 2^floor(log2(range)) of each group of 256 of a
/// (stash_save_options::group_relative; the arrays here are finite and have no constant group).
double max_over_group_bound(const std::vector<float>& a, const float* b, double r) {
  double worst = 0;
  for (std::size_t first = 0; first < a.size(); first += 256) {
    const std::size_t last = std::min(a.size(), first + 256);
    const auto [low, high] = std::minmax_element(a.begin() + std::ptrdiff_t(first), a.begin() + std::ptrdiff_t(last));
    const double range = double(*high) - double(*low);
    const double bound = r * std::ldexp(1.0, std::clamp(range > 0 ? std::ilogb(range) : -100, -100, 127));
    for (std::size_t i = first; i < last; ++i) {
      const double e = std::fabs(double(a[i]) - double(b[i])) / bound;
      worst = std::isnan(e) ? inf : std::max(worst, e);
    }
  }
  return worst;
}

void run_file(file_result& r, const options& opts, const host_exec& one, const host_exec& all) {
  std::vector<float> values = kompress::test::read_raw<float>(r.file.name);
  const std::size_t n = values.size();
  if (opts.positive_share > 0 && n > 0) {  // a ReLU's output of that density
    std::vector<float> sorted = values;
    const auto at = sorted.begin() + std::ptrdiff_t(double(n - 1) * (1 - opts.positive_share));
    std::nth_element(sorted.begin(), at, sorted.end());
    const float t = *at;
    for (float& v : values) v = std::max(v - t, 0.0f);
  }
  r.bytes = n * sizeof(float);
  double low = inf, high = -inf;
  for (float v : values) low = std::min(low, double(v)), high = std::max(high, double(v));
  r.range = high - low;
  host_view in("bench::in", n), out("bench::out", n);
  std::memcpy(in.data(), values.data(), r.bytes);
  const host_exec* instances[2] = {&one, &all};

  // memcpy
  r.memcpy_1t = gbs(r.bytes, best_seconds([&] {
                      std::memcpy(out.data(), in.data(), r.bytes);
                      keep(out.data());
                    }, opts.reps, opts.min_seconds));
  r.memcpy_all = gbs(r.bytes, best_seconds([&] {
                       for_pieces(all, n, 16, [&](std::size_t b, std::size_t e) {
                         std::memcpy(out.data() + b, in.data() + b, (e - b) * sizeof(float));
                       });
                       keep(out.data());
                     }, opts.reps, opts.min_seconds));

  // The stash. Budget: room for a few saves of the largest file; default 4 MiB segments.
  const kompress::stash_options stash_options{.budget_bytes = std::size_t(96) << 20,
                                              .segment_bytes = opts.segment_bytes,
                                              .codec = {.block_size = opts.block_size, .codec = opts.codec}};
  kompress::stash<host_exec> stash(all, stash_options);
  auto staged = kompress::detail::tuned_stash(all, stash_options, {.compress_in_place = false});
  auto uncoded = kompress::detail::tuned_stash(all, stash_options, {.code_sign_bits = false});
  auto whole = kompress::detail::tuned_stash(all, stash_options, {.frame_streams = false});
  for (const double bound : opts.bounds) for (const int variant : {0, 1, 2, 3, 4, 5}) {
    const bool keep_sign = variant >= 1, stochastic = variant >= 2, grouped = variant == 3;
    auto& stash_used = variant == 4 ? uncoded : variant == 5 ? whole : stash;
    method_result m;
    char name[48];
    const char* format = variant == 5   ? "stash REL %g sign stoch, streams whole"
                         : variant == 4 ? "stash REL %g sign stoch, bits uncoded"
                         : grouped    ? "stash REL %g sign stoch group"
                         : stochastic ? "stash REL %g sign stoch"
                         : keep_sign  ? "stash REL %g sign"
                                      : "stash REL %g";
    std::snprintf(name, sizeof name, format, bound);
    m.method = std::string(name) + (opts.codec == kompress::codec_mode::ratio ? " ratio" : "");
    m.bound = bound;
    const auto rel = kompress::relative(bound);
    const kompress::stash_save_options how{
        .keep_sign = keep_sign,
        .rounding = stochastic ? kompress::rounding_mode::stochastic : kompress::rounding_mode::nearest,
        .group_relative = grouped};
    for (int which = 0; which < 2; ++which) {
      const host_exec& exec = *instances[which];
      const double save =
          best_seconds([&] { stash_used.drop(stash_used.save(exec, in, rel, how)); }, opts.reps, opts.min_seconds);
      const auto handle = stash_used.save(exec, in, rel, how);
      const double restore =
          best_seconds([&] { stash_used.restore(exec, handle, out); }, opts.reps, opts.min_seconds);
      (which == 0 ? m.save_1t : m.save_all) = gbs(r.bytes, save);
      (which == 0 ? m.restore_1t : m.restore_all) = gbs(r.bytes, restore);
      const auto info = stash_used.info(handle);
      m.ratio = info.ratio();
      m.max_abs = max_abs_error(values, out.data());
      const double abs_bound = bound * r.range;
      m.max_over_range = r.range > 0 ? m.max_abs / r.range : nan;
      m.max_over_bound = grouped        ? max_over_group_bound(values, out.data(), bound)
                         : abs_bound > 0 ? m.max_abs / abs_bound
                                         : (m.max_abs == 0 ? 0 : inf);
      if (!(m.max_over_bound <= 1.0)) m.ok = false;
      stash_used.drop(handle);
    }
    // On one thread: the codec alone, and a save through the workspace.
    if (keep_sign) {
      r.methods.push_back(m);
      continue;
    }
    Kokkos::View<std::byte*, Kokkos::HostSpace> stream("bench::stream", kompress::max_compressed_size(in));
    const kompress::compress_options codec_options{.bound = rel, .block_size = opts.block_size, .codec = opts.codec};
    m.codec_1t = gbs(r.bytes, best_seconds([&] { kompress::compress(one, in, stream, codec_options); },
                                           opts.reps, opts.min_seconds));
    m.workspace_save_1t = gbs(r.bytes, best_seconds([&] { staged.drop(staged.save(one, in, rel)); },
                                                    opts.reps, opts.min_seconds));
    r.methods.push_back(m);
  }

  // The baselines, on one thread and on all.
  std::vector<std::uint16_t> half(n);
  auto run_baseline = [&](const std::string& name, double ratio, auto&& encode, auto&& decode,
                          std::size_t align) {
    method_result m;
    m.method = name;
    m.ratio = ratio;
    for (int which = 0; which < 2; ++which) {
      const host_exec& exec = *instances[which];
      const double save = best_seconds([&] { for_pieces(exec, n, align, encode); }, opts.reps, opts.min_seconds);
      const double restore = best_seconds([&] { for_pieces(exec, n, align, decode); }, opts.reps, opts.min_seconds);
      (which == 0 ? m.save_1t : m.save_all) = gbs(r.bytes, save);
      (which == 0 ? m.restore_1t : m.restore_all) = gbs(r.bytes, restore);
    }
    m.max_abs = max_abs_error(values, out.data());
    m.max_over_range = r.range > 0 ? m.max_abs / r.range : nan;
    r.methods.push_back(m);
  };
  run_baseline(
      "float16", 2.0, [&](std::size_t b, std::size_t e) { to_half(in.data() + b, half.data() + b, e - b); },
      [&](std::size_t b, std::size_t e) { from_half(half.data() + b, out.data() + b, e - b); }, 16);
  run_baseline(
      "bfloat16", 2.0, [&](std::size_t b, std::size_t e) { to_bfloat(in.data() + b, half.data() + b, e - b); },
      [&](std::size_t b, std::size_t e) { from_bfloat(half.data() + b, out.data() + b, e - b); }, 16);
  auto run_quantizer = [&](auto quantizer, const std::string& name) {
    using q = decltype(quantizer);
    std::vector<std::byte> packed(q::bytes(n));
    const std::size_t groups = q::groups(n);
    // Pieces are in values, aligned to whole groups; the quantizer works on group indices.
    run_baseline(
        name, double(r.bytes) / double(packed.size()),
        [&](std::size_t b, std::size_t e) {
          q::encode(in.data(), n, b / q::group, std::min(groups, (e + q::group - 1) / q::group), packed.data(), 42);
        },
        [&](std::size_t b, std::size_t e) {
          q::decode(packed.data(), n, b / q::group, std::min(groups, (e + q::group - 1) / q::group), out.data());
        },
        q::group);
  };
  run_quantizer(group_quantizer<8>{}, "actnn8");
  run_quantizer(group_quantizer<2>{}, "actnn2");
}

// ---------------------------------------------------------------------------------------------
// Output

void print_table(const std::vector<file_result>& results, int threads) {
  std::printf("\nGB/s of uncompressed bytes; 1t = one thread (per core), %dt = all threads. "
              "err/range = max abs error / value range (a REL bound's scale).\n", threads);
  for (const auto& r : results) {
    std::printf("\n%s (%.1f MB, range %.4g): memcpy %.2f GB/s (1t), %.2f GB/s (%dt)%s%s\n", r.file.name.c_str(),
                r.bytes / 1e6, r.range, r.memcpy_1t, r.memcpy_all, threads, r.error.empty() ? "" : "  FAILED: ",
                r.error.c_str());
    std::printf("  %-38s %7s %9s %9s %9s %9s %11s %10s %8s %8s %9s\n", "method", "ratio", "save 1t", "rest 1t",
                "save all", "rest all", "max err", "err/range", "err/bnd", "codec 1t", "ws save");
    for (const auto& m : r.methods) {
      std::printf("  %-38s %7.2f %9.2f %9.2f %9.2f %9.2f %11.4g %10.3g", m.method.c_str(), m.ratio, m.save_1t,
                  m.restore_1t, m.save_all, m.restore_all, m.max_abs, m.max_over_range);
      if (!std::isnan(m.bound))
        std::printf(" %8.3f %8.2f %9.2f%s", m.max_over_bound, m.codec_1t, m.workspace_save_1t,
                    m.ok ? "" : "  BOUND VIOLATED");
      std::printf("\n");
    }
  }
}

void print_summary_and_targets(const std::vector<file_result>& results) {
  // Geometric means over the act_* files, per method.
  std::vector<std::string> methods;
  for (const auto& r : results)
    for (const auto& m : r.methods)
      if (std::find(methods.begin(), methods.end(), m.method) == methods.end()) methods.push_back(m.method);
  std::printf("\nGeometric means over the act_* files:\n  %-38s %7s %9s %9s %9s %9s %10s\n", "method", "ratio",
              "save 1t", "rest 1t", "save all", "rest all", "err/range");
  for (const auto& name : methods) {
    std::vector<double> ratio, s1, r1, sa, ra;
    double worst = 0;
    for (const auto& r : results) {
      if (!r.file.name.starts_with("act_")) continue;
      for (const auto& m : r.methods) {
        if (m.method != name) continue;
        ratio.push_back(m.ratio), s1.push_back(m.save_1t), r1.push_back(m.restore_1t);
        sa.push_back(m.save_all), ra.push_back(m.restore_all);
        worst = std::max(worst, m.max_over_range);
      }
    }
    if (ratio.empty()) continue;
    std::printf("  %-38s %7.2f %9.2f %9.2f %9.2f %9.2f %10.3g (worst)\n", name.c_str(), geomean(ratio), geomean(s1),
                geomean(r1), geomean(sa), geomean(ra), worst);
  }

  std::printf("\nTargets at REL 1e-2 on the act_* files (one core):\n");
  bool any = false;
  for (const auto& r : results) {
    if (!r.file.name.starts_with("act_")) continue;
    for (const auto& m : r.methods) {
      if (m.bound != 1e-2) continue;
      any = true;
      std::printf("  %-36s %-38s ratio %5.2f %-7s  save %5.2f GB/s %-7s  restore %5.2f GB/s %s\n",
                  r.file.name.c_str(), m.method.c_str(), m.ratio, m.ratio >= 6 ? "MET" : "NOT MET", m.save_1t,
                  m.save_1t >= 1.5 ? "MET" : "NOT MET", m.restore_1t, m.restore_1t >= 4 ? "MET" : "NOT MET");
    }
  }
  if (!any) std::printf("  (no act_* file at REL 1e-2 in this run)\n");
}

void write_csv(const std::vector<file_result>& results, int threads, const std::string& path) {
  std::ofstream csv(path);
  csv << "file,bytes,range,method,rel_bound,ratio,save_gbs_1t,restore_gbs_1t,save_gbs_" << threads
      << "t,restore_gbs_" << threads << "t,max_abs_error,max_error_over_range,max_error_over_bound,"
      << "codec_compress_gbs_1t,workspace_save_gbs_1t,memcpy_gbs_1t,memcpy_gbs_" << threads << "t,ok\n";
  for (const auto& r : results)
    for (const auto& m : r.methods)
      csv << r.file.name << ',' << r.bytes << ',' << r.range << ',' << m.method << ',' << m.bound << ','
          << m.ratio << ',' << m.save_1t << ',' << m.restore_1t << ',' << m.save_all << ',' << m.restore_all
          << ',' << m.max_abs << ',' << m.max_over_range << ',' << m.max_over_bound << ',' << m.codec_1t << ','
          << m.workspace_save_1t << ',' << r.memcpy_1t << ',' << r.memcpy_all << ',' << (m.ok ? 1 : 0) << '\n';
}

int run(int argc, char** argv) {
  const options opts = parse_options(argc, argv);
  // One thread: an OpenMP instance with a pool of one.
  const host_exec one_thread(1);
  const host_exec all_threads{};
  const int threads = all_threads.concurrency();
  if (threads_used(one_thread) != 1 || threads_used(all_threads) != threads) {
    std::fprintf(stderr, "bench_stash: the thread counts of the instances are not what they say\n");
    return 1;
  }
  std::vector<file_result> results;
  for (const auto& file : kompress::test::float_data_files()) {
    if (file.family != "activation" || file.dtype != "f32") continue;
    const bool wanted = opts.file_filters.empty() ||
                        std::any_of(opts.file_filters.begin(), opts.file_filters.end(),
                                    [&](const std::string& f) { return file.name.find(f) != std::string::npos; });
    if (!wanted) continue;
    file_result r;
    r.file = file;
    results.push_back(std::move(r));
  }
  if (results.empty()) {
    std::printf("bench_stash: no activation file matches --files; nothing to do\n");
    return 0;
  }
  const std::time_t now = std::time(nullptr);
  char date[64];
  std::strftime(date, sizeof date, "%Y-%m-%d %H:%M %Z", std::localtime(&now));
  std::printf("bench_stash: kompress %d.%d.%d, %s; %s, %d threads (Kokkos %s), compiled for %s (encoder: %s), "
              "block size %d; load average: %s\n",
              kompress::version.major, kompress::version.minor, kompress::version.patch, date,
              cpu_model().c_str(), threads, host_exec::name(), instruction_set(),
              encoder_instruction_set().c_str(), opts.block_size,
              load_average().c_str());
  std::fflush(stdout);
  const auto start = clock_type::now();
  for (auto& r : results) {
    try {
      run_file(r, opts, one_thread, all_threads);
    } catch (const std::exception& e) {
      r.error = e.what();
    }
    std::fprintf(stderr, "  %-44s %s\n", r.file.name.c_str(), r.error.empty() ? "done" : "FAILED");
  }
  print_table(results, threads);
  print_summary_and_targets(results);
  write_csv(results, threads, opts.csv);
  std::printf("\n%.0f s; load average at end: %s; CSV: %s\n",
              std::chrono::duration<double>(clock_type::now() - start).count(), load_average().c_str(),
              opts.csv.c_str());
  for (const auto& r : results) {
    if (!r.error.empty()) return 1;
    for (const auto& m : r.methods)
      if (!m.ok) return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Kokkos::ScopeGuard kokkos(argc, argv);
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_stash: %s\n", e.what());
    return 1;
  }
}
