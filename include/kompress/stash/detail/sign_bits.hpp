#pragma once
// The sign bits of a keep_sign save: x > 0 as one bit per value, and restored values put back
// on their saved side of 0 within the same bound (docs/stash.md, "Per-save options").
//
// Layout of one stream's sign bits: the bits in 32-bit words (a multiple of 4 of them), then
// the sum and the count of the values in (0, e] (e: the stream's absolute bound) as the real
// and imaginary parts of one Kokkos::complex<double>. Restore gives a positive value that came
// back <= 0 their mean, the expected value of what the quantizer rounded to 0, rather than a
// fixed point of (0, e] that would shift every such value the same way. A stochastic save's
// rounding is unbiased already: restore gives such a value the smallest positive one, and the
// bits are stored without the sum (sign_bytes(count, false)), which restore does not read.
//
// Where every value that is not positive is +0 (a ReLU's output), the bits also say where the
// zeros are: the stash then compresses only the positive values, packed in order
// (classify_signs, pack_positives), and restore puts them back between exact zeros
// (unpack_positives).

#include <kompress/detail/host_simd.hpp>

#include <Kokkos_BitManipulation.hpp>
#include <Kokkos_Complex.hpp>
#include <Kokkos_Core.hpp>
#include <Kokkos_NumericTraits.hpp>

#include <bit>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#ifdef KOMPRESS_HOST_X86_SIMD
#include <immintrin.h>
#endif

namespace kompress::inline v0::detail {

/// Words of bits, a multiple of 4 so that the complex<double> after them (aligned to 16 bytes)
/// is: every stored range starts on 16 bytes (first_fit_allocator::alignment).
/// The bit of lane b of a word: a table, so that the loops below test and set bits with a
/// plain AND per value, which vectorises where a shift by a varying count does not (SSE2).
#define KOMPRESS_IMPL_SIGN_LANES                                                                       \
  constexpr std::uint32_t lanes[32] = {                                                             \
      1u << 0,  1u << 1,  1u << 2,  1u << 3,  1u << 4,  1u << 5,  1u << 6,  1u << 7,                \
      1u << 8,  1u << 9,  1u << 10, 1u << 11, 1u << 12, 1u << 13, 1u << 14, 1u << 15,               \
      1u << 16, 1u << 17, 1u << 18, 1u << 19, 1u << 20, 1u << 21, 1u << 22, 1u << 23,               \
      1u << 24, 1u << 25, 1u << 26, 1u << 27, 1u << 28, 1u << 29, 1u << 30, 1u << 31}

/// The set bits of a word of sign bits, on host and device. An x86-64 build for the baseline
/// instruction set (no POPCNT) would make std::popcount a call into libgcc per word, a tenth of
/// a save's time on a ReLU's output; there the bits are counted in registers (the SWAR sum).
KOKKOS_INLINE_FUNCTION int sign_popcount(std::uint32_t v) {
#if defined(__CUDA_ARCH__)
  return __popc(v);
#elif (defined(__x86_64__) || defined(__i386__)) && !defined(__POPCNT__)
  v = v - ((v >> 1) & 0x55555555u);
  v = (v & 0x33333333u) + ((v >> 2) & 0x33333333u);
  return int((((v + (v >> 4)) & 0x0F0F0F0Fu) * 0x01010101u) >> 24);
#else
  return std::popcount(v);
#endif
}

constexpr std::size_t sign_words(std::size_t count) { return ((count + 31) / 32 + 3) / 4 * 4; }
static_assert(alignof(Kokkos::complex<double>) <= 4 * sizeof(std::uint32_t));
/// Bytes of the bits of `count` values, and of the sum after them `with_sum` (a save that
/// rounds to nearest; a stochastic one's bits end with their words).
constexpr std::size_t sign_bytes(std::size_t count, bool with_sum = true) {
  return sign_words(count) * sizeof(std::uint32_t) + (with_sum ? sizeof(Kokkos::complex<double>) : 0);
}

/// x where `mask` is all ones, +0 where it is 0: a select that vectorises.
template <class T>
KOKKOS_INLINE_FUNCTION T select_bits(T x, std::uint32_t mask) {
  using bits_type = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>;
  return Kokkos::bit_cast<T>(Kokkos::bit_cast<bits_type>(x) & bits_type(0 - bits_type(mask & 1u)));
}

/// The sum of 32 values as a fixed tree of elementwise adds: it vectorises where a running sum
/// (whose order of adds the compiler must keep) does not. Overwrites `v`.
template <class T>
KOKKOS_INLINE_FUNCTION T tree_sum32(T* v) {
  for (int half = 16; half >= 1; half /= 2)
    for (int i = 0; i < half; ++i) v[i] += v[i + half];
  return v[0];
}

/// Whether ExecutionSpace runs on an x86-64 host CPU with AVX2 (the sign loops' AVX2 code).
template <class ExecutionSpace>
bool host_avx2() {
#ifdef KOMPRESS_HOST_X86_SIMD
  if constexpr (Kokkos::SpaceAccessibility<ExecutionSpace, Kokkos::HostSpace>::accessible) return host_has_avx2();
#endif
  return false;
}

/// pack_signs's loop, one word of bits per call: the bits, and the sum and count of the values
/// in (0, e] (e = `bound`).
template <class T>
struct pack_signs_words {
  const T* values;
  std::uint32_t* words;
  std::size_t count;
  double bound;

