#pragma once
// Agreement on a collective's arguments before any data moves: every rank runs its local
// checks, then the ranks combine (a) whether any rank's checks failed, (b) a fingerprint of
// what must be equal on every rank (element type, mode, counts, bound...) and (c) a balance of
// the per-pair message counts (each sender adds a term per message, each receiver subtracts
// the same term: the sum is 0 when every pair agrees). Every rank reaches the same verdict from
// the same combined numbers, so a bad call throws on every rank and never leaves a peer waiting
// on a message.
//
// On two ranks each sends the other one message, and a call whose data moves raw and is small
// rides in it (docs/collectives.md, "Two ranks: the data rides the agreement"): then the
// agreement is the whole collective, one message each way, as plain MPI's. On three to
// max_pairwise_ranks ranks every rank sends its numbers to every other, and a small raw
// alltoall or allgather sends each peer's block with them: one round of messages, as a direct
// alltoall. On more ranks the numbers are combined by one small MPI_Allreduce; one rank has only
// its own. Between pairs, a send MPI rejects leaves as an abort marker, so that no peer waits
// for it (docs/collectives.md, "When the agreement's own messages fail").

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

/// Values a call sends with its agreement messages instead of after them: this rank's raw
/// block to each peer and where each peer's lands. Only a call that sends raw data of at most
/// carried_limit(ranks) per message offers one; it rides only if every rank offers its own and
/// the ranks agree. The block to peer j is `send_bytes` at send + j * send_stride, the one from
/// peer j lands at arrival + j * arrival_stride (on two ranks the strides are 0 and the
/// addresses the one peer's).
struct carried_payload {
  bool offered = false;
  const void* send = nullptr;
  std::size_t send_bytes = 0;
  void* arrival = nullptr;  ///< written only when the call is accepted
  std::size_t arrival_bytes = 0;
  /// This rank's block to itself (alltoall(v), allgather), copied while the messages travel,
  /// as MPI's own collectives do: written before the verdict, its own values in its own place.
  const void* self_from = nullptr;
  void* self_to = nullptr;
  std::size_t self_bytes = 0;
  std::size_t send_stride = 0;
  std::size_t arrival_stride = 0;

  const void* send_to(int peer) const { return static_cast<const std::byte*>(send) + std::size_t(peer) * send_stride; }
  void* arrival_from(int peer) const { return static_cast<std::byte*>(arrival) + std::size_t(peer) * arrival_stride; }
};

/// Up to this many bytes ride inside the agreement message itself; a larger payload follows it
/// as a second message, received straight into place once the verdict is known. With the
/// 64-byte header the message stays within 16 KiB: one byte more crossed MPICH's shared-memory
/// eager size and cost a 16 KiB alltoall a quarter of its time (docs/performance.md).
inline constexpr std::size_t inline_payload_bytes = 16 * 1024 - 64;
/// Larger messages take the collective's own path after the agreement: the agreement's one
/// round trip is then a few percent of the call.
inline constexpr std::size_t max_carried_bytes = std::size_t(1) << 20;
/// The same on three or four ranks, where MPI's own alltoall beat the headers and then the
/// blocks at 64 KiB per peer (docs/performance.md, "Three and four ranks").
inline constexpr std::size_t max_pairwise_carried_bytes = 16 * 1024;
/// On three or four ranks up to this many bytes ride inside each header's message (a larger
/// block follows it as a message of its own).
inline constexpr std::size_t pairwise_inline_bytes = 4 * 1024;
/// Up to this many ranks every rank sends its agreement message to every other; beyond, one
/// MPI_Allreduce costs less than p - 1 messages each way (on eight ranks the pairs slowed a
/// 4 KiB allreduce by 12%).
inline constexpr int max_pairwise_ranks = 4;
/// The largest message that rides the agreement on `ranks` ranks (0: none rides).
constexpr std::size_t carried_limit(int ranks) {
  return ranks == 2 ? max_carried_bytes : ranks <= max_pairwise_ranks ? max_pairwise_carried_bytes : 0;
}
/// The tag of agreement messages (and of payloads that follow them) between pairs of ranks.
inline constexpr int agreement_tag = collective_tag + 1;

