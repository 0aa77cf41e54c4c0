#pragma once
// The sign bits of a packed piece (a ReLU output's segment stored as its positive values, whose
// bits say where the zeros are) coded by the gaps between their rarer value, where one value is
// rare enough for that to be shorter (docs/stash.md, "Coded sign bits"). A ReLU output that is
// 87% positive has 0.56 bit of entropy a value; its bits, one a value, then take about 0.6.
//
// Layout of a coded range (16-byte aligned, as every stored range):
//   header, 16 bytes: u64 the number of rare bits; u32 the Rice parameter k (bits 0-4) and the
//     rare value (bit 8: 1 = the set bits are rare); u32 C, the chunks of 4096 bits;
//   u32 ends[C]: chunk c's codes end ends[c] words into the codes (a prefix sum);
//   the codes: for each chunk, its rare bits in order, each as the gap g from the one before it
//     in the chunk (from the chunk's start for its first) in Rice code: g >> k zeros, a one, then
//     the k low bits of g; bit i of the codes is bit i % 32 of their word i / 32, and a chunk's
//     codes start on a word;
//   zeros to 16 bytes, then the 16 bytes of the sum and count of (0, e] (pack_signs's layout)
//     where the save rounds to nearest; a stochastic save's range ends with the zeros.
// Chunks are coded and decoded independently, a thread each, so both run in parallel on every
// backend; decoding writes sign_bits.hpp's layout (words, then the sum) for unpack_positives.

#include <kompress/stash/detail/sign_bits.hpp>

#include <Kokkos_Core.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>