  KOKKOS_INLINE_FUNCTION void operator()(const std::size_t w, Kokkos::complex<double>& sum_count) const {
    const T e = T(bound);
    const std::size_t first = 32 * w;
    const std::size_t n = first >= count ? 0 : count - first < 32 ? count - first : 32;
    // Without branches (the signs of activations are as good as random: a mispredicted
    // branch per value costs more than the rest): bits by masks, the values in (0, e] as
    // themselves or +0 into an array summed as a fixed tree (e rounded to T may be a little
    // off: the mean only has to lie in (0, e'], which restore checks).
    KOMPRESS_IMPL_SIGN_LANES;
    std::uint32_t bits = 0, small = 0;
    T masked[32];
    const auto pack = [&](const std::size_t b) {
      const T x = values[first + b];
      const std::uint32_t positive = 0u - std::uint32_t(x > T(0));
      const std::uint32_t below = positive & (0u - std::uint32_t(x <= e));
      bits |= lanes[b] & positive;
      small |= lanes[b] & below;
      masked[b] = select_bits(x, below);
    };
    if (n == 32) {
      for (std::size_t b = 0; b < 32; ++b) pack(b);
    } else {
      for (std::size_t b = 0; b < 32; ++b) masked[b] = T(0);
      for (std::size_t b = 0; b < n; ++b) pack(b);
    }
    words[w] = bits;
    sum_count += Kokkos::complex<double>(double(tree_sum32(masked)), double(sign_popcount(small)));
  }
};

/// The bits alone (a stochastic save's).
template <class T>
struct pack_sign_bits_words {
  const T* values;
  std::uint32_t* words;
  std::size_t count;

