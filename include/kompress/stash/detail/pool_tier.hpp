#pragma once
// The stash's first tier: one pool of budget_bytes in the execution space's memory space (the
// device's, or the host's for a host execution space), allocated when the stash is made. It
// holds the compression workspace and the streams, placed by first fit (stash/pool.hpp).
// Beyond storage_tier it lends ranges to compress into in place (borrow/keep) and holds the
// worst-case reservations of pending save_asyncs (reserve/settle); settling moves a stream
// down to the lowest free range of its exact length, so reservations leave no holes behind.

#include <kompress/stash/detail/tier.hpp>
#include <kompress/stash/pool.hpp>

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>

namespace kompress::inline v0::detail {

template <class ExecutionSpace>
class pool_tier final : public storage_tier<ExecutionSpace> {
 public:
  using memory_space = typename ExecutionSpace::memory_space;
  using unmanaged_bytes = Kokkos::View<std::byte*, memory_space, Kokkos::MemoryUnmanaged>;
  using const_unmanaged_bytes =
      Kokkos::View<const std::byte*, memory_space, Kokkos::MemoryUnmanaged>;

  /// Allocates `capacity` bytes (a multiple of the alignment) on `exec` and waits for it;
  /// the first `workspace_bytes` are the workspace.
  pool_tier(const ExecutionSpace& exec, std::size_t capacity, std::size_t workspace_bytes)
      : pool_(Kokkos::view_alloc(exec, Kokkos::WithoutInitializing, "kompress::stash::pool"),
              capacity),
        allocator_(capacity),
        workspace_bytes_(workspace_bytes) {
    exec.fence("kompress::stash: pool allocated");
    workspace_offset_ = *allocator_.allocate(workspace_bytes);
    held_bytes_ = workspace_bytes;
    note_usage();
  }

  std::byte* data() const { return pool_.data(); }
  std::byte* workspace() const { return pool_.data() + workspace_offset_; }
  std::size_t workspace_bytes() const { return workspace_bytes_; }
  std::size_t capacity() const { return allocator_.capacity(); }

  /// The pool as a failing save found it (for budget_exceeded).
  struct usage {
    std::size_t capacity, in_use, largest_free;
  };
  usage snapshot() const {
    std::lock_guard lock(mutex_);
    return {allocator_.capacity(), allocator_.in_use(), allocator_.largest_free()};
  }

  // --- in place: a worst-case range, not counted as held until kept ----------------------
  std::optional<std::size_t> borrow(std::size_t bytes) {
    std::lock_guard lock(mutex_);
    return allocator_.allocate(bytes);
  }
  /// Keeps the first `length` bytes of a borrowed range as a stream; gives the tail back.
  void keep(std::size_t offset, std::size_t borrowed, std::size_t length) {
    std::lock_guard lock(mutex_);
    allocator_.shrink(offset, borrowed, length);
    add_stream(length);
  }
  void give_back(std::size_t offset, std::size_t borrowed) {
    std::lock_guard lock(mutex_);
    allocator_.free(offset, borrowed);
  }

  // --- save_async: a worst-case reservation, counted as held -----------------------------
  std::optional<std::size_t> reserve(std::size_t bytes) {
    std::lock_guard lock(mutex_);
    auto offset = allocator_.allocate(bytes);
    if (offset) {
      held_bytes_ += first_fit_allocator::round_up(bytes);
      reserved_bytes_ += first_fit_allocator::round_up(bytes);
      note_usage();
    }
    return offset;
  }
  void unreserve(std::size_t offset, std::size_t reserved) {
    std::lock_guard lock(mutex_);
    allocator_.free(offset, reserved);
    held_bytes_ -= first_fit_allocator::round_up(reserved);
    reserved_bytes_ -= first_fit_allocator::round_up(reserved);
  }
  /// The reservation at `offset` now holds a stream of `length` bytes, kept where it is; the
  /// tail goes back.
  void keep_reserved(std::size_t offset, std::size_t reserved, std::size_t length) {
    std::lock_guard lock(mutex_);
    allocator_.shrink(offset, reserved, length);
    reservation_to_stream(reserved, length);
  }
  /// The reservation at `offset` now holds a stream of `length` bytes (written through `exec`,
  /// which has finished): the stream moves to the lowest free range of its length when that
  /// lies below the reservation (a device copy on `exec`, waited for), else stays and the tail
  /// goes back. Returns the stream's offset.
  std::size_t settle(const ExecutionSpace& exec, std::size_t offset, std::size_t reserved, std::size_t length) {
    std::unique_lock lock(mutex_);
    // A plain offset rather than the optional across the unlock: GCC's -Wmaybe-uninitialized
    // misreads the optional's payload there at -O1.
    std::size_t settled = offset;
    if (const std::optional<std::size_t> lower = allocator_.allocate(length)) {
      if (*lower > offset)
        allocator_.free(*lower, length);
      else
        settled = *lower;
    }
    if (settled != offset) {
      lock.unlock();  // both ranges are ours: copy without the lock
      Kokkos::deep_copy(exec, unmanaged_bytes(pool_.data() + settled, length),
                        const_unmanaged_bytes(pool_.data() + offset, length));
      exec.fence("kompress::stash: a settled stream moved down");
      lock.lock();
      allocator_.free(offset, reserved);
      ++moved_streams_;
    } else {
      allocator_.shrink(offset, reserved, length);
    }
    reservation_to_stream(reserved, length);
    return settled;
  }

