#pragma once
// Pipelining inside one peer's message: a message that may be compressed is cut into chunks,
// each its own stream (or its raw values) and its own MPI message, so that the compression of
// chunk k+1, the transfer of chunk k and the decoding of chunk k-1 overlap, also when a rank
// has a single peer. The exchange engine (alltoall(v)) and the ring (allreduce, allgather,
// reduce_scatter) both cut their messages with chunk_plan and move them with the two helpers
// below. docs/collectives.md gives the model behind the chunk size.
//
// Matching: the chunks of one message travel on the collective's one tag, in order. MPI keeps
// messages between one pair of ranks on one (tag, communicator) in order, and matches receives
// posted in order, so chunk i lands in the receive posted for chunk i. Both sides compute the
// same plan from what they agreed on (the cost model, the mode, the message's element count):
// no header, no extra message.

#include <kompress/comm/cost_model.hpp>

#include <mpi.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>

namespace kompress::inline v0::detail {

/// How a message of `values` elements is cut: chunks of `chunk` values, the last one shorter.
/// A message of no values has no chunk.
struct chunk_plan {
  std::size_t values = 0;
  std::size_t chunk = 1;  ///< values per chunk, >= 1

  std::size_t count() const { return values == 0 ? 0 : (values + chunk - 1) / chunk; }
  std::size_t begin(std::size_t i) const { return i * chunk; }
  std::size_t size(std::size_t i) const { return std::min(chunk, values - i * chunk); }
};

/// Chunks are a multiple of this many values (every block size divides it), so that no chunk
/// but the last ends in a partial codec block.
inline constexpr std::size_t chunk_granule = 1024;

/// The plan for a message of `values` elements of `value_bytes` each. `compressible`: whether
/// the wire rule lets this message be compressed (a raw message goes whole: nothing to
/// overlap). `nominal_bytes` is the size the chunk count is computed for, the same on both
/// sides (the message's own size, or for the ring the agreed per-hop size).
inline chunk_plan plan_chunks(const cost_model& cost, bool compressible, std::size_t values, std::size_t value_bytes,
                              std::uint64_t nominal_bytes) {
  chunk_plan plan{values, std::max<std::size_t>(values, 1)};
  if (!compressible || values == 0) return plan;
  if (!cost.pipeline) return plan;
  std::size_t chunk = 0;
  if (cost.fixed_chunk_bytes > 0) {
    chunk = std::max<std::size_t>(1, std::size_t(cost.fixed_chunk_bytes / value_bytes));  // as stated
  } else {
    chunk = std::size_t(cost.chunk_bytes(nominal_bytes) / value_bytes);
    chunk = std::max(chunk_granule, (chunk + chunk_granule - 1) / chunk_granule * chunk_granule);
  }
  plan.chunk = std::min(chunk, values);
  return plan;
}

/// Posts one receive per chunk of `plan`, in order, each of its raw size at its raw offset in
/// `base` (chunk i at base + begin(i) * value_bytes); `key(i)` is what the arrival reports.
template <class Posted, class Key>
void post_chunk_receives(Posted& posted, const chunk_plan& plan, std::size_t value_bytes, std::byte* base, int peer,
                         MPI_Comm comm, const char* who, Key&& key) {
  for (std::size_t i = 0; i < plan.count(); ++i)
    posted.receive(base + plan.begin(i) * value_bytes, plan.size(i) * value_bytes, peer, comm, who, key(i));
}

/// What a message sends: encode()'s bytes, or none once the call is aborting, for which
/// posted.send sends the abort marker (posted_messages, comm/detail/engine.hpp), so the peer's
/// receive is still matched. An exception from encode() is this rank's failure: the call is
/// aborting from then on and nothing more is encoded.
template <class Posted, class Encode>
auto encoded_or_marker(Posted& posted, Encode&& encode) -> decltype(encode()) {
  if (posted.failure().aborting()) return {};
  try {
    return encode();
  } catch (...) {
    posted.failure().record_local();
    return {};
  }
}

/// Sends the chunks of `plan` to `peer` in order: encode(i) gives chunk i's bytes (a stream or
/// the raw values; they must stay put until the send completes), each leaves at once, and
/// after each one poll() advances MPI and decodes what has arrived, so the transfer of chunk i
/// and the decoding of arrivals overlap the encoding of chunk i+1. Once the call is aborting,
/// each chunk's message is the abort marker (encoded_or_marker).
template <class Posted, class Encode, class Poll>
void send_chunks(Posted& posted, const chunk_plan& plan, int peer, MPI_Comm comm, const char* who, Encode&& encode,
                 Poll&& poll) {
  for (std::size_t i = 0; i < plan.count(); ++i) {
    const std::span<const std::byte> payload = encoded_or_marker(posted, [&] { return encode(i); });
    posted.send(payload.data(), payload.size(), peer, comm, who);
    poll();
  }
}

}  // namespace kompress::inline v0::detail
