#pragma once
// kompress::node_groups: the ranks of a communicator grouped by node, for the hierarchical
// collectives (comm/hierarchical_*.hpp, docs/collectives.md "Hierarchical collectives"): the
// ranks that share memory (MPI_COMM_TYPE_SHARED), runs of a given number of consecutive ranks, or
// the ranks that name the same node. It holds two communicators split from the caller's (the
// ranks of this rank's node, and the ranks at this rank's place on every node) and, for uniform
// groups, which rank sits at each place of each node.

#include <kompress/detail/mpi.hpp>
#include <kompress/error.hpp>

#include <mpi.h>

#include <string>
#include <utility>
#include <vector>

namespace kompress::inline v0 {

/// Groups the ranks of `comm` by node; collective over `comm` (construct it on every rank, with
/// the same arguments). The groups are *uniform* when every node holds the same number of ranks;
/// only then do the hierarchical collectives run their phases (otherwise they are the flat
/// collectives on `comm`). Keep `comm` alive while the groups are used; destroy them before
/// MPI_Finalize (they free the two communicators they split).
class node_groups {
 public:
  /// The ranks that can share memory are a node (MPI_Comm_split_type, MPI_COMM_TYPE_SHARED).
  explicit node_groups(MPI_Comm comm) : comm_(comm) {
    constexpr const char* who = "kompress::node_groups";
    const detail::comm_shape shape = detail::shape_of(comm, who);
    detail::check_mpi(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, shape.rank, MPI_INFO_NULL, &node_), who,
                      "MPI_Comm_split_type");
    finish(shape, who);
  }

  /// Runs of `ranks_per_node` consecutive ranks are a node (ranks 0 .. k-1 the first, ...; the
  /// last node holds fewer where k does not divide the size): for launchers that place ranks
  /// that way, and to try a layout on one machine. Every rank must pass the same k >= 1: else
  /// invalid_argument on every rank.
  node_groups(MPI_Comm comm, int ranks_per_node) : comm_(comm) {
    constexpr const char* who = "kompress::node_groups";
    const detail::comm_shape shape = detail::shape_of(comm, who);
    int extremes[2] = {-ranks_per_node, ranks_per_node};  // every rank's k: max of -k, max of k
    detail::check_mpi(MPI_Allreduce(MPI_IN_PLACE, extremes, 2, MPI_INT, MPI_MAX, comm), who, "MPI_Allreduce");
    if (-extremes[0] != extremes[1])
      throw invalid_argument(std::string(who) + ": ranks pass different ranks_per_node (" +
                             std::to_string(-extremes[0]) + " to " + std::to_string(extremes[1]) +
                             "); every rank must pass the same");
    if (ranks_per_node < 1)
      throw invalid_argument(std::string(who) + ": ranks_per_node is " + std::to_string(ranks_per_node) +
                             "; it must be at least 1");
    detail::check_mpi(MPI_Comm_split(comm, shape.rank / ranks_per_node, shape.rank, &node_), who, "MPI_Comm_split");
    finish(shape, who);
  }

  /// The ranks that pass the same `node` (>= 0) are a node, whatever their ranks: for placements
  /// neither shared memory nor runs describe (round-robin launchers, a node per GPU switch).
  /// A rank's place on its node follows its rank in `comm`.
  static node_groups by_node(MPI_Comm comm, int node) {
    constexpr const char* who = "kompress::node_groups::by_node";
    const detail::comm_shape shape = detail::shape_of(comm, who);
    int lowest = node;
    detail::check_mpi(MPI_Allreduce(MPI_IN_PLACE, &lowest, 1, MPI_INT, MPI_MIN, comm), who, "MPI_Allreduce");
    if (lowest < 0)
      throw invalid_argument(std::string(who) + ": a rank names node " + std::to_string(lowest) +
                             "; nodes are numbered from 0");
    node_groups groups;
    groups.comm_ = comm;
    detail::check_mpi(MPI_Comm_split(comm, node, shape.rank, &groups.node_), who, "MPI_Comm_split");
    groups.finish(shape, who);
    return groups;
  }