  void reset_peaks() {
    std::lock_guard lock(mutex_);
    peak_held_bytes_ = held_bytes_;
    peak_stored_bytes_ = stored_bytes_;
  }

  // --- storage_tier ------------------------------------------------------------------------
  std::optional<std::size_t> store(const ExecutionSpace& exec, const std::byte* stream,
                                   std::size_t length, const char*) override {
    return store_pair(exec, stream, length, nullptr, 0);
  }

  /// Stores `first_length` bytes from `first`, then `second_length` from `second`, in one range
  /// of their total length (counted as one stream): a packed piece's sign bits and its framed
  /// stream. Both are in the pool's memory space; nothing is copied when there is no room.
  std::optional<std::size_t> store_pair(const ExecutionSpace& exec, const std::byte* first, std::size_t first_length,
                                        const std::byte* second, std::size_t second_length) {
    const std::size_t length = first_length + second_length;
    std::optional<std::size_t> offset;
    {
      std::lock_guard lock(mutex_);
      offset = allocator_.allocate(length);
      if (!offset) return offset;
      add_stream(length);
    }
    Kokkos::deep_copy(exec, unmanaged_bytes(pool_.data() + *offset, first_length),
                      const_unmanaged_bytes(first, first_length));
    if (second_length != 0)
      Kokkos::deep_copy(exec, unmanaged_bytes(pool_.data() + *offset + first_length, second_length),
                        const_unmanaged_bytes(second, second_length));
    exec.fence("kompress::stash::save: stream copied into the pool");
    return offset;
  }

  void release(std::size_t offset, std::size_t length) override {
    std::lock_guard lock(mutex_);
    allocator_.free(offset, length);
    stored_bytes_ -= length;
    held_bytes_ -= first_fit_allocator::round_up(length);
    note_usage();
  }

  bool loads_into_scratch() const override { return false; }

  tier_bytes load(const ExecutionSpace&, std::size_t offset, std::size_t, std::byte*,
                  const char*) override {
    return {pool_.data() + offset, false};
  }

  void report(stash_stats& stats) const override {
    std::lock_guard lock(mutex_);
    stats.budget_bytes = allocator_.capacity();
    stats.workspace_bytes = workspace_bytes_;
    stats.pool_bytes = held_bytes_;
    stats.reserved_bytes = reserved_bytes_;
    stats.padding_bytes = held_bytes_ - workspace_bytes_ - reserved_bytes_ - stored_bytes_;
    stats.moved_streams = moved_streams_;
    stats.peak_pool_bytes = peak_held_bytes_;
    stats.peak_stored_bytes = peak_stored_bytes_;
  }

  void count(stash_placement& placement) const override { ++placement.pool_segments; }

 private:
  /// A reservation of `reserved` bytes is now a stream of `length` (its range already shrunk
  /// or moved).
  void reservation_to_stream(std::size_t reserved, std::size_t length) {  // mutex held
    held_bytes_ -= first_fit_allocator::round_up(reserved);
    reserved_bytes_ -= first_fit_allocator::round_up(reserved);
    add_stream(length);
  }
  void add_stream(std::size_t length) {  // mutex held
    stored_bytes_ += length;
    held_bytes_ += first_fit_allocator::round_up(length);
    note_usage();
  }
  /// Held: the workspace, the streams and the reservations, not the worst-case ranges saves
  /// borrow while they compress in place (they would have gone through the workspace
  /// otherwise), so the peak is the budget a run needed.
  void note_usage() {
    peak_held_bytes_ = std::max(peak_held_bytes_, held_bytes_);
    peak_stored_bytes_ = std::max(peak_stored_bytes_, stored_bytes_);
  }

  Kokkos::View<std::byte*, memory_space> pool_;
  mutable std::mutex mutex_;  // everything below
  first_fit_allocator allocator_;
  std::size_t workspace_offset_ = 0;
  std::size_t workspace_bytes_ = 0;
  std::size_t stored_bytes_ = 0;  ///< streams in the pool
  std::size_t held_bytes_ = 0;    ///< the workspace, streams and reservations, 16-byte aligned
  std::size_t reserved_bytes_ = 0;  ///< of held_bytes_, pending save_asyncs' reservations
  std::uint64_t moved_streams_ = 0;  ///< settled streams moved down
  std::size_t peak_held_bytes_ = 0;
  std::size_t peak_stored_bytes_ = 0;
};

}  // namespace kompress::inline v0::detail
