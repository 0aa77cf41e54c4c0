#pragma once
// kompress::alltoall and alltoallv: MPI_Alltoall(v) on Views, compressed on the wire.
// Every value arrives within the sender's absolute bound (a REL bound resolves against the
// value range of what the sender compresses: its blocks to the other ranks, not its block to
// itself); a rank's block to itself is copied exactly.
//
// Sync points: every call first fences `exec` (the send View may be the output of work on
// it), then agrees on the arguments with one small MPI_Allreduce (blocking, nonblocking forms
// too), then compresses every outgoing block before it returns (each compression waits for
// `exec`). The blocking forms also wait for every message, decompress and fence `exec` before
// returning. The nonblocking forms return a kompress::request whose wait() receives,
// decompresses and fences `exec`. Views must be in host-accessible memory and stay alive until
// the request completes (the request holds references to them). Bad arguments on any rank
// throw invalid_argument on every rank before any data moves.

#include <kompress/comm/detail/engine.hpp>
#include <kompress/comm/detail/value_range.hpp>
#include <kompress/detail/arguments.hpp>

#include <concepts>
#include <ranges>
#include <tuple>

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
    if (value < 0)
      throw invalid_argument(std::string(who) + ": negative " + what + " " + std::to_string(value));
    sizes.push_back(static_cast<std::size_t>(value));
  }
  return sizes;
}

inline void check_layout(const exchange_layout& layout, int size, std::size_t send_extent, std::size_t recv_extent,
                         std::size_t element_bytes, const char* who) {
  const auto check = [&](const std::vector<std::size_t>& counts, const std::vector<std::size_t>& displs,
                         std::size_t extent, const char* what) {
    if (counts.size() != std::size_t(size) || displs.size() != std::size_t(size))
      throw invalid_argument(std::string(who) + ": " + what + " counts and displacements need one entry per rank (" +
                             std::to_string(size) + "), got " + std::to_string(counts.size()) + " and " +
                             std::to_string(displs.size()));
    for (int peer = 0; peer < size; ++peer) {
      if (displs[peer] > extent || counts[peer] > extent - displs[peer])
        throw invalid_argument(std::string(who) + ": " + what + " block for rank " + std::to_string(peer) + " [" +
                               std::to_string(displs[peer]) + ", +" + std::to_string(counts[peer]) +
                               ") overflows the View of " + std::to_string(extent) + " elements");
      byte_count(counts[peer] * element_bytes, who);  // a message's size fits MPI's int
    }
  };
  check(layout.send_counts, layout.send_displs, send_extent, "send");
  check(layout.recv_counts, layout.recv_displs, recv_extent, "receive");
}

inline exchange_layout uniform_layout(std::size_t send_size, std::size_t recv_size, int ranks, const char* who) {
  const std::size_t p = std::size_t(ranks);
  if (send_size % p != 0)
    throw invalid_argument(std::string(who) + ": the send View's " + std::to_string(send_size) +
                           " elements do not split evenly among " + std::to_string(p) + " ranks");
  if (recv_size != send_size)
    throw invalid_argument(std::string(who) + ": the receive View has " + std::to_string(recv_size) +
                           " elements, the send View " + std::to_string(send_size) + "; they must match");
  const std::size_t count = send_size / p;
  exchange_layout layout;
  for (std::size_t peer = 0; peer < p; ++peer) {
    layout.send_counts.push_back(count);
    layout.send_displs.push_back(peer * count);
  }
  layout.recv_counts = layout.send_counts;
  layout.recv_displs = layout.send_displs;
  return layout;
}

/// The absolute bound of this rank's streams: ABS as given; REL against the value range of the
/// values it sends to other ranks, its blocks to them (the block to itself is copied exactly,
/// so its values play no part: at p ranks the range pass reads (p - 1) / p of the View).
template <class Exec, class T>
double sent_values_bound(const Exec& exec, const T* send, const std::vector<std::size_t>& send_counts,
                         const std::vector<std::size_t>& send_displs, int rank, const compress_options& codec) {
  if (codec.bound.mode == bound_mode::absolute) return codec.bound.value;
  packed_range<T> keys = range_keys(exec, send, 0, false, bits_t<T>(0));  // empty
  for (std::size_t peer = 0; peer < send_counts.size(); ++peer)
    if (int(peer) != rank && send_counts[peer] > 0)
      keys = join_keys(keys, range_keys(exec, send + send_displs[peer], send_counts[peer], codec.fill_value.has_value(),
                                        fill_bits_of<T>(codec)));
  return bound_for(codec, keys);
}

