#pragma once
// The one exchange engine behind alltoall, alltoallv and the DLRM embedding exchange: receives
// posted first, the block to itself copied, then a rotating schedule of nonblocking sends
// (rank+1, rank+2, ...) each encoded just before it leaves, and arrivals decoded as they come.
// What a message between two ranks holds is a small policy (`Messages`): one contiguous block
// per peer (block_messages, here) or a list of per-table segments (dlrm/segments.hpp).
// docs/collectives.md describes the schedule, the wire rule and the failure guarantees.
//
// A Messages policy provides, for peers other than this rank:
//   raw_bytes_to(peer), raw_bytes_from(peer)  the raw size of each message (the receive size)
//   receives_in_place(peer), place_from(peer) whether a raw message lands in the caller's memory
//   send_room(peer)                           staging bytes encode(peer) may use
//   copy_self(exec)                           this rank's block to itself, exact
//   encode(exec, peer, room, report)          the bytes to send: a stream in room, or raw values
//   decode_room()                             scratch bytes finish may decode into
//   finish(exec, peer, landed, length, room)  decodes an arrival; returns its absolute bound
//   measures_error()                          whether encode reports the error it introduces

#include <kompress/comm/detail/agreement.hpp>
#include <kompress/comm/options.hpp>
#include <kompress/comm/request.hpp>
#include <kompress/comm/workspace.hpp>
#include <kompress/compress.hpp>
#include <kompress/detail/mpi.hpp>

#include <Kokkos_Core.hpp>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <span>
#include <string>
#include <vector>

namespace kompress::inline v0::detail {

template <class T>
using host_values = Kokkos::View<T*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>;
using host_bytes = Kokkos::View<std::byte*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>;
using const_host_bytes = Kokkos::View<const std::byte*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>;

/// The wire rule: whether a message may be compressed is decided by both sides alike from what
/// both know (mode, cost model, raw size); the sender sends the stream only when it is smaller
/// (and, in automatic mode, wins), else the raw values; the receiver tells them apart by the
/// length (exactly the raw size means raw).
struct wire_rule {
  transfer_mode mode = transfer_mode::compressed;
  cost_model cost{};

  bool may_compress(std::uint64_t raw_bytes) const {
    switch (mode) {
      case transfer_mode::raw: return false;
      case transfer_mode::automatic: return cost.worth_compressing(raw_bytes);
      default: return raw_bytes > 0;
    }
  }
  bool send_compressed(std::uint64_t raw_bytes, std::uint64_t length) const {
    return length < raw_bytes && (mode != transfer_mode::automatic || cost.compressed_wins(raw_bytes, length));
  }
  void add_to(fingerprint& f) const {
    f.add(std::uint64_t(mode));
    if (mode == transfer_mode::automatic)
      f.add(cost.link_bytes_per_second).add(cost.compress_bytes_per_second).add(cost.decompress_bytes_per_second)
          .add(cost.min_message_bytes);
  }
};

/// Decodes a message of `length` bytes that holds `count` values into `out`: the raw values
/// when length is their size, else one kompress stream of exactly that length. Returns the
/// stream's absolute bound (0 for raw values).
template <class T, class Exec>
double decode_message(const Exec& exec, const std::byte* in, std::size_t length, std::size_t count, T* out,
                      const char* who) {
  if (length == count * sizeof(T)) {
    std::memcpy(out, in, length);
    return 0.0;
  }
  const const_host_bytes stream(in, length);
  const stream_info info = inspect(stream);  // format_error on a damaged stream
  if (info.count != count || info.compressed_bytes != length)
    throw format_error(std::string(who) + ": a received stream holds " + std::to_string(info.count) + " values in " +
                       std::to_string(info.compressed_bytes) + " bytes; expected " + std::to_string(count) +
                       " values in a message of " + std::to_string(length) + " bytes");
  decompress(exec, stream, host_values<T>(out, count));
  return info.absolute_bound;
}

/// The requests one collective posted. Destroying it (on an exception too) cancels the
/// receives still pending and completes every request before the buffers they target can go:
/// declare it after those buffers. Sends are waited for, not cancelled: every peer agreed on the
/// call before anything was posted, so each has posted the matching receive.
class posted_messages {
 public:
  posted_messages() = default;
  posted_messages(const posted_messages&) = delete;
  posted_messages& operator=(const posted_messages&) = delete;
  ~posted_messages() { abandon(); }

  void receive(void* buffer, std::size_t bytes, int peer, MPI_Comm comm, const char* who) {
    receives_.push_back(MPI_REQUEST_NULL);
    receive_peers_.push_back(peer);
    check_mpi(MPI_Irecv(buffer, byte_count(bytes, who), MPI_BYTE, peer, collective_tag, comm, &receives_.back()), who,
              "MPI_Irecv");
    ++pending_;
  }
  void send(const void* buffer, std::size_t bytes, int peer, MPI_Comm comm, const char* who) {
    sends_.push_back(MPI_REQUEST_NULL);
    check_mpi(MPI_Isend(buffer, byte_count(bytes, who), MPI_BYTE, peer, collective_tag, comm, &sends_.back()), who,
              "MPI_Isend");
  }

