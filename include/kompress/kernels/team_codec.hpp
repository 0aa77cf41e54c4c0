#pragma once
// The codec with a team of threads per chunk: what a GPU needs, where one thread per chunk
// leaves most of it idle and the assembly's serial tail grows with the output. Plain Kokkos
// (TeamPolicy, team scratch, team scans), so the same source runs on OpenMP, where the tests
// compare its streams with the thread-per-chunk kernels'. docs/gpu.md, "The team kernels",
// gives the design; backend/tuning.hpp's team_size selects it.
//
// Compression, after the value range, is one launch (a decoupled look-back, as CUB's scans and
// cuSZp do): each team takes the next chunk by a ticket, settles its blocks' choices and so its
// length, publishes the length in the chunk end table, adds up its predecessors' lengths until
// it meets one that published its end, publishes its own end, and writes its chunk in place,
// block by block, each block by its own thread. The last team to finish writes the header.

#include <kompress/codec/block.hpp>
#include <kompress/format.hpp>
#include <kompress/kernels/backend/tuning.hpp>
#include <kompress/kernels/chunk_encoder.hpp>
#include <kompress/kernels/value_range.hpp>

#include <Kokkos_Core.hpp>

#include <cstdint>

namespace kompress::inline v0::detail {

/// The chunk end table's words while a team compression runs: not known yet, the chunk's own
/// length (with this flag), or its end, which is also the word's final value.
inline constexpr std::uint64_t chunk_status_unknown = ~std::uint64_t(0);
inline constexpr std::uint64_t chunk_status_length = std::uint64_t(1) << 63;

/// The team compression's two counters (the next ticket, the teams finished), in the header's
/// bytes after the value range until the header replaces them.
inline constexpr std::uint64_t team_counters_offset = 16;
static_assert(team_counters_offset + 16 <= header_bytes);

/// Whether the team compression can run on an output at `out`: its counters and the chunk end
/// table are 64-bit atomics, which need 8-byte alignment (the tables are at 8-byte offsets).
inline bool team_compression_fits(const std::byte* out) {
  return reinterpret_cast<std::uintptr_t>(out) % 8 == 0;
}

template <class Exec>
using team_member_of = typename Kokkos::TeamPolicy<Exec>::member_type;

/// The team scratch a kernel asks for to get `bytes` at a 16-byte boundary: a whole number of
/// 16 bytes. Kokkos::Cuda lays the level-1 scratch of the teams end to end, so a size that is
/// not a multiple of 16 leaves every other team's base unaligned, and get_shmem_aligned(bytes,
/// 16) then finds no room (a null pointer) in those teams.
inline std::size_t team_scratch_request(std::size_t bytes) { return (bytes + 15) / 16 * 16; }

/// The team scratch level that holds `bytes`: shared memory (0) where it fits, else 1.
template <class Exec>
int team_scratch_level(std::size_t bytes) {
  return team_scratch_request(bytes) <= std::size_t(Kokkos::TeamPolicy<Exec>::scratch_size_max(0)) ? 0 : 1;
}

/// A TeamPolicy of `teams` teams of `team_size` threads (at most what `functor` can run with;
/// -1: Kokkos's choice), each with `scratch` bytes of team scratch at `level`, 16-aligned.
template <class Exec, class Functor, class Tag>
Kokkos::TeamPolicy<Exec> team_policy(const Exec& exec, std::uint64_t teams, int team_size,
                                     std::size_t scratch, int level, const Functor& functor,
                                     Tag tag) {
  using policy = Kokkos::TeamPolicy<Exec>;
  const std::size_t request = team_scratch_request(scratch);
  policy p = team_size < 0 ? policy(exec, std::int64_t(teams), Kokkos::AUTO)
                           : policy(exec, std::int64_t(teams), 1);
  p.set_scratch_size(level, Kokkos::PerTeam(request));
  if (team_size > 1) {
    const int most = p.team_size_max(functor, tag);
    p = policy(exec, std::int64_t(teams), team_size < most ? team_size : most);
    p.set_scratch_size(level, Kokkos::PerTeam(request));
  }
  return p;
}

/// The fast codec's chunk for the team kernel: `measure` settles every block's choice (a
/// thread per block), then walks them in order for the bases and offsets, the chunk's one
/// serial dependency (block_choice); `write` encodes each block at its offset, a thread per
/// block, with the base the walk gave it. The bytes are encode_chunk's.
template <class T, int BlockSize>
struct team_fast_chunk {
  chunk_encoder<T, BlockSize> encoder;

