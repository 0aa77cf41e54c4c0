#pragma once
// kompress::comm_workspace: reusable scratch for the collectives and the DLRM exchange, so a
// call repeated every iteration allocates nothing and duplicates no communicator: host
// staging buffers that grow to the largest call and stay, and a small pool of duplicated
// communicators for nonblocking calls (docs/collectives.md, "Workspace").

#include <kompress/detail/mpi.hpp>
#include <kompress/error.hpp>

#include <Kokkos_Core.hpp>
#include <mpi.h>

#include <cstddef>
#include <string>
#include <vector>

namespace kompress::inline v0 {

namespace detail {

/// Scratch of one collective in flight: its communicator and its staging bytes.
struct workspace_slot {
  MPI_Comm comm = MPI_COMM_NULL;  ///< the caller's (blocking calls) or a duplicate
  owned_comm owned;
  Kokkos::View<std::byte*, Kokkos::HostSpace> send, receive, decode;
  bool busy = false;

  /// Staging of at least these sizes; grows, never shrinks.
  void reserve(std::size_t send_bytes, std::size_t receive_bytes, std::size_t decode_bytes) {
    if (decode.size() < decode_bytes)
      decode = Kokkos::View<std::byte*, Kokkos::HostSpace>(
          Kokkos::view_alloc(Kokkos::WithoutInitializing, "kompress::decode_scratch"), decode_bytes);
    if (send.size() < send_bytes)
      send = Kokkos::View<std::byte*, Kokkos::HostSpace>(
          Kokkos::view_alloc(Kokkos::WithoutInitializing, "kompress::send_staging"), send_bytes);
    if (receive.size() < receive_bytes)
      receive = Kokkos::View<std::byte*, Kokkos::HostSpace>(
          Kokkos::view_alloc(Kokkos::WithoutInitializing, "kompress::receive_staging"), receive_bytes);
  }
};

/// A slot held by one operation, given back when the operation ends (its messages completed
/// or cancelled first: the lease is released after them).
class slot_lease {
 public:
  slot_lease() = default;
  explicit slot_lease(workspace_slot* slot) : slot_(slot) { slot_->busy = true; }
  slot_lease(const slot_lease&) = delete;
  slot_lease& operator=(const slot_lease&) = delete;
  ~slot_lease() {
    if (slot_) slot_->busy = false;
  }
  workspace_slot& operator*() const { return *slot_; }
  workspace_slot* operator->() const { return slot_; }

 private:
  workspace_slot* slot_ = nullptr;
};

}  // namespace detail

/// Reusable scratch for collectives on one communicator. Building it is collective over
/// `comm` (it duplicates the communicator `nonblocking_slots` times); so is destroying it.
/// Pass it to a collective called on the same communicator; it must outlive every request
/// that uses it. Nonblocking calls take its slots in turn: at most `nonblocking_slots` may be
/// in flight at once (a further one throws invalid_argument on every rank). Not thread-safe:
/// one thread calls the collectives that share a workspace.
class comm_workspace {
 public:
  explicit comm_workspace(MPI_Comm comm, int nonblocking_slots = 2) : comm_(comm) {
    constexpr const char* who = "kompress::comm_workspace";
    if (nonblocking_slots < 1)
      throw invalid_argument(std::string(who) + ": nonblocking_slots must be at least 1 (got " +
                             std::to_string(nonblocking_slots) + ")");
    blocking_.comm = comm;
    slots_.resize(std::size_t(nonblocking_slots));
    for (auto& slot : slots_) {
      slot.owned = detail::owned_comm(comm, who);
      slot.comm = slot.owned.get();
    }
  }
  comm_workspace(const comm_workspace&) = delete;
  comm_workspace& operator=(const comm_workspace&) = delete;

  MPI_Comm comm() const { return comm_; }
  /// Staging bytes held now, all slots together.
  std::size_t staging_bytes() const {
    std::size_t bytes = blocking_.send.size() + blocking_.receive.size() + blocking_.decode.size();
    for (const auto& slot : slots_) bytes += slot.send.size() + slot.receive.size() + slot.decode.size();
    return bytes;
  }

  /// The slot the next call takes (internal): the blocking one, or the next nonblocking one in
  /// turn. Throws (a local failure, which the call's agreement makes everyone's) when the
  /// workspace belongs to another communicator or that slot is still in flight. Takes
  /// nothing: `taken` advances the turn once every rank agreed.
  detail::workspace_slot& slot_for(MPI_Comm comm, bool nonblocking, const char* who) {
    if (comm != comm_)
      throw invalid_argument(std::string(who) + ": the workspace was built for another communicator");
    if (!nonblocking) return blocking_;
    detail::workspace_slot& slot = slots_[next_];
    if (slot.busy)
      throw invalid_argument(std::string(who) + ": all " + std::to_string(slots_.size()) +
                             " nonblocking slots of the workspace are in flight; complete a request first or "
                             "build the workspace with more slots");
    return slot;
  }
  void taken(bool nonblocking) {
    if (nonblocking) next_ = (next_ + 1) % slots_.size();
  }

 private:
  MPI_Comm comm_;
  detail::workspace_slot blocking_;
  std::vector<detail::workspace_slot> slots_;
  std::size_t next_ = 0;
};

}  // namespace kompress::inline v0
