#pragma once
// The real data the tests, benchmarks and examples read (../shared/data beside the
// repository; see its README.md): where it is, the list of float arrays with their shapes,
// fill values and families, and reading one.
//
// The folder is $KOMPRESS_DATA_DIR when set (ctest sets it for every test), else
// KOMPRESS_DEFAULT_DATA_DIR, which CMake compiles in (the KOMPRESS_DATA_DIR cache variable).
// A missing file or folder is an error that names what was looked for: a test on real data
// never skips silently.

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <numeric>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <vector>

#ifndef KOMPRESS_DEFAULT_DATA_DIR
#define KOMPRESS_DEFAULT_DATA_DIR ""
#endif

namespace kompress::test {

/// The data folder: $KOMPRESS_DATA_DIR if set and non-empty, else the folder CMake compiled in.
/// Throws std::runtime_error if that is not an existing folder.
inline std::filesystem::path data_dir() {
  const char* env = std::getenv("KOMPRESS_DATA_DIR");
  const bool from_env = env != nullptr && *env != '\0';
  const std::filesystem::path dir = from_env ? env : KOMPRESS_DEFAULT_DATA_DIR;
  std::error_code ec;
  if (dir.empty() || !std::filesystem::is_directory(dir, ec)) {
    throw std::runtime_error(
        "kompress::test::data_dir: the test data folder '" + dir.string() + "' (from " +
        (from_env ? "the environment variable KOMPRESS_DATA_DIR"
                  : "the compiled-in default; set KOMPRESS_DATA_DIR to override") +
        ") is not a directory");
  }
  return dir;
}

/// The path of one data file, which must exist. Throws std::runtime_error naming the file,
/// the folder and KOMPRESS_DATA_DIR otherwise.
inline std::filesystem::path data_file(std::string_view name) {
  const std::filesystem::path dir = data_dir();
  std::filesystem::path file = dir / name;
  std::error_code ec;
  if (!std::filesystem::is_regular_file(file, ec)) {
    throw std::runtime_error("kompress::test::data_file: test data file '" + std::string(name) +
                             "' not found in '" + dir.string() +
                             "' (set KOMPRESS_DATA_DIR to the folder that holds it)");
  }
  return file;
}

/// A headerless little-endian raw array of T, as every .f32/.f64/.u8 data file is. Throws if
/// the file is missing, unreadable, or its size is not a multiple of sizeof(T).
template <class T>
  requires std::is_arithmetic_v<T>
std::vector<T> read_raw(std::string_view name) {
  const std::filesystem::path file = data_file(name);
  const auto bytes = std::filesystem::file_size(file);
  if (bytes % sizeof(T) != 0) {
    throw std::runtime_error("kompress::test::read_raw: '" + file.string() + "' has " +
                             std::to_string(bytes) + " bytes, not a multiple of the " +
                             std::to_string(sizeof(T)) + "-byte element size");
  }
  std::vector<T> values(bytes / sizeof(T));
  std::ifstream in(file, std::ios::binary);
  if (!in.read(reinterpret_cast<char*>(values.data()), static_cast<std::streamsize>(bytes))) {
    throw std::runtime_error("kompress::test::read_raw: could not read " + std::to_string(bytes) +
                             " bytes from '" + file.string() + "'");
  }
  if constexpr (std::endian::native == std::endian::big && sizeof(T) > 1) {
    for (T& value : values) {
      auto* first = reinterpret_cast<unsigned char*>(&value);
      std::reverse(first, first + sizeof(T));
    }
  }
  return values;
}

/// One floating-point array of the data folder, described by its file name.
struct data_file_info {
  std::string name;                  ///< file name, e.g. "erai_z_2x3x241x480.f32"
  std::string dtype;                 ///< "f32" or "f64"
  std::vector<std::size_t> shape;    ///< C order, slowest index first (the AxBxC of the name)
  std::optional<double> fill_value;  ///< the missing-value marker stored in the array, if any
  std::string family;                ///< "science", "embedding" or "activation"

  /// Number of elements: the product of the shape.
  std::size_t elements() const {
    return std::accumulate(shape.begin(), shape.end(), std::size_t{1}, std::multiplies<>{});
  }
};

namespace detail {

// "erai_z_2x3x241x480" -> {2, 3, 241, 480}; empty if the name does not end in a shape.
inline std::vector<std::size_t> parse_shape(std::string_view stem) {
  const auto underscore = stem.rfind('_');
  if (underscore == std::string_view::npos) return {};
  std::string_view dims = stem.substr(underscore + 1);
  std::vector<std::size_t> shape;
  while (true) {
    const auto x = dims.find('x');
    const std::string_view dim = dims.substr(0, x);
    if (dim.empty() || dim.size() > 12 ||
        !std::all_of(dim.begin(), dim.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      return {};
    }
    shape.push_back(std::stoull(std::string(dim)));
    if (x == std::string_view::npos) break;
    dims.remove_prefix(x + 1);
  }
  return shape;
}

// Fill (missing) values kept as stored in the arrays. Hard-coded from the data README and
// manifest.json ("fill_values": 9.969209968386869e+36, 1.0000000409184788e+35 and
// 1.0000000200408773e+20 are these float32 values widened to double); no other array has a
// fill-like value (|x| >= 1e19). tests/support/data_support.cpp checks them against the arrays.
inline std::optional<double> fill_value_of(std::string_view name) {
  if (name.starts_with("pop_temp_")) return static_cast<double>(9.96921e36f);
  if (name.starts_with("foam_ocean_v_")) return static_cast<double>(1e35f);
  if (name.starts_with("nemo_orca2_sst_")) return static_cast<double>(1e20f);
  return std::nullopt;
}

inline std::string family_of(std::string_view name) {
  if (name.starts_with("emb_") || name.starts_with("dlrm_")) return "embedding";
  if (name.starts_with("act_") || name.starts_with("grad_")) return "activation";
  return "science";
}

}  // namespace detail

/// Every .f32 and .f64 file of the data folder, sorted by name. Throws if the folder has none,
/// if a name does not end in a shape, or if a file's size does not match its shape.
inline std::vector<data_file_info> float_data_files() {
  const std::filesystem::path dir = data_dir();
  std::vector<data_file_info> files;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const std::filesystem::path& path = entry.path();
    const std::string extension = path.extension().string();
    if (!entry.is_regular_file() || (extension != ".f32" && extension != ".f64")) continue;
    data_file_info info;
    info.name = path.filename().string();
    info.dtype = extension.substr(1);
    info.shape = detail::parse_shape(path.stem().string());
    if (info.shape.empty()) {
      throw std::runtime_error("kompress::test::float_data_files: '" + path.string() +
                               "' does not end in a shape such as _8x8x128" + extension);
    }
    const std::size_t element_size = info.dtype == "f32" ? 4 : 8;
    const auto bytes = entry.file_size();
    if (bytes != info.elements() * element_size) {
      throw std::runtime_error("kompress::test::float_data_files: '" + path.string() + "' has " +
                               std::to_string(bytes) + " bytes, its name says " +
                               std::to_string(info.elements() * element_size));
    }
    info.fill_value = detail::fill_value_of(info.name);
    info.family = detail::family_of(info.name);
    files.push_back(std::move(info));
  }
  if (files.empty()) {
    throw std::runtime_error("kompress::test::float_data_files: no .f32 or .f64 files in '" +
                             dir.string() + "' (set KOMPRESS_DATA_DIR to the data folder)");
  }
  std::sort(files.begin(), files.end(),
            [](const data_file_info& a, const data_file_info& b) { return a.name < b.name; });
  return files;
}

}  // namespace kompress::test
