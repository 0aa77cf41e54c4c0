#pragma once
// compress_batch: many arrays, each compressed into its own stream with the same options, with
// a fixed number of launches and one host wait whatever their number where the backend runs
// the team kernels (kernels/encode_batch.hpp); every stream is compress's bytes for its array.
// The collectives compress with it the chunks they send together. docs/gpu.md, "Batched
// compression".

#include <kompress/compress.hpp>
#include <kompress/kernels/encode_batch.hpp>

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace kompress::inline v0::detail {

/// One array of a batched compression: `count` values at `in` into `out`, which holds
/// max_compressed_size<T>(count, options) bytes (both in the execution space's memory, not
/// overlapping); `known_range` (host memory, or null) is the range of exactly these values as
/// compress_known_range takes it.
template <class T>
struct stream_to_compress {
  const T* in = nullptr;
  std::size_t count = 0;
  std::byte* out = nullptr;
  const packed_range<T>* known_range = nullptr;
};

/// The batched team kernels over `streams[i]` for every i in `which` (each with values and an
/// 8-byte-aligned output), their lengths into lengths[i].
template <int BlockSize, class T, class Exec>
void enqueue_fast_batch(const Exec& exec, std::span<const stream_to_compress<T>> streams,
                        const std::vector<std::size_t>& which, const compress_options& options,
                        std::uint64_t* lengths, const kernel_tuning& tuning) {
  using memory = typename Exec::memory_space;
  using chunk = team_fast_chunk<T, BlockSize>;
  using batch_type = compression_batch<T, Exec, chunk>;
  using entry = typename batch_type::entry;
  Kokkos::View<entry*, Kokkos::HostSpace> entries(
      Kokkos::view_alloc(Kokkos::WithoutInitializing, "kompress::batch_streams"), which.size());
  batch_type batch;
  for (std::size_t k = 0; k < which.size(); ++k) {
    const stream_to_compress<T>& s = streams[which[k]];
    const stream_header base = header_fields_of<T>(options, s.count);
    const stream_layout layout = base.layout();
    const std::uint64_t values_per_chunk = layout.values_per_chunk();
    std::byte* const out = s.out;
    std::byte* const ends = out + layout.chunk_end_table_offset();
    std::byte* const checksums = out + layout.chunk_checksum_table_offset();
    std::byte* const data = out + layout.data_offset();
    const chunk coder{chunk_encoder<T, BlockSize>{s.in, range_slot<T, Exec>(out), data, ends, checksums, base,
                                                  layout, values_per_chunk,
                                                  layout.max_chunk_bytes(values_per_chunk)}};
    const value_range_segments<T> segments = make_value_range_segments(
        s.in, s.count, (base.flags & flag_fill_value) != 0, static_cast<bits_t<T>>(base.fill_bits),
        tuning.range_segment);
    entries(k) = entry{team_compression<T, Exec, chunk>{coder, out, data, ends, checksums, base, layout,
                                                        lengths + which[k], layout.chunk_count(), 0, 0},
                       segments, s.known_range ? *s.known_range : packed_range<T>{}, s.known_range != nullptr,
                       batch.chunks, batch.segments};
    batch.chunks += layout.chunk_count();
    if (!s.known_range) batch.segments += segments.segments();  // a given range takes no segment
    batch.scratch_bytes = std::max(batch.scratch_bytes, coder.scratch_bytes());
  }
  batch.scratch_level = team_scratch_level<Exec>(batch.scratch_bytes);
  const Kokkos::View<entry*, memory> device_entries(
      Kokkos::view_alloc(exec, Kokkos::WithoutInitializing, "kompress::batch_streams"), which.size());
  Kokkos::deep_copy(exec, device_entries, entries);
  batch.streams = device_entries;
  batch.ticket = Kokkos::View<std::uint64_t, memory>(
      Kokkos::view_alloc(exec, Kokkos::WithoutInitializing, "kompress::batch_ticket"));
  enqueue_compression_batch(exec, batch, tuning.team_size);
  // The host table must outlive the copy: the caller fences before returning.
  exec.fence("kompress: batched compression");
}

/// Compresses every array into its stream with `options`, waits for `exec` once, and returns
/// the streams' lengths: the bytes compress (compress_known_range where a range is given)
/// writes for each. Where the team kernels run (`tuning.team_size`; `tuning.batch_compression`
/// turns this off), the fast codec's arrays go through the batched kernels: three launches
/// whatever their number; an empty array or an unaligned output takes the single-stream
/// kernels, as does every array elsewhere (the ratio codec, and the host backend's codec, whose
/// call costs microseconds), each enqueued without a wait.
/// One compression to Kokkos Tools (region "kompress::compress").
template <class T, class Exec>
std::vector<std::size_t> compress_batch(const Exec& exec, std::span<const stream_to_compress<T>> streams,
                                        const compress_options& options, const char* who,
                                        const kernel_tuning& tuning = backend<Exec>::tuning()) {
  using memory = typename Exec::memory_space;
  std::vector<std::size_t> lengths(streams.size());
  if (streams.empty()) return lengths;
  validate_options(options, who);
  Kokkos::Profiling::ScopedRegion region("kompress::compress");
  const Kokkos::View<std::uint64_t*, memory> device_lengths(
      Kokkos::view_alloc(exec, Kokkos::WithoutInitializing, "kompress::batch_lengths"), streams.size());
  const bool batches = tuning.team_size != 0 && tuning.batch_compression && options.codec == codec_mode::fast &&
                       streams.size() > 1;
  std::vector<std::size_t> together;
  for (std::size_t i = 0; i < streams.size(); ++i) {
    const stream_to_compress<T>& s = streams[i];
    if (batches && s.count > 0 && team_compression_fits(s.out)) {
      together.push_back(i);
      continue;
    }
    enqueue_compression(exec, Kokkos::View<const T*, memory, Kokkos::MemoryUnmanaged>(s.in, s.count),
                        Kokkos::View<std::byte*, memory, Kokkos::MemoryUnmanaged>(
                            s.out, max_compressed_size<T>(s.count, options)),
                        options, device_lengths.data() + i, who, s.known_range);
  }
  if (!together.empty())
    dispatch_block_size(options.block_size, [&](auto block_size) {
      enqueue_fast_batch<decltype(block_size)::value>(exec, streams, together, options, device_lengths.data(),
                                                      tuning);
    });
  const auto host_lengths = Kokkos::create_mirror_view(Kokkos::HostSpace{}, device_lengths);
  Kokkos::deep_copy(exec, host_lengths, device_lengths);
  exec.fence("kompress: batched compression's lengths");
  for (std::size_t i = 0; i < streams.size(); ++i) lengths[i] = host_lengths(i);
  return lengths;
}

}  // namespace kompress::inline v0::detail
