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

#include <kompress/comm/options.hpp>
#include <kompress/dlrm/segments.hpp>

#include <functional>
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
  error_bound forward_bound = relative(1e-2);   ///< per table; REL over the table's values sent
  error_bound backward_bound = relative(1e-2);
  bool compress_forward = true;
  bool compress_backward = true;
  /// Per-table multipliers of the bound (empty: all 1): the SC'24 table-wise adaptive bound.
  std::vector<double> table_weights = {};
  /// Multiplier of the bound per iteration, table and direction (empty: 1): an iteration-wise
  /// schedule, e.g. looser early in training.
  std::function<double(std::uint64_t iteration, int table, direction)> bound_schedule = {};
  int block_size = 32;
};

class embedding_exchange {
 public:
  embedding_exchange(MPI_Comm comm, std::vector<table> tables, std::size_t local_batch, exchange_options options = {})
      : comm_(comm), tables_(std::move(tables)), local_batch_(local_batch), options_(std::move(options)) {
    constexpr const char* who = "kompress::dlrm::embedding_exchange";
    shape_ = kompress::detail::shape_of(comm, who);
    if (tables_.empty()) throw invalid_argument(std::string(who) + ": no tables");
    if (local_batch_ == 0) throw invalid_argument(std::string(who) + ": the local batch is 0");
    if (!options_.table_weights.empty() && options_.table_weights.size() != tables_.size())
      throw invalid_argument(std::string(who) + ": " + std::to_string(options_.table_weights.size()) +
                             " table weights for " + std::to_string(tables_.size()) + " tables");
    kompress::detail::validate_bound(options_.forward_bound, who);
    kompress::detail::validate_bound(options_.backward_bound, who);
    kompress::detail::validate_block_size(options_.block_size, who);
    global_column_.resize(tables_.size());
    local_column_.resize(tables_.size());
    local_width_.assign(shape_.size, 0);
    for (std::size_t t = 0; t < tables_.size(); ++t) {
      const table& tab = tables_[t];
      if (tab.owner < 0 || tab.owner >= shape_.size)
        throw invalid_argument(std::string(who) + ": table " + std::to_string(t) + " is owned by rank " +
                               std::to_string(tab.owner) + ", outside the communicator of " +
                               std::to_string(shape_.size) + " ranks");
      if (tab.dim == 0) throw invalid_argument(std::string(who) + ": table " + std::to_string(t) + " has dimension 0");
      global_column_[t] = total_width_;
      total_width_ += tab.dim;
      local_column_[t] = local_width_[tab.owner];
      local_width_[tab.owner] += tab.dim;
    }
    // Every rank must describe the same model: compare a fingerprint of the geometry.
    std::uint64_t fingerprint = local_batch_ * 0x9E3779B97F4A7C15ull;
    for (const table& tab : tables_)
      fingerprint = (fingerprint ^ (std::uint64_t(tab.owner) << 32 ^ tab.dim)) * 0xC2B2AE3D27D4EB4Full;
    unsigned long long extremes[2] = {fingerprint, ~fingerprint};
    kompress::detail::check_mpi(MPI_Allreduce(MPI_IN_PLACE, extremes, 2, MPI_UNSIGNED_LONG_LONG, MPI_MAX, comm),
                                who, "MPI_Allreduce");
    if (extremes[0] != ~extremes[1])
      throw invalid_argument(std::string(who) +
                             ": ranks describe different models (local batch, table owners or dimensions "
                             "differ); every rank must pass the same ones");
  }

  std::size_t local_batch() const { return local_batch_; }
  std::size_t global_batch() const { return local_batch_ * std::size_t(shape_.size); }
  /// Columns of this rank's tables.
  std::size_t local_width() const { return local_width_[shape_.rank]; }
  std::size_t total_width() const { return total_width_; }
  const std::vector<table>& tables() const { return tables_; }
  /// Iterations so far: forward() and forward_async() count one each.
  std::uint64_t iteration() const { return iteration_; }

