// bench_codec: kompress on every real data file, and the baselines a user would compare it
// with, measured in the same run on the same arrays.
//
// For each .f32/.f64 file of the data folder and each REL bound (default 1e-2, 1e-3, 1e-4):
//   kompress  ratio; compress and decompress GB/s on one thread and on all threads; the speed
//             as a fraction of memcpy's; max abs error, max error / bound (must be <= 1);
//             PSNR over the non-fill values. Fill values are passed for the three fill files.
// and once per file, the baselines:
//   memcpy    std::memcpy into a preallocated buffer (one thread), and the same split into one
//             memcpy per thread (all threads): the bandwidth limit
//   zstd -1   ZSTD_compressCCtx / ZSTD_decompressDCtx, preallocated buffers and contexts
//   lz4       LZ4_compress_default / LZ4_decompress_safe
//   float16   a cast to IEEE binary16 and back (round to nearest even; F16C instructions for
//             float where the CPU has them, as ML frameworks do), what ML users pick; ratio 2
//             (float) or 4 (double)
// and for each file and bound, where the build found zfp (bench/CMakeLists.txt):
//   zfp 1.0   fixed-accuracy mode, tolerance = the same absolute bound (REL x range), the
//             array's own shape from its file name up to 3-D (higher ranks fold their slowest
//             extents together), one thread: ratio, GB/s, max error / bound. The best-known
//             error-bounded compressor users already have; its accuracy mode is not a strict
//             bound, so err/eb > 1 is reported, not failed.
// GB/s is always uncompressed bytes / time of the fastest call in --reps repetitions after a
// warm-up; a repetition repeats the call for --min-time-ms, so small files get many calls.
// kompress's one-thread and all-thread calls take their repetitions in turn.
// The baselines run on one thread (memcpy on both).
//
// Output: fixed-width tables on stdout (kompress; kompress beside zfp; the baselines; a
// per-family speed summary against SZx's numbers) and a CSV (--csv) with one row per file x
// bound and geometric-mean rows per family, then the targets (docs/performance.md, "Codec
// (CPU)") marked MET / NOT MET.
//
//   bench_codec [--files a,b] [--bounds 1e-2,1e-3,1e-4] [--reps 5] [--min-time-ms 10]
//               [--block-size 32] [--codec fast|ratio] [--csv bench_codec.csv]
//
// --codec ratio measures the ratio codec (format 1.1) on each file as a View of its own shape
// (its Lorenzo predictors follow it), and adds its targets: PFPL's science-19
// geometric means, and SZx's and zfp's ratio on every file (codec.md's tables).
//
// The thread count is Kokkos's (OMP_NUM_THREADS); bench/run sets it to 2.

#include "real_data.hpp"

#include "support.hpp"

#include <kompress/kompress.hpp>

#include <Kokkos_Core.hpp>
#include <lz4.h>
#include <zstd.h>

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
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#ifdef KOKKOS_ENABLE_OPENMP
#include <omp.h>
#endif
#ifdef KOMPRESS_BENCH_HAVE_ZFP
#include <zfp.h>
#if ZFP_VERSION_MAJOR < 1
#error "bench_codec: zfp 1.0 or later needed (configure with -DKOMPRESS_BENCH_ZFP=OFF to leave it out)"
#endif
#endif
#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace {

using host_exec = Kokkos::DefaultHostExecutionSpace;
using namespace kompress_bench;
constexpr double inf = std::numeric_limits<double>::infinity();
constexpr double nan = std::numeric_limits<double>::quiet_NaN();

// ---------------------------------------------------------------------------------------------
// Options

struct options {
  std::vector<std::string> file_filters;  // substrings; a file is kept if it contains any
  std::vector<double> bounds = {1e-2, 1e-3, 1e-4};
  int reps = 5;
  double min_rep_seconds = 0.010;
  int block_size = 32;
  kompress::codec_mode codec = kompress::codec_mode::fast;
  std::string csv = "bench_codec.csv";
};

[[noreturn]] void usage(const std::string& complaint) {
  std::fprintf(stderr,
               "bench_codec: %s\n"
               "usage: bench_codec [--files SUBSTR[,SUBSTR...]] [--bounds REL[,REL...]]\n"
               "                   [--reps N] [--min-time-ms MS] [--block-size 32|64|128]\n"
               "                   [--codec fast|ratio] [--csv PATH]\n",
               complaint.c_str());
  std::exit(2);
}

options parse_options(int argc, char** argv) {
  options opts;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "-h" || arg == "--help") usage("help");
    if (i + 1 >= argc) usage("missing value after " + arg);
    const std::string value = argv[++i];
    try {
      if (arg == "--files") {
        opts.file_filters = split(value, ',');
      } else if (arg == "--bounds") {
        opts.bounds.clear();
        for (const auto& b : split(value, ',')) opts.bounds.push_back(std::stod(b));
        if (opts.bounds.empty()) usage("--bounds needs at least one value");
      } else if (arg == "--reps") {
        opts.reps = std::stoi(value);
        if (opts.reps < 1) usage("--reps must be >= 1");
      } else if (arg == "--min-time-ms") {
        opts.min_rep_seconds = std::stod(value) / 1000.0;
      } else if (arg == "--block-size") {
        opts.block_size = std::stoi(value);
      } else if (arg == "--codec") {
        if (value != "fast" && value != "ratio") usage("--codec must be fast or ratio");
        opts.codec = value == "ratio" ? kompress::codec_mode::ratio : kompress::codec_mode::fast;
      } else if (arg == "--csv") {
        opts.csv = value;
      } else {
        usage("unknown option " + arg);
      }
    } catch (const std::logic_error&) {
      usage("bad value '" + value + "' for " + arg);
    }
  }
  return opts;
}

// ---------------------------------------------------------------------------------------------
// Timing

/// Keeps the compiler from dropping a store whose result is never read (a memcpy into a
/// buffer nobody reads again, a conversion loop).
inline void keep(const void* p) { asm volatile("" : : "r"(p) : "memory"); }

/// Seconds per call of `f`: a warm-up call, then `reps` repetitions, each calling f until it
/// has run for min_rep_seconds (once at least); every call is timed on its own and the fastest
/// counts. A slow call is another process taking the core, or an OpenMP thread descheduled
/// at a barrier (on a loaded 2-core machine one call in ten can stall for a scheduler slice,
/// ~15 ms); the best call is the codec's own speed, and the most stable number on a shared
/// machine. Repetitions last a fixed time, not a fixed count, so a stall cannot cut the
/// number of calls sampled.
// ---------------------------------------------------------------------------------------------
// Error measures, over the values that are not the fill value

template <class T>
bool is_fill(T x, std::optional<double> fill) {
  if (!fill) return false;
  const T f = static_cast<T>(*fill);
  return std::memcmp(&x, &f, sizeof(T)) == 0;
}

struct value_stats {
  double min = inf, max = -inf;
  std::size_t count = 0;  // non-fill values
  double range() const { return count ? max - min : 0.0; }
};

template <class T>
value_stats stats_of(const std::vector<T>& values, std::optional<double> fill) {
  value_stats s;
  for (T x : values) {
    if (is_fill(x, fill) || !std::isfinite(x)) continue;
    s.min = std::min(s.min, double(x));
    s.max = std::max(s.max, double(x));
    ++s.count;
  }
  return s;
}

struct error_stats {
  double max_abs = 0.0;
  double psnr_db = inf;          // 20 log10(range / RMSE); inf when exact
  std::size_t fill_changed = 0;  // fill values that did not come back bit-exact
};

template <class T, class U>
error_stats errors_of(const std::vector<T>& original, const U* decoded, std::optional<double> fill,
                      double range) {
  error_stats e;
  double sum_sq = 0.0;
  std::size_t count = 0;
  for (std::size_t i = 0; i < original.size(); ++i) {
    if (is_fill(original[i], fill)) {
      if (!is_fill(static_cast<T>(decoded[i]), fill)) ++e.fill_changed;
      continue;
    }
    const double err = std::fabs(double(original[i]) - double(decoded[i]));
    e.max_abs = std::max(e.max_abs, std::isnan(err) ? inf : err);
    sum_sq += err * err;
    ++count;
  }
  const double rmse = count ? std::sqrt(sum_sq / double(count)) : 0.0;
  if (!std::isfinite(rmse)) e.psnr_db = -inf;
  else if (rmse > 0.0) e.psnr_db = 20.0 * std::log10(range / rmse);
  return e;
}

// ---------------------------------------------------------------------------------------------
// Results

struct baseline_result {
  double memcpy_1t = nan, memcpy_all = nan;
  double zstd_ratio = nan, zstd_c = nan, zstd_d = nan;
  double lz4_ratio = nan, lz4_c = nan, lz4_d = nan;
  double fp16_ratio = nan, fp16_c = nan, fp16_d = nan;
  double fp16_max_abs = nan, fp16_max_rel = nan, fp16_psnr = nan;
};

struct codec_result {
  double bound = 0.0;      // REL
  double abs_bound = 0.0;  // REL * range, computed here
  double ratio = nan;
  double c_1t = nan, d_1t = nan, c_all = nan, d_all = nan;
  double max_abs = nan, err_over_bound = nan, psnr = nan;
  bool ok = false;         // bound held, fills bit-exact, streams equal across thread counts
  std::string problem;     // why not ok
};

