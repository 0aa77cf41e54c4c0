#pragma once
// Options and per-call reports of the compressed collectives.

#include <kompress/bound.hpp>

#include <cmath>
#include <cstdint>

namespace kompress {
inline namespace v0 {

/// Whether a collective compresses what it sends.
enum class transfer_mode {
  compressed,  ///< compress every message (a message that would grow is sent raw)
  raw,         ///< plain MPI, no compression
  automatic,   ///< compress only where the cost model says it pays
};

/// What the allreduce bound means.
enum class allreduce_bound {
  per_hop,  ///< every compression is within the bound; the result within p times it
  total,    ///< the result is within the bound; every compression gets bound / p
};

/// The cost model of automatic mode (docs/collectives.md). Every rank must hold the same
/// numbers: decisions are taken on each side of a message without talking about them.
/// kompress::measure_cost_model measures them and agrees on them across ranks.
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

struct collective_options {
  error_bound bound = relative(1e-3);
  transfer_mode mode = transfer_mode::compressed;
  allreduce_bound reduction_bound = allreduce_bound::per_hop;
  cost_model cost{};
  int block_size = 32;
  /// Decode what this rank sends and report the largest error (costs one decompression).
  bool measure_error = false;
};

/// What one call did on the calling rank.
struct collective_report {
  std::uint64_t payload_bytes = 0;      ///< bytes of values this rank sent to other ranks
  std::uint64_t wire_bytes = 0;         ///< bytes it put on the wire for them
  std::uint64_t messages = 0;           ///< messages it sent
  std::uint64_t compressed_messages = 0;
  double absolute_bound = 0.0;          ///< guaranteed |error| of every value this call delivers
  double max_error = NAN;               ///< measured, with collective_options::measure_error

  double ratio() const { return wire_bytes ? double(payload_bytes) / double(wire_bytes) : 1.0; }
  bool sent_raw() const { return compressed_messages == 0; }
};

}  // namespace v0
}  // namespace kompress
