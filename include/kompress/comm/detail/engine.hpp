#pragma once
// The one exchange engine behind alltoall, alltoallv and the DLRM embedding exchange: receives
// posted first, then a rotating schedule of nonblocking sends (rank+1, rank+2, ...), each
// message cut into chunks (comm/detail/pipeline.hpp) encoded in bursts just before they leave,
// arrivals decoded as they come, and the block to itself copied while the last chunks travel.
// What a message between two ranks holds is a small policy (`Messages`): one contiguous block
// per peer (block_messages, here) or a list of per-table segments (dlrm/segments.hpp). The
// policy works in the memory of the call's execution space (host or device); the engine hands
// its bytes to MPI through the transport seam (comm/detail/transport.hpp): directly, or
// staged through host memory message by message.
// docs/collectives.md describes the schedule, the wire rule, the seam and the failure
// guarantees.
//
// A Messages policy provides, for peers other than this rank:
//   raw_bytes_to(peer), raw_bytes_from(peer)  the raw size of each message (the receive size)
//   receives_in_place(peer), place_from(peer) whether a raw message lands in the caller's memory
//   send_room(peer)                           scratch bytes encode(peer) may use
//   copy_self(exec)                           this rank's block to itself, exact
//   encode(exec, peer, room, report)          the bytes to send (never more than the raw size): a
//                                             stream in room, or raw values
//   decode_room()                             scratch bytes finish may decode into
//   finish(exec, peer, landed, length, room)  decodes an arrival; returns its absolute bound
//   measures_error()                          whether encode reports the error it introduces
// and may provide prepare(exec): what must run before the first encode of a message with send
// room (the engine calls it once, after any message sent raw ahead of that one has left).
// A policy whose messages are pipelined (block_messages) also provides chunks_to(peer) and
// chunks_from(peer) (chunk_plans, comm/detail/pipeline.hpp) and value_bytes, and its encode and
// finish take the chunk's index after the peer: each chunk is a message of its own.

#include <kompress/comm/detail/agreement.hpp>
#include <kompress/comm/detail/pipeline.hpp>
#include <kompress/comm/detail/transport.hpp>
#include <kompress/comm/options.hpp>
#include <kompress/comm/request.hpp>
#include <kompress/comm/workspace.hpp>
#include <kompress/compress.hpp>
#include <kompress/detail/compress_batch.hpp>
#include <kompress/detail/decompress_batch.hpp>
#include <kompress/detail/mpi.hpp>
#include <kompress/kernels/range_pass.hpp>

#include <Kokkos_Core.hpp>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstring>
#include <exception>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace kompress::inline v0::detail {

/// Copies `count` values between two buffers of `Memory` that do not overlap, on `exec`.
template <class Memory, class T, class Exec>
void copy_values(const Exec& exec, T* to, const T* from, std::size_t count) {
  if (count == 0) return;
  if constexpr (host_memory_space<Memory>) std::memcpy(to, from, count * sizeof(T));
  else Kokkos::deep_copy(exec, values_in<T, Memory>(to, count), values_in<const T, Memory>(from, count));
}

/// The wire rule: whether a message may be compressed is decided by both sides alike from what
/// both know (mode, cost model, raw size); the sender sends the stream only when it is smaller
/// (and, in automatic mode, wins), else the raw values; the receiver tells them apart by the
/// length (exactly the raw size means raw).
struct wire_rule {
  transfer_mode mode = transfer_mode::compressed;
  cost_model cost{};
  /// An alltoall(v)'s peers (p - 1), whose blocks share codec calls and whose raw exchange is
  /// MPI's (cost_model::exchange_model); 0 for every other collective's messages.
  std::uint64_t exchange_peers = 0;

  bool may_compress(std::uint64_t raw_bytes) const {
    switch (mode) {
      case transfer_mode::raw: return false;
      case transfer_mode::automatic:
        return exchange_peers > 0 ? cost.worth_compressing_exchanged(raw_bytes, exchange_peers)
                                  : cost.worth_compressing(raw_bytes);
      default: return raw_bytes > 0;
    }
  }
  /// The decision for an alltoall(v)'s blocks of one size, taken once for all the blocks of
  /// that size: whether they may be compressed and, where automatic mode compresses only
  /// cost_model::exchanged_compressed_blocks of the p - 1, from which step of the rotation on
  /// (the receiver is the sender + step, mod p). The blocks of the first steps go raw, the
  /// link's share of the work. Both sides know the step and the block's size (an alltoallv's
  /// blocks are each weighed as if all were that size).
  struct block_rule {
    std::uint64_t raw_bytes = 0;
    bool compressible = false;
    std::uint64_t first_compressed_step = 1;
    bool compresses(int step) const { return compressible && std::uint64_t(step) >= first_compressed_step; }
  };
  block_rule for_blocks(std::uint64_t raw_bytes) const {
    block_rule rule{raw_bytes, may_compress(raw_bytes)};
    if (rule.compressible && mode == transfer_mode::automatic && exchange_peers > 1)
      rule.first_compressed_step = exchange_peers + 1 - cost.exchanged_compressed_blocks(raw_bytes, exchange_peers);
    return rule;
  }
  bool send_compressed(std::uint64_t raw_bytes, std::uint64_t length) const {
    if (length >= raw_bytes) return false;
    if (mode != transfer_mode::automatic) return true;
    return exchange_peers > 0 ? cost.exchange_model(raw_bytes, exchange_peers).compressed_wins(raw_bytes, length)
                              : cost.compressed_wins(raw_bytes, length);
  }
  /// The mode and, unless raw, the cost model: automatic mode decides with it, and both modes
  /// that compress cut messages into chunks by it, on each side alone.
  void add_to(fingerprint& f) const {
    f.add(std::uint64_t(mode));
    if (mode != transfer_mode::raw)
      f.add(cost.link_bytes_per_second).add(cost.compress_bytes_per_second).add(cost.decompress_bytes_per_second)
          .add(cost.min_message_bytes).add(cost.min_gain).add(std::uint64_t(cost.pipeline)).add(cost.chunk_seconds)
          .add(cost.min_chunk_bytes).add(cost.max_chunks).add(cost.fixed_chunk_bytes)
          .add(cost.staging_bytes_per_second).add(cost.expected_ratio).add(cost.latency_seconds)
          .add(cost.compress_call_seconds).add(cost.decompress_call_seconds);
  }
  /// The rule of a call whose bytes reach MPI as `how` says: a staged call's cost model counts
  /// its copies through host staging (cost_model::staged), so automatic mode weighs them.
  static wire_rule for_call(const collective_options& options, transport how) {
    return {options.mode, how.staged ? options.cost.staged() : options.cost};
  }
  /// How a message of `values` elements is cut (one chunk unless it may be compressed).
  chunk_plan plan(std::size_t values, std::size_t value_bytes, std::uint64_t nominal_bytes) const {
    return plan(values, value_bytes, nominal_bytes, may_compress(nominal_bytes));
  }
  /// The same for a message whose `compressible` the caller decided (for_blocks).
  chunk_plan plan(std::size_t values, std::size_t value_bytes, std::uint64_t nominal_bytes, bool compressible) const {
    const cost_model& model = exchange_peers > 0 ? cost.exchange_model(nominal_bytes, exchange_peers) : cost;
    return plan_chunks(model, compressible, values, value_bytes, nominal_bytes);
  }
};