/// zfp in fixed-accuracy mode at one bound (one thread).
struct zfp_result {
  double ratio = nan, c_1t = nan, d_1t = nan;
  double max_abs = nan, err_over_bound = nan;
  std::size_t fill_changed = 0;  // fill values not back bit-exact (zfp knows no fill values)
};

struct file_result {
  kompress::test::data_file_info file;
  std::size_t bytes = 0;
  double range = 0.0;
  baseline_result base;
  std::vector<codec_result> codec;  // one per bound
  std::vector<zfp_result> zfp;      // one per bound; empty in a build without zfp
  std::string zfp_shape;            // the extents zfp was given, fastest first ("480x241x6")
  std::string error;                // an exception that stopped this file
};

constexpr bool have_zfp =
#ifdef KOMPRESS_BENCH_HAVE_ZFP
    true;
#else
    false;
#endif

// ---------------------------------------------------------------------------------------------
// The float16 cast, as ML frameworks do it: with the F16C instructions, chosen at run time,
// where the CPU has them (every x86-64 CPU since 2012), else _Float16's software conversion
// (what the default target compiles to: a libgcc call per value). Both round to nearest even.
// GCC does not vectorize _Float16 conversions without AVX512-FP16, hence the intrinsics.
// A double converts in one rounding through _Float16 (no F16C instruction takes doubles).
// nvcc's front end has no _Float16: compiled by nvcc, the cast goes through Kokkos's half_t
// (CUDA's __half) one value at a time; bench_codec_device measures the GPU's own cast.

#if defined(__CUDACC__)
using half_value = Kokkos::Experimental::half_t;
#else
using half_value = _Float16;
#endif

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__CUDACC__)
#define KOMPRESS_BENCH_F16C 1
__attribute__((target("avx,f16c"))) void to_half_f16c(const float* in, _Float16* out,
                                                      std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT));
  for (; i < n; ++i) out[i] = static_cast<_Float16>(in[i]);
}

__attribute__((target("avx,f16c"))) void from_half_f16c(const _Float16* in, float* out,
                                                        std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(out + i,
                     _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i))));
  for (; i < n; ++i) out[i] = static_cast<float>(in[i]);
}

#endif

template <class T>
void to_half(const T* in, half_value* out, std::size_t n) {
#ifdef KOMPRESS_BENCH_F16C
  if constexpr (std::is_same_v<T, float>)
    if (have_f16c()) return to_half_f16c(in, out, n);
#endif
  for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<half_value>(in[i]);
}

template <class T>
void from_half(const half_value* in, T* out, std::size_t n) {
#ifdef KOMPRESS_BENCH_F16C
  if constexpr (std::is_same_v<T, float>)
    if (have_f16c()) return from_half_f16c(in, out, n);
#endif
  for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<T>(in[i]);
}

// ---------------------------------------------------------------------------------------------
// Baselines

template <class T>
baseline_result run_baselines(const std::vector<T>& values, std::optional<double> fill,
                              double range, const options& opts, int threads) {
  baseline_result r;
  const std::size_t bytes = values.size() * sizeof(T);
  const char* const src = reinterpret_cast<const char*>(values.data());

  std::vector<char> copy(bytes);
  r.memcpy_1t = gbs(bytes, best_seconds([&] {
                        std::memcpy(copy.data(), src, bytes);
                        keep(copy.data());
                      },
                      opts.reps, opts.min_rep_seconds));
  // All threads: one contiguous piece per thread, each a std::memcpy.
  const std::size_t piece = (bytes + threads - 1) / threads;
  r.memcpy_all = gbs(bytes, best_seconds([&] {
                         Kokkos::parallel_for(
                             "bench::memcpy", Kokkos::RangePolicy<host_exec>(0, threads),
                             [&](int t) {
                               const std::size_t begin = std::min(bytes, t * piece);
                               const std::size_t end = std::min(bytes, begin + piece);
                               std::memcpy(copy.data() + begin, src + begin, end - begin);
                             });
                         keep(copy.data());
                       },
                       opts.reps, opts.min_rep_seconds));

  // zstd level 1, contexts made once as a careful user would.
  {
    std::vector<char> packed(ZSTD_compressBound(bytes));
    std::vector<char> unpacked(bytes);
    ZSTD_CCtx* cctx = ZSTD_createCCtx();
    ZSTD_DCtx* dctx = ZSTD_createDCtx();
    std::size_t packed_bytes = 0;
    r.zstd_c = gbs(bytes, best_seconds([&] {
                     packed_bytes = ZSTD_compressCCtx(cctx, packed.data(), packed.size(), src,
                                                      bytes, 1);
                     keep(packed.data());
                   },
                   opts.reps, opts.min_rep_seconds));
    if (ZSTD_isError(packed_bytes))
      throw std::runtime_error(std::string("zstd: ") + ZSTD_getErrorName(packed_bytes));
    std::size_t unpacked_bytes = 0;
    r.zstd_d = gbs(bytes, best_seconds([&] {
                     unpacked_bytes = ZSTD_decompressDCtx(dctx, unpacked.data(), unpacked.size(),
                                                          packed.data(), packed_bytes);
                     keep(unpacked.data());
                   },
                   opts.reps, opts.min_rep_seconds));
    if (ZSTD_isError(unpacked_bytes) || unpacked_bytes != bytes ||
        std::memcmp(unpacked.data(), src, bytes) != 0)
      throw std::runtime_error("zstd: round trip failed");
    r.zstd_ratio = double(bytes) / double(packed_bytes);
    ZSTD_freeCCtx(cctx);
    ZSTD_freeDCtx(dctx);
  }

  // lz4 (default acceleration).
  {
    if (bytes > std::size_t(LZ4_MAX_INPUT_SIZE)) throw std::runtime_error("lz4: input too large");
    std::vector<char> packed(LZ4_compressBound(int(bytes)));
    std::vector<char> unpacked(bytes);
    int packed_bytes = 0;
    r.lz4_c = gbs(bytes, best_seconds([&] {
                    packed_bytes = LZ4_compress_default(src, packed.data(), int(bytes),
                                                        int(packed.size()));
                    keep(packed.data());
                  },
                  opts.reps, opts.min_rep_seconds));
    if (packed_bytes <= 0) throw std::runtime_error("lz4: compression failed");
    int unpacked_bytes = 0;
    r.lz4_d = gbs(bytes, best_seconds([&] {
                    unpacked_bytes = LZ4_decompress_safe(packed.data(), unpacked.data(),
                                                         packed_bytes, int(unpacked.size()));
                    keep(unpacked.data());
                  },
                  opts.reps, opts.min_rep_seconds));
    if (unpacked_bytes != int(bytes) || std::memcmp(unpacked.data(), src, bytes) != 0)
      throw std::runtime_error("lz4: round trip failed");
    r.lz4_ratio = double(bytes) / double(packed_bytes);
  }

  // float16: IEEE binary16, round to nearest even (a double converts directly, one rounding).
  {
    std::vector<half_value> half(values.size());
    std::vector<T> back(values.size());
    r.fp16_c = gbs(bytes, best_seconds([&] {
                     to_half(values.data(), half.data(), values.size());
                     keep(half.data());
                   },
                   opts.reps, opts.min_rep_seconds));
    r.fp16_d = gbs(bytes, best_seconds([&] {
                     from_half(half.data(), back.data(), values.size());
                     keep(back.data());
                   },
                   opts.reps, opts.min_rep_seconds));
    r.fp16_ratio = double(sizeof(T)) / double(sizeof(half_value));
    const error_stats e = errors_of(values, back.data(), fill, range);
    r.fp16_max_abs = e.max_abs;
    r.fp16_max_rel = range > 0.0 ? e.max_abs / range : nan;
    r.fp16_psnr = e.psnr_db;
  }
  return r;
}

// ---------------------------------------------------------------------------------------------
// kompress

/// Calls f with an unmanaged LayoutRight View over `values` of the file's shape (rank 1 to 4;
/// the ratio codec's predictors follow it), or a rank-1 View for the fast codec.
template <class T, class F>
auto with_file_view(const std::vector<T>& values, const std::vector<std::size_t>& shape,
                    kompress::codec_mode codec, F&& f) {
  using unmanaged = Kokkos::MemoryTraits<Kokkos::Unmanaged>;
  const T* p = values.data();
  const auto e = [&](std::size_t d) { return shape[d]; };
  if (codec == kompress::codec_mode::ratio) {
    if (shape.size() == 2) return f(Kokkos::View<const T**, Kokkos::HostSpace, unmanaged>(p, e(0), e(1)));
    if (shape.size() == 3) return f(Kokkos::View<const T***, Kokkos::HostSpace, unmanaged>(p, e(0), e(1), e(2)));
    if (shape.size() == 4)
      return f(Kokkos::View<const T****, Kokkos::HostSpace, unmanaged>(p, e(0), e(1), e(2), e(3)));
  }
  return f(Kokkos::View<const T*, Kokkos::HostSpace, unmanaged>(p, values.size()));
}

