#pragma once
// kompress::alltoall and alltoallv: MPI_Alltoall(v) on Views, compressed on the wire.
// Every value arrives within the sender's absolute bound (a REL bound resolves against the
// value range of what the sender compresses: its blocks to the other ranks, not its block to
// itself); a rank's block to itself is copied exactly.
//
// Sync points: every call first fences `exec` (the send View may be the output of work on
// it), then agrees on the arguments with one small MPI_Allreduce (blocking, nonblocking forms
// too; on two to four ranks one message between every pair, which carries a small raw call's
// blocks and then is the whole call), then compresses every outgoing block before it returns
// (each compression waits for `exec`). The blocking forms also wait for every message,
// decompress and fence `exec` before returning. The nonblocking forms return a
// kompress::request whose wait() receives, decompresses and fences `exec`. Views may be in
// any memory `exec` reaches (device Views: the codec runs on the device, and the bytes reach
// MPI through the transport seam, docs/collectives.md) and must stay alive until the request
// completes (the request holds references to them). Bad arguments on any rank throw
// invalid_argument on every rank before any data moves.

#include <kompress/comm/detail/engine.hpp>
#include <kompress/comm/detail/mpi_collective.hpp>
#include <kompress/comm/detail/small_calls.hpp>
#include <kompress/comm/persistent.hpp>
#include <kompress/detail/arguments.hpp>

#include <climits>
#include <concepts>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <ranges>
#include <tuple>
#include <utility>

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
    // std::cmp_less: no comparison of an unsigned count with zero for compilers to flag.
    if (std::cmp_less(value, 0))
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

/// MPI_Alltoallv takes int displacements (in elements); counts fit already (byte_count).
inline void require_int_displacements(const exchange_layout& layout, const char* who) {
  for (const auto* displs : {&layout.send_displs, &layout.recv_displs})
    for (const std::size_t d : *displs)
      if (d > std::size_t(INT_MAX))
        throw invalid_argument(std::string(who) + ": a displacement of " + std::to_string(d) +
                               " elements exceeds MPI's int count");
}

/// What an alltoall(v)'s agreement settled: the communicator's shape, the wire rule, the
/// layout (checked on every rank), the workspace slot (nullptr without a workspace) and whether
/// the data moved with the agreement (two to four ranks, raw and small: the peers' blocks are in
/// place).
struct agreed_exchange {
  comm_shape shape;
  wire_rule rule;
  exchange_layout layout;
  workspace_slot* slot = nullptr;
  bool carried = false;
  transport how{};  ///< how the bytes reach MPI (agreed: every rank staged or none)
};

/// Whether no message of the exchange may be compressed and MPI reads the Views: then it is MPI's
/// own collective (staged Views always take the engine).
/// The rule is asked once per block size (blocks mostly share one; automatic mode's answer
/// weighs the whole exchange, so it is not free at hundreds of peers).
inline bool exchange_sends_raw(const agreed_exchange& agreed, std::size_t element_bytes) {
  if (agreed.how.staged) return false;
  std::optional<std::size_t> last_size;  // the last block size asked, whose answer was raw
  const auto sends_raw = [&](std::size_t count) {
    if (count == last_size) return true;
    if (agreed.rule.may_compress(count * element_bytes)) return false;
    last_size = count;
    return true;
  };
  for (int peer = 0; peer < agreed.shape.size; ++peer)
    if (!sends_raw(agreed.layout.send_counts[std::size_t(peer)]) ||
        !sends_raw(agreed.layout.recv_counts[std::size_t(peer)]))
      return false;
  return true;
}

