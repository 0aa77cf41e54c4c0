#pragma once
// kompress::dlrm::embedding_exchange: the model-parallel to data-parallel all-to-all of
// DLRM-style training, compressed within a bound per table. Built once per model; forward and
// backward every iteration. docs/dlrm.md describes the layouts and how this maps onto an
// alltoallv.
//
// Layouts (row-major, contiguous; rank-2 [rows x width] or rank-3 [rows x tables x dim]):
//   forward  in : [global batch x local width]   this rank's tables, pooled, whole batch
//            out: [local batch x total width]    every table, this rank's slice of the batch
//   backward in : [local batch x total width]    gradients of the pooled embeddings
//            out: [global batch x local width]   for this rank's tables, whole batch
// A table's columns sit in table order: in the total width all tables, in the local width
// this rank's tables. The global batch is ranks x local batch, in rank order.
//
// Sync points: construction is collective (one small MPI_Allreduce agreeing on the model, and
// two MPI_Comm_dup for the workspace it owns). forward/backward and iforward/ibackward fence
// `exec` on entry (the input may be the output of work on it), agree on the arguments with
// one small MPI_Allreduce (on two ranks one message each way), pack and compress every outgoing message before returning (each
// waits for `exec`); the blocking forms, and wait() of the nonblocking ones, return with the
// output in place and `exec` fenced. The exchange owns a workspace: after the first call of a
// shape, no call allocates or duplicates a communicator. The exchange must outlive its requests.

#include <kompress/comm/detail/small_calls.hpp>
#include <kompress/comm/options.hpp>
#include <kompress/comm/workspace.hpp>
#include <kompress/detail/arguments.hpp>
#include <kompress/dlrm/segments.hpp>

#include <cmath>
#include <functional>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

namespace kompress::inline v0::dlrm {

/// One embedding table: the rank that owns it and its embedding dimension.
struct table {
  int owner = 0;
  std::size_t dim = 0;
};

enum class direction { forward, backward };

struct exchange_options {
  /// The codec per direction: the bound per table (REL over the table's values sent), block
  /// size, fill value.
  compress_options forward{.bound = relative(1e-2), .block_size = 32};
  compress_options backward{.bound = relative(1e-2), .block_size = 32};
  bool compress_forward = true;
  bool compress_backward = true;
  /// Per-table multipliers of the bound (empty: all 1): the SC'24 table-wise adaptive bound.
  std::vector<double> table_weights = {};
  /// Multiplier of the bound per iteration, table and direction (empty: 1): an iteration-wise
  /// schedule, e.g. looser early in training.
  std::function<double(std::uint64_t iteration, int table, direction)> bound_schedule = {};
  /// How the bytes reach MPI (kompress::transport_mode; device Views: staged through host
  /// memory unless the MPI moves device memory).
  transport_mode transport = transport_mode::automatic;
  /// How many peers' messages a rank expects at once (collective_options::exchange_window; 0:
  /// every peer's).
  std::size_t window = 0;
};

class embedding_exchange {
 public:
  embedding_exchange(MPI_Comm comm, std::vector<table> tables, std::size_t local_batch, exchange_options options = {})
      : comm_(comm), tables_(std::move(tables)), local_batch_(local_batch), options_(std::move(options)) {
    constexpr const char* who = "kompress::dlrm::embedding_exchange";
    shape_ = kompress::detail::shape_of(comm, who);
    kompress::detail::agreement a;
    a.must_match = "the model (local batch, table owners and dimensions) and which directions compress";
    a.local_failure = kompress::detail::run_local_checks([&] { describe_model(who); });
    // Every rank must describe the same model.
    kompress::detail::fingerprint f;
    f.add(std::uint64_t(local_batch_)).add(std::uint64_t(options_.compress_forward)).add(
        std::uint64_t(options_.compress_backward));
    for (const table& tab : tables_) f.add(std::uint64_t(tab.owner)).add(std::uint64_t(tab.dim));
    a.fingerprint = f.value();
    kompress::detail::agree(a, comm, who);
    workspace_ = std::make_unique<comm_workspace>(comm, 2);
  }