/// best_seconds for two calls measured in turn, one repetition of each at a time: the
/// one-thread and all-thread calls then sample the same moments of a shared machine (other
/// processes come and go), so their ratio is not skewed by whichever ran in a busier moment.
template <class F1, class F2>
std::pair<double, double> best_seconds_alternating(F1&& f1, F2&& f2, int reps,
                                                   double min_rep_seconds) {
  std::pair<double, double> best{best_seconds(f1, 1, min_rep_seconds),
                                 best_seconds(f2, 1, min_rep_seconds)};
  for (int r = 1; r < reps; ++r) {
    best.first = std::min(best.first, best_seconds(f1, 1, min_rep_seconds));
    best.second = std::min(best.second, best_seconds(f2, 1, min_rep_seconds));
  }
  return best;
}

template <class T, class InView>
codec_result run_kompress(const std::vector<T>& values, const InView& in, std::optional<double> fill,
                          double range, double bound, const options& opts,
                          const Kokkos::OpenMP& one_thread, const host_exec& all_threads) {
  codec_result r;
  r.bound = bound;
  r.abs_bound = bound * range;
  const std::size_t bytes = values.size() * sizeof(T);
  const kompress::compress_options copts{.bound = kompress::relative(bound),
                                         .fill_value = fill,
                                         .block_size = opts.block_size,
                                         .codec = opts.codec};
  const std::size_t capacity = kompress::max_compressed_size(in, copts);
  Kokkos::View<std::byte*, Kokkos::HostSpace> stream_1t("bench::stream_1t", capacity);
  Kokkos::View<std::byte*, Kokkos::HostSpace> stream_all("bench::stream_all", capacity);
  Kokkos::View<T*, Kokkos::HostSpace> out_1t("bench::out_1t", values.size());
  Kokkos::View<T*, Kokkos::HostSpace> out_all("bench::out_all", values.size());

  std::size_t length_1t = 0, length_all = 0;
  const auto [c_1t, c_all] = best_seconds_alternating(
      [&] { length_1t = kompress::compress(one_thread, in, stream_1t, copts); },
      [&] { length_all = kompress::compress(all_threads, in, stream_all, copts); }, opts.reps,
      opts.min_rep_seconds);
  r.c_1t = gbs(bytes, c_1t);
  r.c_all = gbs(bytes, c_all);
  const auto packed_1t = Kokkos::subview(stream_1t, std::pair<std::size_t, std::size_t>(0, length_1t));
  const auto packed_all = Kokkos::subview(stream_all, std::pair<std::size_t, std::size_t>(0, length_all));
  const auto [d_1t, d_all] = best_seconds_alternating(
      [&] { kompress::decompress(one_thread, packed_1t, out_1t); },
      [&] { kompress::decompress(all_threads, packed_all, out_all); }, opts.reps,
      opts.min_rep_seconds);
  r.d_1t = gbs(bytes, d_1t);
  r.d_all = gbs(bytes, d_all);
  r.ratio = double(bytes) / double(length_1t);

  const kompress::stream_info info = kompress::inspect(packed_1t);
  const error_stats e = errors_of(values, out_1t.data(), fill, range);
  const error_stats e_all = errors_of(values, out_all.data(), fill, range);
  r.max_abs = std::max(e.max_abs, e_all.max_abs);
  r.err_over_bound = r.abs_bound > 0.0 ? r.max_abs / r.abs_bound : (r.max_abs > 0.0 ? inf : 0.0);
  r.psnr = e.psnr_db;

  std::ostringstream problem;
  if (length_1t != length_all ||
      std::memcmp(stream_1t.data(), stream_all.data(), length_1t) != 0)
    problem << "stream differs between 1 and all threads; ";
  if (!(r.err_over_bound <= 1.0)) problem << "bound broken (" << r.err_over_bound << " x eb); ";
  if (e.fill_changed + e_all.fill_changed)
    problem << (e.fill_changed + e_all.fill_changed) << " fill values changed; ";
  if (info.absolute_bound > r.abs_bound * (1 + 1e-12))
    problem << "stream's absolute bound " << info.absolute_bound << " exceeds REL x range "
            << r.abs_bound << "; ";
  r.problem = problem.str();
  r.ok = r.problem.empty();
  return r;
}

// ---------------------------------------------------------------------------------------------
// zfp

/// The extents zfp is given for an array of `shape` (C order, slowest first): fastest first,
/// extents of 1 dropped, at most three (a 4-D array's two slowest extents become one).
std::vector<std::size_t> zfp_extents(const std::vector<std::size_t>& shape) {
  std::vector<std::size_t> extents;
  for (auto it = shape.rbegin(); it != shape.rend(); ++it)
    if (*it != 1) extents.push_back(*it);
  while (extents.size() > 3) {
    extents[extents.size() - 2] *= extents.back();
    extents.pop_back();
  }
  if (extents.empty()) extents.push_back(1);
  return extents;
}

#ifdef KOMPRESS_BENCH_HAVE_ZFP
/// zfp 1.0, fixed accuracy with tolerance = REL x range (the bound kompress gets), serial
/// execution, buffers and the stream made once; each timed call rewinds the stream.
template <class T>
zfp_result run_zfp(const std::vector<T>& values, const std::vector<std::size_t>& extents,
                   std::optional<double> fill, double range, double bound, const options& opts) {
  zfp_result r;
  const double tolerance = bound * range;
  const std::size_t bytes = values.size() * sizeof(T);
  const zfp_type type = std::is_same_v<T, float> ? zfp_type_float : zfp_type_double;
  std::vector<T> decoded(values.size());
  const auto make_field = [&](T* data) {
    switch (extents.size()) {
      case 1: return zfp_field_1d(data, type, extents[0]);
      case 2: return zfp_field_2d(data, type, extents[0], extents[1]);
      default: return zfp_field_3d(data, type, extents[0], extents[1], extents[2]);
    }
  };
  const std::unique_ptr<zfp_field, void (*)(zfp_field*)> in(
      make_field(const_cast<T*>(values.data())), zfp_field_free);
  const std::unique_ptr<zfp_field, void (*)(zfp_field*)> out(make_field(decoded.data()),
                                                             zfp_field_free);
  const std::unique_ptr<zfp_stream, void (*)(zfp_stream*)> zfp(zfp_stream_open(nullptr),
                                                               zfp_stream_close);
  if (!in || !out || !zfp) throw std::runtime_error("zfp: cannot set up the field or stream");
  zfp_stream_set_accuracy(zfp.get(), tolerance);
  if (!zfp_stream_set_execution(zfp.get(), zfp_exec_serial))
    throw std::runtime_error("zfp: no serial execution");
  std::vector<unsigned char> buffer(zfp_stream_maximum_size(zfp.get(), in.get()));
  const std::unique_ptr<bitstream, void (*)(bitstream*)> stream(
      stream_open(buffer.data(), buffer.size()), stream_close);
  zfp_stream_set_bit_stream(zfp.get(), stream.get());

  std::size_t packed_bytes = 0;
  r.c_1t = gbs(bytes, best_seconds([&] {
                 zfp_stream_rewind(zfp.get());
                 packed_bytes = zfp_compress(zfp.get(), in.get());
                 keep(buffer.data());
               },
               opts.reps, opts.min_rep_seconds));
  if (packed_bytes == 0) throw std::runtime_error("zfp: compression failed");
  std::size_t consumed = 0;
  r.d_1t = gbs(bytes, best_seconds([&] {
                 zfp_stream_rewind(zfp.get());
                 consumed = zfp_decompress(zfp.get(), out.get());
                 keep(decoded.data());
               },
               opts.reps, opts.min_rep_seconds));
  if (consumed == 0) throw std::runtime_error("zfp: decompression failed");
  r.ratio = double(bytes) / double(packed_bytes);
  const error_stats e = errors_of(values, decoded.data(), fill, range);
  r.max_abs = e.max_abs;
  r.err_over_bound = tolerance > 0.0 ? e.max_abs / tolerance : (e.max_abs > 0.0 ? inf : 0.0);
  r.fill_changed = e.fill_changed;
  return r;
}
#endif

template <class T>
void run_file(file_result& result, const options& opts, const Kokkos::OpenMP& one_thread,
              const host_exec& all_threads, int threads) {
  const std::vector<T> values = kompress::test::read_raw<T>(result.file.name);
  result.bytes = values.size() * sizeof(T);
  const value_stats stats = stats_of(values, result.file.fill_value);
  result.range = stats.range();
  result.base = run_baselines(values, result.file.fill_value, result.range, opts, threads);
  for (const double bound : opts.bounds)
    result.codec.push_back(with_file_view(values, result.file.shape, opts.codec, [&](const auto& in) {
      return run_kompress(values, in, result.file.fill_value, result.range, bound, opts,
                          one_thread, all_threads);
    }));
  const std::vector<std::size_t> extents = zfp_extents(result.file.shape);
  for (std::size_t i = 0; i < extents.size(); ++i) {  // appended piece by piece: GCC 12 sees
    if (i) result.zfp_shape += 'x';                   // an overlap in "x" + string that is not
    result.zfp_shape += std::to_string(extents[i]);   // there (-Wrestrict, its bug 105329)
  }
#ifdef KOMPRESS_BENCH_HAVE_ZFP
  for (const double bound : opts.bounds)
    result.zfp.push_back(
        run_zfp(values, extents, result.file.fill_value, result.range, bound, opts));
#endif
}

