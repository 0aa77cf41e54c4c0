// Host and device agree on where a kernel's argument keeps what follows a Kokkos View. nvcc 13
// places a member that follows an empty [[no_unique_address]] member (mdspan-based Views have
// them) at another offset in device code than the host compiler does, unless kompress's CMake
// target's definitions are in force; a kernel then reads its functor's members wrong
// (docs/gpu.md, "nvcc 13 and Kokkos's Views"). Checked without a GPU: this file is compiled for
// Kokkos::Cuda with its PTX kept (nvcc -keep), and the program compares the probe kernel's
// parameter in that PTX (its size, and where the value is loaded from) with the host's layout.
//
//   test_view_layout [PTX_DIR]   (default: the folder the build kept the PTX in)

#include <kompress/detail/config.hpp>

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>

namespace {

/// What a Kokkos kernel's functor looks like: a View, then a value the kernel reads.
struct view_then_value {
  Kokkos::View<double*, Kokkos::CudaSpace, Kokkos::MemoryUnmanaged> view;
  double value;
};

}  // namespace

extern "C" __global__ void kompress_view_layout_probe(view_then_value functor, double* out) { *out = functor.value; }

int main(int argc, char** argv) {
  const std::filesystem::path dir = argc > 1 ? argv[1] : KOMPRESS_VIEW_LAYOUT_PTX_DIR;
  std::string ptx;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() != ".ptx") continue;
    std::ifstream file(entry.path());
    std::ostringstream text;
    text << file.rdbuf();
    if (text.str().find("kompress_view_layout_probe") != std::string::npos) ptx = text.str();
  }
  if (ptx.empty()) {
    std::fprintf(stderr, "test_view_layout: no PTX with the probe kernel in %s\n", dir.c_str());
    return 2;
  }
  std::smatch size, load;
  const bool has_size =
      std::regex_search(ptx, size, std::regex(R"(kompress_view_layout_probe_param_0\[(\d+)\])"));
  const bool has_load = std::regex_search(
      ptx, load, std::regex(R"(ld\.param\.[a-z0-9]+\s+%[a-z0-9]+,\s*\[kompress_view_layout_probe_param_0\+(\d+)\])"));
  if (!has_size || !has_load) {
    std::fprintf(stderr, "test_view_layout: the probe kernel's parameter not found in the PTX\n");
    return 2;
  }
  const std::size_t device_size = std::stoul(size[1]), device_offset = std::stoul(load[1]);
  const std::size_t host_size = sizeof(view_then_value), host_offset = offsetof(view_then_value, value);
  std::printf("a View, then a double: host %zu bytes, the double at %zu; device %zu bytes, the double at %zu\n",
              host_size, host_offset, device_size, device_offset);
  if (device_size != host_size || device_offset != host_offset) {
    std::fprintf(stderr, "test_view_layout: host and device lay the functor out differently\n");
    return 1;
  }
  return 0;
}