  struct scratch_type {
    block_choice choice;
    std::int64_t previous_base;
    std::uint32_t offset;
  };
  std::size_t scratch_bytes() const {
    return sizeof(scratch_type) * std::size_t(encoder.layout.blocks_per_chunk);
  }
  static constexpr const char* label = "kompress::compress::team_chunks";

  /// What both steps derive for a chunk: the codec, and where its blocks and values are.
  struct chunk_blocks {
    value_codec<T> codec;
    const T* in;
    std::uint64_t first;  ///< the index of the chunk's first value in the stream
    std::uint64_t count;
    int blocks;
    KOKKOS_INLINE_FUNCTION const T* block(int b) const { return in + std::uint64_t(b) * BlockSize; }
    KOKKOS_INLINE_FUNCTION std::uint64_t first_of(int b) const { return first + std::uint64_t(b) * BlockSize; }
    KOKKOS_INLINE_FUNCTION int values_in(int b) const {
      const std::uint64_t first = std::uint64_t(b) * BlockSize;
      return int(count - first < BlockSize ? count - first : BlockSize);
    }
  };
  KOKKOS_INLINE_FUNCTION chunk_blocks blocks_of_chunk(std::uint64_t chunk) const {
    const std::uint64_t count = encoder.layout.values_in_chunk(chunk);
    return {plan_compression<T>(encoder.base, *encoder.range).codec,
            encoder.in + chunk * encoder.values_per_chunk, chunk * encoder.values_per_chunk, count,
            int((count + BlockSize - 1) / BlockSize)};
  }

  template <class Member>
  KOKKOS_INLINE_FUNCTION std::uint64_t measure(const Member& team, std::uint64_t chunk,
                                               void* scratch) const {
    auto* const blocks_of = static_cast<scratch_type*>(scratch);
    const chunk_blocks c = blocks_of_chunk(chunk);
    const int blocks = c.blocks;
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, blocks), [&](int b) {
      blocks_of[b].choice = choose_block<T, BlockSize>(c.block(b), c.values_in(b), c.first_of(b), c.codec);
    });
    team.team_barrier();
    std::uint64_t bytes = 0;
    Kokkos::single(
        Kokkos::PerTeam(team),
        [&](std::uint64_t& total) {
          std::int64_t base = 0;
          std::uint64_t offset = std::uint64_t(blocks);
          for (int b = 0; b < blocks; ++b) {
            const block_choice& choice = blocks_of[b].choice;
            const int length_code = choice.length_code<T, BlockSize>(base);
            blocks_of[b].previous_base = base;
            blocks_of[b].offset = std::uint32_t(offset);
            offset += std::uint64_t(choice.payload_bytes<T, BlockSize>(length_code));
            if (length_code >= 0) base = choice.base;
          }
          total = offset;
        },
        bytes);
    return bytes;
  }

  template <class Member>
  KOKKOS_INLINE_FUNCTION void write(const Member& team, std::uint64_t chunk, void* scratch,
                                    std::uint64_t, std::byte* to) const {
    const auto* const blocks_of = static_cast<const scratch_type*>(scratch);
    const chunk_blocks c = blocks_of_chunk(chunk);
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, c.blocks), [&](int b) {
      std::int64_t base = blocks_of[b].previous_base;
      std::uint8_t descriptor = 0;
      encode_block<T, BlockSize>(c.block(b), c.values_in(b), c.first_of(b), c.codec, base, descriptor,
                                 to + blocks_of[b].offset);
      to[b] = std::byte(descriptor);
    });
  }
};

/// The team kernel: `Chunk` (team_fast_chunk, ratio_encoder.hpp's team_ratio_chunk) measures a
/// chunk with the whole team, then writes it where the look-back puts it.
template <class T, class Exec, class Chunk>
struct team_compression {
  Chunk chunk_coder;
  std::byte* out;
  std::byte* data;
  std::byte* ends;
  std::byte* checksums;
  stream_header base;
  stream_layout layout;
  std::uint64_t* length;
  std::uint64_t chunks;
  std::size_t scratch_bytes;
  int scratch_level;

  KOKKOS_INLINE_FUNCTION void operator()(const team_member_of<Exec>& team) const {
    void* const scratch = team.team_scratch(scratch_level).get_shmem_aligned(scratch_bytes, 16);
    compress_chunk(team, take_ticket(team, reinterpret_cast<std::uint64_t*>(out + team_counters_offset)), scratch);
  }

  /// Tickets, not league ranks: a team only ever waits for chunks whose teams are running,
  /// whatever order the teams start in. The next of `counter`'s, on every thread of the team.
  KOKKOS_INLINE_FUNCTION static std::uint64_t take_ticket(const team_member_of<Exec>& team, std::uint64_t* counter) {
    std::uint64_t ticket = 0;
    Kokkos::single(
        Kokkos::PerTeam(team), [&](std::uint64_t& t) { t = Kokkos::atomic_fetch_add(counter, std::uint64_t(1)); },
        ticket);
    return ticket;
  }

