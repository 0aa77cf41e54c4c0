#pragma once
// kompress::stash: activations saved compressed for the backward pass, under a memory budget.
//
//   kompress::stash<Kokkos::DefaultExecutionSpace> stash(exec, {.budget_bytes = 256 << 20});
//   auto handle = stash.save(exec, activation, kompress::relative(1e-2));   // forward
//   ...
//   stash.restore_and_drop(exec, handle, activation_back);                 // backward
//
// Memory. The stash allocates one pool of budget_bytes in the execution space's memory space
// when it is made, and nothing else there. Part of the pool is the compression workspace (one
// segment's worst case); the rest holds the streams, placed by an address-ordered first-fit
// allocator (kompress/stash/pool.hpp; docs/stash.md says why). A save compresses its View in
// segments of at most options.segment_bytes: each segment is compressed straight into the pool
// when a worst-case range is free there, and its unused tail given back; otherwise into the
// workspace, and then copied into a range of its exact size. What still does not fit goes to
// the budget policy (kompress/stash/policy.hpp).
//
// Sync points (nothing here fences the whole device or any instance but those passed in):
//   save_async  enqueues the compression on `exec` into a worst-case range of the pool and
//             returns without waiting; the stash settles the entry (waits for that instance,
//             gives the range's unused tail back) in fence(), in restore/info/drop of it, or
//             when a save needs the room. `view` must not change until `exec` has run it.
//   save      reads the View and writes the pool through `exec` only, and returns when the
//             streams are in place: it waits for `exec` (a relative bound over more than one
//             segment adds a value-range reduction; a copy out of the workspace or to the host
//             or a file adds one more wait). If another instance produced the View, fence
//             that instance first.
//   restore   writes `out` through `exec` and returns when `out` holds the values (it waits
//             for `exec`: kompress::decompress verifies checksums before and after decoding).
//   drop      no device work and no wait, unless the entry's save_async is still pending.
// Thread safety: every member function may be called concurrently from several host threads,
// each on its own execution space instance. Dropping a handle while another thread restores it
// throws kompress::invalid_handle.

#include <kompress/bound.hpp>
#include <kompress/compress.hpp>
#include <kompress/error.hpp>
#include <kompress/format.hpp>
#include <kompress/kernels/value_range.hpp>
#include <kompress/error.hpp>
#include <kompress/stash/handle.hpp>
#include <kompress/stash/policy.hpp>
#include <kompress/stash/detail/spill_file.hpp>
#include <kompress/stash/pool.hpp>
#include <kompress/stash/stats.hpp>