/// Decodes a message of `length` bytes that holds `count` values into `out`, both in `Memory`:
/// the raw values when length is their size, else one kompress stream of exactly that length.
/// Returns the stream's absolute bound (0 for raw values).
template <class Memory = Kokkos::HostSpace, class T, class Exec>
double decode_message(const Exec& exec, const std::byte* in, std::size_t length, std::size_t count, T* out,
                      const char* who) {
  if (length == count * sizeof(T)) {
    copy_values<Memory>(exec, reinterpret_cast<std::byte*>(out), in, length);
    return 0.0;
  }
  const values_in<const std::byte, Memory> stream(in, length);
  // The header and chunk tables read (from device memory: copied) and checked once.
  const stream_header header = read_header(exec, stream, who);  // format_error on a damaged stream
  require_expected_stream(header, count, length, who);
  decompress_parsed(exec, stream, header, values_in<T, Memory>(out, count), who);
  return header.abs_bound;
}

/// decode_message over messages that are all at hand: raw ones copied, the streams decoded as
/// one batch (detail/decompress_batch.hpp), the same values and checks. Returns the largest
/// absolute bound (0 where all were raw).
template <class Memory = Kokkos::HostSpace, class T, class Exec>
double decode_messages(const Exec& exec, std::span<const stream_to_decode<T>> messages, const char* who) {
  std::vector<stream_to_decode<T>> streams;
  for (const stream_to_decode<T>& m : messages) {
    if (m.length == m.count * sizeof(T))
      copy_values<Memory>(exec, reinterpret_cast<std::byte*>(m.out), m.stream, m.length);
    else
      streams.push_back(m);
  }
  return decompress_batch<Memory>(exec, std::span<const stream_to_decode<T>>(streams), who);
}

/// The largest |values[i] - decoded[i]| over the finite values, both in `Memory`, on `exec`.
template <class Memory, class T, class Exec>
double max_difference(const Exec& exec, const T* values, const T* decoded, std::size_t count) {
  double error = 0.0;
  Kokkos::parallel_reduce(
      "kompress::measure_error", Kokkos::RangePolicy<Exec>(exec, 0, count),
      KOKKOS_LAMBDA(std::size_t i, double& worst) {
        if (Kokkos::isfinite(values[i])) {
          const double e = Kokkos::fabs(double(values[i]) - double(decoded[i]));
          worst = e > worst ? e : worst;
        }
      },
      Kokkos::Max<double>(error));
  return error;
}

/// One message of `count` values at `values`, both sides deciding alike: a stream in `out`
/// where `compressible` (the wire rule's may_compress for the message) and the rule sends it,
/// else the raw values copied there. Returns its length. `max_error`, when not NaN, takes the
/// largest error the stream introduced (decoded into `decode_scratch`, `count` values).
template <class Memory, class T, class Exec>
std::size_t encode_message(const Exec& exec, const wire_rule& rule, const compress_options& codec, bool compressible,
                           const T* values, std::size_t count, std::byte* out, T* decode_scratch,
                           double& max_error) {
  const std::size_t raw = count * sizeof(T);
  if (compressible && count > 0) {
    const std::size_t length = compress(exec, values_in<const T, Memory>(values, count),
                                        values_in<std::byte, Memory>(out, max_compressed_size<T>(count, codec)), codec);
    if (rule.send_compressed(raw, length)) {
      if (max_error == max_error) {
        decode_message<Memory>(exec, out, length, count, decode_scratch, "kompress::measure_error");
        max_error = std::max(max_error, max_difference<Memory>(exec, values, decode_scratch, count));
      }
      return length;
    }
  }
  copy_values<Memory>(exec, out, reinterpret_cast<const std::byte*>(values), raw);
  return raw;
}

/// `raw` spread among `coded`, each in its order: before the i-th of the C coded, the first
/// ceil((i + 1) R / C) of the R raw, so that every raw one leaves before the last coded one and
/// each group just ahead of the coded one it overlaps (exchange_engine::rotation).
inline std::vector<int> spread_among(std::span<const int> raw, std::span<const int> coded) {
  std::vector<int> order;
  std::size_t next_raw = 0;
  for (std::size_t i = 0; i < coded.size(); ++i) {
    const std::size_t due = ((i + 1) * raw.size() + coded.size() - 1) / coded.size();
    for (; next_raw < due; ++next_raw) order.push_back(raw[next_raw]);
    order.push_back(coded[i]);
  }
  for (; next_raw < raw.size(); ++next_raw) order.push_back(raw[next_raw]);  // no coded ones
  return order;
}

/// What one call knows of a failure after the agreement (docs/collectives.md, "Failure after
/// the agreement"): its own (the first exception caught while encoding, decoding or posting a
/// send) and, else, the failed rank named by the first abort marker that arrived. Either makes
/// the call abort: nothing more is encoded or decoded, an abort marker leaves in place of each
/// message not yet sent, every receive is completed into the buffer it was posted for; only
/// then does the call throw, so no rank waits for a message that never comes and nothing is
/// written after the call's buffers go.
class call_failure {
 public:
  bool aborting() const { return local_ != nullptr || failed_rank_ >= 0; }
  /// Call from a catch block: this rank failed (the first failure is the one reported).
  void record_local() noexcept {
    if (!local_) local_ = std::current_exception();
  }
  /// An abort marker from `peer` arrived, naming `failed_rank` (the rank that failed first).
  void record_peer(int failed_rank) noexcept {
    if (failed_rank_ < 0) failed_rank_ = failed_rank;
  }
  /// The rank the markers this rank sends name: itself if it failed, else the one it learned.
  int failed_rank(int self) const { return local_ ? self : failed_rank_; }
  /// This rank's own error, else a peer_error naming the failed rank.
  [[noreturn]] void raise(const char* who) const {
    if (local_) std::rethrow_exception(local_);
    throw peer_error("rank " + std::to_string(failed_rank_) + " failed during " + who +
                         " (an abort marker arrived in place of a message); this rank completed the call's "
                         "messages and its output is unspecified",
                     failed_rank_);
  }

 private:
  std::exception_ptr local_;
  int failed_rank_ = -1;
};

/// The requests one collective posted, and the abort protocol over them (call_failure):
/// after a failure, send() posts abort markers and progress() completes arrivals without
/// handing them on. Destroying it with requests still pending (only when an MPI call itself
/// failed, or the call threw before it could send) cancels the pending receives and completes
/// every request before the buffers they target go: declare it after those buffers.
class posted_messages {
 public:
  /// Receives one MPI_Testany or MPI_Waitany of a poll is given (next_arrival): a burst's
  /// arrivals and the jitter in their order, at a cost that does not grow with p.
  static constexpr std::size_t poll_window = 64;

  posted_messages() : failure_(&own_failure_) {}
  explicit posted_messages(call_failure& failure) : failure_(&failure) {}
  posted_messages(const posted_messages&) = delete;
  posted_messages& operator=(const posted_messages&) = delete;
  ~posted_messages() { abandon(); }