/// Every alltoall(v): fence, check locally, agree, then exchange. `make_layout(ranks)` builds
/// the layout (it may throw; that is a local failure like any other).
template <class Exec, class SendView, class RecvView, class MakeLayout>
std::unique_ptr<operation> start_exchange(const Exec& exec, const SendView& send, const RecvView& recv,
                                          MakeLayout&& make_layout, bool uniform, MPI_Comm comm,
                                          const collective_options& options, comm_workspace* workspace,
                                          bool nonblocking, const char* who) {
  using T = typename SendView::non_const_value_type;
  Kokkos::Profiling::ScopedRegion region(who);
  const comm_shape shape = enter_collective<SendView, RecvView>(exec, comm, who);
  const wire_rule rule{options.mode, options.cost};
  exchange_layout layout;
  workspace_slot* slot = nullptr;
  agreement a;
  a.must_match = uniform ? "the element type, transfer mode, cost model and element count"
                         : "the element type, transfer mode and cost model";
  a.local_failure = run_local_checks([&] {
    validate_options(options.codec, who);
    require_contiguous(send, who, "the send View");
    require_contiguous(recv, who, "the receive View");
    require_disjoint(send, recv, who, "the send and receive Views");
    layout = make_layout(shape.size);
    check_layout(layout, shape.size, send.size(), recv.size(), sizeof(T), who);
    if (workspace) slot = &workspace->slot_for(comm, nonblocking, who);
  });
  fingerprint f = call_fingerprint(uniform ? collective_kind::alltoall : collective_kind::alltoallv, nonblocking, sizeof(T));
  rule.add_to(f);
  if (!a.local_failure) {
    if (uniform) f.add(std::uint64_t(layout.send_counts[0]));
    for (int peer = 0; peer < shape.size; ++peer)
      a.pair_balance += pair_term(shape.rank, peer, layout.send_counts[std::size_t(peer)]) -
                        pair_term(peer, shape.rank, layout.recv_counts[std::size_t(peer)]);
    a.send_counts = &layout.send_counts;
    a.recv_counts = &layout.recv_counts;
  }
  a.fingerprint = f.value();
  agree(a, comm, who);
  if (workspace) workspace->taken(nonblocking);

  block_messages<T> messages{send.data(), recv.data(), std::move(layout), rule, options.codec,
                             options.measure_error, shape.rank, who};
  // A REL bound resolves over the blocks to other ranks whenever any of them may be compressed
  // (automatic mode too: left relative, each chunk would resolve it over its own values).
  bool compresses = false;
  for (int peer = 0; peer < shape.size; ++peer)
    compresses = compresses || (peer != shape.rank && rule.may_compress(messages.raw_bytes_to(peer)));
  if (compresses)
    messages.codec.bound = absolute(sent_values_bound(exec, send.data(), messages.layout.send_counts,
                                                      messages.layout.send_displs, shape.rank, options.codec));
  return std::make_unique<exchange_engine<block_messages<T>, Exec>>(exec, std::move(messages), shape, slot, comm,
                                                                    nonblocking, who);
}

template <class Exec, class SendView, class RecvView>
std::unique_ptr<operation> start_alltoall(const Exec& exec, const SendView& send, const RecvView& recv, MPI_Comm comm,
                                          const collective_options& options, comm_workspace* workspace,
                                          bool nonblocking, const char* who) {
  return start_exchange(
      exec, send, recv, [&](int ranks) { return uniform_layout(send.size(), recv.size(), ranks, who); }, true, comm,
      options, workspace, nonblocking, who);
}

template <class Exec, class SendView, class RecvView, class... Counts>
std::unique_ptr<operation> start_alltoallv(const Exec& exec, const SendView& send, const RecvView& recv,
                                           MPI_Comm comm, const collective_options& options,
                                           comm_workspace* workspace, bool nonblocking, const char* who,
                                           const Counts&... counts) {
  return start_exchange(
      exec, send, recv,
      [&](int) {
        const auto& [sc, sd, rc, rd] = std::tie(counts...);
        return exchange_layout{to_sizes(sc, who, "send count"), to_sizes(sd, who, "send displacement"),
                               to_sizes(rc, who, "receive count"), to_sizes(rd, who, "receive displacement")};
      },
      false, comm, options, workspace, nonblocking, who);
}

}  // namespace detail


/// MPI_Alltoall: block i of `send` (send.size() / p elements) goes to rank i; block j of
/// `recv` comes from rank j. `workspace` (optional, built on `comm`) removes the per-call
/// allocation.
template <execution_space Exec, float_view SendView, float_view RecvView>
collective_report alltoall(const Exec& exec, const SendView& send, const RecvView& recv, MPI_Comm comm,
                           const collective_options& options = {}, comm_workspace* workspace = nullptr) {
  return detail::complete(detail::start_alltoall(exec, send, recv, comm, options, workspace, false, "kompress::alltoall"));
}

/// Nonblocking alltoall; wait() on the request delivers `recv`.
template <execution_space Exec, float_view SendView, float_view RecvView>
request ialltoall(const Exec& exec, const SendView& send, const RecvView& recv, MPI_Comm comm,
                  const collective_options& options = {}, comm_workspace* workspace = nullptr) {
  return request(detail::start_alltoall(exec, send, recv, comm, options, workspace, true, "kompress::ialltoall"));
}

/// MPI_Alltoallv: counts and displacements in elements, one per rank; zero counts allowed.
template <execution_space Exec, float_view SendView, count_range SendCounts, count_range SendDispls,
          float_view RecvView, count_range RecvCounts, count_range RecvDispls>
collective_report alltoallv(const Exec& exec, const SendView& send, const SendCounts& send_counts,
                            const SendDispls& send_displs, const RecvView& recv, const RecvCounts& recv_counts,
                            const RecvDispls& recv_displs, MPI_Comm comm, const collective_options& options = {},
                            comm_workspace* workspace = nullptr) {
  return detail::complete(detail::start_alltoallv(exec, send, recv, comm, options, workspace, false, "kompress::alltoallv",
                                    send_counts, send_displs, recv_counts, recv_displs));
}

/// Nonblocking alltoallv; wait() on the request delivers `recv`.
template <execution_space Exec, float_view SendView, count_range SendCounts, count_range SendDispls,
          float_view RecvView, count_range RecvCounts, count_range RecvDispls>
request ialltoallv(const Exec& exec, const SendView& send, const SendCounts& send_counts,
                   const SendDispls& send_displs, const RecvView& recv, const RecvCounts& recv_counts,
                   const RecvDispls& recv_displs, MPI_Comm comm, const collective_options& options = {},
                   comm_workspace* workspace = nullptr) {
  return request(detail::start_alltoallv(exec, send, recv, comm, options, workspace, true, "kompress::ialltoallv",
                                         send_counts, send_displs, recv_counts, recv_displs));
}

}  // namespace v0
}  // namespace kompress
