#pragma once
// The CUDA backend: the portable kernels with a team per chunk (kernels/team_codec.hpp), for
// both codecs and both directions. A thread per chunk gives a 461 MB array 56k threads, a
// fraction of what an H100 keeps resident, and its assembly ends in one thread moving bytes
// (docs/gpu.md). The values below are the design's starting point; docs/performance.md says
// which were measured on a GPU.

#include <kompress/kernels/backend/portable.hpp>

#include <Kokkos_Core.hpp>

#ifdef KOKKOS_ENABLE_CUDA

namespace kompress::inline v0::detail {

template <>
struct backend<Kokkos::Cuda> : portable_backend<Kokkos::Cuda> {
  static kernel_tuning tuning() {
    kernel_tuning t;
    // A thread per block: the format's 64 blocks per chunk make two warps per chunk.
    t.team_size = default_blocks_per_chunk;
    // 256 values per work item of the value range: 1.8M work items for 461 MB of floats, 14k
    // for 14 MB (4096, the host's, would leave a 14 MB field 854 threads).
    t.range_segment = 256;
    return t;
  }
};

}  // namespace kompress::inline v0::detail

#endif
