#pragma once
// A spill tier in host memory (budget_policy::spill_to_host): arenas added as needed and never
// moved (16 MiB, a quarter of the budget, or twice the last, whichever is largest), pinned
// where the stash's pool is device memory (spill_host_space). Outside the budget: it never
// runs out of room short of a failed allocation.

#include <kompress/stash/detail/tier.hpp>
#include <kompress/stash/pool.hpp>

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cstddef>
#include <mutex>
#include <optional>
#include <vector>

namespace kompress::inline v0::detail {

template <class ExecutionSpace>
class host_tier final : public storage_tier<ExecutionSpace> {
 public:
  using memory_space = typename ExecutionSpace::memory_space;
  using arena_space = spill_host_space<ExecutionSpace>;
  using host_bytes = Kokkos::View<std::byte*, arena_space, Kokkos::MemoryUnmanaged>;
  using const_host_bytes = Kokkos::View<const std::byte*, arena_space, Kokkos::MemoryUnmanaged>;
  using unmanaged_bytes = Kokkos::View<std::byte*, memory_space, Kokkos::MemoryUnmanaged>;
  using const_unmanaged_bytes =
      Kokkos::View<const std::byte*, memory_space, Kokkos::MemoryUnmanaged>;
  /// The execution space reads host memory directly (decompress from the arena).
  static constexpr bool exec_reads_host =
      Kokkos::SpaceAccessibility<ExecutionSpace, Kokkos::HostSpace>::accessible;

  explicit host_tier(std::size_t budget_bytes) : budget_bytes_(budget_bytes) {}

  std::optional<std::size_t> store(const ExecutionSpace& exec, const std::byte* stream,
                                   std::size_t length, const char*) override {
    std::size_t offset;
    std::byte* destination;
    {
      std::lock_guard lock(mutex_);
      offset = place(length);
      destination = locate(offset);
      spilled_bytes_ += length;
    }
    Kokkos::deep_copy(exec, host_bytes(destination, length), const_unmanaged_bytes(stream, length));
    exec.fence("kompress::stash::save: stream spilled to host memory");
    return offset;
  }

  void release(std::size_t offset, std::size_t length) override {
    std::lock_guard lock(mutex_);
    arena& a = arena_of(offset);
    a.allocator.free(offset - a.base, length);
    spilled_bytes_ -= length;
  }

  bool loads_into_scratch() const override { return !exec_reads_host; }

  tier_bytes load(const ExecutionSpace& exec, std::size_t offset, std::size_t length,
                  std::byte* scratch, const char*) override {
    const std::byte* source;
    {
      std::lock_guard lock(mutex_);  // arenas may be added meanwhile; never moved
      source = locate(offset);
    }
    if constexpr (exec_reads_host) {
      return {source, true};
    } else {
      Kokkos::deep_copy(exec, unmanaged_bytes(scratch, length), const_host_bytes(source, length));
      exec.fence("kompress::stash::restore: stream copied from host memory");
      return {scratch, false};
    }
  }

  void report(stash_stats& stats) const override {
    std::lock_guard lock(mutex_);
    stats.host_spilled_bytes += spilled_bytes_;
  }

  void count(stash_placement& placement) const override { ++placement.host_segments; }

 private:
  struct arena {
    std::size_t base;  ///< offsets [base, base + capacity) are this arena's
    Kokkos::View<std::byte*, arena_space> bytes;
    first_fit_allocator allocator;
  };

  std::size_t place(std::size_t length) {  // mutex held
    for (arena& a : arenas_)
      if (auto offset = a.allocator.allocate(length)) return a.base + *offset;
    const std::size_t previous = arenas_.empty() ? 0 : arenas_.back().allocator.capacity();
    const std::size_t capacity = first_fit_allocator::round_up(
        std::max({length, 2 * previous, std::size_t(16) << 20, budget_bytes_ / 4}));
    const std::size_t base = arenas_.empty() ? 0 : arenas_.back().base + previous;
    arenas_.push_back({base,
                       Kokkos::View<std::byte*, arena_space>(
                           Kokkos::view_alloc(Kokkos::WithoutInitializing,
                                              "kompress::stash::host_spill"),
                           capacity),
                       first_fit_allocator(capacity)});
    return base + *arenas_.back().allocator.allocate(length);
  }

  arena& arena_of(std::size_t offset) {  // mutex held
    auto it = std::upper_bound(arenas_.begin(), arenas_.end(), offset,
                               [](std::size_t o, const arena& a) { return o < a.base; });
    return *std::prev(it);
  }
  std::byte* locate(std::size_t offset) {  // mutex held
    arena& a = arena_of(offset);
    return a.bytes.data() + (offset - a.base);
  }

  std::size_t budget_bytes_;
  mutable std::mutex mutex_;
  std::vector<arena> arenas_;
  std::size_t spilled_bytes_ = 0;
};

}  // namespace kompress::inline v0::detail
