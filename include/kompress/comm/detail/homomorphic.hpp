#pragma once
// The homomorphic reduction of the ring collectives (collective_options::reduction =
// reduction_method::homomorphic): every rank quantizes its values once on one grid (step a
// power of two <= 2e, the same on every rank), and the reduce-scatter hops add the integer
// codes as they arrive, without decoding to values and compressing again. A message holds the
// codes block-coded by the codec's integer stage (codec/code_block.hpp). The allgather phase
// forwards the final code sums, so every rank reconstructs the same values.
//
// Blocks that cannot stay on the grid travel as floating values and are added in floating
// point: a NaN, infinity or off-grid value (|x| > code_limit * s) on some rank, or a message
// sent raw because its codes did not compress. docs/collectives.md states and proves the bound.
//
// Message layout for n values: C = ceil(n / (64 * block_size)) chunk lengths (u32), then C
// chunk checksums (u64, detail/checksum.hpp, each over its chunk's bytes), then the chunks; a
// chunk is one descriptor byte per block, then the blocks' payloads. The lengths must add up
// to the message and each chunk must match its checksum, so a damaged message is a
// format_error on the rank that receives it, never codes added silently. Exactly
// n * sizeof(T) bytes means the raw values (the wire rule, engine.hpp).

#include <kompress/codec/code_block.hpp>
#include <kompress/comm/detail/engine.hpp>
#include <kompress/detail/checksum.hpp>

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace kompress::inline v0::detail {

inline constexpr std::size_t code_blocks_per_chunk = 64;
/// Bytes of a code message's table per chunk: its length (u32) and its checksum (u64).
inline constexpr std::size_t code_table_bytes_per_chunk = 4 + 8;

/// Loads block `start` (m values) of `values`, padded to BlockSize with its last value, and
/// quantizes it: the codes, whether all m are on the grid, the largest |x - q s| among them.
template <class T, int BlockSize>
KOMPRESS_FUNCTION bool quantize_block(const T* values, int m, const code_grid& grid, double* codes, double& error) {
  T padded[BlockSize];
  const T* in = values;
  if (m < BlockSize) {
    for (int i = 0; i < BlockSize; ++i) padded[i] = values[i < m ? i : m - 1];
    in = padded;
  }
  // Fixed trip count, no branches: vectorizes.
  int off_grid = 0;
  double largest = 0.0;
  for (int i = 0; i < BlockSize; ++i) {
    const double x = static_cast<double>(in[i]);
    bool on_grid = false;
    codes[i] = grid.quantize(x, on_grid);
    off_grid |= !on_grid;
    const double e = magnitude(x - codes[i] * grid.step);
    largest = e > largest ? e : largest;
  }
  error = off_grid ? 0.0 : largest;
  return !off_grid;
}

/// Encodes chunk j of a span: this rank's own values (quantized here) or the span's sums.
template <class T, int BlockSize>
struct code_chunk_encoder {
  const T* values;              ///< the span's values (own input, or floating partial sums)
  const double* codes;          ///< the span's code sums (reduced spans)
  const std::uint8_t* coded;    ///< per element at block starts: the block holds codes
  code_grid grid;
  bool reduced;
  std::size_t n;
  std::byte* slots;
  std::size_t slot_bytes;
  std::uint64_t* lengths;
  std::uint64_t* checksums;
  double* errors;

  KOMPRESS_FUNCTION void operator()(std::size_t j) const {
    constexpr std::size_t chunk_values = BlockSize * code_blocks_per_chunk;
    const std::size_t first = j * chunk_values;
    const std::size_t count = n - first < chunk_values ? n - first : chunk_values;
    const std::size_t blocks = (count + BlockSize - 1) / BlockSize;
    std::byte* const out = slots + j * slot_bytes;
    std::byte* payload = out + blocks;
    std::int64_t base = 0;
    double error = 0.0;
    for (std::size_t b = 0; b < blocks; ++b) {
      const std::size_t start = first + b * BlockSize;
      const int m = int(count - b * BlockSize < BlockSize ? count - b * BlockSize : BlockSize);
      double block[BlockSize];
      bool on_grid;
      if (reduced) {
        on_grid = coded[start] != 0;
        if (m == BlockSize) {
          for (int i = 0; i < BlockSize; ++i) block[i] = codes[start + i];
        } else {
          for (int i = 0; i < BlockSize; ++i) block[i] = codes[start + (i < m ? i : m - 1)];
        }
      } else {
        double block_error = 0.0;
        on_grid = quantize_block<T, BlockSize>(values + start, m, grid, block, block_error);
        error = block_error > error ? block_error : error;
      }
      std::uint8_t descriptor = descriptor_floating;
      if (on_grid) {
        payload += encode_code_block<BlockSize>(block, m, base, descriptor, payload);
      } else {
        std::memcpy(payload, values + start, std::size_t(m) * sizeof(T));
        payload += std::size_t(m) * sizeof(T);
      }
      out[b] = std::byte(descriptor);
    }
    lengths[j] = std::uint64_t(payload - out);
    checksums[j] = checksum_of(out, lengths[j]);
    errors[j] = error;
  }
};

/// Walks the blocks of chunk j of a code message, calling f(start, m, codes or nullptr,
/// floating values or nullptr) for each (codes: BlockSize of them); false if malformed.
template <class T, int BlockSize, class F>
KOMPRESS_FUNCTION bool for_each_code_block(const std::byte* in, std::size_t bytes, std::size_t first,
                                           std::size_t count, F&& f) {
  const std::size_t blocks = (count + BlockSize - 1) / BlockSize;
  if (bytes < blocks) return false;
  std::size_t position = blocks;
  std::int64_t base = 0;
  for (std::size_t b = 0; b < blocks; ++b) {
    const std::size_t start = first + b * BlockSize;
    const int m = int(count - b * BlockSize < BlockSize ? count - b * BlockSize : BlockSize);
    const std::uint8_t descriptor = std::uint8_t(in[b]);
    if (descriptor == descriptor_floating) {
      const std::size_t raw = std::size_t(m) * sizeof(T);
      if (raw > bytes - position) return false;
      T floating[BlockSize];
      std::memcpy(floating, in + position, raw);
      position += raw;
      if (!f(start, m, static_cast<const double*>(nullptr), floating)) return false;
    } else {
      double codes[BlockSize];
      const int used = decode_code_block<BlockSize>(in + position, bytes - position, descriptor, m, base, codes);
      if (used < 0) return false;
      position += std::size_t(used);
      if (!f(start, m, codes, static_cast<const T*>(nullptr))) return false;
    }
  }
  return position == bytes;
}

/// Whether chunk j of a code message matches the checksum its table holds.
KOMPRESS_FUNCTION bool code_chunk_intact(const std::byte* in, const std::uint64_t* offsets, const std::byte* checksums,
                                         std::size_t j) {
  return checksum_of(in + offsets[j], offsets[j + 1] - offsets[j]) == load<std::uint64_t>(checksums + 8 * j);
}

/// Adds chunk j of an arrival to this rank's own values of the span: code + own code where
/// both are on the grid, else floating (this rank's exact values added to the incoming sum).
template <class T, int BlockSize>
struct code_chunk_adder {
  const std::byte* in;
  const std::uint64_t* offsets;  ///< chunk j at [offsets[j], offsets[j + 1])
  const std::byte* checksums;    ///< chunk j's at checksums + 8 j (in the message's table)
  T* values;                     ///< own input in, floating sums out
  double* codes;
  std::uint8_t* coded;
  code_grid grid;
  std::size_t n;
  std::uint8_t* failed;
  double* errors;

  KOMPRESS_FUNCTION void operator()(std::size_t j) const {
    constexpr std::size_t chunk_values = BlockSize * code_blocks_per_chunk;
    const std::size_t first = j * chunk_values;
    const std::size_t count = n - first < chunk_values ? n - first : chunk_values;
    errors[j] = 0.0;
    if (!code_chunk_intact(in, offsets, checksums, j)) {  // nothing of a damaged chunk is added
      failed[j] = 1;
      return;
    }
    double error = 0.0;
    const auto add = [&](std::size_t start, int m, const double* incoming, const T* floating) {
      if (incoming) {
        double own[BlockSize];
        double block_error = 0.0;
        if (quantize_block<T, BlockSize>(values + start, m, grid, own, block_error)) {
          // Both sums of at most (p - 1) and 1 ranks' codes: |sum| <= p * code_limit <= 2^53,
          // exact. Beyond it only from a damaged message.
          bool bad = false;
          for (int i = 0; i < BlockSize; ++i) {
            own[i] += incoming[i];
            bad |= !(magnitude(own[i]) <= max_code_sum);
          }
          if (bad) return false;
          for (int i = 0; i < m; ++i) codes[start + i] = own[i];
          error = block_error > error ? block_error : error;
          coded[start] = 1;
          return true;
        }
        for (int i = 0; i < m; ++i)
          values[start + i] = static_cast<T>(incoming[i] * grid.step + static_cast<double>(values[start + i]));
      } else {
        for (int i = 0; i < m; ++i) values[start + i] = floating[i] + values[start + i];
      }
      coded[start] = 0;
      return true;
    };
    failed[j] = !for_each_code_block<T, BlockSize>(in + offsets[j], offsets[j + 1] - offsets[j], first, count, add);
    errors[j] = error;
  }
};

/// Decodes chunk j of a message of final sums into values.
template <class T, int BlockSize>
struct code_chunk_decoder {
  const std::byte* in;
  const std::uint64_t* offsets;
  const std::byte* checksums;
  T* out;
  code_grid grid;
  std::size_t n;
  std::uint8_t* failed;

  KOMPRESS_FUNCTION void operator()(std::size_t j) const {
    constexpr std::size_t chunk_values = BlockSize * code_blocks_per_chunk;
    const std::size_t first = j * chunk_values;
    const std::size_t count = n - first < chunk_values ? n - first : chunk_values;
    if (!code_chunk_intact(in, offsets, checksums, j)) {
      failed[j] = 1;
      return;
    }
    const auto decode = [&](std::size_t start, int m, const double* codes, const T* floating) {
      if (codes) {
        if (m == BlockSize) {
          for (int i = 0; i < BlockSize; ++i) out[start + i] = grid.value<T>(codes[i]);
        } else {
          for (int i = 0; i < m; ++i) out[start + i] = grid.value<T>(codes[i]);
        }
      } else {
        for (int i = 0; i < m; ++i) out[start + i] = floating[i];
      }
      return true;
    };
    failed[j] = !for_each_code_block<T, BlockSize>(in + offsets[j], offsets[j + 1] - offsets[j], first, count, decode);
  }
};

/// The values of a reduced span: code sums reconstructed, floating sums as they are.
template <class T, int BlockSize>
struct code_span_values {
  const T* values;
  const double* codes;
  const std::uint8_t* coded;
  code_grid grid;
  T* out;
  KOMPRESS_FUNCTION void operator()(std::size_t i) const {
    out[i] = coded[i - i % BlockSize] ? grid.value<T>(codes[i]) : values[i];
  }
};

/// The homomorphic state of one ring operation. Spans are [begin, begin + n) of the ring's
/// partial sums (`values`, which holds this rank's input until a span is reduced); blocks are
/// aligned at each span's begin. One span at a time holds sums (the ring adds an arrival, then
/// sends that chunk on before the next arrives; the last one is the result), so the code sums
/// and block flags are kept for `largest` values, relative to the span that holds them.
/// Scratch (codes, flags, encoding slots, tables) comes from the caller: scratch_bytes(...).
template <class T, class Exec>
class homomorphic_sums {
 public:
  /// Scratch for `count` values whose spans (one message each) hold at most `largest`.
  static std::size_t scratch_bytes(std::size_t count, std::size_t largest, int block_size) {
    return layout(count, largest, block_size).total;
  }

  /// The codes of a span stay in the scratch between the call that forms them and the one that
  /// sends them, at the span's own position: the ring encodes one chunk's pieces while the
  /// next chunk's pieces arrive (comm/detail/pipeline.hpp). Every call on one span must use the
  /// same (begin, n) as the others on it, since blocks start at `begin`.
  homomorphic_sums(const Exec& exec, code_grid grid, int block_size, std::size_t count, std::size_t largest,
                   T* values, std::byte* scratch)
      : exec_(exec), grid_(grid), block_size_(block_size), values_(values) {
    const scratch_layout at = layout(count, largest, block_size);
    codes_ = reinterpret_cast<double*>(scratch + at.codes);
    coded_ = reinterpret_cast<std::uint8_t*>(scratch + at.coded);
    slots_ = scratch + at.slots;
    slot_bytes_ = at.slot_bytes;
    lengths_ = reinterpret_cast<std::uint64_t*>(scratch + at.lengths);
    checksums_ = reinterpret_cast<std::uint64_t*>(scratch + at.checksums);
    errors_ = reinterpret_cast<double*>(scratch + at.errors);
    failed_ = reinterpret_cast<std::uint8_t*>(scratch + at.failed);
  }

  /// The message for a span into `out` (room n * sizeof(T)): its codes when `compress` and the
  /// wire rule prefer them, else the raw values (exactly n * sizeof(T) bytes). `reduced`: the
  /// span holds sums (an arrival was added), else this rank's own values.
  std::size_t encode(std::size_t begin, std::size_t n, bool reduced, bool compress, const wire_rule& rule,
                     std::byte* out) {
    const std::size_t raw = n * sizeof(T);
    if (compress && n > 0 && grid_.active()) {
      const std::size_t chunks = chunks_of(n);
      dispatch_block_size(block_size_, [&](auto block) {
        constexpr int B = decltype(block)::value;
        Kokkos::parallel_for("kompress::homomorphic::encode", Kokkos::RangePolicy<Exec>(exec_, 0, chunks),
                             code_chunk_encoder<T, B>{values_ + begin, codes_ + begin, coded_ + begin, grid_,
                                                      reduced, n, slots_, slot_bytes_, lengths_, checksums_,
                                                      errors_});
      });
      exec_.fence("kompress::homomorphic: codes encoded");
      std::size_t length = chunks * code_table_bytes_per_chunk;
      for (std::size_t j = 0; j < chunks; ++j) length += lengths_[j];
      if (rule.send_compressed(raw, length)) {
        std::byte* at = out + chunks * code_table_bytes_per_chunk;
        for (std::size_t j = 0; j < chunks; ++j) {
          store<std::uint32_t>(out + 4 * j, std::uint32_t(lengths_[j]));
          store<std::uint64_t>(out + 4 * chunks + 8 * j, checksums_[j]);
          std::memcpy(at, slots_ + j * slot_bytes_, lengths_[j]);
          at += lengths_[j];
        }
        if (!reduced) note_errors(chunks);  // this rank's values were quantized
        return length;
      }
    }
    if (reduced) values(begin, n, reinterpret_cast<T*>(out));  // out: aligned staging
    else std::memcpy(out, values_ + begin, raw);
    return raw;
  }

  /// Adds an arrival (a message for the span) to this rank's own values of the span.
  void add(std::size_t begin, std::size_t n, const std::byte* in, std::size_t length, const char* who) {
    if (n == 0) return;
    if (length == n * sizeof(T)) {  // raw partial sums: this rank's exact values added in floating point
      Kokkos::parallel_for("kompress::homomorphic::add_raw", Kokkos::RangePolicy<Exec>(exec_, 0, n),
                           raw_adder{in, values_ + begin, coded_ + begin, block_size_});
      exec_.fence("kompress::homomorphic: raw sums added");
      return;
    }
    const std::size_t chunks = table(in, length, n, who);
    dispatch_block_size(block_size_, [&](auto block) {
      constexpr int B = decltype(block)::value;
      Kokkos::parallel_for("kompress::homomorphic::add", Kokkos::RangePolicy<Exec>(exec_, 0, chunks),
                           code_chunk_adder<T, B>{in, lengths_, in + 4 * chunks, values_ + begin, codes_ + begin,
                                                  coded_ + begin, grid_, n, failed_, errors_});
    });
    exec_.fence("kompress::homomorphic: codes added");
    check_chunks(chunks, who);
    note_errors(chunks);
  }

  /// Decodes a message of final sums (n values) into `out`.
  void decode(const std::byte* in, std::size_t length, std::size_t n, T* out, const char* who) {
    if (length == n * sizeof(T)) {
      std::memcpy(out, in, length);
      return;
    }
    const std::size_t chunks = table(in, length, n, who);
    dispatch_block_size(block_size_, [&](auto block) {
      constexpr int B = decltype(block)::value;
      Kokkos::parallel_for("kompress::homomorphic::decode", Kokkos::RangePolicy<Exec>(exec_, 0, chunks),
                           code_chunk_decoder<T, B>{in, lengths_, in + 4 * chunks, out, grid_, n, failed_});
    });
    exec_.fence("kompress::homomorphic: sums decoded");
    check_chunks(chunks, who);
  }

  /// The values of the reduced span [begin, begin + n).
  void values(std::size_t begin, std::size_t n, T* out) {
    dispatch_block_size(block_size_, [&](auto block) {
      constexpr int B = decltype(block)::value;
      Kokkos::parallel_for("kompress::homomorphic::values", Kokkos::RangePolicy<Exec>(exec_, 0, n),
                           code_span_values<T, B>{values_ + begin, codes_ + begin, coded_ + begin, grid_, out});
    });
    exec_.fence("kompress::homomorphic: sums reconstructed");
  }

  /// Track the largest quantization error of this rank's own values (collective_options::
  /// measure_error); 0 until a value is quantized.
  void measure() {
    measure_ = true;
    max_error_ = 0.0;
  }
  double max_error() const { return max_error_; }

 private:
  struct raw_adder {
    const std::byte* in;
    T* values;
    std::uint8_t* coded;
    int block_size;
    KOMPRESS_FUNCTION void operator()(std::size_t i) const {
      values[i] = load<T>(in + i * sizeof(T)) + values[i];
      if (i % std::size_t(block_size) == 0) coded[i] = 0;
    }
  };

  struct scratch_layout {
    std::size_t codes = 0, coded = 0, slots = 0, slot_bytes = 0, lengths = 0, checksums = 0, errors = 0, failed = 0,
                total = 0;
  };
  static scratch_layout layout(std::size_t count, std::size_t largest, int block_size) {
    const auto round8 = [](std::size_t bytes) { return (bytes + 7) / 8 * 8; };
    const std::size_t chunk = std::size_t(block_size) * code_blocks_per_chunk;
    const std::size_t chunks = (largest + chunk - 1) / chunk;
    scratch_layout at;
    at.slot_bytes = chunk / std::size_t(block_size) + chunk * 8;  // every block verbatim
    at.coded = at.codes + count * sizeof(double);
    at.slots = at.coded + round8(count);
    at.lengths = at.slots + chunks * at.slot_bytes;
    at.checksums = at.lengths + (chunks + 1) * 8;
    at.errors = at.checksums + chunks * 8;
    at.failed = at.errors + chunks * 8;
    at.total = at.failed + round8(chunks);
    return at;
  }

  std::size_t chunk_values() const { return std::size_t(block_size_) * code_blocks_per_chunk; }
  std::size_t chunks_of(std::size_t n) const { return (n + chunk_values() - 1) / chunk_values(); }

  /// Reads the chunk table of a code message into offsets (lengths_); returns the chunk count.
  /// The checksums stay in the message, read by each chunk's kernel.
  std::size_t table(const std::byte* in, std::size_t length, std::size_t n, const char* who) {
    const std::size_t chunks = chunks_of(n);
    std::size_t at = chunks * code_table_bytes_per_chunk;
    bool fits = grid_.active() && length >= at;
    for (std::size_t j = 0; j < chunks && fits; ++j) {
      lengths_[j] = at;
      at += load<std::uint32_t>(in + 4 * j);
      fits = at <= length;
    }
    if (!fits || at != length)
      throw format_error(std::string(who) + ": a received message of " + std::to_string(length) +
                         " bytes is not a code message of " + std::to_string(n) + " values");
    lengths_[chunks] = at;
    return chunks;
  }

  void check_chunks(std::size_t chunks, const char* who) const {
    for (std::size_t j = 0; j < chunks; ++j)
      if (failed_[j])
        throw format_error(std::string(who) + ": a received code message is damaged (chunk " + std::to_string(j) +
                           " does not match its checksum or does not decode)");
  }

  void note_errors(std::size_t chunks) {
    if (!measure_) return;
    for (std::size_t j = 0; j < chunks; ++j) max_error_ = std::max(max_error_, errors_[j]);
  }

  Exec exec_;
  code_grid grid_;
  int block_size_;
  T* values_;
  double* codes_ = nullptr;
  std::uint8_t* coded_ = nullptr;
  std::byte* slots_ = nullptr;
  std::size_t slot_bytes_ = 0;
  std::uint64_t* lengths_ = nullptr;
  std::uint64_t* checksums_ = nullptr;
  double* errors_ = nullptr;
  std::uint8_t* failed_ = nullptr;
  bool measure_ = false;
  double max_error_ = NAN;
};

}  // namespace kompress::inline v0::detail
