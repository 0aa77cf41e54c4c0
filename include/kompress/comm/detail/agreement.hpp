#pragma once
// Agreement on a collective's arguments before any data moves: every rank runs its local
// checks, then one small MPI_Allreduce combines (a) whether any rank's checks failed, (b) a
// fingerprint of what must be equal on every rank (element type, mode, counts, bound...) and
// (c) a balance of the per-pair message counts (each sender adds a term per message, each
// receiver subtracts the same term: the sum is 0 when every pair agrees). Every rank reaches
// the same verdict from the same reduced numbers, so a bad call throws on every rank and never
// leaves a peer waiting on a message.

#include <kompress/detail/mpi.hpp>
#include <kompress/error.hpp>

#include <mpi.h>

#include <bit>
#include <cstdint>
#include <exception>
#include <string>
#include <vector>

namespace kompress::inline v0::detail {

/// Which collective a fingerprint belongs to: calls of different kinds never match.
enum class collective_kind : std::uint64_t {
  alltoall = 1, alltoallv, allreduce, dlrm_forward, dlrm_backward, allgather, reduce_scatter
};

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

/// The agreement itself: one MPI_Allreduce of four integers. Throws the same verdict on every
/// rank: the local failure where there was one, else an invalid_argument naming what differs.
inline void agree(const agreement& a, MPI_Comm comm, const char* who) {
  const comm_shape shape = shape_of(comm, who);
  std::uint64_t values[4] = {a.local_failure ? std::uint64_t(shape.rank) + 1 : 0, a.fingerprint, ~a.fingerprint,
                             a.pair_balance};
  MPI_Op op = MPI_OP_NULL;
  check_mpi(MPI_Op_create(&agreement_reduce, 1, &op), who, "MPI_Op_create");
  const int code = MPI_Allreduce(MPI_IN_PLACE, values, 4, MPI_UINT64_T, op, comm);
  MPI_Op_free(&op);
  check_mpi(code, who, "MPI_Allreduce");
  if (a.local_failure) std::rethrow_exception(a.local_failure);
  if (values[0] != 0)
    throw invalid_argument(std::string(who) + ": rank " + std::to_string(values[0] - 1) +
                           " rejected its arguments (its exception says why); no data moved");
  if (values[1] != ~values[2])
    throw invalid_argument(std::string(who) + ": ranks disagree on " + a.must_match +
                           "; every rank must pass the same; no data moved");
  if (values[3] != 0)
    throw invalid_argument(std::string(who) +
                           ": send and receive counts do not match between ranks (what rank i sends to rank j "
                           "must be what rank j expects from rank i)" +
                           describe_pair_mismatch(a, comm, who) + "; no data moved");
}

}  // namespace kompress::inline v0::detail