  /// Pooled embeddings of this rank's tables for the global batch -> every table for this
  /// rank's slice of the batch. Blocking.
  template <execution_space Exec, float_view InView, float_view OutView>
  collective_report forward(const Exec& exec, const InView& pooled_local, const OutView& pooled_out) {
    auto op = make_forward(exec, pooled_local, pooled_out, false);
    op->progress(true);
    return op->report();
  }

  /// Nonblocking forward, to overlap with the dense part; the Views must stay alive until
  /// the request completes.
  template <execution_space Exec, float_view InView, float_view OutView>
  request forward_async(const Exec& exec, const InView& pooled_local, const OutView& pooled_out) {
    return request(make_forward(exec, pooled_local, pooled_out, true));
  }

  /// Gradients of the pooled embeddings (this rank's batch slice, every table) -> gradients
  /// for this rank's tables, whole batch. Blocking.
  template <execution_space Exec, float_view InView, float_view OutView>
  collective_report backward(const Exec& exec, const InView& grad_in, const OutView& grad_out) {
    auto op = make_backward(exec, grad_in, grad_out, false);
    op->progress(true);
    return op->report();
  }

  template <execution_space Exec, float_view InView, float_view OutView>
  request backward_async(const Exec& exec, const InView& grad_in, const OutView& grad_out) {
    return request(make_backward(exec, grad_in, grad_out, true));
  }

 private:
  template <class In, class Out>
  void check_views(const In& in, const Out& out, std::size_t in_rows, std::size_t in_width, std::size_t out_rows,
                   std::size_t out_width, const char* who) const {
    static_assert(std::is_same_v<typename In::non_const_value_type, typename Out::non_const_value_type>,
                  "kompress::dlrm::embedding_exchange: input and output must hold the same element type");
    static_assert(!std::is_const_v<typename Out::value_type>, "kompress::dlrm::embedding_exchange: the output must not be const");
    static_assert(Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename In::memory_space>::accessible &&
                      Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename Out::memory_space>::accessible,
                  "kompress::dlrm::embedding_exchange: Views must be host-accessible (device buffers are not supported yet)");
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
  }