  /// `key` is what the arrival reports (default: the peer).
  void receive(void* buffer, std::size_t bytes, int peer, MPI_Comm comm, const char* who, int key = -1) {
    if (bytes < min_message_bytes)  // shorter is the abort marker: a receive must expect data
      throw error(std::string(who) + ": internal error: a receive of " + std::to_string(bytes) + " bytes was posted");
    if (ranks_ == 0) check_mpi(MPI_Comm_size(comm, &ranks_), who, "MPI_Comm_size");
    receives_.push_back(MPI_REQUEST_NULL);
    receive_keys_.push_back(key < 0 ? peer : key);
    receive_peers_.push_back(peer);
    receive_buffers_.push_back(buffer);
    check_mpi(MPI_Irecv(buffer, byte_count(bytes, who), MPI_BYTE, peer, collective_tag, comm, &receives_.back()), who,
              "MPI_Irecv");
    ++pending_;
  }
  /// A receive posted in its turn (post_receives_in_turn): the receives of one peer's message are queued one
  /// after another, peers in the order their receives should be posted.
  void queue_receive(void* buffer, std::size_t bytes, int peer, int key = -1) {
    queued_.push_back({buffer, bytes, peer, key < 0 ? peer : key});
  }
  /// Posts the queued receives of the first `window` peers now (0: of every peer), and those of
  /// the next peer whenever all of an earlier peer's have completed, so that at most `window`
  /// peers' messages are expected at once. Once the call is aborting, every queued receive is
  /// posted: each peer still sends a message or an abort marker for it.
  void post_receives_in_turn(std::size_t window, MPI_Comm comm, const char* who) {
    window_ = window;
    queued_comm_ = comm;
    post_queued(who);
  }
  /// Sends a message, or the abort marker once the call is aborting. A send MPI rejects is
  /// this rank's failure: the marker goes in its place; if MPI rejects that too, it throws.
  void send(const void* buffer, std::size_t bytes, int peer, MPI_Comm comm, const char* who) {
    sends_.push_back(MPI_REQUEST_NULL);
    if (!failure_->aborting()) {
      const int rc = MPI_Isend(buffer, byte_count(bytes, who), MPI_BYTE, peer, collective_tag, comm, &sends_.back());
      if (rc == MPI_SUCCESS) return;
      sends_.back() = MPI_REQUEST_NULL;
      try {
        check_mpi(rc, who, "MPI_Isend");
      } catch (...) {
        failure_->record_local();
      }
    }
    if (marker_rank_ < 0) {  // one marker buffer for the call's remaining sends: it outlives them
      int self = 0;
      check_mpi(MPI_Comm_rank(comm, &self), who, "MPI_Comm_rank");
      marker_rank_ = failure_->failed_rank(self);
      write_abort_marker(marker_rank_, marker_);
    }
    // The protocol cannot go on if MPI rejects the marker too: the cancel path (abandon).
    check_mpi(MPI_Isend(marker_, int(abort_marker_bytes), MPI_BYTE, peer, collective_tag, comm, &sends_.back()), who,
              "MPI_Isend of an abort marker");
  }

  /// The call's failure state (shared by the requests of every step of a ring).
  call_failure& failure() { return *failure_; }

  /// Completes receives as they arrive, on_arrival(key, length) for each, then the sends.
  /// Blocks if `block`; otherwise returns false as soon as nothing more is ready. An abort
  /// marker records its peer's failure; an exception from on_arrival is this rank's failure;
  /// after either, arrivals are completed and not handed on. Throws only if MPI fails.
  /// Every arrival ready at once is completed before the first is handed on, so that their
  /// decoding runs back to back, MPI not called in between.
  template <class OnArrival>
  bool progress(bool block, const char* who, OnArrival&& on_arrival) {
    for (post_queued(who); pending_ > 0; post_queued(who)) {
      collect_arrivals(block, who);
      if (ready_.empty()) {
        if (pending_ > 0) return false;
        break;
      }
      for (const arrival& a : ready_) {
        if (failure_->aborting()) continue;  // drained into its buffer, not decoded
        try {
          on_arrival(receive_keys_[a.index], a.length);
        } catch (...) {
          failure_->record_local();
        }
      }
      ready_.clear();
    }
    if (block) {
      check_mpi(MPI_Waitall(int(sends_.size()), sends_.data(), MPI_STATUSES_IGNORE), who, "MPI_Waitall");
      return true;
    }
    int done = 0;
    check_mpi(MPI_Testall(int(sends_.size()), sends_.data(), &done, MPI_STATUSES_IGNORE), who, "MPI_Testall");
    return done != 0;
  }

  /// Cancels pending receives and completes everything (no-op once all completed). Only for
  /// where the abort protocol cannot run: a peer's message to a cancelled receive stays
  /// unmatched (docs/collectives.md says what that leaves uncovered).
  void abandon() noexcept {
    for (MPI_Request& r : receives_)
      if (r != MPI_REQUEST_NULL) MPI_Cancel(&r);
    if (!receives_.empty()) MPI_Waitall(int(receives_.size()), receives_.data(), MPI_STATUSES_IGNORE);
    if (!sends_.empty()) MPI_Waitall(int(sends_.size()), sends_.data(), MPI_STATUSES_IGNORE);
    pending_ = 0;
    ready_.clear();
    next_queued_ = queued_.size();
  }

 private:
  struct arrival {
    std::size_t index, length;  ///< the receive, and the bytes that arrived
  };
  struct queued {
    void* buffer;
    std::size_t bytes;
    int peer, key;
  };

  /// Completes into ready_ every receive that has arrived, waiting for the first if `block`.
  void collect_arrivals(bool block, const char* who) {
    for (bool wait = block; pending_ > 0; wait = false) {
      while (oldest_pending_ < receives_.size() && receives_[oldest_pending_] == MPI_REQUEST_NULL) ++oldest_pending_;
      if (oldest_pending_ == receives_.size()) {  // no receive left active: nothing is pending after all
        pending_ = 0;
        return;
      }
      MPI_Status status;
      const int index = next_arrival(wait, status, who);
      if (index < 0) return;
      --pending_;
      completed_in_turn(index, who);  // the next peer's receives are posted before this arrival is decoded
      int length = 0;
      check_mpi(MPI_Get_count(&status, MPI_BYTE, &length), who, "MPI_Get_count");
      if (std::size_t(length) < min_message_bytes) short_message(index, std::size_t(length), who);
      ready_.push_back({std::size_t(index), std::size_t(length)});
    }
  }

  /// A receive that has completed, or -1: among the poll_window oldest pending ones, else among
  /// the next poll_window beyond them that the sweep reaches (it moves on a window per call and
  /// wraps), else, if `block`, the first of the oldest to complete. MPI_Testany and MPI_Waitany
  /// scan every request they are given: polling all of an alltoall's p - 1 receives once per
  /// arrival cost a rank O(p^2) request checks. Receives are posted in the order their messages
  /// are expected, so the oldest are the next to arrive; the sweep picks up those that arrive
  /// early. Waiting on the oldest alone cannot deadlock: an exchange sends every message without
  /// waiting for one, and a ring's or butterfly's step receives from one peer, whose messages
  /// MPI matches in posting order.
  int next_arrival(bool block, MPI_Status& status, const char* who) {
    const std::size_t oldest = std::min(poll_window, receives_.size() - oldest_pending_);
    if (const int index = test_receives(oldest_pending_, oldest, status, who); index >= 0) return index;
    const std::size_t beyond = oldest_pending_ + oldest;
    if (beyond < receives_.size()) {
      if (sweep_ < beyond || sweep_ >= receives_.size()) sweep_ = beyond;
      const std::size_t begin = sweep_;
      sweep_ += std::min(poll_window, receives_.size() - begin);
      if (const int index = test_receives(begin, sweep_ - begin, status, who); index >= 0) return index;
    }
    if (!block) return -1;
    int index = MPI_UNDEFINED;
    check_mpi(MPI_Waitany(int(oldest), receives_.data() + oldest_pending_, &index, &status), who, "MPI_Waitany");
    return index == MPI_UNDEFINED ? -1 : int(oldest_pending_) + index;
  }
  /// MPI_Testany over receives [begin, begin + count): the one that completed, or -1.
  int test_receives(std::size_t begin, std::size_t count, MPI_Status& status, const char* who) {
    int index = MPI_UNDEFINED, flag = 0;
    check_mpi(MPI_Testany(int(count), receives_.data() + begin, &index, &flag, &status), who, "MPI_Testany");
    return flag && index != MPI_UNDEFINED ? int(begin) + index : -1;
  }

