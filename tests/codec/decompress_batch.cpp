// Batched decoding (detail/decompress_batch.hpp): many streams decoded by one checksum launch
// and one decoder launch write exactly what decompress writes for each, with the thread-per-
// chunk and the team decoders and every way of reading the headers (in place, stream by
// stream, gathered), on real data cut into pieces of every awkward size; a damaged stream is
// named and leaves every output untouched; mixes the batched kernels do not take are decoded
// one by one. On the build's default execution space (the GPU in a CUDA build).

#include "support/codec_checks.hpp"
#include "support/data_checks.hpp"

#include <kompress/detail/decompress_batch.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <span>
#include <string>
#include <vector>

namespace {

using kompress::test::default_exec;
using kompress::test::default_memory;
using kompress::detail::stream_to_decode;
template <class T>
using device = Kokkos::View<T*, default_memory>;

/// The pieces of `values` [begin, begin + count) compressed one by one, end to end in one
/// buffer (each at an 8-byte-aligned offset), as a collective holds the streams that arrived.
template <class T>
struct compressed_pieces {
  device<std::byte> streams;
  std::vector<std::size_t> offsets, lengths, begins, counts;
  std::size_t values = 0;

  compressed_pieces(const device<T>& input, const std::vector<std::size_t>& sizes,
                    const std::vector<kompress::compress_options>& options) {
    std::size_t room = 0;
    for (std::size_t i = 0; i < sizes.size(); ++i)
      room += (kompress::max_compressed_size<T>(sizes[i], options[i % options.size()]) + 7) / 8 * 8;
    streams = device<std::byte>("streams", room);
    std::size_t at = 0;
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      const auto& o = options[i % options.size()];
      const auto in = Kokkos::subview(input, std::pair<std::size_t, std::size_t>(values, values + sizes[i]));
      const std::size_t worst = kompress::max_compressed_size<T>(sizes[i], o);
      const auto out = Kokkos::subview(streams, std::pair<std::size_t, std::size_t>(at, at + worst));
      offsets.push_back(at);
      lengths.push_back(kompress::compress(default_exec{}, in, out, o));
      begins.push_back(values);
      counts.push_back(sizes[i]);
      values += sizes[i];
      at += (worst + 7) / 8 * 8;
    }
  }

  std::vector<stream_to_decode<T>> batch(const device<T>& out) const {
    std::vector<stream_to_decode<T>> items;
    for (std::size_t i = 0; i < offsets.size(); ++i)
      items.push_back({streams.data() + offsets[i], lengths[i], out.data() + begins[i], counts[i]});
    return items;
  }

  /// decompress on each stream alone: what the batch must write.
  device<T> one_by_one() const {
    device<T> out("one_by_one", values);
    for (std::size_t i = 0; i < offsets.size(); ++i)
      kompress::decompress(default_exec{},
                           Kokkos::subview(streams,
                                           std::pair<std::size_t, std::size_t>(offsets[i], offsets[i] + lengths[i])),
                           Kokkos::subview(out, std::pair<std::size_t, std::size_t>(begins[i], begins[i] + counts[i])));
    return out;
  }
};

/// The values of the data folder's array whose name starts with `prefix` (the sample and the
/// full set name the same arrays by different shapes).
std::vector<float> array_named(const std::string& prefix) {
  for (const auto& file : kompress::test::float_data_files())
    if (file.name.starts_with(prefix)) return kompress::test::read_raw<float>(file.name);
  FAIL("no array named " << prefix);
  return {};
}

template <class T>
bool same_bits(const device<T>& a, const device<T>& b) {
  const auto x = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, a);
  const auto y = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, b);
  return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(T)) == 0;
}