  std::size_t local_batch() const { return local_batch_; }
  std::size_t global_batch() const { return local_batch_ * std::size_t(shape_.size); }
  /// Columns of this rank's tables.
  std::size_t local_width() const { return local_width_[std::size_t(shape_.rank)]; }
  std::size_t total_width() const { return total_width_; }
  const std::vector<table>& tables() const { return tables_; }
  /// Iterations so far: forward() and iforward() count one each.
  std::uint64_t iteration() const { return iteration_; }
  /// Staging bytes the exchange holds for reuse.
  std::size_t workspace_bytes() const { return workspace_->staging_bytes(); }

  /// Pooled embeddings of this rank's tables for the global batch -> every table for this
  /// rank's slice of the batch. Blocking.
  template <execution_space Exec, float_view InView, float_view OutView>
  collective_report forward(const Exec& exec, const InView& pooled_local, const OutView& pooled_out) {
    return kompress::detail::complete(start(exec, pooled_local, pooled_out, direction::forward, false));
  }

  /// Nonblocking forward (MPI-nonblocking: the `i` prefix), to overlap with the dense part;
  /// the Views must stay alive until the request completes.
  template <execution_space Exec, float_view InView, float_view OutView>
  request iforward(const Exec& exec, const InView& pooled_local, const OutView& pooled_out) {
    return request(start(exec, pooled_local, pooled_out, direction::forward, true));
  }

  /// Gradients of the pooled embeddings (this rank's batch slice, every table) -> gradients
  /// for this rank's tables, whole batch. Blocking.
  template <execution_space Exec, float_view InView, float_view OutView>
  collective_report backward(const Exec& exec, const InView& grad_in, const OutView& grad_out) {
    return kompress::detail::complete(start(exec, grad_in, grad_out, direction::backward, false));
  }

  /// Nonblocking backward.
  template <execution_space Exec, float_view InView, float_view OutView>
  request ibackward(const Exec& exec, const InView& grad_in, const OutView& grad_out) {
    return request(start(exec, grad_in, grad_out, direction::backward, true));
  }

 private:
  void describe_model(const char* who) {
    if (tables_.empty()) throw invalid_argument(std::string(who) + ": no tables");
    if (local_batch_ == 0) throw invalid_argument(std::string(who) + ": the local batch is 0");
    if (!options_.table_weights.empty() && options_.table_weights.size() != tables_.size())
      throw invalid_argument(std::string(who) + ": " + std::to_string(options_.table_weights.size()) +
                             " table weights for " + std::to_string(tables_.size()) + " tables");
    for (std::size_t t = 0; t < options_.table_weights.size(); ++t)
      check_multiplier(options_.table_weights[t], "the weight of table", int(t), who);
    kompress::detail::validate_options(options_.forward, who);
    kompress::detail::validate_options(options_.backward, who);
    global_column_.resize(tables_.size());
    local_column_.resize(tables_.size());
    local_width_.assign(std::size_t(shape_.size), 0);
    for (std::size_t t = 0; t < tables_.size(); ++t) {
      const table& tab = tables_[t];
      if (tab.owner < 0 || tab.owner >= shape_.size)
        throw invalid_argument(std::string(who) + ": table " + std::to_string(t) + " is owned by rank " +
                               std::to_string(tab.owner) + ", outside the communicator of " +
                               std::to_string(shape_.size) + " ranks");
      if (tab.dim == 0) throw invalid_argument(std::string(who) + ": table " + std::to_string(t) + " has dimension 0");
      global_column_[t] = total_width_;
      total_width_ += tab.dim;
      local_column_[t] = local_width_[std::size_t(tab.owner)];
      local_width_[std::size_t(tab.owner)] += tab.dim;
    }
  }