  /// Posts the queued receives the window has room for (all of them once aborting), a peer's
  /// together.
  void post_queued(const char* who) {
    while (next_queued_ < queued_.size() && (window_ == 0 || peers_in_turn_ < window_ || failure_->aborting())) {
      const int peer = queued_[next_queued_].peer;
      ++peers_in_turn_;
      for (; next_queued_ < queued_.size() && queued_[next_queued_].peer == peer; ++next_queued_) {
        const queued& q = queued_[next_queued_];
        receive(q.buffer, q.bytes, q.peer, queued_comm_, who, q.key);
        in_turn_.resize(receives_.size(), false);
        in_turn_.back() = true;
        if (outstanding_.size() <= std::size_t(peer)) outstanding_.resize(std::size_t(peer) + 1, 0);
        ++outstanding_[std::size_t(peer)];
      }
    }
  }
  /// Receive `index` completed: when it was its peer's last one in turn, the window has room.
  void completed_in_turn(int index, const char* who) {
    if (std::size_t(index) >= in_turn_.size() || !in_turn_[std::size_t(index)]) return;
    if (--outstanding_[std::size_t(receive_peers_[std::size_t(index)])] == 0) --peers_in_turn_;
    post_queued(who);
  }
  /// A message shorter than any data arrived on receive `index`: an abort marker naming a rank
  /// of the communicator, or else a damaged message, this rank's own failure.
  void short_message(int index, std::size_t length, const char* who) {
    const int sender = receive_peers_[std::size_t(index)];
    const int named = abort_marker_rank(receive_buffers_[std::size_t(index)], length, sender, ranks_);
    if (named >= 0) {
      failure_->record_peer(named);
      return;
    }
    try {
      throw format_error(std::string(who) + ": a message of " + std::to_string(length) + " bytes from rank " +
                         std::to_string(sender) + " is neither data (at least " + std::to_string(min_message_bytes) +
                         " bytes) nor an abort marker naming a rank of the communicator");
    } catch (...) {
      failure_->record_local();
    }
  }

  std::vector<MPI_Request> receives_, sends_;
  std::size_t oldest_pending_ = 0;  ///< no receive before it is pending
  std::size_t sweep_ = 0;           ///< where next_arrival tests beyond the oldest next
  std::vector<arrival> ready_;  ///< arrivals completed and not yet handed on
  std::vector<int> receive_keys_, receive_peers_;
  std::vector<const void*> receive_buffers_;
  std::size_t pending_ = 0;
  int ranks_ = 0;  ///< the communicator's size, once a receive is posted
  call_failure own_failure_;
  call_failure* failure_;
  std::vector<queued> queued_;  ///< receives posted in turn, in order
  std::size_t next_queued_ = 0;  ///< the first not yet posted
  std::size_t window_ = 0;       ///< peers whose receives may be outstanding at once (0: all)
  std::size_t peers_in_turn_ = 0;
  std::vector<bool> in_turn_;               ///< per posted receive: whether it was queued
  std::vector<std::size_t> outstanding_;  ///< per peer: its queued receives posted and not completed
  MPI_Comm queued_comm_ = MPI_COMM_NULL;
  int marker_rank_ = -1;                   ///< the rank this rank's markers name, once known
  std::byte marker_[abort_marker_bytes]{};  ///< the abort marker's bytes
};

/// The scratch one call works in: a workspace slot it leases, or its own (allocated per call,
/// with its own duplicate of the communicator when nonblocking).
class call_scratch {
 public:
  call_scratch(workspace_slot* leased, MPI_Comm comm, bool nonblocking, const char* who) {
    if (leased) {
      lease_ = std::make_unique<slot_lease>(leased);
      slot_ = leased;
      return;
    }
    if (nonblocking) own_.owned = owned_comm(comm, who);
    own_.comm = nonblocking ? own_.owned.get() : comm;
    slot_ = &own_;
  }
  workspace_slot& operator*() const { return *slot_; }
  workspace_slot* operator->() const { return slot_; }

 private:
  workspace_slot own_;
  std::unique_ptr<slot_lease> lease_;
  workspace_slot* slot_ = nullptr;
};

/// An arrival whose decoding waits for the rest of the exchange: chunk `chunk` of `peer`'s
/// message, `length` bytes at `landed` (in the execution space's memory).
struct held_arrival {
  int peer = 0;
  std::size_t chunk = 0;
  const std::byte* landed = nullptr;
  std::size_t length = 0;
};

/// Whether a Messages policy cuts its messages into chunks (see the top of this file).
template <class Messages>
concept chunked_messages = requires(const Messages& m) {
  { m.chunks_to(0) } -> std::same_as<chunk_plan>;
  { m.chunks_from(0) } -> std::same_as<chunk_plan>;
};

/// Whether a Messages policy can decode arrivals held until the exchange completes as one batch
/// (block_messages; decodes_together says whether it should).
template <class Messages, class Exec>
concept batch_decoding_messages = chunked_messages<Messages> && requires(const Messages& m, const Exec& exec) {
  { m.decodes_together() } -> std::same_as<bool>;
  { m.finish_together(exec, std::span<const held_arrival>{}) } -> std::same_as<double>;
};

/// Whether a Messages policy can compress a round of chunks (chunk i of several peers' blocks)
/// as one batch (block_messages; encodes_together says whether it should).
template <class Messages, class Exec>
concept batch_encoding_messages = chunked_messages<Messages> && requires(const Messages& m, const Exec& exec,
                                                                          collective_report& report) {
  { m.encodes_together() } -> std::same_as<bool>;
  {
    m.encode_round(exec, std::span<const int>{}, std::size_t(0), std::span<std::byte* const>{}, report)
  } -> std::same_as<std::vector<std::span<const std::byte>>>;
};

/// One exchange in flight (see the top of this file).
template <class Messages, class Exec>
class exchange_engine final : public operation {
 public:
  /// `window`: how many peers' messages this rank expects at once (0: every peer's).
  exchange_engine(const Exec& exec, Messages messages, comm_shape shape, workspace_slot* leased, MPI_Comm comm,
                  bool nonblocking, transport how, std::size_t window, const char* who)
      : exec_(exec), messages_(std::move(messages)), shape_(shape), who_(who), how_(how), window_(window),
        scratch_(leased, comm, nonblocking, who) {
    start();
  }