  KOKKOS_INLINE_FUNCTION void operator()(const std::size_t w) const {
    const std::size_t first = 32 * w;
    const std::size_t n = first >= count ? 0 : count - first < 32 ? count - first : 32;
    KOMPRESS_IMPL_SIGN_LANES;
    std::uint32_t bits = 0;
    if (n == 32) {
      for (std::size_t b = 0; b < 32; ++b) bits |= lanes[b] & (0u - std::uint32_t(values[first + b] > T(0)));
    } else {
      for (std::size_t b = 0; b < n; ++b) bits |= lanes[b] & (0u - std::uint32_t(values[first + b] > T(0)));
    }
    words[w] = bits;
  }
};

#ifdef KOMPRESS_HOST_X86_SIMD
/// The same loops compiled for AVX2: eight lanes per compare and select instead of four, and
/// the tree's adds in the same order (the same sum, bit for bit).
template <class T>
struct pack_signs_words_avx2 : pack_signs_words<T> {
  __attribute__((target("avx2"), flatten)) void operator()(const std::size_t w,
                                                           Kokkos::complex<double>& sum_count) const {
    pack_signs_words<T>::operator()(w, sum_count);
  }
};
template <class T>
struct pack_sign_bits_words_avx2 : pack_sign_bits_words<T> {
  __attribute__((target("avx2"), flatten)) void operator()(const std::size_t w) const {
    pack_sign_bits_words<T>::operator()(w);
  }
};
#endif

/// Packs words[w] bit b = values[32 w + b] > 0 (NaN: 0) and reduces the sum and count of the
/// values in (0, e] into the bytes after the words, e = `bound`; without `mean_of_small` (a
/// stochastic save, whose restore does not read them) the pass only packs bits and writes
/// nothing after the words (`out` then needs sign_bytes(count, false)). `simd`: on an x86-64 host with AVX2, the loops compiled for it. Enqueued on
/// `exec`, nothing waits.
template <class T, class ExecutionSpace>
void pack_signs(const ExecutionSpace& exec, const T* values, std::size_t count, std::byte* out, double bound,
                bool mean_of_small = true, bool simd = true) {
  using memory_space = typename ExecutionSpace::memory_space;
  auto* const words = reinterpret_cast<std::uint32_t*>(out);
  const Kokkos::View<Kokkos::complex<double>, memory_space, Kokkos::MemoryUnmanaged> small_positives(
      reinterpret_cast<Kokkos::complex<double>*>(out + sign_words(count) * sizeof(std::uint32_t)));
  const Kokkos::RangePolicy<ExecutionSpace, Kokkos::IndexType<std::size_t>> policy(exec, 0, sign_words(count));
  const bool avx2 = simd && host_avx2<ExecutionSpace>();
  if (!mean_of_small) {
    const pack_sign_bits_words<T> pack{values, words, count};
#ifdef KOMPRESS_HOST_X86_SIMD
    if (avx2) Kokkos::parallel_for("kompress::stash::pack_signs: bits", policy, pack_sign_bits_words_avx2<T>{pack});
#endif
    if (!avx2) Kokkos::parallel_for("kompress::stash::pack_signs: bits", policy, pack);
    return;
  }
  const pack_signs_words<T> pack{values, words, count, bound};
  const Kokkos::Sum<Kokkos::complex<double>, memory_space> sum(small_positives);
#ifdef KOMPRESS_HOST_X86_SIMD
  if (avx2) Kokkos::parallel_reduce("kompress::stash::pack_signs", policy, pack_signs_words_avx2<T>{pack}, sum);
#endif
  if (!avx2) Kokkos::parallel_reduce("kompress::stash::pack_signs", policy, pack, sum);
}

/// What a positive value restored as x' = 0 becomes: the stream's mean of (0, e] when it lies
/// in (0, bound], else half the bound; with stochastic rounding (already unbiased), or where
/// that is no positive value of T, the smallest positive value.
template <class T>
KOKKOS_INLINE_FUNCTION T positive_at_zero(const Kokkos::complex<double>& sum_count, double bound, bool stochastic) {
  const double mean = sum_count.imag() > 0.0 ? sum_count.real() / sum_count.imag() : 0.0;
  T at_zero = T(mean > 0.0 && mean <= bound ? mean : bound * 0.5);
  if (stochastic || !(at_zero > T(0) && double(at_zero) <= bound)) at_zero = Kokkos::Experimental::denorm_min_v<T>;
  return at_zero;
}

/// What a positive value restored as x' < 0 becomes: the midpoint of (0, x' + bound], where it
/// lies, at least the smallest positive value.
template <class T>
KOKKOS_INLINE_FUNCTION T positive_below_zero(T restored, double bound) {
  const T inside = T((double(restored) + bound) * 0.5);
  return inside > T(0) ? inside : Kokkos::Experimental::denorm_min_v<T>;
}

/// apply_signs's loop, one word of bits per call.
template <class T>
struct apply_signs_words {
  const std::uint32_t* words;
  T* values;
  std::size_t count;
  double bound;
  bool stochastic;
  /// The stream's sum and count of (0, e], read per word (on a device); null where
  /// `known_at_zero` holds what it gives (on the host, worked out once: a division).
  const Kokkos::complex<double>* small_positives;
  T known_at_zero;

