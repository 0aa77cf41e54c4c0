// libFuzzer target: kompress::inspect and kompress::decompress on arbitrary bytes.
//
// A kompress::error (format_error, invalid_argument) is the expected answer to a bad stream.
// Anything else is a bug: another exception, a crash, a sanitizer report, a hang (-timeout) or
// a runaway allocation (-rss_limit_mb).
//
// Every input is tried three times:
//   1. as it is: this fuzzes the header parser and the checksum and table checks, which
//      reject almost every random mutation before a block is decoded;
//   2. repaired: a copy with every chunk checksum and the header checksum recomputed (where
//      the header and the chunk-end table parse), so that structurally arbitrary chunk
//      payloads reach the block decoder;
//   3. inflated: the element count multiplied by up to 2^40 (the input's last byte says how
//      much), then repaired: headers that claim far more values than their bytes can hold,
//      with valid checksums (decompression bombs). Nothing caps the count the harness
//      decodes: decompress must reject such a stream before it allocates its output, or
//      -rss_limit_mb reports the allocation.
//
// Built by tests/fuzz/CMakeLists.txt with clang++ -fsanitize=fuzzer,address,undefined; run by
// the ctest test fuzz.decompress (tests/fuzz/fuzz_tests.cmake). Reproduce a crash with
//   fuzz_decompress <crash-file>

#include "fuzz_decode.hpp"

#include <kompress/kompress.hpp>
#include <kompress/detail/checksum.hpp>

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <optional>
#include <vector>

