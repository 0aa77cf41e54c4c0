// kompress_stream_tool: the C++ side of the Python package's cross-language tests.
//   kompress_stream_tool compress f32|f64 IN.raw abs|rel BOUND BLOCK_SIZE OUT.kmpz [ratio D0xD1x...]
//                                            (ratio: the ratio codec on a row-major View of
//                                            that shape, folded to rank 3 as Python folds it)
//   kompress_stream_tool decompress IN.kmpz OUT.raw
//   kompress_stream_tool time IN.raw CALLS   seconds per kompress::compress of IN (float32,
//                                            REL 1e-3, into a preallocated View): the baseline
//                                            of the Python call-overhead measurement
//   kompress_stream_tool time-device IN.raw CALLS   the same on Kokkos's default execution space
//                                            (a GPU in a CUDA build): values and stream in its
//                                            memory, on its default instance, waited for per call
// Raw files are headerless native-endian arrays; the stream is written exactly as
// kompress::compress produced it.
#include <kompress/kompress.hpp>

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace {

std::vector<char> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_file(const std::string& path, const void* data, std::size_t bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(static_cast<const char*>(data), std::streamsize(bytes));
  if (!out) throw std::runtime_error("cannot write " + path);
}

/// "4x110x64" -> {4 * 110 / ..., rows, columns}: the axes before the last two folded into one.
std::array<std::size_t, 3> folded_shape(const std::string& text) {
  std::vector<std::size_t> shape;
  for (std::size_t at = 0; at <= text.size();) {
    const std::size_t x = std::min(text.find('x', at), text.size());
    shape.push_back(std::stoul(text.substr(at, x - at)));
    at = x + 1;
  }
  std::array<std::size_t, 3> folded{1, 1, 1};
  const int rank = int(shape.size());
  for (int d = 0; d < rank; ++d) folded[d >= rank - 2 ? 3 - (rank - d) : 0] *= shape[std::size_t(d)];
  return folded;
}

template <class T>
void compress_file(const std::vector<char>& raw, const kompress::compress_options& options,
                   const std::array<std::size_t, 3>& shape, const std::string& out_path) {
  Kokkos::View<const T***, Kokkos::LayoutRight, Kokkos::HostSpace, Kokkos::MemoryUnmanaged> values(
      reinterpret_cast<const T*>(raw.data()), shape[0], shape[1], shape[2]);
  if (values.size() * sizeof(T) != raw.size()) throw std::runtime_error("the shape does not match the file's size");
  Kokkos::View<std::byte*, Kokkos::HostSpace> stream("stream", kompress::max_compressed_size(values, options));
  const std::size_t length = kompress::compress(Kokkos::DefaultHostExecutionSpace{}, values, stream, options);
  write_file(out_path, stream.data(), length);
}

template <class T>
void decompress_file(const std::vector<char>& bytes, const std::string& out_path) {
  Kokkos::View<const std::byte*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged> stream(
      reinterpret_cast<const std::byte*>(bytes.data()), bytes.size());
  auto values = kompress::decompress<T>(Kokkos::DefaultHostExecutionSpace{}, stream);
  write_file(out_path, values.data(), values.size() * sizeof(T));
}

}  // namespace

int main(int argc, char** argv) {
  Kokkos::ScopeGuard kokkos(argc, argv);
  try {
    const std::vector<std::string> args(argv + 1, argv + argc);
    if ((args.size() == 7 || (args.size() == 9 && args[7] == "ratio")) && args[0] == "compress") {
      const double bound = std::stod(args[4]);
      const bool ratio = args.size() == 9;
      const kompress::compress_options options{
          .bound = args[3] == "rel" ? kompress::relative(bound) : kompress::absolute(bound),
          .block_size = std::stoi(args[5]),
          .codec = ratio ? kompress::codec_mode::ratio : kompress::codec_mode::fast};
      const auto raw = read_file(args[2]);
      const std::size_t element = args[1] == "f32" ? sizeof(float) : sizeof(double);
      const auto shape = ratio ? folded_shape(args[8]) : std::array<std::size_t, 3>{1, 1, raw.size() / element};
      if (args[1] == "f32")
        compress_file<float>(raw, options, shape, args[6]);
      else
        compress_file<double>(raw, options, shape, args[6]);
      return 0;
    }
    if (args.size() == 3 && args[0] == "decompress") {
      const auto bytes = read_file(args[1]);
      Kokkos::View<const std::byte*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged> stream(
          reinterpret_cast<const std::byte*>(bytes.data()), bytes.size());
      if (kompress::inspect(stream).type == kompress::element_type::float32)
        decompress_file<float>(bytes, args[2]);
      else
        decompress_file<double>(bytes, args[2]);
      return 0;
    }
    if (args.size() == 3 && args[0] == "time") {
      const auto raw = read_file(args[1]);
      Kokkos::View<const float*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged> values(
          reinterpret_cast<const float*>(raw.data()), raw.size() / sizeof(float));
      const kompress::compress_options options{.bound = kompress::relative(1e-3)};
      Kokkos::View<std::byte*, Kokkos::HostSpace> stream("stream", kompress::max_compressed_size(values, options));
      const int calls = std::stoi(args[2]);
      std::size_t total = 0;
      for (int i = 0; i < calls / 10; ++i) total += kompress::compress(Kokkos::DefaultHostExecutionSpace{}, values, stream, options);
      const auto start = std::chrono::steady_clock::now();
      for (int i = 0; i < calls; ++i) total += kompress::compress(Kokkos::DefaultHostExecutionSpace{}, values, stream, options);
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      std::printf("%.9g %zu\n", seconds / calls, total);
      return 0;
    }
    if (args.size() == 3 && args[0] == "time-device") {
      const auto raw = read_file(args[1]);
      using memory = Kokkos::DefaultExecutionSpace::memory_space;
      Kokkos::View<float*, memory> values("values", raw.size() / sizeof(float));
      Kokkos::deep_copy(values, Kokkos::View<const float*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>(
                                    reinterpret_cast<const float*>(raw.data()), values.size()));
      const kompress::compress_options options{.bound = kompress::relative(1e-3)};
      Kokkos::View<std::byte*, memory> stream("stream", kompress::max_compressed_size(values, options));
      const Kokkos::DefaultExecutionSpace exec;
      const int calls = std::stoi(args[2]);
      std::size_t total = 0;
      for (int i = 0; i < std::max(calls / 10, 1); ++i) total += kompress::compress(exec, values, stream, options);
      const auto start = std::chrono::steady_clock::now();
      for (int i = 0; i < calls; ++i) total += kompress::compress(exec, values, stream, options);
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      std::printf("%.9g %zu\n", seconds / calls, total);
      return 0;
    }
    std::fprintf(stderr, "usage: kompress_stream_tool compress f32|f64 IN abs|rel BOUND BLOCK OUT [ratio SHAPE]\n"
                         "       kompress_stream_tool decompress IN OUT\n"
                         "       kompress_stream_tool time|time-device IN CALLS\n");
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kompress_stream_tool: %s\n", e.what());
    return 1;
  }
}
