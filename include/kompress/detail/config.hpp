#pragma once
// How kompress marks functions that run on host and device. With Kokkos, Kokkos's own macro;
// without it (the block codec compiled by nvcc alone, as the CUDA compile check does), the
// CUDA qualifiers, or plain inline in host-only builds. The block codec needs nothing else.

#if __has_include(<Kokkos_Macros.hpp>) && !defined(KOMPRESS_WITHOUT_KOKKOS)
#include <Kokkos_Macros.hpp>
#define KOMPRESS_FUNCTION KOKKOS_INLINE_FUNCTION
#elif defined(__CUDACC__)
#define KOMPRESS_FUNCTION __host__ __device__ inline
#else
#define KOMPRESS_FUNCTION inline
#endif

// nvcc 13 places a member that follows an empty [[no_unique_address]] member at another offset
// in device code than the host compiler does, and Kokkos's mdspan-based Views have such
// members: every kernel whose functor holds a View before other members would read them wrong
// (fills writing outside their View, reductions writing to host addresses). kompress's CMake
// target adds the definitions below; docs/gpu.md, "nvcc 13 and Kokkos's Views".
#if defined(KOKKOS_ENABLE_CUDA) && defined(__NVCC__) && defined(__CUDACC_VER_MAJOR__) && \
    __CUDACC_VER_MAJOR__ >= 13 && !defined(KOKKOS_ENABLE_IMPL_VIEW_LEGACY) && \
    !defined(MDSPAN_IMPL_USE_FAKE_ATTRIBUTE_NO_UNIQUE_ADDRESS)
#error "kompress: nvcc 13 miscompiles kernels holding Kokkos Views; compile with \
-DMDSPAN_IMPL_USE_ATTRIBUTE_NO_UNIQUE_ADDRESS=1 -DMDSPAN_IMPL_USE_FAKE_ATTRIBUTE_NO_UNIQUE_ADDRESS \
-DMDSPAN_IMPL_NO_UNIQUE_ADDRESS= (kompress::kompress adds them; Kokkos itself should be built with them too)"
#endif

// Full unrolling of the bit-packing loops, whose trip count and shifts are constants. Under
// nvcc, its pragma in the device pass and none in the host pass: nvcc's front end rejects
// GCC's, and hands its own on to the host compiler, which does not know it.
#if defined(__CUDA_ARCH__)
#define KOMPRESS_UNROLL _Pragma("unroll")
#elif defined(__CUDACC__)
#define KOMPRESS_UNROLL
#elif defined(__clang__)
#define KOMPRESS_UNROLL _Pragma("clang loop unroll(full)")
#elif defined(__GNUC__)
#define KOMPRESS_UNROLL _Pragma("GCC unroll 128")
#else
#define KOMPRESS_UNROLL
#endif
