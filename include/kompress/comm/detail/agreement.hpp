#pragma once
// Agreement on a collective's arguments before any data moves: every rank runs its local
// checks, then the ranks combine (a) whether any rank's checks failed, (b) a fingerprint of
// what must be equal on every rank (element type, mode, counts, bound...) and (c) a balance of
// the per-pair message counts (each sender adds a term per message, each receiver subtracts
// the same term: the sum is 0 when every pair agrees). Every rank reaches the same verdict from
// the same combined numbers, so a bad call throws on every rank and never leaves a peer waiting
// on a message.
//
// This file holds what an agreement is and its verdict, and the agreement of any number of
// ranks: one small MPI_Allreduce (one rank has only its own numbers). On two to four ranks the
// numbers travel as one message between every pair instead, which may carry a small call's data
// too: comm/detail/small_calls.hpp, whose agree() is the entry point every collective calls.

#include <kompress/detail/mpi.hpp>
#include <kompress/error.hpp>

#include <mpi.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <exception>
#include <span>
#include <string>
#include <vector>

namespace kompress::inline v0::detail {

/// Which collective a fingerprint belongs to: calls of different kinds never match.
enum class collective_kind : std::uint64_t {
  alltoall = 1, alltoallv, allreduce, dlrm_forward, dlrm_backward, allgather, reduce_scatter
};

/// The abort marker: a message of 3 bytes, the rank that failed (little-endian, 0xFFFFFF if it
/// does not fit). Every data message is at least 4 bytes (one value raw; a stream's header; a
/// code message's table; an agreement message's header) and every receive expects at least 4,
/// so a message shorter than 4 bytes is never data, and a posted receive accepts it. It carries
/// the rank so that a marker relayed around the ring still names the rank that failed.
inline constexpr std::size_t abort_marker_bytes = 3;
inline constexpr std::size_t min_message_bytes = 4;
inline constexpr unsigned unnamed_rank = 0xFFFFFF;

inline void write_abort_marker(int failed_rank, std::byte (&marker)[abort_marker_bytes]) {
  const unsigned named = unsigned(failed_rank) < unnamed_rank ? unsigned(failed_rank) : unnamed_rank;
  for (std::size_t i = 0; i < abort_marker_bytes; ++i) marker[i] = std::byte((named >> (8 * i)) & 0xFF);
}

/// The failed rank a message of `length` bytes at `at` from `sender` names, if it is an abort
/// marker: 3 bytes naming a rank of the communicator of `ranks` (the sender itself where the
/// rank did not fit). -1 otherwise: a short message that names no rank is damaged, not a marker.
inline int abort_marker_rank(const void* at, std::size_t length, int sender, int ranks) {
  if (length != abort_marker_bytes) return -1;
  const auto* bytes = static_cast<const std::byte*>(at);
  unsigned named = 0;
  for (std::size_t i = 0; i < abort_marker_bytes; ++i) named |= unsigned(bytes[i]) << (8 * i);
  if (named == unnamed_rank) return unsigned(ranks) > unnamed_rank ? sender : -1;
  return named < unsigned(ranks) ? int(named) : -1;
}

/// Added to the fingerprint of a persistent collective's init: it never matches a one-shot call.
inline constexpr std::uint64_t persistent_call_mark = 0x70657273697374ull;

/// An order-dependent 64-bit hash of the values that must match on every rank.
class fingerprint {
 public:
  fingerprint& add(std::uint64_t value) {
    state_ = mix(state_ ^ (value + 0x9E3779B97F4A7C15ull + (state_ << 6) + (state_ >> 2)));
    return *this;
  }
  fingerprint& add(double value) { return add(std::bit_cast<std::uint64_t>(value)); }
  std::uint64_t value() const { return state_; }

  static std::uint64_t mix(std::uint64_t z) {  // splitmix64's finalizer
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }

