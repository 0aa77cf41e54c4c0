#pragma once
// A storage tier of the stash: somewhere a compressed stream can be kept (the pool, a host
// arena, a file). The stash places each segment's stream in the first tier of its list that
// has room (docs/stash.md, "Storage tiers"); a policy is that list. A new tier is a class
// deriving from storage_tier (one file in stash/detail/) plus its line in tiers.hpp.
//
// Offsets are the tier's own (into its arena or file); the stash records (tier index, offset,
// length) per segment and never looks inside. Every member may be called from several host
// threads at once: a tier guards its own bookkeeping.

#include <kompress/stash/handle.hpp>
#include <kompress/stash/stats.hpp>

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <optional>
#include <type_traits>

namespace kompress::inline v0::detail {

/// Host memory for spilled streams and the spill file's staging: where the stash's memory is
/// not host memory (a GPU's), the backend's pinned host memory, which the device copies to
/// and from by DMA at full bandwidth instead of through the driver's bounce buffer; plain host
/// memory otherwise.
template <class ExecutionSpace>
using spill_host_space = std::conditional_t<
    Kokkos::SpaceAccessibility<Kokkos::DefaultHostExecutionSpace,
                               typename ExecutionSpace::memory_space>::accessible,
    Kokkos::HostSpace, Kokkos::SharedHostPinnedSpace>;

/// Where a stored stream can be read: `data` in the stash's memory space, or (host == true) in
/// host memory that the execution space can read.
struct tier_bytes {
  const std::byte* data = nullptr;
  bool host = false;
};

template <class ExecutionSpace>
class storage_tier {
 public:
  using memory_space = typename ExecutionSpace::memory_space;

  virtual ~storage_tier() = default;

  /// Copies the `length`-byte stream at `stream` (in memory_space, written through `exec`)
  /// into this tier and returns its offset, or nothing when the tier has no room. Waits for
  /// `exec`. Throws (keeping nothing) when the copy fails.
  virtual std::optional<std::size_t> store(const ExecutionSpace& exec, const std::byte* stream,
                                           std::size_t length, const char* who) = 0;

  /// Frees a range store returned.
  virtual void release(std::size_t offset, std::size_t length) = 0;

  /// Whether load copies into the caller's scratch (the caller then holds the scratch's lock).
  virtual bool loads_into_scratch() const = 0;

  /// The stored stream, readable through `exec`: where it is, or copied into `scratch` (in
  /// memory_space, at least `length` bytes) when loads_into_scratch(). Waits for `exec` when
  /// it copies.
  virtual tier_bytes load(const ExecutionSpace& exec, std::size_t offset, std::size_t length,
                          std::byte* scratch, const char* who) = 0;

  /// Adds this tier's live bytes to `stats` (stats() snapshots every tier).
  virtual void report(stash_stats& stats) const = 0;

  /// Counts one segment kept here in `placement` (stash::info).
  virtual void count(stash_placement& placement) const = 0;
};

}  // namespace kompress::inline v0::detail
