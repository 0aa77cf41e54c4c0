// The stream format: self-description, rejection of damaged streams, and golden bytes that
// pin the format (a change to them is a deliberate, versioned decision).

#include "support/codec_checks.hpp"

#include <kompress/detail/checksum.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <utility>
#include <vector>

namespace {

// Streams are written, inspected and decoded on the build's default execution space, from copies
// in its memory space; bytes_view reads the host copy of a stream.
using kompress::test::default_exec;
using kompress::test::to_default_space;
using bytes_view = Kokkos::View<const std::byte*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>;

std::vector<float> sample(std::size_t n) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = float(20.0 * std::sin(0.05 * double(i)) + (i % 11 == 0 ? 3.0 : 0.0));
  return v;
}

std::vector<std::byte> compressed(const std::vector<float>& values, const kompress::compress_options& options) {
  return kompress::test::round_trip<float>(values, options).stream;
}

void decompress_bytes(const std::vector<std::byte>& stream, std::size_t count) {
  kompress::test::decompress_on_default<float>(stream, count);
}

}  // namespace

TEST_CASE("format: inspect reports the header") {
  const auto values = sample(5000);
  const auto stream = compressed(values, {.bound = kompress::relative(1e-3), .fill_value = 1e20, .block_size = 64});
  const auto info = kompress::inspect(bytes_view(stream.data(), stream.size()));
  CHECK(info.format_major == 1);
  CHECK(info.type == kompress::element_type::float32);
  CHECK(info.count == 5000);
  CHECK(info.requested_bound.mode == kompress::bound_mode::relative);
  CHECK(info.requested_bound.value == 1e-3);
  CHECK(info.absolute_bound == doctest::Approx(1e-3 * (info.value_max - info.value_min)));
  CHECK(info.has_fill_value);
  CHECK(info.fill_value == double(1e20f));
  CHECK(info.block_size == 64);
  CHECK(info.compressed_bytes == stream.size());
  CHECK(info.ratio() > 1.0);
}

TEST_CASE("format: every single-byte corruption is detected") {
  const auto values = sample(700);
  const auto stream = compressed(values, {.bound = kompress::absolute(1e-2)});
  for (std::size_t i = 0; i < stream.size(); ++i) {
    for (const unsigned flip : {0x01u, 0x80u, 0xFFu}) {
      auto damaged = stream;
      damaged[i] ^= std::byte(flip);
      CAPTURE(i);
      CHECK_THROWS_AS(decompress_bytes(damaged, values.size()), kompress::error);
    }
  }
}

TEST_CASE("format: every truncation is detected") {
  const auto values = sample(700);
  const auto stream = compressed(values, {.bound = kompress::absolute(1e-2)});
  for (std::size_t length = 0; length < stream.size(); ++length) {
    const std::vector<std::byte> truncated(stream.begin(), stream.begin() + std::ptrdiff_t(length));
    CAPTURE(length);
    CHECK_THROWS_AS(decompress_bytes(truncated, values.size()), kompress::format_error);
  }
}

TEST_CASE("format: wrong magic and unknown versions are named in the error") {
  const auto values = sample(100);
  auto stream = compressed(values, {.bound = kompress::absolute(1e-2)});
  auto bad_magic = stream;
  bad_magic[0] = std::byte('X');
  CHECK_THROWS_WITH_AS(decompress_bytes(bad_magic, values.size()), doctest::Contains("magic"), kompress::format_error);
  auto future = stream;
  future[4] = std::byte(2);
  CHECK_THROWS_WITH_AS(decompress_bytes(future, values.size()), doctest::Contains("version 2.0"), kompress::format_error);
  CHECK_THROWS_WITH_AS(kompress::inspect(bytes_view(stream.data(), 10)), doctest::Contains("truncated"), kompress::format_error);
  CHECK_THROWS_WITH_AS(kompress::inspect(Kokkos::subview(to_default_space(stream), std::pair<std::size_t, std::size_t>(0, 10))),
                       doctest::Contains("truncated"), kompress::format_error);
}

TEST_CASE("format: trailing bytes after a stream are ignored") {
  const auto values = sample(1000);
  auto stream = compressed(values, {.bound = kompress::absolute(1e-2)});
  stream.resize(stream.size() + 100, std::byte(0xAB));
  CHECK_NOTHROW(decompress_bytes(stream, values.size()));
}