  KOKKOS_INLINE_FUNCTION void operator()(const std::size_t w) const {
    const std::size_t first = 32 * w;
    const std::size_t n = count - first < 32 ? count - first : 32;
    const std::uint32_t bits = words[w];
    const T at_zero = small_positives ? positive_at_zero<T>(*small_positives, bound, stochastic) : known_at_zero;
    KOMPRESS_IMPL_SIGN_LANES;
    bool below_zero = false;  // a set bit and x' < 0: rare (a block stored as a constant < 0)
    for (std::size_t b = 0; b < n; ++b) below_zero |= ((bits & lanes[b]) != 0) & (values[first + b] < T(0));
    if (below_zero) {
      for (std::size_t b = 0; b < n; ++b) {
        const T x = values[first + b];
        if (!((bits >> b) & 1u)) {
          if (x > T(0)) values[first + b] = T(0);
        } else if (x < T(0)) {  // x lies in (0, x' + bound]
          values[first + b] = positive_below_zero(x, bound);
        } else if (!(x > T(0))) {
          values[first + b] = at_zero;
        }
      }
      return;
    }
    // Without branches, as pack_signs: the value's bits, at_zero's or +0's, chosen by masks.
    using bits_type = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>;
    const bits_type zero_bits = Kokkos::bit_cast<bits_type>(at_zero);
    const auto apply = [&](const std::size_t b) {
      const T x = values[first + b];
      const bool positive = (bits & lanes[b]) != 0;
      const bool restored_positive = x > T(0);
      const bits_type up = bits_type(0) - bits_type(positive & !restored_positive);
      const bits_type keep = bits_type(0) - bits_type(positive == restored_positive);  // NaN: both false
      values[first + b] = Kokkos::bit_cast<T>((Kokkos::bit_cast<bits_type>(x) & keep) | (zero_bits & up));
    };
    if (n == 32)
      for (std::size_t b = 0; b < 32; ++b) apply(b);
    else
      for (std::size_t b = 0; b < n; ++b) apply(b);
  }
};

#ifdef KOMPRESS_HOST_X86_SIMD
/// The same loop compiled for AVX2: eight lanes per compare and select instead of four.
template <class T>
struct apply_signs_words_avx2 : apply_signs_words<T> {
  __attribute__((target("avx2"), flatten)) void operator()(const std::size_t w) const {
    apply_signs_words<T>::operator()(w);
  }
};
#endif

/// Puts every restored value x' back on the side of 0 its bit records, within `bound` of the
/// saved x when x' was: a set bit with x' <= 0 means x in (0, x' + bound], and any point of
/// that range is within x' + bound <= bound of x (for x' = 0 the stream's mean of (0, e] when
/// it lies in (0, bound], else half the bound; for x' < 0 the range's midpoint; at least the
/// smallest positive value); a clear bit with x' > 0 means x in [x' - bound, 0], and +0 is
/// within bound - x' of x. With `stochastic` rounding x' = 0 takes the smallest positive value
/// instead of the mean: the rounding was already unbiased, the mean would shift it up.
/// `simd`: on an x86-64 host with AVX2, the loop compiled for it. Enqueued on `exec`.
template <class T, class ExecutionSpace>
void apply_signs(const ExecutionSpace& exec, const std::byte* in, T* values, std::size_t count, double bound,
                 bool stochastic = false, bool simd = true) {
  const auto* const words = reinterpret_cast<const std::uint32_t*>(in);
  // A stochastic save's bits have no sum after them: nothing reads past the words.
  const auto* const small_positives =
      stochastic ? nullptr
                 : reinterpret_cast<const Kokkos::complex<double>*>(in + sign_words(count) * sizeof(std::uint32_t));
  apply_signs_words<T> apply{words, values, count, bound, stochastic, small_positives,
                             stochastic ? Kokkos::Experimental::denorm_min_v<T> : T(0)};
  const Kokkos::RangePolicy<ExecutionSpace, Kokkos::IndexType<std::size_t>> policy(exec, 0, (count + 31) / 32);
  if constexpr (Kokkos::SpaceAccessibility<ExecutionSpace, Kokkos::HostSpace>::accessible) {
    if (!stochastic) apply.known_at_zero = positive_at_zero<T>(*small_positives, bound, stochastic);
    apply.small_positives = nullptr;
  }
#ifdef KOMPRESS_HOST_X86_SIMD
  if constexpr (Kokkos::SpaceAccessibility<ExecutionSpace, Kokkos::HostSpace>::accessible) {  // host code only
    if (simd && host_avx2<ExecutionSpace>()) {
      Kokkos::parallel_for("kompress::stash::apply_signs", policy, apply_signs_words_avx2<T>{apply});
      return;
    }
  }
#endif
  (void)simd;
  Kokkos::parallel_for("kompress::stash::apply_signs", policy, apply);
}

/// What classify_signs found: how many values are positive, and whether every other value is
/// +0 (only then do the sign bits alone restore them).
struct packed_positives {
  std::size_t count = 0;
  bool others_zero = false;
};

/// classify_signs's loop, one word of bits per call: the bits, and in the sum the word's
/// count of positive values plus 2^32 if it holds a value neither positive nor +0.
template <class T>
struct classify_signs_words {
  const T* values;
  std::uint32_t* words;
  std::size_t count;

