#pragma once
// The host backend (Serial, OpenMP, Threads: every execution space whose memory is
// HostSpace): on x86-64 the codec's three loops (the value range, the chunk encoder, the chunk
// decoder) are compiled a second time for AVX2 + FMA and taken when the CPU has them. The
// quantize-and-verify and reconstruct loops then work on four doubles at once instead of two,
// and the value range's integer min/max on eight floats' keys (SSE2 has no 32-bit signed
// min/max and no 64-bit compare). Streams and decoded values are identical either way: the
// range is integer arithmetic, and no product in the codec can be fused with anything
// (docs/error-bound.md, "Verification"); the golden checksums in tests/test_format.cpp and
// codec_adversarial's encoder and decoder comparisons check it. Not compiled when the whole
// build already targets AVX2 (nothing to gain), in device compilers, or under the sanitizers
// (their pass then covers the portable code).

#include <kompress/kernels/backend/portable.hpp>

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <type_traits>

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

namespace kompress::detail {

#ifdef KOMPRESS_HOST_AVX2_DISPATCH
template <class T, int BlockSize>
struct chunk_encoder_avx2 : chunk_encoder<T, BlockSize> {
  // flatten: the codec's functions are inlined here and so compiled for AVX2 too.
  __attribute__((target("avx2,fma"), flatten)) void operator()(std::uint64_t chunk) const {
    this->encode(chunk);
  }
};

template <class T>
struct ratio_chunk_encoder_avx2 : ratio_chunk_encoder<T> {
  __attribute__((target("avx2,fma"), flatten)) void operator()(std::uint64_t chunk) const {
    this->encode(chunk);
  }
};

template <class T, int BlockSize>
struct chunk_decoder_avx2 : chunk_decoder<T, BlockSize> {
  __attribute__((target("avx2,fma"), flatten)) void operator()(std::uint64_t chunk,
                                                                std::uint64_t& bad) const {
    this->decode(chunk, bad);
  }
};

template <class T>
struct value_range_segments_avx2 : value_range_segments<T> {
  __attribute__((target("avx2,fma"), flatten)) void operator()(std::uint64_t s,
                                                                packed_range<T>& partial) const {
    this->reduce(s, partial);
  }
};

inline bool host_has_avx2_fma() {
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}
#endif

/// Whether this build can run the encoder `kind` on this host.
inline bool host_runs(encoder_kind kind) {
#ifdef KOMPRESS_HOST_AVX2_DISPATCH
  if (kind == encoder_kind::avx2_fma) return host_has_avx2_fma();
#endif
  return kind == encoder_kind::portable;
}

template <class Exec>
  requires std::is_same_v<typename Exec::memory_space, Kokkos::HostSpace>
struct backend<Exec> {
  // Each value against its alternatives, bench_kernel_tuning on 5 real files, REL 1e-3,
  // 2-core EPYC at load average ~10 (docs/performance.md, "Kernel tuning"):
  static kernel_tuning tuning() {
    kernel_tuning t;
    // 1024 / 16384 / 65536: no difference beyond the noise (mpas_surface_pressure, the
    // steadiest file: within 0.5%); 4096 keeps a work item at 16-32 KB.
    t.range_segment = 4096;
    // The AVX2 + FMA encoder: 1.46x the portable one (geometric mean, one thread; 1.33-1.8x).
    // The value range follows it (see docs/performance.md, "Kernel tuning", for its gain).
    t.encoder = host_runs(encoder_kind::avx2_fma) ? encoder_kind::avx2_fma : encoder_kind::portable;
    // The AVX2 + FMA decoder (docs/performance.md, "Kernel tuning").
    t.decoder = t.encoder;
    // Four waves move 94-100% of the moved bytes in parallel (one wave: 48-92%). On 2 cores
    // the move is about 1% of a compression (the moved bytes at memcpy's speed), so the gain
    // is below the noise here; it is the serial part that would grow with the thread count.
    t.assemble_waves = max_assemble_waves;
    return t;
  }

  template <class T, class ResultView>
  static void enqueue_value_range(const Exec& exec, const value_range_segments<T>& segments,
                                  const ResultView& result, encoder_kind kind) {
#ifdef KOMPRESS_HOST_AVX2_DISPATCH
    if (kind == encoder_kind::avx2_fma && host_has_avx2_fma())
      return enqueue_range_reduction(exec, value_range_segments_avx2<T>{segments}, result);
#endif
    (void)kind;
    enqueue_range_reduction(exec, segments, result);
  }

  template <class T, int BlockSize>
  static void encode_chunks(const Exec& exec, std::uint64_t chunks,
                            const chunk_encoder<T, BlockSize>& encoder, encoder_kind kind) {
    const Kokkos::RangePolicy<Exec> policy(exec, 0, chunks);
#ifdef KOMPRESS_HOST_AVX2_DISPATCH
    // The default block size only: each variant compiles the encoder once more.
    if constexpr (BlockSize == 32) {
      if (kind == encoder_kind::avx2_fma && host_has_avx2_fma()) {
        Kokkos::parallel_for("kompress::compress::encode_chunks", policy,
                             chunk_encoder_avx2<T, BlockSize>{encoder});
        return;
      }
    }
#endif
    (void)kind;
    Kokkos::parallel_for("kompress::compress::encode_chunks", policy, encoder);
  }

  template <class T>
  static void encode_ratio_chunks(const Exec& exec, std::uint64_t chunks,
                                  const ratio_chunk_encoder<T>& encoder, encoder_kind kind) {
    const Kokkos::RangePolicy<Exec> policy(exec, 0, chunks);
#ifdef KOMPRESS_HOST_AVX2_DISPATCH
    if (kind == encoder_kind::avx2_fma && host_has_avx2_fma()) {
      Kokkos::parallel_for("kompress::compress::encode_ratio_chunks", policy,
                           ratio_chunk_encoder_avx2<T>{encoder});
      return;
    }
#endif
    (void)kind;
    Kokkos::parallel_for("kompress::compress::encode_ratio_chunks", policy, encoder);
  }

  template <class T, int BlockSize>
  static std::uint64_t decode_chunks(const Exec& exec, std::uint64_t chunks,
                                     const chunk_decoder<T, BlockSize>& decoder,
                                     encoder_kind kind) {
    const Kokkos::RangePolicy<Exec> policy(exec, 0, chunks);
    std::uint64_t first_bad = chunks;
#ifdef KOMPRESS_HOST_AVX2_DISPATCH
    if constexpr (BlockSize == 32) {
      if (kind == encoder_kind::avx2_fma && host_has_avx2_fma()) {
        Kokkos::parallel_reduce("kompress::decompress::decode_chunks", policy,
                                chunk_decoder_avx2<T, BlockSize>{decoder},
                                Kokkos::Min<std::uint64_t>(first_bad));
        return first_bad;
      }
    }
#endif
    (void)kind;
    Kokkos::parallel_reduce("kompress::decompress::decode_chunks", policy, decoder,
                            Kokkos::Min<std::uint64_t>(first_bad));
    return first_bad;
  }
};

}  // namespace kompress::detail
