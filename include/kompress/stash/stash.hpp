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
// segments of at most options.segment_bytes: each segment is compressed into the workspace
// and stored in the first storage tier with room: the pool, its header cut to a 16-byte frame
// (stash/detail/piece_frame.hpp), then, whole, the tiers the budget policy adds (host memory,
// a file: stash/detail/tiers.hpp). While another thread holds the workspace, a segment is
// compressed straight into the pool where a worst-case range is free, whole.
//
// The parts: this facade; the entry table (stash/detail/entry_table.hpp); pending saves
// (stash/detail/pending_saves.hpp); the storage tiers (stash/detail/tier.hpp and *_tier.hpp).
// The stash uses the codec's public API (compress.hpp), and its header checks and decoder to
// read the streams it keeps in the pool without their headers (stash/detail/piece_frame.hpp).
//
// Sync points (nothing here fences the whole device or any instance but those passed in):
//   save_async  enqueues the compression on `exec` into a worst-case range of the pool and
//             returns without waiting; the stash settles the entry (waits for that instance,
//             moves the stream down to a free range of its length or gives the range's unused
//             tail back) in fence(), in restore/info/drop of it, when async_window saves are
//             pending, or when a save needs the room. `view` must not change until `exec` has
//             run it. With keep_sign it saves as save does.
//   save      reads the View and writes the pool through `exec` only, and returns when the
//             streams are in place: it waits for `exec` (a relative bound over more than one
//             segment or with keep_sign adds a value-range reduction; a copy out of the
//             workspace or to the host or a file adds one more wait). If another instance
//             produced the View, fence that instance first.
//   restore   writes `out` through `exec` and returns when `out` holds the values (it waits
//             for `exec`: kompress::decompress verifies checksums before and after decoding).
//   drop      no device work and no wait, unless the entry's save_async is still pending.
// Thread safety: every member function may be called concurrently from several host threads,
// each on its own execution space instance. Dropping a handle while another thread restores it
// throws kompress::invalid_handle.

#include <kompress/bound.hpp>
#include <kompress/compress.hpp>
#include <kompress/concepts.hpp>
#include <kompress/detail/arguments.hpp>
#include <kompress/error.hpp>
#include <kompress/format.hpp>
#include <kompress/stash/detail/entry_table.hpp>
#include <kompress/stash/detail/group_scales.hpp>
#include <kompress/stash/detail/pending_saves.hpp>
#include <kompress/stash/detail/piece_frame.hpp>
#include <kompress/stash/detail/pool_tier.hpp>
#include <kompress/stash/detail/sign_bits.hpp>
#include <kompress/stash/detail/sign_code.hpp>
#include <kompress/stash/detail/tier.hpp>
#include <kompress/stash/detail/tiers.hpp>
#include <kompress/stash/detail/tuning.hpp>
#include <kompress/stash/handle.hpp>
#include <kompress/stash/options.hpp>
#include <kompress/stash/policy.hpp>
#include <kompress/stash/save_options.hpp>
#include <kompress/stash/stats.hpp>

#include <Kokkos_Core.hpp>
#include <Kokkos_Profiling_ScopedRegion.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

