#pragma once
// kompress::allreduce (sum): MPI_Allreduce on Views, compressed on the wire, every rank ending
// bit-identical. With allreduce_bound::per_hop each compression is within the bound and the
// result within p times it of the exact sum; with allreduce_bound::total the result is within
// the bound (docs/collectives.md; floating-point summation error comes on top, as it does for
// MPI's own sum in a different order). A REL bound resolves against the value range of all
// ranks' inputs, agreed with one small MPI_Allreduce.
//
// Sync points: the blocking form returns with the result in `recv`; the nonblocking form
// compresses the first hop before it returns and advances hop by hop in test() and wait().

#include <kompress/comm/ring_allreduce.hpp>

namespace kompress {
inline namespace v0 {

namespace detail {

/// A plain MPI nonblocking call, for raw mode: the request keeps the Views alive.
template <class SendView, class RecvView>
class mpi_request_operation final : public operation {
 public:
  mpi_request_operation(SendView send, RecvView recv, const char* who)
      : send_(std::move(send)), recv_(std::move(recv)), who_(who) {}
  MPI_Request* handle() { return &request_; }
  collective_report& mutable_report() { return report_; }
  bool progress(bool block) override {
    if (block) {
      check_mpi(MPI_Wait(&request_, MPI_STATUS_IGNORE), who_, "MPI_Wait");
      return true;
    }
    int done = 0;
    check_mpi(MPI_Test(&request_, &done, MPI_STATUS_IGNORE), who_, "MPI_Test");
    return done != 0;
  }
  const collective_report& report() const override { return report_; }

 private:
  SendView send_;
  RecvView recv_;
  const char* who_;
  MPI_Request request_ = MPI_REQUEST_NULL;
  collective_report report_;
};

template <class Exec, class SendView, class RecvView>
void check_allreduce_views(const SendView& send, const RecvView& recv, const char* who) {
  static_assert(std::is_same_v<typename SendView::non_const_value_type, typename RecvView::non_const_value_type>,
                "kompress::allreduce: send and receive Views must hold the same element type");
  static_assert(!std::is_const_v<typename RecvView::value_type>, "kompress::allreduce: the result View must not be const");
  static_assert(Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename SendView::memory_space>::accessible &&
                    Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename RecvView::memory_space>::accessible,
                "kompress::allreduce: Views must be host-accessible (device buffers are not supported yet)");
  static_assert(Kokkos::SpaceAccessibility<Exec, Kokkos::HostSpace>::accessible,
                "kompress::allreduce: the execution space must run on the host");
  require_contiguous(send, who, "the send View");
  require_contiguous(recv, who, "the result View");
  if (send.size() != recv.size())
    throw invalid_argument(std::string(who) + ": the send View has " + std::to_string(send.size()) +
                           " elements, the result View " + std::to_string(recv.size()) + "; they must match");
}

/// Raw mode, and automatic mode where compression cannot pay: exactly MPI_Allreduce.
inline bool allreduce_uncompressed(std::size_t bytes, int ranks, const collective_options& options) {
  return options.mode == transfer_mode::raw ||
         (options.mode == transfer_mode::automatic && !options.cost.worth_compressing(bytes / std::size_t(ranks)));
}

template <class Exec, class SendView, class RecvView>
std::unique_ptr<operation> make_allreduce(const Exec& exec, const SendView& send, const RecvView& recv, MPI_Comm comm,
                                          const collective_options& options, bool nonblocking, const char* who) {
  using T = typename SendView::non_const_value_type;
  Kokkos::Profiling::ScopedRegion region(who);
  check_allreduce_views<Exec>(send, recv, who);
  const comm_shape shape = shape_of(comm, who);
  if (allreduce_uncompressed(send.size() * sizeof(T), shape.size, options)) {
    validate_bound(options.bound, who);
    const void* in = send.data() == recv.data() ? MPI_IN_PLACE : static_cast<const void*>(send.data());
    auto op = std::make_unique<mpi_request_operation<SendView, RecvView>>(send, recv, who);
    const int count = byte_count(send.size(), who);
    if (nonblocking) {
      check_mpi(MPI_Iallreduce(in, recv.data(), count, mpi_type<T>(), MPI_SUM, comm, op->handle()), who,
                "MPI_Iallreduce");
    } else {
      check_mpi(MPI_Allreduce(in, recv.data(), count, mpi_type<T>(), MPI_SUM, comm), who, "MPI_Allreduce");
    }
    op->mutable_report().payload_bytes = op->mutable_report().wire_bytes = send.size() * sizeof(T);
    return op;
  }
  return std::make_unique<ring_allreduce_operation<T, Exec, SendView, RecvView>>(exec, send, recv, comm, options,
                                                                                 nonblocking, who);
}

}  // namespace detail


/// Sum of `send` over all ranks into `recv` (pass the same View twice for in place).
template <execution_space Exec, float_view SendView, float_view RecvView>
collective_report allreduce(const Exec& exec, const SendView& send, const RecvView& recv, MPI_Comm comm,
                            const collective_options& options = {}) {
  auto op = detail::make_allreduce(exec, send, recv, comm, options, false, "kompress::allreduce");
  op->progress(true);
  return op->report();
}

/// In place: `data` holds the sum on return.
template <execution_space Exec, float_view View>
collective_report allreduce(const Exec& exec, const View& data, MPI_Comm comm, const collective_options& options = {}) {
  return allreduce(exec, data, data, comm, options);
}

/// Nonblocking allreduce; wait() on the request delivers `recv`.
template <execution_space Exec, float_view SendView, float_view RecvView>
request iallreduce(const Exec& exec, const SendView& send, const RecvView& recv, MPI_Comm comm,
                   const collective_options& options = {}) {
  return request(detail::make_allreduce(exec, send, recv, comm, options, true, "kompress::iallreduce"));
}

}  // namespace v0
}  // namespace kompress
