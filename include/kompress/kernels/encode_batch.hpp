#pragma once
// Many fast-codec streams compressed by the team kernels in three launches whatever their
// number: the chunk status words, counters and value ranges set; the value ranges reduced (a
// thread per segment of any stream, folded into its stream's range by atomic min and max of
// the order keys); and one team kernel over every chunk of every stream, each team taking the
// next chunk of the whole batch by one ticket and running team_compression's chunk code in its
// stream (the look-back only ever waits on earlier chunks of the same stream, which earlier
// tickets hold). Each stream's bytes are the single-stream compression's. docs/gpu.md,
// "Batched compression", gives the design.

#include <kompress/format.hpp>
#include <kompress/kernels/team_codec.hpp>
#include <kompress/kernels/value_range.hpp>

#include <Kokkos_Core.hpp>

#include <cstdint>

namespace kompress::inline v0::detail {

/// One stream of a batched compression: its team kernel (output, tables, header fields, where
/// its length goes), its value range's segments (none where the range is given), the range
/// given, and the batch indices of its first chunk and segment.
template <class T, class Exec, class Chunk>
struct batched_compression_stream {
  team_compression<T, Exec, Chunk> kernel;
  value_range_segments<T> segments;
  packed_range<T> known;
  bool has_known = false;
  std::uint64_t first_chunk = 0, first_segment = 0;
};

/// The streams (each with at least one chunk and an 8-byte-aligned output) in the execution
/// space's memory, their chunk and segment counts, and the batch's ticket counter.
template <class T, class Exec, class Chunk>
struct compression_batch {
  using entry = batched_compression_stream<T, Exec, Chunk>;
  Kokkos::View<const entry*, typename Exec::memory_space> streams;
  Kokkos::View<std::uint64_t, typename Exec::memory_space> ticket;
  std::uint64_t chunks = 0, segments = 0;
  std::size_t scratch_bytes = 0;  ///< the most any stream's chunk coder asks for
  int scratch_level = 0;

  /// The last stream whose first item (`first` of it) is <= `item`.
  template <class First>
  KOKKOS_INLINE_FUNCTION const entry& stream_of(std::uint64_t item, First first) const {
    std::uint64_t low = 0, high = streams.extent(0);
    while (high - low > 1) {
      const std::uint64_t middle = low + (high - low) / 2;
      if (first(streams(middle)) <= item) low = middle;
      else high = middle;
    }
    return streams(low);
  }
  KOKKOS_INLINE_FUNCTION const entry& stream_of_chunk(std::uint64_t chunk) const {
    return stream_of(chunk, [](const entry& e) { return e.first_chunk; });
  }
  KOKKOS_INLINE_FUNCTION const entry& stream_of_segment(std::uint64_t segment) const {
    return stream_of(segment, [](const entry& e) { return e.first_segment; });
  }

  /// The team kernel: the next chunk of the batch, compressed in its stream.
  KOKKOS_INLINE_FUNCTION void operator()(const team_member_of<Exec>& team) const {
    void* const scratch = team.team_scratch(scratch_level).get_shmem_aligned(scratch_bytes, 16);
    const std::uint64_t chunk = team_compression<T, Exec, Chunk>::take_ticket(team, ticket.data());
    const entry& e = stream_of_chunk(chunk);
    e.kernel.compress_chunk(team, chunk - e.first_chunk, scratch);
  }
};

/// Enqueues the batch's three launches on `exec` without a wait; each stream's length goes
/// where its kernel's `length` points (memory `exec` writes) and into its header.
template <class T, class Exec, class Chunk>
void enqueue_compression_batch(const Exec& exec, const compression_batch<T, Exec, Chunk>& batch, int team_size) {
  using key = order_key_t<T>;
  Kokkos::parallel_for(
      "kompress::compress::batch_status", Kokkos::RangePolicy<Exec>(exec, 0, batch.chunks),
      KOKKOS_LAMBDA(std::uint64_t chunk) {
        const auto& e = batch.stream_of_chunk(chunk);
        const std::uint64_t local = chunk - e.first_chunk;
        reinterpret_cast<std::uint64_t*>(e.kernel.ends)[local] = chunk_status_unknown;
        if (local == 0) {
          auto* const counters = reinterpret_cast<std::uint64_t*>(e.kernel.out + team_counters_offset);
          counters[0] = 0;
          counters[1] = 0;
          packed_range<T>* const range = range_slot<T, Exec>(e.kernel.out);
          if (e.has_known) *range = e.known;
          else range->set(order_key_max<T>(), order_key_min<T>());
        }
        if (chunk == 0) batch.ticket() = 0;
      });
  if (batch.segments > 0)
    Kokkos::parallel_for(
        "kompress::value_range_batch", Kokkos::RangePolicy<Exec>(exec, 0, batch.segments),
        KOKKOS_LAMBDA(std::uint64_t segment) {
          const auto& e = batch.stream_of_segment(segment);
          const value_range_segments<T>& s = e.segments;
          const std::uint64_t local = segment - e.first_segment;
          const std::uint64_t end = (local + 1) * s.segment < s.count ? (local + 1) * s.segment : s.count;
          key low = order_key_max<T>(), high = order_key_min<T>();
          segment_range<T>(s.data, local * s.segment, end, s.fill_bits, s.fill_enabled, low, high);
          if (low > high) return;  // nothing counted
          // The output is 8-byte aligned (team_compression_fits): the keys are aligned words.
          key* const keys = reinterpret_cast<key*>(range_slot<T, Exec>(e.kernel.out));
          Kokkos::atomic_min(&keys[0], low);
          Kokkos::atomic_max(&keys[1], high);
        });
  Kokkos::parallel_for(Chunk::label,
                       team_policy(exec, batch.chunks, team_size, batch.scratch_bytes, batch.scratch_level, batch,
                                   Kokkos::ParallelForTag{}),
                       batch);
}

}  // namespace kompress::inline v0::detail
