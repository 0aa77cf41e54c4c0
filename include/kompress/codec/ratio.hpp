#pragma once
// The ratio codec (format 1.2, codec_mode::ratio): one chunk of up to ratio_chunk_values
// values in, bytes out, and back. Pure functions for host and device: no allocation, no
// dispatch; the scratch lives in a ratio_scratch the caller provides.
//
// Per chunk: quantize every value (value_codec, the fast codec's arithmetic), verify it
// against the decoder's own reconstruction, and turn the values that cannot be quantized
// within the bound (NaN, +-Inf, -0.0, the fill value, codes of 2^28 or more, failed
// verification) into exceptions: bitmaps of their positions, and the raw bits of those that
// are neither -0.0 nor the fill. Predict each integer code from its neighbours (none, the
// previous value, or a 2-D / 3-D Lorenzo predictor over the View's shape; the smallest
// estimate wins), zigzag the residuals, transpose them into bit planes (one byte = one bit of
// eight neighbouring residuals) and drop the zero bytes, recording which bytes were kept in a
// bitmap that is itself zero-eliminated, level after level; or Rice-code them in blocks of 32
// where that is smaller (residuals spread like a geometric distribution). A chunk whose coding
// would not be smaller than its raw values is stored raw. docs/format.md, "Ratio chunks", is the
// layout.