  /// Chunk `chunk` measured, placed by the look-back, written and checksummed by the team; the
  /// stream's last chunk to finish writes the header.
  KOKKOS_INLINE_FUNCTION void compress_chunk(const team_member_of<Exec>& team, std::uint64_t chunk,
                                             void* scratch) const {
    auto* const counters = reinterpret_cast<std::uint64_t*>(out + team_counters_offset);
    auto* const status = reinterpret_cast<std::uint64_t*>(ends);
    const std::uint64_t bytes = chunk_coder.measure(team, chunk, scratch);

    std::uint64_t begin = 0;
    Kokkos::single(
        Kokkos::PerTeam(team),
        [&](std::uint64_t& before) {
          if (chunk == 0) {
            Kokkos::atomic_store(&status[0], bytes);
            before = 0;
            return;
          }
          Kokkos::atomic_store(&status[chunk], chunk_status_length | bytes);
          std::uint64_t sum = 0;
          for (std::uint64_t p = chunk - 1;;) {
            const std::uint64_t word = Kokkos::atomic_load(&status[p]);
            if (word == chunk_status_unknown) continue;
            if (word & chunk_status_length) {
              sum += word & ~chunk_status_length;
              --p;
              continue;
            }
            sum += word;
            break;
          }
          Kokkos::atomic_store(&status[chunk], sum + bytes);
          before = sum;
        },
        begin);

    chunk_coder.write(team, chunk, scratch, bytes, data + begin);
    team.team_barrier();

    Kokkos::single(Kokkos::PerTeam(team), [&]() {
      store<std::uint64_t>(checksums + 8 * chunk, checksum_of(data + begin, bytes));
      // Everything this team wrote before the count says so; the last team then reads it all.
      Kokkos::memory_fence();
      if (Kokkos::atomic_fetch_add(&counters[1], std::uint64_t(1)) == chunks - 1) {
        Kokkos::memory_fence();
        write_stream_header<T>(out, range_slot<T, Exec>(out), base, layout,
                               Kokkos::atomic_load(&status[chunks - 1]), length);
      }
    });
  }
};

/// Steps 1-4 of enqueue_compress_kernels with a team per chunk (tuning.team_size): the status
/// words and counters set (and `*known_range` stored), the value range reduced, then the team
/// kernel. Needs team_compression_fits(out) and at least one chunk.
template <class T, class Exec, class Chunk>
void enqueue_team_compression(const Exec& exec, const value_range_segments<T>& segments,
                              const Chunk& chunk_coder, std::byte* out, std::uint64_t* length,
                              const kernel_tuning& tuning, const packed_range<T>* known_range) {
  using memory_space = typename Exec::memory_space;
  const auto& encoder = chunk_coder.encoder;
  const std::uint64_t chunks = encoder.layout.chunk_count();
  auto* const status = reinterpret_cast<std::uint64_t*>(encoder.ends);
  auto* const counters = reinterpret_cast<std::uint64_t*>(out + team_counters_offset);
  auto* const range = range_slot<T, Exec>(out);
  const bool known = known_range != nullptr;
  const packed_range<T> given = known ? *known_range : packed_range<T>{};
  Kokkos::parallel_for(
      "kompress::compress::team_status", Kokkos::RangePolicy<Exec>(exec, 0, chunks),
      KOKKOS_LAMBDA(std::uint64_t chunk) {
        status[chunk] = chunk_status_unknown;
        if (chunk == 0) {
          counters[0] = 0;
          counters[1] = 0;
          if (known) *range = given;
        }
      });
  if (!known)
    enqueue_range_reduction(
        exec, segments,
        Kokkos::View<packed_range<T>, memory_space, Kokkos::MemoryUnmanaged>(range));

  const std::size_t scratch = chunk_coder.scratch_bytes();
  const team_compression<T, Exec, Chunk> kernel{
      chunk_coder,    out,    encoder.data, encoder.ends, encoder.checksums, encoder.base,
      encoder.layout, length, chunks,       scratch,      team_scratch_level<Exec>(scratch)};
  Kokkos::parallel_for(Chunk::label,
                       team_policy(exec, chunks, tuning.team_size, scratch, kernel.scratch_level,
                                   kernel, Kokkos::ParallelForTag{}),
                       kernel);
}

/// The team scratch team_decode_chunk takes, in bytes: per block its payload offset, then its
/// base; one more offset for the payload's end.
inline std::size_t team_decode_scratch_bytes(int blocks_per_chunk) {
  return sizeof(std::uint64_t) * (2 * std::size_t(blocks_per_chunk) + 1);
}