namespace kompress::inline v0::detail {

inline constexpr std::size_t sign_code_header_bytes = 16;
/// The bits are coded only where the plan expects at most this share of their size: coding
/// and decoding take a step per rare bit, which at a third of the bits rare (a ReLU output 68%
/// positive: 8% fewer bytes) halved a save's speed and a restore's; at a fifth or less they
/// save a quarter or more.
inline constexpr double sign_code_max_share = 0.8;
inline constexpr std::size_t sign_code_chunk_bits = 4096;
inline constexpr int sign_code_max_k = 24;

KOKKOS_INLINE_FUNCTION constexpr std::size_t sign_code_chunks(std::size_t count) {
  return (count + sign_code_chunk_bits - 1) / sign_code_chunk_bits;
}
/// Bytes of a coded range whose codes take `code_words` words, with the sum after them or not.
KOKKOS_INLINE_FUNCTION constexpr std::size_t sign_code_bytes(std::size_t count, std::size_t code_words,
                                                             bool with_sum = true) {
  return (sign_code_header_bytes + 4 * (sign_code_chunks(count) + code_words) + 15) / 16 * 16 +
         (with_sum ? sizeof(Kokkos::complex<double>) : 0);
}

/// What to code: the rare value, how many bits have it and the Rice parameter.
struct sign_code_plan {
  bool rare_set = false;
  std::size_t rare = 0;
  int k = 0;
  std::size_t estimate_bytes = 0;  ///< expected length of the coded range
};

/// The plan for `count` bits of which `positives` are set, from their counts alone: the gaps
/// of a rare value at density d are taken as geometric (mean (1 - d) / d), for which the bits
/// a gap takes at parameter k are 1 + k + E[g >> k] = 1 + k + q / (1 - q), q = rho^(2^k),
/// rho = 1 - d. estimate_bytes is what that predicts, plus the chunks' rounding to words.
inline sign_code_plan plan_sign_code(std::size_t count, std::size_t positives, bool with_sum = true) {
  sign_code_plan plan;
  plan.rare_set = positives <= count - positives;
  plan.rare = plan.rare_set ? positives : count - positives;
  const double rho = count > 0 ? 1.0 - double(plan.rare) / double(count) : 0.0;
  double best = HUGE_VAL;
  for (int k = 0; k <= sign_code_max_k; ++k) {
    const double q = std::pow(rho, std::ldexp(1.0, k));
    const double bits = 1.0 + k + (q < 1.0 ? q / (1.0 - q) : HUGE_VAL);
    if (bits < best) {
      best = bits;
      plan.k = k;
    }
  }
  const double words = double(plan.rare) * best / 32.0 + 0.5 * double(sign_code_chunks(count));
  plan.estimate_bytes = plan.rare == 0 ? sign_code_bytes(count, 0, with_sum)
                        : std::isfinite(words) ? sign_code_bytes(count, std::size_t(std::ceil(words)), with_sum)
                                               : std::size_t(-1);
  return plan;
}

/// The bits of a word, whose first bit is value `first_bit`, that lie below `count`.
KOKKOS_INLINE_FUNCTION std::uint32_t valid_bits(std::size_t first_bit, std::size_t count) {
  return first_bit >= count ? 0u : count - first_bit >= 32 ? ~0u : (std::uint32_t(1) << (count - first_bit)) - 1u;
}

/// The bits of `word` (its first bit value `first_bit`) that hold the rare value.
KOKKOS_INLINE_FUNCTION std::uint32_t rare_bits(std::uint32_t word, bool rare_set, std::size_t first_bit,
                                               std::size_t count) {
  return (rare_set ? word : ~word) & valid_bits(first_bit, count);
}

/// Codes the sign bits at `signs` (sign_bits.hpp's layout for `count` values, with the sum after
/// them `with_sum`) into `out` as the plan says and returns the coded range's length
/// (sign_code_bytes), unless that would not be shorter than the bits (sign_bytes(count,
/// with_sum)): then it writes only the chunk table and returns 0. `out` needs that many bytes.
/// Waits for `exec` (it reads the codes' length).
template <class ExecutionSpace>
std::size_t encode_sign_bits(const ExecutionSpace& exec, const std::byte* signs, std::size_t count,
                             const sign_code_plan& plan, std::byte* out, bool with_sum = true) {
  using policy = Kokkos::RangePolicy<ExecutionSpace, Kokkos::IndexType<std::size_t>>;
  const auto* const words = reinterpret_cast<const std::uint32_t*>(signs);
  const std::size_t chunks = sign_code_chunks(count);
  auto* const ends = reinterpret_cast<std::uint32_t*>(out + sign_code_header_bytes);
  auto* const codes = ends + chunks;
  const bool rare_set = plan.rare_set;
  const int k = plan.k;
  // The chunks' code lengths in words, then their ends (a scan over the lengths alone: a scan
  // may run its body twice): the offsets the coding writes at.
  Kokkos::parallel_for(
      "kompress::stash::sign_code_lengths", policy(exec, 0, chunks), KOKKOS_LAMBDA(const std::size_t c) {
        const std::size_t first = sign_code_chunk_bits * c;
        const std::size_t last = first + sign_code_chunk_bits < count ? first + sign_code_chunk_bits : count;
        std::size_t bits = 0, previous = first;  // the next gap counts from `previous`
        for (std::size_t w = first / 32; 32 * w < last; ++w)
          for (std::uint32_t left = rare_bits(words[w], rare_set, 32 * w, count); left != 0; left &= left - 1) {
            const std::size_t at = 32 * w + std::size_t(Kokkos::Experimental::countr_zero_builtin(left));
            bits += 1 + std::size_t(k) + ((at - previous) >> k);
            previous = at + 1;
          }
        ends[c] = std::uint32_t((bits + 31) / 32);
      });
  std::size_t total = 0;
  Kokkos::parallel_scan(
      "kompress::stash::sign_code_ends", policy(exec, 0, chunks),
      KOKKOS_LAMBDA(const std::size_t c, std::size_t& prefix, const bool final) {
        const std::size_t length = ends[c];
        prefix += length;
        if (final) ends[c] = std::uint32_t(prefix);
      },
      total);
  const std::size_t length = sign_code_bytes(count, total, with_sum);
  if (length >= sign_bytes(count, with_sum)) return 0;
  // One kernel: each chunk's codes; the first chunk's thread also writes the header, the last
  // one's the zeros after the codes and the sum.
  const std::uint64_t rare = plan.rare;
  const std::size_t codes_end = sign_code_header_bytes + 4 * (chunks + total);
  const std::size_t sum_at = with_sum ? length - sizeof(Kokkos::complex<double>) : length;
  const std::byte* const sum = signs + sign_words(count) * sizeof(std::uint32_t);
  Kokkos::parallel_for(
      "kompress::stash::sign_code", policy(exec, 0, chunks), KOKKOS_LAMBDA(const std::size_t c) {
        const std::size_t first = sign_code_chunk_bits * c;
        const std::size_t last = first + sign_code_chunk_bits < count ? first + sign_code_chunk_bits : count;
        std::uint32_t* to = codes + (c == 0 ? 0 : ends[c - 1]);
        std::uint64_t pending = 0;  // bits not yet stored, from bit 0
        int held = 0;
        const auto put = [&](std::uint64_t value, int bits) {  // bits <= 32
          pending |= value << held;
          held += bits;
          if (held >= 32) {
            *to++ = std::uint32_t(pending);
            pending >>= 32;
            held -= 32;
          }
        };
        std::size_t previous = first;
        for (std::size_t w = first / 32; 32 * w < last; ++w)
          for (std::uint32_t left = rare_bits(words[w], rare_set, 32 * w, count); left != 0; left &= left - 1) {
            const std::size_t at = 32 * w + std::size_t(Kokkos::Experimental::countr_zero_builtin(left));
            const std::size_t gap = at - previous;
            previous = at + 1;
            std::size_t zeros = gap >> k;
            const std::uint64_t one_and_low = 1u | (std::uint64_t(gap & ((std::size_t(1) << k) - 1)) << 1);
            if (zeros + 1 + std::size_t(k) <= 32) {  // the usual case: the whole code at once
              put(one_and_low << zeros, int(zeros) + 1 + k);
              continue;
            }
            for (; zeros > 0;) {
              const int run = zeros < 32 ? int(zeros) : 32;
              put(0, run);
              zeros -= std::size_t(run);
            }
            put(one_and_low, 1 + k);
          }
        if (held > 0) *to = std::uint32_t(pending);
        if (c == 0) {
          auto* const header = reinterpret_cast<std::uint32_t*>(out);
          header[0] = std::uint32_t(rare);
          header[1] = std::uint32_t(rare >> 32);
          header[2] = std::uint32_t(k) | (std::uint32_t(rare_set) << 8);
          header[3] = std::uint32_t(chunks);
        }
        if (c + 1 == chunks)
          for (std::size_t i = codes_end; i < length; ++i) out[i] = i >= sum_at ? sum[i - sum_at] : std::byte{0};
      });
  exec.fence("kompress::stash::encode_sign_bits: coded");
  return length;
}

/// Writes sign_bits.hpp's layout for `count` values (sign_bytes(count) bytes at `out`) from the
/// coded range at `coded` (encode_sign_bits's, with the sum or without: then zeros stand for
/// it). The chunk table is taken as written (ends that grow, within the range); a code that
/// would put a bit past its chunk or read past its chunk's codes ends that chunk's decoding
/// there, so codes that are not the encoder's never make it write outside `out`'s
/// sign_bytes(count). Enqueued on `exec`.
template <class ExecutionSpace>
void decode_sign_bits(const ExecutionSpace& exec, const std::byte* coded, std::size_t count, std::byte* out,
                      bool with_sum = true) {
  using policy = Kokkos::RangePolicy<ExecutionSpace, Kokkos::IndexType<std::size_t>>;
  const std::size_t chunks = sign_code_chunks(count);
  const std::size_t word_count = sign_words(count);
  auto* const words = reinterpret_cast<std::uint32_t*>(out);
  Kokkos::parallel_for(
      "kompress::stash::sign_decode", policy(exec, 0, chunks), KOKKOS_LAMBDA(const std::size_t c) {
        const auto* const header = reinterpret_cast<const std::uint32_t*>(coded);
        const int k = int(header[2] & 31u);
        const bool rare_set = (header[2] >> 8) & 1u;
        const auto* const ends = header + sign_code_header_bytes / 4;
        const std::uint32_t* from = ends + chunks + (c == 0 ? 0 : ends[c - 1]);
        const std::uint32_t* const end = ends + chunks + ends[c];
        const std::size_t first = sign_code_chunk_bits * c;
        const std::size_t last = first + sign_code_chunk_bits < count ? first + sign_code_chunk_bits : count;
        // The common value everywhere below `count` (0 past it: the layout's padding), then the
        // rare bits flipped. The last chunk also writes the padding words after it.
        const std::size_t word_end = c + 1 == chunks ? word_count : last / 32;
        for (std::size_t w = first / 32; w < word_end; ++w) words[w] = rare_set ? 0u : valid_bits(32 * w, count);
        std::uint64_t buffer = 0;  // bits read and not yet used, the next one at bit 0
        int held = 0;
        const auto refill = [&]() {
          if (held <= 32 && from < end) {
            buffer |= std::uint64_t(*from++) << held;
            held += 32;
          }
        };
        if (c + 1 == chunks) {  // the sum and count of (0, e], after the codes
          const std::size_t sum_at = sign_code_bytes(count, ends[c]) - sizeof(Kokkos::complex<double>);
          for (std::size_t i = 0; i < sizeof(Kokkos::complex<double>); ++i)
            out[word_count * sizeof(std::uint32_t) + i] = with_sum ? coded[sum_at + i] : std::byte{0};
        }
        std::size_t at = first;  // where the next gap counts from
        // The rare bits of the word being decoded, flipped in it once the codes move past it (a
        // store per word, not per bit).
        std::size_t word = first / 32;
        std::uint32_t flips = 0;
        const auto flush = [&]() { words[word] ^= flips; };
        // The next code's gap; false where the chunk's codes end.
        const auto next_gap = [&](std::size_t& gap) {
          std::size_t quotient = 0;
          for (refill(); buffer == 0; refill()) {  // zeros only: the quotient goes on (or the codes end)
            if (held == 0) return false;
            quotient += std::size_t(held);
            held = 0;
          }
          const int zeros = Kokkos::Experimental::countr_zero_builtin(buffer);
          quotient += std::size_t(zeros);
          if (quotient >= sign_code_chunk_bits) return false;  // no gap in a chunk is that long
          buffer = (buffer >> zeros) >> 1;
          held -= zeros + 1;
          std::size_t low = 0;
          if (k > 0) {
            refill();
            if (held < k) return false;
            low = std::size_t(buffer & ((std::uint64_t(1) << k) - 1));
            buffer >>= k;
            held -= k;
          }
          gap = (quotient << k) | low;
          return true;
        };
        for (std::size_t gap = 0; next_gap(gap); ++at) {
          if (gap >= last - at) break;
          at += gap;
          if (at / 32 != word) {
            flush();
            word = at / 32;
            flips = 0;
          }
          flips |= std::uint32_t(1) << (at % 32);
        }
        flush();
      });
}

}  // namespace kompress::inline v0::detail
