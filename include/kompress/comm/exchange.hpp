#pragma once
// The engine behind alltoall and alltoallv: per-peer compression, pairwise nonblocking sends,
// decompression on arrival. docs/collectives.md describes the schedule and the wire rule.

#include <kompress/comm/options.hpp>
#include <kompress/comm/request.hpp>
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

/// The absolute bound an error_bound resolves to over `count` values (REL: over the finite
/// values of this array).
template <class T, class Exec>
double resolve_bound(const Exec& exec, const T* values, std::size_t count, const error_bound& bound,
                     const char* who) {
  validate_bound(bound, who);
  if (bound.mode == bound_mode::absolute) return bound.value;
  const value_range range = compute_value_range(exec, values, count, false, bits_t<T>(0));
  return range.empty() ? 0.0 : bound.value * (range.max - range.min);
}

/// Who sends what to whom, in elements.
struct exchange_layout {
  std::vector<std::size_t> send_counts, send_displs, recv_counts, recv_displs;
};

inline void check_layout(const exchange_layout& layout, int size, std::size_t send_extent,
                         std::size_t recv_extent, const char* who) {
  const auto check = [&](const std::vector<std::size_t>& counts, const std::vector<std::size_t>& displs,
                         std::size_t extent, const char* what) {
    if (counts.size() != std::size_t(size) || displs.size() != std::size_t(size))
      throw invalid_argument(std::string(who) + ": " + what + " counts and displacements need one entry per rank (" +
                             std::to_string(size) + "), got " + std::to_string(counts.size()) + " and " +
                             std::to_string(displs.size()));
    for (int peer = 0; peer < size; ++peer)
      if (displs[peer] > extent || counts[peer] > extent - displs[peer])
        throw invalid_argument(std::string(who) + ": " + what + " block for rank " + std::to_string(peer) +
                               " [" + std::to_string(displs[peer]) + ", +" + std::to_string(counts[peer]) +
                               ") overflows the View of " + std::to_string(extent) + " elements");
  };
  check(layout.send_counts, layout.send_displs, send_extent, "send");
  check(layout.recv_counts, layout.recv_displs, recv_extent, "receive");
}

/// One alltoall(v) in flight. Holds the caller's Views so they outlive the messages.
template <class T, class Exec, class SendView, class RecvView>
class exchange_operation final : public operation {
 public:
  exchange_operation(const Exec& exec, SendView send, RecvView recv, exchange_layout layout, MPI_Comm comm,
                     const collective_options& options, bool duplicate, const char* who)
      : exec_(exec), send_(std::move(send)), recv_(std::move(recv)), layout_(std::move(layout)),
        options_(options), who_(who) {
    if (duplicate) owned_ = owned_comm(comm, who);
    comm_ = duplicate ? owned_.get() : comm;
    shape_ = shape_of(comm_, who);
    check_layout(layout_, shape_.size, send_.size(), recv_.size(), who);
    validate_block_size(options_.block_size, who);
    start();
  }

  ~exchange_operation() override = default;

  bool progress(bool block) override {
    const bool received = drain_receives(receives_, pending_receives_, block, who_,
                                         [&](int index, const MPI_Status& status) {
                                           finish_receive(receive_peers_[index], status);
                                         });
    return received && complete_sends(sends_, block, who_);
  }

  const collective_report& report() const override { return report_; }

 private:
  bool compress_pair(std::size_t count) const {
    const std::uint64_t bytes = count * sizeof(T);
    switch (options_.mode) {
      case transfer_mode::raw: return false;
      case transfer_mode::automatic: return options_.cost.worth_compressing(bytes);
      default: return bytes > 0;
    }
  }

