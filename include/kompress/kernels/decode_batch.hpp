#pragma once
// Many fast-codec streams decoded in one pair of launches: the checksum check over every chunk
// of every stream, then the decoder over every chunk of every stream, a thread or a team per
// chunk as decompress_chunks does for one stream. On a GPU a decompression costs a fixed time
// per call (launches, and the waits that report the first bad chunk to the host), so a
// collective that holds many streams at once (the final blocks a butterfly step brings in)
// pays it once instead of once per stream. docs/gpu.md, "Batched decoding", gives the design.

#include <kompress/format.hpp>
#include <kompress/kernels/backend/backend.hpp>
#include <kompress/kernels/chunk_encoder.hpp>
#include <kompress/kernels/first_flagged.hpp>
#include <kompress/kernels/team_codec.hpp>

#include <Kokkos_Core.hpp>

#include <cstdint>

namespace kompress::inline v0::detail {

/// One stream of a batch, its header parsed: its chunks' decoder (tables, data, codec, output),
/// its checksum table, and the batch index of its first chunk.
template <class T, int BlockSize>
struct batched_stream {
  chunk_decoder<T, BlockSize> decoder;
  const std::byte* checksums;
  std::uint64_t first_chunk;
};

/// A batch's streams (in the execution space's memory, each with at least one chunk, in
/// order of first_chunk) and their chunk count; chunk c of the batch is chunk c - first_chunk
/// of the last stream whose first_chunk is <= c.
template <class T, int BlockSize, class Memory>
struct stream_batch {
  static constexpr int block_size = BlockSize;
  Kokkos::View<const batched_stream<T, BlockSize>*, Memory> streams;
  std::uint64_t chunks = 0;
  int blocks_per_chunk = default_blocks_per_chunk;  ///< the most of any stream
  flag_slot<Memory> first_bad;  ///< where the kernels' first bad chunk waits (make_flag_slot)

  KOKKOS_INLINE_FUNCTION std::uint64_t stream_of(std::uint64_t chunk) const {
    std::uint64_t low = 0, high = streams.extent(0);  // the answer is in [low, high)
    while (high - low > 1) {
      const std::uint64_t middle = low + (high - low) / 2;
      if (streams(middle).first_chunk <= chunk) low = middle;
      else high = middle;
    }
    return low;
  }
  /// Chunk `chunk` of the batch decoded by one thread; false where it is malformed.
  KOKKOS_INLINE_FUNCTION bool decode(std::uint64_t chunk) const {
    const batched_stream<T, BlockSize>& s = streams(stream_of(chunk));
    std::uint64_t bad = ~std::uint64_t(0);
    s.decoder.decode(chunk - s.first_chunk, bad);
    return bad == ~std::uint64_t(0);
  }
  /// Whether chunk `chunk` of the batch matches its checksum.
  KOKKOS_INLINE_FUNCTION bool verify(std::uint64_t chunk) const {
    const batched_stream<T, BlockSize>& s = streams(stream_of(chunk));
    return chunk_matches(s.decoder.data, s.decoder.ends, s.checksums, chunk - s.first_chunk);
  }
  /// The parallel_reduce functor of the thread-per-chunk decoder: the first bad chunk.
  KOKKOS_INLINE_FUNCTION void operator()(std::uint64_t chunk, std::uint64_t& bad) const {
    if (!decode(chunk)) bad = chunk < bad ? chunk : bad;
  }
};

/// The first chunk of the batch whose checksum does not match, or batch.chunks.
template <class Exec, class T, int BlockSize, class Memory>
std::uint64_t verify_batch(const Exec& exec, const stream_batch<T, BlockSize, Memory>& batch) {
  return first_flagged(
      "kompress::decompress::verify_batch", Kokkos::RangePolicy<Exec>(exec, 0, batch.chunks),
      KOKKOS_LAMBDA(std::uint64_t chunk, std::uint64_t& bad) {
        if (!batch.verify(chunk)) bad = chunk < bad ? chunk : bad;
      },
      batch.first_bad, batch.chunks);
}

/// Every chunk of the batch decoded, a team per chunk where `tuning` says so, else by the
/// backend's thread-per-chunk decoder. The first malformed chunk, or batch.chunks.
template <class Exec, class T, int BlockSize, class Memory>
std::uint64_t decode_batch(const Exec& exec, const stream_batch<T, BlockSize, Memory>& batch,
                           const kernel_tuning& tuning = backend<Exec>::tuning()) {
  if (tuning.team_size == 0) return backend<Exec>::decode_batch_chunks(exec, batch, tuning.decoder);
  using member = team_member_of<Exec>;
  const std::size_t scratch = team_decode_scratch_bytes(batch.blocks_per_chunk);
  const int level = team_scratch_level<Exec>(scratch);
  const auto kernel = KOKKOS_LAMBDA(const member& team, std::uint64_t& bad) {
    const std::uint64_t chunk = team.league_rank();
    const batched_stream<T, BlockSize>& s = batch.streams(batch.stream_of(chunk));
    auto* const words = static_cast<std::uint64_t*>(team.team_scratch(level).get_shmem_aligned(scratch, 16));
    if (!team_decode_chunk(team, s.decoder, chunk - s.first_chunk, words)) bad = chunk < bad ? chunk : bad;
  };
  const auto policy = team_policy(exec, batch.chunks, tuning.team_size, scratch, level, kernel,
                                  Kokkos::ParallelReduceTag{});
  return first_flagged("kompress::decompress::team_decode_batch", policy, kernel, batch.first_bad, batch.chunks);
}

}  // namespace kompress::inline v0::detail