/// The prologue of every alltoall(v): fence, check locally, agree. `make_layout(ranks)` builds
/// the layout (it may throw; that is a local failure like any other). A persistent call agrees
/// on that too (a rank in alltoall_init never meets one in ialltoall).
template <class Exec, class SendView, class RecvView, class MakeLayout>
agreed_exchange agree_exchange(const Exec& exec, const SendView& send, const RecvView& recv, MakeLayout&& make_layout,
                               bool uniform, MPI_Comm comm, const collective_options& options,
                               comm_workspace* workspace, bool nonblocking, bool persistent, const char* who,
                               small_call<typename SendView::non_const_value_type>& data) {
  using T = typename SendView::non_const_value_type;
  const comm_shape shape = enter_collective<SendView, RecvView>(exec, comm, who);
  const transport how =
      transport_for<Exec, typename SendView::memory_space, typename RecvView::memory_space>(options.transport);
  agreed_exchange agreed{shape, wire_rule::for_call(options, how), {}, nullptr, false, how};
  agreed.rule.exchange_peers = std::uint64_t(std::max(shape.size - 1, 0));
  exchange_layout& layout = agreed.layout;
  agreement a;
  a.must_match = uniform ? "the element type, transfer mode, cost model, element count and whether the Views "
                           "are staged for MPI"
                         : "the element type, transfer mode, cost model and whether the Views are staged for MPI";
  a.local_failure = run_local_checks([&] {
    validate_options(options.codec, who);
    require_contiguous(send, who, "the send View");
    require_contiguous(recv, who, "the receive View");
    require_disjoint(send, recv, who, "the send and receive Views");
    layout = make_layout(shape.size);
    check_layout(layout, shape.size, send.size(), recv.size(), sizeof(T), who);
    if (persistent && !uniform) require_int_displacements(layout, who);  // MPI_Alltoallv_init's
    if (workspace) agreed.slot = &workspace->slot_for(comm, nonblocking, who);
  });
  fingerprint f = call_fingerprint(uniform ? collective_kind::alltoall : collective_kind::alltoallv, nonblocking, sizeof(T));
  if (persistent) f.add(persistent_call_mark);
  agreed.rule.add_to(f);
  // A staged rank takes the engine where others may take MPI's own collective.
  f.add(std::uint64_t(agreed.how.staged));
  if (!a.local_failure) {
    if (uniform) f.add(std::uint64_t(layout.send_counts[0]));
    for (int peer = 0; peer < shape.size; ++peer)
      a.pair_balance += pair_term(shape.rank, peer, layout.send_counts[std::size_t(peer)]) -
                        pair_term(peer, shape.rank, layout.recv_counts[std::size_t(peer)]);
    a.send_counts = &layout.send_counts;
    a.recv_counts = &layout.recv_counts;
    if (!persistent)
      data = exchange_small_call(send.data(), recv.data(), layout, uniform, shape, agreed.how,
                                 exchange_sends_raw(agreed, sizeof(T)));
  }
  a.fingerprint = f.value();
  agreed.carried = agree(a, data, comm, who);
  if (workspace) workspace->taken(nonblocking);
  return agreed;
}

/// The exchange itself, once agreed: kompress's engine (receives posted, messages encoded and
/// sent); a REL bound resolves against the values sent to other ranks before the first block
/// is compressed (block_messages::prepare).
template <class Exec, class SendView, class RecvView>
std::unique_ptr<operation> launch_exchange(const Exec& exec, const SendView& send, const RecvView& recv,
                                           const agreed_exchange& agreed, workspace_slot* slot,
                                           const collective_options& options, MPI_Comm comm, bool nonblocking,
                                           const char* who) {
  using T = typename SendView::non_const_value_type;
  using messages_type = block_messages<T, typename Exec::memory_space>;
  messages_type messages = messages_type::planned(send.data(), recv.data(), agreed.layout, agreed.rule, options.codec,
                                                  options.measure_error, agreed.shape.rank, who);
  return std::make_unique<exchange_engine<messages_type, Exec>>(exec, std::move(messages), agreed.shape, slot, comm,
                                                                nonblocking, agreed.how,
                                                                options.exchange_window, who);
}

/// The report of an exchange sent raw by MPI's own collective.
inline collective_report raw_exchange_report(const agreed_exchange& agreed, std::size_t element_bytes,
                                             const collective_options& options) {
  collective_report report;
  for (int peer = 0; peer < agreed.shape.size; ++peer) {
    const std::size_t bytes = agreed.layout.send_counts[std::size_t(peer)] * element_bytes;
    if (peer == agreed.shape.rank || bytes == 0) continue;
    report.payload_bytes += bytes;
    report.wire_bytes += bytes;
    ++report.messages;
    ++report.chunks;
  }
  if (options.measure_error) report.max_error = 0.0;
  return report;
}

