// bench_codec_device: kompress on the build's default execution space, input and output in its
// memory space (an OpenMP build: host memory; a CUDA build: device memory), against the
// baselines a GPU user would compare it with, measured in the same run on the same arrays.
//
// For each .f32/.f64 file of the data folder (optionally tiled: the file repeated N times, so
// a GPU sees hundreds of MB), each codec and each REL bound (default 1e-2, 1e-3, 1e-4):
//   kompress  ratio; compress and decompress GB/s; the max error against the stream's
//             absolute bound, checked exactly on the host for every value (a violation, a
//             fill, NaN, Inf or -0.0 not back bit-exact, or a stream bound above REL x range
//             makes the program exit 1). Fill values are passed for the three fill files.
// and once per file:
//   copy      Kokkos::deep_copy between two Views of the memory space: the bandwidth limit
//   fp16      a cast to Kokkos::Experimental::half_t and back in a Kokkos::parallel_for (round
//             to nearest even); ratio 2 (float) or 4 (double) where half_t is 16 bits. Builds
//             without a 16-bit half (OpenMP-only Kokkos) make half_t a float: the program says
//             so and reports the ratio that type gives.
// GB/s is uncompressed bytes / the fastest of --reps calls after one warm-up call; each call is
// followed by a fence of the execution space instance before the clock stops.
//
// Output: the device and the date, a fixed-width table on stdout and a CSV (--csv) with one row
// per file x method (x bound); --write-streams DIR also writes each kompress stream to
// DIR/<file>.<codec>.<REL>.kmpz (".tileN" after the file name when tiled), so that streams made
// on a GPU can be compared byte for byte with a CPU's (scripts/gpu/compare).
//
//   bench_codec_device [--files a,b] [--bounds 1e-2,1e-3,1e-4] [--codec fast|ratio|fast,ratio]
//                      [--reps 5] [--tile N] [--tile-to-mb MB] [--csv PATH]
//                      [--write-streams DIR] [--no-baselines] [--size-kib K[,K...]]
//
// --tile-to-mb tiles each file at least as often as it takes to reach MB megabytes. The ratio
// codec sees each file as a View of its own shape (the tiles stacked along the slowest
// extent), the fast codec a rank-1 View. --size-kib instead cuts each file (tiled as far as
// needed) to exactly K KiB per row, a rank-1 View for both codecs: the time of one call against
// its size, from the latency-bound small messages of a collective at many ranks to large ones.

#include "real_data.hpp"

#include "support.hpp"

#include <kompress/kompress.hpp>

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

