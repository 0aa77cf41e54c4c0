#pragma once
// The default backend, for every execution space no other backend file specializes: the
// codec as the build compiles it, and the parallel assemble step.
//
// A backend is a specialization of `backend<Exec>` (keyed on the execution space) with
//   static kernel_tuning tuning();                        its tuning (backend/tuning.hpp)
//   template <class T, class R> static void enqueue_value_range(  reduces `segments` into the
//       const Exec&, const value_range_segments<T>& segments, const R& result, encoder_kind);
//                                                         View `result`, without a wait
//   template <class T, int B> static void encode_chunks(  runs `encoder` over chunks [0, n)
//       const Exec&, std::uint64_t n, const chunk_encoder<T, B>& encoder, encoder_kind);
//   template <class T, int B, class R> static bool enqueue_fused_compression(  the value
//       const Exec&, const value_range_segments<T>&, const R& range, range, the fast codec's
//       const chunk_encoder<T, B>&, std::byte* out,         chunks and the stream's assembly
//       std::uint64_t* length, const kernel_tuning&,        in fewer launches, or false;
//       const packed_range<T>* known_range);                the range given, when not null
//   template <class T> static void encode_ratio_chunks(   the same for ratio chunks
//       const Exec&, std::uint64_t n, const ratio_chunk_encoder<T>& encoder, encoder_kind);
//   static std::uint64_t verify_chunks(const Exec&,       the first chunk of [0, n) whose
//       std::uint64_t n, const std::byte* data,            checksum does not match, or n
//       const std::byte* ends, const std::byte* checksums);
//   template <class T, int B> static std::uint64_t decode_chunks(  runs `decoder` over chunks
//       const Exec&, std::uint64_t n, const chunk_decoder<T, B>& decoder, encoder_kind);
//                                                         [0, n): the first bad chunk, or n
//   template <class T> static std::uint64_t               the same for ratio chunks
//       decode_ratio_chunks(const Exec&, std::uint64_t n,
//       const ratio_chunk_decoder<T>& decoder, encoder_kind);
//   template <class Batch> static std::uint64_t           the same over every chunk of a
//       decode_batch_chunks(const Exec&, const Batch&,    stream_batch (decode_batch.hpp)
//       encoder_kind);
// A new one is one file beside this one that specializes it, deriving from portable_backend
// where it changes only some members (cuda.hpp changes only the tuning), plus its #include in
// backend/backend.hpp.

#include <kompress/kernels/backend/tuning.hpp>
#include <kompress/kernels/chunk_encoder.hpp>
#include <kompress/kernels/first_flagged.hpp>
#include <kompress/kernels/ratio_encoder.hpp>

#include <Kokkos_Core.hpp>

#include <cstdint>

namespace kompress::inline v0::detail {

/// The portable backend's members, for backends that change only some of them to derive from.
template <class Exec>
struct portable_backend {
  static kernel_tuning tuning() { return {}; }

  template <class T, class ResultView>
  static void enqueue_value_range(const Exec& exec, const value_range_segments<T>& segments,
                                  const ResultView& result, encoder_kind) {
    enqueue_range_reduction(exec, segments, result);
  }

  template <class T, int BlockSize>
  static void encode_chunks(const Exec& exec, std::uint64_t chunks,
                            const chunk_encoder<T, BlockSize>& encoder, encoder_kind) {
    Kokkos::parallel_for("kompress::compress::encode_chunks",
                         Kokkos::RangePolicy<Exec>(exec, 0, chunks), encoder);
  }

  /// Steps 1-4 of enqueue_compress_kernels for the fast codec in fewer launches, where a
  /// backend can (host.hpp); false: nothing enqueued, the caller runs the general launches.
  /// With `known_range` the value range is that, not reduced.
  template <class T, int BlockSize, class ResultView>
  static bool enqueue_fused_compression(const Exec&, const value_range_segments<T>&,
                                        const ResultView&, const chunk_encoder<T, BlockSize>&,
                                        std::byte*, std::uint64_t*, const kernel_tuning&,
                                        const packed_range<T>*) {
    return false;
  }

  /// The ratio codec's chunks (codec_mode::ratio).
  template <class T>
  static void encode_ratio_chunks(const Exec& exec, std::uint64_t chunks,
                                  const ratio_chunk_encoder<T>& encoder, encoder_kind) {
    Kokkos::parallel_for("kompress::compress::encode_ratio_chunks",
                         Kokkos::RangePolicy<Exec>(exec, 0, chunks), encoder);
  }

  /// The first chunk whose checksum does not match, or `chunks`.
  static std::uint64_t verify_chunks(const Exec& exec, std::uint64_t chunks, const std::byte* data,
                                     const std::byte* ends, const std::byte* checksums) {
    std::uint64_t first_bad = chunks;
    Kokkos::parallel_reduce(
        "kompress::decompress::verify", Kokkos::RangePolicy<Exec>(exec, 0, chunks),
        KOKKOS_LAMBDA(std::uint64_t chunk, std::uint64_t& bad) {
          if (!chunk_matches(data, ends, checksums, chunk)) bad = chunk < bad ? chunk : bad;
        },
        Kokkos::Min<std::uint64_t>(first_bad));
    return first_bad;
  }

  template <class T, int BlockSize>
  static std::uint64_t decode_chunks(const Exec& exec, std::uint64_t chunks,
                                     const chunk_decoder<T, BlockSize>& decoder, encoder_kind) {
    std::uint64_t first_bad = chunks;
    Kokkos::parallel_reduce("kompress::decompress::decode_chunks",
                            Kokkos::RangePolicy<Exec>(exec, 0, chunks), decoder,
                            Kokkos::Min<std::uint64_t>(first_bad));
    return first_bad;
  }

  /// The ratio codec's chunks: the first bad one, or `chunks`.
  template <class T>
  static std::uint64_t decode_ratio_chunks(const Exec& exec, std::uint64_t chunks,
                                           const ratio_chunk_decoder<T>& decoder, encoder_kind) {
    std::uint64_t first_bad = chunks;
    Kokkos::parallel_reduce("kompress::decompress::decode_ratio_chunks",
                            Kokkos::RangePolicy<Exec>(exec, 0, chunks), decoder,
                            Kokkos::Min<std::uint64_t>(first_bad));
    return first_bad;
  }

  /// Every chunk of a stream_batch (kernels/decode_batch.hpp): the first bad one, or all.
  template <class Batch>
  static std::uint64_t decode_batch_chunks(const Exec& exec, const Batch& batch, encoder_kind) {
    return first_flagged("kompress::decompress::decode_batch", Kokkos::RangePolicy<Exec>(exec, 0, batch.chunks),
                         batch, batch.first_bad, batch.chunks);
  }
};

template <class Exec>
struct backend : portable_backend<Exec> {};

}  // namespace kompress::inline v0::detail