  template <class In, class Out>
  void check_views(const In& in, const Out& out, std::size_t in_rows, std::size_t in_width, std::size_t out_rows,
                   std::size_t out_width, const char* who) const {
    static_assert(In::rank == 1 || std::is_same_v<typename In::array_layout, Kokkos::LayoutRight>,
                  "kompress::dlrm::embedding_exchange: input must be row-major (LayoutRight)");
    static_assert(Out::rank == 1 || std::is_same_v<typename Out::array_layout, Kokkos::LayoutRight>,
                  "kompress::dlrm::embedding_exchange: output must be row-major (LayoutRight)");
    kompress::detail::require_contiguous(in, who, "the input View");
    kompress::detail::require_contiguous(out, who, "the output View");
    const auto expect = [&](const auto& view, std::size_t rows, std::size_t width, const char* what) {
      using V = std::remove_cvref_t<decltype(view)>;
      if (view.size() != rows * width || (V::rank >= 2 && view.extent(0) != rows))
        throw invalid_argument(std::string(who) + ": " + what + " must be [" + std::to_string(rows) + " x " +
                               std::to_string(width) + "] (batch x width), got " + std::to_string(view.extent(0)) +
                               " rows and " + std::to_string(view.size()) + " values");
    };
    expect(in, in_rows, in_width, "the input");
    expect(out, out_rows, out_width, "the output");
    using T = typename In::non_const_value_type;
    kompress::detail::require_disjoint(in, out, who, "the input and output Views");
    kompress::detail::byte_count(local_batch_ * total_width_ * sizeof(T), who);  // any message fits MPI's int
  }

  /// A table weight or bound_schedule value multiplies a bound: like the bound itself it must
  /// be finite and >= 0 (0: that table lossless), never silently lossless.
  static void check_multiplier(double value, const char* what, int t, const char* who) {
    if (!std::isfinite(value) || value < 0.0)
      throw invalid_argument(std::string(who) + ": " + what + " " + std::to_string(t) +
                             " must be finite and >= 0 (got " + kompress::detail::number_text(value) + ")");
  }

  /// Table t's absolute bound this call. Raises invalid_argument (a local check of the call)
  /// for a bad bound_schedule value.
  double table_bound(int t, direction dir, const error_bound& bound, const kompress::detail::value_range& range,
                     std::uint64_t iteration, const char* who) const {
    double e = kompress::detail::resolve_bound(bound, range.min, range.max);
    if (!options_.table_weights.empty()) e *= options_.table_weights[std::size_t(t)];
    if (options_.bound_schedule) {
      const double scheduled = options_.bound_schedule(iteration, t, dir);
      check_multiplier(scheduled, "bound_schedule's value for table", t, who);
      e *= scheduled;
    }
    // Every factor is finite and >= 0: only a product beyond the largest double is left, which
    // saturates as a REL bound over an infinite range does.
    return std::isfinite(e) ? e : std::numeric_limits<double>::max();
  }

  /// The segments of one call: per peer, what goes and where what comes lands.
  template <class Exec, class T>
  std::vector<kompress::detail::peer_segments<T>> segments(const Exec& exec, T* in_data, T* out_data, direction dir,
                                                           std::uint64_t iteration, const char* who) const {
    const int p = shape_.size, me = shape_.rank;
    const std::size_t mine = local_width(), bl = local_batch_;
    std::vector<kompress::detail::peer_segments<T>> peers(static_cast<std::size_t>(p));
    const bool fwd = dir == direction::forward;
    const compress_options& codec = fwd ? options_.forward : options_.backward;
    const bool compress = fwd ? options_.compress_forward : options_.compress_backward;
    for (std::size_t t = 0; t < tables_.size(); ++t) {
      const table& tab = tables_[t];
      if (fwd) {
        if (tab.owner == me) {
          // Send: rows of each peer's batch slice, this table's columns.
          const kompress::detail::value_range range =
              compress && codec.bound.mode == bound_mode::relative
                  ? kompress::detail::strided_range(exec, in_data + local_column_[t], mine, global_batch(), tab.dim)
                  : kompress::detail::value_range{};
          const double e = table_bound(int(t), dir, codec.bound, range, iteration, who);
          for (int peer = 0; peer < p; ++peer)
            peers[std::size_t(peer)].send.push_back(
                {in_data + std::size_t(peer) * bl * mine + local_column_[t], mine, bl, tab.dim, e});
        }
        // Receive: from the owner, this table's columns of the local slice.
        peers[std::size_t(tab.owner)].receive.push_back({out_data + global_column_[t], total_width_, bl, tab.dim, 0.0});
      } else {
        // Send: this rank's slice of the gradient for table t, to its owner.
        const kompress::detail::value_range range =
            compress && codec.bound.mode == bound_mode::relative
                ? kompress::detail::strided_range(exec, in_data + global_column_[t], total_width_, bl, tab.dim)
                : kompress::detail::value_range{};
        const double e = table_bound(int(t), dir, codec.bound, range, iteration, who);
        peers[std::size_t(tab.owner)].send.push_back({in_data + global_column_[t], total_width_, bl, tab.dim, e});
        if (tab.owner == me)
          for (int peer = 0; peer < p; ++peer)
            peers[std::size_t(peer)].receive.push_back(
                {out_data + std::size_t(peer) * bl * mine + local_column_[t], mine, bl, tab.dim, 0.0});
      }
    }
    return peers;
  }

