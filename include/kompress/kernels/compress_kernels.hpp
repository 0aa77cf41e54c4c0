#pragma once
// The array kernels: the block codec mapped over chunks with Kokkos. Compression is enqueued
// on the caller's execution space instance without a wait (enqueue_compress_kernels says how);
// decompression verifies checksums first and so waits.

#include <kompress/codec/chunk.hpp>
#include <kompress/format.hpp>
#include <kompress/kernels/value_range.hpp>

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <cstring>
#include <type_traits>

namespace kompress::detail {

/// What compression decides from the value range: the header's data-dependent fields and the
/// codec. A pure function of (base header, range), evaluated on the device by every kernel
/// that needs it, so nothing goes back to the host between launches.
template <class T>
struct compression_plan {
  stream_header header;
  value_codec<T> codec;
};

template <class T>
KOKKOS_INLINE_FUNCTION compression_plan<T> plan_compression(const stream_header& base,
                                                            const packed_range<T>& range) {
  compression_plan<T> plan{base, {}};
  const bool empty = !(range.low() <= range.high());
  const double nan = from_bits<double>(0x7FF8000000000000ull);
  const double min = empty ? nan : static_cast<double>(from_order_key<T>(range.low()));
  const double max = empty ? nan : static_cast<double>(from_order_key<T>(range.high()));
  const double abs_bound = base.mode == bound_mode::absolute
                               ? base.user_bound
                               : (empty ? 0.0 : relative_abs_bound(base.user_bound, min, max));
  const double max_abs = empty ? 0.0 : Kokkos::fmax(Kokkos::fabs(min), Kokkos::fabs(max));
  plan.codec = make_value_codec<T>(abs_bound, max_abs);
  plan.codec.has_fill = (base.flags & flag_fill_value) != 0;
  plan.codec.fill_bits = static_cast<bits_t<T>>(base.fill_bits);
  plan.header.value_min = min;
  plan.header.value_max = max;
  plan.header.abs_bound = plan.codec.step > 0.0 ? abs_bound : 0.0;
  plan.header.quant_step = plan.codec.step;
  return plan;
}

/// Encodes chunk `chunk` at its worst-case slot and records its length and checksum; each
/// call derives the codec from the value range at the front of the output.
template <class T, int BlockSize>
struct chunk_encoder {
  const T* in;
  const packed_range<T>* range;
  std::byte* data;
  std::byte* ends;
  std::byte* checksums;
  stream_header base;
  stream_layout layout;
  std::uint64_t values_per_chunk;
  std::uint64_t full_chunk_bytes;

  KOKKOS_INLINE_FUNCTION void operator()(std::uint64_t chunk) const { encode(chunk); }

