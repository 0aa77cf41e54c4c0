#pragma once
// The repository's data sample against the full data set (real_data.hpp finds either).
//
// data/ holds a sample of the full set (data/README.md): some arrays whole, some as their
// leading rows, with the shape they have there in their names, and a sample.json that marks the
// folder. Code that runs on either finds an array by its stem ("act_mlp_relu2_out", whatever
// the shape); code that needs what only the full set has skips on the sample with a reason
// (missing_from_sample) and fails anywhere else, as real_data.hpp does.

#include "real_data.hpp"

#include <algorithm>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

namespace kompress::test {

/// True when the data folder is the repository's sample (marked by its sample.json) rather
/// than the full set.
inline bool data_is_sample() {
  std::error_code ec;
  return std::filesystem::is_regular_file(data_dir() / "sample.json", ec);
}

namespace detail {

// "act_mlp_relu2_out_128x1024.f32" -> "act_mlp_relu2_out": the name without its shape.
inline std::string_view stem_of(std::string_view name) {
  const auto dot = name.rfind('.');
  return name.substr(0, name.substr(0, dot).rfind('_'));
}

}  // namespace detail

/// The array called `stem` whatever its shape: "act_mlp_relu2_out" is
/// act_mlp_relu2_out_1024x1024.f32 in the full set and act_mlp_relu2_out_128x1024.f32, its
/// first 128 rows, in the sample. Throws, naming the folder, unless exactly one array has it.
inline data_file_info find_array(std::string_view stem) {
  std::vector<data_file_info> found;
  for (auto& file : float_data_files())
    if (detail::stem_of(file.name) == stem) found.push_back(std::move(file));
  if (found.size() != 1) {
    throw std::runtime_error("kompress::test::find_array: " + std::to_string(found.size()) + " arrays called '" +
                             std::string(stem) + "_<shape>' in '" + data_dir().string() +
                             "' (set KOMPRESS_DATA_DIR to the data folder)");
  }
  return found.front();
}

/// `count` values of the array called `stem`: in the full set, when `count` is its size, the
/// array itself; in the sample, its leading rows repeated until there are `count` (the sizes a
/// test was written for, on real values). Throws if the array holds fewer values and the folder
/// is not the sample.
template <class T>
std::vector<T> read_array(std::string_view stem, std::size_t count) {
  std::vector<T> values = read_raw<T>(find_array(stem).name);
  if (values.size() < count && !data_is_sample()) {
    throw std::runtime_error("kompress::test::read_array: '" + std::string(stem) + "' holds " +
                             std::to_string(values.size()) + " values, fewer than " + std::to_string(count));
  }
  const std::size_t have = values.size();
  values.resize(count);
  for (std::size_t i = have; i < count; ++i) values[i] = values[i - have];
  return values;
}

/// Why a caller that needs `name` must skip: set when it is absent and the folder is the
/// repository's sample. `name` is a file name ("mnist_t10k_labels_10000.u8") or an array's
/// stem ("nemo_orca2_sst", as find_array takes). Empty when it is there; throws data_file's or
/// find_array's error when it is absent from any other folder.
inline std::optional<std::string> missing_from_sample(std::string_view name) {
  const bool stem = name.find('.') == std::string_view::npos;
  std::error_code ec;
  if (stem) {
    const auto files = float_data_files();
    if (std::any_of(files.begin(), files.end(), [&](const auto& f) { return detail::stem_of(f.name) == name; }))
      return std::nullopt;
  } else if (std::filesystem::is_regular_file(data_dir() / name, ec)) {
    return std::nullopt;
  }
  if (!data_is_sample()) stem ? (void)find_array(name) : (void)data_file(name);  // throws, naming the folder
  return "skipped: needs " + std::string(name) + ", which only the full data set has; '" + data_dir().string() +
         "' is the repository's sample (set KOMPRESS_DATA_DIR to the full set, ../shared/data)";
}

}  // namespace kompress::test
