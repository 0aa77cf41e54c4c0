// The main demo: compress every real field in the data folder at a few relative bounds and
// print what kompress does with it: ratio, the largest error against the bound, throughput.
//
//   kompress_demo [--data DIR] [--bounds 1e-2,1e-3,1e-4] [--repeat 3]
//
// The data folder defaults to KOMPRESS_DATA_DIR, else ../shared/data beside the repository.

#include <kompress/kompress.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;
using host = Kokkos::DefaultHostExecutionSpace;

struct field_file {
  fs::path path;
  bool is_double = false;
  std::optional<double> fill;
};

// Fill values of the data folder's ocean and climate files (see its README).
std::optional<double> fill_value_of(const std::string& name) {
  if (name.starts_with("pop_temp_")) return double(9.96921e36f);
  if (name.starts_with("foam_ocean_v_")) return double(1e35f);
  if (name.starts_with("nemo_orca2_sst_")) return double(1e20f);
  return std::nullopt;
}

std::vector<field_file> find_fields(const fs::path& dir) {
  std::vector<field_file> files;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const auto ext = entry.path().extension();
    if (ext != ".f32" && ext != ".f64") continue;
    files.push_back({entry.path(), ext == ".f64", fill_value_of(entry.path().filename().string())});
  }
  std::sort(files.begin(), files.end(), [](const auto& a, const auto& b) { return a.path < b.path; });
  return files;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

template <class T>
void run_field(const field_file& file, const std::vector<double>& bounds, int repeats) {
  std::ifstream stream(file.path, std::ios::binary);
  const std::size_t count = fs::file_size(file.path) / sizeof(T);
  Kokkos::View<T*, Kokkos::HostSpace> values("values", count);
  stream.read(reinterpret_cast<char*>(values.data()), std::streamsize(count * sizeof(T)));
  Kokkos::View<std::byte*, Kokkos::HostSpace> compressed("compressed", kompress::max_compressed_size(values));
  Kokkos::View<T*, Kokkos::HostSpace> decoded("decoded", count);
  const double megabytes = double(count * sizeof(T)) / 1e6;

  for (const double bound : bounds) {
    const kompress::compress_options options{.bound = kompress::relative(bound), .fill_value = file.fill};
    // Best of several: the first run also pays for first-touch page faults.
    double compress_seconds = 1e30, decompress_seconds = 1e30;
    std::size_t length = 0;
    for (int repeat = 0; repeat < repeats; ++repeat) {
      auto start = std::chrono::steady_clock::now();
      length = kompress::compress(host{}, values, compressed, options);
      compress_seconds = std::min(compress_seconds, seconds_since(start));
      start = std::chrono::steady_clock::now();
      kompress::decompress(host{}, Kokkos::subview(compressed, std::pair<std::size_t, std::size_t>(0, length)), decoded);
      decompress_seconds = std::min(decompress_seconds, seconds_since(start));
    }
    const auto info = kompress::inspect(Kokkos::subview(compressed, std::pair<std::size_t, std::size_t>(0, length)));
    double max_error = 0.0;
    for (std::size_t i = 0; i < count; ++i)
      if (std::isfinite(values(i)) && !(file.fill && values(i) == T(*file.fill)))
        max_error = std::max(max_error, std::fabs(double(values(i)) - double(decoded(i))));
    const double error_ratio = info.absolute_bound > 0 ? max_error / info.absolute_bound : 0.0;
    std::printf("%-42s %-6s %8.0e %9.2f %11.3g %8.3f %9.2f %9.2f%s\n", file.path.filename().c_str(),
                file.is_double ? "f64" : "f32", bound, info.ratio(), max_error, error_ratio,
                megabytes / 1e3 / compress_seconds, megabytes / 1e3 / decompress_seconds,
                max_error <= info.absolute_bound ? "" : "  BOUND VIOLATED");
  }
}

std::vector<double> parse_bounds(const std::string& text) {
  std::vector<double> bounds;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) bounds.push_back(std::stod(item));
  return bounds;
}

}  // namespace

int main(int argc, char* argv[]) {
  Kokkos::ScopeGuard kokkos(argc, argv);
  fs::path data_dir;
  if (const char* env = std::getenv("KOMPRESS_DATA_DIR")) data_dir = env;
#ifdef KOMPRESS_DEFAULT_DATA_DIR
  if (data_dir.empty()) data_dir = KOMPRESS_DEFAULT_DATA_DIR;
#endif
  std::vector<double> bounds = {1e-2, 1e-3, 1e-4};
  int repeats = 3;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--data" && i + 1 < argc) data_dir = argv[++i];
    else if (arg == "--bounds" && i + 1 < argc) bounds = parse_bounds(argv[++i]);
    else if (arg == "--repeat" && i + 1 < argc) repeats = std::max(1, std::atoi(argv[++i]));
    else {
      std::fprintf(stderr, "usage: kompress_demo [--data DIR] [--bounds 1e-2,1e-3,1e-4] [--repeat 3]\n");
      return 2;
    }
  }
  if (data_dir.empty() || !fs::is_directory(data_dir)) {
    std::fprintf(stderr, "kompress_demo: data folder '%s' not found; pass --data DIR or set KOMPRESS_DATA_DIR\n",
                 data_dir.c_str());
    return 1;
  }
  const auto files = find_fields(data_dir);
  std::printf("kompress %d.%d.%d demo: every array in %s, relative bounds, %d host threads\n\n",
              kompress::version.major, kompress::version.minor, kompress::version.patch, data_dir.c_str(),
              host{}.concurrency());
  std::printf("%-42s %-6s %8s %9s %11s %8s %9s %9s\n", "field", "type", "rel", "ratio", "max error",
              "err/eb", "comp GB/s", "dec GB/s");
  try {
    for (const auto& file : files) {
      if (file.is_double)
        run_field<double>(file, bounds, repeats);
      else
        run_field<float>(file, bounds, repeats);
    }
  } catch (const kompress::error& e) {
    std::fprintf(stderr, "kompress_demo: %s\n", e.what());
    return 1;
  }
  std::printf("\nerr/eb is the largest error over the bound (<= 1 always); fill values kept exact.\n");
  return 0;
}
