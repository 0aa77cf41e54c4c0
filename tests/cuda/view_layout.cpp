// Host and device agree on where a kernel's argument keeps what follows a Kokkos View. nvcc 13
// places a member that follows an empty [[no_unique_address]] member (mdspan-based Views have
// them) at another offset in device code than the host compiler does, unless kompress's CMake
// target's definitions are in force; a kernel then reads its functor's members wrong
// (docs/gpu.md, "nvcc 13 and Kokkos's Views"). Checked without a GPU: this file is compiled for
// Kokkos::Cuda, and the program compares the probe kernel's parameter in its PTX (its size, and
// where the value is loaded from) with the host's layout. The PTX is read from the program
// itself (a build with uncompressed fatbins, as scripts/dev's, holds it as text), else from the
// folder nvcc -keep left it in (empty where ccache supplied the object).
//
//   test_view_layout [PTX_DIR]   (default: the folder the build kept the PTX in)

#include <kompress/detail/config.hpp>

#include <Kokkos_Core.hpp>

#include <cctype>
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

namespace {

/// The whole of a file, or nothing where it cannot be read.
std::string read_file(const std::filesystem::path& path) {
  std::ifstream file(path, std::ios::binary);
  std::ostringstream text;
  text << file.rdbuf();
  return text.str();
}

/// Where the probe kernel's PTX declares its parameter's size ("..._param_0[40]"), or npos. The
/// name alone also appears among this program's own strings, not followed by a digit.
std::size_t probe_declaration(const std::string& text) {
  const std::string marker = "kompress_view_layout_probe_param_0[";
  for (std::size_t at = text.find(marker); at != std::string::npos; at = text.find(marker, at + 1))
    if (at + marker.size() < text.size() && std::isdigit(static_cast<unsigned char>(text[at + marker.size()])))
      return at;
  return std::string::npos;
}

}  // namespace

int main(int argc, char** argv) {
  // The probe's PTX: given a folder, the .ptx files there; else this program's own PTX, else
  // the folder the build kept its PTX in.
  std::string ptx;
  const auto search = [&](const std::filesystem::path& dir) {
    std::error_code error;
    for (const auto& entry : std::filesystem::directory_iterator(dir, error))
      if (entry.path().extension() == ".ptx" && probe_declaration(read_file(entry.path())) != std::string::npos)
        ptx = read_file(entry.path());
  };
  if (argc > 1) {
    search(argv[1]);
  } else {
    ptx = read_file("/proc/self/exe");
    if (probe_declaration(ptx) == std::string::npos) {
      ptx.clear();
      search(KOMPRESS_VIEW_LAYOUT_PTX_DIR);
    }
  }
  if (ptx.empty()) {
    std::fprintf(stderr, "test_view_layout: no PTX of the probe kernel in this program (a compressed fatbin?) or in %s\n",
                 argc > 1 ? argv[1] : KOMPRESS_VIEW_LAYOUT_PTX_DIR);
    return 2;
  }
  // The kernel's declaration and body: a few hundred bytes from its parameter's size on (the
  // rest of a program is no input for std::regex; the marker alone is this program's string).
  ptx = ptx.substr(probe_declaration(ptx), 4096);
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
