// The main demo: compress every real field in the data folder at a few relative bounds and
// print what kompress does with it: ratio, the largest error against the bound, throughput.
//
//   kompress_demo [--data DIR] [--bounds 1e-2,1e-3,1e-4] [--repeat 3]
//
// The data folder defaults to KOMPRESS_DATA_DIR, else ../shared/data beside the repository.

#include <kompress/kompress.hpp>

#include "real_data.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

namespace {

using host = Kokkos::DefaultHostExecutionSpace;

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

template <class T>
void run_field(const kompress::test::data_file_info& file, const std::vector<double>& bounds, int repeats) {
  const std::vector<T> array = kompress::test::read_raw<T>(file.name);
  const std::size_t count = array.size();
  Kokkos::View<T*, Kokkos::HostSpace> values("values", count);
  std::copy(array.begin(), array.end(), values.data());
  Kokkos::View<std::byte*, Kokkos::HostSpace> compressed("compressed", kompress::max_compressed_size(values));
  Kokkos::View<T*, Kokkos::HostSpace> decoded("decoded", count);
  const double megabytes = double(count * sizeof(T)) / 1e6;

  for (const double bound : bounds) {
    const kompress::compress_options options{.bound = kompress::relative(bound), .fill_value = file.fill_value};
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
      if (std::isfinite(values(i)) && !(file.fill_value && values(i) == T(*file.fill_value)))
        max_error = std::max(max_error, std::fabs(double(values(i)) - double(decoded(i))));
    const double error_ratio = info.absolute_bound > 0 ? max_error / info.absolute_bound : 0.0;
    std::printf("%-42s %-6s %8.0e %9.2f %11.3g %8.3f %9.2f %9.2f%s\n", file.name.c_str(),
                file.dtype.c_str(), bound, info.ratio(), max_error, error_ratio,
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
  std::vector<double> bounds = {1e-2, 1e-3, 1e-4};
  int repeats = 3;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--data" && i + 1 < argc) ::setenv("KOMPRESS_DATA_DIR", argv[++i], 1);
    else if (arg == "--bounds" && i + 1 < argc) bounds = parse_bounds(argv[++i]);
    else if (arg == "--repeat" && i + 1 < argc) repeats = std::max(1, std::atoi(argv[++i]));
    else {
      std::fprintf(stderr, "usage: kompress_demo [--data DIR] [--bounds 1e-2,1e-3,1e-4] [--repeat 3]\n");
      return 2;
    }
  }
  std::vector<kompress::test::data_file_info> files;
  try {
    files = kompress::test::float_data_files();  // names the folder it looked in if it fails
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kompress_demo: %s\n", e.what());
    return 1;
  }
  const std::string data_dir = kompress::test::data_dir().string();
  std::printf("kompress %d.%d.%d demo: every array in %s, relative bounds, %d host threads\n\n",
              kompress::version.major, kompress::version.minor, kompress::version.patch, data_dir.c_str(),
              host{}.concurrency());
  std::printf("%-42s %-6s %8s %9s %11s %8s %9s %9s\n", "field", "type", "rel", "ratio", "max error",
              "err/eb", "comp GB/s", "dec GB/s");
  try {
    for (const auto& file : files) {
      if (file.dtype == "f64")
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