  /// Completes receives as they arrive, on_arrival(peer, length) for each, then the sends.
  /// Blocks if `block`; otherwise returns false as soon as nothing more is ready.
  template <class OnArrival>
  bool progress(bool block, const char* who, OnArrival&& on_arrival) {
    while (pending_ > 0) {
      int index = MPI_UNDEFINED, flag = 0;
      MPI_Status status;
      if (block) {
        check_mpi(MPI_Waitany(int(receives_.size()), receives_.data(), &index, &status), who, "MPI_Waitany");
        flag = 1;
      } else {
        check_mpi(MPI_Testany(int(receives_.size()), receives_.data(), &index, &flag, &status), who, "MPI_Testany");
      }
      if (!flag) return false;
      if (index == MPI_UNDEFINED) break;
      --pending_;
      int length = 0;
      check_mpi(MPI_Get_count(&status, MPI_BYTE, &length), who, "MPI_Get_count");
      on_arrival(receive_peers_[std::size_t(index)], std::size_t(length));
    }
    if (block) {
      check_mpi(MPI_Waitall(int(sends_.size()), sends_.data(), MPI_STATUSES_IGNORE), who, "MPI_Waitall");
      return true;
    }
    int done = 0;
    check_mpi(MPI_Testall(int(sends_.size()), sends_.data(), &done, MPI_STATUSES_IGNORE), who, "MPI_Testall");
    return done != 0;
  }

  /// Cancels pending receives and completes everything (no-op once all completed).
  void abandon() noexcept {
    for (MPI_Request& r : receives_)
      if (r != MPI_REQUEST_NULL) MPI_Cancel(&r);
    if (!receives_.empty()) MPI_Waitall(int(receives_.size()), receives_.data(), MPI_STATUSES_IGNORE);
    if (!sends_.empty()) MPI_Waitall(int(sends_.size()), sends_.data(), MPI_STATUSES_IGNORE);
    pending_ = 0;
  }

 private:
  std::vector<MPI_Request> receives_, sends_;
  std::vector<int> receive_peers_;
  std::size_t pending_ = 0;
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

/// One exchange in flight (see the top of this file).
template <class Messages, class Exec>
class exchange_engine final : public operation {
 public:
  exchange_engine(const Exec& exec, Messages messages, comm_shape shape, workspace_slot* leased, MPI_Comm comm,
                  bool nonblocking, const char* who)
      : exec_(exec), messages_(std::move(messages)), shape_(shape), who_(who),
        scratch_(leased, comm, nonblocking, who) {
    start();
  }

  bool progress(bool block) override {
    if (finished_) return true;
    const bool done = posted_.progress(block, who_, [&](int peer, std::size_t length) {
      report_.absolute_bound = std::max(report_.absolute_bound, messages_.finish(exec_, peer, target(peer), length,
                                                                                scratch_->decode.data()));
    });
    if (done) {
      exec_.fence("kompress: exchange decoded");
      finished_ = true;
    }
    return done;
  }

  const collective_report& report() const override { return report_; }

 private:
  std::byte* target(int peer) const {
    return messages_.receives_in_place(peer) ? messages_.place_from(peer)
                                             : scratch_->receive.data() + receive_offset_[std::size_t(peer)];
  }

  void start() {
    const int p = shape_.size, rank = shape_.rank;
    receive_offset_.assign(std::size_t(p), 0);
    send_offset_.assign(std::size_t(p), 0);
    std::size_t receive_bytes = 0, send_bytes = 0;
    for (int peer = 0; peer < p; ++peer) {
      if (peer == rank) continue;
      if (!messages_.receives_in_place(peer)) {
        receive_offset_[std::size_t(peer)] = receive_bytes;
        receive_bytes += messages_.raw_bytes_from(peer);
      }
      send_offset_[std::size_t(peer)] = send_bytes;
      send_bytes += messages_.send_room(peer);
    }
    scratch_->reserve(send_bytes, receive_bytes, messages_.decode_room());
    if (messages_.measures_error()) report_.max_error = 0.0;

    // Receives first, so early senders find them posted.
    for (int peer = 0; peer < p; ++peer)
      if (peer != rank && messages_.raw_bytes_from(peer) > 0)
        posted_.receive(target(peer), messages_.raw_bytes_from(peer), peer, scratch_->comm, who_);

    messages_.copy_self(exec_);

    // Rotating order, so no rank is everyone's first target; each message leaves as soon as it
    // is encoded, overlapping its transfer with the next one's compression.
    for (int step = 1; step < p; ++step) {
      const int peer = (rank + step) % p;
      const std::size_t raw = messages_.raw_bytes_to(peer);
      if (raw == 0) continue;
      const std::span<const std::byte> payload =
          messages_.encode(exec_, peer, scratch_->send.data() + send_offset_[std::size_t(peer)], report_);
      report_.payload_bytes += raw;
      report_.wire_bytes += payload.size();
      ++report_.messages;
      if (payload.size() < raw) ++report_.compressed_messages;
      posted_.send(payload.data(), payload.size(), peer, scratch_->comm, who_);
    }
  }