#include <Kokkos_Core.hpp>
#include <Kokkos_Profiling_ScopedRegion.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace kompress {
inline namespace v0 {
namespace detail {

/// Tuning of the stash, chosen per backend; the measured gain is written beside each value
/// (bench/stash, docs/performance.md "Stash (CPU)").
struct stash_tuning {
  /// Compress a segment straight into the pool when a worst-case range is free, instead of
  /// into the workspace and then copying. OpenMP, 2 threads, act_* at REL 1e-2: the copy
  /// costs 1-3% of a save (it moves compressed bytes only); in place also lets concurrent
  /// saves skip the workspace's lock. Kept on.
  bool compress_in_place = true;
};

template <class ExecutionSpace>
constexpr stash_tuning default_stash_tuning() {
  return {};
}

enum class segment_location : std::uint8_t { pool, host, file };

struct stash_segment {
  std::size_t first_value = 0;
  std::size_t count = 0;
  segment_location location = segment_location::pool;
  std::size_t offset = 0;          ///< in the pool, the host arena, or the file
  std::size_t arena = 0;           ///< host arena index
  std::byte* host_data = nullptr;  ///< the host arena's data (stable while the arena lives)
  std::size_t stream_bytes = 0;
};

struct stash_entry {
  std::uint32_t generation = 1;
  bool live = false;  ///< published: a handle names it
  int pins = 0;       ///< restores in progress
  /// While a save_async is pending (the stash holds the instance it was enqueued on, by slot),
  /// its one segment holds a worst-case range of reserved_bytes in the pool (stream_bytes 0).
  std::size_t reserved_bytes = 0;
  element_type type = element_type::float32;
  int rank = 0;
  std::array<std::size_t, 8> extents{};
  std::array<std::size_t, 8> strides{};
  std::size_t count = 0;
  error_bound requested{};
  error_bound used{};
  double absolute_bound = 0.0;
  std::vector<stash_segment> segments;  ///< capacity kept when the slot is reused

  std::size_t element_size() const { return type == element_type::float32 ? 4 : 8; }
  std::size_t stored_bytes() const {
    std::size_t total = 0;
    for (const stash_segment& s : segments) total += s.stream_bytes;
    return total;
  }
};

struct host_arena {
  Kokkos::View<std::byte*, Kokkos::HostSpace> bytes;
  first_fit_allocator allocator;
};

inline std::string bound_text(const error_bound& bound) {
  std::ostringstream text;
  text << (bound.mode == bound_mode::relative ? "REL " : "ABS ") << bound.value;
  return text.str();
}

inline const char* policy_name(budget_policy::action action) {
  switch (action) {
    case budget_policy::action::spill_host: return "spill_host";
    case budget_policy::action::spill_file: return "spill_file";
    case budget_policy::action::loosen_bound: return "loosen_bound";
    default: return "throw_error";
  }
}

template <class T>
constexpr const char* type_name() {
  return std::is_same_v<T, float> ? "float" : "double";
}

/// Values per segment for elements of `element_size` bytes: segment_bytes worth, rounded down
/// to whole chunks (a partial chunk only costs a shorter table, but whole ones keep segment
/// boundaries on chunk boundaries).
inline std::size_t segment_values(std::size_t segment_bytes, std::size_t element_size,
                                  int block_size) {
  const std::size_t values = std::max<std::size_t>(1, segment_bytes / element_size);
  const std::size_t chunk = std::size_t(block_size) * std::size_t(default_blocks_per_chunk);
  return values >= chunk ? values / chunk * chunk : values;
}

}  // namespace detail


template <class ExecutionSpace = Kokkos::DefaultExecutionSpace>
class stash {
  static_assert(execution_space<ExecutionSpace>,
                "kompress::stash: the template argument must be a Kokkos execution space");

 public:
  using execution_space = ExecutionSpace;
  using memory_space = typename ExecutionSpace::memory_space;

  /// Allocates the pool (options.budget_bytes in memory_space) on `exec`; waits for `exec`.
  stash(const ExecutionSpace& exec, const stash_options& options,
        const detail::stash_tuning& tuning = detail::default_stash_tuning<ExecutionSpace>())
      : state_(std::make_unique<state>(exec, options, tuning)) {}
  explicit stash(const stash_options& options) : stash(ExecutionSpace{}, options) {}

  stash(stash&&) noexcept = default;
  stash& operator=(stash&&) noexcept = default;
  stash(const stash&) = delete;
  stash& operator=(const stash&) = delete;
  /// Releases the pool and removes the spill file. Handles into it become invalid.
  ~stash() = default;

  // ------------------------------------------------------------------------------------------
  /// Compresses `view` (float or double, any rank, contiguous) within `bound` into the stash
  /// and returns its handle. Reads `view` through `exec` and waits for `exec` (see the top of
  /// this header). A zero-size View makes an entry of 0 bytes. Throws invalid_argument for a
  /// strided View or an invalid bound, budget_exceeded when the policy cannot place it (the
  /// stash is then unchanged).
  template <float_view View>
  stash_handle save(const ExecutionSpace& exec, const View& view, const error_bound& bound) {
    static_assert(Kokkos::SpaceAccessibility<ExecutionSpace, typename View::memory_space>::accessible,
                  "kompress::stash::save: the View must be accessible from the stash's execution space");
    return state_->template save<typename View::non_const_value_type>(exec, view, bound);
  }
  template <float_view View>
  stash_handle save(const View& view, const error_bound& bound) {
    return save(state_->exec, view, bound);
  }

  /// Enqueues the compression of `view` on `exec` and returns its handle without waiting for
  /// it. Until `exec` has finished the save (exec.fence(), or any stash call that settles the
  /// entry: see docs/stash.md "Asynchronous saves"), `view` must not change. The entry is one
  /// stream compressed in place into a worst-case range of the pool, held until the stash
  /// settles it: fence(), restore, info or drop of the entry, or a save that needs the room.
  /// When the pool has no such range even after settling, this saves as save() does (and
  /// waits). Throws what save throws.
  template <float_view View>
  stash_handle save_async(const ExecutionSpace& exec, const View& view, const error_bound& bound) {
    static_assert(Kokkos::SpaceAccessibility<ExecutionSpace, typename View::memory_space>::accessible,
                  "kompress::stash::save_async: the View must be accessible from the stash's "
                  "execution space");
    return state_->template save_async<typename View::non_const_value_type>(exec, view, bound);
  }
  template <float_view View>
  stash_handle save_async(const View& view, const error_bound& bound) {
    return save_async(state_->exec, view, bound);
  }

  /// Waits for every save_async still pending (fencing the instances they were enqueued on)
  /// and gives the unused part of their reservations back to the pool.
  void fence() { state_->settle(std::nullopt); }

  /// Decompresses the entry into `out`, which must be contiguous, of the saved element type
  /// and of the saved extents in the same element order (or rank 1 with as many elements:
  /// the values in memory order). Every value is within the entry's absolute_bound. The entry
  /// stays until drop. Writes through `exec` and waits for it.
  template <float_view View>
  void restore(const ExecutionSpace& exec, const stash_handle& handle, const View& out) {
    static_assert(!std::is_const_v<typename View::value_type>,
                  "kompress::stash::restore: the output View must not be const");
    static_assert(Kokkos::SpaceAccessibility<ExecutionSpace, typename View::memory_space>::accessible,
                  "kompress::stash::restore: the output View must be accessible from the stash's "
                  "execution space");
    state_->restore(exec, handle, out, false, "kompress::stash::restore");
  }
  template <float_view View>
  void restore(const stash_handle& handle, const View& out) {
    restore(state_->exec, handle, out);
  }

  /// Decompresses into a new View of type View with the saved extents (allocated on `exec`).
  /// View's layout must give the saved element order (the layout saved, or rank 1).
  template <float_view View>
  View restore(const ExecutionSpace& exec, const stash_handle& handle) {
    static_assert(std::is_same_v<typename View::array_layout, Kokkos::LayoutLeft> ||
                      std::is_same_v<typename View::array_layout, Kokkos::LayoutRight>,
                  "kompress::stash::restore: the View to allocate must be LayoutLeft or LayoutRight");
    const stash_entry_info entry = info(handle);
    View out;
    if constexpr (View::rank == 1) {
      out = View(Kokkos::view_alloc(exec, Kokkos::WithoutInitializing, "kompress::stash::restored"),
                 entry.count);
    } else {
      if (entry.rank != int(View::rank))
        throw invalid_argument("kompress::stash::restore: the entry has rank " +
                               std::to_string(entry.rank) + " but the View type has rank " +
                               std::to_string(View::rank));
      out = allocate<View>(exec, entry.extents, std::make_index_sequence<View::rank>{});
    }
    restore(exec, handle, out);
    return out;
  }

  /// restore, then drop: the backward pass's usual call.
  template <float_view View>
  void restore_and_drop(const ExecutionSpace& exec, const stash_handle& handle, const View& out) {
    static_assert(!std::is_const_v<typename View::value_type>,
                  "kompress::stash::restore_and_drop: the output View must not be const");
    static_assert(Kokkos::SpaceAccessibility<ExecutionSpace, typename View::memory_space>::accessible,
                  "kompress::stash::restore_and_drop: the output View must be accessible from the "
                  "stash's execution space");
    state_->restore(exec, handle, out, true, "kompress::stash::restore_and_drop");
  }
  template <float_view View>
  void restore_and_drop(const stash_handle& handle, const View& out) {
    restore_and_drop(state_->exec, handle, out);
  }

  /// Releases the entry's bytes now; the handle (and its copies) becomes invalid.
  void drop(const stash_handle& handle) { state_->drop(handle, "kompress::stash::drop"); }

  /// True if `handle` names a live entry of this stash.
  bool contains(const stash_handle& handle) const { return state_->contains(handle); }

  /// What the stash knows about one entry: shape, sizes, the bound used, where it is.
  stash_entry_info info(const stash_handle& handle) const { return state_->info(handle); }

  stash_stats stats() const { return state_->stats(); }

  /// Sets the high-water marks to the current values (e.g. between training steps).
  void reset_peaks() { state_->reset_peaks(); }

  const stash_options& options() const { return state_->options; }

 private:
  struct state;

  template <class View, std::size_t... I>
  static View allocate(const ExecutionSpace& exec, const std::array<std::size_t, 8>& extents,
                       std::index_sequence<I...>) {
    return View(Kokkos::view_alloc(exec, Kokkos::WithoutInitializing, "kompress::stash::restored"),
                extents[I]...);
  }

  std::unique_ptr<state> state_;
};

// ----------------------------------------------------------------------------------------------
// The implementation. Host-side bookkeeping sits behind one mutex; compression, copies and file
// I/O run outside it, on ranges the bookkeeping has handed out.
template <class ExecutionSpace>
struct stash<ExecutionSpace>::state {
  using bytes_view = Kokkos::View<std::byte*, memory_space>;
  using unmanaged_bytes = Kokkos::View<std::byte*, memory_space, Kokkos::MemoryUnmanaged>;
  using const_unmanaged_bytes =
      Kokkos::View<const std::byte*, memory_space, Kokkos::MemoryUnmanaged>;
  using host_unmanaged_bytes = Kokkos::View<std::byte*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>;
  /// The execution space can read host memory directly (decompress from a host spill).
  static constexpr bool exec_reads_host =
      Kokkos::SpaceAccessibility<ExecutionSpace, Kokkos::HostSpace>::accessible;
  /// The host can read the pool directly (write a spill file from it).
  static constexpr bool host_reads_pool =
      Kokkos::SpaceAccessibility<Kokkos::DefaultHostExecutionSpace, memory_space>::accessible;

  ExecutionSpace exec;
  stash_options options;
  detail::stash_tuning tuning;
  std::uint64_t id = 0;

  mutable std::mutex mutex;  // guards everything below except the workspace and the file
  bytes_view pool;
  detail::first_fit_allocator allocator;
  std::size_t workspace_offset = 0;
  std::size_t workspace_bytes = 0;
  std::vector<detail::stash_entry> entries;
  std::vector<std::uint32_t> free_slots;
  std::vector<detail::host_arena> host_arenas;
  stash_stats counters;
  std::size_t pool_stored_bytes = 0;  // streams in the pool
  std::size_t pool_held_bytes = 0;    // the workspace + streams in the pool, 64-byte aligned

  std::mutex workspace_mutex;  // the workspace and the host staging buffer
  Kokkos::View<std::byte*, Kokkos::HostSpace> host_staging;

  // save_async: the instance each pending entry was enqueued on, by slot (set exactly while the
  // entry is pending); one settlement at a time (it waits on those instances), with its
  // scratch list.
  std::vector<std::optional<ExecutionSpace>> saved_on;
  std::mutex settle_mutex;
  struct settle_job {
    std::uint32_t slot;
    std::size_t offset, reserved;
    ExecutionSpace exec;
    std::size_t length = 0;
    double abs_bound = 0.0;
  };
  std::vector<settle_job> settle_jobs;

  std::mutex file_mutex;  // the spill file's creation and allocator
  detail::spill_file file;
  detail::first_fit_allocator file_allocator;

  state(const ExecutionSpace& exec_, const stash_options& options_,
        const detail::stash_tuning& tuning_)
      : exec(exec_), options(options_), tuning(tuning_) {
    constexpr const char* who = "kompress::stash";
    detail::validate_block_size(options.block_size, who);
    if (options.segment_bytes < 8)
      throw invalid_argument(std::string(who) + ": segment_bytes must be at least 8 (got " +
                             std::to_string(options.segment_bytes) + ")");
    const budget_policy& policy = options.policy;
    if (policy.what == budget_policy::action::spill_file) {
      std::error_code ec;
      if (policy.directory.empty() || !std::filesystem::is_directory(policy.directory, ec))
        throw invalid_argument(std::string(who) + ": the spill directory '" +
                               policy.directory.string() + "' is not an existing directory");
    }
    if (policy.what == budget_policy::action::loosen_bound) {
      detail::validate_bound(policy.ceiling, "kompress::stash: the loosen_bound ceiling");
      if (!(policy.growth > 1.0) || !std::isfinite(policy.growth))
        throw invalid_argument(std::string(who) + ": loosen_bound growth must be finite and > 1 (got " +
                               std::to_string(policy.growth) + ")");
    }
    workspace_bytes = detail::first_fit_allocator::round_up(std::max(
        max_compressed_size<float>(detail::segment_values(options.segment_bytes, 4, options.block_size),
                                   options.block_size),
        max_compressed_size<double>(detail::segment_values(options.segment_bytes, 8, options.block_size),
                                    options.block_size)));
    const std::size_t capacity = options.budget_bytes / detail::first_fit_allocator::alignment *
                                 detail::first_fit_allocator::alignment;
    if (capacity < workspace_bytes + detail::first_fit_allocator::alignment)
      throw invalid_argument(std::string(who) + ": budget of " + std::to_string(options.budget_bytes) +
                             " bytes is too small: the workspace alone takes " +
                             std::to_string(workspace_bytes) + " bytes (one segment of " +
                             std::to_string(options.segment_bytes) +
                             " bytes at worst); raise budget_bytes or lower segment_bytes");

    std::random_device random;
    do {
      id = (std::uint64_t(random()) << 32) ^ std::uint64_t(random()) ^
           std::uint64_t(reinterpret_cast<std::uintptr_t>(this));
    } while (id == 0);

    pool = bytes_view(Kokkos::view_alloc(exec, Kokkos::WithoutInitializing, "kompress::stash::pool"),
                      capacity);
    exec.fence("kompress::stash: pool allocated");
    allocator.grow(capacity);
    workspace_offset = *allocator.allocate(workspace_bytes);
    pool_held_bytes = workspace_bytes;
    entries.reserve(64);
    saved_on.reserve(64);
    free_slots.reserve(64);
    counters.budget_bytes = capacity;
    counters.workspace_bytes = workspace_bytes;
    note_pool_usage();
  }

  ~state() {
    // A pending save may still be writing into the pool.
    for (std::optional<ExecutionSpace>& instance : saved_on)
      if (instance) instance->fence("kompress::stash: destroyed with a save_async pending");
  }

  // --- bookkeeping (mutex held) -----------------------------------------------------------
  /// Pool bytes held: the workspace and the streams, not the worst-case ranges saves borrow
  /// while they compress in place (they would have gone through the workspace otherwise), so
  /// peak_pool_bytes is the budget a run needed.
  void note_pool_usage() {
    counters.pool_bytes = pool_held_bytes;
    counters.peak_pool_bytes = std::max(counters.peak_pool_bytes, counters.pool_bytes);
    counters.peak_stored_bytes = std::max(counters.peak_stored_bytes, pool_stored_bytes);
  }

  detail::stash_entry& lookup(const stash_handle& handle, const char* who) {
    if (handle.empty())
      throw invalid_handle(std::string(who) + ": the handle is empty (default-constructed, not "
                                              "returned by save)");
    if (handle.stash_id != id)
      throw invalid_handle(std::string(who) + ": the handle belongs to another stash");
    if (handle.slot >= entries.size() || entries[handle.slot].generation != handle.generation ||
        !entries[handle.slot].live)
      throw invalid_handle(std::string(who) +
                           ": the handle's entry was dropped (a handle is valid from save until "
                           "drop or restore_and_drop)");
    return entries[handle.slot];
  }
  const detail::stash_entry& lookup(const stash_handle& handle, const char* who) const {
    return const_cast<state*>(this)->lookup(handle, who);
  }

  void free_segment(const detail::stash_segment& segment) {
    switch (segment.location) {
      case detail::segment_location::pool:
        allocator.free(segment.offset, segment.stream_bytes);
        pool_stored_bytes -= segment.stream_bytes;
        pool_held_bytes -= detail::first_fit_allocator::round_up(segment.stream_bytes);
        break;
      case detail::segment_location::host:
        host_arenas[segment.arena].allocator.free(segment.offset, segment.stream_bytes);
        counters.host_spilled_bytes -= segment.stream_bytes;
        break;
      case detail::segment_location::file:
        {
          std::lock_guard file_lock(file_mutex);
          file_allocator.free(segment.offset, segment.stream_bytes);
        }
        counters.file_spilled_bytes -= segment.stream_bytes;
        break;
    }
  }

  void free_segments(detail::stash_entry& entry) {
    for (const detail::stash_segment& segment : entry.segments) free_segment(segment);
    entry.segments.clear();
    note_pool_usage();
  }

  void release_slot(std::uint32_t slot) {
    detail::stash_entry& entry = entries[slot];
    entry.live = false;
    ++entry.generation;
    free_slots.push_back(slot);
  }

  // --- save -------------------------------------------------------------------------------
  template <class View>
  void check_save(const View& view, const error_bound& requested, const char* who) const {
    detail::validate_bound(requested, who);
    detail::require_contiguous(view, who, "the View");
    const budget_policy& policy = options.policy;
    if (policy.what == budget_policy::action::loosen_bound && policy.ceiling.mode != requested.mode)
      throw invalid_argument(std::string(who) + ": the loosen_bound ceiling (" +
                             detail::bound_text(policy.ceiling) +
                             ") and the save's bound (" + detail::bound_text(requested) +
                             ") must have the same mode");
  }

  /// Takes a slot; it is ours (not live, not on the free list) until published or released.
  /// Other threads may grow `entries` meanwhile, so touch it only under the lock. `local`
  /// receives the slot's segment vector (its capacity is reused) and the View's shape.
  template <class T, class View>
  std::uint32_t acquire_slot(const View& view, const error_bound& requested,
                             detail::stash_entry& local) {
    std::uint32_t slot;
    {
      std::lock_guard lock(mutex);
      if (!free_slots.empty()) {
        slot = free_slots.back();
        free_slots.pop_back();
      } else {
        slot = static_cast<std::uint32_t>(entries.size());
        entries.emplace_back();
        saved_on.emplace_back();
      }
      local.segments = std::move(entries[slot].segments);
    }
    local.segments.clear();
    local.type = detail::element_type_of<T>();
    local.rank = int(View::rank);
    local.count = view.size();
    for (int r = 0; r < int(View::rank); ++r) {
      local.extents[std::size_t(r)] = view.extent(std::size_t(r));
      local.strides[std::size_t(r)] = std::size_t(view.stride(std::size_t(r)));
    }
    local.requested = requested;
    return slot;
  }

  /// Makes the slot's entry live with `local`'s contents (mutex held) and returns its handle.
  stash_handle publish(std::uint32_t slot, detail::stash_entry& local) {
    detail::stash_entry& published = entries[slot];
    const std::uint32_t generation = published.generation;
    published = std::move(local);
    published.generation = generation;
    published.live = true;
    published.pins = 0;
    const std::size_t raw = published.count * published.element_size();
    const std::size_t stored = published.stored_bytes();
    ++counters.saves;
    ++counters.entries;
    counters.raw_bytes += raw;
    counters.stored_bytes += stored;
    counters.total_raw_bytes += raw;
    counters.total_stored_bytes += stored;
    counters.peak_raw_bytes = std::max(counters.peak_raw_bytes, counters.raw_bytes);
    if (published.used.value != published.requested.value) ++counters.loosened_saves;
    return stash_handle{id, slot, generation};
  }

  template <class T, class View>
  stash_handle save(const ExecutionSpace& exec_, const View& view, const error_bound& requested) {
    constexpr const char* who = "kompress::stash::save";
    Kokkos::Profiling::ScopedRegion region(who);
    check_save(view, requested, who);
    detail::stash_entry local;
    const std::uint32_t slot = acquire_slot<T>(view, requested, local);

    try {
      place_entry<T>(exec_, view, requested, local, who);
    } catch (...) {
      std::lock_guard lock(mutex);
      free_segments(local);
      entries[slot].segments = std::move(local.segments);
      release_slot(slot);
      throw;
    }

    std::lock_guard lock(mutex);
    return publish(slot, local);
  }

  // --- save_async ---------------------------------------------------------------------------
  template <class T, class View>
  stash_handle save_async(const ExecutionSpace& exec_, const View& view, const error_bound& requested) {
    constexpr const char* who = "kompress::stash::save_async";
    Kokkos::Profiling::ScopedRegion region(who);
    check_save(view, requested, who);
    const std::size_t count = view.size();
    if (count == 0) return save<T>(exec_, view, requested);  // no device work at all
    const std::size_t reserved = max_compressed_size<T>(count, options.block_size);
    std::optional<std::size_t> offset;
    bool others_pending;
    {
      std::lock_guard lock(mutex);
      offset = allocator.allocate(reserved);
      others_pending = counters.pending_saves > 0;
    }
    if (!offset && others_pending && settle(std::nullopt)) {
      std::lock_guard lock(mutex);
      offset = allocator.allocate(reserved);
    }
    // No room for the worst case: the synchronous path (segments, workspace, policy) can
    // still place it.
    if (!offset) return save<T>(exec_, view, requested);

    detail::stash_entry local;
    const std::uint32_t slot = acquire_slot<T>(view, requested, local);
    try {
      kompress::compress_async(
          exec_, Kokkos::View<const T*, typename View::memory_space, Kokkos::MemoryUnmanaged>(view.data(), count),
          unmanaged_bytes(pool.data() + *offset, reserved),
          compress_options{.bound = requested, .block_size = options.block_size});
    } catch (...) {
      std::lock_guard lock(mutex);
      allocator.free(*offset, reserved);
      entries[slot].segments = std::move(local.segments);
      release_slot(slot);
      throw;
    }
    detail::stash_segment segment;
    segment.count = count;
    segment.location = detail::segment_location::pool;
    segment.offset = *offset;
    local.segments.push_back(segment);
    local.used = requested;
    local.reserved_bytes = reserved;

    std::lock_guard lock(mutex);
    saved_on[slot] = exec_;
    ++counters.pending_saves;
    pool_held_bytes += detail::first_fit_allocator::round_up(reserved);
    note_pool_usage();
    return publish(slot, local);
  }

  /// Waits for the pending saves (all, or the one in `only`) on the instances they were
  /// enqueued on, then shrinks each reservation to its stream. Returns whether any was pending.
  /// Only this changes a pending entry, and drop and restore settle an entry before they touch
  /// it, so the slots stay valid while the lock is released for the waits.
  bool settle(std::optional<std::uint32_t> only) {
    std::lock_guard settle_lock(settle_mutex);
    settle_jobs.clear();
    {
      std::lock_guard lock(mutex);
      for (std::uint32_t slot = only.value_or(0);
           slot < (only ? *only + 1 : std::uint32_t(entries.size())); ++slot) {
        const detail::stash_entry& entry = entries[slot];
        if (entry.live && saved_on[slot])
          settle_jobs.push_back({slot, entry.segments.front().offset, entry.reserved_bytes,
                                 *saved_on[slot]});
      }
    }
    if (settle_jobs.empty()) return false;
    for (settle_job& job : settle_jobs) {
      job.exec.fence("kompress::stash: waiting for a save_async");
      const std::byte* stream = pool.data() + job.offset;
      job.length = detail::read_stream_field<std::uint64_t, memory_space>(
          job.exec, stream, detail::stream_length_offset);
      job.abs_bound = detail::read_stream_field<double, memory_space>(job.exec, stream,
                                                                      detail::abs_bound_offset);
    }
    std::lock_guard lock(mutex);
    for (const settle_job& job : settle_jobs) {
      detail::stash_entry& entry = entries[job.slot];
      allocator.shrink(job.offset, job.reserved, job.length);
      pool_held_bytes -= detail::first_fit_allocator::round_up(job.reserved) -
                         detail::first_fit_allocator::round_up(job.length);
      pool_stored_bytes += job.length;
      entry.segments.front().stream_bytes = job.length;
      entry.absolute_bound = job.abs_bound;
      entry.reserved_bytes = 0;
      saved_on[job.slot].reset();
      --counters.pending_saves;
      counters.stored_bytes += job.length;
      counters.total_stored_bytes += job.length;
    }
    note_pool_usage();
    return true;
  }

  /// Settles the handle's entry if its save_async is pending (throws for a bad handle).
  void settle_entry(const stash_handle& handle, const char* who) {
    bool pending;
    {
      std::lock_guard lock(mutex);
      lookup(handle, who);  // throws for a bad handle
      pending = saved_on[handle.slot].has_value();
    }
    if (pending) settle(handle.slot);
  }

  /// Places every segment of `view` within `requested`, loosening the bound if the policy says
  /// so. On return entry.segments holds them all; on a throw, what it holds is freed by the
  /// caller.
  template <class T, class View>
  void place_entry(const ExecutionSpace& exec_, const View& view, const error_bound& requested,
                   detail::stash_entry& entry, const char* who) {
    const std::size_t count = view.size();
    const T* const data = view.data();
    const std::size_t per_segment =
        detail::segment_values(options.segment_bytes, sizeof(T), options.block_size);
    const std::size_t segments = count == 0 ? 0 : (count + per_segment - 1) / per_segment;

    // A relative bound is relative to the whole View's range: over several segments it is
    // resolved once here, and every segment gets the same absolute bound.
    detail::value_range range;
    if (segments > 1 && requested.mode == bound_mode::relative)
      range = detail::compute_value_range(exec_, data, count, false, detail::bits_t<T>(0));

    error_bound bound = requested;
    std::string tried;
    while (true) {
      error_bound segment_bound = bound;
      if (segments > 1 && bound.mode == bound_mode::relative) {
        double e = range.empty() ? 0.0 : bound.value * (range.max - range.min);
        if (!(e <= 0x1p1000)) e = 0x1p1000;  // an overflowing range: the codec caps it too
        segment_bound = absolute(e);
      }
      entry.used = bound;
      entry.absolute_bound = 0.0;
      bool placed_all = true;
      detail::stash_segment failed;
      std::size_t failed_bytes = 0;
      for (std::size_t s = 0; s < segments; ++s) {
        detail::stash_segment segment;
        segment.first_value = s * per_segment;
        segment.count = std::min(per_segment, count - segment.first_value);
        Kokkos::View<const T*, typename View::memory_space, Kokkos::MemoryUnmanaged> values(
            data + segment.first_value, segment.count);
        double segment_abs_bound = 0.0;
        failed_bytes = place_segment<T>(exec_, values, segment_bound, segment, segment_abs_bound);
        if (failed_bytes != 0) {
          failed = segment;
          placed_all = false;
          break;
        }
        entry.segments.push_back(segment);
        entry.absolute_bound = std::max(entry.absolute_bound, segment_abs_bound);
      }
      if (placed_all) return;

      // The pool as the failing segment found it, then give back what this save placed.
      std::unique_lock lock(mutex);
      const std::size_t in_use = allocator.in_use(), largest = allocator.largest_free();
      free_segments(entry);
      lock.unlock();
      tried += (tried.empty() ? "" : ", ") + detail::bound_text(bound);
      const bool loosen = options.policy.what == budget_policy::action::loosen_bound &&
                          bound.value < options.policy.ceiling.value;
      if (loosen) {
        bound.value = bound.value > 0.0
                          ? std::min(bound.value * options.policy.growth, options.policy.ceiling.value)
                          : options.policy.ceiling.value;
        continue;
      }
      std::string message =
          std::string(who) + ": budget exceeded: a compressed segment of " +
          std::to_string(failed_bytes) + " bytes (values " + std::to_string(failed.first_value) +
          ".." + std::to_string(failed.first_value + failed.count) + " of " + std::to_string(count) +
          " " + detail::type_name<T>() + ", bound " + detail::bound_text(bound) +
          ") does not fit: the pool of " + std::to_string(allocator.capacity()) + " bytes has " +
          std::to_string(in_use) + " in use (the " + std::to_string(workspace_bytes) +
          "-byte workspace included) and its largest free range is " + std::to_string(largest) +
          " bytes";
      if (options.policy.what == budget_policy::action::loosen_bound)
        message += "; tried the bounds " + tried + " up to the ceiling " +
                   detail::bound_text(options.policy.ceiling);
      else
        message += " (policy " + std::string(detail::policy_name(options.policy.what)) +
                   "; see kompress::budget_policy)";
      throw budget_exceeded(message, failed_bytes, allocator.capacity(), in_use, largest);
    }
  }

  /// Compresses one segment and places its stream. Returns 0 when placed (segment filled in),
  /// or the aligned stream size that did not fit when the policy leaves it to the caller.
  template <class T, class InView>
  std::size_t place_segment(const ExecutionSpace& exec_, const InView& values,
                            const error_bound& bound, detail::stash_segment& segment,
                            double& abs_bound) {
    const compress_options compress{.bound = bound, .block_size = options.block_size};
    const std::size_t worst = max_compressed_size<T>(values.size(), options.block_size);

    if (tuning.compress_in_place) {
      std::optional<std::size_t> offset;
      {
        std::lock_guard lock(mutex);
        offset = allocator.allocate(worst);
      }
      if (offset) {
        std::size_t length = 0;
        try {
          length = kompress::compress(exec_, values, unmanaged_bytes(pool.data() + *offset, worst),
                                      compress);
          abs_bound = read_abs_bound(exec_, pool.data() + *offset);
        } catch (...) {
          std::lock_guard lock(mutex);
          allocator.free(*offset, worst);
          throw;
        }
        std::lock_guard lock(mutex);
        allocator.shrink(*offset, worst, length);
        pool_stored_bytes += length;
        pool_held_bytes += detail::first_fit_allocator::round_up(length);
        note_pool_usage();
        segment.location = detail::segment_location::pool;
        segment.offset = *offset;
        segment.stream_bytes = length;
        return 0;
      }
    }

    std::lock_guard workspace_lock(workspace_mutex);
    std::byte* const workspace = pool.data() + workspace_offset;
    const std::size_t length =
        kompress::compress(exec_, values, unmanaged_bytes(workspace, workspace_bytes), compress);
    abs_bound = read_abs_bound(exec_, workspace);
    const_unmanaged_bytes stream(workspace, length);
    segment.stream_bytes = length;

    std::optional<std::size_t> offset;
    bool pending_saves = false;
    for (int attempt = 0; attempt < 2 && !offset; ++attempt) {
      // Pending saves hold worst-case ranges: settle them before turning to the policy.
      if (attempt == 1 && !(pending_saves && settle(std::nullopt))) break;
      std::lock_guard lock(mutex);
      offset = allocator.allocate(length);
      pending_saves = counters.pending_saves > 0;
      if (offset) {
        pool_stored_bytes += length;
        pool_held_bytes += detail::first_fit_allocator::round_up(length);
        note_pool_usage();
      }
    }
    if (offset) {
      Kokkos::deep_copy(exec_, unmanaged_bytes(pool.data() + *offset, length), stream);
      exec_.fence("kompress::stash::save: stream copied into the pool");
      segment.location = detail::segment_location::pool;
      segment.offset = *offset;
      return 0;
    }

    switch (options.policy.what) {
      case budget_policy::action::spill_host: {
        {
          std::lock_guard lock(mutex);
          place_on_host(length, segment);
          counters.host_spilled_bytes += length;
          ++counters.spilled_segments;
        }
        Kokkos::deep_copy(exec_, host_unmanaged_bytes(segment.host_data + segment.offset, length),
                          stream);
        exec_.fence("kompress::stash::save: stream spilled to host memory");
        return 0;
      }
      case budget_policy::action::spill_file: {
        const std::byte* bytes = nullptr;
        if constexpr (host_reads_pool) {
          exec_.fence("kompress::stash::save: stream ready for the spill file");
          bytes = workspace;
        } else {
          if (host_staging.size() < length)
            host_staging = Kokkos::View<std::byte*, Kokkos::HostSpace>(
                Kokkos::view_alloc(Kokkos::WithoutInitializing, "kompress::stash::host_staging"),
                workspace_bytes);
          Kokkos::deep_copy(exec_, host_unmanaged_bytes(host_staging.data(), length), stream);
          exec_.fence("kompress::stash::save: stream staged for the spill file");
          bytes = host_staging.data();
        }
        segment.location = detail::segment_location::file;
        segment.offset = write_file(bytes, length);
        std::lock_guard lock(mutex);
        counters.file_spilled_bytes += length;
        ++counters.spilled_segments;
        return 0;
      }
      default:
        return detail::first_fit_allocator::round_up(length);
    }
  }

  /// The absolute bound a freshly written stream records (compress has waited for exec_).
  double read_abs_bound(const ExecutionSpace& exec_, const std::byte* stream) {
    return detail::read_stream_field<double, memory_space>(exec_, stream, detail::abs_bound_offset);
  }

  /// Host spill: a range in a host arena; arenas are added (never moved) as needed.
  void place_on_host(std::size_t length, detail::stash_segment& segment) {
    for (std::size_t a = 0; a < host_arenas.size(); ++a) {
      if (auto offset = host_arenas[a].allocator.allocate(length)) {
        segment.location = detail::segment_location::host;
        segment.arena = a;
        segment.offset = *offset;
        segment.host_data = host_arenas[a].bytes.data();
        return;
      }
    }
    const std::size_t previous = host_arenas.empty() ? 0 : host_arenas.back().allocator.capacity();
    const std::size_t capacity = detail::first_fit_allocator::round_up(
        std::max({length, 2 * previous, std::size_t(16) << 20, options.budget_bytes / 4}));
    detail::host_arena arena;
    arena.bytes = Kokkos::View<std::byte*, Kokkos::HostSpace>(
        Kokkos::view_alloc(Kokkos::WithoutInitializing, "kompress::stash::host_spill"), capacity);
    arena.allocator.grow(capacity);
    host_arenas.push_back(std::move(arena));
    place_on_host(length, segment);
  }

  std::size_t write_file(const std::byte* bytes, std::size_t length) {
    constexpr const char* who = "kompress::stash::save";
    std::optional<std::size_t> offset;
    {
      std::lock_guard file_lock(file_mutex);
      if (!file.is_open()) file.create(options.policy.directory, id, who);
      offset = file_allocator.allocate(length);
      if (!offset) {
        file_allocator.grow(file_allocator.capacity() +
                            std::max(detail::first_fit_allocator::round_up(length),
                                     file_allocator.capacity()));
        offset = file_allocator.allocate(length);
      }
    }
    try {
      file.write(*offset, bytes, length, who);  // pwrite: no lock needed for disjoint ranges
    } catch (...) {
      std::lock_guard file_lock(file_mutex);
      file_allocator.free(*offset, length);
      throw;
    }
    return *offset;
  }

  void read_file(std::size_t offset, std::byte* bytes, std::size_t length, const char* who) {
    file.read(offset, bytes, length, who);
  }

  // --- restore ----------------------------------------------------------------------------
  template <class View>
  void restore(const ExecutionSpace& exec_, const stash_handle& handle, const View& out,
               bool then_drop, const char* who) {
    using T = typename View::non_const_value_type;
    Kokkos::Profiling::ScopedRegion region(who);
    settle_entry(handle, who);
    // Pin the entry: its segments cannot change or be freed until it is unpinned, so they are
    // read below without the lock (entries may move when other threads save, the segments'
    // storage does not).
    const detail::stash_segment* segments;
    std::size_t segment_count;
    {
      std::lock_guard lock(mutex);
      detail::stash_entry& entry = lookup(handle, who);
      check_output(entry, out, who);
      ++entry.pins;
      segments = entry.segments.data();
      segment_count = entry.segments.size();
    }
    struct unpin_on_throw {
      state* self;
      std::uint32_t slot;
      ~unpin_on_throw() {
        if (!self) return;
        std::lock_guard lock(self->mutex);
        --self->entries[slot].pins;
      }
    } guard{this, handle.slot};

    for (std::size_t s = 0; s < segment_count; ++s) {
      const detail::stash_segment& segment = segments[s];
      Kokkos::View<T*, typename View::memory_space, Kokkos::MemoryUnmanaged> values(
          out.data() + segment.first_value, segment.count);
      switch (segment.location) {
        case detail::segment_location::pool:
          decompress(exec_, const_unmanaged_bytes(pool.data() + segment.offset, segment.stream_bytes),
                     values);
          break;
        case detail::segment_location::host:
          if constexpr (exec_reads_host) {
            decompress(exec_,
                       Kokkos::View<const std::byte*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>(
                           segment.host_data + segment.offset, segment.stream_bytes),
                       values);
          } else {
            std::lock_guard workspace_lock(workspace_mutex);
            unmanaged_bytes workspace(pool.data() + workspace_offset, segment.stream_bytes);
            Kokkos::deep_copy(exec_, workspace,
                              host_unmanaged_bytes(segment.host_data + segment.offset,
                                                   segment.stream_bytes));
            decompress(exec_, workspace, values);
          }
          break;
        case detail::segment_location::file: {
          std::lock_guard workspace_lock(workspace_mutex);
          if constexpr (host_reads_pool) {
            read_file(segment.offset, pool.data() + workspace_offset, segment.stream_bytes, who);
          } else {
            if (host_staging.size() < segment.stream_bytes)
              host_staging = Kokkos::View<std::byte*, Kokkos::HostSpace>(
                  Kokkos::view_alloc(Kokkos::WithoutInitializing, "kompress::stash::host_staging"),
                  workspace_bytes);
            read_file(segment.offset, host_staging.data(), segment.stream_bytes, who);
            Kokkos::deep_copy(exec_, unmanaged_bytes(pool.data() + workspace_offset, segment.stream_bytes),
                              host_unmanaged_bytes(host_staging.data(), segment.stream_bytes));
          }
          decompress(exec_, const_unmanaged_bytes(pool.data() + workspace_offset, segment.stream_bytes),
                     values);
          break;
        }
      }
    }
    guard.self = nullptr;
    std::lock_guard lock(mutex);
    detail::stash_entry& entry = entries[handle.slot];
    --entry.pins;
    ++counters.restores;
    if (then_drop && entry.pins == 0) drop_locked(entry, handle.slot);
    else if (then_drop)
      throw invalid_handle(std::string(who) +
                           ": restored, but not dropped: another thread is restoring the entry");
  }

  template <class View>
  void check_output(const detail::stash_entry& entry, const View& out, const char* who) const {
    using T = typename View::non_const_value_type;
    if (entry.type != detail::element_type_of<T>())
      throw invalid_argument(std::string(who) + ": the entry holds " +
                             (entry.type == element_type::float32 ? "float" : "double") +
                             " values but the output View is of " + detail::type_name<T>());
    if (out.size() != entry.count)
      throw invalid_argument(std::string(who) + ": the entry holds " + std::to_string(entry.count) +
                             " values but the output View has " + std::to_string(out.size()));
    detail::require_contiguous(out, who, "the output View");
    if (int(View::rank) == 1 || entry.count == 0) return;  // rank 1: the values in memory order
    bool same = int(View::rank) == entry.rank;
    for (int r = 0; same && r < entry.rank; ++r) {
      const std::size_t extent = out.extent(std::size_t(r));
      same = extent == entry.extents[std::size_t(r)] &&
             (extent == 1 || std::size_t(out.stride(std::size_t(r))) == entry.strides[std::size_t(r)]);
    }
    if (!same)
      throw invalid_argument(std::string(who) + ": the output View's shape or layout differs from "
                                                "the saved View's (saved extents " +
                             extents_text(entry) +
                             "); give a View of the same extents and layout, or a rank-1 View");
  }

  static std::string extents_text(const detail::stash_entry& entry) {
    std::string text = "[";
    for (int r = 0; r < entry.rank; ++r)
      text += (r ? ", " : "") + std::to_string(entry.extents[std::size_t(r)]);
    return text + "]";
  }

  // --- drop, info, stats ------------------------------------------------------------------
  void drop_locked(detail::stash_entry& entry, std::uint32_t slot) {
    const std::size_t raw = entry.count * entry.element_size();
    counters.raw_bytes -= raw;
    counters.stored_bytes -= entry.stored_bytes();
    --counters.entries;
    ++counters.drops;
    free_segments(entry);
    release_slot(slot);
  }

  void drop(const stash_handle& handle, const char* who) {
    settle_entry(handle, who);  // its save may still be writing the range
    std::lock_guard lock(mutex);
    detail::stash_entry& entry = lookup(handle, who);
    if (entry.pins > 0)
      throw invalid_handle(std::string(who) + ": the entry is being restored by another thread");
    drop_locked(entry, handle.slot);
  }

  bool contains(const stash_handle& handle) const {
    std::lock_guard lock(mutex);
    return handle.stash_id == id && !handle.empty() && handle.slot < entries.size() &&
           entries[handle.slot].live && entries[handle.slot].generation == handle.generation;
  }

  stash_entry_info info(const stash_handle& handle) const {
    const_cast<state*>(this)->settle_entry(handle, "kompress::stash::info");
    std::lock_guard lock(mutex);
    const detail::stash_entry& entry = lookup(handle, "kompress::stash::info");
    stash_entry_info result;
    result.type = entry.type;
    result.rank = entry.rank;
    result.extents = entry.extents;
    result.count = entry.count;
    result.raw_bytes = entry.count * entry.element_size();
    result.stored_bytes = entry.stored_bytes();
    result.requested_bound = entry.requested;
    result.used_bound = entry.used;
    result.absolute_bound = entry.absolute_bound;
    result.segments = entry.segments.size();
    for (const detail::stash_segment& segment : entry.segments) {
      switch (segment.location) {
        case detail::segment_location::pool: ++result.placement.pool_segments; break;
        case detail::segment_location::host: ++result.placement.host_segments; break;
        case detail::segment_location::file: ++result.placement.file_segments; break;
      }
    }
    return result;
  }

  stash_stats stats() const {
    std::lock_guard lock(mutex);
    return counters;
  }

  void reset_peaks() {
    std::lock_guard lock(mutex);
    counters.peak_raw_bytes = counters.raw_bytes;
    counters.peak_pool_bytes = counters.pool_bytes;
    counters.peak_stored_bytes = pool_stored_bytes;
  }
};

}  // namespace v0
}  // namespace kompress