// Not an anonymous namespace: nvcc's extended lambdas need enclosing functions with linkage.
namespace kompress_bench_device {

using exec_space = Kokkos::DefaultExecutionSpace;
using memory_space = exec_space::memory_space;
using host_space = Kokkos::DefaultHostExecutionSpace;
using half = Kokkos::Experimental::half_t;
using kompress_bench::gbs;
using kompress_bench::split;
constexpr double inf = std::numeric_limits<double>::infinity();
constexpr double nan = std::numeric_limits<double>::quiet_NaN();
constexpr bool half_is_16_bits = sizeof(half) == 2;

/// An uninitialized rank-1 View in the memory space, allocated through `exec`.
template <class T>
Kokkos::View<T*, memory_space> device_array(const exec_space& exec, const std::string& label, std::size_t n) {
  return Kokkos::View<T*, memory_space>(Kokkos::view_alloc(exec, Kokkos::WithoutInitializing, label), n);
}

// ---------------------------------------------------------------------------------------------
// Options

struct options {
  std::vector<std::string> file_filters;  // substrings; a file is kept if it contains any
  std::vector<double> bounds = {1e-2, 1e-3, 1e-4};
  std::vector<kompress::codec_mode> codecs = {kompress::codec_mode::fast};
  int reps = 5;
  std::size_t tile = 1;
  double tile_to_mb = 0.0;
  std::vector<std::size_t> sizes_kib;  // empty: whole (tiled) files
  std::string csv = "bench_codec_device.csv";
  std::string stream_dir;  // empty: streams are not written
  bool baselines = true;
};

[[noreturn]] void usage(const std::string& complaint) {
  std::fprintf(stderr,
               "bench_codec_device: %s\n"
               "usage: bench_codec_device [--files SUBSTR[,SUBSTR...]] [--bounds REL[,REL...]]\n"
               "                          [--codec fast|ratio|fast,ratio] [--reps N] [--tile N]\n"
               "                          [--tile-to-mb MB] [--csv PATH] [--write-streams DIR]\n"
               "                          [--no-baselines] [--size-kib K[,K...]]\n",
               complaint.c_str());
  std::exit(2);
}

options parse_options(int argc, char** argv) {
  options opts;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "-h" || arg == "--help") usage("help");
    if (arg == "--no-baselines") {
      opts.baselines = false;
      continue;
    }
    if (i + 1 >= argc) usage("missing value after " + arg);
    const std::string value = argv[++i];
    try {
      if (arg == "--files") {
        opts.file_filters = split(value, ',');
      } else if (arg == "--bounds") {
        opts.bounds.clear();
        for (const auto& b : split(value, ',')) opts.bounds.push_back(std::stod(b));
        if (opts.bounds.empty()) usage("--bounds needs at least one value");
      } else if (arg == "--codec") {
        opts.codecs.clear();
        for (const auto& c : split(value, ',')) {
          if (c != "fast" && c != "ratio") usage("--codec takes fast, ratio or fast,ratio");
          opts.codecs.push_back(c == "ratio" ? kompress::codec_mode::ratio : kompress::codec_mode::fast);
        }
        if (opts.codecs.empty()) usage("--codec needs a codec");
      } else if (arg == "--reps") {
        opts.reps = std::stoi(value);
        if (opts.reps < 1) usage("--reps must be >= 1");
      } else if (arg == "--tile") {
        const long long tile = std::stoll(value);
        if (tile < 1) usage("--tile must be >= 1");
        opts.tile = static_cast<std::size_t>(tile);
      } else if (arg == "--tile-to-mb") {
        opts.tile_to_mb = std::stod(value);
        if (!(opts.tile_to_mb >= 0.0)) usage("--tile-to-mb must be >= 0");
      } else if (arg == "--size-kib") {
        opts.sizes_kib.clear();
        for (const auto& k : split(value, ',')) {
          const long long kib = std::stoll(k);
          if (kib < 1) usage("--size-kib takes sizes >= 1");
          opts.sizes_kib.push_back(static_cast<std::size_t>(kib));
        }
      } else if (arg == "--csv") {
        opts.csv = value;
      } else if (arg == "--write-streams") {
        opts.stream_dir = value;
      } else {
        usage("unknown option " + arg);
      }
    } catch (const std::logic_error&) {
      usage("bad value '" + value + "' for " + arg);
    }
  }
  return opts;
}

const char* codec_name(kompress::codec_mode codec) {
  return codec == kompress::codec_mode::ratio ? "ratio" : "fast";
}

// ---------------------------------------------------------------------------------------------
// The machine

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%d %H:%M:%S UTC", &utc);
  return text;
}

/// The execution space, and for CUDA the device; for a host space the CPU and its threads.
std::string describe_device(const exec_space& exec) {
  std::ostringstream out;
  out << exec_space::name() << " (concurrency " << exec.concurrency() << ")";
#ifdef KOKKOS_ENABLE_CUDA
  if constexpr (std::is_same_v<exec_space, Kokkos::Cuda>) {
    cudaDeviceProp prop{};
    int runtime = 0, driver = 0;
    if (cudaGetDeviceProperties(&prop, exec.cuda_device()) != cudaSuccess ||
        cudaRuntimeGetVersion(&runtime) != cudaSuccess || cudaDriverGetVersion(&driver) != cudaSuccess)
      return out.str() + ": (cudaGetDeviceProperties failed)";
    out << ": " << prop.name << ", sm_" << prop.major << prop.minor << ", "
        << prop.multiProcessorCount << " SMs, " << (double(prop.totalGlobalMem) / (1 << 30))
        << " GiB; CUDA runtime " << runtime / 1000 << "." << (runtime % 1000) / 10 << ", driver "
        << driver / 1000 << "." << (driver % 1000) / 10;
    return out.str();
  }
#endif
  out << ": " << kompress_bench::cpu_model() << ", load average "
      << kompress_bench::load_average();
  return out.str();
}

