#pragma once
// The engine behind allreduce: a ring reduce-scatter whose hops carry compressed partial sums
// (decompress, add, recompress), then a ring allgather that forwards each final chunk's bytes
// unchanged, so every rank decodes the same bytes and ends bit-identical.
// docs/collectives.md gives the schedule and the error argument.

#include <kompress/comm/exchange.hpp>

#include <mpi.h>

#include <limits>
#include <vector>

namespace kompress::inline v0::detail {

template <class T>
MPI_Datatype mpi_type() {
  return std::is_same_v<T, float> ? MPI_FLOAT : MPI_DOUBLE;
}

/// Every rank must pass the same element count; a mismatch is reported on every rank.
inline void agree_on_count(std::size_t count, MPI_Comm comm, const char* who) {
  long long extremes[2] = {static_cast<long long>(count), -static_cast<long long>(count)};
  check_mpi(MPI_Allreduce(MPI_IN_PLACE, extremes, 2, MPI_LONG_LONG, MPI_MAX, comm), who, "MPI_Allreduce");
  if (extremes[0] != -extremes[1])
    throw invalid_argument(std::string(who) + ": ranks pass Views of different sizes (from " +
                           std::to_string(-extremes[1]) + " to " + std::to_string(extremes[0]) +
                           " elements); every rank must pass the same count");
}

template <class T, class Exec, class SendView, class RecvView>
class ring_allreduce_operation final : public operation {
 public:
  ring_allreduce_operation(const Exec& exec, SendView send, RecvView recv, MPI_Comm comm,
                           const collective_options& options, bool duplicate, const char* who)
      : exec_(exec), send_(std::move(send)), recv_(std::move(recv)), options_(options), who_(who) {
    if (duplicate) owned_ = owned_comm(comm, who);
    comm_ = duplicate ? owned_.get() : comm;
    shape_ = shape_of(comm_, who);
    validate_bound(options_.bound, who);
    agree_on_count(send_.size(), comm_, who);
    start();
  }

  bool progress(bool block) override {
    while (step_ < total_steps()) {
      MPI_Request pair[2] = {send_request_, recv_request_};
      MPI_Status statuses[2];
      if (block) {
        check_mpi(MPI_Waitall(2, pair, statuses), who_, "MPI_Waitall");
      } else {
        int done = 0;
        check_mpi(MPI_Testall(2, pair, &done, statuses), who_, "MPI_Testall");
        if (!done) {
          send_request_ = pair[0];
          recv_request_ = pair[1];
          return false;
        }
      }
      send_request_ = recv_request_ = MPI_REQUEST_NULL;
      int length = 0;
      check_mpi(MPI_Get_count(&statuses[1], MPI_BYTE, &length), who_, "MPI_Get_count");
      finish_step(std::size_t(length));
      ++step_;
      if (step_ < total_steps()) start_step();
    }
    return true;
  }

  const collective_report& report() const override { return report_; }

 private:
  int p() const { return shape_.size; }
  int total_steps() const { return 2 * (p() - 1); }
  std::size_t chunk_begin(int chunk) const { return std::size_t(chunk) * count_ / std::size_t(p()); }
  std::size_t chunk_size(int chunk) const { return chunk_begin(chunk + 1) - chunk_begin(chunk); }
  int wrap(int i) const { return ((i % p()) + p()) % p(); }
  // Reduce-scatter step s sends chunk rank - s and receives rank - s - 1; allgather step s
  // forwards chunk rank + 1 - s and receives rank - s.
  int sent_chunk(int step) const {
    return step < p() - 1 ? wrap(shape_.rank - step) : wrap(shape_.rank + 1 - (step - (p() - 1)));
  }
  int received_chunk(int step) const {
    return step < p() - 1 ? wrap(shape_.rank - step - 1) : wrap(shape_.rank - (step - (p() - 1)));
  }

  void start() {
    count_ = send_.size();
    // The bound every compression honours. REL resolves against all ranks' inputs.
    double bound = options_.bound.value;
    if (options_.bound.mode == bound_mode::relative) {
      const value_range local = compute_value_range(exec_, send_.data(), count_, false, bits_t<T>(0));
      double extremes[2] = {-local.min, local.max};  // +inf/-inf when empty
      check_mpi(MPI_Allreduce(MPI_IN_PLACE, extremes, 2, MPI_DOUBLE, MPI_MAX, comm_), who_, "MPI_Allreduce");
      bound = extremes[1] >= -extremes[0] ? options_.bound.value * (extremes[1] + extremes[0]) : 0.0;
    }
    hop_bound_ = options_.reduction_bound == allreduce_bound::total ? bound / p() : bound;
    report_.absolute_bound = hop_bound_ * p();

    std::size_t largest = 0;
    for (int c = 0; c < p(); ++c) largest = std::max(largest, chunk_size(c));
    // Partial sums accumulate in a copy: the input may be the output (in place).
    sums_ = Kokkos::View<T*, Kokkos::HostSpace>(Kokkos::view_alloc(Kokkos::WithoutInitializing, "kompress::sums"),
                                                count_);
    std::memcpy(sums_.data(), send_.data(), count_ * sizeof(T));
    scratch_ = Kokkos::View<T*, Kokkos::HostSpace>(Kokkos::view_alloc(Kokkos::WithoutInitializing, "kompress::hop"),
                                                   largest);
    send_bytes_ = Kokkos::View<std::byte*, Kokkos::HostSpace>(
        Kokkos::view_alloc(Kokkos::WithoutInitializing, "kompress::hop_send"),
        max_compressed_size<T>(largest, options_.block_size));
    // Final chunks as they travel in the allgather, one slot of raw size each.
    final_bytes_ = Kokkos::View<std::byte*, Kokkos::HostSpace>(
        Kokkos::view_alloc(Kokkos::WithoutInitializing, "kompress::final_chunks"), count_ * sizeof(T));
    final_length_.assign(p(), 0);
    recv_bytes_ = Kokkos::View<std::byte*, Kokkos::HostSpace>(
        Kokkos::view_alloc(Kokkos::WithoutInitializing, "kompress::hop_recv"), largest * sizeof(T));
    start_step();
  }