  /// After a failure it completes every message first, then throws (again on each call).
  bool progress(bool block) override {
    if (!finished_) {
      if (!posted_.progress(block, who_, [&](int key, std::size_t length) { arrived(key, length); })) return false;
      decode_held();
      exec_.fence("kompress: exchange decoded");
      finished_ = true;
    }
    if (failure_.aborting()) failure_.raise(who_);
    return true;
  }

  const collective_report& report() const override { return report_; }

 private:
  static constexpr bool chunked = chunked_messages<Messages>;
  static constexpr bool prepares = requires(Messages& m, const Exec& exec) { m.prepare(exec); };
  static constexpr std::size_t value_bytes() {
    if constexpr (chunked) return Messages::value_bytes;
    else return 1;
  }
  /// One chunk per message unless the policy cuts them (plans in bytes then).
  chunk_plan plan_to(int peer) const {
    if constexpr (chunked) return messages_.chunks_to(peer);
    else return chunk_plan{messages_.raw_bytes_to(peer), std::max<std::size_t>(1, messages_.raw_bytes_to(peer))};
  }
  chunk_plan plan_from(int peer) const {
    if constexpr (chunked) return messages_.chunks_from(peer);
    else return chunk_plan{messages_.raw_bytes_from(peer), std::max<std::size_t>(1, messages_.raw_bytes_from(peer))};
  }

  /// Where `peer`'s message is decoded from (in the execution space's memory): the caller's
  /// View where raw values land in place, else the receive scratch.
  std::byte* target(int peer) const {
    return messages_.receives_in_place(peer) ? messages_.place_from(peer)
                                             : room_.receive + receive_offset_[std::size_t(peer)];
  }
  /// Where MPI receives `peer`'s message: the target, or its host staging.
  std::byte* mpi_target(int peer) const {
    return how_.staged ? scratch_->staged_receive.data() + staged_receive_offset_[std::size_t(peer)] : target(peer);
  }

  /// Chunk `chunk` of `peer`'s message arrived, `length` bytes: decoded now, or held for the
  /// batch at the end (decode_held).
  void arrived(int key, std::size_t length) {
    const auto [peer, chunk] = arrivals_[std::size_t(key)];
    const std::size_t offset = plan_from(peer).begin(chunk) * value_bytes();
    std::byte* const landed = target(peer) + offset;
    if (how_.staged) stage_in(exec_, landed, mpi_target(peer) + offset, length);
    if (decode_together_) {
      held_.push_back({peer, chunk, landed, length});
      return;
    }
    double bound = 0.0;
    if constexpr (chunked) bound = messages_.finish(exec_, peer, chunk, landed, length, room_.decode);
    else bound = messages_.finish(exec_, peer, landed, length, room_.decode);
    report_.absolute_bound = std::max(report_.absolute_bound, bound);
  }

  /// What MPI sends for a chunk of `peer`'s message at byte `offset`: the payload itself, or
  /// its copy in host staging.
  std::span<const std::byte> to_mpi(int peer, std::size_t offset, std::span<const std::byte> payload) {
    if (!how_.staged) return payload;
    std::byte* const staged = scratch_->staged_send.data() + staged_send_offset_[std::size_t(peer)] + offset;
    stage_out(exec_, staged, payload.data(), payload.size());
    return {staged, payload.size()};
  }

  /// The report's share of one chunk sent: its bytes on the wire. Whether it left compressed.
  bool account_chunk(std::size_t wire_bytes, std::size_t raw_bytes) {
    report_.wire_bytes += wire_bytes;
    ++report_.chunks;
    return wire_bytes < raw_bytes;
  }
  /// The report's share of one peer's message, once all its chunks are sent.
  void account_message(std::size_t raw_bytes, bool compressed) {
    report_.payload_bytes += raw_bytes;
    ++report_.messages;
    if (compressed) ++report_.compressed_messages;
  }

  /// The peers this rank sends a message to in the rotating order (rank + 1, rank + 2, ...), so
  /// that no rank is everyone's first target; or (`sending` false) those it receives one from,
  /// in the order they send to it (rank - 1, rank - 2, ...). Where some blocks go raw and others
  /// may be compressed (automatic mode's raw share, wire_rule::for_blocks), the raw ones are
  /// spread among the others in proportion, each group ahead of the compression it overlaps:
  /// the link carries them while the codec works, a few at a time rather than all at once (all
  /// at once, every rank's raw blocks converge on the fabric together).
  std::vector<int> rotation(bool sending) const {
    const int p = shape_.size, rank = shape_.rank;
    std::vector<int> peers, raw, coded;
    for (int step = 1; step < p; ++step) {
      const int peer = sending ? (rank + step) % p : (rank - step + p) % p;
      if ((sending ? messages_.raw_bytes_to(peer) : messages_.raw_bytes_from(peer)) == 0) continue;
      peers.push_back(peer);
      if constexpr (requires { messages_.compresses_from(peer); }) {
        const bool compressible = sending ? messages_.compresses_to(peer) : messages_.compresses_from(peer);
        (compressible ? coded : raw).push_back(peer);
      }
    }
    return raw.empty() || coded.empty() ? peers : spread_among(raw, coded);
  }

  /// Readies the policy for its first compression (block_messages: the REL bound's range pass),
  /// once; in send_in_bursts after the blocks sent raw ahead of it have left, so that the link
  /// carries them meanwhile. A failure there is this rank's.
  void prepare_encoding() {
    if constexpr (prepares) {
      if (prepared_ || failure_.aborting()) return;
      prepared_ = true;
      try {
        messages_.prepare(exec_);
      } catch (...) {
        failure_.record_local();
      }
    }
  }

  /// Advances MPI without blocking and decodes what has arrived.
  void poll() {
    posted_.progress(false, who_, [&](int key, std::size_t length) { arrived(key, length); });
  }

  /// Every peer's chunks in the rotating order, encoded in bursts of at least burst_bytes of raw
  /// values (or to the end), each burst sent in order and followed by a poll. Once the call is
  /// aborting, nothing more is encoded and every chunk's message is the abort marker
  /// (encoded_or_marker).
  void send_in_bursts() {
    std::size_t burst_raw = 0;
    const auto send_burst = [&] {
      for (const outgoing& o : burst_) posted_.send(o.payload.data(), o.payload.size(), o.peer, scratch_->comm, who_);
      burst_.clear();
      burst_raw = 0;
      poll();
    };
    for (const int peer : rotation(true)) {
      if (messages_.send_room(peer) > 0 && !prepared_) {  // the first block that may be compressed
        if (!burst_.empty()) send_burst();
        prepare_encoding();
      }
      std::byte* const room = room_.send + send_offset_[std::size_t(peer)];
      const chunk_plan plan = plan_to(peer);
      bool compressed = false;
      for (std::size_t chunk = 0; chunk < plan.count(); ++chunk) {
        const std::size_t raw = plan.size(chunk) * value_bytes();
        const std::span<const std::byte> payload = encoded_or_marker(posted_, [&] {
          std::span<const std::byte> encoded;
          if constexpr (chunked) encoded = messages_.encode(exec_, peer, chunk, room, report_);
          else encoded = messages_.encode(exec_, peer, room, report_);
          if (account_chunk(encoded.size(), raw)) compressed = true;
          return to_mpi(peer, plan.begin(chunk) * value_bytes(), encoded);
        });
        burst_.push_back({payload, peer});
        burst_raw += raw;
        if (burst_raw >= burst_bytes) send_burst();
      }
      account_message(messages_.raw_bytes_to(peer), compressed);
    }
    if (!burst_.empty()) send_burst();
  }