  KOKKOS_INLINE_FUNCTION void encode(std::uint64_t chunk) const {
    const value_codec<T> codec = plan_compression<T>(base, *range).codec;
    std::byte* const slot = data + chunk * full_chunk_bytes;
    const std::uint64_t bytes = encode_chunk<T, BlockSize>(
        in + chunk * values_per_chunk, layout.values_in_chunk(chunk), codec, slot);
    store<std::uint64_t>(ends + 8 * chunk, bytes);
    store<std::uint64_t>(checksums + 8 * chunk, checksum_of(slot, bytes));
  }
};

// On x86-64 hosts the encoder is compiled a second time for AVX2 + FMA and taken when the CPU
// has them: the quantize-and-verify loop then works on four doubles at once instead of two
// (1.5x on the encode, docs/performance.md). Streams are identical either way (the rounding does
// not depend on FMA contraction, docs/error-bound.md; the golden checksums in
// tests/test_format.cpp run through this path in the Release tests and through the baseline
// path in the sanitizer pass, where it is left out). Not needed when the whole build already
// targets AVX2, nor in device compilers.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(__AVX2__) && \
    !defined(__CUDACC__) && !defined(__HIPCC__) && !defined(__SANITIZE_ADDRESS__) &&            \
    !defined(KOMPRESS_NO_HOST_DISPATCH)
#if defined(__has_feature)
#if !__has_feature(address_sanitizer) && !__has_feature(memory_sanitizer)
#define KOMPRESS_HOST_AVX2_DISPATCH 1
#endif
#else
#define KOMPRESS_HOST_AVX2_DISPATCH 1
#endif
#endif

#ifdef KOMPRESS_HOST_AVX2_DISPATCH
template <class T, int BlockSize>
struct chunk_encoder_avx2 : chunk_encoder<T, BlockSize> {
  // flatten: the codec's functions are inlined here and so compiled for AVX2 too.
  __attribute__((target("avx2,fma"), flatten)) void operator()(std::uint64_t chunk) const {
    this->encode(chunk);
  }
};

inline bool host_has_avx2_fma() {
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}
#endif

/// Enqueues the compression of `count = base.count` values at `in` into `out` on `exec` and
/// returns without waiting. `base` carries the data-independent header fields. When `exec`
/// completes, `out` holds the stream, and `*length` (if not null; memory `exec` writes) its
/// length, which the header also records. Four launches:
///   1. the value range, reduced into the first 16 bytes of `out`;
///   2. every chunk encoded by one thread at its worst-case position in the output, writing
///      its length and checksum to the chunk tables (each thread derives the codec from the
///      range);
///   3. an inclusive scan turning the lengths into chunk ends;
///   4. one thread moving the chunks down into place in order (a chunk only ever moves towards
///      the front, over space already vacated) and writing the header and its checksum.
/// Step 4 copies compressed bytes only, a fraction of the input. The stream does not depend
/// on the thread count: every chunk's bytes depend on its values alone.
template <class T, int BlockSize, class Exec>
void enqueue_compress_kernels(const Exec& exec, const T* in, std::byte* out,
                              const stream_header& base, std::uint64_t* length) {
  using memory_space = typename Exec::memory_space;
  const stream_layout layout = base.layout();
  const std::uint64_t count = base.count;
  const std::uint64_t chunks = layout.chunk_count();
  const std::uint64_t values_per_chunk = layout.values_per_chunk();
  const std::uint64_t full_chunk_bytes = layout.max_chunk_bytes(values_per_chunk);
  std::byte* const ends = out + layout.chunk_end_table_offset();
  std::byte* const checksums = out + layout.chunk_checksum_table_offset();
  std::byte* const data = out + layout.data_offset();
  auto* const range = reinterpret_cast<packed_range<T>*>(out);  // alignment 1
  static_assert(sizeof(packed_range<T>) <= header_bytes);

  enqueue_value_range(exec, in, count, (base.flags & flag_fill_value) != 0,
                      static_cast<bits_t<T>>(base.fill_bits),
                      Kokkos::View<packed_range<T>, memory_space, Kokkos::MemoryUnmanaged>(range));

  const chunk_encoder<T, BlockSize> encoder{in,   range, data, ends, checksums, base, layout,
                                            values_per_chunk, full_chunk_bytes};
  const Kokkos::RangePolicy<Exec> chunk_policy(exec, 0, chunks);
  bool encoded = false;
#ifdef KOMPRESS_HOST_AVX2_DISPATCH
  // The default block size only: each variant compiles the encoder once more.
  if constexpr (std::is_same_v<memory_space, Kokkos::HostSpace> && BlockSize == 32) {
    if (host_has_avx2_fma()) {
      Kokkos::parallel_for("kompress::compress::encode_chunks", chunk_policy,
                           chunk_encoder_avx2<T, BlockSize>{encoder});
      encoded = true;
    }
  }
#endif
  if (!encoded) Kokkos::parallel_for("kompress::compress::encode_chunks", chunk_policy, encoder);
  Kokkos::parallel_scan(
      "kompress::compress::chunk_offsets", Kokkos::RangePolicy<Exec>(exec, 0, chunks),
      KOKKOS_LAMBDA(std::uint64_t chunk, std::uint64_t& end, bool final) {
        end += load<std::uint64_t>(ends + 8 * chunk);
        if (final) store<std::uint64_t>(ends + 8 * chunk, end);
      });
  Kokkos::parallel_for(
      "kompress::compress::assemble", Kokkos::RangePolicy<Exec>(exec, 0, 1),
      KOKKOS_LAMBDA(int) {
        stream_header h = plan_compression<T>(base, *range).header;  // before the header lands
        std::uint64_t begin = chunks ? load<std::uint64_t>(ends) : 0;
        for (std::uint64_t chunk = 1; chunk < chunks; ++chunk) {
          const std::uint64_t end = load<std::uint64_t>(ends + 8 * chunk);
          std::byte* const from = data + chunk * full_chunk_bytes;
          std::byte* const to = data + begin;
          if (to != from) {
            KOKKOS_IF_ON_HOST((std::memmove(to, from, end - begin);))
            KOKKOS_IF_ON_DEVICE((for (std::uint64_t i = 0; i < end - begin; ++i) to[i] = from[i];))
          }
          begin = end;
        }
        h.stream_bytes = layout.data_offset() + begin;
        write_header_fields(out, h);
        store<std::uint64_t>(out + header_checksum_offset,
                             header_checksum(out, layout.data_offset()));
        if (length) *length = h.stream_bytes;
      });
}

/// Verifies every chunk's checksum, then decodes. Throws format_error before writing any
/// output if a checksum does not match.
template <class T, int BlockSize, class Exec>
void decompress_chunks(const Exec& exec, const std::byte* in, const stream_header& header,
                       const value_codec<T>& codec, T* out, const char* who) {
  const stream_layout layout = header.layout();
  const std::uint64_t chunks = layout.chunk_count();
  const std::uint64_t values_per_chunk = layout.values_per_chunk();
  const std::byte* const ends = in + layout.chunk_end_table_offset();
  const std::byte* const checksums = in + layout.chunk_checksum_table_offset();
  const std::byte* const data = in + layout.data_offset();
  const auto chunk_begin = [=] KOKKOS_FUNCTION(std::uint64_t chunk) {
    return chunk ? load<std::uint64_t>(ends + 8 * (chunk - 1)) : std::uint64_t(0);
  };

  std::uint64_t first_bad = chunks;
  Kokkos::parallel_reduce(
      "kompress::decompress::verify", Kokkos::RangePolicy<Exec>(exec, 0, chunks),
      KOKKOS_LAMBDA(std::uint64_t chunk, std::uint64_t& bad) {
        const std::uint64_t begin = chunk_begin(chunk);
        const std::uint64_t end = load<std::uint64_t>(ends + 8 * chunk);
        if (checksum_of(data + begin, end - begin) != load<std::uint64_t>(checksums + 8 * chunk))
          bad = chunk < bad ? chunk : bad;
      },
      Kokkos::Min<std::uint64_t>(first_bad));
  if (first_bad < chunks)
    throw_format(who, "checksum mismatch in chunk " + std::to_string(first_bad) + " of " +
                          std::to_string(chunks) + " (the stream is corrupted)");

  Kokkos::parallel_reduce(
      "kompress::decompress::decode_chunks", Kokkos::RangePolicy<Exec>(exec, 0, chunks),
      KOKKOS_LAMBDA(std::uint64_t chunk, std::uint64_t& bad) {
        const std::uint64_t begin = chunk_begin(chunk);
        const std::uint64_t end = load<std::uint64_t>(ends + 8 * chunk);
        if (!decode_chunk<T, BlockSize>(data + begin, end - begin,
                                        layout.values_in_chunk(chunk), codec,
                                        out + chunk * values_per_chunk))
          bad = chunk < bad ? chunk : bad;
      },
      Kokkos::Min<std::uint64_t>(first_bad));
  if (first_bad < chunks)
    throw_format(who, "malformed block data in chunk " + std::to_string(first_bad));
}

}  // namespace kompress::detail