// ---------------------------------------------------------------------------------------------
// Summaries

const std::vector<std::string> families = {"science", "embedding", "activation"};

/// The files SZx was measured on as "embedding tables / DLRM lookups / gradients" (codec.md).
bool szx_embedding_set(const std::string& name) {
  return name.starts_with("emb_word2vec") || name.starts_with("dlrm_flights_tables") ||
         name.starts_with("dlrm_flights_lookup_fwd") || name.starts_with("dlrm_flights_lookup_grad");
}

/// Geometric means of a codec field over the files chosen by `keep_file`, at one bound.
double codec_geomean(const std::vector<file_result>& results, std::size_t bound_index,
                     const std::function<bool(const file_result&)>& keep_file,
                     const std::function<double(const codec_result&)>& field) {
  std::vector<double> xs;
  for (const auto& r : results)
    if (r.error.empty() && keep_file(r)) xs.push_back(field(r.codec[bound_index]));
  return geomean(xs);
}

/// Geometric mean of a zfp field over the files chosen by `keep_file`, at one bound.
double zfp_geomean(const std::vector<file_result>& results, std::size_t bound_index,
                   const std::function<bool(const file_result&)>& keep_file,
                   const std::function<double(const zfp_result&)>& field) {
  std::vector<double> xs;
  for (const auto& r : results)
    if (r.error.empty() && keep_file(r) && bound_index < r.zfp.size())
      xs.push_back(field(r.zfp[bound_index]));
  return geomean(xs);
}

double base_geomean(const std::vector<file_result>& results,
                    const std::function<bool(const file_result&)>& keep_file,
                    const std::function<double(const file_result&)>& field) {
  std::vector<double> xs;
  for (const auto& r : results)
    if (r.error.empty() && keep_file(r)) xs.push_back(field(r));
  return geomean(xs);
}

// ---------------------------------------------------------------------------------------------
// Printing

std::string fmt(double x, int precision = 2) {
  if (std::isnan(x)) return "-";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, "%.*f", precision, x);
  return buffer;
}

std::string fmt_g(double x, int digits = 3) {
  if (std::isnan(x)) return "-";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, "%.*g", digits, x);
  return buffer;
}

std::string csv_num(double x) {
  if (std::isnan(x)) return "";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, "%.6g", x);
  return buffer;
}

/// Other processes on the cores make every timing low, and the all-thread ones wildly so: an
/// OpenMP thread that loses its core stalls every fork-join for a scheduler slice (~10 ms).
void warn_if_busy(double load, int threads) {
  if (load > 0.5)
    std::printf("WARNING: 1-minute load average %.2f (this run needs %d cores): other processes "
                "share the cores, so timings are low, all-thread ones can be far too low. "
                "Rerun on an idle machine.\n",
                load, threads);
}

std::string short_name(const std::string& name) {
  return name.size() <= 40 ? name : name.substr(0, 39) + "~";
}

void print_codec_table(const std::vector<file_result>& results, const options& opts, int threads) {
  const std::string nt = std::to_string(threads) + "T";
  std::printf("\nkompress, block %d. GB/s = uncompressed bytes / s, fastest call of %d "
              "repetitions of >= %g ms. 1T = one thread,\n%s = all threads. '/mc' = speed / "
              "memcpy's on as many threads. err/eb = max |x - x'| / (REL x range), must be "
              "<= 1.\n\n",
              opts.block_size, opts.reps, opts.min_rep_seconds * 1e3, nt.c_str());
  std::printf("%-40s %6s %7s %6s %6s %6s %6s %6s %6s %6s %6s %8s %6s %5s\n", "file", "REL",
              "ratio", "c1T", "d1T", ("c" + nt).c_str(), ("d" + nt).c_str(), "c1/mc", "d1/mc",
              ("c" + nt + "/mc").c_str(), ("d" + nt + "/mc").c_str(), "err/eb", "PSNR", "ok");
  const std::string rule(40 + 7 + 8 + 7 * 8 + 9 + 7 + 6, '-');
  for (const auto& family : families) {
    std::printf("%s\n", rule.c_str());
    bool any = false;
    for (const auto& r : results) {
      if (r.file.family != family) continue;
      any = true;
      if (!r.error.empty()) {
        std::printf("%-40s ERROR: %s\n", short_name(r.file.name).c_str(), r.error.c_str());
        continue;
      }
      for (const auto& c : r.codec)
        std::printf("%-40s %6.0e %7.2f %6.2f %6.2f %6.2f %6.2f %6.3f %6.3f %6.3f %6.3f %8.4f %6s %5s\n",
                    short_name(r.file.name).c_str(), c.bound, c.ratio, c.c_1t, c.d_1t, c.c_all,
                    c.d_all, c.c_1t / r.base.memcpy_1t, c.d_1t / r.base.memcpy_1t,
                    c.c_all / r.base.memcpy_all, c.d_all / r.base.memcpy_all, c.err_over_bound,
                    fmt(c.psnr, 1).c_str(), c.ok ? "yes" : "NO");
    }
    if (!any) continue;
    for (std::size_t b = 0; b < opts.bounds.size(); ++b) {
      const auto in_family = [&](const file_result& r) { return r.file.family == family; };
      const auto g = [&](auto field) { return codec_geomean(results, b, in_family, field); };
      const auto frac = [&](auto speed, auto memcpy_speed) {
        std::vector<double> xs;
        for (const auto& r : results)
          if (r.error.empty() && in_family(r)) xs.push_back(speed(r.codec[b]) / memcpy_speed(r.base));
        return geomean(xs);
      };
      double worst = 0.0;
      for (const auto& r : results)
        if (r.error.empty() && in_family(r)) worst = std::max(worst, r.codec[b].err_over_bound);
      std::printf("%-40s %6.0e %7.2f %6.2f %6.2f %6.2f %6.2f %6.3f %6.3f %6.3f %6.3f %8.4f %6s %5s\n",
                  ("geomean " + family).c_str(), opts.bounds[b],
                  g([](const codec_result& c) { return c.ratio; }),
                  g([](const codec_result& c) { return c.c_1t; }),
                  g([](const codec_result& c) { return c.d_1t; }),
                  g([](const codec_result& c) { return c.c_all; }),
                  g([](const codec_result& c) { return c.d_all; }),
                  frac([](const codec_result& c) { return c.c_1t; }, [](const baseline_result& m) { return m.memcpy_1t; }),
                  frac([](const codec_result& c) { return c.d_1t; }, [](const baseline_result& m) { return m.memcpy_1t; }),
                  frac([](const codec_result& c) { return c.c_all; }, [](const baseline_result& m) { return m.memcpy_all; }),
                  frac([](const codec_result& c) { return c.d_all; }, [](const baseline_result& m) { return m.memcpy_all; }),
                  worst, "", "");
    }
  }
  for (const auto& r : results)
    for (const auto& c : r.codec)
      if (!c.ok) std::printf("PROBLEM %s REL %g: %s\n", r.file.name.c_str(), c.bound, c.problem.c_str());
}

void print_baseline_table(const std::vector<file_result>& results, int threads) {
  const std::string nt = std::to_string(threads) + "T";
  std::printf("\nBaselines, same files, one thread (memcpy also on all threads). GB/s = "
              "uncompressed bytes / s.\nfp16 rel = max |x - x'| / range (compare with REL); "
              "inf where values overflow binary16 (|x| > 65504). fp16 cast of float: %s;\n"
              "of double: _Float16 in software (one libgcc call per value).\n\n",
              have_f16c() ? "F16C instructions (chosen at run time)"
                          : "_Float16 in software (no F16C on this CPU)");
  std::printf("%-40s %7s %7s %7s | %6s %6s %6s | %6s %6s %6s | %5s %6s %6s %9s %6s\n", "file",
              "MB", "mc1T", ("mc" + nt).c_str(), "zstd1", "c", "d", "lz4", "c", "d", "fp16",
              "c", "d", "rel err", "PSNR");
  const std::string rule(40 + 8 * 3 + 2 + 7 * 3 + 2 + 7 * 3 + 2 + 6 + 7 * 2 + 10 + 7, '-');
  for (const auto& family : families) {
    std::printf("%s\n", rule.c_str());
    bool any = false;
    for (const auto& r : results) {
      if (r.file.family != family || !r.error.empty()) continue;
      any = true;
      const auto& b = r.base;
      std::printf("%-40s %7.2f %7.2f %7.2f | %6.2f %6.2f %6.2f | %6.2f %6.2f %6.2f | %5.1f %6.2f %6.2f %9s %6s\n",
                  short_name(r.file.name).c_str(), double(r.bytes) / 1e6, b.memcpy_1t,
                  b.memcpy_all, b.zstd_ratio, b.zstd_c, b.zstd_d, b.lz4_ratio, b.lz4_c, b.lz4_d,
                  b.fp16_ratio, b.fp16_c, b.fp16_d, fmt_g(b.fp16_max_rel, 2).c_str(),
                  fmt(b.fp16_psnr, 1).c_str());
    }
    if (!any) continue;
    const auto in_family = [&](const file_result& r) { return r.file.family == family; };
    const auto g = [&](auto field) { return base_geomean(results, in_family, field); };
    std::printf("%-40s %7s %7.2f %7.2f | %6.2f %6.2f %6.2f | %6.2f %6.2f %6.2f | %5s %6.2f %6.2f %9s %6s\n",
                ("geomean " + family).c_str(), "",
                g([](const file_result& r) { return r.base.memcpy_1t; }),
                g([](const file_result& r) { return r.base.memcpy_all; }),
                g([](const file_result& r) { return r.base.zstd_ratio; }),
                g([](const file_result& r) { return r.base.zstd_c; }),
                g([](const file_result& r) { return r.base.zstd_d; }),
                g([](const file_result& r) { return r.base.lz4_ratio; }),
                g([](const file_result& r) { return r.base.lz4_c; }),
                g([](const file_result& r) { return r.base.lz4_d; }), "",
                g([](const file_result& r) { return r.base.fp16_c; }),
                g([](const file_result& r) { return r.base.fp16_d; }), "", "");
  }
}

