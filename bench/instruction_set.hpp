#pragma once
// The vector instructions the benchmark was compiled for, printed with its results: the codec's
// loops vectorize for what the compiler may assume, so numbers from different targets differ
// (bench/CMakeLists.txt, KOMPRESS_BENCH_ARCH).

inline const char* instruction_set() {
#if defined(__AVX512F__)
  return "AVX-512";
#elif defined(__AVX2__) && defined(__FMA__)
  return "AVX2+FMA";
#elif defined(__AVX2__)
  return "AVX2";
#elif defined(__AVX__)
  return "AVX";
#elif defined(__SSE2__)
  return "SSE2 (the x86-64 baseline)";
#elif defined(__ARM_NEON)
  return "NEON";
#else
  return "the compiler's default";
#endif
}