  KOKKOS_INLINE_FUNCTION void operator()(const std::size_t w, std::uint64_t& sum) const {
    using bits_type = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>;
    const std::size_t first = 32 * w;
    const std::size_t n = first >= count ? 0 : count - first < 32 ? count - first : 32;
    KOMPRESS_IMPL_SIGN_LANES;
    std::uint32_t positive = 0, other = 0;
    const auto classify = [&](const std::size_t b) {
      const T x = values[first + b];
      const std::uint32_t is_positive = 0u - std::uint32_t(x > T(0));
      positive |= lanes[b] & is_positive;
      other |= ~is_positive & (0u - std::uint32_t(Kokkos::bit_cast<bits_type>(x) != 0));
    };
    if (n == 32)
      for (std::size_t b = 0; b < 32; ++b) classify(b);
    else
      for (std::size_t b = 0; b < n; ++b) classify(b);
    words[w] = positive;
    sum += std::uint64_t(sign_popcount(positive)) + (std::uint64_t(other != 0) << 32);
  }
};

#ifdef KOMPRESS_HOST_X86_SIMD
/// The same loop compiled for AVX2.
template <class T>
struct classify_signs_words_avx2 : classify_signs_words<T> {
  __attribute__((target("avx2"), flatten)) void operator()(const std::size_t w, std::uint64_t& sum) const {
    classify_signs_words<T>::operator()(w, sum);
  }
};
#endif

/// Writes the sign bits' words of values[0, count) (pack_signs's layout, without the sum and
/// count after them: reduce_small_positives), counts the positive values and finds whether
/// every other value is +0. `count` must be below 2^32: the reduction carries the count of
/// positives in the low 32 bits and the number of words holding a value that is neither
/// positive nor +0 (negative, -0.0, NaN) in the high ones. `simd`: on an x86-64 host with
/// AVX2, the loop compiled for it. Waits for `exec`.
template <class T, class ExecutionSpace>
packed_positives classify_signs(const ExecutionSpace& exec, const T* values, std::size_t count, std::byte* signs,
                                bool simd = true) {
  const classify_signs_words<T> classify{values, reinterpret_cast<std::uint32_t*>(signs), count};
  const Kokkos::RangePolicy<ExecutionSpace, Kokkos::IndexType<std::size_t>> policy(exec, 0, sign_words(count));
  const bool avx2 = simd && host_avx2<ExecutionSpace>();
  std::uint64_t total = 0;
#ifdef KOMPRESS_HOST_X86_SIMD
  if (avx2)
    Kokkos::parallel_reduce("kompress::stash::classify_signs", policy, classify_signs_words_avx2<T>{classify}, total);
#endif
  if (!avx2) Kokkos::parallel_reduce("kompress::stash::classify_signs", policy, classify, total);
  return {std::size_t(total & 0xFFFFFFFFu), (total >> 32) == 0};
}

#ifdef KOMPRESS_HOST_X86_SIMD
/// For each byte m, the lanes of its set bits in order, one per byte of the entry (the rest 0):
/// the permutation that moves a group of 8 values' positive ones to its front.
inline constexpr auto left_pack_lanes = [] {
  struct table {
    std::uint64_t lanes[256];
  } t{};
  for (unsigned m = 0; m < 256; ++m) {
    std::uint64_t entry = 0;
    int k = 0;
    for (unsigned b = 0; b < 8; ++b)
      if (m & (1u << b)) entry |= std::uint64_t(b) << (8 * k++);
    t.lanes[m] = entry;
  }
  return t;
}();

/// pack_positives for one whole word of floats (32 values at `from`, `bits` as classify_signs
/// wrote them) on AVX2: each byte of the bits moves its positive values to the front with one
/// permute and stores 8 lanes where the next packed value goes. A store whose 8 lanes would
/// pass the word's last packed value is masked to the lanes it takes; the others' extra lanes
/// fall where a later group of the same word writes its own. So nothing is written past the
/// word's share of `to`, and the values are the portable loop's, bit for bit.
__attribute__((target("avx2"))) inline void pack_word_avx2(std::uint32_t bits, const float* from, float* to) {
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const int total = __builtin_popcount(bits);
  int at = 0;
  for (int byte = 0; byte < 4; ++byte) {
    const std::uint32_t m = (bits >> (8 * byte)) & 0xFFu;
    const int taken = __builtin_popcount(m);
    const __m256i order = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<long long>(left_pack_lanes.lanes[m])));
    const __m256 packed = _mm256_permutevar8x32_ps(_mm256_loadu_ps(from + 8 * byte), order);
    if (at + 8 <= total) _mm256_storeu_ps(to + at, packed);
    else _mm256_maskstore_ps(to + at, _mm256_cmpgt_epi32(_mm256_set1_epi32(taken), lane), packed);
    at += taken;
  }
}
#endif

