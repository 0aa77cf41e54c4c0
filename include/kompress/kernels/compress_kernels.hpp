#pragma once
// The array kernels: the block codec mapped over chunks with Kokkos. Compression is enqueued
// on the caller's execution space instance without a wait (enqueue_compress_kernels says how);
// decompression verifies checksums first and so waits. What differs between backends (which
// encoder, the tuning) lives in kernels/backend/; the algorithm is here.

#include <kompress/codec/chunk.hpp>
#include <kompress/format.hpp>
#include <kompress/kernels/backend/backend.hpp>
#include <kompress/kernels/chunk_encoder.hpp>
#include <kompress/kernels/ratio_encoder.hpp>
#include <kompress/kernels/team_codec.hpp>
#include <kompress/kernels/value_range.hpp>

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <cstring>
#include <type_traits>

namespace kompress::inline v0::detail {

/// Moves `bytes` bytes from `from` down to `to` (to <= from; the ranges may overlap).
KOKKOS_INLINE_FUNCTION void move_down(std::byte* to, const std::byte* from, std::uint64_t bytes) {
  if (to == from) return;
  KOKKOS_IF_ON_HOST((std::memmove(to, from, bytes);))
  KOKKOS_IF_ON_DEVICE((for (std::uint64_t i = 0; i < bytes; ++i) to[i] = from[i];))
}

/// Where the chunks are before and after assembly. Chunk c was encoded at c * full_chunk_bytes
/// (its source) and goes to [end of chunk c - 1, end of chunk c) (its destination); ends are
/// the inclusive scan of the lengths, relative to `data`.
struct chunk_moves {
  std::byte* data;
  const std::byte* ends;
  std::uint64_t full_chunk_bytes;