/// The words of an agreement message between a pair: {failed rank + 1, fingerprint, its
/// complement, pair balance, offers a payload, payload bytes to the peer, bytes expected from
/// it, 0}.
inline constexpr std::size_t header_words = 8;

/// What one rank brings to the agreement.
struct agreement {
  std::exception_ptr local_failure;  ///< from this rank's checks; null when they passed
  std::uint64_t fingerprint = 0;     ///< of what must be equal on every rank
  std::uint64_t pair_balance = 0;    ///< sum of pair_term over sends minus over receives
  const char* must_match = "";       ///< the words for what the fingerprint covers
  /// Element counts per peer, for naming a mismatched pair (optional; alltoallv).
  const std::vector<std::size_t>* send_counts = nullptr;
  const std::vector<std::size_t>* recv_counts = nullptr;
  carried_payload carry;  ///< two ranks only; ignored after a local failure
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

/// Writes this rank's agreement message header (header_words words) to `out`.
inline void write_header(const agreement& a, comm_shape shape, bool offers, std::uint64_t* out) {
  const std::uint64_t words[header_words] = {a.local_failure ? std::uint64_t(shape.rank) + 1 : 0,
                                             a.fingerprint,
                                             ~a.fingerprint,
                                             a.pair_balance,
                                             offers,
                                             offers ? a.carry.send_bytes : 0,
                                             offers ? a.carry.arrival_bytes : 0,
                                             0};
  std::memcpy(out, words, sizeof words);
}

/// Should an MPI call fail midway through an agreement, no receive may land in its frame once
/// that is gone: the pending receives are cancelled and completed, the pending sends left to
/// MPI. (On every other path all requests have completed by then, and this does nothing.)
struct pending_requests {
  std::span<MPI_Request> receives;
  std::span<MPI_Request> sends;
  ~pending_requests() {
    for (MPI_Request& r : receives)
      if (r != MPI_REQUEST_NULL) {
        MPI_Cancel(&r);
        MPI_Wait(&r, MPI_STATUS_IGNORE);
      }
    for (MPI_Request& r : sends)
      if (r != MPI_REQUEST_NULL) MPI_Request_free(&r);
  }
};

/// The agreement's own messages between pairs, and what can go wrong with them besides the
/// arguments: a send MPI rejects (this rank's error: the abort marker goes in its place and in
/// place of every later message this rank sends, so every receive posted for them is matched
/// and the peers learn that this rank failed; a payload is sent only behind a header that left),
/// an abort marker arriving in place of a peer's message, or a message that is neither. Each
/// rejects the call on the rank that sees it; every message is still completed, then raise()
/// throws. Declare it before the requests' pending_requests: the marker's bytes outlive every
/// send.
class agreement_messages {
 public:
  agreement_messages(comm_shape shape, MPI_Comm comm, const char* who) : shape_(shape), comm_(comm), who_(who) {
    write_abort_marker(shape.rank, marker_);
  }

  /// Posts `bytes` at `buffer` to `peer`, or the abort marker once a send of this rank failed.
  /// Returns whether the message itself left. Throws only if MPI rejects the marker too.
  bool send(const void* buffer, std::size_t bytes, int peer, MPI_Request* request) {
    if (!send_failure_) {
      const int code = MPI_Isend(buffer, int(bytes), MPI_BYTE, peer, agreement_tag, comm_, request);
      if (code == MPI_SUCCESS) return true;
      *request = MPI_REQUEST_NULL;
      try {
        check_mpi(code, who_, "MPI_Isend");
      } catch (...) {
        send_failure_ = std::current_exception();
      }
    }
    check_mpi(MPI_Isend(marker_, int(abort_marker_bytes), MPI_BYTE, peer, agreement_tag, comm_, request), who_,
              "MPI_Isend of an abort marker");
    return false;
  }