/// Chunk `chunk` of `decoder`'s stream decoded by the whole team: the blocks' payload lengths
/// (from their descriptors) and their base differences turned into offsets and bases by two
/// team scans, then every block decoded by its own thread. `scratch` holds
/// team_decode_scratch_bytes words. False (on every thread of the team) where the chunk is
/// malformed, exactly where decode_chunk says so.
template <class T, int BlockSize, class Member>
KOKKOS_INLINE_FUNCTION bool team_decode_chunk(const Member& team, const chunk_decoder<T, BlockSize>& decoder,
                                              std::uint64_t chunk, std::uint64_t* scratch) {
  std::uint64_t* const offsets = scratch;
  std::uint64_t* const bases = offsets + decoder.layout.blocks_per_chunk + 1;
  const std::uint64_t begin = chunk ? load<std::uint64_t>(decoder.ends + 8 * (chunk - 1)) : 0;
  const std::uint64_t bytes = load<std::uint64_t>(decoder.ends + 8 * chunk) - begin;
  const std::uint64_t count = decoder.layout.values_in_chunk(chunk);
  const int blocks = int((count + BlockSize - 1) / BlockSize);
  const std::byte* const in = decoder.data + begin;
  if (bytes < std::uint64_t(blocks)) return false;
  const auto values_in = [&](int b) {
    const std::uint64_t first = std::uint64_t(b) * BlockSize;
    return int(count - first < BlockSize ? count - first : BlockSize);
  };
  // A descriptor no encoder writes counts as longer than the chunk.
  Kokkos::parallel_scan(Kokkos::TeamThreadRange(team, blocks), [&](int b, std::uint64_t& offset, bool final) {
    const int size = block_payload_bytes<T, BlockSize>(std::uint8_t(in[b]), values_in(b), decoder.codec);
    if (final) offsets[b] = offset;
    offset += size < 0 ? bytes + 1 : std::uint64_t(size);
    if (final && b == blocks - 1) offsets[blocks] = offset;
  });
  team.team_barrier();
  if (std::uint64_t(blocks) + offsets[blocks] != bytes) return false;
  const std::byte* const payload = in + blocks;
  Kokkos::parallel_scan(Kokkos::TeamThreadRange(team, blocks), [&](int b, std::uint64_t& base, bool final) {
    if (final) bases[b] = base;
    base += std::uint64_t(block_base_difference<T>(payload + offsets[b], std::uint8_t(in[b])));
  });
  team.team_barrier();
  int failed = 0;
  Kokkos::parallel_reduce(
      Kokkos::TeamThreadRange(team, blocks),
      [&](int b, int& failures) {
        std::int64_t base = std::int64_t(bases[b]);
        if (decode_block<T, BlockSize>(payload + offsets[b], bytes - blocks - offsets[b], std::uint8_t(in[b]),
                                       values_in(b), decoder.codec, base,
                                       decoder.out + chunk * decoder.values_per_chunk + std::uint64_t(b) * BlockSize) <
            0)
          ++failures;
      },
      failed);
  // Every thread reads the scratch before another chunk of the same team overwrites it.
  team.team_barrier();
  return failed == 0;
}

/// decode_chunks with a team per chunk (team_decode_chunk). The first malformed chunk, or
/// `chunks`.
template <class T, int BlockSize, class Exec>
std::uint64_t team_decode_chunks(const Exec& exec, std::uint64_t chunks,
                                 const chunk_decoder<T, BlockSize>& decoder, int team_size) {
  using member = team_member_of<Exec>;
  const std::size_t scratch = team_decode_scratch_bytes(decoder.layout.blocks_per_chunk);
  const int level = team_scratch_level<Exec>(scratch);
  const auto kernel = KOKKOS_LAMBDA(const member& team, std::uint64_t& bad) {
    const std::uint64_t chunk = team.league_rank();
    auto* const words = static_cast<std::uint64_t*>(team.team_scratch(level).get_shmem_aligned(scratch, 16));
    if (!team_decode_chunk(team, decoder, chunk, words)) bad = chunk < bad ? chunk : bad;
  };
  const auto policy =
      team_policy(exec, chunks, team_size, scratch, level, kernel, Kokkos::ParallelReduceTag{});
  std::uint64_t first_bad = chunks;
  Kokkos::parallel_reduce("kompress::decompress::team_decode_chunks", policy, kernel,
                          Kokkos::Min<std::uint64_t>(first_bad));
  return first_bad;
}

}  // namespace kompress::inline v0::detail
