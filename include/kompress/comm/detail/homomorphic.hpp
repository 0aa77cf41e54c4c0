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
// Message layout for n values: C = ceil(n / (64 * block_size)) chunk lengths (u32), then the
// chunks; a chunk is one descriptor byte per block, then the blocks' payloads. Exactly
// n * sizeof(T) bytes means the raw values (the wire rule, engine.hpp).

#include <kompress/codec/code_block.hpp>
#include <kompress/comm/detail/engine.hpp>

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace kompress::inline v0::detail {

inline constexpr std::size_t code_blocks_per_chunk = 64;

/// Encodes chunk j of a span: this rank's own values (quantized here) or the span's sums.
template <class T, int BlockSize>
struct code_chunk_encoder {
  const T* values;              ///< the span's values (own input, or floating partial sums)
  const std::int64_t* codes;    ///< the span's code sums (reduced spans)
  const std::uint8_t* coded;    ///< per element at block starts: the block holds codes
  code_grid grid;
  bool reduced;
  std::size_t n;
  std::byte* slots;
  std::size_t slot_bytes;
  std::uint64_t* lengths;
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
      std::int64_t own[BlockSize];
      const std::int64_t* block_codes = codes + start;
      bool on_grid = true;
      if (reduced) {
        on_grid = coded[start] != 0;
      } else {
        double block_error = 0.0;
        for (int i = 0; i < m; ++i) {
          const double x = static_cast<double>(values[start + i]);
          on_grid = grid.quantize(x, own[i]) && on_grid;
          const double e = magnitude(x - static_cast<double>(own[i]) * grid.step);
          block_error = e > block_error ? e : block_error;
        }
        if (on_grid) error = block_error > error ? block_error : error;
        block_codes = own;
      }
      std::uint8_t descriptor = descriptor_floating;
      if (on_grid) {
        payload += encode_code_block<BlockSize>(block_codes, m, base, descriptor, payload);
      } else {
        std::memcpy(payload, values + start, std::size_t(m) * sizeof(T));
        payload += std::size_t(m) * sizeof(T);
      }
      out[b] = std::byte(descriptor);
    }
    lengths[j] = std::uint64_t(payload - out);
    errors[j] = error;
  }
};

/// Walks the blocks of chunk j of a code message, calling f(start, m, codes or nullptr,
/// floating values or nullptr) for each; false if the chunk is malformed.
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
      if (!f(start, m, static_cast<const std::int64_t*>(nullptr), floating)) return false;
    } else {
      std::int64_t codes[BlockSize];
      const int used = decode_code_block<BlockSize>(in + position, bytes - position, descriptor, m, base, codes);
      if (used < 0) return false;
      position += std::size_t(used);
      if (!f(start, m, codes, static_cast<const T*>(nullptr))) return false;
    }
  }
  return position == bytes;
}

/// Adds chunk j of an arrival to this rank's own values of the span: code + own code where
/// both are on the grid, else floating (this rank's exact values added to the incoming sum).
template <class T, int BlockSize>
struct code_chunk_adder {
  const std::byte* in;
  const std::uint64_t* offsets;  ///< chunk j at [offsets[j], offsets[j + 1])
  T* values;                     ///< own input in, floating sums out
  std::int64_t* codes;
  std::uint8_t* coded;
  code_grid grid;
  std::size_t n;
  std::uint8_t* failed;
  double* errors;