/// Piece sizes that cross every boundary: one value, a block, a chunk and one, a partial
/// block, an empty piece, and the rest of `total` in two uneven pieces.
std::vector<std::size_t> awkward_sizes(std::size_t total) {
  std::vector<std::size_t> sizes = {1, 32, 2049, 0, 4095, 77};
  std::size_t used = 0;
  for (std::size_t s : sizes) used += s;
  REQUIRE(total > used + 2);
  const std::size_t rest = total - used;
  sizes.push_back(rest / 3);
  sizes.push_back(rest - rest / 3);
  return sizes;
}

using kompress::detail::header_reading;
constexpr header_reading every_reading[] = {header_reading::direct, header_reading::per_stream,
                                            header_reading::gathered};

kompress::detail::kernel_tuning tuned(int team_size, header_reading reading = header_reading::direct) {
  kompress::detail::kernel_tuning tuning = kompress::detail::backend<default_exec>::tuning();
  tuning.team_size = team_size;
  tuning.batch_headers = reading;
  return tuning;
}

template <class T>
void check_file(const kompress::test::data_file_info& file) {
  const std::vector<T> values = kompress::test::read_raw<T>(file.name);
  const device<T> input = kompress::test::to_default_space(values);
  for (const int block_size : {32, 64, 128}) {
    for (const double rel : {1e-2, 1e-4}) {
      const kompress::compress_options options{.bound = kompress::relative(rel), .fill_value = file.fill_value,
                                               .block_size = block_size};
      const compressed_pieces<T> pieces(input, awkward_sizes(values.size()), {options});
      const device<T> expected = pieces.one_by_one();
      // Every decoder with the headers read in place, the thread per chunk with every reading.
      const std::pair<int, header_reading> runs[] = {{0, header_reading::direct},
                                                     {64, header_reading::direct},
                                                     {-1, header_reading::direct},
                                                     {0, header_reading::per_stream},
                                                     {0, header_reading::gathered}};
      for (const auto& [team_size, reading] : runs) {
        CAPTURE(file.name);
        CAPTURE(block_size);
        CAPTURE(rel);
        CAPTURE(team_size);
        CAPTURE(int(reading));
        const device<T> out("batched", pieces.values);
        const auto items = pieces.batch(out);
        const double bound = kompress::detail::decompress_batch<default_memory>(
            default_exec{}, std::span<const stream_to_decode<T>>(items), "test", tuned(team_size, reading));
        CHECK(same_bits(out, expected));
        CHECK(bound > 0.0);
      }
    }
  }
}

}  // namespace

TEST_CASE("decompress_batch: every real array cut into pieces decodes as each piece alone" *
          doctest::test_suite("slow")) {
  const auto files = kompress::test::float_data_files();
  REQUIRE(!files.empty());
  int checked = 0;
  for (const auto& file : files) {
    if (file.elements() < 20000) continue;
    if (file.dtype == "f32") check_file<float>(file);
    else check_file<double>(file);
    ++checked;
  }
  CHECK(checked >= 5);
}

TEST_CASE("decompress_batch: a mix the batched kernels do not take is decoded stream by stream") {
  const std::vector<float> values = kompress::test::read_raw<float>("hacc_x_32768.f32");
  const device<float> input = kompress::test::to_default_space(values);
  const std::vector<kompress::compress_options> mixed = {
      {.bound = kompress::relative(1e-3)},
      {.bound = kompress::relative(1e-3), .codec = kompress::codec_mode::ratio},
      {.bound = kompress::absolute(0.01), .block_size = 64}};
  const compressed_pieces<float> pieces(input, {5000, 9000, 1, 4096, 6000, 8000}, mixed);
  const device<float> out("batched", pieces.values);
  const auto items = pieces.batch(out);
  kompress::detail::decompress_batch<default_memory>(default_exec{}, std::span<const stream_to_decode<float>>(items),
                                                     "test");
  CHECK(same_bits(out, pieces.one_by_one()));
}

