// Batched compression (detail/compress_batch.hpp): many arrays compressed by three launches of
// the team kernels write, byte for byte, what compress writes for each, and the same lengths:
// on real data cut into pieces of every awkward size, at every block size, with fill values,
// given value ranges, stochastic rounding, an unaligned output and the ratio codec (the last
// two through the single-stream kernels). On the build's default execution space (the GPU in a
// CUDA build), with the team kernels forced where the backend does not run them, and with the
// batched kernels turned off (every piece through the single-stream kernels) as well.

#include "support/codec_checks.hpp"
#include "support/data_checks.hpp"

#include <kompress/detail/compress_batch.hpp>
#include <kompress/kernels/range_pass.hpp>

#include <doctest/doctest.h>

#include <cstring>
#include <span>
#include <string>
#include <vector>

namespace {

using kompress::test::default_exec;
using kompress::test::default_memory;
using kompress::detail::stream_to_compress;
template <class T>
using device = Kokkos::View<T*, default_memory>;

/// The backend's tuning with `team_size`; the batched kernels where `batch_kernels` (and the
/// team kernels run), else every piece through the single-stream kernels.
kompress::detail::kernel_tuning with_team_size(int team_size, bool batch_kernels) {
  kompress::detail::kernel_tuning tuning = kompress::detail::backend<default_exec>::tuning();
  tuning.team_size = team_size;
  tuning.batch_compression = batch_kernels;
  return tuning;
}

/// Compresses `values` cut into `sizes` as one batch and each piece alone (compress, or
/// compress_known_range for the pieces given their range), every stream at an 8-byte-aligned
/// offset of its buffer except where `shift` moves one by 3 bytes; checks every length and
/// every byte.
template <class T>
void check_batch(const device<T>& values, const std::vector<std::size_t>& sizes,
                 const kompress::compress_options& options, int team_size, bool batch_kernels,
                 bool known_ranges, std::size_t shift = ~std::size_t(0)) {
  std::vector<std::size_t> offsets, begins;
  std::size_t room = 0, at = 0;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    offsets.push_back(room + (i == shift ? 3 : 0));
    begins.push_back(at);
    room += (kompress::max_compressed_size<T>(sizes[i], options) + 3 + 7) / 8 * 8;
    at += sizes[i];
  }
  REQUIRE(at <= values.size());
  const device<std::byte> batched("batched", room), alone("alone", room);
  std::vector<kompress::detail::packed_range<T>> ranges(sizes.size());
  std::vector<stream_to_compress<T>> streams;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    const T* const in = values.data() + begins[i];
    if (known_ranges)
      ranges[i] = kompress::detail::range_keys(default_exec{}, in, sizes[i], options.fill_value.has_value(),
                                               kompress::detail::fill_bits_of<T>(options));
    streams.push_back({in, sizes[i], batched.data() + offsets[i], known_ranges && i % 2 ? &ranges[i] : nullptr});
  }
  const std::vector<std::size_t> lengths = kompress::detail::compress_batch(
      default_exec{}, std::span<const stream_to_compress<T>>(streams), options, "test",
      with_team_size(team_size, batch_kernels));
  REQUIRE(lengths.size() == sizes.size());
  const auto got = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, batched);
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    CAPTURE(i);
    CAPTURE(sizes[i]);
    const auto in = Kokkos::subview(values, std::pair<std::size_t, std::size_t>(begins[i], begins[i] + sizes[i]));
    const std::size_t worst = kompress::max_compressed_size<T>(sizes[i], options);
    const auto out = Kokkos::subview(alone, std::pair<std::size_t, std::size_t>(offsets[i], offsets[i] + worst));
    const std::size_t length = streams[i].known_range
                                   ? kompress::detail::compress_known_range(default_exec{}, in, out, options, ranges[i])
                                   : kompress::compress(default_exec{}, in, out, options);
    CHECK(lengths[i] == length);
    const auto expected = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, alone);
    CHECK(std::memcmp(got.data() + offsets[i], expected.data() + offsets[i], length) == 0);
  }
}

template <class T>
void check_file(const kompress::test::data_file_info& file) {
  const std::vector<T> host_values = kompress::test::read_raw<T>(file.name);
  const device<T> values = kompress::test::to_default_space(host_values);
  const std::size_t n = host_values.size();
  const std::vector<std::size_t> sizes = {1, 32, 2049, 0, 4095, 77, (n - 6254) / 3, n - 6254 - (n - 6254) / 3};
  for (const int block_size : {32, 64, 128})
    for (const auto bound : {kompress::relative(1e-2), kompress::absolute(1e-3)}) {
      const kompress::compress_options options{.bound = bound, .fill_value = file.fill_value, .block_size = block_size};
      for (const int team_size : {64, -1, 0})
        for (const bool batch_kernels : {false, true}) {
          CAPTURE(file.name);
          CAPTURE(block_size);
          CAPTURE(team_size);
          CAPTURE(batch_kernels);
          check_batch(values, sizes, options, team_size, batch_kernels, block_size == 32);
        }
    }
}

}  // namespace

TEST_CASE("compress_batch: every real array cut into pieces compresses as each piece alone" *
          doctest::test_suite("slow")) {
  int checked = 0;
  for (const auto& file : kompress::test::float_data_files()) {
    if (file.elements() < 20000) continue;
    if (file.dtype == "f32") check_file<float>(file);
    else check_file<double>(file);
    ++checked;
  }
  CHECK(checked >= 5);
}

TEST_CASE("compress_batch: stochastic rounding, an unaligned output and the ratio codec") {
  const std::vector<float> host_values = kompress::test::read_raw<float>("hacc_x_32768.f32");
  const device<float> values = kompress::test::to_default_space(host_values);
  const std::vector<std::size_t> sizes = {5000, 9000, 1, 4096, 6000, 8000};
  for (const int team_size : {64, 0})
    for (const bool batch_kernels : {false, true}) {
      CAPTURE(team_size);
      CAPTURE(batch_kernels);
      check_batch(values, sizes,
                  {.bound = kompress::relative(1e-3), .rounding = kompress::rounding_mode::stochastic,
                   .rounding_seed = 11},
                  team_size, batch_kernels, false);
      check_batch(values, sizes, {.bound = kompress::relative(1e-3)}, team_size, batch_kernels, true,
                  2);  // stream 2 at +3 bytes
      check_batch(values, sizes, {.bound = kompress::relative(1e-3), .codec = kompress::codec_mode::ratio}, team_size,
                  batch_kernels, false);
    }
}

TEST_CASE("compress_batch: nothing to compress, and bad options, as compress treats them") {
  CHECK(kompress::detail::compress_batch(default_exec{}, std::span<const stream_to_compress<float>>(),
                                         kompress::compress_options{}, "test")
            .empty());
  const device<float> values("values", 100);
  const device<std::byte> out("out", kompress::max_compressed_size<float>(100));
  const std::vector<stream_to_compress<float>> one = {{values.data(), 100, out.data(), nullptr}};
  CHECK_THROWS_AS(kompress::detail::compress_batch(default_exec{}, std::span<const stream_to_compress<float>>(one),
                                                   {.bound = kompress::relative(-1.0)}, "test"),
                  kompress::invalid_argument);
}