 private:
  std::uint64_t state_ = 0x6B6F6D7072657373ull;
};

/// The term of one message of `count` elements from `from` to `to` in the pair balance.
inline std::uint64_t pair_term(int from, int to, std::uint64_t count) {
  return fingerprint{}.add(std::uint64_t(from)).add(std::uint64_t(to)).add(count).value();
}

/// What one rank brings to the agreement.
struct agreement {
  std::exception_ptr local_failure;  ///< from this rank's checks; null when they passed
  std::uint64_t fingerprint = 0;     ///< of what must be equal on every rank
  std::uint64_t pair_balance = 0;    ///< sum of pair_term over sends minus over receives
  const char* must_match = "";       ///< the words for what the fingerprint covers
  /// Element counts per peer, for naming a mismatched pair (optional; alltoallv).
  const std::vector<std::size_t>* send_counts = nullptr;
  const std::vector<std::size_t>* recv_counts = nullptr;
};

/// Runs `check`; an exception it throws becomes the agreement's local failure.
template <class Check>
std::exception_ptr run_local_checks(Check&& check) {
  try {
    check();
  } catch (...) {
    return std::current_exception();
  }
  return nullptr;
}

inline void agreement_reduce(void* in, void* inout, int* length, MPI_Datatype*) {
  const auto* a = static_cast<const std::uint64_t*>(in);
  auto* b = static_cast<std::uint64_t*>(inout);
  for (int i = 0; i + 3 < *length; i += 4) {
    for (int k = 0; k < 3; ++k) b[i + k] = a[i + k] > b[i + k] ? a[i + k] : b[i + k];  // max
    b[i + 3] += a[i + 3];                                                              // sum
  }
}

/// Names the first pair whose counts differ (every rank calls it, on the error path only).
inline std::string describe_pair_mismatch(const agreement& a, MPI_Comm comm, const char* who) {
  if (!a.send_counts || !a.recv_counts) return "";
  const comm_shape shape = shape_of(comm, who);
  std::vector<unsigned long long> sent(a.send_counts->begin(), a.send_counts->end()), told(shape.size);
  check_mpi(MPI_Alltoall(sent.data(), 1, MPI_UNSIGNED_LONG_LONG, told.data(), 1, MPI_UNSIGNED_LONG_LONG, comm), who,
            "MPI_Alltoall");
  for (int peer = 0; peer < shape.size; ++peer)
    if (told[peer] != (*a.recv_counts)[peer])
      return " (this rank, " + std::to_string(shape.rank) + ", expects " + std::to_string((*a.recv_counts)[peer]) +
             " values from rank " + std::to_string(peer) + ", which sends " + std::to_string(told[peer]) + ")";
  return " (this rank's receive counts match; another rank's do not)";
}

/// Throws the verdict of the combined numbers {failed rank + 1, max fingerprint, max of its
/// complement, pair balance} (`consistent`: what the two ranks carry matches): the local
/// failure where there was one, else an invalid_argument naming what differs; nothing when
/// the call is accepted.
inline void throw_if_rejected(const agreement& a, const std::uint64_t (&values)[4], bool consistent, MPI_Comm comm,
                              const char* who) {
  if (a.local_failure) std::rethrow_exception(a.local_failure);
  if (values[0] != 0)
    throw invalid_argument(std::string(who) + ": rank " + std::to_string(values[0] - 1) +
                           " rejected its arguments (its exception says why); no data moved");
  const std::string disagree =
      std::string(who) + ": ranks disagree on " + a.must_match + "; every rank must pass the same; no data moved";
  if (values[1] != ~values[2]) throw invalid_argument(disagree);
  if (values[3] != 0)
    throw invalid_argument(std::string(who) +
                           ": send and receive counts do not match between ranks (what rank i sends to rank j "
                           "must be what rank j expects from rank i)" +
                           describe_pair_mismatch(a, comm, who) + "; no data moved");
  if (!consistent) throw invalid_argument(disagree);
}

/// The agreement by one MPI_Allreduce of the four numbers (on one rank, its own numbers). Throws
/// the same verdict on every rank: the local failure where there was one, else an
/// invalid_argument naming what differs.
inline void agree_by_allreduce(const agreement& a, comm_shape shape, MPI_Comm comm, const char* who) {
  std::uint64_t values[4] = {a.local_failure ? std::uint64_t(shape.rank) + 1 : 0, a.fingerprint, ~a.fingerprint,
                             a.pair_balance};
  if (shape.size > 1) {
    MPI_Op op = MPI_OP_NULL;
    check_mpi(MPI_Op_create(&agreement_reduce, 1, &op), who, "MPI_Op_create");
    const int code = MPI_Allreduce(MPI_IN_PLACE, values, 4, MPI_UINT64_T, op, comm);
    MPI_Op_free(&op);
    check_mpi(code, who, "MPI_Allreduce");
  }
  throw_if_rejected(a, values, true, comm, who);
}

}  // namespace kompress::inline v0::detail