  Exec exec_;
  Messages messages_;
  comm_shape shape_;
  const char* who_;
  call_scratch scratch_;
  std::vector<std::size_t> receive_offset_, send_offset_;
  collective_report report_;
  bool finished_ = false;
  posted_messages posted_;  // last: completed or cancelled before the buffers above go
};

/// Who sends what to whom, in elements.
struct exchange_layout {
  std::vector<std::size_t> send_counts, send_displs, recv_counts, recv_displs;
};

/// One contiguous block per peer (alltoall, alltoallv).
template <class T>
struct block_messages {
  const T* send = nullptr;
  T* recv = nullptr;
  exchange_layout layout;
  wire_rule rule;
  compress_options codec;  ///< the bound already absolute
  bool measure_error = false;
  int rank = 0;
  const char* who = "kompress::alltoall";

  std::size_t raw_bytes_to(int peer) const { return layout.send_counts[std::size_t(peer)] * sizeof(T); }
  std::size_t raw_bytes_from(int peer) const { return layout.recv_counts[std::size_t(peer)] * sizeof(T); }
  bool receives_in_place(int peer) const { return !rule.may_compress(raw_bytes_from(peer)); }
  std::byte* place_from(int peer) const {
    return reinterpret_cast<std::byte*>(recv + layout.recv_displs[std::size_t(peer)]);
  }
  std::size_t send_room(int peer) const {
    return rule.may_compress(raw_bytes_to(peer))
               ? max_compressed_size<T>(layout.send_counts[std::size_t(peer)], codec.block_size)
               : 0;
  }
  bool measures_error() const { return measure_error; }
  std::size_t decode_room() const { return 0; }

  template <class Exec>
  void copy_self(const Exec&) const {
    const std::size_t r = std::size_t(rank);
    if (layout.send_counts[r] > 0)
      std::memmove(recv + layout.recv_displs[r], send + layout.send_displs[r], layout.send_counts[r] * sizeof(T));
  }

  template <class Exec>
  std::span<const std::byte> encode(const Exec& exec, int peer, std::byte* room, collective_report& report) const {
    const std::size_t count = layout.send_counts[std::size_t(peer)];
    const T* const values = send + layout.send_displs[std::size_t(peer)];
    const std::size_t raw = count * sizeof(T);
    if (rule.may_compress(raw)) {
      const host_bytes staging(room, send_room(peer));
      const std::size_t length = compress(exec, host_values<const T>(values, count), staging, codec);
      if (rule.send_compressed(raw, length)) {
        if (measure_error) report.max_error = std::fmax(report.max_error, decode_error(exec, values, count, room, length));
        return {room, length};
      }
    }
    return {reinterpret_cast<const std::byte*>(values), raw};
  }

  template <class Exec>
  double finish(const Exec& exec, int peer, const std::byte* landed, std::size_t length, std::byte*) const {
    if (receives_in_place(peer)) return 0.0;  // raw values landed in place
    return decode_message(exec, landed, length, layout.recv_counts[std::size_t(peer)],
                          recv + layout.recv_displs[std::size_t(peer)], who);
  }

 private:
  template <class Exec>
  static double decode_error(const Exec& exec, const T* values, std::size_t count, const std::byte* stream,
                             std::size_t length) {
    std::vector<T> decoded(count);
    decompress(exec, const_host_bytes(stream, length), host_values<T>(decoded.data(), count));
    double error = 0.0;
    for (std::size_t i = 0; i < count; ++i)
      if (std::isfinite(values[i])) error = std::max(error, std::fabs(double(values[i]) - double(decoded[i])));
    return error;
  }
};

/// The start of every call's fingerprint: which collective, blocking or not, element size.
inline fingerprint call_fingerprint(collective_kind kind, bool nonblocking, std::size_t element_bytes) {
  fingerprint f;
  f.add(std::uint64_t(kind)).add(std::uint64_t(nonblocking)).add(std::uint64_t(element_bytes));
  return f;
}

/// What every collective asks of its Views' types (host memory until the GPU path).
template <class Exec, class SendView, class RecvView>
constexpr void check_view_types() {
  static_assert(std::is_same_v<typename SendView::non_const_value_type, typename RecvView::non_const_value_type>,
                "kompress collectives and dlrm exchange: input and output Views must hold the same element type");
  static_assert(!std::is_const_v<typename RecvView::value_type>,
                "kompress collectives and dlrm exchange: the output View must not be const");
  static_assert(Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename SendView::memory_space>::accessible &&
                    Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename RecvView::memory_space>::accessible,
                "kompress collectives and dlrm exchange: Views must be host-accessible (device buffers are not "
                "supported yet)");
  static_assert(Kokkos::SpaceAccessibility<Exec, Kokkos::HostSpace>::accessible,
                "kompress collectives and dlrm exchange: the execution space must run on the host");
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
