#pragma once
// decompress_batch: many streams, each of a known element count and length in the execution
// space's memory, decoded with a fixed number of launches and host waits whatever their
// number (kernels/decode_batch.hpp; the headers of streams in device memory are read stream by
// stream, or gathered: kernel_tuning::batch_headers); every output is what decompress writes for
// its stream, and every check decompress makes is made. The collectives decode with it the
// streams that arrive together. docs/gpu.md, "Batched decoding".

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

/// Bytes [from[i], to[i]) of each stream, gathered on `exec` by one kernel into one buffer and
/// copied to the host with one wait; returned end to end in stream order.
template <class Memory, class T, class Exec>
std::vector<std::byte> gather_stream_bytes(const Exec& exec, std::span<const stream_to_decode<T>> streams,
                                           const std::vector<std::size_t>& from, const std::vector<std::size_t>& to) {
  // The plan: each piece's address, then where each piece starts in the buffer (and its end).
  const std::size_t m = streams.size();
  Kokkos::View<std::uint64_t*, Kokkos::HostSpace> plan(
      Kokkos::view_alloc(Kokkos::WithoutInitializing, "kompress::batch_gather_plan"), 2 * m + 1);
  std::size_t total = 0;
  for (std::size_t i = 0; i < m; ++i) {
    plan(i) = reinterpret_cast<std::uintptr_t>(streams[i].stream + from[i]);
    plan(m + i) = total;
    total += to[i] - from[i];
  }
  plan(2 * m) = total;
  std::vector<std::byte> host(total);
  if (total == 0) return host;
  const Kokkos::View<std::uint64_t*, Memory> device_plan(
      Kokkos::view_alloc(exec, Kokkos::WithoutInitializing, "kompress::batch_gather_plan"), 2 * m + 1);
  Kokkos::deep_copy(exec, device_plan, plan);
  const Kokkos::View<std::byte*, Memory> gathered(
      Kokkos::view_alloc(exec, Kokkos::WithoutInitializing, "kompress::batch_gathered_bytes"), total);
  // A thread per byte finds its piece by bisection: balanced however unequal the pieces are.
  const std::uint64_t* const pieces = device_plan.data();
  std::byte* const out = gathered.data();
  Kokkos::parallel_for(
      "kompress::decompress::gather_headers", Kokkos::RangePolicy<Exec>(exec, 0, total), KOKKOS_LAMBDA(std::size_t b) {
        std::size_t lo = 0, hi = m;  // the piece is the last one starting at or before b
        while (hi - lo > 1) {
          const std::size_t mid = (lo + hi) / 2;
          if (pieces[m + mid] <= b) lo = mid;
          else hi = mid;
        }
        out[b] = reinterpret_cast<const std::byte*>(pieces[lo])[b - pieces[m + lo]];
      });
  copy_to_host<Memory>(exec, host.data(), out, total);
  return host;
}

/// Every stream's header and chunk tables through two gathers (gather_stream_bytes): the
/// headers, then the tables they describe, so that only those bytes cross to the host (a
/// prefetch of header_prefetch_bytes a stream, as read_header makes, would carry 4 KiB for the
/// some hundred bytes of a collective's piece).
template <class Memory, class T, class Exec>
std::vector<stream_header> gathered_headers(const Exec& exec, std::span<const stream_to_decode<T>> streams,
                                            const char* who) {
  const std::size_t m = streams.size();
  std::vector<std::size_t> from(m, 0), to(m);
  for (std::size_t i = 0; i < m; ++i) {
    if (streams[i].length < header_bytes) parse_header(nullptr, 0, streams[i].length, who);  // throws
    to[i] = header_bytes;
  }
  const std::vector<std::byte> prefixes = gather_stream_bytes<Memory>(exec, streams, from, to);
  std::vector<std::size_t> at(m), tables_end(m);
  for (std::size_t i = 0, offset = 0; i < m; ++i) {
    at[i] = offset;
    offset += to[i];
    tables_end[i] = parse_header(prefixes.data() + at[i], header_bytes, streams[i].length, who).layout().data_offset();
    from[i] = to[i];
    to[i] = std::max(to[i], tables_end[i]);
  }
  const std::vector<std::byte> rests = gather_stream_bytes<Memory>(exec, streams, from, to);
  std::vector<stream_header> headers(m);
  std::vector<std::byte> whole;
  for (std::size_t i = 0, rest = 0; i < m; ++i) {
    const std::size_t more = to[i] - from[i];
    if (more == 0) {
      headers[i] = parse_header(prefixes.data() + at[i], tables_end[i], streams[i].length, who);
      continue;
    }
    whole.assign(prefixes.begin() + std::ptrdiff_t(at[i]), prefixes.begin() + std::ptrdiff_t(at[i] + from[i]));
    whole.insert(whole.end(), rests.begin() + std::ptrdiff_t(rest), rests.begin() + std::ptrdiff_t(rest + more));
    rest += more;
    headers[i] = parse_header(whole.data(), whole.size(), streams[i].length, who);
  }
  return headers;
}

/// Every stream's header and chunk tables read and checked (`how`: kernel_tuning::batch_headers),
/// and each held to its expected element type, count and length.
template <class Memory, class T, class Exec>
std::vector<stream_header> read_batch_headers(const Exec& exec, std::span<const stream_to_decode<T>> streams,
                                              const char* who, header_reading how) {
  std::vector<stream_header> headers;
  if (how == header_reading::gathered) {
    headers = gathered_headers<Memory>(exec, streams, who);
  } else {
    headers.resize(streams.size());
    for (std::size_t i = 0; i < streams.size(); ++i) {
      const std::byte* const stream = streams[i].stream;
      const Kokkos::View<const std::byte*, Memory, Kokkos::MemoryUnmanaged> in(stream, streams[i].length);
      if constexpr (Kokkos::SpaceAccessibility<Kokkos::HostSpace, Memory>::accessible) {
        if (how == header_reading::direct) {
          headers[i] = read_header_with(streams[i].length, who, [&](std::size_t bytes) {
            return Kokkos::View<const std::byte*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>(stream, bytes);
          });
          continue;
        }
      }
      headers[i] = read_header(exec, in, who);
    }
  }
  for (std::size_t i = 0; i < streams.size(); ++i) {
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
/// another decoder or way of reading the headers.
template <class Memory, class T, class Exec>
double decompress_batch(const Exec& exec, std::span<const stream_to_decode<T>> streams, const char* who,
                        const kernel_tuning& tuning = backend<Exec>::tuning()) {
  if (streams.empty()) return 0.0;
  const std::vector<stream_header> headers = read_batch_headers<Memory>(exec, streams, who, tuning.batch_headers);
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
