// The error bound on every real array in the data folder, at every bound the codec promises
// to honour, in both bound modes: |x - x'| <= e element by element, no slack.

#include "support/codec_checks.hpp"
#include "data_sample.hpp"

#include <doctest/doctest.h>

#include <cstdio>
#include <span>

namespace {

/// With codec_mode::ratio the array is compressed as a View of its own shape (LayoutRight),
/// so the Lorenzo predictors run on real 2-D, 3-D and 4-D fields.
/// Stochastic rounding runs at three bounds of each mode: its arithmetic differs from rounding
/// to nearest only in the dither (docs/error-bound.md), which the adversarial suite covers.
template <class T>
void check_file(const kompress::test::data_file_info& file,
                kompress::codec_mode codec = kompress::codec_mode::fast,
                kompress::rounding_mode rounding = kompress::rounding_mode::nearest) {
  const std::vector<T> values = kompress::test::read_raw<T>(file.name);
  const std::vector<std::size_t> extents =
      codec == kompress::codec_mode::ratio ? file.shape : std::vector<std::size_t>{};
  const bool stochastic = rounding == kompress::rounding_mode::stochastic;
  std::vector<double> bounds = {1e-1, 1e-2, 1e-3, 1e-4, 1e-6};
  if (stochastic) bounds = {1e-1, 1e-2, 1e-4};
  if constexpr (std::is_same_v<T, double>) bounds.push_back(1e-9);
  for (const auto mode : {kompress::bound_mode::absolute, kompress::bound_mode::relative}) {
    for (const double bound : bounds) {
      kompress::compress_options options{.bound = {mode, bound}, .fill_value = file.fill_value, .codec = codec,
                                         .rounding = rounding, .rounding_seed = 17};
      CAPTURE(file.name);
      CAPTURE(bound);
      CAPTURE(mode == kompress::bound_mode::relative ? "rel" : "abs");
      CAPTURE(int(codec));
      CAPTURE(stochastic);
      const auto result = kompress::test::require_round_trip<T>(std::span<const T>(values), options, extents);
      std::printf("%-44s %s%s %s %-6g ratio %8.2f\n", file.name.c_str(),
                  codec == kompress::codec_mode::ratio ? "ratio" : "fast ", stochastic ? " stochastic" : "",
                  mode == kompress::bound_mode::relative ? "rel" : "abs", bound, result.ratio());
    }
  }
  // Fill files also without naming the fill: the bound still holds, over the raw range.
  if (file.fill_value) {
    kompress::compress_options options{.bound = kompress::relative(1e-3), .codec = codec, .rounding = rounding};
    kompress::test::require_round_trip<T>(std::span<const T>(values), options, extents);
  }
}

// The full set has 35 arrays, the repository's sample 14 of them (data/README.md).
std::size_t arrays_expected() { return kompress::test::data_is_sample() ? 14 : 30; }

}  // namespace

TEST_CASE("codec: the bound holds on every real array in the data folder") {
  const auto files = kompress::test::float_data_files();
  REQUIRE(files.size() >= arrays_expected());
  for (const auto& file : files) {
    if (file.dtype == "f32")
      check_file<float>(file);
    else
      check_file<double>(file);
  }
}

TEST_CASE("codec: the ratio codec's bound holds on every real array, as a View of its shape") {
  const auto files = kompress::test::float_data_files();
  REQUIRE(files.size() >= arrays_expected());
  for (const auto& file : files) {
    if (file.dtype == "f32")
      check_file<float>(file, kompress::codec_mode::ratio);
    else
      check_file<double>(file, kompress::codec_mode::ratio);
  }
}

// Not in the team-kernel build, three times slower on the host: its encoder is the
// same per-block code, and codec_rounding_team holds its stochastic streams to the same bytes.
#ifndef KOMPRESS_TEAM_KERNELS
TEST_CASE("codec: stochastic rounding keeps the bound on every real array, both codecs") {
  const auto files = kompress::test::float_data_files();
  REQUIRE(files.size() >= arrays_expected());
  for (const auto codec : {kompress::codec_mode::fast, kompress::codec_mode::ratio}) {
    for (const auto& file : files) {
      if (file.dtype == "f32")
        check_file<float>(file, codec, kompress::rounding_mode::stochastic);
      else
        check_file<double>(file, codec, kompress::rounding_mode::stochastic);
    }
  }
}
#endif