  /// Every call: fence, check locally (the user's bound schedule included), agree, exchange.
  template <class Exec, class In, class Out>
  std::unique_ptr<kompress::detail::operation> start(const Exec& exec, const In& in, const Out& out, direction dir,
                                                     bool nonblocking) {
    using T = typename In::non_const_value_type;
    const bool fwd = dir == direction::forward;
    const char* const who = fwd ? (nonblocking ? "kompress::dlrm::embedding_exchange::iforward"
                                               : "kompress::dlrm::embedding_exchange::forward")
                                : (nonblocking ? "kompress::dlrm::embedding_exchange::ibackward"
                                               : "kompress::dlrm::embedding_exchange::backward");
    Kokkos::Profiling::ScopedRegion region(who);
    kompress::detail::enter_collective<In, Out>(exec, comm_, who);
    // The backward pass belongs to the iteration whose forward came last.
    const std::uint64_t iteration = fwd ? iteration_ : (iteration_ > 0 ? iteration_ - 1 : 0);
    std::vector<kompress::detail::peer_segments<T>> peers;
    kompress::detail::workspace_slot* slot = nullptr;
    kompress::detail::agreement a;
    a.must_match = "the direction, element type and iteration";
    a.local_failure = kompress::detail::run_local_checks([&] {
      if (fwd) check_views(in, out, global_batch(), local_width(), local_batch_, total_width_, who);
      else check_views(in, out, local_batch_, total_width_, global_batch(), local_width(), who);
      slot = &workspace_->slot_for(comm_, nonblocking, who);
      peers = segments(exec, const_cast<T*>(in.data()), out.data(), dir, iteration, who);
    });
    kompress::detail::fingerprint f = kompress::detail::call_fingerprint(
        fwd ? kompress::detail::collective_kind::dlrm_forward : kompress::detail::collective_kind::dlrm_backward,
        nonblocking, sizeof(T));
    f.add(iteration_);
    a.fingerprint = f.value();
    kompress::detail::agree(a, comm_, who);
    workspace_->taken(nonblocking);
    if (fwd) ++iteration_;
    const bool compress = fwd ? options_.compress_forward : options_.compress_backward;
    using messages_type = kompress::detail::segment_messages<T, typename Exec::memory_space>;
    messages_type messages{std::move(peers), {compress ? transfer_mode::compressed : transfer_mode::raw, {}},
                           fwd ? options_.forward : options_.backward, shape_.rank, who};
    const auto how = kompress::detail::transport_for<Exec, typename In::memory_space, typename Out::memory_space>(
        options_.transport);
    return std::make_unique<kompress::detail::exchange_engine<messages_type, Exec>>(
        exec, std::move(messages), shape_, slot, comm_, nonblocking, how,
        options_.window, who);
  }

  MPI_Comm comm_;
  kompress::detail::comm_shape shape_;
  std::vector<table> tables_;
  std::size_t local_batch_;
  exchange_options options_;
  std::vector<std::size_t> global_column_, local_column_, local_width_;
  std::size_t total_width_ = 0;
  std::uint64_t iteration_ = 0;
  std::unique_ptr<comm_workspace> workspace_;
};

}  // namespace kompress::inline v0::dlrm