// The ratio codec's targets, for --codec ratio. codec.md, "PFPL measured here" and "SZx and zfp
// measured here, same run as kompress": PFPL's geometric means over the 19 science fields without
// fill values, and SZx's and zfp's ratio on every file at REL 1e-2 / 1e-3 / 1e-4.
struct reference_ratios {
  const char* file;
  double szx[3], zfp[3];
};
const reference_ratios szx_zfp_ratios[] = {
    {"act_cnn_s3_relu_out_128x64x8x8.f32", {3.75, 2.73, 2.47}, {3.32, 2.53, 2.05}},
    {"act_cnn_stem_conv_out_128x16x32x32.f32", {2.88, 2.23, 1.72}, {4.15, 2.99, 2.17}},
    {"act_cnn_stem_relu_out_128x16x32x32.f32", {3.76, 2.70, 2.27}, {4.03, 2.68, 2.14}},
    {"act_mlp_fc1_out_1024x1024.f32", {2.04, 1.39, 1.35}, {3.81, 2.58, 2.08}},
    {"act_mlp_relu2_out_1024x1024.f32", {2.56, 1.81, 1.74}, {3.25, 2.49, 2.02}},
    {"act_tfm_b0_attn_probs_32x4x128x128.f32", {8.25, 6.30, 4.71}, {11.25, 7.34, 4.99}},
    {"act_tfm_b1_ln1_in_32x128x128.f32", {1.98, 1.35, 1.33}, {3.34, 2.36, 1.93}},
    {"cesm_trefht_4x110x64x128.f32", {3.28, 2.70, 2.02}, {5.89, 3.80, 2.80}},
    {"dlrm_flights_lookup_fwd_1024x10x128.f32", {2.06, 1.53, 1.44}, {2.55, 1.98, 1.62}},
    {"dlrm_flights_lookup_grad_1024x10x128.f32", {3.20, 1.98, 1.57}, {3.53, 2.31, 1.84}},
    {"dlrm_flights_tables_10492x128.f32", {2.23, 1.82, 1.46}, {3.96, 2.89, 2.27}},
    {"emb_word2vec_googlenews_8000x300.f32", {2.16, 1.50, 1.45}, {3.57, 2.67, 2.00}},
    {"era5_t2m_uk_744x33x49.f32", {3.13, 2.37, 1.84}, {5.79, 3.21, 2.40}},
    {"erai_u_2x3x241x480.f32", {5.67, 3.25, 2.63}, {6.28, 3.18, 2.27}},
    {"erai_z_2x3x241x480.f32", {76.32, 6.47, 3.62}, {6.71, 4.44, 2.97}},
    {"foam_ocean_v_24x128x128.f32", {1.76, 1.74, 1.73}, {3.23, 2.99, 2.69}},
    {"grad_cnn_stem_relu_out_128x16x32x32.f32", {3.25, 2.27, 1.68}, {5.07, 3.44, 2.41}},
    {"grad_mlp_fc1_out_1024x1024.f32", {51.51, 31.40, 20.05}, {35.73, 19.32, 9.96}},
    {"grad_tfm_b0_ln2_in_32x128x128.f32", {2.27, 1.77, 1.47}, {3.50, 2.63, 2.11}},
    {"hacc_vx_32768.f32", {2.28, 1.72, 1.60}, {3.25, 2.49, 2.02}},
    {"hacc_x_32768.f32", {3.52, 2.71, 1.96}, {3.77, 2.80, 2.07}},
    {"mitgcm_deepconv_t_50x100x100.f32", {51.20, 41.56, 32.35}, {26.69, 22.26, 17.81}},
    {"mitgcm_deepconv_u_50x100x100.f32", {24.05, 8.63, 3.22}, {56.03, 31.01, 15.64}},
    {"mitgcm_fizhi_theta_40x32x192.f64", {7.65, 5.64, 4.21}, {16.79, 9.56, 6.00}},
    {"mitgcm_ocean_theta_15x40x90.f64", {10.57, 8.02, 6.32}, {11.30, 7.84, 5.56}},
    {"mitgcm_ocean_uvel_15x40x90.f64", {14.12, 8.74, 7.14}, {16.56, 10.27, 7.41}},
    {"mpas_surface_pressure_163842.f64", {9.31, 5.64, 4.55}, {6.24, 4.54, 3.74}},
    {"nemo_orca2_sst_5x149x182.f32", {1.67, 1.66, 1.63}, {2.77, 2.34, 1.93}},
    {"nyx_baryon_density_32x32x32.f32", {23.65, 8.67, 3.58}, {13.81, 6.93, 4.26}},
    {"nyx_dark_matter_density_32x32x32.f32", {27.44, 4.46, 3.09}, {12.42, 4.86, 3.34}},
    {"nyx_temperature_32x32x32.f32", {4.52, 3.10, 2.51}, {5.70, 3.71, 2.76}},
    {"nyx_velocity_x_32x32x32.f32", {4.04, 3.03, 2.23}, {5.84, 3.77, 2.56}},
    {"pop_temp_384x320.f32", {1.69, 1.68, 1.64}, {4.40, 3.57, 2.79}},
    {"sz_testdouble_8x8x8x128.f64", {50.34, 36.72, 31.76}, {9.97, 7.88, 6.51}},
    {"sz_testfloat_8x8x128.f32", {4.89, 3.28, 2.51}, {4.80, 3.47, 2.53}},
    {"wrf_katrina_qrain_4x14x48x48.f32", {14.10, 9.05, 6.53}, {23.70, 12.57, 8.05}},
};

template <class Line>
void print_ratio_targets(const std::vector<file_result>& results, const options& opts, Line& line) {
  const auto bound_index = [&](double bound) -> std::optional<std::size_t> {
    for (std::size_t i = 0; i < opts.bounds.size(); ++i)
      if (std::fabs(opts.bounds[i] - bound) <= 1e-9 * bound) return i;
    return std::nullopt;
  };
  const auto science_19 = [](const file_result& r) {
    return r.file.family == "science" && !r.file.fill_value;
  };
  const auto ratio = [](const codec_result& c) { return c.ratio; };
  const double rels[3] = {1e-2, 1e-3, 1e-4}, pfpl[3] = {37.3, 15.3, 7.9};
  std::printf(" Ratio codec: science fields without fill values, geometric means\n");
  std::printf("  (22 science fields, fills declared:");
  for (int k = 0; k < 3; ++k) {
    const auto i = bound_index(rels[k]);
    std::printf(" %s", i ? fmt(codec_geomean(results, *i, [](const file_result& r) {
                                 return r.file.family == "science";
                               }, ratio)).c_str() : "-");
  }
  std::printf(" at REL 1e-2 / 1e-3 / 1e-4)\n");
  for (int k = 0; k < 3; ++k) {
    const auto i = bound_index(rels[k]);
    char what[96];
    std::snprintf(what, sizeof what, "science-19, REL %.0e, >= PFPL (%.1f)", rels[k], pfpl[k]);
    line(what, i ? codec_geomean(results, *i, science_19, ratio) : nan, pfpl[k], true);
  }
  const auto embedding = [](const file_result& r) { return r.file.family == "embedding"; };
  const auto activation = [](const file_result& r) { return r.file.family == "activation"; };
  const auto i2 = bound_index(1e-2);
  line("embeddings + DLRM, REL 1e-2, >= fast codec today (8.56)",
       i2 ? codec_geomean(results, *i2, embedding, ratio) : nan, 8.56, true);
  line("activations, REL 1e-2, >= fast codec today (10.8)",
       i2 ? codec_geomean(results, *i2, activation, ratio) : nan, 10.8, true);
  // Every file at least SZx's and zfp's ratio.
  int below = 0, compared = 0;
  double worst = inf;
  std::string worst_what;
  for (const auto& r : results) {
    if (!r.error.empty()) continue;
    for (const auto& ref : szx_zfp_ratios) {
      if (r.file.name != ref.file) continue;
      for (int k = 0; k < 3; ++k) {
        const auto i = bound_index(rels[k]);
        if (!i) continue;
        const double mine = r.codec[*i].ratio, best = std::max(ref.szx[k], ref.zfp[k]);
        ++compared;
        if (mine < best) {
          ++below;
          std::printf("    below SZx/zfp: %-40s REL %.0e: %.2f < %.2f (SZx %.2f, zfp %.2f)\n",
                      short_name(r.file.name).c_str(), rels[k], mine, best, ref.szx[k], ref.zfp[k]);
        }
        if (mine / best < worst) {
          worst = mine / best;
          worst_what = r.file.name + " at REL " + fmt_g(rels[k], 1);
        }
      }
    }
  }
  std::printf("  every file >= SZx and zfp: %d of %d file x bound cases below; worst ratio / theirs "
              "%.2f (%s)\n", below, compared, worst, worst_what.c_str());
  line("file x bound cases at or above both SZx and zfp (all of them)", double(compared - below),
       double(compared), compared > 0);
}

