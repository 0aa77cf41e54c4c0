#pragma once
// Loops of the ratio codec written with x86 vector instructions, for the host only. One uses
// SSE2 (every x86-64 CPU has it): the delta predictor's inverse, whose portable loop takes a step
// per value on a dependency chain that no compiler vectorizes; it gives what that loop gives
// (integer adds, and the same products as value_codec<T>::reconstruct), and tests/codec/ratio.cpp's
// portable build (KOMPRESS_NO_HOST_DISPATCH) runs the portable one. The rest take instructions
// past SSE2, each called only where the CPU has them (the caller asks; elsewhere the portable
// loops run): zero elimination's byte expansion (one SSSE3 shuffle in place of a step per byte),
// and four AVX2 ones: the Rice writer's quotient codes of eight values (a prefix sum and variable
// shifts in place of a chain of them) and its remainders (packed eight at a time), and the Rice
// reader's set-bit positions and its blocks (the remainders unpacked by a shuffle and variable
// shifts, eight at a time, with the quotients in the same pass).

#include <kompress/codec/quantizer.hpp>
#include <kompress/detail/host_simd.hpp>

#include <cstdint>
#include <type_traits>

#ifdef KOMPRESS_HOST_X86_SIMD
#include <immintrin.h>

namespace kompress::inline v0::detail {

/// For each byte value, the positions of its set bits (lowest first) and their count.
struct set_bit_table {
  std::uint8_t positions[256][8];
  std::uint8_t counts[256];
};

inline constexpr set_bit_table make_set_bit_table() {
  set_bit_table table{};
  for (int v = 0; v < 256; ++v) {
    int count = 0;
    for (int j = 0; j < 8; ++j)
      if ((v >> j) & 1) table.positions[v][count++] = std::uint8_t(j);
    table.counts[v] = std::uint8_t(count);
  }
  return table;
}

inline constexpr set_bit_table set_bits_of_byte = make_set_bit_table();

/// For each bitmap byte m, the byte shuffle that moves the first popcount(m) bytes of a word to
/// the positions of m's set bits, lowest first, and zeroes the others (0x80).
struct byte_expansion_table {
  std::uint8_t control[256][8];
};

inline constexpr byte_expansion_table make_byte_expansion_table() {
  byte_expansion_table table{};
  for (int m = 0; m < 256; ++m) {
    std::uint8_t rank = 0;
    for (int j = 0; j < 8; ++j) table.control[m][j] = (m >> j) & 1 ? rank++ : std::uint8_t(0x80);
  }
  return table;
}

inline constexpr byte_expansion_table byte_expansion = make_byte_expansion_table();

/// The eight bytes a zero-eliminated bitmap byte m stands for: byte j is the next of `kept`'s
/// bytes (lowest first) where bit j of m is set, else 0. Only where host_has_ssse3().
__attribute__((target("ssse3"))) inline std::uint64_t expand_kept_bytes_ssse3(std::uint64_t kept, unsigned m) {
  const __m128i control = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(byte_expansion.control[m]));
  return std::uint64_t(_mm_cvtsi128_si64(_mm_shuffle_epi8(_mm_cvtsi64_si128(static_cast<long long>(kept)), control)));
}

/// The Rice quotient codes of z[0, 8) >> s (each that many 0 bits, then a 1 bit) as one bit
/// string, lowest first: returns its length and writes it to `pattern` when it fits 64 bits;
/// returns a length above 64 otherwise, without writing. Only where host_has_avx2().
__attribute__((target("avx2"))) inline std::uint32_t rice_quotient_pattern_avx2(const std::uint32_t* z, int s,
                                                                               std::uint64_t* pattern) {
  const __m256i quotients =
      _mm256_srl_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(z)), _mm_cvtsi32_si128(s));
  if (!_mm256_testz_si256(quotients, _mm256_set1_epi32(~63))) return 65;  // a code alone past 64
  // Each value's end: the running sum of the code lengths, in each half, then across.
  __m256i ends = _mm256_add_epi32(quotients, _mm256_set1_epi32(1));
  ends = _mm256_add_epi32(ends, _mm256_slli_si256(ends, 4));
  ends = _mm256_add_epi32(ends, _mm256_slli_si256(ends, 8));
  const __m256i low_half_total = _mm256_permutevar8x32_epi32(ends, _mm256_set1_epi32(3));
  ends = _mm256_add_epi32(ends, _mm256_blend_epi32(_mm256_setzero_si256(), low_half_total, 0xF0));
  const std::uint32_t length = std::uint32_t(_mm256_extract_epi32(ends, 7));
  if (length > 64) return length;
  const __m256i ones_at = _mm256_sub_epi32(ends, _mm256_set1_epi32(1));  // each below 64
  const __m256i one = _mm256_set1_epi64x(1);
  const __m256i bits =
      _mm256_or_si256(_mm256_sllv_epi64(one, _mm256_cvtepu32_epi64(_mm256_castsi256_si128(ones_at))),
                      _mm256_sllv_epi64(one, _mm256_cvtepu32_epi64(_mm256_extracti128_si256(ones_at, 1))));
  __m128i folded = _mm_or_si128(_mm256_castsi256_si128(bits), _mm256_extracti128_si256(bits, 1));
  folded = _mm_or_si128(folded, _mm_unpackhi_epi64(folded, folded));
  *pattern = std::uint64_t(_mm_cvtsi128_si64(folded));
  return length;
}