// ---------------------------------------------------------------------------------------------
// Timing

/// Seconds of the fastest of `reps` calls of `f` after one warm-up call; every call is fenced.
template <class F>
double best_fenced_seconds(const exec_space& exec, int reps, F&& f) {
  f();
  exec.fence("bench_codec_device: warm-up");
  double best = inf;
  for (int r = 0; r < reps; ++r) {
    const auto start = kompress_bench::clock_type::now();
    f();
    exec.fence("bench_codec_device: timed call");
    const auto end = kompress_bench::clock_type::now();
    best = std::min(best, std::chrono::duration<double>(end - start).count());
  }
  return best;
}

// ---------------------------------------------------------------------------------------------
// The exact check, on the host

template <class T>
using bits_of = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>;

/// The value range the relative bound is taken of: finite values other than the fill value.
struct value_range {
  double min = inf, max = -inf;
  double width() const { return max >= min ? max - min : 0.0; }
};

template <class T>
value_range range_of(const std::vector<T>& values, std::optional<double> fill) {
  const bits_of<T> fill_bits = fill ? std::bit_cast<bits_of<T>>(static_cast<T>(*fill)) : 0;
  value_range r;
  for (T x : values) {
    if (!std::isfinite(x) || (fill && std::bit_cast<bits_of<T>>(x) == fill_bits)) continue;
    r.min = std::min(r.min, double(x));
    r.max = std::max(r.max, double(x));
  }
  return r;
}

/// Whether |x - y| <= bound holds in exact arithmetic, for finite x and y: x - y rounded to
/// double plus its rounding error (Knuth's TwoSum, exact without an FMA and without overflow)
/// decide it where the rounded difference alone equals the bound.
inline bool within_exactly(double x, double y, double bound, double& rounded_error) {
  const double sum = x - y;
  rounded_error = std::fabs(sum);
  if (!std::isfinite(sum)) return false;
  if (rounded_error != bound) return rounded_error < bound;
  const double y_part = sum - x;
  const double tail = (x - (sum - y_part)) + (-y - y_part);
  return tail == 0.0 || (tail > 0.0) != (sum > 0.0);
}

struct check_result {
  std::size_t violations = 0;  // values off the bound, or special values not back bit-exact
  double max_abs = 0.0;        // over the values the bound applies to
};

/// kompress's promise (docs/error-bound.md) for every value: NaN, +-Inf, -0.0 and the fill
/// value bit-exact, every other value within `bound` exactly.
template <class T>
check_result check_exactly(const std::vector<T>& original, const T* decoded,
                           std::optional<double> fill, double bound) {
  using bits = bits_of<T>;
  const bool has_fill = fill.has_value();
  const bits fill_bits = has_fill ? std::bit_cast<bits>(static_cast<T>(*fill)) : 0;
  const bits negative_zero = std::bit_cast<bits>(T(-0.0));
  const T* in = original.data();
  check_result result;
  Kokkos::parallel_reduce(
      "bench_codec_device::check", Kokkos::RangePolicy<host_space>(0, original.size()),
      [=](std::size_t i, std::size_t& violations, double& max_abs) {
        const bits x_bits = std::bit_cast<bits>(in[i]);
        const bits y_bits = std::bit_cast<bits>(decoded[i]);
        if (!std::isfinite(in[i]) || x_bits == negative_zero || (has_fill && x_bits == fill_bits)) {
          if (x_bits != y_bits) ++violations;
          return;
        }
        double error = 0.0;
        if (!within_exactly(double(in[i]), double(decoded[i]), bound, error)) ++violations;
        max_abs = std::max(max_abs, std::isnan(error) ? inf : error);
      },
      Kokkos::Sum<std::size_t>(result.violations), Kokkos::Max<double>(result.max_abs));
  return result;
}