/// Every alltoall(v): fence, check locally, agree, then the exchange: the blocks already moved
/// with the agreement, MPI_Alltoall where nothing may be compressed (and
/// raw_exchange_takes_engine says no), else kompress's engine (alltoallv always).
template <class Exec, class SendView, class RecvView, class MakeLayout>
std::unique_ptr<operation> start_exchange(const Exec& exec, const SendView& send, const RecvView& recv,
                                          MakeLayout&& make_layout, bool uniform, MPI_Comm comm,
                                          const collective_options& options, comm_workspace* workspace,
                                          bool nonblocking, const char* who) {
  using T = typename SendView::non_const_value_type;
  Kokkos::Profiling::ScopedRegion region(who);
  small_call<T> data;
  const agreed_exchange agreed = agree_exchange(exec, send, recv, std::forward<MakeLayout>(make_layout), uniform, comm,
                                                options, workspace, nonblocking, false, who, data);
  if (agreed.carried) return completed_call(send, recv, raw_exchange_report(agreed, sizeof(T), options), who);
  if (!uniform || !exchange_sends_raw(agreed, sizeof(T)) || agreed.shape.size == 1 ||
      raw_exchange_takes_engine(agreed.shape))
    return launch_exchange(exec, send, recv, agreed, agreed.slot, options, comm, nonblocking, who);
  return start_mpi_collective(mpi_alltoall<T>{send.data(), recv.data(), int(agreed.layout.send_counts[0]), comm},
                              send, recv, nonblocking, raw_exchange_report(agreed, sizeof(T), options), who);
}

template <class Exec, class SendView, class RecvView>
std::unique_ptr<operation> start_alltoall(const Exec& exec, const SendView& send, const RecvView& recv, MPI_Comm comm,
                                          const collective_options& options, comm_workspace* workspace,
                                          bool nonblocking, const char* who) {
  return start_exchange(
      exec, send, recv, [&](int ranks) { return uniform_layout(send.size(), recv.size(), ranks, who); }, true, comm,
      options, workspace, nonblocking, who);
}

/// The rounds of an alltoall(v) that sends every block raw: MPI's own persistent alltoall(v).
template <class Exec, class SendView, class RecvView>
std::unique_ptr<persistent_operation> mpi_exchange(const Exec& exec, const SendView& send, const RecvView& recv,
                                                   const agreed_exchange& agreed, bool uniform, MPI_Comm comm,
                                                   const collective_options& options, const char* who) {
  using T = typename SendView::non_const_value_type;
  const collective_report report = raw_exchange_report(agreed, sizeof(T), options);
  if (uniform) {
    const mpi_alltoall<T> call{send.data(), recv.data(), int(agreed.layout.send_counts[0]), comm};
    return std::make_unique<persistent_mpi_collective<Exec, SendView, RecvView, mpi_alltoall<T>>>(exec, send, recv,
                                                                                                  call, report, who);
  }
  // The checks passed: every count and displacement fits MPI's int.
  const auto ints = [](const std::vector<std::size_t>& values) {
    return std::vector<int>(values.begin(), values.end());
  };
  const exchange_layout& l = agreed.layout;
  const mpi_alltoallv<T> call{send.data(), recv.data(),
                              std::make_shared<const mpi_layout>(mpi_layout{ints(l.send_counts), ints(l.send_displs),
                                                                            ints(l.recv_counts), ints(l.recv_displs)}),
                              comm};
  return std::make_unique<persistent_mpi_collective<Exec, SendView, RecvView, mpi_alltoallv<T>>>(exec, send, recv,
                                                                                                 call, report, who);
}