// kompress beside zfp, file by file: ratio, one-thread speeds, max error / bound.
void print_zfp_table(const std::vector<file_result>& results, const options& opts) {
  if (!have_zfp) {
    std::printf("\nzfp: not in this build (bench/CMakeLists.txt found no zfp; Debian: libzfp-dev)\n");
    return;
  }
#ifdef KOMPRESS_BENCH_HAVE_ZFP
  std::printf("\nkompress (k) beside zfp %s (z): fixed accuracy, tolerance = REL x range, the "
              "array's shape from its name\n(fastest extent first, up to 3-D), one thread, same "
              "run. err/eb = max |x - x'| / (REL x range) over the non-fill values;\nzfp's "
              "accuracy mode is not a strict bound ('>1' marks a violation; 'fill': fill values "
              "not kept).\n\n",
              ZFP_VERSION_STRING);
#endif
  std::printf("%-40s %6s %14s | %7s %7s | %6s %6s | %6s %6s | %7s %7s %5s\n", "file", "REL",
              "zfp shape", "k ratio", "z ratio", "k c1T", "z c1T", "k d1T", "z d1T", "k er/eb",
              "z er/eb", "note");
  const std::string rule(40 + 7 + 15 + 2 + 16 + 2 + 14 + 2 + 14 + 2 + 16 + 6, '-');
  for (const auto& family : families) {
    bool any = false;
    for (const auto& r : results) {
      if (r.file.family != family || !r.error.empty() || r.zfp.empty()) continue;
      if (!any) std::printf("%s\n", rule.c_str());
      any = true;
      for (std::size_t b = 0; b < r.codec.size(); ++b) {
        const codec_result& k = r.codec[b];
        const zfp_result& z = r.zfp[b];
        const std::string note = z.fill_changed ? "fill" : (z.err_over_bound > 1.0 ? ">1" : "");
        // zfp's error over the bound reaches 1e4 on the fill files: 4 significant digits.
        const std::string z_err = z.err_over_bound < 10.0 ? fmt(z.err_over_bound, 4)
                                                          : fmt_g(z.err_over_bound, 4);
        std::printf("%-40s %6.0e %14s | %7.2f %7.2f | %6.2f %6.2f | %6.2f %6.2f | %7.4f %7s %5s\n",
                    short_name(r.file.name).c_str(), k.bound, r.zfp_shape.c_str(), k.ratio,
                    z.ratio, k.c_1t, z.c_1t, k.d_1t, z.d_1t, k.err_over_bound, z_err.c_str(),
                    note.c_str());
      }
    }
    if (!any) continue;
    const auto in_family = [&](const file_result& r) { return r.file.family == family; };
    for (std::size_t b = 0; b < opts.bounds.size(); ++b) {
      const auto k = [&](auto field) { return codec_geomean(results, b, in_family, field); };
      const auto z = [&](auto field) { return zfp_geomean(results, b, in_family, field); };
      std::size_t violations = 0;
      for (const auto& r : results)
        if (r.error.empty() && in_family(r) && !r.zfp.empty() &&
            (r.zfp[b].err_over_bound > 1.0 || r.zfp[b].fill_changed))
          ++violations;
      std::printf("%-40s %6.0e %14s | %7.2f %7.2f | %6.2f %6.2f | %6.2f %6.2f | %7s %7s %5s\n",
                  ("geomean " + family).c_str(), opts.bounds[b], "",
                  k([](const codec_result& c) { return c.ratio; }),
                  z([](const zfp_result& c) { return c.ratio; }),
                  k([](const codec_result& c) { return c.c_1t; }),
                  z([](const zfp_result& c) { return c.c_1t; }),
                  k([](const codec_result& c) { return c.d_1t; }),
                  z([](const zfp_result& c) { return c.d_1t; }), "", "",
                  violations ? (std::to_string(violations) + "!").c_str() : "");
    }
  }
}

/// SZx's geometric means on this data and machine (codec.md, "SZx measured here": blocked mode,
/// block 128, one thread, best of 5), NaN where not measured: {ratio, compress, decompress}.
struct szx_numbers {
  double ratio = nan, c = nan, d = nan;
};
szx_numbers szx_reference(const std::string& family, double bound) {
  const auto near = [&](double b) { return std::fabs(bound - b) <= 1e-9 * b; };
  if (family == "science") {
    if (near(1e-2)) return {10.5, 1.23, 2.03};
    if (near(1e-3)) return {6.1, 1.04, 1.49};
    if (near(1e-4)) return {4.6, 0.93, 1.29};
  } else if (family == "embedding") {  // word2vec and the three DLRM files: our embedding family
    if (near(1e-2)) return {2.37, 0.48, 0.67};
    if (near(1e-3)) return {1.70, 0.45, 0.63};
  }
  return {};
}

// One line per family and bound (and over all bounds): geometric means of kompress's ratio
// and speeds, its scaling, zfp's, and SZx's from codec.md.
void print_speed_summary(const std::vector<file_result>& results, const options& opts,
                         int threads) {
  const std::string nt = std::to_string(threads) + "T";
  std::printf("\nPer family, geometric means (\"all\": over every file and bound). kompress: "
              "ratio, one-thread GB/s, %s / 1T;\nzfp: same run, one thread; SZx: codec.md "
              "(\"SZx measured here\", one thread, same data and machine; '-' not measured).\n\n",
              nt.c_str());
  std::printf("%-12s %6s | %7s %6s %6s %7s %7s | %7s %6s %6s | %7s %6s %6s | %7s\n", "family",
              "REL", "ratio", "c1T", "d1T", ("c" + nt + "/1T").c_str(),
              ("d" + nt + "/1T").c_str(), "zfp rat", "z c1T", "z d1T", "SZx rat", "S c1T",
              "S d1T", "c1T/SZx");
  const std::string rule(12 + 7 + 2 + 37 + 2 + 21 + 2 + 21 + 2 + 7, '-');
  for (const auto& family : families) {
    const auto in_family = [&](const file_result& r) { return r.file.family == family; };
    bool any = false;
    for (const auto& r : results) any = any || (r.error.empty() && in_family(r));
    if (!any) continue;
    std::printf("%s\n", rule.c_str());
    for (std::size_t b = 0; b <= opts.bounds.size(); ++b) {
      const bool all = b == opts.bounds.size();
      std::vector<std::size_t> bounds;
      if (all) {
        for (std::size_t i = 0; i < opts.bounds.size(); ++i) bounds.push_back(i);
      } else {
        bounds.push_back(b);
      }
      const auto k = [&](auto field) {
        std::vector<double> xs;
        for (const auto& r : results)
          if (r.error.empty() && in_family(r))
            for (std::size_t i : bounds) xs.push_back(field(r.codec[i]));
        return geomean(xs);
      };
      const auto z = [&](auto field) {
        std::vector<double> xs;
        for (const auto& r : results)
          if (r.error.empty() && in_family(r) && !r.zfp.empty())
            for (std::size_t i : bounds) xs.push_back(field(r.zfp[i]));
        return geomean(xs);
      };
      szx_numbers szx;
      if (all) {
        std::vector<double> rs, cs, ds;
        for (const double bound : opts.bounds) {
          const szx_numbers one = szx_reference(family, bound);
          rs.push_back(one.ratio), cs.push_back(one.c), ds.push_back(one.d);
        }
        szx = {geomean(rs), geomean(cs), geomean(ds)};
      } else {
        szx = szx_reference(family, opts.bounds[b]);
      }
      const double c1 = k([](const codec_result& c) { return c.c_1t; });
      char rel[16];
      std::snprintf(rel, sizeof rel, "%.0e", all ? 0.0 : opts.bounds[b]);
      std::printf("%-12s %6s | %7.2f %6.2f %6.2f %7.2f %7.2f | %7s %6s %6s | %7s %6s %6s | %7s\n",
                  family.c_str(), all ? "all" : rel,
                  k([](const codec_result& c) { return c.ratio; }), c1,
                  k([](const codec_result& c) { return c.d_1t; }),
                  k([](const codec_result& c) { return c.c_all / c.c_1t; }),
                  k([](const codec_result& c) { return c.d_all / c.d_1t; }),
                  fmt(z([](const zfp_result& c) { return c.ratio; })).c_str(),
                  fmt(z([](const zfp_result& c) { return c.c_1t; })).c_str(),
                  fmt(z([](const zfp_result& c) { return c.d_1t; })).c_str(), fmt(szx.ratio).c_str(),
                  fmt(szx.c).c_str(), fmt(szx.d).c_str(), fmt(c1 / szx.c).c_str());
    }
  }
}

