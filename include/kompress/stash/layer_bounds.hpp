#pragma once
// kompress::layer_bounds: per-layer error bounds for a stash, chosen from the training itself.
// Every layer starts at one bound; on check steps the caller computes a layer's parameter
// gradient twice, from the exact activations and from the restored ones, and reports how far
// apart they are. While a layer's gradients stay within the tolerance its bound grows (up to a
// ceiling); when they do not, it steps back and stays; settled layers are checked again
// periodically and tightened if they drift. docs/stash.md, "Per-layer bounds", has the
// argument and what it costs.
//
//   kompress::layer_bounds bounds({.initial = kompress::relative(1e-2),
//                                  .ceiling = kompress::relative(1e-1)});
//   const bool check = bounds.check_due(step);            // keep exact copies this step
//   stash.save(exec, x, bounds.bound(layer), {.layer = layer});
//   ...                                                   // backward, twice when check
//   if (check) bounds.report(step, layer, kompress::layer_bounds::deviation(exec, exact, approx));

#include <kompress/bound.hpp>
#include <kompress/concepts.hpp>
#include <kompress/detail/arguments.hpp>
#include <kompress/error.hpp>

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace kompress {
inline namespace v0 {

struct layer_bounds_options {
  /// Every layer's first bound, and (with `floor`) the range a layer may be tightened to.
  error_bound initial = relative(1e-2);
  /// The loosest bound a layer gets; same mode as `initial`.
  error_bound ceiling = relative(1e-1);
  /// The tightest: a layer whose gradients drift even at `initial` steps down to it.
  /// Nothing: `initial`.
  std::optional<error_bound> floor = std::nullopt;
  /// A raise multiplies the bound by this (> 1; the last raise lands on the ceiling exactly),
  /// a step back divides by it.
  double growth = 2.0;
  /// The largest gradient deviation ||g' - g|| / ||g|| a layer's bound may cause (> 0).
  double tolerance = 0.05;
  /// Steps between checks: every step while some layer is still raising its bound, every
  /// `check_every` steps once all have settled (>= 1).
  std::uint64_t check_every = 50;
};

/// One change of a layer's bound, with the measurement that caused it.
struct layer_bound_change {
  std::uint64_t step = 0;
  std::uint32_t layer = 0;
  error_bound from{};
  error_bound to{};
  double deviation = 0.0;
};

class layer_bounds {
 public:
  explicit layer_bounds(const layer_bounds_options& options) : options_(options) {
    constexpr const char* who = "kompress::layer_bounds";
    detail::validate_bound(options_.initial, "kompress::layer_bounds: initial");
    detail::validate_bound(options_.ceiling, "kompress::layer_bounds: ceiling");
    const error_bound floor = options_.floor.value_or(options_.initial);
    detail::validate_bound(floor, "kompress::layer_bounds: floor");
    if (options_.ceiling.mode != options_.initial.mode || floor.mode != options_.initial.mode)
      throw invalid_argument(std::string(who) + ": initial, ceiling and floor must have the same mode");
    if (!(floor.value <= options_.initial.value && options_.initial.value <= options_.ceiling.value) ||
        !(floor.value > 0.0))
      throw invalid_argument(std::string(who) + ": the bounds must satisfy 0 < floor <= initial <= ceiling (got " +
                             detail::number_text(floor.value) + ", " + detail::number_text(options_.initial.value) +
                             ", " + detail::number_text(options_.ceiling.value) + ")");
    if (!(options_.growth > 1.0) || !std::isfinite(options_.growth))
      throw invalid_argument(std::string(who) + ": growth must be finite and > 1 (got " +
                             detail::number_text(options_.growth) + ")");
    if (!(options_.tolerance > 0.0))
      throw invalid_argument(std::string(who) + ": tolerance must be > 0 (got " +
                             detail::number_text(options_.tolerance) + ")");
    if (options_.check_every < 1) throw invalid_argument(std::string(who) + ": check_every must be at least 1");
    floor_ = floor;
  }

  /// The bound in force for `layer` (a layer not seen yet: initial).
  error_bound bound(std::uint32_t layer) const {
    const auto found = layers_.find(layer);
    return found == layers_.end() ? options_.initial : found->second.bound;
  }

  /// Whether `layer`'s bound has settled (reached the ceiling, or stepped back once); a layer
  /// not reported yet has not.
  bool settled(std::uint32_t layer) const {
    const auto found = layers_.find(layer);
    return found != layers_.end() && found->second.settled;
  }

  /// Whether `step` is a check step: the caller then computes every layer's gradient from
  /// exact activations too and reports each layer's deviation.
  bool check_due(std::uint64_t step) const {
    if (layers_.empty()) return true;  // nothing measured yet
    for (const auto& [layer, state] : layers_)
      if (!state.settled) return true;
    return step % options_.check_every == 0;
  }

  /// Records the deviation ||g' - g|| / ||g|| of `layer`'s parameter gradient on a check step
  /// (g from exact activations, g' from restored ones at the layer's bound), and moves the
  /// layer's bound: up while within the tolerance and not settled, back one step (and settled)
  /// when beyond it. A NaN deviation counts as beyond.
  void report(std::uint64_t step, std::uint32_t layer, double deviation) {
    state& s = layers_.try_emplace(layer, state{options_.initial, false}).first->second;
    const error_bound before = s.bound;
    if (deviation <= options_.tolerance) {
      if (!s.settled) {
        s.bound.value = std::min(s.bound.value * options_.growth, options_.ceiling.value);
        if (s.bound.value >= options_.ceiling.value) s.settled = true;
      }
    } else {
      s.bound.value = std::max(s.bound.value / options_.growth, floor_.value);
      s.settled = true;
    }
    if (s.bound.value != before.value) log_.push_back({step, layer, before, s.bound, deviation});
  }

  /// Every change so far, in order.
  const std::vector<layer_bound_change>& log() const { return log_; }
  const layer_bounds_options& options() const { return options_; }

  /// ||approx - exact|| / ||exact|| (2-norms; 0 when both are 0, infinity when only exact is),
  /// over Views of the same size on `exec`. Waits for `exec`.
  template <execution_space ExecutionSpace, float_view ExactView, float_view ApproxView>
  static double deviation(const ExecutionSpace& exec, const ExactView& exact, const ApproxView& approx) {
    if (exact.size() != approx.size())
      throw invalid_argument("kompress::layer_bounds::deviation: the Views have " + std::to_string(exact.size()) +
                             " and " + std::to_string(approx.size()) + " values");
    detail::require_contiguous(exact, "kompress::layer_bounds::deviation", "the exact View");
    detail::require_contiguous(approx, "kompress::layer_bounds::deviation", "the approximate View");
    const auto* e = exact.data();
    const auto* a = approx.data();
    double difference = 0.0, norm = 0.0;
    Kokkos::parallel_reduce(
        "kompress::layer_bounds::deviation",
        Kokkos::RangePolicy<ExecutionSpace, Kokkos::IndexType<std::size_t>>(exec, 0, exact.size()),
        KOKKOS_LAMBDA(const std::size_t i, double& d, double& n) {
          const double x = double(e[i]), y = double(a[i]);
          d += (y - x) * (y - x);
          n += x * x;
        },
        difference, norm);
    exec.fence("kompress::layer_bounds::deviation");
    if (norm == 0.0) return difference == 0.0 ? 0.0 : INFINITY;
    return std::sqrt(difference / norm);
  }

 private:
  struct state {
    error_bound bound;
    bool settled = false;
  };
  layer_bounds_options options_;
  error_bound floor_{};
  std::map<std::uint32_t, state> layers_;
  std::vector<layer_bound_change> log_;
};

}  // namespace v0
}  // namespace kompress