/// 64-bit FNV-1a of a stream: a short fingerprint for the CSV.
inline std::uint64_t fnv1a(const std::byte* data, std::size_t size) {
  std::uint64_t hash = 0xcbf29ce484222325ull;
  for (std::size_t i = 0; i < size; ++i) hash = (hash ^ std::uint64_t(data[i])) * 0x100000001b3ull;
  return hash;
}

// ---------------------------------------------------------------------------------------------
// Results

struct row {
  std::string file, dtype, method, problem;
  std::size_t tile = 1, bytes = 0;
  double bound = nan, abs_bound = nan, ratio = nan, compress_gbs = nan, decompress_gbs = nan;
  double max_abs = nan, err_over_bound = nan;  // kompress: / abs bound; fp16: / value range
  std::uint64_t stream_hash = 0;
  bool ok = true;
};

// ---------------------------------------------------------------------------------------------
// Baselines

template <class T>
void run_baselines(const exec_space& exec, const Kokkos::View<T*, memory_space>& in,
                   const std::vector<T>& host_in, std::optional<double> fill, double range,
                   const options& opts, row& copy_row, row& fp16_row) {
  const std::size_t n = in.size();
  const std::size_t bytes = n * sizeof(T);
  {
    const auto copy = device_array<T>(exec, "bench::copy", n);
    copy_row.compress_gbs =
        gbs(bytes, best_fenced_seconds(exec, opts.reps, [&] { Kokkos::deep_copy(exec, copy, in); }));
    copy_row.ratio = 1.0;
  }
  const auto halves = device_array<half>(exec, "bench::half", n);
  const auto back = device_array<T>(exec, "bench::back", n);
  const Kokkos::RangePolicy<exec_space> all(exec, 0, n);
  // The device lambdas are defined here, not inside the timed host lambdas: nvcc accepts an
  // extended lambda only directly in a named function.
  const auto to_half = KOKKOS_LAMBDA(std::size_t i) {
    halves(i) = Kokkos::Experimental::cast_to_half(in(i));
  };
  const auto from_half = KOKKOS_LAMBDA(std::size_t i) {
    back(i) = Kokkos::Experimental::cast_from_half<T>(halves(i));
  };
  fp16_row.compress_gbs = gbs(bytes, best_fenced_seconds(exec, opts.reps, [&] {
    Kokkos::parallel_for("bench::to_half", all, to_half);
  }));
  fp16_row.decompress_gbs = gbs(bytes, best_fenced_seconds(exec, opts.reps, [&] {
    Kokkos::parallel_for("bench::from_half", all, from_half);
  }));
  fp16_row.ratio = double(sizeof(T)) / double(sizeof(half));
  const auto host_back = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, back);
  // The cast's error relative to the value range, over the values kompress bounds.
  const check_result errors = check_exactly(host_in, host_back.data(), fill, inf);
  fp16_row.max_abs = errors.max_abs;
  fp16_row.err_over_bound = range > 0.0 ? errors.max_abs / range : nan;
}

// ---------------------------------------------------------------------------------------------
// kompress

/// Calls f with an unmanaged LayoutRight View of `data` in the memory space: of `shape` for the
/// ratio codec (rank 2 to 4; its predictors follow it), rank 1 otherwise.
template <class T, class F>
void with_input_view(const T* data, const std::vector<std::size_t>& shape, kompress::codec_mode codec, F&& f) {
  using unmanaged = Kokkos::MemoryTraits<Kokkos::Unmanaged>;
  const auto e = [&](std::size_t d) { return shape[d]; };
  std::size_t count = 1;
  for (std::size_t extent : shape) count *= extent;
  if (codec == kompress::codec_mode::ratio) {
    if (shape.size() == 2)
      return f(Kokkos::View<const T**, Kokkos::LayoutRight, memory_space, unmanaged>(data, e(0), e(1)));
    if (shape.size() == 3)
      return f(
          Kokkos::View<const T***, Kokkos::LayoutRight, memory_space, unmanaged>(data, e(0), e(1), e(2)));
    if (shape.size() == 4)
      return f(Kokkos::View<const T****, Kokkos::LayoutRight, memory_space, unmanaged>(data, e(0), e(1), e(2),
                                                                                       e(3)));
  }
  f(Kokkos::View<const T*, Kokkos::LayoutRight, memory_space, unmanaged>(data, count));
}

