#pragma once
// kompress::comm_workspace: reusable scratch for the collectives and the DLRM exchange, so a
// call repeated every iteration allocates nothing and duplicates no communicator: scratch
// buffers (in host memory, in device memory for calls on a device, and the transport seam's
// host staging) that grow to the largest call and stay, and a small pool of duplicated
// communicators for nonblocking calls (docs/collectives.md, "Workspace").

#include <kompress/comm/detail/transport.hpp>
#include <kompress/detail/mpi.hpp>
#include <kompress/error.hpp>

#include <Kokkos_Core.hpp>
#include <mpi.h>

#include <cstddef>
#include <string>
#include <type_traits>
#include <vector>

namespace kompress::inline v0 {

namespace detail {

/// Where a call's scratch is, in one memory space: room to encode into, to receive into and to
/// decode into.
struct scratch_room {
  std::byte *send = nullptr, *receive = nullptr, *decode = nullptr;
};

/// Grows `view` to at least `bytes` (never shrinks it).
template <class View>
void grow(View& view, std::size_t bytes, const char* label) {
  if (view.size() < bytes) view = View(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string(label)), bytes);
}

/// Scratch of one collective in flight: its communicator and its staging bytes.
struct workspace_slot {
  using device_memory = Kokkos::DefaultExecutionSpace::memory_space;

  MPI_Comm comm = MPI_COMM_NULL;  ///< the caller's (blocking calls) or a duplicate
  owned_comm owned;
  Kokkos::View<std::byte*, Kokkos::HostSpace> send, receive, decode;
  /// The same scratch in device memory, for calls whose execution space is a device's (unused
  /// where the default execution space runs on the host).
  Kokkos::View<std::byte*, device_memory> device_send, device_receive, device_decode;
  /// The transport seam's host staging (comm/detail/transport.hpp): what MPI sends from and
  /// receives into when the call's memory is staged.
  Kokkos::View<std::byte*, staging_space> staged_send, staged_receive;
  bool busy = false;

  /// Scratch in `Memory` (host memory, or the device's) of at least these sizes.
  template <class Memory>
  scratch_room reserve_in(std::size_t send_bytes, std::size_t receive_bytes, std::size_t decode_bytes) {
    if constexpr (host_memory_space<Memory>) {
      reserve(send_bytes, receive_bytes, decode_bytes);
      return {send.data(), receive.data(), decode.data()};
    } else {
      static_assert(std::is_same_v<Memory, device_memory>,
                    "kompress collectives: the execution space's memory must be the host's or the default "
                    "execution space's");
      grow(device_send, send_bytes, "kompress::device_send_scratch");
      grow(device_receive, receive_bytes, "kompress::device_receive_scratch");
      grow(device_decode, decode_bytes, "kompress::device_decode_scratch");
      return {device_send.data(), device_receive.data(), device_decode.data()};
    }
  }
  /// Host staging of at least these sizes.
  void reserve_staging(std::size_t send_bytes, std::size_t receive_bytes) {
    grow(staged_send, send_bytes, "kompress::staged_send");
    grow(staged_receive, receive_bytes, "kompress::staged_receive");
  }

  /// Staging of at least these sizes; grows, never shrinks.
  void reserve(std::size_t send_bytes, std::size_t receive_bytes, std::size_t decode_bytes) {
    grow(decode, decode_bytes, "kompress::decode_scratch");
    grow(send, send_bytes, "kompress::send_staging");
    grow(receive, receive_bytes, "kompress::receive_staging");
  }

  /// Every byte the slot holds.
  std::size_t bytes() const {
    std::size_t all = send.size() + receive.size() + decode.size() + staged_send.size() + staged_receive.size();
    if constexpr (!std::is_same_v<device_memory, Kokkos::HostSpace>)
      all += device_send.size() + device_receive.size() + device_decode.size();
    return all;
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
    std::size_t bytes = blocking_.bytes();
    for (const auto& slot : slots_) bytes += slot.bytes();
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
