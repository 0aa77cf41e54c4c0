#pragma once
// The kernels' tuning parameters, one plain struct per backend (CUB's tuning policies). Each
// backend (backend/portable.hpp, backend/host.hpp, backend/cuda.hpp) returns its own from
// `backend<Exec>::tuning()`; docs/performance.md ("Kernel tuning") has the measurements
// behind every value.

#include <kompress/format.hpp>

#include <cstdint>

namespace kompress::inline v0::detail {

/// Which compilation of the codec's loops a kernel runs (the value range and the chunk
/// encoder for compression, the chunk decoder for decompression). All write the same bytes
/// and decode the same values.
enum class encoder_kind : std::uint8_t {
  portable,  ///< the codec as compiled for the build's target
  avx2_fma,  ///< the codec compiled once more for AVX2 + FMA (x86-64 hosts that have them)
  avx512,    ///< avx2_fma, with both codecs' chunk encoders, the ratio codec's decoder and the
             ///< value range compiled for AVX-512 (F, VL, BW, DQ) + FMA (x86-64 hosts that have
             ///< them; the fast codec's decoder keeps AVX2, which is faster)
};

/// How batched decoding (detail/decompress_batch.hpp) reads its streams' headers and chunk
/// tables. Every way reads the same bytes and makes the same checks.
enum class header_reading : std::uint8_t {
  direct,      ///< in place where the host can read the streams' memory, else per_stream
  per_stream,  ///< a copy and a wait per stream (two where its tables are long), as decompress reads one
  gathered,    ///< every stream's first bytes gathered by one kernel into one buffer and copied to the
               ///< host with one wait, a second for the tables past them: whatever the number of streams
};

/// The most parallel waves the assemble step runs (the wave of a chunk is computed from up
/// to 2^max_assemble_waves chunk-table lookups).
inline constexpr int max_assemble_waves = 4;

/// Every backend's team_size unless it says otherwise: 0, or in a build that defines
/// KOMPRESS_TEAM_KERNELS the CUDA backend's 64 (as many threads per team as the execution
/// space allows, up to that): the CPU tests of the team kernels run the codec suites that way.
#ifdef KOMPRESS_TEAM_KERNELS
inline constexpr int default_team_size = default_blocks_per_chunk;
#else
inline constexpr int default_team_size = 0;
#endif

struct kernel_tuning {
  /// Blocks per chunk. The stream records it and its bytes depend on it, and streams must
  /// not depend on the backend: every backend uses the format's value.
  int blocks_per_chunk = default_blocks_per_chunk;
  /// Values per work item of the value-range reduction.
  std::uint64_t range_segment = 4096;
  /// Compression's value range and chunk encoder.
  encoder_kind encoder = encoder_kind::portable;
  /// How the compressed chunks, encoded at their worst-case positions, reach their places:
  /// in this many parallel waves (at most max_assemble_waves), then one thread moves the rest
  /// in order (enqueue_compress_kernels). 0: one thread moves them all.
  int assemble_waves = max_assemble_waves;
  /// The host backend's fused compression (backend/host.hpp): the fast codec's chunks encoded
  /// and assembled in one launch by this many workers, each a contiguous run of chunks; -1:
  /// one per thread of the execution space; 0: the general launches (steps 2-4 of
  /// enqueue_compress_kernels). Any value writes the same bytes.
  int fused_workers = 0;
  /// Decompression's chunk decoder.
  encoder_kind decoder = encoder_kind::portable;
  /// 0: a thread per chunk (the kernels above). Otherwise a team of this many threads per
  /// chunk (kernels/team_codec.hpp; -1: as many as Kokkos picks), for both codecs and both
  /// directions; the settings above other than range_segment then do not apply. Any value
  /// writes the same bytes.
  int team_size = default_team_size;
  /// Whether batched compression (detail/compress_batch.hpp) runs the batched kernels where
  /// the team kernels run. Off, every array takes the single-stream kernels: the same bytes,
  /// a compression per array (bench_compress_batch's baseline).
  bool batch_compression = true;
  /// How batched decoding reads its streams' headers (above).
  header_reading batch_headers = header_reading::direct;
};

}  // namespace kompress::inline v0::detail