TEST_CASE("decompress_batch: a damaged stream is named, and no output is written") {
  const std::vector<float> values = array_named("act_mlp_relu2_out_");
  const device<float> input = kompress::test::to_default_space(values);
  const compressed_pieces<float> pieces(input, {40000, 30000, 20000, 10000},
                                        {{.bound = kompress::relative(1e-2)}});
  for (const auto& [team_size, reading] : {std::pair{0, header_reading::direct}, std::pair{64, header_reading::direct},
                                           std::pair{0, header_reading::gathered}}) {
    CAPTURE(team_size);
    CAPTURE(int(reading));
    // A byte of stream 2's chunk data flipped (past its header and tables).
    const auto streams = Kokkos::create_mirror(Kokkos::HostSpace{}, pieces.streams);  // a copy, even on the host
    Kokkos::deep_copy(streams, pieces.streams);
    const std::size_t at = pieces.offsets[2] + pieces.lengths[2] - 5;
    streams(at) = std::byte(std::uint8_t(streams(at)) ^ 0x40);
    const device<std::byte> damaged("damaged", streams.size());
    Kokkos::deep_copy(damaged, streams);
    // Filled from the host (kompress::test::filled says why).
    const device<float> out = kompress::test::to_default_space(std::vector<float>(pieces.values, 7.0f));
    std::vector<stream_to_decode<float>> items = pieces.batch(out);
    for (std::size_t i = 0; i < items.size(); ++i) items[i].stream = damaged.data() + pieces.offsets[i];
    try {
      kompress::detail::decompress_batch<default_memory>(
          default_exec{}, std::span<const stream_to_decode<float>>(items), "test", tuned(team_size, reading));
      FAIL("a damaged stream was decoded");
    } catch (const kompress::format_error& e) {
      CHECK(std::string(e.what()).find("of stream 2 of 4") != std::string::npos);
      CHECK(std::string(e.what()).find("checksum mismatch") != std::string::npos);
    }
    const auto written = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, out);
    bool untouched = true;
    for (std::size_t i = 0; i < written.size(); ++i) untouched = untouched && written(i) == 7.0f;
    CHECK(untouched);
  }
}

TEST_CASE("decompress_batch: a stream that does not hold what it should is rejected") {
  const std::vector<float> values = kompress::test::read_raw<float>("hacc_x_32768.f32");
  const device<float> input = kompress::test::to_default_space(values);
  const compressed_pieces<float> pieces(input, {10000, 12000, 9000}, {{.bound = kompress::relative(1e-3)}});
  const device<float> out("out", pieces.values);
  using error = kompress::format_error;
  for (const header_reading reading : every_reading) {
    CAPTURE(int(reading));
    const auto decode = [&](std::vector<stream_to_decode<float>> items) {
      kompress::detail::decompress_batch<default_memory>(
          default_exec{}, std::span<const stream_to_decode<float>>(items), "test", tuned(0, reading));
    };
    auto items = pieces.batch(out);
    items[1].count -= 1;  // another count than the stream's
    CHECK_THROWS_WITH_AS(decode(items), doctest::Contains("expected 11999 values"), error);
    items = pieces.batch(out);
    items[2].length -= 1;  // shorter than the stream
    CHECK_THROWS_AS(decode(items), error);
    items = pieces.batch(out);
    items[0].length = 40;  // shorter than a header
    CHECK_THROWS_WITH_AS(decode(items), doctest::Contains("truncated"), error);
    // The streams hold floats: decoding them as doubles is the caller's error.
    const device<double> wide("wide", pieces.values);
    std::vector<stream_to_decode<double>> as_double;
    for (const auto& item : pieces.batch(out))
      as_double.push_back({item.stream, item.length, wide.data(), item.count});
    CHECK_THROWS_AS(kompress::detail::decompress_batch<default_memory>(
                        default_exec{}, std::span<const stream_to_decode<double>>(as_double), "test",
                        tuned(0, reading)),
                    kompress::invalid_argument);
    // Nothing to decode is not an error.
    CHECK(kompress::detail::decompress_batch<default_memory>(default_exec{}, std::span<const stream_to_decode<float>>(),
                                                             "test", tuned(0, reading)) == 0.0);
  }
}