/// Copies the positive values of values[0, count), in order, to out[0, P), where the sign bits
/// classify_signs wrote at `signs` say they are (out must have room for P). `simd`: for floats
/// on an AVX2 host (host_avx2), a whole word that is neither full nor empty takes
/// pack_word_avx2. Waits for `exec`.
template <class T, class ExecutionSpace>
void pack_positives(const ExecutionSpace& exec, const T* values, std::size_t count, const std::byte* signs, T* out,
                    bool simd = true) {
  [[maybe_unused]] const bool avx2 = std::is_same_v<T, float> && simd && host_avx2<ExecutionSpace>();
  [[maybe_unused]] constexpr bool host = Kokkos::SpaceAccessibility<ExecutionSpace, Kokkos::HostSpace>::accessible;
  const auto* const words = reinterpret_cast<const std::uint32_t*>(signs);
  Kokkos::parallel_scan(
      "kompress::stash::pack_positives",
      Kokkos::RangePolicy<ExecutionSpace, Kokkos::IndexType<std::size_t>>(exec, 0, sign_words(count)),
      KOKKOS_LAMBDA(const std::size_t w, std::size_t& prefix, const bool final) {
        const std::uint32_t positive = words[w];
        if (final && positive != 0) {
          // A word of positive values only is a copy. Otherwise, without a branch per value:
          // each value is written where the next positive one goes and the cursor moves on
          // under a set bit, up to the last positive value only, so nothing is written past
          // this word's share of `out`.
          const std::size_t first = 32 * w;
          const int last = 31 - Kokkos::Experimental::countl_zero_builtin(positive);
          T* const to = out + prefix;
          bool done = false;
#ifdef KOMPRESS_HOST_X86_SIMD
          if constexpr (std::is_same_v<T, float> && host) {  // host code only
            if (avx2 && positive != ~0u && first + 32 <= count) {
              pack_word_avx2(positive, values + first, to);
              done = true;
            }
          }
#endif
          if (done) {
          } else if (positive == ~0u) {
            for (std::size_t b = 0; b < 32; ++b) to[b] = values[first + b];
          } else {
            std::size_t k = 0;
            for (int b = 0; b <= last; ++b) {
              to[k] = values[first + b];
              k += (positive >> b) & 1u;
            }
          }
        }
        prefix += std::size_t(sign_popcount(positive));
      });
  exec.fence("kompress::stash::pack_positives: packed");
}

/// Where a packed piece of the values classify_signs found ends so that it holds at most `cap`
/// positive values: the largest multiple of 128 values (four words of bits: the piece's bits
/// are the first words of the segment's, in sign_words's layout) whose prefix holds at most
/// `cap`, and that prefix's count; `count` and all of its positive values when they are at most
/// `cap`. Waits for `exec`.
struct positives_cut {
  std::size_t values = 0;
  std::size_t positives = 0;
};
template <class ExecutionSpace>
positives_cut cut_positives(const ExecutionSpace& exec, std::byte* signs, std::size_t count, std::size_t cap) {
  using memory_space = typename ExecutionSpace::memory_space;
  using found_view = Kokkos::View<std::uint64_t[2], memory_space, Kokkos::MemoryUnmanaged>;
  const auto* const words = reinterpret_cast<const std::uint32_t*>(signs);
  const std::size_t groups = sign_words(count) / 4;
  // [0]: the first group whose end holds more than `cap` (`groups` if none), [1]: the positive
  // values before it; one group crosses the cap, so one writer. Written where the bits' sum
  // and count go later (reduce_small_positives): the stash allocates nothing per save.
  const found_view found(reinterpret_cast<std::uint64_t*>(signs + sign_words(count) * sizeof(std::uint32_t)));
  // Set by a kernel of one thread, not deep_copy(exec, found, value): Kokkos's fill is what
  // nvcc 13 miscompiles without the layout definitions (docs/gpu.md, "nvcc 13 and Kokkos's
  // Views"), and one launch either way.
  Kokkos::parallel_for(
      "kompress::stash::cut_positives_reset", Kokkos::RangePolicy<ExecutionSpace>(exec, 0, 1),
      KOKKOS_LAMBDA(int) { found(0) = found(1) = groups; });
  std::size_t total = 0;
  Kokkos::parallel_scan(
      "kompress::stash::cut_positives",
      Kokkos::RangePolicy<ExecutionSpace, Kokkos::IndexType<std::size_t>>(exec, 0, groups),
      KOKKOS_LAMBDA(const std::size_t g, std::size_t& prefix, const bool final) {
        std::size_t here = 0;
        for (std::size_t w = 4 * g; w < 4 * g + 4; ++w)
          here += std::size_t(sign_popcount(words[w]));
        if (final && prefix <= cap && prefix + here > cap) {
          found(0) = g;
          found(1) = prefix;
        }
        prefix += here;
      },
      total);
  std::uint64_t at[2];
  Kokkos::deep_copy(exec, Kokkos::View<std::uint64_t[2], Kokkos::HostSpace, Kokkos::MemoryUnmanaged>(at), found);
  exec.fence("kompress::stash::cut_positives: the cut read");
  if (at[0] == groups) return {count, total};
  return {std::size_t(128 * at[0]), std::size_t(at[1])};
}