// The codec's targets (docs/performance.md; the SZx numbers from shared/design/codec.md, "SZx
// measured here" and "Numbers to beat"). Returns the number not met.
int print_targets(const std::vector<file_result>& results, const options& opts, int threads) {
  std::printf("\nTargets (SZx numbers: codec.md, \"SZx measured here\": blocked mode, 1 thread, "
              "same data and machine)\n\n");
  int not_met = 0, checked = 0;
  const auto line = [&](const std::string& what, double value, double target, bool applicable) {
    if (!applicable || std::isnan(value)) {
      std::printf("  %-72s %8s  (not measured in this run)\n", what.c_str(), "-");
      return;
    }
    const bool met = value >= target;
    ++checked;
    if (!met) ++not_met;
    std::printf("  %-72s %8.2f  >= %-6.2f %s\n", what.c_str(), value, target,
                met ? "MET" : "NOT MET");
  };
  const auto bound_index = [&](double bound) -> std::optional<std::size_t> {
    for (std::size_t i = 0; i < opts.bounds.size(); ++i)
      if (std::fabs(opts.bounds[i] - bound) <= 1e-9 * bound) return i;
    return std::nullopt;
  };
  const auto science = [](const file_result& r) { return r.file.family == "science"; };
  const auto embedding = [](const file_result& r) { return szx_embedding_set(r.file.name); };
  const auto any_file = [](const file_result&) { return true; };
  const auto geo = [&](double bound, const std::function<bool(const file_result&)>& keep_file,
                       const std::function<double(const codec_result&)>& field) {
    const auto i = bound_index(bound);
    return i ? codec_geomean(results, *i, keep_file, field) : nan;
  };
  const auto ratio = [](const codec_result& c) { return c.ratio; };
  const auto c1 = [](const codec_result& c) { return c.c_1t; };
  const auto d1 = [](const codec_result& c) { return c.d_1t; };

  if (opts.codec == kompress::codec_mode::ratio) print_ratio_targets(results, opts, line);
  std::printf(" Ratio (geometric means)\n");
  line("science fields, REL 1e-3, >= 2x SZx (6.1)", geo(1e-3, science, ratio), 12.2, true);
  line("science fields, REL 1e-4, >= 2x SZx (4.6)", geo(1e-4, science, ratio), 9.2, true);
  line("embedding files (word2vec, DLRM tables/lookups/grads), REL 1e-2, >= 6",
       geo(1e-2, embedding, ratio), 6.0, true);
  // The targets: >= 2 GB/s compression and >= 4 GB/s decompression, one thread, science
  // geometric mean over every file and bound; at least SZx's compression speed per family.
  const auto geo_all = [&](const std::function<bool(const file_result&)>& keep_file,
                           const std::function<double(const codec_result&)>& field) {
    std::vector<double> xs;
    for (std::size_t i = 0; i < opts.bounds.size(); ++i)
      for (const auto& r : results)
        if (r.error.empty() && keep_file(r)) xs.push_back(field(r.codec[i]));
    return geomean(xs);
  };
  std::printf(" Speed, one thread (geometric means of GB/s)\n");
  line("science fields, compress,   all bounds, >= 2 GB/s", geo_all(science, c1), 2.0, true);
  line("science fields, decompress, all bounds, >= 4 GB/s", geo_all(science, d1), 4.0, true);
  for (const double bound : opts.bounds) {
    char rel[16];
    std::snprintf(rel, sizeof rel, "%.0e", bound);
    line(std::string("science fields, compress,   REL ") + rel + ", >= 2 GB/s", geo(bound, science, c1), 2.0, true);
    line(std::string("science fields, decompress, REL ") + rel + ", >= 4 GB/s", geo(bound, science, d1), 4.0, true);
  }
  for (const std::string family : {"science", "embedding"})
    for (const double bound : opts.bounds) {
      const szx_numbers szx = szx_reference(family, bound);
      if (std::isnan(szx.c)) continue;
      char what[96];
      std::snprintf(what, sizeof what, "%s, compress, REL %.0e, >= SZx (%.2f GB/s)",
                    family.c_str(), bound, szx.c);
      line(what, geo(bound, [&](const file_result& r) { return r.file.family == family; }, c1),
           szx.c, true);
    }
  line("embedding files, compress,   REL 1e-2, >= 2x SZx (0.48 GB/s)", geo(1e-2, embedding, c1), 0.96, true);
  line("embedding files, decompress, REL 1e-2, >= 2x SZx (0.67 GB/s)", geo(1e-2, embedding, d1), 1.34, true);
  line("embedding files, compress,   REL 1e-3, >= 2x SZx (0.45 GB/s)", geo(1e-3, embedding, c1), 0.90, true);
  line("embedding files, decompress, REL 1e-3, >= 2x SZx (0.63 GB/s)", geo(1e-3, embedding, d1), 1.26, true);
  std::printf(" Scaling: all threads (%d) vs one (geometric mean of the speedups)\n", threads);
  for (std::size_t b = 0; b < opts.bounds.size(); ++b) {
    char rel[16];
    std::snprintf(rel, sizeof rel, "%.0e", opts.bounds[b]);
    line(std::string("all files, compress,   REL ") + rel + ", >= 1.8x",
         codec_geomean(results, b, any_file, [](const codec_result& c) { return c.c_all / c.c_1t; }),
         1.8, threads > 1);
    line(std::string("all files, decompress, REL ") + rel + ", >= 1.8x",
         codec_geomean(results, b, any_file, [](const codec_result& c) { return c.d_all / c.d_1t; }),
         1.8, threads > 1);
  }
  std::size_t broken = 0;
  for (const auto& r : results) {
    if (!r.error.empty()) ++broken;
    for (const auto& c : r.codec)
      if (!c.ok) ++broken;
  }
  std::printf(" Correctness\n  %-72s %8s  %s\n",
              "bound held, fills bit-exact, same stream on 1 and all threads",
              (std::to_string(broken) + " bad").c_str(), broken ? "NOT MET" : "MET");
  ++checked;
  if (broken) ++not_met;
  std::printf("\n  %d of %d targets met\n", checked - not_met, checked);
  return not_met;
}

