#pragma once
// The cost model of automatic mode: when compressing a message pays (docs/collectives.md).

#include <cstdint>

namespace kompress {
inline namespace v0 {

/// The cost model of automatic mode (docs/collectives.md). Every rank must hold the same
/// numbers: decisions are taken on each side of a message without talking about them.
/// kompress::measure_cost_model (kompress/comm/measure.hpp) measures them and makes every rank
/// agree on them.
struct cost_model {
  double link_bytes_per_second = 1.25e9;       ///< 10 Gb/s unless measured or stated
  double compress_bytes_per_second = 0.6e9;    ///< per rank, this machine's codec, 1 thread
  double decompress_bytes_per_second = 2.0e9;
  std::uint64_t min_message_bytes = 64 * 1024; ///< below this, latency dominates: send raw

  /// True when compressing a message of `bytes` could pay, at a ratio of at least 2.
  bool worth_compressing(std::uint64_t bytes) const {
    if (bytes < min_message_bytes) return false;
    const double codec = 1.0 / compress_bytes_per_second + 1.0 / decompress_bytes_per_second;
    return codec + 0.5 / link_bytes_per_second < 1.0 / link_bytes_per_second;
  }

  /// True when `wire_bytes` compressed beat `raw_bytes` raw, the compression already done.
  bool compressed_wins(std::uint64_t raw_bytes, std::uint64_t wire_bytes) const {
    return double(wire_bytes) / link_bytes_per_second + double(raw_bytes) / decompress_bytes_per_second <
           double(raw_bytes) / link_bytes_per_second;
  }
};

}  // namespace v0
}  // namespace kompress
