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