TEST_CASE("format: inspect_header reads length and bound from the header alone") {
  const auto values = sample(5000);
  const auto stream = compressed(values, {.bound = kompress::relative(1e-3), .block_size = 64});
  const auto device_stream = to_default_space(stream);
  const auto prefix = [&](std::size_t length) {
    return Kokkos::subview(device_stream, std::pair<std::size_t, std::size_t>(0, length));
  };
  const auto full = kompress::inspect(bytes_view(stream.data(), stream.size()));
  const auto header = kompress::inspect_header(default_exec{}, device_stream);
  CHECK(header.compressed_bytes == stream.size());
  CHECK(header.compressed_bytes == full.compressed_bytes);
  CHECK(header.absolute_bound == full.absolute_bound);
  CHECK(header.count == values.size());
  CHECK(header.block_size == 64);
  CHECK(kompress::inspect(device_stream).compressed_bytes == full.compressed_bytes);
  // Room beyond the stream (a worst-case reservation) is fine; less than the header is not.
  std::vector<std::byte> padded = stream;
  padded.resize(stream.size() + 4096);
  CHECK(kompress::inspect_header(default_exec{}, to_default_space(padded)).compressed_bytes == stream.size());
  CHECK_THROWS_AS(kompress::inspect_header(default_exec{}, prefix(40)), kompress::format_error);
  CHECK_THROWS_WITH_AS(kompress::inspect_header(default_exec{}, prefix(stream.size() - 1)),
                       doctest::Contains("truncated"), kompress::format_error);
}

TEST_CASE("format: the allocating decompress checks the element type and max_output_bytes before allocating") {
  const auto values = sample(5000);
  const auto stream = to_default_space(compressed(values, {.bound = kompress::absolute(1e-2), .block_size = 128}));
  const std::size_t bytes = values.size() * sizeof(float);
  const auto decoded = kompress::test::to_host(kompress::decompress<float>(default_exec{}, stream, {.max_output_bytes = bytes}));
  CHECK(decoded == kompress::test::to_host(kompress::decompress<float>(default_exec{}, stream)));
  CHECK_THROWS_WITH_AS(kompress::decompress<float>(default_exec{}, stream, {.max_output_bytes = bytes - 1}),
                       doctest::Contains("20000 bytes, more than options.max_output_bytes allows (19999)"),
                       kompress::resource_error);
  CHECK_THROWS_WITH_AS(kompress::decompress<double>(default_exec{}, stream), doctest::Contains("float values"),
                       kompress::invalid_argument);
}

// Golden streams: the checksum of the whole stream for fixed inputs. If one of these changes,
// the bytes the codec writes changed: bump the format version (docs/format.md) on purpose,
// never just update the number.
TEST_CASE("format: golden streams") {
  std::vector<float> f(3000);
  std::vector<double> d(3000);
  for (std::size_t i = 0; i < f.size(); ++i) {
    f[i] = float(std::sin(0.01 * double(i)) * 100.0 + double(i % 7));
    d[i] = std::cos(0.003 * double(i)) * 1e5 + double(i % 13) * 0.25;
  }
  f[100] = std::numeric_limits<float>::quiet_NaN();
  d[200] = -0.0;
  const auto fs = kompress::test::round_trip<float>(f, {.bound = kompress::relative(1e-3)}).stream;
  const auto ds = kompress::test::round_trip<double>(d, {.bound = kompress::absolute(1e-2), .block_size = 128}).stream;
  const auto fills = kompress::test::round_trip<float>(f, {.bound = kompress::absolute(0.5), .fill_value = 6.0}).stream;
  const auto checksum = [](const std::vector<std::byte>& s) { return kompress::detail::checksum_of(s.data(), s.size()); };
  MESSAGE("golden: float " << fs.size() << " bytes, checksum " << checksum(fs) << "; double " << ds.size()
                           << " bytes, checksum " << checksum(ds) << "; fill " << fills.size()
                           << " bytes, checksum " << checksum(fills));
  CHECK(fs.size() == 2393u);
  CHECK(checksum(fs) == 14783683460259762730ull);
  CHECK(ds.size() == 6645u);
  CHECK(checksum(ds) == 5278588016095605399ull);
  CHECK(fills.size() == 1920u);
  CHECK(checksum(fills) == 15808278008842667960ull);
}
