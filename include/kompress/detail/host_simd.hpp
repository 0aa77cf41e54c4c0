#pragma once
// x86-64 code for the host that the compiler builds for a wider instruction set than the rest
// of the build (GCC and Clang target attributes) and that runs only when the CPU has it. Not
// in device compilers, under the sanitizers (their pass covers the portable code), or with
// KOMPRESS_NO_HOST_DISPATCH (the test suites' portable variants).

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDACC__) && \
    !defined(__HIPCC__) && !defined(__SANITIZE_ADDRESS__) && !defined(KOMPRESS_NO_HOST_DISPATCH)
#if defined(__has_feature)
#if !__has_feature(address_sanitizer) && !__has_feature(memory_sanitizer)
#define KOMPRESS_HOST_X86_SIMD 1
#endif
#else
#define KOMPRESS_HOST_X86_SIMD 1
#endif
#endif

#ifdef KOMPRESS_HOST_X86_SIMD
namespace kompress::inline v0::detail {

inline bool host_has_ssse3() { return __builtin_cpu_supports("ssse3"); }
inline bool host_has_avx2() { return __builtin_cpu_supports("avx2"); }
inline bool host_has_avx2_fma() { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }
inline bool host_has_avx512() {
  return host_has_avx2_fma() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
         __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq");
}
inline bool host_has_bmi_popcnt() { return __builtin_cpu_supports("bmi") && __builtin_cpu_supports("popcnt"); }

}  // namespace kompress::inline v0::detail
#endif