TEST_CASE("decompress_batch: streams whose tables run past the first copy, read every way") {
  // 700,001 values: 342 chunks of the fast codec, tables past header_prefetch_bytes; beside
  // them a stream of one value, shorter than the prefetch.
  std::vector<float> values(700001);
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = float(std::sin(0.001 * double(i)) + 1e-3 * double(i % 7));
  const device<float> input = kompress::test::to_default_space(values);
  const compressed_pieces<float> pieces(input, {1, 700000}, {{.bound = kompress::relative(1e-3)}});
  REQUIRE(pieces.lengths[1] > kompress::detail::header_prefetch_bytes);
  const device<float> expected = pieces.one_by_one();
  for (const header_reading reading : every_reading) {
    CAPTURE(int(reading));
    const device<float> out("batched", pieces.values);
    const auto items = pieces.batch(out);
    kompress::detail::decompress_batch<default_memory>(default_exec{}, std::span<const stream_to_decode<float>>(items),
                                                       "test", tuned(0, reading));
    CHECK(same_bits(out, expected));
  }
  // A chunk end in the long stream's tables, past the first copy, damaged: rejected every way.
  const auto streams = Kokkos::create_mirror(Kokkos::HostSpace{}, pieces.streams);
  Kokkos::deep_copy(streams, pieces.streams);
  const std::size_t at = pieces.offsets[1] + kompress::detail::header_prefetch_bytes + 100;
  streams(at) = std::byte(std::uint8_t(streams(at)) ^ 0x10);
  const device<std::byte> damaged("damaged", streams.size());
  Kokkos::deep_copy(damaged, streams);
  for (const header_reading reading : every_reading) {
    CAPTURE(int(reading));
    const device<float> out("batched", pieces.values);
    std::vector<stream_to_decode<float>> items = pieces.batch(out);
    for (std::size_t i = 0; i < items.size(); ++i) items[i].stream = damaged.data() + pieces.offsets[i];
    CHECK_THROWS_AS(kompress::detail::decompress_batch<default_memory>(
                        default_exec{}, std::span<const stream_to_decode<float>>(items), "test", tuned(0, reading)),
                    kompress::format_error);
  }
}

TEST_CASE("gather_stream_bytes: pieces of every length, empty ones included, end to end in order") {
  std::vector<std::byte> bytes(10000);
  for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = std::byte(std::uint8_t(i * 37 + i / 251));
  const device<std::byte> memory = kompress::test::to_default_space(bytes);
  // Streams at odd offsets; pieces [from, to) of each, two of them empty.
  const std::vector<std::size_t> offsets = {0, 1, 333, 4097, 9000, 9999};
  const std::vector<std::size_t> from = {0, 5, 0, 10, 7, 0}, to = {1, 5, 3000, 4000, 7, 1};
  std::vector<stream_to_decode<float>> streams;
  for (std::size_t offset : offsets) streams.push_back({memory.data() + offset, bytes.size() - offset, nullptr, 0});
  const std::vector<std::byte> gathered = kompress::detail::gather_stream_bytes<default_memory>(
      default_exec{}, std::span<const stream_to_decode<float>>(streams), from, to);
  std::vector<std::byte> expected;
  for (std::size_t i = 0; i < offsets.size(); ++i)
    expected.insert(expected.end(), bytes.begin() + std::ptrdiff_t(offsets[i] + from[i]),
                    bytes.begin() + std::ptrdiff_t(offsets[i] + to[i]));
  CHECK(gathered == expected);
  // Nothing to gather: no launch, nothing returned.
  const std::vector<std::size_t> none(offsets.size(), 0);
  CHECK(kompress::detail::gather_stream_bytes<default_memory>(
            default_exec{}, std::span<const stream_to_decode<float>>(streams), none, none)
            .empty());
}