namespace {

using host = Kokkos::DefaultHostExecutionSpace;
using kompress_fuzz::bytes_view;

[[noreturn]] void bug(const char* what, const char* detail = "") {
  std::fprintf(stderr, "fuzz_decompress: BUG: %s%s%s\n", what, *detail ? ": " : "", detail);
  std::abort();
}

/// What inspect says must hold for any stream it accepts.
void check_info(const kompress::stream_info& info, std::size_t size) {
  if (info.compressed_bytes > size) bug("inspect accepted a stream longer than its bytes");
  if (info.block_size != 32 && info.block_size != 64 && info.block_size != 128)
    bug("inspect accepted an unsupported block size");
  if (info.blocks_per_chunk < 1) bug("inspect accepted 0 blocks per chunk");
  const std::uint64_t per_chunk =
      std::uint64_t(info.block_size) * std::uint64_t(info.blocks_per_chunk);
  if (info.chunk_count != (info.count + per_chunk - 1) / per_chunk)
    bug("inspect's chunk count disagrees with its element count");
  if (info.type != kompress::element_type::float32 && info.type != kompress::element_type::float64)
    bug("inspect accepted an unknown element type");
  // Every fast-codec block costs at least its descriptor byte, every ratio chunk (formats 1.1
  // and 1.2) of 4096 values five bytes and a shorter last one three: what bounds the output decompress
  // allocates.
  const std::uint64_t blocks = (info.count + std::uint64_t(info.block_size) - 1) / std::uint64_t(info.block_size);
  const std::uint64_t least_ratio_payload = info.chunk_count ? 5 * (info.chunk_count - 1) + 3 : 0;
  const std::uint64_t least_payload = info.codec == kompress::codec_mode::ratio ? least_ratio_payload : blocks;
  if (info.compressed_bytes < kompress::detail::header_bytes + 16 * info.chunk_count + least_payload)
    bug("inspect accepted a stream too short for its element count");
}

/// inspect, then decompress when the stream is accepted: into a vector of inspect's count, and
/// through the allocating form, which must check the header before it allocates.
void exercise(const std::byte* data, std::size_t size) {
  const bytes_view stream(data, size);
  kompress::stream_info info;
  try {
    info = kompress::inspect(stream);
  } catch (const kompress::error&) {
    return;
  }
  check_info(info, size);
  try {
    if (info.type == kompress::element_type::float32)
      kompress_fuzz::decode<float>(stream, info.count);
    else
      kompress_fuzz::decode<double>(stream, info.count);
  } catch (const kompress::format_error&) {
    // Expected: damage that the header and table checks cannot see, found by the decoder.
  } catch (const kompress::invalid_argument& e) {
    bug("decompress rejected a stream with invalid_argument instead of format_error", e.what());
  }
}

/// A copy of the input whose chunk checksums and header checksum are recomputed, or nothing
/// when the header does not parse (then there is nothing the checksums could hide). Chunks are
/// repaired up to the first entry of the chunk-end table that is out of order or out of the
/// stream; parse_header rejects such a table after its checksum, which is fuzzed this way too.
std::optional<std::vector<std::byte>> with_checksums_recomputed(const std::uint8_t* data,
                                                                std::size_t size) {
  namespace detail = kompress::detail;
  if (size < detail::header_bytes) return std::nullopt;
  std::vector<std::byte> stream(size);
  std::memcpy(stream.data(), data, size);
  std::byte* const bytes = stream.data();

  // A stream of 0 elements has no tables, and parse_header then checks the header checksum
  // even on a header-only prefix: write the header-only checksum first so such headers parse.
  // (For any other count it is overwritten below.)
  detail::store<std::uint64_t>(bytes + detail::header_checksum_offset,
                               detail::header_checksum(bytes, detail::header_bytes));
  detail::stream_header header;
  try {
    header = detail::parse_header(bytes, detail::header_bytes, size, "fuzz_decompress");
  } catch (const kompress::format_error&) {
    return std::nullopt;
  }
  // parse_header checked data_offset <= stream_bytes <= size.
  const detail::stream_layout layout = header.layout();
  const std::uint64_t data_offset = layout.data_offset();
  const std::uint64_t payload_bytes = header.stream_bytes - data_offset;
  std::uint64_t begin = 0;
  for (std::uint64_t chunk = 0; chunk < layout.chunk_count(); ++chunk) {
    const auto end =
        detail::load<std::uint64_t>(bytes + layout.chunk_end_table_offset() + 8 * chunk);
    if (end < begin || end > payload_bytes) break;
    detail::store<std::uint64_t>(bytes + layout.chunk_checksum_table_offset() + 8 * chunk,
                                 detail::checksum_of(bytes + data_offset + begin, end - begin));
    begin = end;
  }
  detail::store<std::uint64_t>(bytes + detail::header_checksum_offset,
                               detail::header_checksum(bytes, data_offset));
  return stream;
}

/// The input with its element count multiplied by 2^(1 + last byte % 40), checksums then
/// recomputed; nothing when the header does not parse.
std::optional<std::vector<std::byte>> with_count_inflated(const std::uint8_t* data,
                                                          std::size_t size) {
  namespace detail = kompress::detail;
  if (size < detail::header_bytes) return std::nullopt;
  std::vector<std::uint8_t> copy(data, data + size);
  const std::uint64_t count = detail::load<std::uint64_t>(reinterpret_cast<std::byte*>(copy.data()) + 8);
  const int shift = 1 + data[size - 1] % 40;
  const std::uint64_t limit = (std::uint64_t(1) << 58) / 8;
  const std::uint64_t inflated = (count | 1) < (limit >> shift) ? (count | 1) << shift : limit;
  detail::store<std::uint64_t>(reinterpret_cast<std::byte*>(copy.data()) + 8, inflated);
  return with_checksums_recomputed(copy.data(), copy.size());
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // One thread: every input runs the same way (no scheduling in the coverage), and the fuzz
  // build compiles Kokkos's OpenMP regions as serial code (tests/fuzz/cmake/FindOpenMP.cmake),
  // which is only correct with one thread. Finalized at exit.
  static Kokkos::ScopeGuard kokkos(
      Kokkos::InitializationSettings().set_num_threads(1).set_disable_warnings(true));
  if (host().concurrency() != 1) {
    std::fprintf(stderr, "fuzz_decompress: Kokkos runs %d host threads; this build needs 1\n",
                 host().concurrency());
    std::abort();
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    exercise(reinterpret_cast<const std::byte*>(data), size);
    if (auto repaired = with_checksums_recomputed(data, size);
        repaired && std::memcmp(repaired->data(), data, size) != 0)
      exercise(repaired->data(), repaired->size());
    if (auto inflated = with_count_inflated(data, size)) exercise(inflated->data(), inflated->size());
  } catch (const kompress::error& e) {
    bug("kompress::error escaped the harness", e.what());  // unreachable: caught above
  } catch (const std::exception& e) {
    bug("an exception other than kompress::error", e.what());
  } catch (...) {
    bug("an exception not derived from std::exception");
  }
  return 0;
}
