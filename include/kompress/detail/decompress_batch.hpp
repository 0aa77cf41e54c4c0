#pragma once
// decompress_batch: many streams, each of a known element count and length in the execution
// space's memory, decoded with a fixed number of launches and host waits whatever their
// number (kernels/decode_batch.hpp; device memory's headers are read stream by stream for
// now); every output is what decompress writes for its stream, and every check decompress
// makes is made. The collectives decode with it the streams that arrive together. docs/gpu.md,
// "Batched decoding".

#include <kompress/compress.hpp>
#include <kompress/kernels/decode_batch.hpp>

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

namespace kompress::inline v0::detail {

/// One stream of a batch: `length` bytes at `stream` holding `count` values for `out` (both in
/// the execution space's memory, not overlapping).
template <class T>
struct stream_to_decode {
  const std::byte* stream = nullptr;
  std::size_t length = 0;
  T* out = nullptr;
  std::size_t count = 0;
};

/// A stream must hold what its message was posted for: `count` values in exactly `length` bytes.
inline void require_expected_stream(const stream_header& header, std::size_t count, std::size_t length,
                                    const char* who) {
  if (header.count != count || header.stream_bytes != length)
    throw format_error(std::string(who) + ": a received stream holds " + std::to_string(header.count) + " values in " +
                       std::to_string(header.stream_bytes) + " bytes; expected " + std::to_string(count) +
                       " values in a message of " + std::to_string(length) + " bytes");
}

/// Every stream's header and chunk tables read and checked, and each held to its expected
/// element type, count and length: in host memory where the streams are; in device memory
/// stream by stream, as decompress reads them (a batched gather of the headers gave wrong bytes
/// on Kokkos::Cuda, docs/gpu.md, "Measured on an H200 (2026-12-04)").
template <class Memory, class T, class Exec>
std::vector<stream_header> read_batch_headers(const Exec& exec, std::span<const stream_to_decode<T>> streams,
                                              const char* who) {
  std::vector<stream_header> headers(streams.size());
  for (std::size_t i = 0; i < streams.size(); ++i) {
    const std::byte* const stream = streams[i].stream;
    if constexpr (Kokkos::SpaceAccessibility<Kokkos::HostSpace, Memory>::accessible)
      headers[i] = read_header_with(streams[i].length, who, [&](std::size_t bytes) {
        return Kokkos::View<const std::byte*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>(stream, bytes);
      });
    else
      headers[i] =
          read_header(exec, Kokkos::View<const std::byte*, Memory, Kokkos::MemoryUnmanaged>(stream, streams[i].length), who);
    require_element_type<T>(headers[i], who);
    require_expected_stream(headers[i], streams[i].count, streams[i].length, who);
  }
  return headers;
}

/// The batched kernels over streams of the fast codec and one block size, their headers read.
template <class Memory, int BlockSize, class T, class Exec>
void decode_fast_batch(const Exec& exec, std::span<const stream_to_decode<T>> streams,
                       const std::vector<stream_header>& headers, const char* who, const kernel_tuning& tuning) {
  using entry = batched_stream<T, BlockSize>;
  Kokkos::View<entry*, Kokkos::HostSpace> entries(Kokkos::view_alloc(Kokkos::WithoutInitializing,
                                                                     "kompress::batch_streams"),
                                                  streams.size());
  std::vector<std::size_t> index;  // the batch's stream k is streams[index[k]]
  stream_batch<T, BlockSize, Memory> batch;
  for (std::size_t i = 0; i < streams.size(); ++i) {
    const stream_layout layout = headers[i].layout();
    if (layout.chunk_count() == 0) continue;  // nothing to check or decode
    const std::byte* const in = streams[i].stream;
    entries(index.size()) = entry{
        chunk_decoder<T, BlockSize>{in + layout.data_offset(), in + layout.chunk_end_table_offset(), layout,
                                    decoding_codec<T>(headers[i]), streams[i].out, layout.values_per_chunk()},
        in + layout.chunk_checksum_table_offset(), batch.chunks};
    batch.chunks += layout.chunk_count();
    batch.blocks_per_chunk = std::max(batch.blocks_per_chunk, layout.blocks_per_chunk);
    index.push_back(i);
  }
  if (index.empty()) return;
  const auto used = Kokkos::subview(entries, std::pair<std::size_t, std::size_t>(0, index.size()));
  const Kokkos::View<entry*, Memory> device_entries(
      Kokkos::view_alloc(exec, Kokkos::WithoutInitializing, "kompress::batch_streams"), index.size());
  Kokkos::deep_copy(exec, device_entries, used);
  batch.streams = device_entries;
  batch.first_bad = make_flag_slot<Memory>(exec);

  // Where chunk c of the batch is: stream k = the last entry whose first chunk is <= c.
  const auto locate = [&](std::uint64_t chunk) {
    std::size_t k = index.size() - 1;
    while (entries(k).first_chunk > chunk) --k;
    const std::uint64_t chunks = headers[index[k]].layout().chunk_count();
    return "chunk " + std::to_string(chunk - entries(k).first_chunk) + " of " + std::to_string(chunks) +
           " of stream " + std::to_string(index[k]) + " of " + std::to_string(streams.size());
  };
  std::uint64_t first_bad = verify_batch(exec, batch);
  if (first_bad < batch.chunks)
    throw_format(who, "checksum mismatch in " + locate(first_bad) + " decoded together (the stream is corrupted)");
  first_bad = decode_batch(exec, batch, tuning);
  if (first_bad < batch.chunks) throw_format(who, "malformed block data in " + locate(first_bad) + " decoded together");
}

/// Decodes every stream into its output; the same values and the same checks as decompress on
/// each. Streams of the fast codec sharing one block size go through the batched kernels
/// (the checksum check and the decoder, one launch each, whatever the number of streams);
/// any other mix, and a single stream, are decoded one by one. Returns the largest absolute
/// bound of the streams. Throws format_error for a damaged stream or one that does not hold
/// its expected count in its length (naming the stream), before any output is written unless
/// the damage hides behind matching checksums. `tuning` is the backend's unless a test forces
/// the other decoder.
template <class Memory, class T, class Exec>
double decompress_batch(const Exec& exec, std::span<const stream_to_decode<T>> streams, const char* who,
                        const kernel_tuning& tuning = backend<Exec>::tuning()) {
  if (streams.empty()) return 0.0;
  const std::vector<stream_header> headers = read_batch_headers<Memory>(exec, streams, who);
  double bound = 0.0;
  for (const stream_header& header : headers) bound = std::max(bound, header.abs_bound);
  const int block_size = headers[0].block_size;
  const bool batched = streams.size() > 1 && std::all_of(headers.begin(), headers.end(), [&](const stream_header& h) {
                         return !h.ratio() && h.block_size == block_size;
                       });
  if (batched) {
    // One decompression, whatever the number of streams (Kokkos Tools time the codec by it).
    Kokkos::Profiling::ScopedRegion region("kompress::decompress");
    dispatch_block_size(block_size, [&](auto b) {
      decode_fast_batch<Memory, decltype(b)::value>(exec, streams, headers, who, tuning);
    });
    return bound;
  }
  for (std::size_t i = 0; i < streams.size(); ++i)
    decompress_parsed(exec,
                      Kokkos::View<const std::byte*, Memory, Kokkos::MemoryUnmanaged>(streams[i].stream,
                                                                                     streams[i].length),
                      headers[i], Kokkos::View<T*, Memory, Kokkos::MemoryUnmanaged>(streams[i].out, streams[i].count),
                      who);
  return bound;
}

}  // namespace kompress::inline v0::detail