/// pack_signs's sum and count of the values in (0, bound], from the positive values alone
/// (packed[0, positives), pack_positives's output), into the sign bits of `count` values at
/// `signs`; zeros without `mean_of_small`, as pack_signs. Enqueued on `exec`.
template <class T, class ExecutionSpace>
void reduce_small_positives(const ExecutionSpace& exec, const T* packed, std::size_t positives, std::byte* signs,
                            std::size_t count, double bound, bool mean_of_small = true) {
  using memory_space = typename ExecutionSpace::memory_space;
  const Kokkos::View<Kokkos::complex<double>, memory_space, Kokkos::MemoryUnmanaged> small_positives(
      reinterpret_cast<Kokkos::complex<double>*>(signs + sign_words(count) * sizeof(std::uint32_t)));
  if (positives == 0 || !mean_of_small) {  // a kernel, not deep_copy: see cut_positives
    Kokkos::parallel_for(
        "kompress::stash::no_small_positives", Kokkos::RangePolicy<ExecutionSpace>(exec, 0, 1),
        KOKKOS_LAMBDA(int) { small_positives() = Kokkos::complex<double>(0.0, 0.0); });
    return;
  }
  Kokkos::parallel_reduce(
      "kompress::stash::reduce_small_positives",
      Kokkos::RangePolicy<ExecutionSpace, Kokkos::IndexType<std::size_t>>(exec, 0, (positives + 31) / 32),
      KOKKOS_LAMBDA(const std::size_t g, Kokkos::complex<double>& sum_count) {
        const T e = T(bound);
        const std::size_t first = 32 * g;
        const std::size_t n = positives - first < 32 ? positives - first : 32;
        KOMPRESS_IMPL_SIGN_LANES;
        std::uint32_t small = 0;
        T masked[32];
        const auto add = [&](const std::size_t i) {
          const T x = packed[first + i];
          const std::uint32_t below = 0u - std::uint32_t(x <= e);
          small |= lanes[i] & below;
          masked[i] = select_bits(x, below);
        };
        if (n == 32) {
          for (std::size_t i = 0; i < 32; ++i) add(i);
        } else {
          for (std::size_t i = 0; i < 32; ++i) masked[i] = T(0);
          for (std::size_t i = 0; i < n; ++i) add(i);
        }
        sum_count += Kokkos::complex<double>(double(tree_sum32(masked)),
                                             double(sign_popcount(small)));
      },
      Kokkos::Sum<Kokkos::complex<double>, memory_space>(small_positives));
}

#ifdef KOMPRESS_HOST_X86_SIMD
/// unpack_positives for one whole word of floats on AVX2: each byte of the bits takes its
/// packed values with one masked load (no lane past them is read) and one permute that sends
/// the k-th of them to the k-th set lane; the fix-up is a compare and a blend. Returns whether
/// a packed value was < 0 (the caller then redoes those lanes). The same values as the
/// portable loop, bit for bit.
__attribute__((target("avx2"))) inline bool unpack_word_avx2(std::uint32_t bits, const float* from, float* to,
                                                              float at_zero) {
  const __m256i lane_bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256 zero = _mm256_setzero_ps(), fill = _mm256_set1_ps(at_zero);
  __m256 below = zero;
  for (int byte = 0; byte < 4; ++byte) {
    const std::uint32_t m = (bits >> (8 * byte)) & 0xFFu;
    const int taken = __builtin_popcount(m);
    // Byte b of `set` is bit b of m; byte b of `index` the number of set bits below b.
    const std::uint64_t set =
        ((((m * 0x0101010101010101ull) & 0x8040201008040201ull) + 0x7F7F7F7F7F7F7F7Full) >> 7) &
        0x0101010101010101ull;
    const std::uint64_t index = (set * 0x0101010101010101ull) << 8;
    const __m256i is_set = _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32(int(m)), lane_bit), lane_bit);
    const __m256 next = _mm256_maskload_ps(from, _mm256_cmpgt_epi32(_mm256_set1_epi32(taken), lane));
    const __m256 x =
        _mm256_permutevar8x32_ps(next, _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<long long>(index))));
    const __m256 kept = _mm256_blendv_ps(fill, x, _mm256_cmp_ps(x, zero, _CMP_GT_OQ));
    below = _mm256_or_ps(below, _mm256_and_ps(_mm256_cmp_ps(x, zero, _CMP_LT_OQ), _mm256_castsi256_ps(is_set)));
    _mm256_storeu_ps(to + 8 * byte, _mm256_and_ps(kept, _mm256_castsi256_ps(is_set)));
    from += taken;
  }
  return _mm256_movemask_ps(below) != 0;
}
#endif