  KOMPRESS_FUNCTION void operator()(std::size_t j) const {
    constexpr std::size_t chunk_values = BlockSize * code_blocks_per_chunk;
    const std::size_t first = j * chunk_values;
    const std::size_t count = n - first < chunk_values ? n - first : chunk_values;
    double error = 0.0;
    const auto add = [&](std::size_t start, int m, const std::int64_t* incoming, const T* floating) {
      std::int64_t own[BlockSize];
      bool on_grid = incoming != nullptr;
      double block_error = 0.0;
      for (int i = 0; i < m && on_grid; ++i) {
        const double x = static_cast<double>(values[start + i]);
        on_grid = grid.quantize(x, own[i]);
        const double e = magnitude(x - static_cast<double>(own[i]) * grid.step);
        block_error = e > block_error ? e : block_error;
      }
      if (on_grid) {
        for (int i = 0; i < m; ++i) {
          const std::int64_t sum = incoming[i] + own[i];  // both within 2^53: no overflow
          if (sum > max_code_sum || sum < -max_code_sum) return false;  // only a damaged stream
          codes[start + i] = sum;
        }
        error = block_error > error ? block_error : error;
        coded[start] = 1;
      } else if (incoming) {
        for (int i = 0; i < m; ++i)
          values[start + i] = static_cast<T>(static_cast<double>(incoming[i]) * grid.step +
                                             static_cast<double>(values[start + i]));
        coded[start] = 0;
      } else {
        for (int i = 0; i < m; ++i) values[start + i] = floating[i] + values[start + i];
        coded[start] = 0;
      }
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
  T* out;
  code_grid grid;
  std::size_t n;
  std::uint8_t* failed;

  KOMPRESS_FUNCTION void operator()(std::size_t j) const {
    constexpr std::size_t chunk_values = BlockSize * code_blocks_per_chunk;
    const std::size_t first = j * chunk_values;
    const std::size_t count = n - first < chunk_values ? n - first : chunk_values;
    const auto decode = [&](std::size_t start, int m, const std::int64_t* codes, const T* floating) {
      for (int i = 0; i < m; ++i) out[start + i] = codes ? grid.value<T>(codes[i]) : floating[i];
      return true;
    };
    failed[j] = !for_each_code_block<T, BlockSize>(in + offsets[j], offsets[j + 1] - offsets[j], first, count, decode);
  }
};

/// The values of a reduced span: code sums reconstructed, floating sums as they are.
template <class T, int BlockSize>
struct code_span_values {
  const T* values;
  const std::int64_t* codes;
  const std::uint8_t* coded;
  code_grid grid;
  T* out;
  KOMPRESS_FUNCTION void operator()(std::size_t i) const {
    out[i] = coded[i - i % BlockSize] ? grid.value<T>(codes[i]) : values[i];
  }
};

/// The homomorphic state of one ring operation. Spans are [begin, begin + n) of the ring's
/// partial sums (`values`, which holds this rank's input until a span is reduced); blocks are
/// aligned at each span's begin, so a span must be encoded, added and reconstructed with the
/// same begin and n (ring chunks are).
template <class T, class Exec>
class homomorphic_sums {
 public:
  homomorphic_sums(const Exec& exec, code_grid grid, int block_size, std::size_t count, std::size_t largest, T* values)
      : exec_(exec), grid_(grid), block_size_(block_size), values_(values),
        codes_(Kokkos::view_alloc(Kokkos::WithoutInitializing, "kompress::homomorphic_codes"), count),
        coded_("kompress::homomorphic_blocks", count) {
    const std::size_t chunks = chunks_of(largest);
    slot_bytes_ = chunk_values() / std::size_t(block_size_) + chunk_values() * 8;
    slots_ = Kokkos::View<std::byte*, Kokkos::HostSpace>(
        Kokkos::view_alloc(Kokkos::WithoutInitializing, "kompress::homomorphic_slots"), chunks * slot_bytes_);
    lengths_ = Kokkos::View<std::uint64_t*, Kokkos::HostSpace>("kompress::homomorphic_lengths", chunks + 1);
    errors_ = Kokkos::View<double*, Kokkos::HostSpace>("kompress::homomorphic_errors", chunks);
    failed_ = Kokkos::View<std::uint8_t*, Kokkos::HostSpace>("kompress::homomorphic_failed", chunks);
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
                             code_chunk_encoder<T, B>{values_ + begin, codes_.data() + begin, coded_.data() + begin,
                                                      grid_, reduced, n, slots_.data(), slot_bytes_, lengths_.data(),
                                                      errors_.data()});
      });
      exec_.fence("kompress::homomorphic: codes encoded");
      std::size_t length = chunks * 4;
      for (std::size_t j = 0; j < chunks; ++j) length += lengths_(j);
      if (rule.send_compressed(raw, length)) {
        std::byte* at = out + chunks * 4;
        for (std::size_t j = 0; j < chunks; ++j) {
          store<std::uint32_t>(out + 4 * j, std::uint32_t(lengths_(j)));
          std::memcpy(at, slots_.data() + j * slot_bytes_, lengths_(j));
          at += lengths_(j);
        }
        if (!reduced) note_errors(chunks);  // this rank's values were quantized
        return length;
      }
    }
    if (reduced) {
      values(begin, n, reinterpret_cast<T*>(out));  // out is suitably aligned staging
    } else {
      std::memcpy(out, values_ + begin, raw);
    }
    return raw;
  }

  /// Adds an arrival (a message for the span) to this rank's own values of the span.
  void add(std::size_t begin, std::size_t n, const std::byte* in, std::size_t length, const char* who) {
    if (n == 0) return;
    if (length == n * sizeof(T)) {  // raw partial sums: this rank's exact values added in floating point
      T* const values = values_ + begin;
      std::uint8_t* const coded = coded_.data() + begin;
      Kokkos::parallel_for("kompress::homomorphic::add_raw", Kokkos::RangePolicy<Exec>(exec_, 0, n),
                           raw_adder{in, values, coded, block_size_});
      exec_.fence("kompress::homomorphic: raw sums added");
      return;
    }
    const std::size_t chunks = table(in, length, n, who);
    dispatch_block_size(block_size_, [&](auto block) {
      constexpr int B = decltype(block)::value;
      Kokkos::parallel_for("kompress::homomorphic::add", Kokkos::RangePolicy<Exec>(exec_, 0, chunks),
                           code_chunk_adder<T, B>{in, lengths_.data(), values_ + begin, codes_.data() + begin,
                                                  coded_.data() + begin, grid_, n, failed_.data(), errors_.data()});
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
                           code_chunk_decoder<T, B>{in, lengths_.data(), out, grid_, n, failed_.data()});
    });
    exec_.fence("kompress::homomorphic: sums decoded");
    check_chunks(chunks, who);
  }

  /// The values of a reduced span.
  void values(std::size_t begin, std::size_t n, T* out) {
    dispatch_block_size(block_size_, [&](auto block) {
      constexpr int B = decltype(block)::value;
      Kokkos::parallel_for("kompress::homomorphic::values", Kokkos::RangePolicy<Exec>(exec_, 0, n),
                           code_span_values<T, B>{values_ + begin, codes_.data() + begin, coded_.data() + begin,
                                                  grid_, out});
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

  std::size_t chunk_values() const { return std::size_t(block_size_) * code_blocks_per_chunk; }
  std::size_t chunks_of(std::size_t n) const { return (n + chunk_values() - 1) / chunk_values(); }

  /// Reads the chunk table of a code message into offsets (lengths_); returns the chunk count.
  std::size_t table(const std::byte* in, std::size_t length, std::size_t n, const char* who) {
    const std::size_t chunks = chunks_of(n);
    std::size_t at = chunks * 4;
    bool fits = grid_.active() && length >= at;
    for (std::size_t j = 0; j < chunks && fits; ++j) {
      lengths_(j) = at;
      at += load<std::uint32_t>(in + 4 * j);
      fits = at <= length;
    }
    if (!fits || at != length)
      throw format_error(std::string(who) + ": a received message of " + std::to_string(length) +
                         " bytes is not a code message of " + std::to_string(n) + " values");
    lengths_(chunks) = at;
    return chunks;
  }

  void check_chunks(std::size_t chunks, const char* who) const {
    for (std::size_t j = 0; j < chunks; ++j)
      if (failed_(j))
        throw format_error(std::string(who) + ": a received code message is malformed (chunk " + std::to_string(j) +
                           ")");
  }

  void note_errors(std::size_t chunks) {
    if (!measure_) return;
    for (std::size_t j = 0; j < chunks; ++j) max_error_ = std::max(max_error_, errors_(j));
  }

  Exec exec_;
  code_grid grid_;
  int block_size_;
  T* values_;
  Kokkos::View<std::int64_t*, Kokkos::HostSpace> codes_;
  Kokkos::View<std::uint8_t*, Kokkos::HostSpace> coded_;
  Kokkos::View<std::byte*, Kokkos::HostSpace> slots_;
  std::size_t slot_bytes_ = 0;
  Kokkos::View<std::uint64_t*, Kokkos::HostSpace> lengths_;
  Kokkos::View<double*, Kokkos::HostSpace> errors_;
  Kokkos::View<std::uint8_t*, Kokkos::HostSpace> failed_;
  bool measure_ = false;
  double max_error_ = NAN;
};

}  // namespace kompress::inline v0::detail