  /// A receive from `peer` completed with `status` into `at`: whether it holds data of at least
  /// `least` bytes. A shorter message is an abort marker naming a rank, or damaged.
  bool arrived(const void* at, const MPI_Status& status, std::size_t least, int peer) {
    int length = 0;
    check_mpi(MPI_Get_count(&status, MPI_BYTE, &length), who_, "MPI_Get_count");
    if (std::size_t(length) >= least) return true;
    const int named = abort_marker_rank(at, std::size_t(length), peer, shape_.size);
    if (named >= 0 && failed_peer_ < 0) failed_peer_ = named;
    if (named < 0 && damaged_.empty())
      damaged_ = std::string(who_) + ": an agreement message of " + std::to_string(length) + " bytes from rank " +
                 std::to_string(peer) + " is neither its numbers (" + std::to_string(least) +
                 " bytes or more) nor an abort marker naming a rank of the communicator";
    return false;
  }

  bool failed() const { return send_failure_ || failed_peer_ >= 0 || !damaged_.empty(); }

  /// This rank's failed send, else a damaged message, else the peer_error of a marker.
  void raise() const {
    if (send_failure_) std::rethrow_exception(send_failure_);
    if (!damaged_.empty()) throw format_error(damaged_);
    if (failed_peer_ >= 0)
      throw peer_error("rank " + std::to_string(failed_peer_) + " failed during " + who_ +
                           " (an abort marker arrived in place of an agreement message); this rank completed the "
                           "agreement's messages and its output is unspecified",
                       failed_peer_);
  }