  /// Where a compression costs more than a chunk's bytes (a GPU): round i compresses chunk i of
  /// every peer's block (in the rotating order) as one batch, then sends them, and polls for
  /// arrivals before the next round, so that round i's transfers overlap round i + 1's
  /// compression. Each peer's chunks still leave in order, as its receives were posted. Once the
  /// call is aborting, nothing more is encoded and every chunk's message is the abort marker.
  void send_in_rounds() {
    if constexpr (batch_encoding_messages<Messages, Exec>) {
      prepare_encoding();
      const std::vector<int> peers = rotation(true);
      std::vector<chunk_plan> plans;
      std::size_t rounds = 0;
      for (const int peer : peers) {
        plans.push_back(plan_to(peer));
        rounds = std::max(rounds, plans.back().count());
      }
      std::vector<bool> compressed(peers.size(), false);
      for (std::size_t chunk = 0; chunk < rounds; ++chunk) {
        std::vector<int> round_peers;
        std::vector<std::size_t> round_index;
        std::vector<std::byte*> rooms;
        for (std::size_t k = 0; k < peers.size(); ++k)
          if (chunk < plans[k].count()) {
            round_peers.push_back(peers[k]);
            round_index.push_back(k);
            rooms.push_back(room_.send + send_offset_[std::size_t(peers[k])]);
          }
        std::vector<std::span<const std::byte>> payloads = encoded_or_marker(posted_, [&] {
          auto encoded = messages_.encode_round(exec_, std::span<const int>(round_peers), chunk,
                                                std::span<std::byte* const>(rooms), report_);
          for (std::size_t j = 0; j < encoded.size(); ++j) {
            const std::size_t k = round_index[j];
            if (account_chunk(encoded[j].size(), plans[k].size(chunk) * value_bytes())) compressed[k] = true;
            encoded[j] = to_mpi(peers[k], plans[k].begin(chunk) * value_bytes(), encoded[j]);
          }
          return encoded;
        });
        payloads.resize(round_peers.size());  // none (aborting): abort markers
        for (std::size_t j = 0; j < payloads.size(); ++j)
          posted_.send(payloads[j].data(), payloads[j].size(), round_peers[j], scratch_->comm, who_);
        poll();
      }
      for (std::size_t k = 0; k < peers.size(); ++k) account_message(messages_.raw_bytes_to(peers[k]), compressed[k]);
    }
  }

  /// Where a decompression costs more than an arrival's bytes (a GPU), every stream that
  /// arrived is decoded in one batch once all have (docs/collectives.md, "alltoall and
  /// alltoallv"). A failure there is this rank's: every message has been sent, so its peers
  /// complete as they are.
  void decode_held() {
    if (held_.empty()) return;
    try {
      if constexpr (batch_decoding_messages<Messages, Exec>)
        if (!failure_.aborting())
          report_.absolute_bound = std::max(report_.absolute_bound,
                                            messages_.finish_together(exec_, std::span<const held_arrival>(held_)));
    } catch (...) {
      failure_.record_local();
    }
    held_.clear();
  }

  void start() {
    if constexpr (batch_decoding_messages<Messages, Exec>) decode_together_ = messages_.decodes_together();
    const int p = shape_.size, rank = shape_.rank;
    receive_offset_.assign(std::size_t(p), 0);
    send_offset_.assign(std::size_t(p), 0);
    if (how_.staged) {
      staged_receive_offset_.assign(std::size_t(p), 0);
      staged_send_offset_.assign(std::size_t(p), 0);
    }
    std::size_t receive_bytes = 0, send_bytes = 0, staged_receive = 0, staged_send = 0;
    for (int peer = 0; peer < p; ++peer) {
      if (peer == rank) continue;
      if (!messages_.receives_in_place(peer)) {
        receive_offset_[std::size_t(peer)] = receive_bytes;
        receive_bytes += messages_.raw_bytes_from(peer);
      }
      send_offset_[std::size_t(peer)] = send_bytes;
      send_bytes += messages_.send_room(peer);
      // Staged, every message has its raw size in host memory: what is sent is never larger.
      if (how_.staged) {
        staged_receive_offset_[std::size_t(peer)] = staged_receive;
        staged_receive += messages_.raw_bytes_from(peer);
        staged_send_offset_[std::size_t(peer)] = staged_send;
        staged_send += messages_.raw_bytes_to(peer);
      }
    }
    room_ = scratch_->template reserve_in<typename Exec::memory_space>(send_bytes, receive_bytes,
                                                                       messages_.decode_room());
    if (how_.staged) scratch_->reserve_staging(staged_send, staged_receive);
    if (messages_.measures_error()) report_.max_error = 0.0;

    // Receives first, so early senders find them posted: every chunk of every message, each
    // at its raw offset, in order (MPI matches them in that order); peers in the order they
    // send to this rank (rank - 1, rank - 2, ...), at most window_ of them at a time.
    for (const int peer : rotation(false)) {
      const chunk_plan plan = plan_from(peer);
      for (std::size_t chunk = 0; chunk < plan.count(); ++chunk) {
        arrivals_.push_back({peer, chunk});
        posted_.queue_receive(mpi_target(peer) + plan.begin(chunk) * value_bytes(), plan.size(chunk) * value_bytes(),
                              peer, int(arrivals_.size() - 1));
      }
    }
    posted_.post_receives_in_turn(window_, scratch_->comm, who_);

    bool in_rounds = false;
    if constexpr (batch_encoding_messages<Messages, Exec>) in_rounds = messages_.encodes_together();
    if (in_rounds) send_in_rounds();
    // Chunks are encoded in bursts of about burst_bytes of raw values, each burst then sent and
    // MPI polled for arrivals, which are decoded back to back: the transfer of one burst
    // overlaps the encoding of the next and the decoding of what came in. Per chunk, the encoder
    // and the decoder would each start with caches that MPI's calls in between had left.
    if (!in_rounds) send_in_bursts();
    // The block to itself last: the copy overlaps the last chunks on the wire.
    if (!failure_.aborting()) {
      try {
        messages_.copy_self(exec_);
      } catch (...) {
        failure_.record_local();  // every message has left: the peers complete as they are
      }
    }
  }

  /// The raw bytes of a burst (send_in_bursts): the pipeline's smallest chunk by default, so a
  /// pipelined message still leaves a chunk at a time; 64 chunks of 4 KiB, 4 of 64 KiB; about
  /// 100 us of encoding on a core.
  static constexpr std::size_t burst_bytes = cost_model{}.min_chunk_bytes;
  /// A chunk encoded and not yet sent: its bytes (none: the abort marker) and its peer.
  struct outgoing {
    std::span<const std::byte> payload;
    int peer;
  };

  Exec exec_;
  Messages messages_;
  comm_shape shape_;
  const char* who_;
  transport how_;
  std::size_t window_;
  call_scratch scratch_;
  scratch_room room_;  ///< the scratch in the execution space's memory
  std::vector<std::size_t> receive_offset_, send_offset_, staged_receive_offset_, staged_send_offset_;
  std::vector<std::pair<int, std::size_t>> arrivals_;  ///< per posted receive: (peer, chunk)
  bool decode_together_ = false;    ///< arrivals held and decoded as one batch at the end
  std::vector<held_arrival> held_;  ///< those held so far
  std::vector<outgoing> burst_;     ///< the burst being encoded (send_in_bursts)
  bool prepared_ = !prepares;       ///< prepare_encoding has run (or has nothing to do)
  collective_report report_;
  bool finished_ = false;
  call_failure failure_;
  posted_messages posted_{failure_};  // last: completed (or cancelled) before the buffers above go
};