#include <kompress/codec/bitpack.hpp>
#include <kompress/codec/quantizer.hpp>
#include <kompress/codec/ratio_x86.hpp>
#include <kompress/detail/bytes.hpp>

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace kompress::inline v0::detail {

/// Values per ratio chunk (both element types): 16 KiB of floats, 32 KiB of doubles.
inline constexpr int ratio_chunk_values = 4096;
/// Codes of this magnitude or more are exceptions: residuals of the 3-D Lorenzo predictor
/// (eight codes) then stay below 2^31 and fit a 32-bit zigzag word.
inline constexpr double ratio_max_code = 0x1p28;
/// Chunk kind byte.
inline constexpr std::uint8_t ratio_chunk_raw = 0xFF;
/// Every value has one bit pattern (constant arrays under a REL bound are lossless; NaN runs).
inline constexpr std::uint8_t ratio_chunk_constant = 0xFE;
inline constexpr std::uint8_t ratio_flag_negative_zeros = 1u << 2;
inline constexpr std::uint8_t ratio_flag_fills = 1u << 3;
inline constexpr std::uint8_t ratio_flag_raw_values = 1u << 4;
/// Format 1.2: the residuals are Rice-coded instead of zero-eliminated bit planes.
inline constexpr std::uint8_t ratio_flag_rice = 1u << 5;

enum ratio_predictor : int { predict_none = 0, predict_delta = 1, predict_lorenzo2 = 2, predict_lorenzo3 = 3 };

/// The View's extents in memory order, fastest first, extents of 1 left out: `row` values per
/// row and `plane_rows` rows per plane (0 where the View has fewer dimensions). Only what fits
/// in a chunk matters: a Lorenzo predictor is offered when its farthest neighbour
/// (row + 1, or row * plane_rows + row + 1 values back) lies inside a chunk.
struct ratio_shape {
  std::uint64_t row = 0;
  std::uint64_t plane_rows = 0;
};

/// Padded length of a chunk: residuals and bitmaps cover whole 64-value blocks.
KOMPRESS_FUNCTION constexpr int ratio_padded(int n) { return (n + 63) & ~63; }

/// Scratch for one chunk (about 54 KiB): one per thread on the host.
struct ratio_scratch {
  std::int32_t codes[ratio_chunk_values];
  std::uint32_t residuals[ratio_chunk_values];
  std::uint8_t planes[4 * ratio_chunk_values];
  std::uint8_t levels[4 * ratio_chunk_values / 7 + 64];
  std::uint32_t maps[3][ratio_chunk_values / 32];
};

/// std::popcount and std::countr_zero of a nonzero word (32 and 64 bits), on host and device.
KOMPRESS_FUNCTION int popcount32(std::uint32_t v) {
#if defined(__CUDA_ARCH__)
  return __popc(v);
#else
  return std::popcount(v);
#endif
}
KOMPRESS_FUNCTION int lowest_bit(std::uint32_t v) {
#if defined(__CUDA_ARCH__)
  return __ffs(int(v)) - 1;
#else
  return std::countr_zero(v);
#endif
}

KOMPRESS_FUNCTION int popcount64(std::uint64_t v) {
#if defined(__CUDA_ARCH__)
  return __popcll(v);
#else
  return std::popcount(v);
#endif
}

KOMPRESS_FUNCTION int lowest_bit64(std::uint64_t v) {
#if defined(__CUDA_ARCH__)
  return __ffsll(static_cast<long long>(v)) - 1;
#else
  return std::countr_zero(v);
#endif
}

// ---------------------------------------------------------------------------------------------
// Zero-byte elimination: a buffer of L bytes is stored as its bitmap of nonzero bytes
// (ceil(L / 8) bytes, bit j of byte k set when byte 8k + j is nonzero), itself stored the same
// way, down to a bitmap of at most 8 bytes kept verbatim; then, level after level from the top,
// the nonzero bytes of each bitmap and finally of the buffer.

/// Level lengths: lengths[0] = L, lengths[k+1] = ceil(lengths[k] / 8), the last <= 8.
KOMPRESS_FUNCTION int zero_levels(std::uint32_t length, std::uint32_t* lengths) {
  int levels = 0;
  lengths[0] = length;
  while (lengths[levels] > 8) {
    lengths[levels + 1] = (lengths[levels] + 7) / 8;
    ++levels;
  }
  return levels;  // lengths[levels] is stored verbatim
}

/// Bitmap of the nonzero bytes of in[0, length) into out[0, ceil(length / 8)); returns the
/// number of nonzero bytes.
KOMPRESS_FUNCTION std::uint32_t nonzero_bitmap(const std::uint8_t* in, std::uint32_t length,
                                               std::uint8_t* out) {
  std::uint32_t count = 0;
  const std::uint32_t full = length / 8;
  for (std::uint32_t k = 0; k < full; ++k) {
    const std::uint64_t w = load<std::uint64_t>(reinterpret_cast<const std::byte*>(in + 8 * k));
    std::uint8_t m = 0;
    if (w) {
      // High bit of each byte set where the byte is nonzero.
      constexpr std::uint64_t low7 = 0x7F7F7F7F7F7F7F7Full;
      const std::uint64_t nonzero = (((w & low7) + low7) | w) & ~low7;
      m = static_cast<std::uint8_t>((nonzero >> 7) * 0x0102040810204080ull >> 56);
      count += std::uint32_t(popcount32(m));
    }
    out[k] = m;
  }
  if (length % 8) {
    std::uint8_t m = 0;
    for (std::uint32_t j = 0; j < length % 8; ++j) m |= std::uint8_t((in[8 * full + j] != 0) << j);
    out[full] = m;
    count += std::uint32_t(popcount32(m));
  }
  return count;
}

/// The zero-eliminated size of in[0, length), building the bitmaps into `levels` (room for
/// length / 7 + 64 bytes).
KOMPRESS_FUNCTION std::uint64_t zero_eliminated_size(const std::uint8_t* in, std::uint32_t length,
                                                     std::uint8_t* levels) {
  std::uint32_t lengths[8];
  const int top = zero_levels(length, lengths);
  std::uint64_t size = lengths[top];
  const std::uint8_t* source = in;
  std::uint8_t* bitmap = levels;
  for (int k = 0; k < top; ++k) {
    size += nonzero_bitmap(source, lengths[k], bitmap);
    source = bitmap;
    bitmap += lengths[k + 1];
  }
  return size;
}

/// Writes in[0, length) zero-eliminated, with the bitmaps zero_eliminated_size just built in
/// `levels`, to `out`, which has room for `room` bytes (at least the size); returns the bytes
/// written. A bitmap byte's kept bytes are stored with eight unconditional writes where the room
/// allows (the writes past the kept ones are overwritten next or lie beyond the chunk's end).
KOMPRESS_FUNCTION std::uint64_t write_zero_eliminated(const std::uint8_t* in, std::uint32_t length,
                                                      const std::uint8_t* levels, std::byte* out,
                                                      std::uint64_t room) {
  std::uint32_t lengths[8];
  const int top = zero_levels(length, lengths);
  const std::uint8_t* level_data[8];
  level_data[0] = in;
  const std::uint8_t* p = levels;
  for (int k = 1; k <= top; ++k) {
    level_data[k] = p;
    p += lengths[k];
  }
  std::uint64_t position = 0;
  for (std::uint32_t j = 0; j < lengths[top]; ++j) out[position++] = std::byte(level_data[top][j]);
  for (int k = top - 1; k >= 0; --k) {
    const std::uint8_t* data = level_data[k];
    const std::uint8_t* bitmap = level_data[k + 1];
    for (std::uint32_t b = 0; b < lengths[k + 1]; ++b) {
      std::uint32_t m = bitmap[b];
      if (!m) continue;
      if (position + 8 <= room && 8 * b + 8 <= lengths[k]) {
        for (std::uint32_t j = 0; j < 8; ++j) {
          out[position] = std::byte(data[8 * b + j]);
          position += (m >> j) & 1u;
        }
      } else {
        while (m) {
          const int j = lowest_bit(m);
          m &= m - 1;
          out[position++] = std::byte(data[8 * b + std::uint32_t(j)]);
        }
      }
    }
  }
  return position;
}

/// Reads a zero-eliminated buffer of `length` bytes into out, using `levels` (length / 7 + 64
/// bytes) for the bitmaps; returns the bytes consumed, or -1 if it would read past `available`
/// or a bitmap marks bytes past the buffer.
KOMPRESS_FUNCTION std::int64_t read_zero_eliminated(const std::byte* in, std::uint64_t available,
                                                    std::uint32_t length, std::uint8_t* levels,
                                                    std::uint8_t* out) {
  std::uint32_t lengths[8];
  const int top = zero_levels(length, lengths);
  std::uint8_t* level_data[8];
  level_data[0] = out;
  std::uint8_t* p = levels;
  for (int k = 1; k <= top; ++k) {
    level_data[k] = p;
    p += lengths[k];
  }
  if (available < lengths[top]) return -1;
#ifdef KOMPRESS_HOST_X86_SIMD
  const bool shuffle = host_has_ssse3();
#endif
  std::uint64_t position = 0;
  for (std::uint32_t j = 0; j < lengths[top]; ++j) level_data[top][j] = std::uint8_t(in[position++]);
  for (int k = top - 1; k >= 0; --k) {
    std::uint8_t* data = level_data[k];
    const std::uint8_t* bitmap = level_data[k + 1];
    // Nothing marked past the level's end, and every kept byte within `available`.
    const std::uint32_t full = lengths[k] / 8;
    if (lengths[k] % 8 && (bitmap[full] >> (lengths[k] % 8)) != 0) return -1;
    std::uint64_t kept = 0;
    const std::uint32_t words = lengths[k + 1] / 8;
    for (std::uint32_t w = 0; w < words; ++w)
      kept += std::uint64_t(popcount64(load<std::uint64_t>(reinterpret_cast<const std::byte*>(bitmap + 8 * w))));
    for (std::uint32_t b = 8 * words; b < lengths[k + 1]; ++b) kept += std::uint64_t(popcount32(bitmap[b]));
    if (kept > available - position) return -1;
    const std::uint64_t last = position + kept;  // one past the last kept byte
    for (std::uint32_t b = 0; b < lengths[k + 1]; ++b) {
      const std::uint32_t m = bitmap[b];
      if (b < full) {
        if (!m) {
          store<std::uint64_t>(reinterpret_cast<std::byte*>(data + 8 * b), 0);
          continue;
        }
#ifdef KOMPRESS_HOST_X86_SIMD
        if (shuffle && last - position >= 8) {  // eight bytes to load, all this level's
          store<std::uint64_t>(reinterpret_cast<std::byte*>(data + 8 * b),
                               expand_kept_bytes_ssse3(load<std::uint64_t>(in + position), m));
          position += std::uint64_t(popcount32(m));
          continue;
        }
#endif
        for (std::uint32_t j = 0; j < 8; ++j) {
          const std::uint32_t bit = (m >> j) & 1u;
          const std::uint64_t at = position < last ? position : last - 1;
          data[8 * b + j] = std::uint8_t(std::uint8_t(in[at]) & (0u - bit));
          position += bit;
        }
      } else {
        for (std::uint32_t j = 0; 8 * b + j < lengths[k]; ++j) {
          const std::uint32_t bit = (m >> j) & 1u;
          data[8 * b + j] = bit ? std::uint8_t(in[position]) : 0;
          position += bit;
        }
      }
    }
  }
  return std::int64_t(position);
}

/// The shortest well-formed chunk of n (1..ratio_chunk_values) values of `element_size` bytes,
/// the least of: a coded chunk whose residuals are all zero, as bit planes (its kind byte and
/// the top level of its planes' zero elimination, 2 to 8 bytes: 4 for a whole chunk, so 5 in
/// all) or Rice codes (kind, shift and a parameter nibble per 32 padded values: 3 bytes for up
/// to 64 values, 66 for a whole chunk), a constant chunk (1 + element_size, n >= 2) and a raw
/// one (1 + n * element_size). Every other coded chunk adds predictor parameters, maps, raw
/// values, plane bytes or Rice codes to that.
KOMPRESS_FUNCTION std::uint64_t ratio_min_chunk_bytes(std::uint64_t n, std::uint64_t element_size) {
  std::uint32_t lengths[8];
  const int padded = ratio_padded(int(n));
  const int top = zero_levels(4 * std::uint32_t(padded), lengths);
  std::uint64_t shortest = 1 + lengths[top];
  if (2 + std::uint64_t(padded / 64) < shortest) shortest = 2 + std::uint64_t(padded / 64);
  if (n >= 2 && 1 + element_size < shortest) shortest = 1 + element_size;
  if (1 + n * element_size < shortest) shortest = 1 + n * element_size;
  return shortest;
}

// ---------------------------------------------------------------------------------------------
// Exception bitmaps: bit i of word i / 32 marks value i. Stored as transitions (bit i is map
// bit i XOR map bit i - 1), so runs of exceptions (land masks) cost their two ends.

KOMPRESS_FUNCTION void to_transitions(const std::uint32_t* map, int words, std::uint8_t* out) {
  std::uint32_t carry = 0;
  for (int w = 0; w < words; ++w) {
    const std::uint32_t t = map[w] ^ ((map[w] << 1) | carry);
    carry = map[w] >> 31;
    store<std::uint32_t>(reinterpret_cast<std::byte*>(out + 4 * w), t);
  }
}

KOMPRESS_FUNCTION void from_transitions(const std::uint8_t* in, int words, std::uint32_t* map) {
  std::uint32_t carry = 0;
  for (int w = 0; w < words; ++w) {
    std::uint32_t x = load<std::uint32_t>(reinterpret_cast<const std::byte*>(in + 4 * w));
    x ^= x << 1;
    x ^= x << 2;
    x ^= x << 4;
    x ^= x << 8;
    x ^= x << 16;
    x ^= carry;
    map[w] = x;
    carry = std::uint32_t(0) - (x >> 31);
  }
}

// ---------------------------------------------------------------------------------------------
// Prediction on integer codes (wrapping 32-bit arithmetic: exact for the codes the encoder
// writes, |q| < 2^28, and harmless on a corrupted stream).

struct ratio_geometry {
  int predictor = predict_none;
  std::uint32_t row = 0;         // values per row (Lorenzo)
  std::uint32_t plane_rows = 0;  // rows per plane (3-D Lorenzo)
};

KOMPRESS_FUNCTION std::uint32_t zigzag32(std::uint32_t d) {
  return (d << 1) ^ std::uint32_t(std::int32_t(d) >> 31);
}
KOMPRESS_FUNCTION std::uint32_t unzigzag32(std::uint32_t z) {
  return (z >> 1) ^ (std::uint32_t(0) - (z & 1));
}

/// The Lorenzo predictors' neighbour terms (bit t of a `present` mask for term t): the left,
/// upper and back neighbours and their corners, at offsets 1, r, p, r + 1, p + 1, p + r and
/// p + r + 1 values back (r values a row, p a plane), added with signs + + + - - - +. The 2-D
/// predictor has the first, second and fourth.
enum lorenzo_term : int {
  term_left,
  term_up,
  term_back,
  term_up_left,
  term_back_left,
  term_back_up,
  term_back_up_left,
};
inline constexpr unsigned lorenzo2_terms = (1u << term_left) | (1u << term_up) | (1u << term_up_left);
inline constexpr unsigned lorenzo3_terms = 0x7Fu;

/// The terms value i of a chunk has: those inside the chunk (i at least their offset), in the
/// value's row (`has_x`: not its row's first value) and, for the 3-D predictor, in its plane
/// (`has_y`: not its plane's first row). A neighbour before the chunk's first value, across a
/// row's start or across a plane's first row counts as 0.
KOMPRESS_FUNCTION unsigned lorenzo_terms(int i, bool has_x, bool has_y, const ratio_geometry& g) {
  const int r = int(g.row);
  unsigned present = 0;
  if (has_x && i >= 1) present |= 1u << term_left;
  if (g.predictor == predict_lorenzo2) {
    if (i >= r) present |= 1u << term_up;
    if (has_x && i >= r + 1) present |= 1u << term_up_left;
    return present;
  }
  const int p = int(g.row * g.plane_rows);
  if (has_y && i >= r) present |= 1u << term_up;
  if (i >= p) present |= 1u << term_back;
  if (has_x && has_y && i >= r + 1) present |= 1u << term_up_left;
  if (has_x && i >= p + 1) present |= 1u << term_back_left;
  if (has_y && i >= p + r) present |= 1u << term_back_up;
  if (has_x && has_y && i >= p + r + 1) present |= 1u << term_back_up_left;
  return present;
}

/// Walks the chunk's values in runs [lo, hi) over which the same Lorenzo terms are present:
/// run(lo, hi, present). A row's first value is a run of its own, and the rest of a row is cut
/// where a term's offset is reached (only in the chunk's first p + r + 1 values), so that
/// boundary values take a loop as plain as the interior's instead of a test per term and value.
template <class Run>
KOMPRESS_FUNCTION void walk_runs(std::uint64_t first, int n, const ratio_geometry& g, Run&& run) {
  const int r = int(g.row);
  const bool three = g.predictor == predict_lorenzo3;
  const int p = three ? int(g.row * g.plane_rows) : 0;
  const int offsets[7] = {1, r, r + 1, p, p + 1, p + r, p + r + 1};
  const int offset_count = three ? 7 : 3;
  std::uint32_t x = std::uint32_t(first % g.row);
  std::uint32_t y = three ? std::uint32_t((first / g.row) % g.plane_rows) : 1u;
  int a = 0;
  while (a < n) {
    const int b = a + int(g.row - x) < n ? a + int(g.row - x) : n;
    const bool has_y = !three || y > 0;
    int lo = a;
    if (x == 0) {
      run(a, a + 1, lorenzo_terms(a, false, has_y, g));
      ++lo;
    }
    while (lo < b) {
      int hi = b;
      for (int k = 0; k < offset_count; ++k)
        if (offsets[k] > lo && offsets[k] < hi) hi = offsets[k];
      run(lo, hi, lorenzo_terms(lo, true, has_y, g));
      lo = hi;
    }
    a = b;
    x = 0;
    if (three && ++y == g.plane_rows) y = 0;
  }
}

/// One run's terms as offsets and masks: a present term is read at its offset and kept, an
/// absent one reads the value one back (inside the chunk for a run that does not start it) and
/// is masked to 0, so the loop over the run has no branch.
struct lorenzo_run {
  int offset[7];
  std::uint32_t mask[7];

  KOMPRESS_FUNCTION lorenzo_run(const ratio_geometry& g, unsigned present) {
    const int r = int(g.row), p = int(g.row * g.plane_rows);
    const int offsets[7] = {1, r, p, r + 1, p + 1, p + r, p + r + 1};
    for (int t = 0; t < 7; ++t) {
      const bool on = ((present >> t) & 1u) != 0;
      offset[t] = on ? offsets[t] : 1;
      mask[t] = on ? ~std::uint32_t(0) : 0u;
    }
  }

  /// The prediction of u[i] less its left neighbour's term.
  KOMPRESS_FUNCTION std::uint32_t above(const std::uint32_t* u, int i) const {
    return (u[i - offset[term_up]] & mask[term_up]) + (u[i - offset[term_back]] & mask[term_back]) -
           (u[i - offset[term_up_left]] & mask[term_up_left]) -
           (u[i - offset[term_back_left]] & mask[term_back_left]) -
           (u[i - offset[term_back_up]] & mask[term_back_up]) +
           (u[i - offset[term_back_up_left]] & mask[term_back_up_left]);
  }
};

/// Residuals of codes[0, n) under `g` into out[0, n); returns the estimated zero-eliminated
/// size: the nonzero bit-plane bytes, sum over 8-value groups of popcount(OR of the group).
KOMPRESS_FUNCTION std::uint64_t ratio_residuals(const std::int32_t* q, int n, std::uint64_t first,
                                                const ratio_geometry& g, std::uint32_t* out) {
  if (g.predictor == predict_none) {
    for (int i = 0; i < n; ++i) out[i] = zigzag32(std::uint32_t(q[i]));
  } else if (g.predictor == predict_delta) {
    out[0] = zigzag32(std::uint32_t(q[0]));
    for (int i = 1; i < n; ++i) out[i] = zigzag32(std::uint32_t(q[i]) - std::uint32_t(q[i - 1]));
  } else {
    const int r = int(g.row), p = int(g.row * g.plane_rows);
    const auto* u = reinterpret_cast<const std::uint32_t*>(q);
    const auto boundary = [&](int lo, int hi, unsigned present) {
      if (lo == 0) {  // the chunk's first value: no neighbour
        out[0] = zigzag32(u[0]);
        return;
      }
      const lorenzo_run run(g, present);
      for (int i = lo; i < hi; ++i) out[i] = zigzag32(u[i] - ((u[i - 1] & run.mask[term_left]) + run.above(u, i)));
    };
    const auto planar = [&](int lo, int hi) {
      for (int i = lo; i < hi; ++i) out[i] = zigzag32(u[i] - (u[i - 1] + u[i - r] - u[i - r - 1]));
    };
    if (g.predictor == predict_lorenzo2) {
      walk_runs(first, n, g, [&](int lo, int hi, unsigned present) {
        if (present != lorenzo2_terms) return boundary(lo, hi, present);
        planar(lo, hi);
      });
    } else {
      walk_runs(first, n, g, [&](int lo, int hi, unsigned present) {
        // A chunk's first plane: no back terms, the 2-D predictor's.
        if (present == lorenzo2_terms) return planar(lo, hi);
        if (present != lorenzo3_terms) return boundary(lo, hi, present);
        for (int i = lo; i < hi; ++i)
          out[i] = zigzag32(u[i] - (u[i - 1] + u[i - r] + u[i - p] - u[i - r - 1] - u[i - p - 1] -
                                    u[i - p - r] + u[i - p - r - 1]));
      });
    }
  }
  std::uint64_t estimate = 0;
  for (int k = 0; k < n / 8; ++k) {
    std::uint32_t o = 0;
    for (int j = 0; j < 8; ++j) o |= out[8 * k + j];
    estimate += std::uint64_t(popcount32(o));
  }
  std::uint32_t o = 0;
  for (int i = n / 8 * 8; i < n; ++i) o |= out[i];
  return estimate + std::uint64_t(popcount32(o));
}

/// The nonzero bytes of the bit planes' first bitmap (zero_eliminated_size's second level):
/// byte j covers one plane's 8 bytes, that is one bit of 64 residuals, so it is the sum over
/// 64-residual groups of popcount(OR of the group).
KOMPRESS_FUNCTION std::uint64_t plane_bitmap_bytes(const std::uint32_t* residuals, int padded) {
  std::uint64_t bytes = 0;
  for (int g = 0; g < padded; g += 64) {
    std::uint32_t o = 0;
    for (int i = 0; i < 64; ++i) o |= residuals[g + i];
    bytes += std::uint64_t(popcount32(o));
  }
  return bytes;
}

/// Codes q[0, n) back from their Lorenzo residuals r[0, n) (the inverse of ratio_residuals).
/// A run lies in one row: its upper and back neighbours are decoded before it, so their terms
/// are summed for the whole run first (a loop without a dependency, which vectorizes), then the
/// left neighbours' running sum along the row.
KOMPRESS_FUNCTION void lorenzo_codes(const std::uint32_t* r, int n, std::uint64_t first, const ratio_geometry& g,
                                     std::int32_t* q) {
  const int w = int(g.row), p = int(g.row * g.plane_rows);
  auto* u = reinterpret_cast<std::uint32_t*>(q);
  const auto boundary = [&](int lo, int hi, unsigned present) {
    if (lo == 0) {  // the chunk's first value: no neighbour
      u[0] = unzigzag32(r[0]);
      return;
    }
    const lorenzo_run run(g, present);
    std::uint32_t left = u[lo - 1] & run.mask[term_left];
    for (int i = lo; i < hi; ++i) {
      left += run.above(u, i) + unzigzag32(r[i]);
      u[i] = left;
    }
  };
  const auto running_sum = [&](int lo, int hi) {
    std::uint32_t left = u[lo - 1];
    for (int i = lo; i < hi; ++i) {
      left += u[i];
      u[i] = left;
    }
  };
  const auto planar = [&](int lo, int hi) {
    for (int i = lo; i < hi; ++i) u[i] = u[i - w] - u[i - w - 1] + unzigzag32(r[i]);
    running_sum(lo, hi);
  };
  if (g.predictor == predict_lorenzo2) {
    walk_runs(first, n, g, [&](int lo, int hi, unsigned present) {
      if (present != lorenzo2_terms) return boundary(lo, hi, present);
      planar(lo, hi);
    });
  } else {
    walk_runs(first, n, g, [&](int lo, int hi, unsigned present) {
      // A chunk's first plane: no back terms, the 2-D predictor's.
      if (present == lorenzo2_terms) return planar(lo, hi);
      if (present != lorenzo3_terms) return boundary(lo, hi, present);
      for (int i = lo; i < hi; ++i)
        u[i] = u[i - w] + u[i - p] - u[i - w - 1] - u[i - p - 1] - u[i - p - w] + u[i - p - w - 1] +
               unzigzag32(r[i]);
      running_sum(lo, hi);
    });
  }
}

/// Transposes, in each of the 8 byte lanes independently, the 8x8 bit matrix whose row i is
/// that byte of w[i] (bit j = column j): afterwards bit j of byte k of w[i] is what bit i of
/// byte k of w[j] was. Three rounds of block swaps (Hacker's Delight 7-3, across words).
KOMPRESS_FUNCTION void transpose_lanes(std::uint64_t* w) {
  constexpr std::uint64_t m4 = 0x0F0F0F0F0F0F0F0Full, m2 = 0x3333333333333333ull,
                          m1 = 0x5555555555555555ull;
  for (int i = 0; i < 4; ++i) {
    const std::uint64_t t = ((w[i] >> 4) ^ w[i + 4]) & m4;
    w[i + 4] ^= t;
    w[i] ^= t << 4;
  }
  for (int a = 0; a < 4; ++a) {
    const int i = (a & 1) | ((a & 2) << 1);  // 0, 1, 4, 5
    const std::uint64_t t = ((w[i] >> 2) ^ w[i + 2]) & m2;
    w[i + 2] ^= t;
    w[i] ^= t << 2;
  }
  for (int a = 0; a < 4; ++a) {
    const int i = 2 * a;
    const std::uint64_t t = ((w[i] >> 1) ^ w[i + 1]) & m1;
    w[i + 1] ^= t;
    w[i] ^= t << 1;
  }
}

/// Bit planes of residuals[0, padded) (padded a multiple of 64): byte p * (padded / 8) + k
/// holds bit p of residuals 8k .. 8k + 7 (bit j = residual 8k + j). `planes` has 4 * padded
/// bytes. Per 64 residuals and byte slice (planes 8b .. 8b + 7) holding a set bit: gather the
/// slice's bytes into 8 words (word j, byte k: residual 8k + j), transpose the lanes, and each
/// word is a plane's 8 bytes.
KOMPRESS_FUNCTION void to_bit_planes(const std::uint32_t* residuals, int padded, std::uint8_t* planes) {
  const int groups = padded / 8;
  for (int b = 0; b < 4 * padded; ++b) planes[b] = 0;
  for (int block = 0; block < padded / 64; ++block) {
    const std::uint32_t* r = residuals + 64 * block;
    std::uint32_t o = 0;
    for (int i = 0; i < 64; ++i) o |= r[i];
    const int slices = (bit_width(o) + 7) / 8;
    for (int b = 0; b < slices; ++b) {
      std::uint64_t w[8];
      for (int j = 0; j < 8; ++j) {
        std::uint64_t x = 0;
        for (int k = 0; k < 8; ++k) x |= std::uint64_t((r[8 * k + j] >> (8 * b)) & 0xFFu) << (8 * k);
        w[j] = x;
      }
      transpose_lanes(w);
      for (int p = 0; p < 8; ++p)
        store<std::uint64_t>(reinterpret_cast<std::byte*>(planes + (8 * b + p) * groups + 8 * block), w[p]);
    }
  }
}

KOMPRESS_FUNCTION void from_bit_planes(const std::uint8_t* planes, int padded, std::uint32_t* residuals) {
  const int groups = padded / 8;
  // Byte slices holding any set bit, over the whole chunk.
  int slices = 0;
  for (int b = 0; b < 4; ++b) {
    std::uint64_t any = 0;
    const std::uint8_t* slice = planes + 8 * b * groups;
    for (int i = 0; i < groups; ++i) any |= load<std::uint64_t>(reinterpret_cast<const std::byte*>(slice + 8 * i));
    if (any) slices = b + 1;
  }
  for (int i = 0; i < padded; ++i) residuals[i] = 0;
  for (int block = 0; block < padded / 64; ++block) {
    std::uint32_t* r = residuals + 64 * block;
    for (int b = 0; b < slices; ++b) {
      std::uint64_t w[8], any = 0;
      for (int p = 0; p < 8; ++p) {
        w[p] = load<std::uint64_t>(reinterpret_cast<const std::byte*>(planes + (8 * b + p) * groups + 8 * block));
        any |= w[p];
      }
      if (!any) continue;
      transpose_lanes(w);  // word j, byte k: byte b of residual 8k + j
      for (int j = 0; j < 8; ++j)
        for (int k = 0; k < 8; ++k) r[8 * k + j] |= std::uint32_t((w[j] >> (8 * k)) & 0xFFu) << (8 * b);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Rice-coded residuals (format 1.2, kind bit 5; docs/format.md, "Rice residuals"): a shift
// common to all residuals, a parameter k per block of 32 (15: all zero), the blocks' k-bit
// remainders, then every quotient in unary (zeros ended by a one) in one bit string.

inline constexpr int rice_block = 32;
inline constexpr std::uint8_t rice_zero_block = 15;
inline constexpr int rice_max_parameter = 14;

/// Parameters of every block of residuals[0, padded) into `parameters` (padded / 32 entries);
/// returns the Rice section's length in bytes. A block's parameter is rice_zero_block if all its
/// z = residual >> shift are 0, else the smallest k <= rice_max_parameter minimising its
/// 32 k + S(k) bits, S(k) = sum(z >> k). The cost falls from k to k + 1 by
/// D(k) - 32, D(k) = S(k) - S(k + 1) = sum(ceil((z >> k) / 2)), which does not grow with k: the
/// first k where D(k) <= 32 is the minimum. The search starts at the previous block's k (blocks
/// of a chunk are alike), each step one more S over the block's 32 values.
KOMPRESS_FUNCTION std::uint64_t rice_size(const std::uint32_t* residuals, int padded, int shift,
                                          std::uint8_t* parameters) {
  const int blocks = padded / rice_block;
  std::uint64_t remainder_bytes = 0, quotient_bits = 0;
  int guess = 0;
  for (int b = 0; b < blocks; ++b) {
    const std::uint32_t* const r = residuals + rice_block * b;
    std::uint32_t any = 0;
    for (int i = 0; i < rice_block; ++i) any |= r[i];
    if (any == 0) {  // every z is 0 (and only then: the shift drops zero bits only)
      parameters[b] = rice_zero_block;
      continue;
    }
    // S(k); in 32 bits where the block's z are below 2^27 (nearly always), so that it vectorizes
    // without widening.
    const bool narrow = (any >> shift) < (std::uint32_t(1) << 27);
    const auto sum = [&](int k) {
      if (narrow) {
        std::uint32_t s = 0;
        for (int i = 0; i < rice_block; ++i) s += (r[i] >> shift) >> k;
        return std::uint64_t(s);
      }
      std::uint64_t s = 0;
      for (int i = 0; i < rice_block; ++i) s += (r[i] >> shift) >> k;
      return s;
    };
    int k = guess;
    std::uint64_t at_k = sum(k), above = sum(k + 1);  // S(k), S(k + 1)
    if (at_k - above <= std::uint64_t(rice_block)) {
      while (k > 0) {  // down while the step below still does not pay
        const std::uint64_t below = sum(k - 1);
        if (below - at_k > std::uint64_t(rice_block)) break;
        above = at_k;
        at_k = below;
        --k;
      }
    } else {
      while (k < rice_max_parameter && at_k - above > std::uint64_t(rice_block)) {
        ++k;
        at_k = above;
        above = sum(k + 1);
      }
    }
    guess = k;
    parameters[b] = std::uint8_t(k);
    remainder_bytes += std::uint64_t(k) * (rice_block / 8);
    quotient_bits += at_k + std::uint64_t(rice_block);
  }
  return 1 + std::uint64_t(blocks / 2) + remainder_bytes + (quotient_bits + 7) / 8;
}

/// Writes the Rice section of residuals[0, padded) with the parameters rice_size chose; returns
/// its length.
KOMPRESS_FUNCTION std::uint64_t write_rice(const std::uint32_t* residuals, int padded, int shift,
                                           const std::uint8_t* parameters, std::byte* out) {
  const int blocks = padded / rice_block;
  std::uint64_t position = 0;
  out[position++] = std::byte(shift);
  for (int b = 0; b < blocks; b += 2)
    out[position++] = std::byte(std::uint8_t(parameters[b] | (parameters[b + 1] << 4)));
#ifdef KOMPRESS_HOST_X86_SIMD
  const bool avx2 = host_has_avx2();
  int coded = 0;
  for (int b = 0; b < blocks && coded < 4; ++b) coded += parameters[b] != rice_zero_block;
  // The vector packing writes up to 16 bytes past a block's remainders, which what follows
  // overwrites: inside the section once four blocks are coded (their quotients take 16 bytes).
  const bool pack_avx2 = avx2 && coded >= 4;
#endif
  for (int b = 0; b < blocks; ++b) {
    const int k = parameters[b];
    if (k == rice_zero_block) continue;
#ifdef KOMPRESS_HOST_X86_SIMD
    if (pack_avx2 && k > 0) {
      pack_rice_remainders_avx2(residuals + rice_block * b, shift, k, out + position);
      position += std::uint64_t(k) * (rice_block / 8);
      continue;
    }
#endif
    std::uint32_t low[rice_block];
    for (int i = 0; i < rice_block; ++i) low[i] = (residuals[rice_block * b + i] >> shift) & ((1u << k) - 1u);
    pack<rice_block>(k, low, out + position);
    position += std::uint64_t(k) * (rice_block / 8);
  }
  // The quotients: a 64-bit accumulator of `used` (< 64) bits, stored whole when it fills, the
  // rest byte by byte at the end. Eight quotients go in at once where their codes fit a word
  // together (nearly always: the parameter keeps quotients near 1): the positions of their ones
  // are a running sum, independent of the accumulator, so the loop carries one add and one
  // branch per eight values instead of per value.
  std::uint64_t word = 0;
  std::uint64_t used = 0;
  const auto append_one = [&](std::uint64_t length) {  // any length >= 1, one value's code
    std::uint64_t next = used + length;
    while (next > 64) {
      store<std::uint64_t>(out + position, word);
      position += 8;
      word = 0;
      next -= 64;
    }
    word |= std::uint64_t(1) << (next - 1);
    used = next;
    if (used == 64) {
      store<std::uint64_t>(out + position, word);
      position += 8;
      word = 0;
      used = 0;
    }
  };
  for (int b = 0; b < blocks; ++b) {
    const int k = parameters[b];
    if (k == rice_zero_block) continue;
    const std::uint32_t* const z = residuals + rice_block * b;
    for (int g = 0; g < rice_block; g += 8) {
      std::uint64_t pattern = 0, end = 0;
#ifdef KOMPRESS_HOST_X86_SIMD
      if (avx2) {
        end = rice_quotient_pattern_avx2(z + g, shift + k, &pattern);
      } else
#endif
      {
        for (int j = 0; j < 8; ++j) {
          end += (std::uint64_t(z[g + j]) >> (shift + k)) + 1;
          pattern |= std::uint64_t(1) << ((end - 1) & 63);
        }
      }
      if (end > 64) {
        for (int j = 0; j < 8; ++j) append_one((std::uint64_t(z[g + j]) >> (shift + k)) + 1);
        continue;
      }
      const std::uint64_t filled = used + end;  // < 128
      const std::uint64_t low = word | (pattern << used);
      if (filled >= 64) {
        store<std::uint64_t>(out + position, low);
        position += 8;
        word = (pattern >> 1) >> (63 - used);  // the pattern's bits past the stored word
        used = filled - 64;
      } else {
        word = low;
        used = filled;
      }
    }
  }
  for (std::uint64_t j = 0; j < (used + 7) / 8; ++j) out[position++] = std::byte(std::uint8_t(word >> (8 * j)));
  return position;
}

/// Writes base + the position of each of w's `count` set bits, lowest first, to out (and up to
/// 7 more entries past them).
KOMPRESS_FUNCTION void collect_set_bits(std::uint64_t w, std::uint32_t base, std::uint32_t count,
                                        std::uint32_t* out) {
  for (std::uint32_t at = 0; at < count; at += 8) {
    for (int j = 0; j < 8; ++j) {
      out[at + j] = base + std::uint32_t(lowest_bit64(w));
      w &= w - 1;
    }
  }
}

/// Reads a Rice section of exactly `bytes` bytes into residuals[0, padded); false if it is
/// malformed (never reads outside [in, in + bytes)). `ends` is scratch for `padded` positions.
///
/// The quotients are read in two passes rather than one quotient at a time: the positions of
/// the set bits (each ends a quotient) first, a step per set bit whose only dependency is
/// clearing the lowest bit of a word; then each quotient as the distance between two ends, a
/// loop over a block's 32 values without a dependency (on x86 hosts with AVX2, unpacking the
/// block's remainders in the same pass; elsewhere the portable loops, which GCC vectorizes for
/// the baseline target).
KOMPRESS_FUNCTION bool read_rice(const std::byte* in, std::uint64_t bytes, int padded, std::uint32_t* residuals,
                                 std::uint32_t* ends) {
  const int blocks = padded / rice_block;
  const std::uint64_t header = 1 + std::uint64_t(blocks / 2);
  if (bytes < header) return false;
  const int shift = int(std::uint8_t(in[0]));
  if (shift > 31) return false;
  const auto parameter = [&](int b) { return (std::uint8_t(in[1 + b / 2]) >> (4 * (b & 1))) & 0xF; };
  std::uint64_t remainder_bytes = 0;
  std::uint32_t total = 0;  // quotients: 32 per coded block
  for (int b = 0; b < blocks; ++b) {
    const int k = parameter(b);
    if (k == rice_zero_block) continue;
    if (k + shift > 32) return false;
    remainder_bytes += std::uint64_t(k) * (rice_block / 8);
    total += rice_block;
  }
  if (bytes - header < remainder_bytes) return false;
  const std::byte* const quotients = in + header + remainder_bytes;
  const std::uint64_t quotient_bytes = bytes - header - remainder_bytes;
  // Bit positions are 32-bit: a section that long is never written (its chunk is stored raw).
  if (quotient_bytes >= (std::uint64_t(1) << 28)) return false;

  // Every set bit's position; exactly `total` of them, the last in the section's last byte
  // (the rest of that byte 0 bits).
  // Eight positions at a time, whatever the word's count: a branch per eight set bits, not one
  // per bit that mispredicts at the word's end (on x86 hosts, a byte's positions from a table).
  // Either writes up to 8 entries past the word's last; past `total - 72` the last ones go
  // singly, so nothing is written past ends[total).
#ifdef KOMPRESS_HOST_X86_SIMD
  const bool avx2 = host_has_avx2();
#endif
  std::uint32_t found = 0;
  const auto collect = [&](std::uint64_t w, std::uint32_t base) {
    const std::uint32_t count = std::uint32_t(popcount64(w));
    if (found + count > total) return false;
    if (total - found >= 72) {
#ifdef KOMPRESS_HOST_X86_SIMD
      if (avx2)
        collect_set_bits_avx2(w, base, ends + found);
      else
#endif
        collect_set_bits(w, base, count, ends + found);
      found += count;
    } else {
      while (w != 0) {
        ends[found++] = base + std::uint32_t(lowest_bit64(w));
        w &= w - 1;
      }
    }
    return true;
  };
  const std::uint64_t whole_words = quotient_bytes / 8;
  for (std::uint64_t word = 0; word < whole_words; ++word)
    if (!collect(load<std::uint64_t>(quotients + 8 * word), std::uint32_t(64 * word))) return false;
  std::uint64_t tail = 0;
  for (std::uint64_t j = 8 * whole_words; j < quotient_bytes; ++j)
    tail |= std::uint64_t(std::uint8_t(quotients[j])) << (8 * (j - 8 * whole_words));
  if (!collect(tail, std::uint32_t(64 * whole_words))) return false;
  if (found != total) return false;
  if (total == 0 ? quotient_bytes != 0 : ends[total - 1] / 8 != quotient_bytes - 1) return false;

  const std::byte* remainders = in + header;
  std::uint32_t start = 0;  // the first bit of the block's first quotient
  const std::uint32_t* e = ends;
#ifdef KOMPRESS_HOST_X86_SIMD
  std::byte copy[4 * rice_max_parameter + 16] = {};
#endif
  for (int b = 0; b < blocks; ++b) {
    std::uint32_t* r = residuals + rice_block * b;
    const int k = parameter(b);
    if (k == rice_zero_block) {
      for (int i = 0; i < rice_block; ++i) r[i] = 0;
      continue;
    }
    // A quotient is the zeros between two ends; it must stay below 2^(32 - shift - k).
    std::uint32_t any;
#ifdef KOMPRESS_HOST_X86_SIMD
    if (avx2) {
      // It reads 16 - k bytes past the block's remainders (and uses none of them): from a copy
      // where the section ends sooner.
      const std::byte* from = remainders;
      if (std::uint64_t(remainders - in) + 3 * std::uint64_t(k) + 16 > bytes) {
        for (int j = 0; j < 4 * k; ++j) copy[j] = remainders[j];
        from = copy;
      }
      any = rice_block_avx2(from, e, start, k, shift, r);
    } else
#endif
    {
      unpack<rice_block>(k, remainders, r);
      const std::uint32_t first = e[0] - start;
      any = first;
      r[0] = ((first << k) | r[0]) << shift;
      for (int i = 1; i < rice_block; ++i) {
        const std::uint32_t quotient = e[i] - e[i - 1] - 1;
        any |= quotient;
        r[i] = ((quotient << k) | r[i]) << shift;
      }
    }
    remainders += std::uint64_t(k) * (rice_block / 8);
    if ((std::uint64_t(any) >> (32 - shift - k)) != 0) return false;
    start = e[rice_block - 1] + 1;
    e += rice_block;
  }
  return true;
}

// ---------------------------------------------------------------------------------------------
// The chunk.

/// The geometries the encoder tries for a chunk of a View of shape `shape`.
KOMPRESS_FUNCTION int ratio_candidates(const ratio_shape& shape, ratio_geometry* out) {
  int count = 0;
  out[count++] = {predict_none, 0, 0};
  out[count++] = {predict_delta, 0, 0};
  if (shape.row >= 2 && shape.row + 1 < std::uint64_t(ratio_chunk_values)) {
    out[count++] = {predict_lorenzo2, std::uint32_t(shape.row), 0};
    if (shape.plane_rows >= 2 &&
        shape.row * shape.plane_rows + shape.row + 1 < std::uint64_t(ratio_chunk_values))
      out[count++] = {predict_lorenzo3, std::uint32_t(shape.row), std::uint32_t(shape.plane_rows)};
  }
  return count;
}

/// Encodes the n (1..ratio_chunk_values) values at `in`, the chunk starting at value `first`
/// of a View of shape `shape`, into `out` (room for 1 + n * sizeof(T) bytes); returns the
/// chunk's length. `rice_allowed`: the stream has flag bit 2 (format 1.2); without it the
/// residuals are always bit planes, as format 1.1 writes them.
template <class T>
KOMPRESS_FUNCTION std::uint64_t encode_ratio_chunk(const T* in, int n, std::uint64_t first,
                                                   const ratio_shape& shape,
                                                   const value_codec<T>& codec,
                                                   ratio_scratch& scratch, std::byte* out,
                                                   bool rice_allowed) {
  using bits = bits_t<T>;
  constexpr bits sign_mask = bits(1) << (8 * sizeof(T) - 1);
  constexpr bits exponent_mask = std::is_same_v<T, float> ? bits(0x7F800000u)
                                                          : bits(0x7FF0000000000000ull);
  const std::uint64_t raw_bytes = 1 + std::uint64_t(n) * sizeof(T);
  const auto write_raw = [&]() {
    out[0] = std::byte(ratio_chunk_raw);
    std::memcpy(out + 1, in, std::size_t(n) * sizeof(T));
    return raw_bytes;
  };
  {
    // In blocks, so that a chunk that is not constant (nearly every one) stops at its first.
    const bits first_bits = to_bits(in[0]);
    bits differs = 0;
    for (int lo = 1; lo < n && differs == 0; lo += 64) {
      const int hi = lo + 64 < n ? lo + 64 : n;
      for (int i = lo; i < hi; ++i) differs |= to_bits(in[i]) ^ first_bits;
    }
    if (differs == 0 && n > 1) {
      out[0] = std::byte(ratio_chunk_constant);
      std::memcpy(out + 1, in, sizeof(T));
      return 1 + sizeof(T);
    }
  }
  if (!(codec.step > 0.0)) return write_raw();

  const int padded = ratio_padded(n);
  const int words = padded / 32;
  std::int32_t* const q = scratch.codes;
  std::uint32_t* const negative_zeros = scratch.maps[0];
  std::uint32_t* const fills = scratch.maps[1];
  std::uint32_t* const raws = scratch.maps[2];
  for (int w = 0; w < words; ++w) negative_zeros[w] = fills[w] = raws[w] = 0;

  // Quantize and verify (a branch-free loop that vectorizes: flags per value, in the residual
  // scratch), then, if any value is an exception, its maps; exceptions take the previous code
  // (0 for -0.0).
  const bits fill_bits = codec.fill_bits;
  const bits fill_enabled = codec.has_fill ? ~bits(0) : bits(0);
  const double step = codec.step, threshold = codec.accept_threshold;
  std::uint32_t* const flags = scratch.residuals;  // bit 0 exception, 1 -0.0, 2 fill
  // With stochastic rounding the dither is drawn from the value's index in the stream, as the
  // fast codec draws it (one key per chunk: chunks never straddle a multiple of 2^32), so both
  // codecs pick the same codes.
  const std::uint32_t key = codec.stochastic ? codec.dither_key(first) : 0u;
  const std::uint32_t first_low = static_cast<std::uint32_t>(first);
  const auto quantize_all = [&](auto stochastic) {
    std::uint32_t any = 0;
    for (int i = 0; i < n; ++i) {
      const T value = in[i];
      const bits b = to_bits(value);
      const double x = static_cast<double>(value);
      double biased;
      if constexpr (decltype(stochastic)::value)
        biased = codec.biased_code(x, value_codec<T>::dither(key, first_low + std::uint32_t(i)));
      else
        biased = codec.biased_code(x);
      const double code = biased - rounding_constant;
      // Masks, not selects: NaN and out-of-range codes become 0 by their bits.
      const std::uint64_t in_range = std::uint64_t(0) - std::uint64_t(magnitude(code) < ratio_max_code);
      const double safe = from_bits<double>(to_bits(code) & in_range);
      const double error = x - static_cast<double>(value_codec<T>::reconstruct(safe, step));
      const std::uint32_t ok = std::uint32_t(in_range & 1u) & std::uint32_t(magnitude(error) <= threshold) &
                               std::uint32_t((b & exponent_mask) != exponent_mask) &
                               std::uint32_t(b != sign_mask);
      const std::uint32_t is_fill = std::uint32_t(((b ^ fill_bits) | ~fill_enabled) == 0);
      q[i] = static_cast<std::int32_t>(safe);
      const std::uint32_t f = ((ok ^ 1u) | is_fill) | (std::uint32_t(b == sign_mask) << 1) | (is_fill << 2);
      flags[i] = f;
      any |= f;
    }
    return any;
  };
  const std::uint32_t any = codec.stochastic ? quantize_all(std::true_type{}) : quantize_all(std::false_type{});
  std::uint32_t any_negative_zero = 0, any_fill = 0, raw_count = 0;
  if (any) {
    for (int w = 0; w < words; ++w) {
      const int begin = 32 * w, end = begin + 32 < n ? begin + 32 : n;
      std::uint32_t bad = 0, zeros = 0, fill = 0;
      for (int i = begin; i < end; ++i) {
        bad |= (flags[i] & 1u) << (i - begin);
        zeros |= ((flags[i] >> 1) & 1u) << (i - begin);
        fill |= ((flags[i] >> 2) & 1u) << (i - begin);
      }
      if (!bad) continue;
      negative_zeros[w] = zeros;
      fills[w] = fill & ~zeros;
      raws[w] = bad & ~zeros & ~fill;
      any_negative_zero |= zeros;
      any_fill |= fills[w];
      raw_count += std::uint32_t(popcount32(raws[w]));
      for (int i = begin; i < end; ++i) {
        const std::uint32_t bit = std::uint32_t(1) << (i - begin);
        if (zeros & bit) q[i] = 0;
        else if (bad & bit) q[i] = i > 0 ? q[i - 1] : 0;
      }
    }
  }
  if (raw_count == std::uint32_t(n)) return write_raw();

  // The predictor with the smallest estimate; ties go to the earlier (simpler) one. The
  // residuals and the planes buffers are the same size: each candidate is written to the one
  // not holding the best so far, so the winner is never computed twice, and the other becomes
  // the planes.
  static_assert(sizeof(scratch.planes) == sizeof(scratch.residuals));
  std::uint32_t* residuals = scratch.residuals;
  std::uint32_t* spare = reinterpret_cast<std::uint32_t*>(scratch.planes);
  ratio_geometry candidates[4];
  const int candidate_count = ratio_candidates(shape, candidates);
  int best = 0;
  std::uint64_t best_estimate = ~std::uint64_t(0);
  for (int c = 0; c < candidate_count; ++c) {
    std::uint32_t* const into = c == 0 ? residuals : spare;
    const std::uint64_t estimate = ratio_residuals(q, n, first, candidates[c], into);
    if (estimate < best_estimate) {
      best_estimate = estimate;
      best = c;
      if (c != 0) {
        spare = residuals;
        residuals = into;
      }
    }
  }
  const ratio_geometry g = candidates[best];
  std::uint8_t* const planes = reinterpret_cast<std::uint8_t*>(spare);
  for (int i = n; i < padded; ++i) residuals[i] = 0;

  // Size first, so a chunk that would not shrink is written raw and nothing overflows. The
  // residuals go as bit planes or Rice codes, whichever is smaller (a tie keeps the planes).
  std::uint8_t rice_parameters[ratio_chunk_values / rice_block];
  std::uint32_t any_residual = 0;
  if (rice_allowed)
    for (int i = 0; i < padded; ++i) any_residual |= residuals[i];
  const int shift = any_residual ? lowest_bit(any_residual) : 0;
  const std::uint64_t rice_bytes =
      rice_allowed ? rice_size(residuals, padded, shift, rice_parameters) : ~std::uint64_t(0);
  // The planes take at least their nonzero bytes (the estimate) and their first bitmap's
  // (plane_bitmap_bytes: at most padded / 2, and at most the estimate). A Rice section smaller
  // than that wins without the planes being built.
  const std::uint64_t bitmap_most = best_estimate < std::uint64_t(padded / 2) ? best_estimate : padded / 2;
  const bool rice_below_planes = rice_bytes < best_estimate ||
                                 (rice_bytes < best_estimate + bitmap_most &&
                                  rice_bytes < best_estimate + plane_bitmap_bytes(residuals, padded));
  std::uint64_t plane_bytes = 0;
  if (!rice_below_planes) {
    to_bit_planes(residuals, padded, planes);
    plane_bytes = zero_eliminated_size(planes, std::uint32_t(4 * padded), scratch.levels);
  }
  const bool rice = rice_below_planes || rice_bytes < plane_bytes;
  const std::uint8_t kind = std::uint8_t(g.predictor) |
                            (any_negative_zero ? ratio_flag_negative_zeros : 0) |
                            (any_fill ? ratio_flag_fills : 0) |
                            (raw_count ? ratio_flag_raw_values : 0) | (rice ? ratio_flag_rice : 0);
  std::uint64_t size = 1 + (g.predictor >= predict_lorenzo2 ? 2 : 0) +
                       (g.predictor == predict_lorenzo3 ? 2 : 0) +
                       std::uint64_t(raw_count) * sizeof(T) + (rice ? rice_bytes : plane_bytes);
  std::uint8_t transitions[3][ratio_chunk_values / 8];
  std::uint8_t map_levels[3][ratio_chunk_values / 8 / 7 + 64];
  for (int m = 0; m < 3; ++m) {
    if (!(kind & (ratio_flag_negative_zeros << m))) continue;
    to_transitions(scratch.maps[m], words, transitions[m]);
    size += zero_eliminated_size(transitions[m], std::uint32_t(padded / 8), map_levels[m]);
  }
  if (size >= raw_bytes) return write_raw();

  std::uint64_t position = 0;
  out[position++] = std::byte(kind);
  if (g.predictor >= predict_lorenzo2) {
    store<std::uint16_t>(out + position, std::uint16_t(g.row));
    position += 2;
  }
  if (g.predictor == predict_lorenzo3) {
    store<std::uint16_t>(out + position, std::uint16_t(g.plane_rows));
    position += 2;
  }
  for (int m = 0; m < 3; ++m)
    if (kind & (ratio_flag_negative_zeros << m))
      position += write_zero_eliminated(transitions[m], std::uint32_t(padded / 8), map_levels[m],
                                        out + position, raw_bytes - position);
  if (raw_count) {
    for (int w = 0; w < words; ++w) {
      std::uint32_t m = raws[w];
      while (m) {
        const int i = 32 * w + lowest_bit(m);
        m &= m - 1;
        std::memcpy(out + position, in + i, sizeof(T));
        position += sizeof(T);
      }
    }
  }
  if (rice)
    position += write_rice(residuals, padded, shift, rice_parameters, out + position);
  else
    position += write_zero_eliminated(planes, std::uint32_t(4 * padded), scratch.levels,
                                      out + position, raw_bytes - position);
  return position;
}

/// Decodes a chunk of exactly `bytes` bytes into n values; false if it is malformed (never
/// reads outside [in, in + bytes)). `rice_allowed`: the stream's flag bit 2 (format 1.2).
template <class T>
KOMPRESS_FUNCTION bool decode_ratio_chunk(const std::byte* in, std::uint64_t bytes, int n,
                                          std::uint64_t first, const value_codec<T>& codec,
                                          ratio_scratch& scratch, T* out, bool rice_allowed) {
  if (bytes < 1 || n < 1 || n > ratio_chunk_values) return false;
  const std::uint8_t kind = std::uint8_t(in[0]);
  if (kind == ratio_chunk_raw) {
    if (bytes != 1 + std::uint64_t(n) * sizeof(T)) return false;
    std::memcpy(out, in + 1, std::size_t(n) * sizeof(T));
    return true;
  }
  if (kind == ratio_chunk_constant) {
    if (bytes != 1 + sizeof(T) || n < 2) return false;
    const T value = load<T>(in + 1);
    for (int i = 0; i < n; ++i) out[i] = value;
    return true;
  }
  if ((kind & 0xC0) != 0 || ((kind & ratio_flag_rice) && !rice_allowed) || !(codec.step > 0.0)) return false;
  if ((kind & ratio_flag_fills) && !codec.has_fill) return false;
  ratio_geometry g;
  g.predictor = kind & 3;
  std::uint64_t position = 1;
  if (g.predictor >= predict_lorenzo2) {
    if (bytes < position + 2) return false;
    g.row = load<std::uint16_t>(in + position);
    position += 2;
    if (g.row < 2 || g.row + 1 >= std::uint32_t(ratio_chunk_values)) return false;
  }
  if (g.predictor == predict_lorenzo3) {
    if (bytes < position + 2) return false;
    g.plane_rows = load<std::uint16_t>(in + position);
    position += 2;
    if (g.plane_rows < 2 ||
        std::uint64_t(g.row) * g.plane_rows + g.row + 1 >= std::uint64_t(ratio_chunk_values))
      return false;
  }
  const int padded = ratio_padded(n);
  const int words = padded / 32;
  for (int m = 0; m < 3; ++m) {
    std::uint32_t* map = scratch.maps[m];
    if (kind & (ratio_flag_negative_zeros << m)) {
      const std::int64_t used =
          read_zero_eliminated(in + position, bytes - position, std::uint32_t(padded / 8),
                               scratch.levels, scratch.planes);
      if (used < 0) return false;
      position += std::uint64_t(used);
      from_transitions(scratch.planes, words, map);
      // Nothing past the chunk's end may be marked: the maps are padded to 64 values, so the
      // word holding value n and every word after it are checked.
      for (int w = n / 32; w < words; ++w)
        if (map[w] & (w == n / 32 ? ~std::uint32_t(0) << (n % 32) : ~std::uint32_t(0))) return false;
    } else {
      for (int w = 0; w < words; ++w) map[w] = 0;
    }
  }
  std::uint32_t raw_count = 0;
  for (int w = 0; w < words; ++w) {
    // The three kinds are disjoint.
    const std::uint32_t z = scratch.maps[0][w], f = scratch.maps[1][w], r = scratch.maps[2][w];
    if ((z & f) | (z & r) | (f & r)) return false;
    raw_count += std::uint32_t(popcount32(r));
  }
  const std::uint64_t raw_position = position;
  if (bytes - position < std::uint64_t(raw_count) * sizeof(T)) return false;
  position += std::uint64_t(raw_count) * sizeof(T);
  if (kind & ratio_flag_rice) {
    // The codes are not written before the residuals are read: their room holds the ends.
    if (!read_rice(in + position, bytes - position, padded, scratch.residuals,
                   reinterpret_cast<std::uint32_t*>(scratch.codes)))
      return false;
  } else {
    const std::int64_t used = read_zero_eliminated(in + position, bytes - position,
                                                   std::uint32_t(4 * padded), scratch.levels,
                                                   scratch.planes);
    if (used < 0 || position + std::uint64_t(used) != bytes) return false;
    from_bit_planes(scratch.planes, padded, scratch.residuals);
  }

  // Codes back from the residuals, then values.
  std::int32_t* const q = scratch.codes;
  bool values_written = false;
  const std::uint32_t* const r = scratch.residuals;
  if (g.predictor == predict_none) {
    // Straight to values, in one pass.
    for (int i = 0; i < n; ++i)
      out[i] = value_codec<T>::reconstruct(double(std::int32_t(unzigzag32(r[i]))), codec.step);
    values_written = true;
  } else if (g.predictor == predict_delta) {
#ifdef KOMPRESS_HOST_X86_SIMD
    // Straight to values: the codes are needed for nothing else.
    undelta_reconstruct_sse2(r, n, codec.step, out);
    values_written = true;
#else
    std::uint32_t code = 0;
    for (int i = 0; i < n; ++i) {
      code += unzigzag32(r[i]);
      q[i] = std::int32_t(code);
    }
#endif
  } else {
    lorenzo_codes(r, n, first, g, q);
  }
  const double step = codec.step;
  if (!values_written)
    for (int i = 0; i < n; ++i) out[i] = value_codec<T>::reconstruct(double(q[i]), step);
  const T fill = from_bits<T>(static_cast<bits_t<T>>(codec.fill_bits));
  std::uint64_t raw_at = raw_position;
  for (int w = 0; w < words; ++w) {
    std::uint32_t any = scratch.maps[0][w] | scratch.maps[1][w] | scratch.maps[2][w];
    while (any) {
      const int j = lowest_bit(any);
      any &= any - 1;
      const int i = 32 * w + j;
      const std::uint32_t bit = std::uint32_t(1) << j;
      if (scratch.maps[0][w] & bit) {
        out[i] = T(-0.0);
      } else if (scratch.maps[1][w] & bit) {
        out[i] = fill;
      } else {
        std::memcpy(out + i, in + raw_at, sizeof(T));
        raw_at += sizeof(T);
      }
    }
  }
  return true;
}

}  // namespace kompress::inline v0::detail
