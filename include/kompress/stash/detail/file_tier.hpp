#pragma once
// A spill tier in a file (budget_policy::spill_to_file): one private file per stash, created
// on the first spill (stash/detail/spill_file.hpp says how, and why), its freed ranges reused
// by first fit over file offsets, removed with the stash. It grows as needed.

#include <kompress/error.hpp>
#include <kompress/stash/detail/spill_file.hpp>
#include <kompress/stash/detail/tier.hpp>
#include <kompress/stash/pool.hpp>

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <mutex>
#include <optional>
#include <string>
#include <system_error>

namespace kompress::inline v0::detail {

template <class ExecutionSpace>
class file_tier final : public storage_tier<ExecutionSpace> {
 public:
  using memory_space = typename ExecutionSpace::memory_space;
  using staging_space = spill_host_space<ExecutionSpace>;
  using host_bytes = Kokkos::View<std::byte*, staging_space, Kokkos::MemoryUnmanaged>;
  using unmanaged_bytes = Kokkos::View<std::byte*, memory_space, Kokkos::MemoryUnmanaged>;
  using const_unmanaged_bytes =
      Kokkos::View<const std::byte*, memory_space, Kokkos::MemoryUnmanaged>;
  /// The host reads the pool directly (write the file from the workspace, read into it).
  static constexpr bool host_reads_pool =
      Kokkos::SpaceAccessibility<Kokkos::DefaultHostExecutionSpace, memory_space>::accessible;

  /// `staging_bytes`: the largest stream (one segment's worst case), for a device pool's
  /// host staging buffer (pinned: spill_host_space), allocated on the first spill.
  file_tier(std::filesystem::path directory, std::uint64_t stash_id, std::size_t staging_bytes)
      : directory_(std::move(directory)), stash_id_(stash_id), staging_bytes_(staging_bytes) {
    std::error_code ec;
    if (directory_.empty() || !std::filesystem::is_directory(directory_, ec))
      throw invalid_argument("kompress::stash: the spill directory '" + directory_.string() +
                             "' is not an existing directory");
  }

  std::optional<std::size_t> store(const ExecutionSpace& exec, const std::byte* stream,
                                   std::size_t length, const char* who) override {
    std::size_t offset;
    {
      std::lock_guard lock(mutex_);
      if (!file_.is_open()) file_.create(directory_, stash_id_, who);
      auto placed = allocator_.allocate(length);
      if (!placed) {
        allocator_.grow(allocator_.capacity() +
                        std::max(first_fit_allocator::round_up(length), allocator_.capacity()));
        placed = allocator_.allocate(length);
      }
      offset = *placed;
    }
    try {
      if constexpr (host_reads_pool) {
        exec.fence("kompress::stash::save: stream ready for the spill file");
        file_.write(offset, stream, length, who);  // pwrite: disjoint ranges need no lock
      } else {
        std::lock_guard staging_lock(staging_mutex_);
        stage(length);
        Kokkos::deep_copy(exec, host_bytes(staging_.data(), length),
                          const_unmanaged_bytes(stream, length));
        exec.fence("kompress::stash::save: stream staged for the spill file");
        file_.write(offset, staging_.data(), length, who);
      }
    } catch (...) {
      std::lock_guard lock(mutex_);
      allocator_.free(offset, length);
      throw;
    }
    std::lock_guard lock(mutex_);
    spilled_bytes_ += length;
    return offset;
  }

  void release(std::size_t offset, std::size_t length) override {
    std::lock_guard lock(mutex_);
    allocator_.free(offset, length);
    spilled_bytes_ -= length;
  }

  bool loads_into_scratch() const override { return true; }

  tier_bytes load(const ExecutionSpace& exec, std::size_t offset, std::size_t length,
                  std::byte* scratch, const char* who) override {
    if constexpr (host_reads_pool) {
      file_.read(offset, scratch, length, who);
    } else {
      std::lock_guard staging_lock(staging_mutex_);
      stage(length);
      file_.read(offset, staging_.data(), length, who);
      Kokkos::deep_copy(exec, unmanaged_bytes(scratch, length), host_bytes(staging_.data(), length));
      exec.fence("kompress::stash::restore: stream copied from the spill file");
    }
    return {scratch, false};
  }

  void report(stash_stats& stats) const override {
    std::lock_guard lock(mutex_);
    stats.file_spilled_bytes += spilled_bytes_;
  }

  void count(stash_placement& placement) const override { ++placement.file_segments; }

 private:
  void stage(std::size_t length) {  // staging_mutex_ held
    if (staging_.size() < length)
      staging_ = Kokkos::View<std::byte*, staging_space>(
          Kokkos::view_alloc(Kokkos::WithoutInitializing, "kompress::stash::host_staging"),
          std::max(length, staging_bytes_));
  }

  std::filesystem::path directory_;
  std::uint64_t stash_id_;
  std::size_t staging_bytes_;
  mutable std::mutex mutex_;  // the file's creation, its allocator and byte count
  spill_file file_;
  first_fit_allocator allocator_;
  std::size_t spilled_bytes_ = 0;
  std::mutex staging_mutex_;
  Kokkos::View<std::byte*, staging_space> staging_;
};

}  // namespace kompress::inline v0::detail