/// Who sends what to whom, in elements.
struct exchange_layout {
  std::vector<std::size_t> send_counts, send_displs, recv_counts, recv_displs;
};

/// One contiguous block per peer (alltoall, alltoallv), cut into chunks when it may be
/// compressed (comm/detail/pipeline.hpp): chunk i of a block is values [begin(i), begin(i) +
/// size(i)), its own stream or its raw values, its own message. The Views and the scratch are
/// in `Memory` (the execution space's).
template <class T, class Memory = Kokkos::HostSpace>
struct block_messages {
  const T* send = nullptr;
  T* recv = nullptr;
  exchange_layout layout;
  wire_rule rule;
  compress_options codec;  ///< the bound already absolute
  bool measure_error = false;
  int rank = 0;
  const char* who = "kompress::alltoall";
  /// chunk_ranges[peer][chunk]: the value range of each chunk that may be compressed, read by
  /// resolve_relative_bound; empty when the bound was given absolute.
  std::vector<std::vector<packed_range<T>>> chunk_ranges;

  static constexpr std::size_t value_bytes = sizeof(T);

  /// One block's plan: whether it may be compressed and its chunks.
  struct block_plan {
    bool compressed = false;
    chunk_plan chunks;
  };
  /// Per peer, the block to it and the block from it, as planned decided them.
  std::vector<block_plan> to_peers, from_peers;

  /// The messages of one call, each block's plan decided once, before the engine asks: whether
  /// it may be compressed (the wire rule's decision for its size and its step in the rotation,
  /// the same on both sides) and its chunks. The engine asks for them per chunk, and the
  /// decision weighs the whole exchange (wire_rule::for_blocks).
  static block_messages planned(const T* send, T* recv, exchange_layout layout, wire_rule rule,
                                compress_options codec, bool measure_error, int rank, const char* who) {
    block_messages messages;
    messages.send = send;
    messages.recv = recv;
    messages.layout = std::move(layout);
    messages.rule = rule;
    messages.codec = std::move(codec);
    messages.measure_error = measure_error;
    messages.rank = rank;
    messages.who = who;
    messages.plan_blocks();
    return messages;
  }

  std::size_t raw_bytes_to(int peer) const { return layout.send_counts[std::size_t(peer)] * sizeof(T); }
  std::size_t raw_bytes_from(int peer) const { return layout.recv_counts[std::size_t(peer)] * sizeof(T); }
  bool compresses_to(int peer) const { return to_peers[std::size_t(peer)].compressed; }
  bool compresses_from(int peer) const { return from_peers[std::size_t(peer)].compressed; }
  chunk_plan chunks_to(int peer) const { return to_peers[std::size_t(peer)].chunks; }
  chunk_plan chunks_from(int peer) const { return from_peers[std::size_t(peer)].chunks; }
  bool receives_in_place(int peer) const { return !compresses_from(peer); }
  std::byte* place_from(int peer) const {
    return reinterpret_cast<std::byte*>(recv + layout.recv_displs[std::size_t(peer)]);
  }
  /// Staging of one chunk's stream: every chunk but the last is full, the last no larger.
  std::size_t chunk_room(const chunk_plan& plan) const { return max_compressed_size<T>(plan.chunk, codec); }
  std::size_t send_room(int peer) const {
    if (!compresses_to(peer)) return 0;
    const chunk_plan plan = chunks_to(peer);
    return plan.count() * chunk_room(plan);
  }
  bool measures_error() const { return measure_error; }
  std::size_t decode_room() const { return 0; }

  /// Called by the engine once before the first compression (after any blocks sent raw ahead of
  /// it have left): makes a REL bound absolute over the values this rank sends to other ranks
  /// (its block to itself is copied exactly, so its values play no part: at p ranks the pass
  /// reads (p - 1) / p of the View). Left relative, each chunk would resolve it over its own
  /// values. The range is read chunk by chunk where a block may be compressed, and each chunk's
  /// range kept for its compression, which then skips its own range pass (the same keys, so
  /// the same bytes).
  template <class Exec>
  void prepare(const Exec& exec) {
    if (codec.bound.mode == bound_mode::absolute) return;
    const bool has_fill = codec.fill_value.has_value();
    const bits_t<T> fill = fill_bits_of<T>(codec);
    packed_range<T> all = range_keys(exec, send, 0, false, bits_t<T>(0));  // empty
    chunk_ranges.assign(layout.send_counts.size(), {});
    for (int peer = 0; peer < int(layout.send_counts.size()); ++peer) {
      const std::size_t count = layout.send_counts[std::size_t(peer)];
      if (peer == rank || count == 0) continue;
      const T* const block = send + layout.send_displs[std::size_t(peer)];
      if (!compresses_to(peer)) {
        all = join_keys(all, range_keys(exec, block, count, has_fill, fill));
        continue;
      }
      const chunk_plan plan = chunks_to(peer);
      auto& ranges = chunk_ranges[std::size_t(peer)];
      for (std::size_t chunk = 0; chunk < plan.count(); ++chunk) {
        ranges.push_back(range_keys(exec, block + plan.begin(chunk), plan.size(chunk), has_fill, fill));
        all = join_keys(all, ranges.back());
      }
    }
    codec.bound = absolute(bound_for(codec, all));
  }

  template <class Exec>
  void copy_self(const Exec& exec) const {
    const std::size_t r = std::size_t(rank);
    copy_values<Memory>(exec, recv + layout.recv_displs[r], send + layout.send_displs[r], layout.send_counts[r]);
  }

  /// Whether this rank compresses its chunks round by round, each round one batch: where a
  /// compression costs more than the largest chunk it sends takes (cost_model::batches_encodes).
  bool encodes_together() const {
    std::size_t largest = 0;
    for (int peer = 0; peer < int(layout.send_counts.size()); ++peer)
      if (peer != rank && compresses_to(peer))
        largest = std::max(largest, chunks_to(peer).chunk * sizeof(T));
    return largest > 0 && rule.cost.batches_encodes(double(largest));
  }

  /// Chunk `chunk` of the block for each of `peers` (rooms[k]: that peer's staging), those that
  /// may be compressed compressed as one batch (detail/compress_batch.hpp): for each, the
  /// stream or the raw values, as encode gives them.
  template <class Exec>
  std::vector<std::span<const std::byte>> encode_round(const Exec& exec, std::span<const int> peers, std::size_t chunk,
                                                       std::span<std::byte* const> rooms,
                                                       collective_report& report) const {
    std::vector<std::span<const std::byte>> payloads(peers.size());
    std::vector<stream_to_compress<T>> streams;
    std::vector<std::size_t> which;
    for (std::size_t k = 0; k < peers.size(); ++k) {
      const int peer = peers[k];
      const chunk_plan plan = chunks_to(peer);
      const T* const values = send + layout.send_displs[std::size_t(peer)] + plan.begin(chunk);
      payloads[k] = {reinterpret_cast<const std::byte*>(values), plan.size(chunk) * sizeof(T)};
      if (!compresses_to(peer)) continue;
      streams.push_back({values, plan.size(chunk), rooms[k] + chunk * chunk_room(plan),
                         chunk_ranges.empty() ? nullptr : &chunk_ranges[std::size_t(peer)][chunk]});
      which.push_back(k);
    }
    const std::vector<std::size_t> lengths =
        compress_batch(exec, std::span<const stream_to_compress<T>>(streams), codec, who);
    for (std::size_t j = 0; j < which.size(); ++j) {
      const stream_to_compress<T>& s = streams[j];
      if (!rule.send_compressed(s.count * sizeof(T), lengths[j])) continue;
      if (measure_error)
        report.max_error = std::fmax(report.max_error, decode_error(exec, s.in, s.count, s.out, lengths[j]));
      payloads[which[j]] = {s.out, lengths[j]};
    }
    return payloads;
  }