/// Writes base + the position of each set bit of w, lowest first, to out: a byte at a time,
/// without a branch, one widening load and one store per byte. Eight positions are written for
/// every byte and the next byte's overwrite those past its count, so out must have room for
/// popcount(w) + 8. Only where host_has_avx2().
__attribute__((target("avx2"))) inline void collect_set_bits_avx2(std::uint64_t w, std::uint32_t base,
                                                                 std::uint32_t* out) {
  __m256i offset = _mm256_set1_epi32(int(base));
  const __m256i eight = _mm256_set1_epi32(8);
  for (int byte = 0; byte < 8; ++byte) {
    const unsigned v = unsigned(w >> (8 * byte)) & 0xFFu;
    const __m256i positions =
        _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(set_bits_of_byte.positions[v])));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), _mm256_add_epi32(positions, offset));
    offset = _mm256_add_epi32(offset, eight);
    out += set_bits_of_byte.counts[v];
  }
}

/// For each Rice parameter k (0..14), where each of eight k-bit remainders lies in the 16 bytes
/// that start at the first of them (byte-aligned: eight remainders take k bytes): the byte
/// shuffle that gathers value j's four bytes into lane j, and the shift that aligns it.
struct rice_unpack_table {
  std::uint8_t control[15][32];
  std::uint32_t shifts[15][8];
};

inline constexpr rice_unpack_table make_rice_unpack_table() {
  rice_unpack_table table{};
  for (int k = 0; k < 15; ++k)
    for (int j = 0; j < 8; ++j) {
      for (int b = 0; b < 4; ++b) table.control[k][4 * j + b] = std::uint8_t((j * k >> 3) + b);
      table.shifts[k][j] = std::uint32_t(j * k & 7);
    }
  return table;
}

inline constexpr rice_unpack_table rice_unpack = make_rice_unpack_table();

/// One Rice block's residuals in one pass (read_rice): its k-bit remainders unpacked from
/// `remainders` (bitpack.hpp's layout) and its quotients taken from their ends, r[i] = ((q_i <<
/// k) | remainder_i) << shift, q_i = ends[i] - ends[i - 1] - 1, ends[-1] = start - 1. k <= 14:
/// eight remainders lie in the 16 bytes from the first of them, so `remainders` must have 3k +
/// 16 readable bytes (the block's 4k and what follows). Returns the OR of the quotients. Only
/// where host_has_avx2().
__attribute__((target("avx2"))) inline std::uint32_t rice_block_avx2(const std::byte* remainders,
                                                                    const std::uint32_t* ends, std::uint32_t start,
                                                                    int k, int shift, std::uint32_t* r) {
  const __m256i control = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rice_unpack.control[k]));
  const __m256i shifts = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rice_unpack.shifts[k]));
  const __m256i mask = _mm256_set1_epi32(int((1u << k) - 1u));
  const __m256i one = _mm256_set1_epi32(1);
  const __m128i k_count = _mm_cvtsi32_si128(k), shift_count = _mm_cvtsi32_si128(shift);
  __m256i any = _mm256_setzero_si256();
  for (int g = 0; g < 4; ++g) {
    const __m256i bytes = _mm256_broadcastsi128_si256(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(remainders + g * k)));
    const __m256i remainder = _mm256_and_si256(_mm256_srlv_epi32(_mm256_shuffle_epi8(bytes, control), shifts), mask);
    const __m256i current = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ends + 8 * g));
    const __m256i previous =
        g == 0 ? _mm256_blend_epi32(_mm256_permutevar8x32_epi32(current, _mm256_setr_epi32(0, 0, 1, 2, 3, 4, 5, 6)),
                                    _mm256_set1_epi32(int(start - 1u)), 1)
               : _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ends + 8 * g - 1));
    const __m256i quotient = _mm256_sub_epi32(_mm256_sub_epi32(current, previous), one);
    any = _mm256_or_si256(any, quotient);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(r + 8 * g),
                        _mm256_sll_epi32(_mm256_or_si256(_mm256_sll_epi32(quotient, k_count), remainder), shift_count));
  }
  __m128i folded = _mm_or_si128(_mm256_castsi256_si128(any), _mm256_extracti128_si256(any, 1));
  folded = _mm_or_si128(folded, _mm_shuffle_epi32(folded, 0x4E));
  folded = _mm_or_si128(folded, _mm_shuffle_epi32(folded, 0xB1));
  return std::uint32_t(_mm_cvtsi128_si32(folded));
}