  bool compress_hops() const {
    switch (options_.mode) {
      case transfer_mode::raw: return false;
      case transfer_mode::automatic: return options_.cost.worth_compressing(count_ * sizeof(T) / p());
      default: return true;
    }
  }

  /// Encodes `count` values for the wire into `out` (room for the max compressed size);
  /// returns the message length: the stream, or the raw values when that is not smaller.
  std::size_t encode(const T* values, std::size_t count, std::byte* out) {
    const std::size_t raw = count * sizeof(T);
    std::size_t length = raw;
    if (compress_hops() && count > 0) {
      length = compress(exec_, host_values<const T>(values, count),
                        host_bytes(out, max_compressed_size<T>(count, options_.block_size)),
                        compress_options{.bound = absolute(hop_bound_), .block_size = options_.block_size});
      const bool pays = options_.mode != transfer_mode::automatic || options_.cost.compressed_wins(raw, length);
      if (length < raw && pays) return length;
    }
    std::memcpy(out, values, raw);
    return raw;
  }

  /// Decodes a message of `length` bytes holding `count` values (raw when length is the raw size).
  void decode(const std::byte* in, std::size_t length, std::size_t count, T* out) {
    if (length == count * sizeof(T)) {
      std::memcpy(out, in, length);
      return;
    }
    decompress(exec_, Kokkos::View<const std::byte*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>(in, length),
               host_values<T>(out, count));
  }

  void start_step() {
    const int right = wrap(shape_.rank + 1), left = wrap(shape_.rank - 1);
    const int out_chunk = sent_chunk(step_), in_chunk = received_chunk(step_);
    const std::byte* payload = nullptr;
    std::size_t length = 0;
    if (step_ < p() - 1) {
      length = encode(sums_.data() + chunk_begin(out_chunk), chunk_size(out_chunk), send_bytes_.data());
      payload = send_bytes_.data();
    } else {
      if (step_ == p() - 1) {
        // This rank owns the final value of chunk rank + 1: compress it once; every rank,
        // this one included, decodes these same bytes.
        const int own = wrap(shape_.rank + 1);
        std::byte* slot = final_bytes_.data() + chunk_begin(own) * sizeof(T);
        const std::size_t n = chunk_size(own);
        std::byte* staging = send_bytes_.data();
        final_length_[own] = encode(sums_.data() + chunk_begin(own), n, staging);
        std::memcpy(slot, staging, final_length_[own]);
        decode(slot, final_length_[own], n, recv_.data() + chunk_begin(own));
      }
      payload = final_bytes_.data() + chunk_begin(out_chunk) * sizeof(T);
      length = final_length_[out_chunk];
    }
    report_.payload_bytes += chunk_size(out_chunk) * sizeof(T);
    report_.wire_bytes += length;
    // Shorter than the raw values means a stream: allgather hops forward streams too.
    if (length < chunk_size(out_chunk) * sizeof(T)) ++report_.compressed_messages;
    ++report_.messages;
    std::byte* target = step_ < p() - 1 ? recv_bytes_.data() : final_bytes_.data() + chunk_begin(in_chunk) * sizeof(T);
    check_mpi(MPI_Irecv(target, byte_count(chunk_size(in_chunk) * sizeof(T), who_), MPI_BYTE, left, collective_tag,
                        comm_, &recv_request_),
              who_, "MPI_Irecv");
    check_mpi(MPI_Isend(payload, byte_count(length, who_), MPI_BYTE, right, collective_tag, comm_, &send_request_),
              who_, "MPI_Isend");
  }

  void finish_step(std::size_t length) {
    const int chunk = received_chunk(step_);
    const std::size_t n = chunk_size(chunk), begin = chunk_begin(chunk);
    if (step_ < p() - 1) {
      decode(recv_bytes_.data(), length, n, scratch_.data());
      T* const sums = sums_.data() + begin;
      const T* const incoming = scratch_.data();
      Kokkos::parallel_for("kompress::allreduce::add", Kokkos::RangePolicy<Exec>(exec_, 0, n),
                           KOKKOS_LAMBDA(std::size_t i) { sums[i] += incoming[i]; });
      exec_.fence("kompress::allreduce: partial sum added");
    } else {
      final_length_[chunk] = length;
      decode(final_bytes_.data() + begin * sizeof(T), length, n, recv_.data() + begin);
    }
  }

  Exec exec_;
  SendView send_;
  RecvView recv_;
  collective_options options_;
  const char* who_;
  owned_comm owned_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  comm_shape shape_;
  std::size_t count_ = 0;
  double hop_bound_ = 0.0;
  int step_ = 0;
  Kokkos::View<T*, Kokkos::HostSpace> sums_, scratch_;
  Kokkos::View<std::byte*, Kokkos::HostSpace> send_bytes_, recv_bytes_, final_bytes_;
  std::vector<std::size_t> final_length_;
  MPI_Request send_request_ = MPI_REQUEST_NULL, recv_request_ = MPI_REQUEST_NULL;
  collective_report report_;
};

}  // namespace kompress::inline v0::detail