  /// Chunk `chunk` of the block for `peer`; `room` is the peer's staging (send_room bytes).
  template <class Exec>
  std::span<const std::byte> encode(const Exec& exec, int peer, std::size_t chunk, std::byte* room,
                                    collective_report& report) const {
    const chunk_plan plan = chunks_to(peer);
    const std::size_t count = plan.size(chunk);
    const T* const values = send + layout.send_displs[std::size_t(peer)] + plan.begin(chunk);
    const std::size_t raw = count * sizeof(T);
    if (compresses_to(peer)) {
      std::byte* const out = room + chunk * chunk_room(plan);
      const values_in<std::byte, Memory> staging(out, chunk_room(plan));
      const values_in<const T, Memory> in(values, count);
      const std::size_t length =
          chunk_ranges.empty()
              ? compress(exec, in, staging, codec)
              : compress_known_range(exec, in, staging, codec, chunk_ranges[std::size_t(peer)][chunk]);
      if (rule.send_compressed(raw, length)) {
        if (measure_error) report.max_error = std::fmax(report.max_error, decode_error(exec, values, count, out, length));
        return {out, length};
      }
    }
    return {reinterpret_cast<const std::byte*>(values), raw};
  }

  /// Whether this rank decodes its arrivals together at the end: where a decompression costs
  /// more than the largest chunk it receives takes to decode (cost_model::batches_decodes).
  bool decodes_together() const {
    std::size_t largest = 0;
    for (int peer = 0; peer < int(layout.recv_counts.size()); ++peer)
      if (peer != rank && !receives_in_place(peer)) largest = std::max(largest, chunks_from(peer).chunk * sizeof(T));
    return largest > 0 && rule.cost.batches_decodes(double(largest));
  }

  /// finish over every held arrival: raw chunks checked, streams decoded as one batch.
  template <class Exec>
  double finish_together(const Exec& exec, std::span<const held_arrival> arrivals) const {
    std::vector<stream_to_decode<T>> streams;
    for (const held_arrival& a : arrivals) {
      if (receives_in_place(a.peer)) {
        finish(exec, a.peer, a.chunk, a.landed, a.length, nullptr);
        continue;
      }
      const chunk_plan plan = chunks_from(a.peer);
      streams.push_back({a.landed, a.length, recv + layout.recv_displs[std::size_t(a.peer)] + plan.begin(a.chunk),
                         plan.size(a.chunk)});
    }
    return decode_messages<Memory>(exec, std::span<const stream_to_decode<T>>(streams), who);
  }

  template <class Exec>
  double finish(const Exec& exec, int peer, std::size_t chunk, const std::byte* landed, std::size_t length,
                std::byte*) const {
    const chunk_plan plan = chunks_from(peer);
    if (receives_in_place(peer)) {  // raw values landed in place: exactly their size, or damaged
      if (length != plan.size(chunk) * sizeof(T))
        throw format_error(std::string(who) + ": a raw message from rank " + std::to_string(peer) + " holds " +
                           std::to_string(length) + " bytes; expected " + std::to_string(plan.size(chunk) * sizeof(T)));
      return 0.0;
    }
    return decode_message<Memory>(exec, landed, length, plan.size(chunk),
                                  recv + layout.recv_displs[std::size_t(peer)] + plan.begin(chunk), who);
  }

 private:
  /// How far `to` is after `from` in the rotation (1 .. p - 1 between two ranks).
  int step(int from, int to) const {
    const int p = int(layout.send_counts.size());
    return (to - from + p) % p;
  }

  template <class Exec>
  static double decode_error(const Exec& exec, const T* values, std::size_t count, const std::byte* stream,
                             std::size_t length) {
    const Kokkos::View<T*, Memory> decoded(Kokkos::view_alloc(Kokkos::WithoutInitializing, "kompress::measured"),
                                           count);
    decompress(exec, values_in<const std::byte, Memory>(stream, length), decoded);
    return max_difference<Memory>(exec, values, decoded.data(), count);
  }

 private:
  void plan_blocks() {
    const int p = int(layout.send_counts.size());
    // The last size's rule (blocks mostly share one size); the default is for_blocks(0)'s.
    wire_rule::block_rule sized;
    const auto plan = [&](std::size_t values, int step) {
      const std::uint64_t bytes = values * sizeof(T);
      if (bytes != sized.raw_bytes) sized = rule.for_blocks(bytes);
      const bool compressed = sized.compresses(step);
      return block_plan{compressed, rule.plan(values, sizeof(T), bytes, compressed)};
    };
    to_peers.clear();
    from_peers.clear();
    for (int peer = 0; peer < p; ++peer) {
      to_peers.push_back(plan(layout.send_counts[std::size_t(peer)], step(rank, peer)));
      from_peers.push_back(plan(layout.recv_counts[std::size_t(peer)], step(peer, rank)));
    }
  }
};

/// The start of every call's fingerprint: which collective, blocking or not, element size.
inline fingerprint call_fingerprint(collective_kind kind, bool nonblocking, std::size_t element_bytes) {
  fingerprint f;
  f.add(std::uint64_t(kind)).add(std::uint64_t(nonblocking)).add(std::uint64_t(element_bytes));
  return f;
}

/// What every collective asks of its Views' types: any memory the execution space reaches
/// (host or device; the transport seam gets the bytes to MPI).
template <class Exec, class SendView, class RecvView>
constexpr void check_view_types() {
  static_assert(std::is_same_v<typename SendView::non_const_value_type, typename RecvView::non_const_value_type>,
                "kompress collectives and dlrm exchange: input and output Views must hold the same element type");
  static_assert(!std::is_const_v<typename RecvView::value_type>,
                "kompress collectives and dlrm exchange: the output View must not be const");
  static_assert(Kokkos::SpaceAccessibility<Exec, typename SendView::memory_space>::accessible &&
                    Kokkos::SpaceAccessibility<Exec, typename RecvView::memory_space>::accessible,
                "kompress collectives and dlrm exchange: the Views must be accessible from the execution space");
}

/// The start of every collective call: the Views' types checked, `exec` fenced so that MPI and
/// the host read what work on it produced; returns the communicator's shape.
template <class SendView, class RecvView, class Exec>
comm_shape enter_collective(const Exec& exec, MPI_Comm comm, const char* who) {
  check_view_types<Exec, SendView, RecvView>();
  exec.fence("kompress: before MPI or the host reads a user View");
  return shape_of(comm, who);
}

}  // namespace kompress::inline v0::detail