/// One Rice block's k-bit remainders of z[i] >> shift (i < 32; bitpack.hpp's layout, k = 1..14)
/// eight at a time: the eight joined in pairs, then fours, by shifts within 64-bit lanes, then
/// the two fours in 64-bit words. Writes the block's 4k bytes and up to 16 - k zero bytes past
/// them, which the caller overwrites. Only where host_has_avx2().
__attribute__((target("avx2"))) inline void pack_rice_remainders_avx2(const std::uint32_t* z, int shift, int k,
                                                                     std::byte* out) {
  const __m256i mask = _mm256_set1_epi32(int((1u << k) - 1u));
  const __m256i low_halves = _mm256_set1_epi64x(0xFFFFFFFF);
  const __m128i shift_count = _mm_cvtsi32_si128(shift), k_count = _mm_cvtsi32_si128(k),
                pair_count = _mm_cvtsi32_si128(2 * k);
  const int four = 4 * k;  // 4..56
  for (int g = 0; g < 4; ++g) {
    __m256i v = _mm256_and_si256(
        _mm256_srl_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(z + 8 * g)), shift_count), mask);
    v = _mm256_or_si256(_mm256_and_si256(v, low_halves), _mm256_sll_epi64(_mm256_srli_epi64(v, 32), k_count));
    v = _mm256_or_si256(v, _mm256_sll_epi64(_mm256_srli_si256(v, 8), pair_count));  // each half's low word
    const std::uint64_t low = std::uint64_t(_mm_cvtsi128_si64(_mm256_castsi256_si128(v)));
    const std::uint64_t high = std::uint64_t(_mm_cvtsi128_si64(_mm256_extracti128_si256(v, 1)));
    store<std::uint64_t>(out + g * k, low | (high << four));
    store<std::uint64_t>(out + g * k + 8, high >> (64 - four));
  }
}

/// out[i] = reconstruct(code_i) for i < n, code_i = code_(i-1) + unzigzag(residuals[i]) and
/// code_-1 = 0 (the delta predictor), four codes at a time: an in-register prefix sum whose
/// carry is one add and one shuffle per four values. Reads residuals up to n rounded up to 4.
template <class T>
inline void undelta_reconstruct_sse2(const std::uint32_t* residuals, int n, double step, T* out) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>);
  const __m128i one = _mm_set1_epi32(1);
  const __m128d scale = _mm_set1_pd(step);
  __m128i carry = _mm_setzero_si128();
  const auto value = [&](__m128i codes) {  // code * step + 0.0 of the low two codes
    return _mm_add_pd(_mm_mul_pd(_mm_cvtepi32_pd(codes), scale), _mm_setzero_pd());
  };
  int i = 0;
  for (; i + 4 <= n; i += 4) {
    const __m128i z = _mm_loadu_si128(reinterpret_cast<const __m128i*>(residuals + i));
    // unzigzag: (z >> 1) ^ -(z & 1), then the running sum across the four lanes.
    __m128i d = _mm_xor_si128(_mm_srli_epi32(z, 1), _mm_sub_epi32(_mm_setzero_si128(), _mm_and_si128(z, one)));
    d = _mm_add_epi32(d, _mm_slli_si128(d, 4));
    d = _mm_add_epi32(d, _mm_slli_si128(d, 8));
    d = _mm_add_epi32(d, carry);
    carry = _mm_shuffle_epi32(d, 0xFF);
    const __m128d low = value(d), high = value(_mm_shuffle_epi32(d, 0xEE));
    if constexpr (std::is_same_v<T, float>) {
      _mm_storeu_ps(out + i, _mm_movelh_ps(_mm_cvtpd_ps(low), _mm_cvtpd_ps(high)));
    } else {
      _mm_storeu_pd(out + i, low);
      _mm_storeu_pd(out + i + 2, high);
    }
  }
  std::uint32_t code = std::uint32_t(_mm_cvtsi128_si32(carry));
  for (; i < n; ++i) {
    const std::uint32_t z = residuals[i];
    code += (z >> 1) ^ (0u - (z & 1u));
    out[i] = value_codec<T>::reconstruct(double(std::int32_t(code)), step);
  }
}

}  // namespace kompress::inline v0::detail
#endif