std::string bound_label(double bound) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", bound);
  return text;
}

template <class T, class InView>
void run_kompress(const exec_space& exec, const InView& in, const std::vector<T>& host_in,
                  std::optional<double> fill, const value_range& range, kompress::codec_mode codec,
                  double bound, const std::string& stream_name, const options& opts, row& r) {
  const std::size_t n = in.size();
  const std::size_t bytes = n * sizeof(T);
  const kompress::compress_options copts{
      .bound = kompress::relative(bound), .fill_value = fill, .block_size = 32, .codec = codec};
  const auto stream = device_array<std::byte>(exec, "bench::stream", kompress::max_compressed_size(in, copts));
  const auto out = device_array<T>(exec, "bench::out", n);

  std::size_t length = 0;
  r.compress_gbs = gbs(bytes, best_fenced_seconds(exec, opts.reps, [&] {
    length = kompress::compress(exec, in, stream, copts);
  }));
  const auto packed = Kokkos::subview(stream, std::pair<std::size_t, std::size_t>(0, length));
  r.decompress_gbs = gbs(bytes, best_fenced_seconds(exec, opts.reps, [&] {
    kompress::decompress(exec, packed, out);
  }));
  r.ratio = double(bytes) / double(length);

  const kompress::stream_info info = kompress::inspect(packed);
  r.abs_bound = info.absolute_bound;
  const auto host_out = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, out);
  const check_result checked = check_exactly(host_in, host_out.data(), fill, info.absolute_bound);
  r.max_abs = checked.max_abs;
  r.err_over_bound = info.absolute_bound > 0.0 ? checked.max_abs / info.absolute_bound
                                               : (checked.max_abs > 0.0 ? inf : 0.0);

  // REL x range as docs/error-bound.md defines it, fl(r * fl(max - min)): the stream's bound
  // may be that or tighter, never looser.
  const double promised = bound * range.width();
  std::ostringstream problem;
  if (checked.violations) problem << checked.violations << " values off the bound or not bit-exact; ";
  if (!(info.absolute_bound <= promised))
    problem << "stream bound " << info.absolute_bound << " above REL x range " << promised << "; ";
  if (info.compressed_bytes != length) problem << "header length differs from compress's; ";

  const auto host_stream = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, packed);
  r.stream_hash = fnv1a(host_stream.data(), length);
  if (!opts.stream_dir.empty()) {
    const std::filesystem::path path = std::filesystem::path(opts.stream_dir) / stream_name;
    std::ofstream file(path, std::ios::binary);
    file.write(reinterpret_cast<const char*>(host_stream.data()), static_cast<std::streamsize>(length));
    if (!file) problem << "could not write " << path.string() << "; ";
  }
  r.problem = problem.str();
  r.ok = r.problem.empty();
}