/// The lanes of a word whose packed value was restored below 0 (rare: a block stored as a
/// constant < 0), put back above it as apply_signs does. `from`: the word's first packed value.
template <class T>
KOKKOS_INLINE_FUNCTION void redo_below_zero(std::uint32_t bits, const T* from, T* to, double bound) {
  for (std::uint32_t left = bits; left != 0; left &= left - 1) {
    const T x = *from++;
    if (x < T(0)) to[Kokkos::Experimental::countr_zero_builtin(left)] = positive_below_zero(x, bound);
  }
}

/// The inverse of pack_positives given the sign bits packed from the same values, with
/// apply_signs's fix-up: values[i] = the next of `packed` where bit i is set (put back above 0
/// as apply_signs does when it was restored <= 0), +0 where it is clear. `packed` holds the P
/// restored positive values. `simd`: for floats on an AVX2 host (host_avx2), a word that is
/// neither full, empty nor the last takes unpack_word_avx2. Enqueued on `exec`.
template <class T, class ExecutionSpace>
void unpack_positives(const ExecutionSpace& exec, const std::byte* signs, const T* packed, T* values,
                      std::size_t count, double bound, bool stochastic, bool simd = true) {
  [[maybe_unused]] const bool avx2 = std::is_same_v<T, float> && simd && host_avx2<ExecutionSpace>();
  const auto* const words = reinterpret_cast<const std::uint32_t*>(signs);
  const auto* const small_positives =
      reinterpret_cast<const Kokkos::complex<double>*>(signs + sign_words(count) * sizeof(std::uint32_t));
  // On the host, what a positive value restored as 0 becomes is worked out once here rather
  // than per word (a division); a device reads the mean where it lies. A stochastic save's bits
  // have no sum after them: nothing reads past the words.
  constexpr bool host = Kokkos::SpaceAccessibility<ExecutionSpace, Kokkos::HostSpace>::accessible;
  T host_at_zero = Kokkos::Experimental::denorm_min_v<T>;
  if constexpr (host)
    if (!stochastic) host_at_zero = positive_at_zero<T>(*small_positives, bound, stochastic);
  Kokkos::parallel_scan(
      "kompress::stash::unpack_positives",
      Kokkos::RangePolicy<ExecutionSpace, Kokkos::IndexType<std::size_t>>(exec, 0, (count + 31) / 32),
      KOKKOS_LAMBDA(const std::size_t w, std::size_t& prefix, const bool final) {
        const std::uint32_t bits = words[w];
        if (final) {
          const T at_zero =
              host || stochastic ? host_at_zero : positive_at_zero<T>(*small_positives, bound, stochastic);
          const std::size_t first = 32 * w;
          const std::size_t n = count - first < 32 ? count - first : 32;
          const T* const from = packed + prefix;
          T* const to = values + first;
          bool below_zero = false;
          bool done = false;
#ifdef KOMPRESS_HOST_X86_SIMD
          if constexpr (std::is_same_v<T, float> && host) {  // host code only
            if (avx2 && n == 32 && bits != 0 && bits != ~0u) {
              below_zero = unpack_word_avx2(bits, from, to, at_zero);
              done = true;
            }
          }
#endif
          if (done) {
          } else if (bits == ~0u) {
            // A word of positive values only (runs of them: attention, images) is a copy with
            // the fix-up as masks, which vectorises.
            using bits_type = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>;
            const bits_type zero_bits = Kokkos::bit_cast<bits_type>(at_zero);
            for (std::size_t b = 0; b < 32; ++b) {
              const T x = from[b];
              const bits_type above = bits_type(0) - bits_type(x > T(0));
              below_zero |= x < T(0);
              to[b] = Kokkos::bit_cast<T>((Kokkos::bit_cast<bits_type>(x) & above) | (zero_bits & ~above));
            }
          } else {
            // The word's values start as +0 (a loop that vectorises), then each set bit takes
            // the next packed value, one step per positive value: its lane is the lowest bit left.
            for (std::size_t b = 0; b < n; ++b) to[b] = T(0);
            std::size_t at = 0;
            for (std::uint32_t left = bits; left != 0; left &= left - 1) {
              const T x = from[at++];
              below_zero |= x < T(0);
              to[Kokkos::Experimental::countr_zero_builtin(left)] = x > T(0) ? x : at_zero;
            }
          }
          if (below_zero) redo_below_zero(bits, from, to, bound);
        }
        prefix += std::size_t(sign_popcount(bits));
      });
}

#undef KOMPRESS_IMPL_SIGN_LANES

}  // namespace kompress::inline v0::detail