  void start() {
    const int rank = shape_.rank, size = shape_.size;
    const T* const send = send_.data();
    T* const recv = recv_.data();
    abs_bound_ = resolve_bound(exec_, send, send_.size(), options_.bound, who_);

    // Receives first, so early senders find them posted. A pair is compressed or raw by a rule
    // both sides evaluate alike; a compressed pair's receive takes up to the raw size, since a
    // sender whose stream would not be smaller sends the raw values (and the length says so).
    std::size_t staging_bytes = 0;
    std::vector<std::size_t> staging_offset(size, 0);
    for (int peer = 0; peer < size; ++peer) {
      if (peer == rank || !compress_pair(layout_.recv_counts[peer])) continue;
      staging_offset[peer] = staging_bytes;
      staging_bytes += layout_.recv_counts[peer] * sizeof(T);
    }
    recv_staging_ = Kokkos::View<std::byte*, Kokkos::HostSpace>(
        Kokkos::view_alloc(Kokkos::WithoutInitializing, "kompress::recv_staging"), staging_bytes);
    recv_staging_offset_ = staging_offset;
    for (int peer = 0; peer < size; ++peer) {
      const std::size_t count = layout_.recv_counts[peer];
      if (peer == rank || count == 0) continue;
      const int bytes = byte_count(count * sizeof(T), who_);
      void* target = compress_pair(count) ? static_cast<void*>(recv_staging_.data() + staging_offset[peer])
                                          : static_cast<void*>(recv + layout_.recv_displs[peer]);
      receives_.push_back(MPI_REQUEST_NULL);
      receive_peers_.push_back(peer);
      check_mpi(MPI_Irecv(target, bytes, MPI_BYTE, peer, collective_tag, comm_, &receives_.back()), who_,
                "MPI_Irecv");
    }
    pending_receives_ = receives_.size();

    if (layout_.send_counts[rank] != layout_.recv_counts[rank])
      throw invalid_argument(std::string(who_) + ": this rank sends " + std::to_string(layout_.send_counts[rank]) +
                             " values to itself but expects " + std::to_string(layout_.recv_counts[rank]));
    if (layout_.send_counts[rank] > 0)
      std::memmove(recv + layout_.recv_displs[rank], send + layout_.send_displs[rank],
                   layout_.send_counts[rank] * sizeof(T));

    // Sends in a rotating order (rank+1, rank+2, ...) so no rank is everyone's first target;
    // each message leaves as soon as its chunk is compressed, overlapping the next chunk's
    // compression with the transfer.
    std::size_t send_staging_bytes = 0;
    std::vector<std::size_t> send_offset(size, 0);
    for (int peer = 0; peer < size; ++peer) {
      if (peer == rank || !compress_pair(layout_.send_counts[peer])) continue;
      send_offset[peer] = send_staging_bytes;
      send_staging_bytes += max_compressed_size<T>(layout_.send_counts[peer], options_.block_size);
    }
    send_staging_ = Kokkos::View<std::byte*, Kokkos::HostSpace>(
        Kokkos::view_alloc(Kokkos::WithoutInitializing, "kompress::send_staging"), send_staging_bytes);
    const compress_options chunk_options{.bound = absolute(abs_bound_), .block_size = options_.block_size};
    double max_error = 0.0;
    for (int step = 1; step < size; ++step) {
      const int peer = (rank + step) % size;
      const std::size_t count = layout_.send_counts[peer];
      if (count == 0) continue;
      const T* const values = send + layout_.send_displs[peer];
      const std::size_t raw_bytes = count * sizeof(T);
      const void* payload = values;
      std::size_t wire = raw_bytes;
      if (compress_pair(count)) {
        host_bytes staging(send_staging_.data() + send_offset[peer],
                           max_compressed_size<T>(count, options_.block_size));
        const std::size_t length =
            compress(exec_, host_values<const T>(values, count), staging, chunk_options);
        const bool pays = options_.mode != transfer_mode::automatic || options_.cost.compressed_wins(raw_bytes, length);
        if (length < raw_bytes && pays) {
          payload = staging.data();
          wire = length;
          ++report_.compressed_messages;
          if (options_.measure_error) max_error = std::max(max_error, decode_error(values, count, staging, length));
        }
      }
      report_.payload_bytes += raw_bytes;
      report_.wire_bytes += wire;
      ++report_.messages;
      sends_.push_back(MPI_REQUEST_NULL);
      check_mpi(MPI_Isend(payload, byte_count(wire, who_), MPI_BYTE, peer, collective_tag, comm_, &sends_.back()),
                who_, "MPI_Isend");
    }
    if (options_.measure_error) report_.max_error = max_error;
  }

  double decode_error(const T* values, std::size_t count, host_bytes staging, std::size_t length) const {
    std::vector<T> decoded(count);
    decompress(exec_, Kokkos::subview(staging, std::pair<std::size_t, std::size_t>(0, length)),
               host_values<T>(decoded.data(), count));
    double error = 0.0;
    for (std::size_t i = 0; i < count; ++i)
      if (std::isfinite(values[i])) error = std::max(error, std::fabs(double(values[i]) - double(decoded[i])));
    return error;
  }

  void finish_receive(int peer, const MPI_Status& status) {
    const std::size_t count = layout_.recv_counts[peer];
    if (!compress_pair(count)) return;  // raw values landed in place
    int length = 0;
    check_mpi(MPI_Get_count(&status, MPI_BYTE, &length), who_, "MPI_Get_count");
    T* const target = recv_.data() + layout_.recv_displs[peer];
    std::byte* const staged = recv_staging_.data() + recv_staging_offset_[peer];
    if (std::size_t(length) == count * sizeof(T)) {  // the sender found raw cheaper
      std::memcpy(target, staged, count * sizeof(T));
      return;
    }
    const host_bytes stream(staged, std::size_t(length));
    decompress(exec_, stream, host_values<T>(target, count));
    report_.absolute_bound = std::max(report_.absolute_bound, inspect(stream).absolute_bound);
  }

  Exec exec_;
  SendView send_;
  RecvView recv_;
  exchange_layout layout_;
  collective_options options_;
  const char* who_;
  owned_comm owned_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  comm_shape shape_;
  double abs_bound_ = 0.0;
  Kokkos::View<std::byte*, Kokkos::HostSpace> send_staging_, recv_staging_;
  std::vector<std::size_t> recv_staging_offset_;
  std::vector<MPI_Request> receives_, sends_;
  std::vector<int> receive_peers_;
  std::size_t pending_receives_ = 0;
  collective_report report_;
};

}  // namespace kompress::inline v0::detail