/// Runs the baselines and every codec and bound on `host_in`, seen by the codecs with `shape`
/// (tiles already stacked) and reported as `tile` copies of the file; streams are named after `stem`.
template <class T>
void run_input(const exec_space& exec, const kompress::test::data_file_info& file, const std::vector<T>& host_in,
               const std::vector<std::size_t>& shape, std::size_t tile, const std::string& stem,
               const options& opts, std::vector<row>& rows) {
  const value_range range = range_of(host_in, file.fill_value);
  const auto in = device_array<T>(exec, "bench::in", host_in.size());
  Kokkos::deep_copy(exec, in,
                    Kokkos::View<const T*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>(host_in.data(),
                                                                                       host_in.size()));
  exec.fence("bench_codec_device: input uploaded");

  const auto new_row = [&](std::string method) {
    row r;
    r.file = file.name;
    r.dtype = file.dtype;
    r.method = std::move(method);
    r.tile = tile;
    r.bytes = host_in.size() * sizeof(T);
    return r;
  };
  if (opts.baselines) {
    row copy_row = new_row("copy"), fp16_row = new_row("fp16");
    run_baselines(exec, in, host_in, file.fill_value, range.width(), opts, copy_row, fp16_row);
    rows.push_back(copy_row);
    rows.push_back(fp16_row);
  }
  for (const kompress::codec_mode codec : opts.codecs) {
    for (const double bound : opts.bounds) {
      row r = new_row(std::string("kompress-") + codec_name(codec));
      r.bound = bound;
      try {
        with_input_view(in.data(), shape, codec, [&](const auto& view) {
          run_kompress(exec, view, host_in, file.fill_value, range, codec, bound,
                       stem + "." + codec_name(codec) + "." + bound_label(bound) + ".kmpz", opts, r);
        });
      } catch (const std::exception& e) {
        r.ok = false;
        r.problem = e.what();
      }
      rows.push_back(r);
    }
  }
}

/// The first `n` values of the file repeated end to end.
template <class T>
std::vector<T> tiled(const std::vector<T>& one, std::size_t n) {
  std::vector<T> values(n);
  for (std::size_t done = 0; done < n; done += one.size())
    std::copy_n(one.begin(), std::min(one.size(), n - done), values.begin() + done);
  return values;
}

template <class T>
void run_file(const exec_space& exec, const kompress::test::data_file_info& file, const options& opts,
              std::vector<row>& rows) {
  const std::vector<T> one = kompress::test::read_raw<T>(file.name);
  if (one.empty()) return;
  if (!opts.sizes_kib.empty()) {
    for (const std::size_t kib : opts.sizes_kib) {
      const std::size_t n = std::max<std::size_t>(kib * 1024 / sizeof(T), 1);
      run_input(exec, file, tiled(one, n), {n}, (n + one.size() - 1) / one.size(),
                file.name + "." + std::to_string(kib) + "KiB", opts, rows);
    }
    return;
  }
  std::size_t tile = opts.tile;
  if (opts.tile_to_mb > 0.0) {
    const double wanted = opts.tile_to_mb * 1e6 / double(one.size() * sizeof(T));
    tile = std::max(tile, static_cast<std::size_t>(std::ceil(wanted)));
  }
  std::vector<std::size_t> shape = file.shape;
  shape[0] *= tile;
  run_input(exec, file, tiled(one, one.size() * tile), shape, tile,
            file.name + (tile > 1 ? ".tile" + std::to_string(tile) : std::string()), opts, rows);
}

// ---------------------------------------------------------------------------------------------
// Output

/// A number in a fixed-width cell, "-" where there is none.
std::string cell(double value, const char* format) {
  if (std::isnan(value)) return "-";
  char text[32];
  std::snprintf(text, sizeof text, format, value);
  return text;
}

void print_table(const std::vector<row>& rows) {
  std::printf("\n%-40s %-4s %5s %9s %-14s %7s %8s %9s %9s %10s  %s\n", "file", "type", "tile", "MB",
              "method", "REL", "ratio", "comp GB/s", "dec GB/s", "err/bound", "check");
  for (const row& r : rows) {
    const bool codec = r.method.starts_with("kompress");
    const std::string bound = codec ? bound_label(r.bound) : "-";
    // fp16's error is relative to the value range (its own REL), kompress's to the stream's bound.
    std::printf("%-40s %-4s %5zu %9.1f %-14s %7s %8s %9s %9s %10s  %s\n", r.file.c_str(), r.dtype.c_str(),
                r.tile, double(r.bytes) / 1e6, r.method.c_str(), bound.c_str(), cell(r.ratio, "%.2f").c_str(),
                cell(r.compress_gbs, "%.2f").c_str(), cell(r.decompress_gbs, "%.2f").c_str(),
                cell(r.err_over_bound, "%.3g").c_str(),
                !codec ? (r.method == "fp16" ? "(err/range)" : "") : r.ok ? "ok" : "FAILED");
  }
}