/// alltoall_init and alltoallv_init: agreed once; when no message may be compressed (and
/// raw_exchange_takes_engine says no), rounds are MPI's own persistent alltoall(v), else
/// kompress's engine on the request's own scratch and communicator. Automatic mode times the
/// two where times_automatic_choice and worth_timing say and keeps the faster (faster_of).
template <class Exec, class SendView, class RecvView, class MakeLayout>
std::unique_ptr<persistent_operation> init_exchange(const Exec& exec, const SendView& send, const RecvView& recv,
                                                    MakeLayout&& make_layout, bool uniform, MPI_Comm comm,
                                                    const collective_options& options, const char* who) {
  using T = typename SendView::non_const_value_type;
  Kokkos::Profiling::ScopedRegion region(who);
  small_call<T> unused;
  const agreed_exchange agreed = agree_exchange(exec, send, recv, std::forward<MakeLayout>(make_layout), uniform, comm,
                                                options, nullptr, true, true, who, unused);
  const auto engine = [&](const agreed_exchange& on) -> std::unique_ptr<persistent_operation> {
    return std::make_unique<persistent_engine_collective<Exec>>(
        exec, comm,
        [=](workspace_slot& slot) {
          return launch_exchange(exec, send, recv, on, &slot, options, slot.comm, true, who);
        },
        who);
  };
  if (raw_exchange_takes_engine(agreed.shape)) return engine(agreed);
  const bool model_says_raw = exchange_sends_raw(agreed, sizeof(T));
  if (times_automatic_choice(options, agreed.how, agreed.shape)) {
    // alltoallv's send buffers differ: the largest of any rank decides, alike everywhere.
    std::uint64_t largest = send.size() * sizeof(T);
    check_mpi(MPI_Allreduce(MPI_IN_PLACE, &largest, 1, MPI_UINT64_T, MPI_MAX, comm), who, "MPI_Allreduce");
    if (worth_timing(options, largest)) {
      agreed_exchange compressed = agreed;  // as init_ring_collective's
      if (model_says_raw) compressed.rule.mode = transfer_mode::compressed;
      return faster_of(mpi_exchange(exec, send, recv, agreed, uniform, comm, options, who), engine(compressed),
                       comm, who);
    }
  }
  if (!model_says_raw) return engine(agreed);
  return mpi_exchange(exec, send, recv, agreed, uniform, comm, options, who);
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

/// Persistent alltoall (MPI_Alltoall_init): checks and agrees once (collective; bad arguments
/// on any rank an invalid_argument on every rank), then every start() exchanges what `send`
/// holds; see kompress::persistent_request.
template <execution_space Exec, float_view SendView, float_view RecvView>
persistent_request alltoall_init(const Exec& exec, const SendView& send, const RecvView& recv, MPI_Comm comm,
                                 const collective_options& options = {}) {
  constexpr const char* who = "kompress::alltoall_init";
  return persistent_request(detail::init_exchange(
      exec, send, recv, [&](int ranks) { return detail::uniform_layout(send.size(), recv.size(), ranks, who); }, true,
      comm, options, who));
}

/// Persistent alltoallv (MPI_Alltoallv_init): the counts and displacements are read once, at
/// init; see kompress::persistent_request.
template <execution_space Exec, float_view SendView, count_range SendCounts, count_range SendDispls,
          float_view RecvView, count_range RecvCounts, count_range RecvDispls>
persistent_request alltoallv_init(const Exec& exec, const SendView& send, const SendCounts& send_counts,
                                  const SendDispls& send_displs, const RecvView& recv, const RecvCounts& recv_counts,
                                  const RecvDispls& recv_displs, MPI_Comm comm,
                                  const collective_options& options = {}) {
  constexpr const char* who = "kompress::alltoallv_init";
  return persistent_request(detail::init_exchange(
      exec, send, recv,
      [&](int) {
        return detail::exchange_layout{detail::to_sizes(send_counts, who, "send count"),
                                       detail::to_sizes(send_displs, who, "send displacement"),
                                       detail::to_sizes(recv_counts, who, "receive count"),
                                       detail::to_sizes(recv_displs, who, "receive displacement")};
      },
      false, comm, options, who));
}

}  // namespace v0
}  // namespace kompress
