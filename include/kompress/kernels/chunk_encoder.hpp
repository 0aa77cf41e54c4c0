#pragma once
// What every backend's chunk encoder and decoder share: the compression plan derived from the
// value range, the functor that encodes one chunk at its worst-case slot, and the one that
// decodes a chunk.

#include <kompress/codec/chunk.hpp>
#include <kompress/format.hpp>
#include <kompress/kernels/value_range.hpp>

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <type_traits>

namespace kompress::inline v0::detail {

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
  const double abs_bound = resolve_bound(error_bound{base.mode, base.user_bound}, min, max);
  const double max_abs = empty ? 0.0 : Kokkos::fmax(Kokkos::fabs(min), Kokkos::fabs(max));
  plan.codec = make_value_codec<T>(abs_bound, max_abs, base.rounding == rounding_mode::stochastic,
                                   base.rounding_seed);
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
    store<std::uint64_t>(ends + 8 * chunk, encode_into(chunk, data + chunk * full_chunk_bytes));
  }

  /// Encodes chunk `chunk` at `to` (room for max_chunk_bytes of its values), records its
  /// checksum and returns its length (not recorded).
  KOKKOS_INLINE_FUNCTION std::uint64_t encode_into(std::uint64_t chunk, std::byte* to) const {
    const std::uint64_t bytes = encode_unsealed(chunk, to);
    store<std::uint64_t>(checksums + 8 * chunk, checksum_of(to, bytes));
    return bytes;
  }

  /// encode_into without the checksum (the caller records it).
  KOKKOS_INLINE_FUNCTION std::uint64_t encode_unsealed(std::uint64_t chunk, std::byte* to) const {
    const value_codec<T> codec = plan_compression<T>(base, *range).codec;
    return encode_chunk<T, BlockSize>(in + chunk * values_per_chunk, layout.values_in_chunk(chunk),
                                      chunk * values_per_chunk, codec, to);
  }
};

/// Where a compression on `Exec` keeps the value range until the header replaces it: in the
/// header's first bytes, at `out` itself on the host, at the next 4-byte boundary elsewhere. A
/// device's parallel_reduce stores its result in 4-byte words (Kokkos::Cuda), which fault at
/// an output that starts at an odd address (compress_async into any offset of a buffer).
template <class T, class Exec>
KOKKOS_INLINE_FUNCTION packed_range<T>* range_slot(std::byte* out) {
  static_assert(3 + sizeof(packed_range<T>) <= header_bytes);
  if constexpr (std::is_same_v<typename Exec::memory_space, Kokkos::HostSpace>) {
    return reinterpret_cast<packed_range<T>*>(out);
  } else {
    const auto misaligned = reinterpret_cast<std::uintptr_t>(out) % 4;
    return reinterpret_cast<packed_range<T>*>(out + (misaligned ? 4 - misaligned : 0));
  }
}

/// The last step of a compression: once the chunk data (`data_bytes` long) and the chunk end
/// table are in place, writes the header (its data-dependent fields from the value range still
/// at `range`, in the header's bytes), its checksum, and the stream's length to `*length` (if
/// not null).
template <class T>
KOKKOS_INLINE_FUNCTION void write_stream_header(std::byte* out, const packed_range<T>* range,
                                                const stream_header& base, const stream_layout& layout,
                                                std::uint64_t data_bytes, std::uint64_t* length) {
  // Read the range before the header lands on it.
  stream_header h = plan_compression<T>(base, *range).header;
  h.stream_bytes = layout.data_offset() + data_bytes;
  write_header_fields(out, h);
  store<std::uint64_t>(out + header_checksum_offset, header_checksum(out, layout.data_offset()));
  if (length) *length = h.stream_bytes;
}

/// Decodes chunk `chunk` of a stream whose checksums were verified; a malformed chunk lowers
/// `bad` to its index (a Kokkos::Min reduction).
template <class T, int BlockSize>
struct chunk_decoder {
  const std::byte* data;
  const std::byte* ends;
  stream_layout layout;
  value_codec<T> codec;
  T* out;
  std::uint64_t values_per_chunk;

  KOKKOS_INLINE_FUNCTION void operator()(std::uint64_t chunk, std::uint64_t& bad) const {
    decode(chunk, bad);
  }

  KOKKOS_INLINE_FUNCTION void decode(std::uint64_t chunk, std::uint64_t& bad) const {
    const std::uint64_t begin = chunk ? load<std::uint64_t>(ends + 8 * (chunk - 1)) : 0;
    const std::uint64_t end = load<std::uint64_t>(ends + 8 * chunk);
    if (!decode_chunk<T, BlockSize>(data + begin, end - begin, layout.values_in_chunk(chunk),
                                    codec, out + chunk * values_per_chunk))
      bad = chunk < bad ? chunk : bad;
  }
};

}  // namespace kompress::inline v0::detail
