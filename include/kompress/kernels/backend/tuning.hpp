#pragma once
// The kernels' tuning parameters, one plain struct per backend (CUB's tuning policies). Each
// backend (backend/portable.hpp, backend/host.hpp) returns its own from
// `backend<Exec>::tuning()`; docs/performance.md ("Kernel tuning") has the measurements
// behind every value.

#include <kompress/format.hpp>

#include <cstdint>

namespace kompress::detail {

/// Which chunk encoder compression runs. Both write the same bytes.
enum class encoder_kind : std::uint8_t {
  portable,  ///< the codec as compiled for the build's target
  avx2_fma,  ///< the codec compiled once more for AVX2 + FMA (x86-64 hosts that have them)
};

/// How the compressed chunks, encoded at their worst-case positions, reach their places.
enum class assemble_kind : std::uint8_t {
  serial,    ///< one thread moves every chunk down, in order
  parallel,  ///< chunks whose destination overlaps no other chunk's bytes move in parallel,
             ///< one thread then moves the rest in order (enqueue_assemble)
};

struct kernel_tuning {
  /// Blocks per chunk. The stream records it and its bytes depend on it, and streams must
  /// not depend on the backend: every backend uses the format's value.
  int blocks_per_chunk = default_blocks_per_chunk;
  /// Values per work item of the value-range reduction.
  std::uint64_t range_segment = 4096;
  encoder_kind encoder = encoder_kind::portable;
  assemble_kind assemble = assemble_kind::parallel;
};

}  // namespace kompress::detail