  KOKKOS_INLINE_FUNCTION std::uint64_t end(std::uint64_t chunk) const {
    return load<std::uint64_t>(ends + 8 * chunk);
  }
  KOKKOS_INLINE_FUNCTION std::uint64_t begin(std::uint64_t chunk) const {
    return chunk ? end(chunk - 1) : 0;
  }
  /// Calls f(other) for every earlier chunk whose source chunk c's destination overlaps:
  /// those must move before c. Destinations are at most a slot long, so at most two slots can
  /// be hit; later chunks' sources start at (c + 1) * full_chunk_bytes, past any destination of
  /// c, and chunk 0 never moves.
  template <class F>
  KOKKOS_INLINE_FUNCTION void for_each_blocker(std::uint64_t chunk, F&& f) const {
    const std::uint64_t to = begin(chunk), to_end = end(chunk);
    if (to_end == to) return;
    const std::uint64_t first = to / full_chunk_bytes, last = (to_end - 1) / full_chunk_bytes;
    for (std::uint64_t other = first > 0 ? first : 1; other <= last && other < chunk; ++other) {
      const std::uint64_t source = other * full_chunk_bytes;
      if (source < to_end && source + (end(other) - begin(other)) > to) f(other);
    }
  }
  /// The wave in which chunk c can move, capped at Limit: 0 if nothing blocks it, else one more
  /// than the latest wave of its blockers. Each wave moves in parallel after the ones before;
  /// chunks of wave >= Limit move afterwards on one thread, in order.
  template <int Limit>
  KOKKOS_INLINE_FUNCTION int wave(std::uint64_t chunk) const {
    if constexpr (Limit == 0) {
      return 0;
    } else {
      int latest = -1;
      for_each_blocker(chunk, [&](std::uint64_t other) {
        const int w = wave<Limit - 1>(other);
        latest = w > latest ? w : latest;
      });
      return latest + 1;
    }
  }
  KOKKOS_INLINE_FUNCTION void move(std::uint64_t chunk) const {
    move_down(data + begin(chunk), data + chunk * full_chunk_bytes, end(chunk) - begin(chunk));
  }
};

/// Enqueues the compression of `count = base.count` values at `in` into `out` on `exec` and
/// returns without waiting. `base` carries the data-independent header fields. When `exec`
/// completes, `out` holds the stream, and `*length` (if not null; memory `exec` writes) its
/// length, which the header also records. `tuning` is the backend's (backend<Exec>::tuning())
/// unless a test or benchmark forces another; the bytes never depend on it, except
/// blocks_per_chunk, which must be the format's. Launches:
///   1. the value range, reduced into the first 16 bytes of `out` (or `*known_range` stored
///      there: the range of exactly these values, which a caller has already read);
///   2. every chunk encoded by one thread at its worst-case position in the output, writing
///      its length and checksum to the chunk tables (each thread derives the codec from the
///      range), by the backend's encoder;
///   3. an inclusive scan turning the lengths into chunk ends;
///   4. the chunks moved down into place, in `tuning.assemble_waves` parallel waves (none on
///      an execution space of one thread) and then one thread: wave 0 moves every chunk whose destination overlaps no earlier chunk's
///      source, each by its own thread; wave k those whose blockers all moved in waves < k;
///      one thread then moves the rest in chunk order (a chunk only ever moves towards the
///      front, over space already vacated) and writes the header and its checksum. A chunk
///      overwrites only bytes of chunks already moved, so every wave count (0: all on one
///      thread) gives the same bytes.
/// The stream does not depend on the thread count: every chunk's bytes depend on its values
/// alone (and, for ratio chunks, on `shape`, the View's extents the predictors use).
template <class T, int BlockSize, class Exec>
void enqueue_compress_kernels(const Exec& exec, const T* in, std::byte* out,
                              const stream_header& base, std::uint64_t* length,
                              const kernel_tuning& tuning = backend<Exec>::tuning(),
                              const ratio_shape& shape = {},
                              const packed_range<T>* known_range = nullptr) {
  using memory_space = typename Exec::memory_space;
  const stream_layout layout = base.layout();
  const std::uint64_t count = base.count;
  const std::uint64_t chunks = layout.chunk_count();
  const std::uint64_t values_per_chunk = layout.values_per_chunk();
  const std::uint64_t full_chunk_bytes = layout.max_chunk_bytes(values_per_chunk);
  std::byte* const ends = out + layout.chunk_end_table_offset();
  std::byte* const checksums = out + layout.chunk_checksum_table_offset();
  std::byte* const data = out + layout.data_offset();
  packed_range<T>* const range = range_slot<T, Exec>(out);
  static_assert(sizeof(packed_range<T>) <= header_bytes);

  const value_range_segments<T> segments =
      make_value_range_segments(in, count, (base.flags & flag_fill_value) != 0,
                                static_cast<bits_t<T>>(base.fill_bits), tuning.range_segment);
  const Kokkos::View<packed_range<T>, memory_space, Kokkos::MemoryUnmanaged> range_view(range);
  // A team per chunk (kernels/team_codec.hpp): steps 2-4 in one launch.
  if (tuning.team_size != 0 && chunks > 0 && team_compression_fits(out)) {
    if (base.ratio())
      enqueue_team_compression(
          exec, segments,
          team_ratio_chunk<T>{ratio_chunk_encoder<T>{in, range, data, ends, checksums, base, layout,
                                                     values_per_chunk, full_chunk_bytes, shape}},
          out, length, tuning, known_range);
    else
      enqueue_team_compression(
          exec, segments,
          team_fast_chunk<T, BlockSize>{chunk_encoder<T, BlockSize>{
              in, range, data, ends, checksums, base, layout, values_per_chunk, full_chunk_bytes}},
          out, length, tuning, known_range);
    return;
  }
  // A backend that can encode and assemble in one launch (the host backend) does steps 2-4
  // itself.
  if (!base.ratio() && chunks > 0 &&
      backend<Exec>::enqueue_fused_compression(
          exec, segments, range_view,
          chunk_encoder<T, BlockSize>{in, range, data, ends, checksums, base, layout,
                                      values_per_chunk, full_chunk_bytes},
          out, length, tuning, known_range))
    return;
  if (known_range) {
    const packed_range<T> known = *known_range;
    Kokkos::parallel_for(
        "kompress::compress::known_range", Kokkos::RangePolicy<Exec>(exec, 0, 1),
        KOKKOS_LAMBDA(int) { *range = known; });
  } else {
    backend<Exec>::enqueue_value_range(exec, segments, range_view, tuning.encoder);
  }

  if (base.ratio()) {
    const ratio_chunk_encoder<T> encoder{in,     range,           data,           ends, checksums,
                                         base,   layout,          values_per_chunk,
                                         full_chunk_bytes, shape};
    backend<Exec>::encode_ratio_chunks(exec, chunks, encoder, tuning.encoder);
  } else {
    const chunk_encoder<T, BlockSize> encoder{in,   range, data, ends, checksums, base, layout,
                                              values_per_chunk, full_chunk_bytes};
    backend<Exec>::encode_chunks(exec, chunks, encoder, tuning.encoder);
  }
  Kokkos::parallel_scan(
      "kompress::compress::chunk_offsets", Kokkos::RangePolicy<Exec>(exec, 0, chunks),
      KOKKOS_LAMBDA(std::uint64_t chunk, std::uint64_t& end, bool final) {
        end += load<std::uint64_t>(ends + 8 * chunk);
        if (final) store<std::uint64_t>(ends + 8 * chunk, end);
      });
  const chunk_moves moves{data, ends, full_chunk_bytes};
  // On one thread the waves would only add launches (small arrays feel them): the last
  // kernel moves every chunk, and the bytes are the same for any wave count.
  const int waves = exec.concurrency() == 1                     ? 0
                    : tuning.assemble_waves < max_assemble_waves ? tuning.assemble_waves
                                                                 : max_assemble_waves;
  for (int w = 0; w < waves && chunks > 1; ++w)
    Kokkos::parallel_for(
        "kompress::compress::assemble_wave", Kokkos::RangePolicy<Exec>(exec, 1, chunks),
        KOKKOS_LAMBDA(std::uint64_t chunk) {
          if (moves.wave<max_assemble_waves>(chunk) == w) moves.move(chunk);
        });
  Kokkos::parallel_for(
      "kompress::compress::assemble", Kokkos::RangePolicy<Exec>(exec, 0, 1),
      KOKKOS_LAMBDA(int) {
        for (std::uint64_t chunk = 1; chunk < chunks; ++chunk)
          if (moves.wave<max_assemble_waves>(chunk) >= waves) moves.move(chunk);
        write_stream_header<T>(out, range, base, layout, chunks ? moves.end(chunks - 1) : 0, length);
      });
}

/// Verifies every chunk's checksum, then decodes (with the backend's decoder, or the one
/// `tuning` names). Throws format_error before writing any output if a checksum does not
/// match.
template <class T, int BlockSize, class Exec>
void decompress_chunks(const Exec& exec, const std::byte* in, const stream_header& header,
                       const value_codec<T>& codec, T* out, const char* who,
                       const kernel_tuning& tuning = backend<Exec>::tuning()) {
  const stream_layout layout = header.layout();
  const std::uint64_t chunks = layout.chunk_count();
  const std::uint64_t values_per_chunk = layout.values_per_chunk();
  const std::byte* const ends = in + layout.chunk_end_table_offset();
  const std::byte* const checksums = in + layout.chunk_checksum_table_offset();
  const std::byte* const data = in + layout.data_offset();
  std::uint64_t first_bad = backend<Exec>::verify_chunks(exec, chunks, data, ends, checksums);
  if (first_bad < chunks)
    throw_format(who, "checksum mismatch in chunk " + std::to_string(first_bad) + " of " +
                          std::to_string(chunks) + " (the stream is corrupted)");

  const chunk_decoder<T, BlockSize> decoder{data, ends, layout, codec, out, values_per_chunk};
  first_bad = tuning.team_size != 0
                  ? team_decode_chunks(exec, chunks, decoder, tuning.team_size)
                  : backend<Exec>::decode_chunks(exec, chunks, decoder, tuning.decoder);
  if (first_bad < chunks)
    throw_format(who, "malformed block data in chunk " + std::to_string(first_bad));
}

/// Verifies every chunk's checksum, then decodes the ratio chunks (with the backend's decoder,
/// or, with `tuning.team_size` set, a team per chunk: one thread decodes, its ratio_scratch in
/// team scratch). Throws format_error before writing any output if a checksum does not match.
template <class T, class Exec>
void decompress_ratio_chunks(const Exec& exec, const std::byte* in, const stream_header& header,
                             const value_codec<T>& codec, T* out, const char* who,
                             const kernel_tuning& tuning = backend<Exec>::tuning()) {
  const stream_layout layout = header.layout();
  const std::uint64_t chunks = layout.chunk_count();
  const std::byte* const ends = in + layout.chunk_end_table_offset();
  const std::byte* const checksums = in + layout.chunk_checksum_table_offset();
  const std::byte* const data = in + layout.data_offset();
  std::uint64_t first_bad = backend<Exec>::verify_chunks(exec, chunks, data, ends, checksums);
  if (first_bad < chunks)
    throw_format(who, "checksum mismatch in chunk " + std::to_string(first_bad) + " of " +
                          std::to_string(chunks) + " (the stream is corrupted)");

  const ratio_chunk_decoder<T> decoder{data,   ends, layout, codec, out, layout.values_per_chunk(),
                                       (header.flags & flag_rice_residuals) != 0};
  if (tuning.team_size != 0) {
    using member = team_member_of<Exec>;
    const int level = team_scratch_level<Exec>(sizeof(ratio_scratch));
    const auto kernel = KOKKOS_LAMBDA(const member& team, std::uint64_t& bad) {
      auto* const scratch = static_cast<ratio_scratch*>(
          team.team_scratch(level).get_shmem_aligned(sizeof(ratio_scratch), 16));
      const std::uint64_t chunk = team.league_rank();
      Kokkos::single(Kokkos::PerTeam(team), [&]() {
        if (!decoder.decode(chunk, *scratch)) bad = chunk < bad ? chunk : bad;
      });
    };
    Kokkos::parallel_reduce(
        "kompress::decompress::team_decode_ratio_chunks",
        team_policy(exec, chunks, tuning.team_size, sizeof(ratio_scratch), level, kernel,
                    Kokkos::ParallelReduceTag{}),
        kernel, Kokkos::Min<std::uint64_t>(first_bad));
  } else {
    first_bad = backend<Exec>::decode_ratio_chunks(exec, chunks, decoder, tuning.decoder);
  }
  if (first_bad < chunks)
    throw_format(who, "malformed ratio chunk " + std::to_string(first_bad));
}

}  // namespace kompress::inline v0::detail
