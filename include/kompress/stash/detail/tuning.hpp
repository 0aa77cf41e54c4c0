#pragma once
// Tuning of the stash, chosen per backend; the measured gain is written beside each value
// (bench/stash, docs/performance.md "Stash (CPU)").

namespace kompress::inline v0::detail {

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

}  // namespace kompress::inline v0::detail