 private:
  comm_shape shape_;
  MPI_Comm comm_;
  const char* who_;
  std::byte marker_[abort_marker_bytes];
  std::exception_ptr send_failure_;
  int failed_peer_ = -1;
  std::string damaged_;
};

/// The agreement of two ranks: one message each way, {failed rank + 1, fingerprint, its
/// complement, pair balance, offers a payload, payload bytes, bytes expected, 0} followed by an
/// inline payload, or a payload message of its own after it. Every message posted is received,
/// whatever the verdict (a payload on a rejected call into scratch), so nothing is left for a
/// later call to match; a send MPI rejects leaves as an abort marker (agreement_messages), so
/// the peer is not left waiting. Returns whether the payloads were exchanged.
inline bool agree_pair(const agreement& a, comm_shape shape, MPI_Comm comm, const char* who) {
  constexpr std::size_t message_words = header_words + inline_payload_bytes / sizeof(std::uint64_t);
  constexpr std::size_t header_bytes = header_words * sizeof(std::uint64_t);
  const int peer = 1 - shape.rank;
  const carried_payload& carry = a.carry;
  const bool offers = !a.local_failure && carry.offered;
  const bool inline_send = offers && carry.send_bytes <= inline_payload_bytes;
  // On the stack: heap blocks of this size come back from the allocator untouched (trimmed),
  // and their page faults cost more than a small exchange itself.
  std::uint64_t mine[message_words];
  std::uint64_t theirs[message_words];
  write_header(a, shape, offers, mine);
  if (inline_send && carry.send_bytes > 0) std::memcpy(mine + header_words, carry.send_to(peer), carry.send_bytes);
  const std::size_t message_bytes = header_bytes + (inline_send ? carry.send_bytes : 0);

  MPI_Request receives[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};  // header, payload
  MPI_Request sends[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};     // likewise
  std::vector<std::byte> drain;  // a rejected call's payload; outlives `pending`
  agreement_messages messages(shape, comm, who);
  const pending_requests pending{receives, sends};
  check_mpi(MPI_Irecv(theirs, int(message_words * sizeof(std::uint64_t)), MPI_BYTE, peer, agreement_tag, comm,
                      &receives[0]),
            who, "MPI_Irecv");
  // The payload follows only a header that left: after a marker the peer expects nothing more.
  if (messages.send(mine, message_bytes, peer, &sends[0]) && offers && !inline_send)
    messages.send(carry.send_to(peer), carry.send_bytes, peer, &sends[1]);
  // This rank's own block is copied while a message travels: the peer's agreement message,
  // or, where a payload follows it, that payload (its receive posted first).
  const bool copies_own = offers && carry.self_bytes > 0;
  const bool copies_early = carry.arrival_bytes <= inline_payload_bytes;
  if (copies_own && copies_early) std::memcpy(carry.self_to, carry.self_from, carry.self_bytes);
  MPI_Status status{};
  check_mpi(MPI_Wait(&receives[0], &status), who, "MPI_Wait");
  const bool has_header = messages.arrived(theirs, status, header_bytes, peer);

  // The same numbers on both ranks, combined as MPI_Allreduce would: the same verdict. A rank
  // whose message was a marker offers nothing more.
  std::uint64_t values[4] = {mine[0], mine[1], mine[2], mine[3]};
  bool consistent = true, both_offer = false, accepted = false;
  std::size_t following = 0;
  if (has_header) {
    int four = 4;
    agreement_reduce(theirs, values, &four, nullptr);
    both_offer = mine[4] != 0 && theirs[4] != 0;
    consistent = mine[4] == theirs[4] && (!both_offer || (mine[5] == theirs[6] && theirs[5] == mine[6]));
    accepted = !messages.failed() && values[0] == 0 && values[1] == ~values[2] && values[3] == 0 && consistent;
    // A payload that follows the peer's message: into place if accepted, else drained.
    following = theirs[4] != 0 && theirs[5] > inline_payload_bytes ? std::size_t(theirs[5]) : 0;
  }
  if (following > 0 && !accepted) drain.resize(following);
  void* const landing = accepted ? carry.arrival_from(peer) : static_cast<void*>(drain.data());
  if (following > 0)
    check_mpi(MPI_Irecv(landing, int(following), MPI_BYTE, peer, agreement_tag, comm, &receives[1]), who,
              "MPI_Irecv");
  if (copies_own && !copies_early) std::memcpy(carry.self_to, carry.self_from, carry.self_bytes);
  check_mpi(MPI_Wait(&receives[1], &status), who, "MPI_Wait");
  if (following > 0) messages.arrived(landing, status, following, peer);
  check_mpi(MPI_Waitall(2, sends, MPI_STATUSES_IGNORE), who, "MPI_Waitall");
  if (a.local_failure) std::rethrow_exception(a.local_failure);
  if (messages.failed()) messages.raise();
  if (!accepted) throw_if_rejected(a, values, consistent, comm, who);
  if (both_offer && following == 0 && carry.arrival_bytes > 0)
    std::memcpy(carry.arrival_from(peer), theirs + header_words, carry.arrival_bytes);
  return both_offer;
}

/// The agreement of three to max_pairwise_ranks ranks: every rank sends every other its
/// header (as agree_pair's; every pair's blocks are one size) with, where it offers a payload,
/// that peer's block inside the same message up to pairwise_inline_bytes, else right behind it.
/// Every rank combines the same p headers, so all reach the same verdict. The blocks land in
/// place when every rank offered and the call is accepted; otherwise they are drained, so
/// nothing is left for a later call to match and nothing of a peer's lands in a receive View.
/// A send MPI rejects leaves as an abort marker, and so does every later message of this rank
/// (agreement_messages): when the first send fails every peer gets a marker and rejects the
/// call; a peer that received this rank's header before a later send failed cannot learn of it
/// in this one round (docs/collectives.md, "What is not covered"). Returns whether the blocks
/// moved.
inline bool agree_pairwise(const agreement& a, comm_shape shape, MPI_Comm comm, const char* who) {
  constexpr std::size_t message_words = header_words + pairwise_inline_bytes / sizeof(std::uint64_t);
  constexpr int message_capacity = int(message_words * sizeof(std::uint64_t));
  constexpr std::size_t header_bytes = header_words * sizeof(std::uint64_t);
  const int p = shape.size;
  const carried_payload& carry = a.carry;
  const bool offers = !a.local_failure && carry.offered;
  const bool inline_send = offers && carry.send_bytes <= pairwise_inline_bytes;
  const std::size_t message_bytes = header_bytes + (inline_send ? carry.send_bytes : 0);
  // Slot k - 1 holds the messages to and from the peer k ranks on (k = 1 .. p - 1). Every
  // receive has room for a header and an inline block, whatever the peer offers. On the stack,
  // as agree_pair's: allocations cost a measurable share of a small call.
  const auto peer_at = [&](int slot) { return (shape.rank + slot + 1) % p; };
  std::uint64_t outgoing[max_pairwise_ranks - 1][message_words];
  std::uint64_t incoming[max_pairwise_ranks - 1][message_words];
  // allgather sends every peer the same block: one message serves them all.
  const bool one_message = carry.send_stride == 0;
  MPI_Request receives[2 * max_pairwise_ranks];  // messages, then payloads that follow them
  MPI_Request sends[2 * max_pairwise_ranks];     // likewise
  std::fill(std::begin(receives), std::end(receives), MPI_REQUEST_NULL);
  std::fill(std::begin(sends), std::end(sends), MPI_REQUEST_NULL);
  MPI_Status statuses[2 * max_pairwise_ranks]{};
  std::vector<std::byte> drain;  // payloads of a call that does not carry them; outlives `pending`
  agreement_messages messages(shape, comm, who);
  const pending_requests pending{receives, sends};
  for (int slot = 0; slot < p - 1; ++slot)
    check_mpi(MPI_Irecv(incoming[slot], message_capacity, MPI_BYTE, peer_at(slot), agreement_tag, comm,
                        &receives[slot]),
              who, "MPI_Irecv");
  for (int slot = 0; slot < p - 1; ++slot) {
    const int peer = peer_at(slot);
    std::uint64_t* message = outgoing[one_message ? 0 : slot];
    if (slot == 0 || !one_message) {
      write_header(a, shape, offers, message);
      if (inline_send && carry.send_bytes > 0)
        std::memcpy(message + header_words, carry.send_to(peer), carry.send_bytes);
    }
    // The payload follows only a header that left: after a marker the peer expects nothing more.
    if (messages.send(message, message_bytes, peer, &sends[slot]) && offers && !inline_send)
      messages.send(carry.send_to(peer), carry.send_bytes, peer, &sends[p + slot]);
  }
  if (offers && carry.self_bytes > 0) std::memcpy(carry.self_to, carry.self_from, carry.self_bytes);
  check_mpi(MPI_Waitall(p - 1, receives, statuses), who, "MPI_Waitall");
  bool has_header[max_pairwise_ranks - 1];
  for (int slot = 0; slot < p - 1; ++slot)
    has_header[slot] = messages.arrived(incoming[slot], statuses[slot], header_bytes, peer_at(slot));

  // Every rank combines the same p headers, as MPI_Allreduce would: the same verdict.
  std::uint64_t values[4] = {outgoing[0][0], outgoing[0][1], outgoing[0][2], outgoing[0][3]};
  bool every_rank_offers = offers;
  bool sizes_match = true;  // what each peer sends is what this rank expects, and back
  int four = 4;
  for (int slot = 0; slot < p - 1; ++slot) {
    if (!has_header[slot]) continue;
    const std::uint64_t* theirs = incoming[slot];
    agreement_reduce(incoming[slot], values, &four, nullptr);
    every_rank_offers = every_rank_offers && theirs[4] != 0;
    sizes_match = sizes_match && theirs[5] == carry.arrival_bytes && theirs[6] == carry.send_bytes;
  }
  const bool accepted = !messages.failed() && values[0] == 0 && values[1] == ~values[2] && values[3] == 0;
  const bool carried = accepted && every_rank_offers && sizes_match;

  // Every payload that follows a message is received: into place if the blocks ride, else
  // into scratch. Inline ones are copied into place below.
  const auto follows = [&](int slot) {
    return has_header[slot] && incoming[slot][4] != 0 && incoming[slot][5] > pairwise_inline_bytes;
  };
  std::size_t drained = 0;
  for (int slot = 0; slot < p - 1; ++slot)
    if (!carried && follows(slot)) drained += incoming[slot][5];
  drain.resize(drained);
  void* landing[max_pairwise_ranks - 1] = {};
  std::size_t at = 0;
  for (int slot = 0; slot < p - 1; ++slot) {
    if (!follows(slot)) continue;
    const int peer = peer_at(slot);
    landing[slot] = carried ? carry.arrival_from(peer) : static_cast<void*>(drain.data() + at);
    if (!carried) at += incoming[slot][5];
    check_mpi(MPI_Irecv(landing[slot], int(incoming[slot][5]), MPI_BYTE, peer, agreement_tag, comm,
                        &receives[p + slot]),
              who, "MPI_Irecv");
  }
  check_mpi(MPI_Waitall(p - 1, receives + p, statuses + p), who, "MPI_Waitall");
  for (int slot = 0; slot < p - 1; ++slot)
    if (follows(slot)) messages.arrived(landing[slot], statuses[p + slot], incoming[slot][5], peer_at(slot));
  check_mpi(MPI_Waitall(2 * p, sends, MPI_STATUSES_IGNORE), who, "MPI_Waitall");
  if (a.local_failure) std::rethrow_exception(a.local_failure);
  if (messages.failed()) messages.raise();
  if (!accepted) throw_if_rejected(a, values, true, comm, who);
  // An accepted call whose payload sizes differ between a pair: the pair balance matched by a
  // 64-bit coincidence. This rank's blocks were drained, not written.
  if (every_rank_offers && !sizes_match)
    throw invalid_argument(std::string(who) + ": send and receive counts do not match between ranks; no data moved");
  if (carried && carry.arrival_bytes > 0 && carry.arrival_bytes <= pairwise_inline_bytes)
    for (int slot = 0; slot < p - 1; ++slot)
      std::memcpy(carry.arrival_from(peer_at(slot)), incoming[slot] + header_words, carry.arrival_bytes);
  return carried;
}

/// The agreement itself. Throws the same verdict on every rank: the local failure where there
/// was one, else an invalid_argument naming what differs. Returns whether the carried payloads
/// were exchanged with it (two to four ranks, every rank offered one, accepted): then the
/// call's data moved.
inline bool agree(const agreement& a, MPI_Comm comm, const char* who) {
  const comm_shape shape = shape_of(comm, who);
  if (shape.size == 2) return agree_pair(a, shape, comm, who);
  if (shape.size > 2 && shape.size <= max_pairwise_ranks) return agree_pairwise(a, shape, comm, who);
  std::uint64_t values[4] = {a.local_failure ? std::uint64_t(shape.rank) + 1 : 0, a.fingerprint, ~a.fingerprint,
                             a.pair_balance};
  if (shape.size == 1) {  // nobody to disagree with: this rank's own numbers are the combined ones
    throw_if_rejected(a, values, true, comm, who);
    return false;
  }
  MPI_Op op = MPI_OP_NULL;
  check_mpi(MPI_Op_create(&agreement_reduce, 1, &op), who, "MPI_Op_create");
  const int code = MPI_Allreduce(MPI_IN_PLACE, values, 4, MPI_UINT64_T, op, comm);
  MPI_Op_free(&op);
  check_mpi(code, who, "MPI_Allreduce");
  throw_if_rejected(a, values, true, comm, who);
  return false;
}

}  // namespace kompress::inline v0::detail
