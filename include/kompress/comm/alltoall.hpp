#pragma once
// kompress::alltoall and alltoallv: MPI_Alltoall(v) on Views, compressed on the wire.
// Every value arrives within the sender's absolute bound (a REL bound resolves against the
// sender's whole send View); a rank's block to itself is copied exactly.
//
// Sync points: the call compresses every outgoing block before it returns (blocking on
// `exec`); the blocking forms also wait for every message and decompress. The nonblocking
// forms return a kompress::request whose wait() receives and decompresses. Views must be in
// host-accessible memory and stay alive until the request completes (the request holds
// references to them).

#include <kompress/comm/exchange.hpp>

#include <concepts>
#include <ranges>

namespace kompress {
inline namespace v0 {

/// A range of non-negative integer counts or displacements (std::vector<int>, std::span, ...).
template <class R>
concept count_range = std::ranges::sized_range<R> && std::integral<std::ranges::range_value_t<R>>;

namespace detail {

template <class R>
std::vector<std::size_t> to_sizes(const R& range, const char* who, const char* what) {
  std::vector<std::size_t> sizes;
  sizes.reserve(std::ranges::size(range));
  for (const auto value : range) {
    if (value < 0) throw invalid_argument(std::string(who) + ": negative " + what + " " + std::to_string(value));
    sizes.push_back(static_cast<std::size_t>(value));
  }
  return sizes;
}

template <class Exec, class SendView, class RecvView>
void check_exchange_views(const SendView& send, const RecvView& recv, const char* who) {
  static_assert(std::is_same_v<typename SendView::non_const_value_type, typename RecvView::non_const_value_type>,
                "kompress::alltoall: send and receive Views must hold the same element type");
  static_assert(!std::is_const_v<typename RecvView::value_type>, "kompress::alltoall: the receive View must not be const");
  static_assert(Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename SendView::memory_space>::accessible &&
                    Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename RecvView::memory_space>::accessible,
                "kompress::alltoall: Views must be host-accessible (device buffers are not supported yet)");
  static_assert(Kokkos::SpaceAccessibility<Exec, Kokkos::HostSpace>::accessible,
                "kompress::alltoall: the execution space must run on the host");
  require_contiguous(send, who, "the send View");
  require_contiguous(recv, who, "the receive View");
}

template <class Exec, class SendView, class RecvView>
exchange_layout uniform_layout(const SendView& send, const RecvView& recv, MPI_Comm comm, const char* who) {
  const comm_shape shape = shape_of(comm, who);
  const std::size_t p = std::size_t(shape.size);
  if (send.size() % p != 0)
    throw invalid_argument(std::string(who) + ": the send View's " + std::to_string(send.size()) +
                           " elements do not split evenly among " + std::to_string(p) + " ranks");
  if (recv.size() != send.size())
    throw invalid_argument(std::string(who) + ": the receive View has " + std::to_string(recv.size()) +
                           " elements, the send View " + std::to_string(send.size()) + "; they must match");
  const std::size_t count = send.size() / p;
  exchange_layout layout;
  for (std::size_t peer = 0; peer < p; ++peer) {
    layout.send_counts.push_back(count);
    layout.send_displs.push_back(peer * count);
  }
  layout.recv_counts = layout.send_counts;
  layout.recv_displs = layout.send_displs;
  return layout;
}

template <class Exec, class SendView, class RecvView>
std::unique_ptr<operation> make_exchange(const Exec& exec, const SendView& send, const RecvView& recv,
                                         exchange_layout layout, MPI_Comm comm, const collective_options& options,
                                         bool nonblocking, const char* who) {
  using T = typename SendView::non_const_value_type;
  Kokkos::Profiling::ScopedRegion region(who);
  return std::make_unique<exchange_operation<T, Exec, SendView, RecvView>>(exec, send, recv, std::move(layout), comm,
                                                                           options, nonblocking, who);
}

}  // namespace detail


/// MPI_Alltoall: block i of `send` (send.size() / p elements) goes to rank i; block j of
/// `recv` comes from rank j.
template <execution_space Exec, float_view SendView, float_view RecvView>
collective_report alltoall(const Exec& exec, const SendView& send, const RecvView& recv, MPI_Comm comm,
                           const collective_options& options = {}) {
  constexpr const char* who = "kompress::alltoall";
  using T = typename SendView::non_const_value_type;
  detail::check_exchange_views<Exec>(send, recv, who);
  const detail::exchange_layout layout = detail::uniform_layout<Exec>(send, recv, comm, who);
  const std::size_t block_bytes = layout.send_counts[0] * sizeof(T);
  if (options.mode == transfer_mode::raw ||
      (options.mode == transfer_mode::automatic && !options.cost.worth_compressing(block_bytes))) {
    // Exactly MPI_Alltoall: no staging, no extra message.
    detail::validate_bound(options.bound, who);
    const int bytes = detail::byte_count(block_bytes, who);
    detail::check_mpi(MPI_Alltoall(send.data(), bytes, MPI_BYTE, recv.data(), bytes, MPI_BYTE, comm), who,
                      "MPI_Alltoall");
    collective_report report;
    report.payload_bytes = report.wire_bytes = block_bytes * (layout.send_counts.size() - 1);
    report.messages = layout.send_counts.size() - 1;
    return report;
  }
  auto op = detail::make_exchange(exec, send, recv, layout, comm, options, false, who);
  op->progress(true);
  return op->report();
}

/// Nonblocking alltoall; wait() on the request delivers `recv`.
template <execution_space Exec, float_view SendView, float_view RecvView>
request ialltoall(const Exec& exec, const SendView& send, const RecvView& recv, MPI_Comm comm,
                  const collective_options& options = {}) {
  constexpr const char* who = "kompress::ialltoall";
  detail::check_exchange_views<Exec>(send, recv, who);
  return request(detail::make_exchange(exec, send, recv, detail::uniform_layout<Exec>(send, recv, comm, who), comm,
                                       options, true, who));
}

/// MPI_Alltoallv: counts and displacements in elements, one per rank; zero counts allowed.
template <execution_space Exec, float_view SendView, count_range SendCounts, count_range SendDispls,
          float_view RecvView, count_range RecvCounts, count_range RecvDispls>
collective_report alltoallv(const Exec& exec, const SendView& send, const SendCounts& send_counts,
                            const SendDispls& send_displs, const RecvView& recv, const RecvCounts& recv_counts,
                            const RecvDispls& recv_displs, MPI_Comm comm, const collective_options& options = {}) {
  constexpr const char* who = "kompress::alltoallv";
  detail::check_exchange_views<Exec>(send, recv, who);
  detail::exchange_layout layout{detail::to_sizes(send_counts, who, "send count"),
                                 detail::to_sizes(send_displs, who, "send displacement"),
                                 detail::to_sizes(recv_counts, who, "receive count"),
                                 detail::to_sizes(recv_displs, who, "receive displacement")};
  auto op = detail::make_exchange(exec, send, recv, std::move(layout), comm, options, false, who);
  op->progress(true);
  return op->report();
}

/// Nonblocking alltoallv; wait() on the request delivers `recv`.
template <execution_space Exec, float_view SendView, count_range SendCounts, count_range SendDispls,
          float_view RecvView, count_range RecvCounts, count_range RecvDispls>
request ialltoallv(const Exec& exec, const SendView& send, const SendCounts& send_counts,
                   const SendDispls& send_displs, const RecvView& recv, const RecvCounts& recv_counts,
                   const RecvDispls& recv_displs, MPI_Comm comm, const collective_options& options = {}) {
  constexpr const char* who = "kompress::ialltoallv";
  detail::check_exchange_views<Exec>(send, recv, who);
  detail::exchange_layout layout{detail::to_sizes(send_counts, who, "send count"),
                                 detail::to_sizes(send_displs, who, "send displacement"),
                                 detail::to_sizes(recv_counts, who, "receive count"),
                                 detail::to_sizes(recv_displs, who, "receive displacement")};
  return request(detail::make_exchange(exec, send, recv, std::move(layout), comm, options, true, who));
}

}  // namespace v0
}  // namespace kompress