  /// Runs a local argument check and makes every rank fail if any rank's check failed, so a
  /// bad argument on one rank is an exception everywhere instead of a hang.
  template <class Check>
  void agree(const char* who, Check&& check) const {
    std::string failure;
    try {
      check();
    } catch (const invalid_argument& e) {
      failure = e.what();
    }
    int failed = failure.empty() ? 0 : 1;
    kompress::detail::check_mpi(MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_INT, MPI_MAX, comm_), who, "MPI_Allreduce");
    if (!failure.empty()) throw invalid_argument(failure);
    if (failed) throw invalid_argument(std::string(who) + ": another rank's arguments were rejected");
  }

  double table_bound(int t, direction dir, const error_bound& bound, double range, std::uint64_t iteration) const {
    double e = bound.mode == bound_mode::absolute ? bound.value : bound.value * range;
    if (!options_.table_weights.empty()) e *= options_.table_weights[t];
    if (options_.bound_schedule) e *= options_.bound_schedule(iteration, t, dir);
    return std::isfinite(e) && e > 0.0 ? e : 0.0;
  }

  /// Value range of a strided block (finite values).
  template <class T>
  static double range_of(const T* base, std::size_t stride, std::size_t rows, std::size_t cols) {
    double lo = INFINITY, hi = -INFINITY;
    for (std::size_t r = 0; r < rows; ++r)
      for (std::size_t c = 0; c < cols; ++c) {
        const double x = double(base[r * stride + c]);
        if (std::isfinite(x)) {
          lo = x < lo ? x : lo;
          hi = x > hi ? x : hi;
        }
      }
    return lo <= hi ? hi - lo : 0.0;
  }

  template <class Exec, class In, class Out>
  std::unique_ptr<kompress::detail::operation> make_forward(const Exec& exec, const In& in, const Out& out, bool async) {
    using T = typename In::non_const_value_type;
    constexpr const char* who = "kompress::dlrm::embedding_exchange::forward";
    Kokkos::Profiling::ScopedRegion region(who);
    const int p = shape_.size, me = shape_.rank;
    const std::size_t mine = local_width(), bl = local_batch_;
    agree(who, [&] { check_views(in, out, global_batch(), mine, bl, total_width_, who); });
    T* const in_data = const_cast<T*>(in.data());
    T* const out_data = out.data();
    std::vector<kompress::detail::peer_segments<T>> peers(p);
    for (std::size_t t = 0; t < tables_.size(); ++t) {
      const table& tab = tables_[t];
      if (tab.owner == me) {
        // Send: rows of each peer's batch slice, this table's columns.
        const double range = options_.compress_forward && options_.forward_bound.mode == bound_mode::relative
                                 ? range_of(in_data + local_column_[t], mine, global_batch(), tab.dim)
                                 : 0.0;
        const double e = table_bound(int(t), direction::forward, options_.forward_bound, range, iteration_);
        for (int peer = 0; peer < p; ++peer)
          peers[peer].send.push_back({in_data + std::size_t(peer) * bl * mine + local_column_[t], mine, bl, tab.dim, e});
      }
      // Receive: from the owner, this table's columns of the local slice.
      peers[tab.owner].receive.push_back({out_data + global_column_[t], total_width_, bl, tab.dim, 0.0});
    }
    ++iteration_;
    return std::make_unique<kompress::detail::segment_exchange<T, Exec>>(exec, std::move(peers), comm_,
                                                                        options_.compress_forward, options_.block_size,
                                                                        async, who);
  }

  template <class Exec, class In, class Out>
  std::unique_ptr<kompress::detail::operation> make_backward(const Exec& exec, const In& in, const Out& out, bool async) {
    using T = typename In::non_const_value_type;
    constexpr const char* who = "kompress::dlrm::embedding_exchange::backward";
    Kokkos::Profiling::ScopedRegion region(who);
    const int p = shape_.size, me = shape_.rank;
    const std::size_t mine = local_width(), bl = local_batch_;
    agree(who, [&] { check_views(in, out, bl, total_width_, global_batch(), mine, who); });
    T* const in_data = const_cast<T*>(in.data());
    T* const out_data = out.data();
    std::vector<kompress::detail::peer_segments<T>> peers(p);
    for (std::size_t t = 0; t < tables_.size(); ++t) {
      const table& tab = tables_[t];
      // Send: this rank's slice of the gradient for table t, to its owner.
      // The backward pass belongs to the iteration whose forward came last.
      const double range = options_.compress_backward && options_.backward_bound.mode == bound_mode::relative
                               ? range_of(in_data + global_column_[t], total_width_, bl, tab.dim)
                               : 0.0;
      const double e = table_bound(int(t), direction::backward, options_.backward_bound, range,
                                   iteration_ > 0 ? iteration_ - 1 : 0);
      peers[tab.owner].send.push_back({in_data + global_column_[t], total_width_, bl, tab.dim, e});
      if (tab.owner == me)
        for (int peer = 0; peer < p; ++peer)
          peers[peer].receive.push_back({out_data + std::size_t(peer) * bl * mine + local_column_[t], mine, bl, tab.dim, 0.0});
    }
    return std::make_unique<kompress::detail::segment_exchange<T, Exec>>(exec, std::move(peers), comm_,
                                                                        options_.compress_backward, options_.block_size,
                                                                        async, who);
  }

  MPI_Comm comm_;
  kompress::detail::comm_shape shape_;
  std::vector<table> tables_;
  std::size_t local_batch_;
  exchange_options options_;
  std::vector<std::size_t> global_column_, local_column_, local_width_;
  std::size_t total_width_ = 0;
  std::uint64_t iteration_ = 0;
};

}  // namespace kompress::inline v0::dlrm