namespace kompress {
inline namespace v0 {
namespace detail {

// A range of sign bits ends in their sum and count, read in place as a complex<double>.
static_assert(first_fit_allocator::alignment % alignof(Kokkos::complex<double>) == 0);

inline std::string bound_text(const error_bound& bound) {
  return (bound.mode == bound_mode::relative ? "REL " : "ABS ") + number_text(bound.value);
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

template <class ExecutionSpace>
class stash;

namespace detail {

/// A stash with a tuning other than its backend's default (what bench/stash compares).
template <class ExecutionSpace>
stash<ExecutionSpace> tuned_stash(const ExecutionSpace& exec, const stash_options& options,
                                  const stash_tuning& tuning);

}  // namespace detail

template <class ExecutionSpace = Kokkos::DefaultExecutionSpace>
class stash {
  static_assert(execution_space<ExecutionSpace>,
                "kompress::stash: the template argument must be a Kokkos execution space");

 public:
  using execution_space = ExecutionSpace;
  using memory_space = typename ExecutionSpace::memory_space;

  /// Allocates the pool (options.budget_bytes in memory_space) on `exec`; waits for `exec`.
  stash(const ExecutionSpace& exec, const stash_options& options)
      : stash(exec, options, detail::default_stash_tuning<ExecutionSpace>()) {}
  explicit stash(const stash_options& options) : stash(ExecutionSpace{}, options) {}

  stash(stash&&) noexcept = default;
  stash& operator=(stash&&) noexcept = default;
  stash(const stash&) = delete;
  stash& operator=(const stash&) = delete;
  /// Releases the pool and removes the spill file. Handles into it become invalid.
  ~stash() = default;

  // ------------------------------------------------------------------------------------------
  /// Compresses `view` (float or double, any rank, contiguous) within `bound` into the stash
  /// and returns its handle; `how` picks the codec and keeps the sign bits (docs/stash.md,
  /// "Per-save options"). Reads `view` through `exec` and waits for `exec` (see the top of
  /// this header). A zero-size View makes an entry of 0 bytes. Throws invalid_argument for a
  /// strided View or an invalid bound, budget_exceeded when the policy cannot place it (the
  /// stash is then unchanged).
  template <float_view View>
  stash_handle save(const ExecutionSpace& exec, const View& view, const error_bound& bound,
                    const stash_save_options& how = {}) {
    static_assert(Kokkos::SpaceAccessibility<ExecutionSpace, typename View::memory_space>::accessible,
                  "kompress::stash::save: the View must be accessible from the stash's execution space");
    return state_->template save<typename View::non_const_value_type>(exec, view, bound, how);
  }
  template <float_view View>
  stash_handle save(const View& view, const error_bound& bound, const stash_save_options& how = {}) {
    return save(state_->exec, view, bound, how);
  }

  /// Enqueues the compression of `view` on `exec` and returns its handle without waiting for
  /// it. Until `exec` has finished the save (exec.fence(), or any stash call that settles the
  /// entry: see docs/stash.md "Asynchronous saves"), `view` must not change. The entry is one
  /// stream compressed in place into a worst-case range of the pool, held until the stash
  /// settles it: fence(), restore, info or drop of the entry, or a save that needs the room.
  /// When the pool has no such range even after settling, this saves as save() does (and
  /// waits); so does a keep_sign save (its streams' lengths are counts the host must learn),
  /// and a stash_codec::automatic save whose layer is due a measurement, until the codec is
  /// chosen. Throws what save throws.
  template <float_view View>
  stash_handle save_async(const ExecutionSpace& exec, const View& view, const error_bound& bound,
                          const stash_save_options& how = {}) {
    static_assert(Kokkos::SpaceAccessibility<ExecutionSpace, typename View::memory_space>::accessible,
                  "kompress::stash::save_async: the View must be accessible from the stash's "
                  "execution space");
    return state_->template save_async<typename View::non_const_value_type>(exec, view, bound, how);
  }
  template <float_view View>
  stash_handle save_async(const View& view, const error_bound& bound, const stash_save_options& how = {}) {
    return save_async(state_->exec, view, bound, how);
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

  stash(const ExecutionSpace& exec, const stash_options& options, const detail::stash_tuning& tuning)
      : state_(std::make_unique<state>(exec, options, tuning)) {}
  friend stash detail::tuned_stash<ExecutionSpace>(const ExecutionSpace&, const stash_options&,
                                                   const detail::stash_tuning&);
};

template <class ExecutionSpace>
stash<ExecutionSpace> detail::tuned_stash(const ExecutionSpace& exec, const stash_options& options,
                                          const stash_tuning& tuning) {
  return stash<ExecutionSpace>(exec, options, tuning);
}

// ----------------------------------------------------------------------------------------------
// The implementation. The entry table and the counters sit behind one mutex, each tier guards
// its own bookkeeping; compression, copies and file I/O run outside the locks, on ranges the
// bookkeeping has handed out.
template <class ExecutionSpace>
struct stash<ExecutionSpace>::state {
  using unmanaged_bytes = Kokkos::View<std::byte*, memory_space, Kokkos::MemoryUnmanaged>;
  using const_unmanaged_bytes =
      Kokkos::View<const std::byte*, memory_space, Kokkos::MemoryUnmanaged>;
  using const_host_bytes = Kokkos::View<const std::byte*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>;
  using tier = detail::storage_tier<ExecutionSpace>;
  using pool_tier = detail::pool_tier<ExecutionSpace>;

  ExecutionSpace exec;
  stash_options options;
  detail::stash_tuning tuning;
  std::uint64_t id = 0;
  /// The workspace: one segment's worst case (workspace_bytes), then the sign scratch (the sign
  /// bits of a segment of floats, sign_scratch_bytes), both part of the pool's first range.
  std::size_t workspace_bytes = 0;
  std::size_t sign_scratch_bytes = 0;
  std::uint64_t saves_begun = 0;  ///< numbers the saves (mutex): their rounding seeds

  /// tiers[0] is the pool; the policy's spill tiers follow, in order. Made once, never changed.
  std::vector<std::unique_ptr<tier>> tiers;
  pool_tier* pool = nullptr;

  mutable std::mutex mutex;  // the entry table, the pending saves' instances and the counters
  detail::entry_table entries{0};
  detail::pending_saves<ExecutionSpace> pending;
  stash_stats counters;  // the tiers' fields are filled in by stats()

  std::mutex workspace_mutex;  // the workspace (compression, and loads into it)

  /// stash_codec::automatic's choice per layer, and how many saves have used it (under mutex).
  struct layer_codec {
    codec_mode codec = codec_mode::fast;
    std::uint32_t saves = 0;
  };
  std::unordered_map<std::uint32_t, layer_codec> layer_codecs;

  state(const ExecutionSpace& exec_, const stash_options& options_,
        const detail::stash_tuning& tuning_)
      : exec(exec_), options(options_), tuning(tuning_) {
    constexpr const char* who = "kompress::stash";
    detail::validate_options(options.codec, "kompress::stash: options.codec");
    if (options.codec.bound.value != 0.0)
      throw invalid_argument(std::string(who) + ": options.codec.bound must be lossless() (got " +
                             detail::bound_text(options.codec.bound) +
                             "): the bound is given to each save");
    if (options.segment_bytes < 8)
      throw invalid_argument(std::string(who) + ": segment_bytes must be at least 8 (got " +
                             std::to_string(options.segment_bytes) + ")");
    const budget_policy& policy = options.policy;
    if (policy.what == budget_policy::action::loosen_bound) {
      detail::validate_bound(policy.ceiling, "kompress::stash: the loosen_bound ceiling");
      if (!(policy.growth > 1.0) || !std::isfinite(policy.growth))
        throw invalid_argument(std::string(who) + ": loosen_bound growth must be finite and > 1 (got " +
                               detail::number_text(policy.growth) + ")");
    }
    if (!(options.ratio_codec_min_saving >= 0.0 && options.ratio_codec_min_saving < 1.0))
      throw invalid_argument(std::string(who) + ": ratio_codec_min_saving must be in [0, 1) (got " +
                             detail::number_text(options.ratio_codec_min_saving) + ")");
    if (options.codec_remeasure_saves < 1)
      throw invalid_argument(std::string(who) + ": codec_remeasure_saves must be at least 1");
    if (options.async_window < 1) throw invalid_argument(std::string(who) + ": async_window must be at least 1");
    // The workspace holds one segment's worst case in either codec (a save may pick either).
    const int block_size = options.codec.block_size;
    for (const codec_mode mode : {codec_mode::fast, codec_mode::ratio}) {
      const compress_options codec = codec_with(lossless(), mode);
      workspace_bytes = std::max(
          {workspace_bytes,
           max_compressed_size<float>(detail::segment_values(options.segment_bytes, 4, block_size), codec),
           max_compressed_size<double>(detail::segment_values(options.segment_bytes, 8, block_size), codec)});
    }
    workspace_bytes = detail::first_fit_allocator::round_up(workspace_bytes);
    // After it, the sign bits of a segment of floats (keep_sign saves write and read them there).
    sign_scratch_bytes = detail::first_fit_allocator::round_up(
        detail::sign_bytes(detail::segment_values(options.segment_bytes, 4, block_size)));
    const std::size_t capacity = options.budget_bytes / detail::first_fit_allocator::alignment *
                                 detail::first_fit_allocator::alignment;
    if (capacity < workspace_bytes + sign_scratch_bytes + detail::first_fit_allocator::alignment)
      throw invalid_argument(std::string(who) + ": budget of " + std::to_string(options.budget_bytes) +
                             " bytes is too small: the workspace alone takes " +
                             std::to_string(workspace_bytes + sign_scratch_bytes) + " bytes (one segment of " +
                             std::to_string(options.segment_bytes) +
                             " bytes at worst); raise budget_bytes or lower segment_bytes");

    std::random_device random;
    do {
      id = (std::uint64_t(random()) << 32) ^ std::uint64_t(random()) ^
           std::uint64_t(reinterpret_cast<std::uintptr_t>(this));
    } while (id == 0);
    entries = detail::entry_table(id);

    // The spill tiers first: they check the policy's arguments before the pool is allocated.
    auto spill = detail::make_spill_tiers<ExecutionSpace>(
        policy, {.stash_id = id, .budget_bytes = options.budget_bytes, .largest_stream = workspace_bytes});
    auto made_pool = std::make_unique<pool_tier>(exec, capacity, workspace_bytes + sign_scratch_bytes);
    pool = made_pool.get();
    tiers.push_back(std::move(made_pool));
    for (auto& t : spill) tiers.push_back(std::move(t));
  }

  ~state() { pending.fence_all(); }  // a pending save may still be writing into the pool

  compress_options codec_with(const error_bound& bound, codec_mode mode) const {
    compress_options codec = options.codec;
    codec.bound = bound;
    codec.codec = mode;
    return codec;
  }

  rounding_mode rounding_of(const stash_save_options& how) const {
    return how.rounding.value_or(options.codec.rounding);
  }

  /// The options of stream `stream` of `entry`: its rounding, seeded per save and stream (each
  /// stream's dither restarts at index 0), splitmix64 over the stash's seed.
  compress_options stream_codec(const error_bound& bound, codec_mode mode, const detail::stash_entry& entry,
                                std::size_t stream) const {
    compress_options codec = codec_with(bound, mode);
    codec.rounding = entry.rounding;
    std::uint64_t z = options.codec.rounding_seed + 0x9E3779B97F4A7C15ull * (2 * entry.save_number + 1) +
                      0xBF58476D1CE4E5B9ull * std::uint64_t(stream);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    codec.rounding_seed = z ^ (z >> 31);
    return codec;
  }

  /// The codec of a save: the one `how` names (or the stash's), or stash_codec::automatic's
  /// choice: the layer's, or measured by compressing `sample` (the save's first segment)
  /// within `bound` with both codecs in the workspace.
  template <class SampleView>
  codec_mode choose_codec(const ExecutionSpace& exec_, const SampleView& sample, const error_bound& bound,
                          const stash_save_options& how) {
    const stash_codec asked = how.codec.value_or(
        options.codec.codec == codec_mode::ratio ? stash_codec::ratio : stash_codec::fast);
    if (asked != stash_codec::automatic)
      return asked == stash_codec::ratio ? codec_mode::ratio : codec_mode::fast;
    if (sample.size() == 0) return codec_mode::fast;  // nothing to measure, nothing to store
    if (how.layer) {
      std::lock_guard lock(mutex);
      const auto found = layer_codecs.find(*how.layer);
      if (found != layer_codecs.end() && found->second.saves < options.codec_remeasure_saves) {
        ++found->second.saves;
        return found->second.codec;
      }
    }
    codec_mode chosen = codec_mode::fast;
    {
      std::lock_guard workspace_lock(workspace_mutex);
      const unmanaged_bytes workspace_range(pool->workspace(), workspace_bytes);
      compress_options trial = codec_with(bound, codec_mode::fast);
      trial.rounding = rounding_of(how);
      const double fast = double(kompress::compress(exec_, sample, workspace_range, trial));
      trial.codec = codec_mode::ratio;
      const double ratio = double(kompress::compress(exec_, sample, workspace_range, trial));
      if (ratio <= (1.0 - options.ratio_codec_min_saving) * fast) chosen = codec_mode::ratio;
    }
    std::lock_guard lock(mutex);
    ++counters.codec_measurements;
    if (how.layer) layer_codecs[*how.layer] = {chosen, 1};
    return chosen;
  }

  bool asks_automatic(const stash_save_options& how) const {
    return how.codec.value_or(options.codec.codec == codec_mode::ratio ? stash_codec::ratio : stash_codec::fast) ==
           stash_codec::automatic;
  }

  /// The pool bytes that `count` scaled values of T take (a reservation, counted as held).
  template <class T>
  static std::size_t scaled_bytes(std::size_t count) {
    return detail::first_fit_allocator::round_up(count * sizeof(T));
  }

  /// Scales values [first, first + count) of a group_relative save at `data` into a reservation
  /// of the pool and calls `use(const T* scaled)`; returns false (calling nothing) when the pool
  /// has no room for them. The reservation is counted as held while it lives.
  template <class T, class Use>
  bool with_scaled(const ExecutionSpace& exec_, const T* data, std::size_t first, std::size_t count,
                   const detail::group_exponent* exponents, Use&& use) {
    const std::size_t bytes = scaled_bytes<T>(count);
    const std::optional<std::size_t> offset = pool->reserve(bytes);
    if (!offset) return false;
    try {
      T* const scaled = reinterpret_cast<T*>(pool->data() + *offset);
      detail::scale_down_groups(exec_, data, first, count, exponents, scaled);
      use(static_cast<const T*>(scaled));
      exec_.fence("kompress::stash::save: scaled values read");
    } catch (...) {
      pool->unreserve(*offset, bytes);
      throw;
    }
    pool->unreserve(*offset, bytes);
    return true;
  }

  /// choose_codec for a group_relative save: measured on its first `count` values scaled.
  /// Nothing when the pool has no room for them.
  template <class T>
  std::optional<codec_mode> choose_codec_scaled(const ExecutionSpace& exec_, const T* data, std::size_t count,
                                                const detail::group_exponent* exponents, const error_bound& bound,
                                                const stash_save_options& how) {
    std::optional<codec_mode> chosen;
    with_scaled<T>(exec_, data, 0, count, exponents, [&](const T* scaled) {
      chosen = choose_codec(exec_, Kokkos::View<const T*, memory_space, Kokkos::MemoryUnmanaged>(scaled, count),
                            bound, how);
    });
    return chosen;
  }

  static stash_save_options with_codec(stash_save_options how, codec_mode mode) {
    how.codec = mode == codec_mode::ratio ? stash_codec::ratio : stash_codec::fast;
    return how;
  }

  // --- bookkeeping ------------------------------------------------------------------------
  /// Frees the segments' streams in their tiers (the entry's own mutex held or not needed).
  void free_segments(detail::stash_entry& entry) {
    for (const detail::stash_segment& segment : entry.segments)
      if (segment.has_range()) tiers[segment.tier]->release(segment.offset, segment.range_bytes());
    entry.segments.clear();
  }

  // --- save -------------------------------------------------------------------------------
  template <class View>
  void check_save(const View& view, const error_bound& requested, const stash_save_options& how,
                  const char* who) const {
    detail::validate_bound(requested, who);
    if (how.group_relative)
      detail::check_group_relative(requested.mode == bound_mode::relative, requested.value, who);
    detail::require_contiguous(view, who, "the View");
    const budget_policy& policy = options.policy;
    if (policy.what == budget_policy::action::loosen_bound && policy.ceiling.mode != requested.mode)
      throw invalid_argument(std::string(who) + ": the loosen_bound ceiling (" +
                             detail::bound_text(policy.ceiling) +
                             ") and the save's bound (" + detail::bound_text(requested) +
                             ") must have the same mode");
  }

  /// Takes a slot for a save; `local` receives its segment vector and the View's shape.
  template <class T, class View>
  std::uint32_t acquire_slot(const View& view, const error_bound& requested, const stash_save_options& how,
                             detail::stash_entry& local) {
    std::uint32_t slot;
    {
      std::lock_guard lock(mutex);
      slot = entries.acquire(local);
      local.save_number = saves_begun++;
    }
    local.type = detail::element_type_of<T>();
    local.rank = int(View::rank);
    local.count = view.size();
    for (int r = 0; r < int(View::rank); ++r) {
      local.extents[std::size_t(r)] = view.extent(std::size_t(r));
      local.strides[std::size_t(r)] = std::size_t(view.stride(std::size_t(r)));
    }
    local.requested = requested;
    local.rounding = rounding_of(how);
    return slot;
  }

  /// Publishes the slot's entry (mutex held) and counts the save.
  stash_handle publish(std::uint32_t slot, detail::stash_entry& local) {
    const std::size_t raw = local.raw_bytes();
    const std::size_t stored = local.stored_bytes();
    const bool loosened = local.used.value != local.requested.value;
    const std::size_t signs = local.sign_bytes();
    const bool ratio = local.codec == codec_mode::ratio;
    const stash_handle handle = entries.publish(slot, local);
    ++counters.saves;
    counters.sign_bytes += signs;
    if (ratio) ++counters.ratio_codec_saves;
    ++counters.entries;
    counters.raw_bytes += raw;
    counters.stored_bytes += stored;
    counters.total_raw_bytes += raw;
    counters.total_stored_bytes += stored;
    counters.peak_raw_bytes = std::max(counters.peak_raw_bytes, counters.raw_bytes);
    if (loosened) ++counters.loosened_saves;
    return handle;
  }

  template <class T, class View>
  stash_handle save(const ExecutionSpace& exec_, const View& view, const error_bound& requested,
                    const stash_save_options& how) {
    constexpr const char* who = "kompress::stash::save";
    Kokkos::Profiling::ScopedRegion region(who);
    check_save(view, requested, how, who);
    detail::stash_entry local;
    const std::uint32_t slot = acquire_slot<T>(view, requested, how, local);
    try {
      place_entry<T>(exec_, view, requested, how, local, who);
    } catch (...) {
      free_segments(local);
      std::lock_guard lock(mutex);
      entries.release(slot, std::move(local.segments));
      throw;
    }
    std::lock_guard lock(mutex);
    return publish(slot, local);
  }

  // --- save_async -------------------------------------------------------------------------
  template <class T, class View>
  stash_handle save_async(const ExecutionSpace& exec_, const View& view, const error_bound& requested,
                          const stash_save_options& how) {
    using values_view = Kokkos::View<const T*, typename View::memory_space, Kokkos::MemoryUnmanaged>;
    constexpr const char* who = "kompress::stash::save_async";
    Kokkos::Profiling::ScopedRegion region(who);
    check_save(view, requested, how, who);
    const std::size_t count = view.size();
    if (count == 0) return save<T>(exec_, view, requested, how);  // no device work at all
    // keep_sign stores a ReLU's output as its positive values alone, and only the host can
    // place a stream of a length the device counts: such saves wait, as save does.
    // So do group_relative saves, whose exponents are found before the first stream.
    if (how.keep_sign || how.group_relative) return save<T>(exec_, view, requested, how);
    const std::size_t sample =
        std::min(count, detail::segment_values(options.segment_bytes, sizeof(T), options.codec.block_size));
    const codec_mode mode = choose_codec(exec_, values_view(view.data(), sample), requested, how);
    const compress_options codec = codec_with(requested, mode);
    const std::size_t reserved = max_compressed_size<T>(count, codec);
    // The window: the oldest pending saves settle first, so at most async_window worst-case
    // ranges are held at once.
    while (true) {
      std::optional<std::uint32_t> oldest;
      {
        std::lock_guard lock(mutex);
        if (pending.count >= options.async_window) oldest = pending.oldest();
      }
      if (!oldest) break;
      settle(*oldest);
    }
    std::optional<std::size_t> offset = pool->reserve(reserved);
    bool others_pending;
    {
      std::lock_guard lock(mutex);
      others_pending = pending.count > 0;
    }
    if (!offset && others_pending && settle(std::nullopt)) offset = pool->reserve(reserved);
    // No room for the worst case: the synchronous path (segments, workspace, tiers) can
    // still place it.
    if (!offset) return save<T>(exec_, view, requested, with_codec(how, mode));

    detail::stash_entry local;
    const std::uint32_t slot = acquire_slot<T>(view, requested, how, local);
    try {
      kompress::compress_async(exec_, values_view(view.data(), count),
                               unmanaged_bytes(pool->data() + *offset, reserved),
                               stream_codec(requested, mode, local, 0));
    } catch (...) {
      pool->unreserve(*offset, reserved);
      std::lock_guard lock(mutex);
      entries.release(slot, std::move(local.segments));
      throw;
    }
    local.segments.push_back({.first_value = 0, .count = count, .tier = 0, .offset = *offset,
                              .stream_bytes = 0});
    local.used = requested;
    local.codec = mode;
    local.reserved_bytes = reserved;

    std::lock_guard lock(mutex);
    pending.mark(slot, exec_);
    counters.pending_saves = pending.count;
    return publish(slot, local);
  }

  /// Waits for the pending saves (all, or the one in `only`) on the instances they were
  /// enqueued on, then shrinks each reservation to its stream. Returns whether any was pending.
  /// Only this changes a pending entry, and drop and restore settle an entry before they touch
  /// it, so the slots stay valid while the lock is released for the waits.
  bool settle(std::optional<std::uint32_t> only) {
    std::lock_guard settle_lock(pending.settle_mutex);
    auto& jobs = pending.jobs;
    jobs.clear();
    {
      std::lock_guard lock(mutex);
      const std::uint32_t first = only.value_or(0);
      const std::uint32_t end = only ? *only + 1 : std::uint32_t(entries.slots());
      for (std::uint32_t slot = first; slot < end; ++slot) {
        const detail::stash_entry& entry = entries[slot];
        if (entry.live && pending.pending(slot))
          jobs.push_back({slot, entry.segments.front().offset, entry.reserved_bytes,
                          *pending.instances[slot]});
      }
    }
    if (jobs.empty()) return false;
    for (auto& job : jobs) {
      job.exec.fence("kompress::stash: waiting for a save_async");
      const stream_info header = kompress::inspect_header(
          job.exec, const_unmanaged_bytes(pool->data() + job.offset, job.reserved));
      job.length = header.compressed_bytes;
      job.abs_bound = header.absolute_bound;
    }
    for (auto& job : jobs) job.offset = pool->settle(job.exec, job.offset, job.reserved, job.length);
    std::lock_guard lock(mutex);
    for (const auto& job : jobs) {
      detail::stash_entry& entry = entries[job.slot];
      entry.segments.front().offset = job.offset;
      entry.segments.front().stream_bytes = job.length;
      entry.absolute_bound = job.abs_bound;
      entry.reserved_bytes = 0;
      pending.clear(job.slot);
      counters.stored_bytes += job.length;
      counters.total_stored_bytes += job.length;
    }
    counters.pending_saves = pending.count;
    return true;
  }

  /// Settles the handle's entry if its save_async is pending (throws for a bad handle).
  void settle_entry(const stash_handle& handle, const char* who) {
    bool is_pending;
    {
      std::lock_guard lock(mutex);
      entries.lookup(handle, who);  // throws for a bad handle
      is_pending = pending.pending(handle.slot);
    }
    if (is_pending) settle(handle.slot);
  }

  /// Places every segment of `view` within `requested`, loosening the bound if the policy says
  /// so. On return entry.segments holds them all; on a throw, what it holds is freed by the
  /// caller.
  template <class T, class View>
  void place_entry(const ExecutionSpace& exec_, const View& view, const error_bound& requested,
                   const stash_save_options& how, detail::stash_entry& entry, const char* who) {
    using values_view = Kokkos::View<const T*, typename View::memory_space, Kokkos::MemoryUnmanaged>;
    const std::size_t count = view.size();
    const T* const data = view.data();
    const std::size_t per_segment =
        detail::segment_values(options.segment_bytes, sizeof(T), options.codec.block_size);
    const std::size_t segments = count == 0 ? 0 : (count + per_segment - 1) / per_segment;

    error_bound bound = requested;
    std::string tried;
    std::optional<codec_mode> mode;  // chosen once, at the bound asked for
    while (true) {
      // A relative bound is relative to the whole View's range: over several segments (or with
      // keep_sign, whose packed streams hold only the positive values) it is resolved here, and
      // every segment gets the same absolute bound.
      // The range also says whether the View has a negative value, which a keep_sign save
      // would otherwise find with a scan before storing the View whole.
      error_bound segment_bound = bound;
      bool has_negative = false;
      bool placed_all = true;
      detail::stash_segment failed;
      std::size_t failed_bytes = 0;
      // group_relative: each group's exponent, kept in the pool as the entry's first segment,
      // and its values compressed scaled by it within r (1 - 2^-20) (detail/group_scales.hpp).
      const detail::group_exponent* exponents = nullptr;
      entry.absolute_bound = 0.0;
      entry.group_relative = how.group_relative && bound.value > 0.0 && count > 0;
      if (entry.group_relative) {
        detail::stash_segment scales{.first_value = 0, .count = count, .scales = true};
        scales.stream_bytes = detail::group_scale_bytes(count);
        if (const std::optional<std::size_t> offset = pool->borrow(scales.stream_bytes)) {
          pool->keep(*offset, scales.stream_bytes, scales.stream_bytes);
          scales.offset = *offset;
          entry.segments.push_back(scales);
          auto* const stored = reinterpret_cast<detail::group_exponent*>(pool->data() + *offset);
          const detail::group_exponents_result found = detail::find_group_exponents(exec_, data, count, stored);
          exponents = stored;
          entry.max_group_exponent = found.max_exponent;
          has_negative = found.has_negative;
          segment_bound = absolute(detail::group_codec_bound(bound.value));
        } else {
          failed = scales;
          failed_bytes = detail::first_fit_allocator::round_up(scales.stream_bytes);
          placed_all = false;
        }
      } else if ((segments > 1 || how.keep_sign) && bound.mode == bound_mode::relative) {
        const compress_options resolve = codec_with(bound, options.codec.codec);
        const auto keys =
            detail::range_keys(exec_, data, count, resolve.fill_value.has_value(), detail::fill_bits_of<T>(resolve));
        double e = detail::bound_for(resolve, keys);
        if (!(e <= 0x1p1000)) e = 0x1p1000;  // an overflowing range: the codec caps it too
        segment_bound = absolute(e);
        has_negative = keys.low() <= keys.high() && keys.low() < 0;  // -0.0 included: its key is -1
      }
      if (!mode && placed_all) {
        if (!exponents || !asks_automatic(how)) {
          mode = choose_codec(exec_, values_view(data, std::min(count, per_segment)), segment_bound, how);
        } else if (!(mode = choose_codec_scaled<T>(exec_, data, std::min(count, per_segment), exponents,
                                                   segment_bound, how))) {
          failed = {.first_value = 0, .count = std::min(count, per_segment)};
          failed_bytes = scaled_bytes<T>(failed.count);
          placed_all = false;
        }
      }
      if (mode) entry.codec = *mode;
      entry.used = bound;
      // keep_sign: each segment's stream, then its sign bits. A segment of values >= 0 stores
      // its positive values alone; once one holds a negative value or no zero, the save stops
      // trying (the scan that finds out is a pass over the segment), and a View whose range
      // has a negative value does not start.
      bool positives_only = how.keep_sign && !has_negative && per_segment < (std::size_t(1) << 32) && placed_all;
      // Segments of per_segment values; a packed one may end sooner (place_positives), and the
      // next starts where it ended.
      for (std::size_t next = 0, s = 0; next < count && placed_all; ++s) {
        detail::stash_segment segment;
        segment.first_value = next;
        segment.count = std::min(per_segment, count - next);
        const compress_options codec = stream_codec(segment_bound, *mode, entry, s);
        failed_bytes = place_piece<T, typename View::memory_space>(exec_, data, codec, segment_bound.value,
                                                                   how.keep_sign, positives_only, exponents, segment,
                                                                   entry, who);
        if (failed_bytes != 0) {
          failed = segment;
          placed_all = false;
        }
        next = segment.first_value + segment.count;
      }
      if (placed_all) return;

      // The pool as the failing segment found it, then give back what this save placed.
      const auto usage = pool->snapshot();
      free_segments(entry);
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
          std::string(who) + ": budget exceeded: " +
          (failed.signs    ? "a range of sign bits"
           : failed.scales ? "a range of the groups' exponents"
           : exponents     ? "a compressed segment (or its scaled values)"
                           : "a compressed segment") +
          " of " +
          std::to_string(failed_bytes) + " bytes (values " + std::to_string(failed.first_value) +
          ".." + std::to_string(failed.first_value + failed.count) + " of " + std::to_string(count) +
          " " + detail::type_name<T>() + ", bound " + detail::bound_text(bound) +
          ") does not fit: the pool of " + std::to_string(usage.capacity) + " bytes has " +
          std::to_string(usage.in_use) + " in use (the " + std::to_string(workspace_bytes) +
          "-byte workspace included) and its largest free range is " +
          std::to_string(usage.largest_free) + " bytes";
      if (options.policy.what == budget_policy::action::loosen_bound)
        message += "; tried the bounds " + tried + " up to the ceiling " +
                   detail::bound_text(options.policy.ceiling);
      else
        message += " (policy " + std::string(detail::policy_name(options.policy.what)) +
                   "; see kompress::budget_policy)";
      throw budget_exceeded(message, failed_bytes, usage.capacity, usage.in_use, usage.largest_free);
    }
  }

  /// Compresses one segment and places its stream: through the workspace into the pool framed
  /// (detail/piece_frame.hpp), or whole into the first tier with room where the pool has none;
  /// where another thread holds the workspace (or framing is off), in place in the pool when a
  /// worst-case range is free there, whole. Returns 0 when placed (segment filled in), or the
  /// aligned stream size that no tier took.
  template <class T, class InView>
  std::size_t place_segment(const ExecutionSpace& exec_, const InView& values,
                            const compress_options& codec, detail::stash_segment& segment,
                            double& abs_bound, const char* who) {
    const std::size_t worst = max_compressed_size<T>(values.size(), codec);
    std::unique_lock workspace_lock(workspace_mutex, std::defer_lock);
    const bool framing = tuning.frame_streams && workspace_lock.try_lock();

    if (!framing && tuning.compress_in_place) {
      if (const std::optional<std::size_t> offset = pool->borrow(worst)) {
        std::size_t length = 0;
        try {
          const unmanaged_bytes range(pool->data() + *offset, worst);
          length = kompress::compress(exec_, values, range, codec);
          abs_bound = kompress::inspect_header(exec_, range).absolute_bound;
        } catch (...) {
          pool->give_back(*offset, worst);
          throw;
        }
        pool->keep(*offset, worst, length);
        segment.tier = 0;
        segment.offset = *offset;
        segment.stream_bytes = length;
        return 0;
      }
    }

    if (!workspace_lock.owns_lock()) workspace_lock.lock();
    const unmanaged_bytes workspace_range(pool->workspace(), workspace_bytes);
    const std::size_t length = kompress::compress(exec_, values, workspace_range, codec);
    const stream_info info = kompress::inspect_header(exec_, workspace_range);
    abs_bound = info.absolute_bound;
    if (tuning.frame_streams) {
      // The frame goes into the sign scratch (free here), so that the stream stays whole in the
      // workspace for the spill tiers should the pool have no room for it.
      std::byte* const frame = pool->workspace() + workspace_bytes;
      detail::write_piece_frame(exec_, pool->workspace(), frame, info);
      if (const std::optional<std::size_t> offset =
              pool->store_pair(exec_, frame, detail::piece_frame_bytes, pool->workspace() + detail::header_bytes,
                               length - detail::header_bytes)) {
        segment.tier = 0;
        segment.offset = *offset;
        segment.stream_bytes = detail::framed_bytes(length);
        segment.framed = true;
        return 0;
      }
    }
    segment.stream_bytes = length;
    return store_from_workspace(exec_, segment, who);
  }

  /// Places values [piece.first_value, + piece.count) of a save at `data` into `entry`: with
  /// `keep_sign`, as their positive values and sign bits while `positives_only` (cleared once a
  /// piece holds a negative value or no zero), else as a stream and its sign bits; without, as
  /// a stream. Returns 0, or the aligned size of what no tier took (`piece` then names it).
  template <class T, class Memory>
  std::size_t place_piece(const ExecutionSpace& exec_, const T* data, const compress_options& codec, double bound,
                          bool keep_sign, bool& positives_only, const detail::group_exponent* exponents,
                          detail::stash_segment& piece, detail::stash_entry& entry, const char* who) {
    double abs_bound = 0.0;
    if (positives_only) {
      detail::stash_segment signs;
      switch (place_positives<T>(exec_, data + piece.first_value, codec, bound, exponents, piece, signs, abs_bound,
                                 who)) {
        case positives_placement::placed:
          entry.segments.push_back(piece);
          entry.segments.push_back(signs);
          entry.absolute_bound = std::max(entry.absolute_bound, abs_bound);
          return 0;
        case positives_placement::no_room: break;  // stored whole; the next segment tries again
        default: positives_only = false;
      }
    }
    using values_view = Kokkos::View<const T*, Memory, Kokkos::MemoryUnmanaged>;
    // The piece's stream, then its sign bits, from `values` (the piece's first value).
    const auto place_whole = [&](const T* values) -> std::size_t {
      std::size_t failed_bytes =
          place_segment<T>(exec_, values_view(values, piece.count), codec, piece, abs_bound, who);
      if (failed_bytes != 0) return failed_bytes;
      entry.segments.push_back(piece);
      entry.absolute_bound = std::max(entry.absolute_bound, abs_bound);
      if (!keep_sign) return 0;
      detail::stash_segment signs{.first_value = piece.first_value, .count = piece.count};
      failed_bytes = place_signs(exec_, values, abs_bound, codec.rounding != rounding_mode::stochastic, signs, who);
      if (failed_bytes == 0) entry.segments.push_back(signs);
      else piece = signs;
      return failed_bytes;
    };
    if (!exponents) return place_whole(data + piece.first_value);
    std::size_t failed_bytes = 0;
    if (!with_scaled<T>(exec_, data, piece.first_value, piece.count, exponents,
                        [&](const T* scaled) { failed_bytes = place_whole(scaled); }))
      return scaled_bytes<T>(piece.count);
    return failed_bytes;
  }

  enum class positives_placement { placed, not_all_positive_or_zero, no_zeros, no_room };

  /// A keep_sign segment whose values are all positive or +0 (a ReLU's output) is stored as
  /// its positive values alone, compressed within `codec`, and its sign bits, which say where
  /// they go: the zeros cost one bit each, not a code. The sign bits (packed with `bound`, the
  /// absolute bound) are written into the workspace's sign scratch; the positive values are
  /// packed into the workspace and compressed from there. Where the packed values and their
  /// stream's worst case fit in the workspace side by side (values at the top), the stream is
  /// compressed into the workspace and goes into the pool framed (its header cut to 16 bytes,
  /// detail/piece_frame.hpp) after its sign bits, the two in one range of their exact length:
  /// the pool a run needs is then the workspace and what it keeps, as for a stream stored
  /// whole. A segment with more positive values (more than about half) is cut short
  /// where they fill the workspace so (stream.count shrinks; the caller goes on from there);
  /// only where its first 128 values hold too many (tiny segments) does the stream go into a
  /// worst-case range of the pool held as a reservation (counted in pool_bytes, as a
  /// save_async's) until it is in, and the sign bits take a range of their own. The bits are
  /// coded by their rare value's gaps where that is shorter (detail/sign_code.hpp). So
  /// stats().peak_pool_bytes stays the budget the run needed. Places nothing unless it returns
  /// `placed`: a segment with a value that is neither, without zeros, or without room in the
  /// pool is stored whole (place_segment, place_signs). With `exponents` (a group_relative
  /// save), the packed values are scaled by their groups' before they are compressed.
  template <class T>
  positives_placement place_positives(const ExecutionSpace& exec_, const T* values, const compress_options& codec,
                                      double bound, const detail::group_exponent* exponents,
                                      detail::stash_segment& stream, detail::stash_segment& signs,
                                      double& abs_bound, const char* who) {
    std::size_t count = stream.count;
    std::lock_guard workspace_lock(workspace_mutex);
    std::byte* const sign_range = pool->workspace() + workspace_bytes;  // the sign scratch
    std::optional<std::size_t> offset;  // the stream's range once kept
    std::size_t length = 0;
    abs_bound = bound;  // without positives, what a stream would have recorded
    try {
      detail::packed_positives packed = detail::classify_signs(exec_, values, count, sign_range, tuning.simd_save);
      if (!packed.others_zero || packed.count == count)
        return packed.others_zero ? positives_placement::no_zeros : positives_placement::not_all_positive_or_zero;
      const auto fits_beside = [&](std::size_t positives) {
        return (positives > 0 ? max_compressed_size<T>(positives, codec) : 0) + positives * sizeof(T) <=
               workspace_bytes;
      };
      if (!fits_beside(packed.count)) {
        // Cut the segment short where its positive values fill the workspace beside their
        // stream's worst case: a stream more per segment at worst, where a reservation would
        // hold a segment's worst case more at the peak.
        std::size_t low = 0, high = packed.count;  // the most positive values that fit
        while (low < high) {
          const std::size_t mid = high - (high - low) / 2;
          if (fits_beside(mid)) low = mid;
          else high = mid - 1;
        }
        const detail::positives_cut cut = detail::cut_positives(exec_, sign_range, count, low);
        if (cut.values > 0) {
          count = stream.count = cut.values;
          packed.count = cut.positives;
        }
      }
      const std::size_t packed_bytes = packed.count * sizeof(T);
      const std::size_t worst = packed.count > 0 ? max_compressed_size<T>(packed.count, codec) : 0;
      const bool beside = fits_beside(packed.count);
      T* const packed_values = reinterpret_cast<T*>(pool->workspace() + (beside ? workspace_bytes - packed_bytes : 0));
      if (packed.count > 0) {
        detail::pack_positives(exec_, values, count, sign_range, packed_values, tuning.simd_save);
        if (exponents)
          detail::scale_down_packed_groups(exec_, sign_range, stream.first_value, count, packed_values, exponents);
        const Kokkos::View<const T*, memory_space, Kokkos::MemoryUnmanaged> positives(packed_values, packed.count);
        std::optional<std::size_t> reserved;  // in place, where the workspace cannot hold both
        if (!beside && !(reserved = pool->reserve(worst))) return positives_placement::no_room;
        const unmanaged_bytes range(reserved ? pool->data() + *reserved : pool->workspace(), worst);
        try {
          length = kompress::compress(exec_, positives, range, codec);
          const stream_info info = kompress::inspect_header(exec_, range);
          abs_bound = info.absolute_bound;
          if (beside && tuning.frame_streams)
            detail::write_piece_frame(exec_, range.data(), range.data() + detail::piece_frame_offset, info);
        } catch (...) {
          if (reserved) pool->unreserve(*reserved, worst);
          throw;
        }
        if (reserved) {
          pool->keep_reserved(*reserved, worst, length);
          offset = reserved;
        }
      }
      detail::reduce_small_positives(exec_, packed_values, packed.count, sign_range, count, bound,
                                      codec.rounding != rounding_mode::stochastic);
      exec_.fence("kompress::stash::save: sign bits packed");
      stream.stored_values = packed.count;
      // The bits, coded where that is shorter (into the workspace, after the stream it may
      // still hold: the packed values are no longer needed), else as they are.
      signs = stream;
      signs.signs = true;
      signs.positives_only = false;
      signs.stored_values = 0;
      const bool with_sum = codec.rounding != rounding_mode::stochastic;  // restore reads it
      signs.stream_bytes = detail::sign_bytes(count, with_sum);
      const std::byte* bits = sign_range;
      std::byte* const coded_at =
          pool->workspace() + (beside ? detail::first_fit_allocator::round_up(length) : std::size_t(0));
      const detail::sign_code_plan plan = detail::plan_sign_code(count, packed.count, with_sum);
      if (tuning.code_sign_bits && std::size_t(pool->workspace() + workspace_bytes - coded_at) >= signs.stream_bytes &&
          double(plan.estimate_bytes) <= detail::sign_code_max_share * double(signs.stream_bytes)) {
        const std::size_t coded = detail::encode_sign_bits(exec_, sign_range, count, plan, coded_at, with_sum);
        if (coded != 0 && coded < signs.stream_bytes) {
          bits = coded_at;
          signs.stream_bytes = coded;
          signs.coded_signs = true;
        }
      }
      // Beside, the stream is still in the workspace: framed, it follows the bits in their
      // range. Else it is in the pool (stored now, unless reserved), and the bits take a range
      // of their own.
      const bool framed = beside && packed.count > 0 && tuning.frame_streams;
      if (beside && packed.count > 0 && !framed &&
          !(offset = pool->store(exec_, pool->workspace(), length, who)))
        return positives_placement::no_room;
      const std::optional<std::size_t> sign_offset =
          framed ? pool->store_pair(exec_, bits, signs.stream_bytes, pool->workspace() + detail::piece_frame_offset,
                                    detail::framed_bytes(length))
                 : pool->store(exec_, bits, signs.stream_bytes, who);
      if (!sign_offset) {
        if (offset) pool->release(*offset, length);
        return positives_placement::no_room;
      }
      signs.offset = *sign_offset;
      if (framed) {
        length = detail::framed_bytes(length);
        offset = *sign_offset + signs.stream_bytes;
        signs.trailing_bytes = length;
        stream.framed = true;
      }
    } catch (...) {
      if (offset) pool->release(*offset, length);
      throw;
    }
    stream.tier = 0;
    stream.positives_only = true;
    stream.offset = offset.value_or(0);
    stream.stream_bytes = length;
    signs.tier = 0;
    return positives_placement::placed;
  }

  /// Packs the sign bits of segment.count values at `values` (stored within `abs_bound`; the
  /// mean of the small positive values with `mean_of_small`, detail::pack_signs) and places
  /// them as place_segment places a stream (their size is exact: no worst case).
  template <class T>
  std::size_t place_signs(const ExecutionSpace& exec_, const T* values, double abs_bound, bool mean_of_small,
                          detail::stash_segment& segment, const char* who) {
    const std::size_t bytes = detail::sign_bytes(segment.count, mean_of_small);
    segment.signs = true;
    segment.stream_bytes = bytes;
    if (const std::optional<std::size_t> offset = pool->borrow(bytes)) {
      try {
        detail::pack_signs(exec_, values, segment.count, pool->data() + *offset, abs_bound, mean_of_small,
                           tuning.simd_save);
        exec_.fence("kompress::stash::save: sign bits packed");
      } catch (...) {
        pool->give_back(*offset, bytes);
        throw;
      }
      pool->keep(*offset, bytes, bytes);
      segment.tier = 0;
      segment.offset = *offset;
      return 0;
    }
    std::lock_guard workspace_lock(workspace_mutex);
    detail::pack_signs(exec_, values, segment.count, pool->workspace(), abs_bound, mean_of_small, tuning.simd_save);
    return store_from_workspace(exec_, segment, who);
  }

  /// Stores the segment.stream_bytes in the workspace (its lock held, written through `exec_`)
  /// in the first tier with room. Returns 0 when placed, or the aligned size no tier took.
  std::size_t store_from_workspace(const ExecutionSpace& exec_, detail::stash_segment& segment,
                                   const char* who) {
    std::byte* const workspace = pool->workspace();
    const std::size_t length = segment.stream_bytes;
    // The pool first; pending saves hold worst-case ranges there, so settle them before
    // turning to the next tier.
    std::optional<std::size_t> offset = pool->store(exec_, workspace, length, who);
    if (!offset) {
      bool any_pending;
      {
        std::lock_guard lock(mutex);
        any_pending = pending.count > 0;
      }
      if (any_pending && settle(std::nullopt)) offset = pool->store(exec_, workspace, length, who);
    }
    for (std::size_t t = 1; !offset && t < tiers.size(); ++t) {
      offset = tiers[t]->store(exec_, workspace, length, who);
      if (offset) {
        segment.tier = std::uint8_t(t);
        std::lock_guard lock(mutex);
        ++counters.spilled_segments;
      }
    }
    if (!offset) return detail::first_fit_allocator::round_up(length);
    segment.offset = *offset;
    return 0;
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
    double abs_bound;
    rounding_mode rounding;
    codec_mode codec;
    {
      std::lock_guard lock(mutex);
      detail::stash_entry& entry = entries.lookup(handle, who);
      check_output(entry, out, who);
      ++entry.pins;
      segments = entry.segments.data();
      segment_count = entry.segments.size();
      abs_bound = entry.absolute_bound;
      rounding = entry.rounding;
      codec = entry.codec;
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

    // A framed stream (always in the pool) behind the header its frame stands for.
    const auto decompress_framed = [&](const detail::stash_segment& segment, const auto& into) {
      const std::byte* const stream = pool->data() + segment.offset;
      const detail::stream_header header = detail::read_framed_header<T>(
          exec_, stream, segment.stream_bytes, into.size(), codec_with(absolute(abs_bound), codec), who);
      detail::decompress_framed(exec_, stream, header, into, who);
    };

    // Each stream, then the sign bits that follow it (every value decoded before its sign is
    // applied); a group_relative save's values are then scaled back.
    const detail::stash_segment* scales = nullptr;
    for (std::size_t s = 0; s < segment_count; ++s) {
      const detail::stash_segment& segment = segments[s];
      if (segment.scales) {  // in the pool, read after the streams
        scales = &segment;
        continue;
      }
      const Kokkos::View<T*, typename View::memory_space, Kokkos::MemoryUnmanaged> values(
          out.data() + segment.first_value, segment.count);
      if (segment.positives_only) {  // decoded into the workspace, then spread between zeros
        const detail::stash_segment& signs = segments[++s];  // both in the pool; applied here
        std::lock_guard workspace_lock(workspace_mutex);
        const Kokkos::View<T*, memory_space, Kokkos::MemoryUnmanaged> packed_values(
            reinterpret_cast<T*>(pool->workspace()), segment.stored_values);
        if (segment.framed) decompress_framed(segment, packed_values);
        else if (segment.stored_values > 0)
          decompress(exec_, const_unmanaged_bytes(pool->data() + segment.offset, segment.stream_bytes), packed_values);
        const std::byte* bits = pool->data() + signs.offset;
        if (signs.coded_signs) {  // decoded into the sign scratch
          std::byte* const scratch = pool->workspace() + workspace_bytes;
          detail::decode_sign_bits(exec_, bits, segment.count, scratch, rounding != rounding_mode::stochastic);
          bits = scratch;
        }
        detail::unpack_positives(exec_, bits, packed_values.data(), values.data(), segment.count, abs_bound,
                                 rounding == rounding_mode::stochastic, tuning.simd_restore);
        exec_.fence("kompress::stash::restore: positive values unpacked");
        continue;
      }
      if (segment.framed) {
        decompress_framed(segment, values);
        continue;
      }
      tier& where = *tiers[segment.tier];
      std::unique_lock<std::mutex> workspace_lock;
      if (where.loads_into_scratch()) workspace_lock = std::unique_lock(workspace_mutex);
      const detail::tier_bytes bytes =
          where.load(exec_, segment.offset, segment.stream_bytes, pool->workspace(), who);
      if (segment.signs) {
        detail::apply_signs(exec_, bytes.data, values.data(), segment.count, abs_bound,
                            rounding == rounding_mode::stochastic, tuning.simd_restore);
        exec_.fence("kompress::stash::restore: signs applied");
        continue;
      }
      if constexpr (Kokkos::SpaceAccessibility<ExecutionSpace, Kokkos::HostSpace>::accessible) {
        if (bytes.host) {
          decompress(exec_, const_host_bytes(bytes.data, segment.stream_bytes), values);
          continue;
        }
      }
      decompress(exec_, const_unmanaged_bytes(bytes.data, segment.stream_bytes), values);
    }
    if (scales) {
      detail::scale_up_groups(exec_, out.data(), scales->count,
                              reinterpret_cast<const detail::group_exponent*>(pool->data() + scales->offset));
      exec_.fence("kompress::stash::restore: groups scaled back");
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
    counters.raw_bytes -= entry.raw_bytes();
    counters.stored_bytes -= entry.stored_bytes();
    counters.sign_bytes -= entry.sign_bytes();
    --counters.entries;
    ++counters.drops;
    free_segments(entry);
    entries.release(slot);
  }

  void drop(const stash_handle& handle, const char* who) {
    settle_entry(handle, who);  // its save may still be writing the range
    std::lock_guard lock(mutex);
    detail::stash_entry& entry = entries.lookup(handle, who);
    if (entry.pins > 0)
      throw invalid_handle(std::string(who) + ": the entry is being restored by another thread");
    drop_locked(entry, handle.slot);
  }

  bool contains(const stash_handle& handle) const {
    std::lock_guard lock(mutex);
    return entries.contains(handle);
  }

  stash_entry_info info(const stash_handle& handle) const {
    const_cast<state*>(this)->settle_entry(handle, "kompress::stash::info");
    std::lock_guard lock(mutex);
    const detail::stash_entry& entry = entries.lookup(handle, "kompress::stash::info");
    stash_entry_info result;
    result.type = entry.type;
    result.rank = entry.rank;
    result.extents = entry.extents;
    result.count = entry.count;
    result.raw_bytes = entry.raw_bytes();
    result.stored_bytes = entry.stored_bytes();
    result.requested_bound = entry.requested;
    result.used_bound = entry.used;
    result.absolute_bound = entry.absolute_bound;
    result.group_relative = entry.group_relative;
    // The largest group's bound: r 2^k (the streams' own, r (1 - 2^-20) 2^k, leave room for the
    // scaling's rounding; detail/group_scales.hpp).
    if (entry.group_relative) result.absolute_bound = std::ldexp(entry.used.value, entry.max_group_exponent);
    result.sign_bytes = entry.sign_bytes();
    result.zeros_in_signs = entry.zeros_in_signs();
    result.codec = entry.codec;
    result.keeps_sign = entry.keeps_sign();
    result.rounding = entry.rounding;
    for (const detail::stash_segment& segment : entry.segments) {
      if (segment.signs || segment.scales) continue;
      ++result.segments;
      tiers[segment.tier]->count(result.placement);
    }
    return result;
  }

  stash_stats stats() const {
    stash_stats result;
    {
      std::lock_guard lock(mutex);
      result = counters;
    }
    result.host_spilled_bytes = 0;
    result.file_spilled_bytes = 0;
    for (const auto& t : tiers) t->report(result);
    return result;
  }

  void reset_peaks() {
    std::lock_guard lock(mutex);
    counters.peak_raw_bytes = counters.raw_bytes;
    pool->reset_peaks();
  }
};

}  // namespace v0
}  // namespace kompress