  node_groups(const node_groups&) = delete;
  node_groups& operator=(const node_groups&) = delete;
  node_groups(node_groups&& other) noexcept { *this = std::move(other); }
  node_groups& operator=(node_groups&& other) noexcept {
    if (this != &other) {
      release();
      comm_ = std::exchange(other.comm_, MPI_COMM_NULL);
      node_ = std::exchange(other.node_, MPI_COMM_NULL);
      across_ = std::exchange(other.across_, MPI_COMM_NULL);
      ranks_per_node_ = other.ranks_per_node_;
      nodes_ = other.nodes_;
      uniform_ = other.uniform_;
      ranks_at_ = std::move(other.ranks_at_);
    }
    return *this;
  }
  ~node_groups() { release(); }

  /// The communicator the groups were made from.
  MPI_Comm comm() const { return comm_; }
  /// The ranks of this rank's node, ordered as in comm().
  MPI_Comm node() const { return node_; }
  /// One rank of every node: those at this rank's place on its node, ordered by node.
  MPI_Comm across() const { return across_; }
  /// Whether every node holds the same number of ranks.
  bool uniform() const { return uniform_; }
  /// Ranks on every node (uniform groups), or on the largest.
  int ranks_per_node() const { return ranks_per_node_; }
  /// Number of nodes.
  int nodes() const { return nodes_; }
  /// The rank in comm() at place `place` (its rank in node()) of node `node` (its rank in
  /// across()); uniform groups only, else -1.
  int rank_at(int node, int place) const {
    if (!uniform_ || node < 0 || node >= nodes_ || place < 0 || place >= ranks_per_node_) return -1;
    return ranks_at_[std::size_t(place) * std::size_t(nodes_) + std::size_t(node)];
  }

 private:
  node_groups() = default;

  void finish(detail::comm_shape shape, const char* who) {
    const detail::comm_shape local = detail::shape_of(node_, who);
    detail::check_mpi(MPI_Comm_split(comm_, local.rank, shape.rank, &across_), who, "MPI_Comm_split");
    // Node sizes: their extremes; and the nodes, counted by their first ranks.
    int numbers[3] = {-local.size, local.size, local.rank == 0 ? 1 : 0};
    int extremes[2] = {numbers[0], numbers[1]};
    detail::check_mpi(MPI_Allreduce(MPI_IN_PLACE, extremes, 2, MPI_INT, MPI_MAX, comm_), who, "MPI_Allreduce");
    detail::check_mpi(MPI_Allreduce(MPI_IN_PLACE, &numbers[2], 1, MPI_INT, MPI_SUM, comm_), who, "MPI_Allreduce");
    ranks_per_node_ = extremes[1];
    uniform_ = -extremes[0] == extremes[1];
    nodes_ = numbers[2];
    // Who sits where: every rank's (place, node) pair, where the nodes are uniform.
    if (!uniform_) return;
    const int place_and_node[2] = {local.rank, detail::shape_of(across_, who).rank};
    std::vector<int> all(2 * std::size_t(shape.size));
    detail::check_mpi(MPI_Allgather(place_and_node, 2, MPI_INT, all.data(), 2, MPI_INT, comm_), who, "MPI_Allgather");
    ranks_at_.assign(std::size_t(shape.size), -1);
    for (int r = 0; r < shape.size; ++r)
      ranks_at_[std::size_t(all[2 * r]) * std::size_t(nodes_) + std::size_t(all[2 * r + 1])] = r;
  }

  void release() noexcept {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) {
      if (across_ != MPI_COMM_NULL) MPI_Comm_free(&across_);
      if (node_ != MPI_COMM_NULL) MPI_Comm_free(&node_);
    }
    across_ = node_ = MPI_COMM_NULL;
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  MPI_Comm node_ = MPI_COMM_NULL;
  MPI_Comm across_ = MPI_COMM_NULL;
  int ranks_per_node_ = 1;
  int nodes_ = 1;
  bool uniform_ = true;
  std::vector<int> ranks_at_;  // place-major: ranks_at_[place * nodes + node]
};

}  // namespace kompress::inline v0