bool write_csv(const std::string& path, const std::string& device, const std::string& date,
               const std::vector<row>& rows) {
  std::ofstream out(path);
  out << "device,date,file,dtype,tile,bytes,method,rel_bound,abs_bound,ratio,compress_gbs,"
         "decompress_gbs,max_abs_error,error_over_bound,stream_fnv1a64,ok,problem\n";
  const auto quoted = [](std::string text) {
    std::replace(text.begin(), text.end(), '"', '\'');
    return "\"" + text + "\"";
  };
  for (const row& r : rows) {
    char hash[20] = "";
    if (r.stream_hash)
      std::snprintf(hash, sizeof hash, "%016llx", static_cast<unsigned long long>(r.stream_hash));
    out << quoted(device) << "," << date << "," << r.file << "," << r.dtype << "," << r.tile << ","
        << r.bytes << "," << r.method << "," << r.bound << "," << r.abs_bound << "," << r.ratio << ","
        << r.compress_gbs << "," << r.decompress_gbs << "," << r.max_abs << "," << r.err_over_bound
        << "," << hash << "," << (r.ok ? 1 : 0) << "," << quoted(r.problem) << "\n";
  }
  return static_cast<bool>(out);
}

int run(int argc, char** argv) {
  const options opts = parse_options(argc, argv);
  const exec_space exec;
  const std::string device = describe_device(exec);
  const std::string date = utc_now();
  std::printf("bench_codec_device, %s\n", date.c_str());
  std::printf("device: %s\n", device.c_str());
  std::printf("memory space: %s; host checks on %s (concurrency %d)\n", memory_space::name(),
              host_space::name(), host_space().concurrency());
  if (!half_is_16_bits)
    std::printf("note: Kokkos::Experimental::half_t is a %zu-byte float in this build, so the fp16 "
                "row times a float copy, not a 16-bit cast\n", sizeof(half));
  std::printf("GB/s: uncompressed bytes / fastest of %d fenced calls after a warm-up\n", opts.reps);
  if (!opts.stream_dir.empty()) std::filesystem::create_directories(opts.stream_dir);

  std::vector<row> rows;
  int files = 0;
  for (const auto& file : kompress::test::float_data_files()) {
    if (!opts.file_filters.empty() &&
        std::none_of(opts.file_filters.begin(), opts.file_filters.end(),
                     [&](const std::string& f) { return file.name.find(f) != std::string::npos; }))
      continue;
    ++files;
    try {
      if (file.dtype == "f64") run_file<double>(exec, file, opts, rows);
      else run_file<float>(exec, file, opts, rows);
    } catch (const std::exception& e) {
      row r;
      r.file = file.name;
      r.dtype = file.dtype;
      r.method = "(file)";
      r.ok = false;
      r.problem = e.what();
      rows.push_back(r);
    }
    std::fflush(stdout);
  }
  if (files == 0) {
    std::fprintf(stderr, "bench_codec_device: no data file matches --files\n");
    return 1;
  }
  print_table(rows);

  int failed = 0;
  for (const row& r : rows)
    if (!r.ok) {
      ++failed;
      std::printf("FAILED: %s %s REL %s: %s\n", r.file.c_str(), r.method.c_str(),
                  bound_label(r.bound).c_str(), r.problem.c_str());
    }
  if (!write_csv(opts.csv, device, date, rows)) {
    std::fprintf(stderr, "bench_codec_device: could not write %s\n", opts.csv.c_str());
    return 1;
  }
  std::printf("\n%zu rows, %d failed; CSV: %s%s%s\n", rows.size(), failed, opts.csv.c_str(),
              opts.stream_dir.empty() ? "" : "; streams: ", opts.stream_dir.c_str());
  return failed ? 1 : 0;
}

}  // namespace kompress_bench_device

int main(int argc, char** argv) {
  Kokkos::ScopeGuard kokkos(argc, argv);
  try {
    return kompress_bench_device::run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_codec_device: %s\n", e.what());
    return 1;
  }
}
