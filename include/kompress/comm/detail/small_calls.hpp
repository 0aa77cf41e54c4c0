#pragma once
// The small-call paths: everything kompress does differently on two to four ranks, in one
// place. There the agreement (comm/detail/agreement.hpp) travels as one message between every
// pair of ranks instead of an MPI_Allreduce, and a small raw call's data rides in it
// (docs/collectives.md, "Two ranks: the data rides the agreement"): then the agreement is the
// whole collective, one message each way, as plain MPI's. On two ranks a persistent raw call's
// rounds are one exchange with the peer (persistent_pair_exchange), and a raw alltoall takes
// the engine's pairwise messages rather than MPI_Alltoall. Only host memory read directly
// takes these paths (transport::small_calls); the collectives ask the functions here whether
// and what to carry, and never branch on the rank count themselves but for one rank.
//
// The agreement carries a payload as opaque bytes (carried_payload: what goes to each peer,
// where each peer's lands) and runs the caller's work while its messages travel; a small_call
// says what those bytes are for each collective and finishes the call once they moved.
// Between pairs, a send MPI rejects leaves as an abort marker, so that no peer waits for it
// (docs/collectives.md, "When the agreement's own messages fail").

#include <kompress/comm/detail/agreement.hpp>
#include <kompress/comm/detail/engine.hpp>
#include <kompress/comm/detail/transport.hpp>
#include <kompress/comm/persistent.hpp>
#include <kompress/detail/mpi.hpp>
#include <kompress/error.hpp>

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace kompress::inline v0::detail {

/// Bytes a call sends with its agreement messages instead of after them, opaque to the
/// agreement: `send_bytes` to peer j at send + j * send_stride, and `arrival_bytes` from peer j
/// landing at arrival + j * arrival_stride (on two ranks the strides are 0 and the addresses
/// the one peer's). A call offers one only when raw and at most carried_limit(ranks) per
/// message; it rides only if every rank offers its own and the ranks agree. The arrivals are
/// written only when the call is accepted.
struct carried_payload {
  bool offered = false;
  const std::byte* send = nullptr;
  std::size_t send_bytes = 0;
  std::size_t send_stride = 0;
  std::byte* arrival = nullptr;
  std::size_t arrival_bytes = 0;
  std::size_t arrival_stride = 0;

  const std::byte* to(int peer) const { return send + std::size_t(peer) * send_stride; }
  std::byte* from(int peer) const { return arrival + std::size_t(peer) * arrival_stride; }
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

/// Writes this rank's agreement message header (header_words words) to `out`.
inline void write_header(const agreement& a, const carried_payload& carry, comm_shape shape, bool offers,
                         std::uint64_t* out) {
  const std::uint64_t words[header_words] = {a.local_failure ? std::uint64_t(shape.rank) + 1 : 0,
                                             a.fingerprint,
                                             ~a.fingerprint,
                                             a.pair_balance,
                                             offers,
                                             offers ? carry.send_bytes : 0,
                                             offers ? carry.arrival_bytes : 0,
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
template <class Meanwhile>
bool agree_pair(const agreement& a, const carried_payload& carry, const Meanwhile& meanwhile, comm_shape shape,
                MPI_Comm comm, const char* who) {
  constexpr std::size_t message_words = header_words + inline_payload_bytes / sizeof(std::uint64_t);
  constexpr std::size_t header_bytes = header_words * sizeof(std::uint64_t);
  const int peer = 1 - shape.rank;
  const bool offers = !a.local_failure && carry.offered;
  const bool inline_send = offers && carry.send_bytes <= inline_payload_bytes;
  // On the stack: heap blocks of this size come back from the allocator untouched (trimmed),
  // and their page faults cost more than a small exchange itself.
  std::uint64_t mine[message_words];
  std::uint64_t theirs[message_words];
  write_header(a, carry, shape, offers, mine);
  if (inline_send && carry.send_bytes > 0) std::memcpy(mine + header_words, carry.to(peer), carry.send_bytes);
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
    messages.send(carry.to(peer), carry.send_bytes, peer, &sends[1]);
  // The caller's work runs while a message travels: the peer's agreement message, or, where a
  // payload follows it, that payload (its receive posted first).
  const bool early = carry.arrival_bytes <= inline_payload_bytes;
  if (offers && early) meanwhile();
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
  void* const landing = accepted ? carry.from(peer) : static_cast<void*>(drain.data());
  if (following > 0)
    check_mpi(MPI_Irecv(landing, int(following), MPI_BYTE, peer, agreement_tag, comm, &receives[1]), who,
              "MPI_Irecv");
  if (offers && !early) meanwhile();
  check_mpi(MPI_Wait(&receives[1], &status), who, "MPI_Wait");
  if (following > 0) messages.arrived(landing, status, following, peer);
  check_mpi(MPI_Waitall(2, sends, MPI_STATUSES_IGNORE), who, "MPI_Waitall");
  if (a.local_failure) std::rethrow_exception(a.local_failure);
  if (messages.failed()) messages.raise();
  if (!accepted) throw_if_rejected(a, values, consistent, comm, who);
  if (both_offer && following == 0 && carry.arrival_bytes > 0)
    std::memcpy(carry.from(peer), theirs + header_words, carry.arrival_bytes);
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
template <class Meanwhile>
bool agree_pairwise(const agreement& a, const carried_payload& carry, const Meanwhile& meanwhile, comm_shape shape,
                    MPI_Comm comm, const char* who) {
  constexpr std::size_t message_words = header_words + pairwise_inline_bytes / sizeof(std::uint64_t);
  constexpr int message_capacity = int(message_words * sizeof(std::uint64_t));
  constexpr std::size_t header_bytes = header_words * sizeof(std::uint64_t);
  const int p = shape.size;
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
      write_header(a, carry, shape, offers, message);
      if (inline_send && carry.send_bytes > 0)
        std::memcpy(message + header_words, carry.to(peer), carry.send_bytes);
    }
    // The payload follows only a header that left: after a marker the peer expects nothing more.
    if (messages.send(message, message_bytes, peer, &sends[slot]) && offers && !inline_send)
      messages.send(carry.to(peer), carry.send_bytes, peer, &sends[p + slot]);
  }
  if (offers) meanwhile();  // while the messages travel
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
    landing[slot] = carried ? carry.from(peer) : static_cast<void*>(drain.data() + at);
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
      std::memcpy(carry.from(peer_at(slot)), incoming[slot] + header_words, carry.arrival_bytes);
  return carried;
}


/// The agreement on any number of ranks (the verdict: agreement.hpp): between pairs on two to
/// max_pairwise_ranks ranks, carrying `carry` and running `meanwhile()` while the messages
/// travel where this rank offers one; else one MPI_Allreduce. Throws the same verdict on every
/// rank. Returns whether the payloads moved (every rank offered one and the call is accepted).
template <class Meanwhile>
bool agree_carrying(const agreement& a, const carried_payload& carry, const Meanwhile& meanwhile, MPI_Comm comm,
                    const char* who) {
  const comm_shape shape = shape_of(comm, who);
  if (shape.size == 2) return agree_pair(a, carry, meanwhile, shape, comm, who);
  if (shape.size > 2 && shape.size <= max_pairwise_ranks) return agree_pairwise(a, carry, meanwhile, shape, comm, who);
  agree_by_allreduce(a, shape, comm, who);
  return false;
}

/// The agreement of a call that carries no data.
inline void agree(const agreement& a, MPI_Comm comm, const char* who) {
  agree_carrying(a, carried_payload{}, [] {}, comm, who);
}

/// out = own + other, n values: a sum on two ranks from the peer's values (the same bits on both
/// ranks: IEEE addition commutes, and it is MPI's own result there). `out` may be `own` or
/// `other`. On the calling thread: these messages are small (at most max_carried_bytes), and a
/// parallel region would cost more than the add at the sizes they exist for.
template <class T>
void add_pair(T* out, const T* own, const T* other, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) out[i] = own[i] + other[i];
}

/// A small raw call as the pairs carry it: its payload, and what completes it. For alltoall(v)
/// and allgather, this rank's own `count` values are copied from `own` to `out` while the
/// messages travel, as MPI's own collectives do (written before the verdict: its own values in
/// its own place). For the sums (two ranks), out = own + the peer's values once they arrived.
/// `scratch` holds the peer's values where they cannot land in `out` (an in-place allreduce).
template <class T>
struct small_call {
  carried_payload payload;
  const T* own = nullptr;
  T* out = nullptr;
  std::size_t count = 0;
  bool sums = false;
  std::shared_ptr<T[]> scratch;

  void copy_own() const {
    if (!sums && count > 0) std::memcpy(out, own, count * sizeof(T));
  }
  /// After the payloads moved: the sum with the peer's values (on two ranks).
  void finish(int peer) const {
    if (sums) add_pair(out, own, reinterpret_cast<const T*>(payload.from(peer)), count);
  }
};

/// The agreement of a call offering `call`'s data. Returns whether it moved; then the call is
/// complete once call.finish(peer) ran (finish_small_call).
template <class T>
bool agree(const agreement& a, const small_call<T>& call, MPI_Comm comm, const char* who) {
  return agree_carrying(a, call.payload, [&] { call.copy_own(); }, comm, who);
}

/// Completes a call whose data moved with the agreement: on two ranks the sums add the peer's
/// values; otherwise everything is in place already.
template <class T>
void finish_small_call(const small_call<T>& call, comm_shape shape) {
  if (shape.size == 2) call.finish(1 - shape.rank);
}

/// Whether a one-shot raw call whose messages are `bytes` long offers its data to the
/// agreement: on two to max_pairwise_ranks ranks (only two for the sums and alltoallv, whose
/// messages differ between pairs), host memory read directly, at most carried_limit bytes.
inline bool offers_small_call(comm_shape shape, transport how, bool sends_raw, std::size_t bytes,
                              bool two_ranks_only) {
  return sends_raw && how.small_calls() && shape.size >= 2 && shape.size <= max_pairwise_ranks &&
         (!two_ranks_only || shape.size == 2) && bytes <= carried_limit(shape.size);
}

/// Whether a persistent raw call's rounds are one exchange with the peer
/// (persistent_pair_exchange): on two ranks, where a one-shot call would carry `call` with its
/// agreement (above that size, MPI's own persistent collective, as measured there).
template <class T>
bool pair_rounds(comm_shape shape, const small_call<T>& call) {
  return shape.size == 2 && call.payload.offered;
}

/// Whether a raw alltoall(v) takes kompress's engine rather than MPI's collective: on two ranks,
/// where the engine's pairwise messages measured faster than MPI_Alltoall after the same
/// agreement; on more ranks MPI's own algorithm is far faster (docs/performance.md,
/// "Persistent collectives").
inline bool raw_exchange_takes_engine(comm_shape shape) { return shape.size == 2; }

/// allreduce's data on two ranks: its whole input to the peer, the peer's into the result
/// View (in place: into scratch), summed with its own. Offered where offers_small_call says.
template <class T>
small_call<T> allreduce_small_call(const T* send, T* recv, std::size_t n, comm_shape shape, transport how,
                                   bool sends_raw) {
  small_call<T> call{{}, send, recv, n, true, nullptr};
  if (!offers_small_call(shape, how, sends_raw, n * sizeof(T), true)) return call;
  std::byte* arrival = reinterpret_cast<std::byte*>(recv);
  if (static_cast<const void*>(send) == static_cast<const void*>(recv)) {
    call.scratch = std::make_shared_for_overwrite<T[]>(n);
    arrival = reinterpret_cast<std::byte*>(call.scratch.get());
  }
  call.payload = {true, reinterpret_cast<const std::byte*>(send), n * sizeof(T), 0, arrival, n * sizeof(T), 0};
  return call;
}

/// reduce_scatter's data on two ranks: the peer's block to the peer, the peer's part of this
/// rank's block into the receive View, summed with this rank's own part.
template <class T>
small_call<T> reduce_scatter_small_call(const T* send, T* recv, std::size_t n, comm_shape shape, transport how,
                                        bool sends_raw) {
  const std::size_t bytes = n * sizeof(T);
  small_call<T> call{{}, send + std::size_t(shape.rank) * n, recv, n, true, nullptr};
  if (offers_small_call(shape, how, sends_raw, bytes, true))
    call.payload = {true, reinterpret_cast<const std::byte*>(send + std::size_t(1 - shape.rank) * n), bytes, 0,
                    reinterpret_cast<std::byte*>(recv), bytes, 0};
  return call;
}

/// allgather's data on two to max_pairwise_ranks ranks: this rank's block to every peer (one
/// message serves them all), each peer's into its place in the receive View, this rank's own
/// copied into its place.
template <class T>
small_call<T> allgather_small_call(const T* send, T* recv, std::size_t n, comm_shape shape, transport how,
                                   bool sends_raw) {
  const std::size_t bytes = n * sizeof(T);
  small_call<T> call{{}, send, recv + std::size_t(shape.rank) * n, n, false, nullptr};
  if (offers_small_call(shape, how, sends_raw, bytes, false))
    call.payload = {true, reinterpret_cast<const std::byte*>(send), bytes, 0, reinterpret_cast<std::byte*>(recv),
                    bytes, bytes};
  return call;
}

/// alltoall(v)'s data: on two ranks any layout, the one block to the peer and the peer's; on
/// three to max_pairwise_ranks ranks alltoall's (one count, blocks in rank order), the same
/// offer on every rank that passes the same count. This rank's own block is copied into place.
template <class T>
small_call<T> exchange_small_call(const T* send, T* recv, const exchange_layout& layout, bool uniform,
                                  comm_shape shape, transport how, bool sends_raw) {
  const auto self = std::size_t(shape.rank);
  const auto bytes = [](std::size_t count) { return count * sizeof(T); };
  small_call<T> call{{}, send + layout.send_displs[self], recv + layout.recv_displs[self], layout.send_counts[self],
                     false, nullptr};
  if (shape.size == 2) {
    const auto peer = std::size_t(1 - shape.rank);
    const std::size_t out = bytes(layout.send_counts[peer]), in = bytes(layout.recv_counts[peer]);
    if (offers_small_call(shape, how, sends_raw, std::max(out, in), false))
      call.payload = {true, reinterpret_cast<const std::byte*>(send + layout.send_displs[peer]), out, 0,
                      reinterpret_cast<std::byte*>(recv + layout.recv_displs[peer]), in, 0};
  } else if (uniform && offers_small_call(shape, how, sends_raw, bytes(layout.send_counts[0]), false)) {
    const std::size_t block = bytes(layout.send_counts[0]);
    call.payload = {true, reinterpret_cast<const std::byte*>(send), block, block, reinterpret_cast<std::byte*>(recv),
                    block, block};
  }
  return call;
}

/// A raw round on two ranks as one exchange with the peer, what the one-shot calls do inside
/// the agreement's message: the peer's values arrive where `call` says, then the sums add, or
/// for allgather this rank's own block is copied while the messages travel. MPI's persistent
/// requests (MPI_Send_init, MPI_Recv_init) on a duplicated communicator of the request's own,
/// so the caller's messages never meet them. MPICH's two-rank collectives took 1.0-4.4x longer
/// at every size measured; Open MPI's blocking allreduce beat the exchange at 4-8 KiB
/// (docs/performance.md), so run() times both once, at init, and keeps the faster: `mpi` is
/// MPI's collective on the request's Views (comm/detail/mpi_collective.hpp).
template <class Exec, class SendView, class RecvView, class Mpi>
class persistent_pair_exchange final : public persistent_operation {
 public:
  using T = typename SendView::non_const_value_type;

  persistent_pair_exchange(const Exec& exec, SendView send, RecvView recv, MPI_Comm comm, small_call<T> call,
                           const Mpi& mpi, const collective_report& report, const char* who)
      : exec_(exec), send_(std::move(send)), recv_(std::move(recv)), comm_(comm, who), call_(std::move(call)),
        mpi_(mpi), report_(report), who_(who) {
    if (call_.count == 0) return;
    const int peer = 1 - shape_of(comm_.get(), who).rank;
    run_blocking_ = blocking_wins(peer);  // first: nothing of ours to free if it throws
    const int bytes = int(call_.count * sizeof(T));  // checked to fit at init
    check_mpi(MPI_Recv_init(call_.payload.from(peer), bytes, MPI_BYTE, peer, collective_tag, comm_.get(),
                            &requests_[0]),
              who, "MPI_Recv_init");
    check_mpi(MPI_Send_init(call_.payload.to(peer), bytes, MPI_BYTE, peer, collective_tag, comm_.get(),
                            &requests_[1]),
              who, "MPI_Send_init");
    peer_ = peer;
  }
  persistent_pair_exchange(const persistent_pair_exchange&) = delete;
  persistent_pair_exchange& operator=(const persistent_pair_exchange&) = delete;
  ~persistent_pair_exchange() override {
    // A round is still active here only after a failed MPI call (persistent_request completes
    // it first): its receive is cancelled and completed, so nothing lands in freed scratch.
    if (active_ && requests_[0] != MPI_REQUEST_NULL) {
      MPI_Cancel(&requests_[0]);
      MPI_Wait(&requests_[0], MPI_STATUS_IGNORE);
    }
    for (MPI_Request& r : requests_)
      if (r != MPI_REQUEST_NULL) MPI_Request_free(&r);
  }

  void start() override {
    exec_.fence("kompress: before MPI or the host reads a user View");
    if (call_.count > 0) check_mpi(MPI_Startall(2, requests_), who_, "MPI_Startall");
    active_ = true;
    call_.copy_own();
  }
  bool progress(bool block) override {
    if (!active_) return true;
    if (call_.count > 0) {
      int done = 1;
      if (block) check_mpi(MPI_Waitall(2, requests_, MPI_STATUSES_IGNORE), who_, "MPI_Waitall");
      else check_mpi(MPI_Testall(2, requests_, &done, MPI_STATUSES_IGNORE), who_, "MPI_Testall");
      if (!done) return false;
      call_.finish(peer_);
    }
    active_ = false;
    return true;
  }
  void run() override {
    if (!run_blocking_) {
      start();
      progress(true);
      return;
    }
    exec_.fence("kompress: before MPI reads a user View");
    check_mpi(mpi_.blocking(), who_, Mpi::names[0]);
  }
  const collective_report& report() const override { return report_; }

 private:
  /// Whether MPI's blocking collective beats the exchange: both timed on scratch in batches of
  /// back-to-back calls (a single call of a few microseconds would time the other rank's
  /// arrival), alternating, after untimed batches (a process's first exchanges ran 2-5x slower,
  /// for longer than its first collectives), the best batch of each. The slower rank's times
  /// decide, so both ranks choose alike (MPI_Allreduce of the two times). A cold start errs
  /// towards MPI's collective: run() then costs what plain MPI's call does.
  bool blocking_wins(int peer) {
    constexpr int untimed = 3, batches = 5;
    const std::size_t bytes = call_.count * sizeof(T);
    const int calls = int(std::clamp<std::size_t>((std::size_t(256) << 10) / std::max<std::size_t>(bytes, 1), 2, 32));
    std::vector<T> out(call_.count), in(call_.count, T(1)), arrival(call_.count);
    std::vector<T> mpi_in(send_.size(), T(1)), mpi_out(recv_.size());
    const Mpi on_scratch = mpi_.on(mpi_in.data(), mpi_out.data());
    const auto exchange = [&] {
      MPI_Request r[2];
      check_mpi(MPI_Irecv(arrival.data(), int(bytes), MPI_BYTE, peer, collective_tag, comm_.get(), &r[0]), who_,
                "MPI_Irecv");
      check_mpi(MPI_Isend(in.data(), int(bytes), MPI_BYTE, peer, collective_tag, comm_.get(), &r[1]), who_,
                "MPI_Isend");
      check_mpi(MPI_Waitall(2, r, MPI_STATUSES_IGNORE), who_, "MPI_Waitall");
      add_pair(out.data(), in.data(), arrival.data(), call_.count);  // the sums' add, or the copy's
    };
    const auto mpi_round = [&] { check_mpi(on_scratch.blocking(), who_, Mpi::names[0]); };
    const auto batch = [&](const auto& round) {
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < calls; ++i) round();
      return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    };
    double best[2] = {1e30, 1e30};  // exchange, MPI's collective
    for (int b = 0; b < untimed + batches; ++b) {
      const double t[2] = {batch(exchange), batch(mpi_round)};
      if (b < untimed) continue;
      best[0] = std::min(best[0], t[0]);
      best[1] = std::min(best[1], t[1]);
    }
    check_mpi(MPI_Allreduce(MPI_IN_PLACE, best, 2, MPI_DOUBLE, MPI_MAX, comm_.get()), who_, "MPI_Allreduce");
    return best[1] < best[0];
  }

  Exec exec_;
  SendView send_;  // held: every round reads and writes them
  RecvView recv_;
  owned_comm comm_;
  small_call<T> call_;  // its scratch holds the peer's values where they cannot land in place
  Mpi mpi_;
  collective_report report_;
  const char* who_;
  MPI_Request requests_[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};  // receive, send
  int peer_ = 0;
  bool active_ = false;
  bool run_blocking_ = false;  ///< run() calls MPI's blocking collective (timed faster at init)
};

}  // namespace kompress::inline v0::detail