void write_csv(const std::vector<file_result>& results, const options& opts, int threads,
               const std::string& path) {
  std::ofstream out(path);
  if (!out) throw std::runtime_error("bench_codec: cannot write the CSV '" + path + "'");
  out << "file,family,dtype,elements,bytes,threads,block_size,rel_bound,abs_bound,ratio,"
         "comp_gbs_1t,decomp_gbs_1t,comp_gbs_all,decomp_gbs_all,"
         "comp_frac_memcpy_1t,decomp_frac_memcpy_1t,comp_frac_memcpy_all,decomp_frac_memcpy_all,"
         "max_abs_err,max_err_over_bound,psnr_db,ok,"
         "memcpy_gbs_1t,memcpy_gbs_all,zstd1_ratio,zstd1_comp_gbs,zstd1_decomp_gbs,"
         "lz4_ratio,lz4_comp_gbs,lz4_decomp_gbs,fp16_ratio,fp16_comp_gbs,fp16_decomp_gbs,"
         "fp16_max_abs_err,fp16_max_rel_err,fp16_psnr_db,"
         "zfp_ratio,zfp_comp_gbs_1t,zfp_decomp_gbs_1t,zfp_max_abs_err,zfp_max_err_over_bound\n";
  for (const auto& r : results) {
    if (!r.error.empty()) continue;
    const auto& b = r.base;
    for (std::size_t i = 0; i < r.codec.size(); ++i) {
      const codec_result& c = r.codec[i];
      const zfp_result z = i < r.zfp.size() ? r.zfp[i] : zfp_result{};
      out << r.file.name << ',' << r.file.family << ',' << r.file.dtype << ','
          << r.file.elements() << ',' << r.bytes << ',' << threads << ',' << opts.block_size << ','
          << csv_num(c.bound) << ',' << csv_num(c.abs_bound) << ',' << csv_num(c.ratio) << ','
          << csv_num(c.c_1t) << ',' << csv_num(c.d_1t) << ',' << csv_num(c.c_all) << ','
          << csv_num(c.d_all) << ',' << csv_num(c.c_1t / b.memcpy_1t) << ','
          << csv_num(c.d_1t / b.memcpy_1t) << ',' << csv_num(c.c_all / b.memcpy_all) << ','
          << csv_num(c.d_all / b.memcpy_all) << ',' << csv_num(c.max_abs) << ','
          << csv_num(c.err_over_bound) << ',' << csv_num(c.psnr) << ',' << (c.ok ? 1 : 0) << ','
          << csv_num(b.memcpy_1t) << ',' << csv_num(b.memcpy_all) << ','
          << csv_num(b.zstd_ratio) << ',' << csv_num(b.zstd_c) << ',' << csv_num(b.zstd_d) << ','
          << csv_num(b.lz4_ratio) << ',' << csv_num(b.lz4_c) << ',' << csv_num(b.lz4_d) << ','
          << csv_num(b.fp16_ratio) << ',' << csv_num(b.fp16_c) << ',' << csv_num(b.fp16_d) << ','
          << csv_num(b.fp16_max_abs) << ',' << csv_num(b.fp16_max_rel) << ','
          << csv_num(b.fp16_psnr) << ',' << csv_num(z.ratio) << ',' << csv_num(z.c_1t) << ','
          << csv_num(z.d_1t) << ',' << csv_num(z.max_abs) << ',' << csv_num(z.err_over_bound)
          << '\n';
    }
  }
  // Geometric-mean rows: file "geomean of N files", ratios and speeds only; ok = every file
  // ok, and max_err_over_bound the worst file's.
  for (const auto& family : families) {
    const auto in_family = [&](const file_result& r) { return r.file.family == family; };
    std::size_t count = 0;
    for (const auto& r : results)
      if (r.error.empty() && in_family(r)) ++count;
    if (count == 0) continue;
    const auto bg = [&](auto field) { return csv_num(base_geomean(results, in_family, field)); };
    for (std::size_t i = 0; i < opts.bounds.size(); ++i) {
      const auto g = [&](auto field) { return csv_num(codec_geomean(results, i, in_family, field)); };
      const auto zg = [&](auto field) { return csv_num(zfp_geomean(results, i, in_family, field)); };
      double worst = 0.0;
      bool ok = true;
      for (const auto& r : results)
        if (r.error.empty() && in_family(r)) {
          worst = std::max(worst, r.codec[i].err_over_bound);
          ok = ok && r.codec[i].ok;
        }
      const auto frac = [&](auto speed, auto memcpy_speed) {
        std::vector<double> xs;
        for (const auto& r : results)
          if (r.error.empty() && in_family(r)) xs.push_back(speed(r.codec[i]) / memcpy_speed(r.base));
        return csv_num(geomean(xs));
      };
      out << "geomean of " << count << " files," << family << ",,,," << threads << ','
          << opts.block_size << ',' << csv_num(opts.bounds[i]) << ",,"
          << g([](const codec_result& c) { return c.ratio; }) << ','
          << g([](const codec_result& c) { return c.c_1t; }) << ','
          << g([](const codec_result& c) { return c.d_1t; }) << ','
          << g([](const codec_result& c) { return c.c_all; }) << ','
          << g([](const codec_result& c) { return c.d_all; }) << ','
          << frac([](const codec_result& c) { return c.c_1t; }, [](const baseline_result& m) { return m.memcpy_1t; }) << ','
          << frac([](const codec_result& c) { return c.d_1t; }, [](const baseline_result& m) { return m.memcpy_1t; }) << ','
          << frac([](const codec_result& c) { return c.c_all; }, [](const baseline_result& m) { return m.memcpy_all; }) << ','
          << frac([](const codec_result& c) { return c.d_all; }, [](const baseline_result& m) { return m.memcpy_all; }) << ','
          << ',' << csv_num(worst) << ",," << (ok ? 1 : 0) << ','
          << bg([](const file_result& r) { return r.base.memcpy_1t; }) << ','
          << bg([](const file_result& r) { return r.base.memcpy_all; }) << ','
          << bg([](const file_result& r) { return r.base.zstd_ratio; }) << ','
          << bg([](const file_result& r) { return r.base.zstd_c; }) << ','
          << bg([](const file_result& r) { return r.base.zstd_d; }) << ','
          << bg([](const file_result& r) { return r.base.lz4_ratio; }) << ','
          << bg([](const file_result& r) { return r.base.lz4_c; }) << ','
          << bg([](const file_result& r) { return r.base.lz4_d; }) << ','
          << bg([](const file_result& r) { return r.base.fp16_ratio; }) << ','
          << bg([](const file_result& r) { return r.base.fp16_c; }) << ','
          << bg([](const file_result& r) { return r.base.fp16_d; }) << ",,,,"
          << zg([](const zfp_result& z) { return z.ratio; }) << ','
          << zg([](const zfp_result& z) { return z.c_1t; }) << ','
          << zg([](const zfp_result& z) { return z.d_1t; }) << ",,\n";
    }
  }
  if (!out) throw std::runtime_error("bench_codec: error writing the CSV '" + path + "'");
}

/// How many distinct OpenMP threads run a parallel_for on `exec`.
template <class Exec>
int threads_used(const Exec& exec) {
#ifdef KOKKOS_ENABLE_OPENMP
  const int slots = 256;
  Kokkos::View<int*, Kokkos::HostSpace> seen("bench::seen", slots);
  Kokkos::parallel_for("bench::threads_used",
                       Kokkos::RangePolicy<Exec>(exec, 0, 1 << 16),
                       [=](int) { seen(omp_get_thread_num() % slots) = 1; });
  exec.fence();
  int used = 0;
  for (int i = 0; i < slots; ++i) used += seen(i);
  return used;
#else
  return exec.concurrency();
#endif
}

int run(int argc, char** argv) {
  const options opts = parse_options(argc, argv);
  if (opts.block_size != 32 && opts.block_size != 64 && opts.block_size != 128)
    usage("--block-size must be 32, 64 or 128");

  // One thread: an OpenMP instance with a pool of one. (partition_space(host, 1, n-1) would
  // hand back the full default instance unless nested OpenMP is enabled, silently.)
  const Kokkos::OpenMP one_thread(1);
  const host_exec all_threads{};
  const int threads = all_threads.concurrency();
  const int one_used = threads_used(one_thread), all_used = threads_used(all_threads);
  if (one_used != 1 || all_used != threads) {
    std::fprintf(stderr, "bench_codec: the one-thread instance ran on %d threads and the default "
                         "one on %d of %d; timings would be wrong\n", one_used, all_used, threads);
    return 1;
  }

  std::vector<file_result> results;
  for (const auto& file : kompress::test::float_data_files()) {
    const bool wanted =
        opts.file_filters.empty() ||
        std::any_of(opts.file_filters.begin(), opts.file_filters.end(),
                    [&](const std::string& f) { return file.name.find(f) != std::string::npos; });
    if (!wanted) continue;
    file_result r;
    r.file = file;
    results.push_back(std::move(r));
  }
  if (results.empty()) {
    std::fprintf(stderr, "bench_codec: no data file matches --files\n");
    return 1;
  }
  // Families in a fixed order, names sorted within each.
  std::stable_sort(results.begin(), results.end(), [](const file_result& a, const file_result& b) {
    const auto rank = [](const std::string& f) {
      return std::find(families.begin(), families.end(), f) - families.begin();
    };
    return rank(a.file.family) < rank(b.file.family);
  });

  const std::time_t now = std::time(nullptr);
  char date[64];
  std::strftime(date, sizeof date, "%Y-%m-%d %H:%M %Z", std::localtime(&now));
  std::printf("bench_codec: kompress %d.%d.%d, %s; %s, %d threads (Kokkos %s %d.%d.%d), %s, compiled for %s (encoder: %s)%s\n",
              kompress::version.major, kompress::version.minor, kompress::version.patch, date, cpu_model().c_str(), threads,
              host_exec::name(), KOKKOS_VERSION_MAJOR, KOKKOS_VERSION_MINOR, KOKKOS_VERSION_PATCH,
              __VERSION__, instruction_set(), encoder_instruction_set().c_str(),
#ifdef NDEBUG
              ""
#else
              " (assertions on: not a release build)"
#endif
  );
  std::printf("data: %s; %zu files; REL bounds:", kompress::test::data_dir().c_str(), results.size());
  for (double b : opts.bounds) std::printf(" %g", b);
  std::printf("; load average at start: %s\n", load_average().c_str());
  warn_if_busy(load_1min(), threads);
  std::fflush(stdout);

  const auto start = clock_type::now();
  for (auto& r : results) {
    try {
      if (r.file.dtype == "f32")
        run_file<float>(r, opts, one_thread, all_threads, threads);
      else
        run_file<double>(r, opts, one_thread, all_threads, threads);
    } catch (const std::exception& e) {
      r.error = e.what();
      r.codec.clear();
    }
    std::fprintf(stderr, "  %-44s %s\n", r.file.name.c_str(), r.error.empty() ? "done" : "FAILED");
  }
  const double elapsed = std::chrono::duration<double>(clock_type::now() - start).count();

  print_codec_table(results, opts, threads);
  print_zfp_table(results, opts);
  print_baseline_table(results, threads);
  print_speed_summary(results, opts, threads);
  const int not_met = print_targets(results, opts, threads);
  write_csv(results, opts, threads, opts.csv);
  std::printf("\n%.0f s; load average at end: %s; CSV: %s\n", elapsed, load_average().c_str(),
              opts.csv.c_str());
  // The load average counts this run's own threads by now; only a load beyond them is others'.
  warn_if_busy(load_1min() - threads, threads);
  // Targets not met are reported, not failed: this is a measurement, not a test. Broken
  // bounds or failed files are failures.
  (void)not_met;
  for (const auto& r : results) {
    if (!r.error.empty()) return 1;
    for (const auto& c : r.codec)
      if (!c.ok) return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Kokkos::ScopeGuard kokkos(argc, argv);
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_codec: %s\n", e.what());
    return 1;
  }
}
