// kompress::layer_bounds: per-layer bounds raised while the gradients stay within the
// tolerance, stepped back and settled when they do not, checked again periodically; and the
// deviation it is fed.
#include <kompress/stash/layer_bounds.hpp>

#include "support/stash_views.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <vector>

namespace {

using exec_space = Kokkos::DefaultExecutionSpace;
using kompress::test::to_view;

}  // namespace

TEST_CASE("layer_bounds: a tolerant layer climbs to the ceiling, a sensitive one steps back, both settle") {
  kompress::layer_bounds bounds({.initial = kompress::relative(1e-2),
                                 .ceiling = kompress::relative(1e-1),
                                 .floor = kompress::relative(2.5e-3),
                                 .growth = 2.0,
                                 .tolerance = 0.05,
                                 .check_every = 10});
  CHECK(bounds.bound(0).value == 1e-2);
  CHECK(bounds.bound(0).mode == kompress::bound_mode::relative);
  CHECK_FALSE(bounds.settled(0));
  // Layer 0 tolerates anything; layer 1 drifts beyond the tolerance from 4e-2 on.
  const auto deviation_of = [&](std::uint32_t layer) {
    return layer == 0 ? 0.01 : (bounds.bound(1).value >= 4e-2 ? 0.2 : 0.02);
  };
  std::uint64_t step = 0;
  std::vector<std::uint64_t> checks;
  for (; step < 40; ++step) {
    if (!bounds.check_due(step)) continue;
    checks.push_back(step);
    for (std::uint32_t layer : {0u, 1u}) bounds.report(step, layer, deviation_of(layer));
    if (step == 0) CHECK_FALSE(bounds.settled(0));  // raised once, still climbing
  }
  CHECK(bounds.bound(0).value == 1e-1);  // 1e-2, 2e-2, 4e-2, 8e-2, then the ceiling exactly
  CHECK(bounds.bound(1).value == 2e-2);  // 4e-2 drifted: back one step, settled
  CHECK(bounds.settled(0));
  CHECK(bounds.settled(1));
  CHECK_FALSE(bounds.settled(2));
  // Checked every step until both settled (after step 3: layer 1 drifts at step 2, layer 0
  // reaches the ceiling at step 3), then every 10 steps.
  CHECK(checks == std::vector<std::uint64_t>{0, 1, 2, 3, 10, 20, 30});
  // The log: layer 0 raised four times, layer 1 raised twice and stepped back once.
  std::size_t raises0 = 0, raises1 = 0, backs1 = 0;
  for (const auto& change : bounds.log()) {
    if (change.layer == 0) raises0 += change.to.value > change.from.value;
    if (change.layer == 1 && change.to.value > change.from.value) ++raises1;
    if (change.layer == 1 && change.to.value < change.from.value) {
      ++backs1;
      CHECK(change.step == 2);
      CHECK(change.from.value == 4e-2);
      CHECK(change.deviation == 0.2);
    }
  }
  CHECK(raises0 == 4);
  CHECK(raises1 == 2);
  CHECK(backs1 == 1);

  // A settled layer is tightened when a periodic check finds it drifting, down to the floor.
  for (int i = 0; i < 4; ++i) bounds.report(step++, 1, 1.0);
  CHECK(bounds.bound(1).value == 2.5e-3);
  bounds.report(step++, 1, std::nan(""));  // NaN counts as drifting; already at the floor
  CHECK(bounds.bound(1).value == 2.5e-3);
  // ... and not raised again by good checks (settled).
  bounds.report(step++, 1, 0.0);
  CHECK(bounds.bound(1).value == 2.5e-3);
}

TEST_CASE("layer_bounds: options out of range are rejected") {
  using kompress::relative;
  using kompress::absolute;
  const auto rejects = [](const kompress::layer_bounds_options& o) {
    CHECK_THROWS_AS(kompress::layer_bounds{o}, kompress::invalid_argument);
  };
  rejects({.initial = relative(1e-2), .ceiling = absolute(1e-1)});
  rejects({.initial = relative(1e-2), .ceiling = relative(1e-3)});
  rejects({.initial = relative(1e-2), .ceiling = relative(1e-1), .floor = relative(2e-2)});
  rejects({.initial = relative(1e-2), .ceiling = relative(1e-1), .floor = relative(0.0)});
  rejects({.initial = relative(1e-2), .ceiling = relative(1e-1), .growth = 1.0});
  rejects({.initial = relative(1e-2), .ceiling = relative(1e-1), .tolerance = 0.0});
  rejects({.initial = relative(1e-2), .ceiling = relative(1e-1), .check_every = 0});
  CHECK_NOTHROW(kompress::layer_bounds({.initial = absolute(0.1), .ceiling = absolute(0.1)}));
}

TEST_CASE("layer_bounds::deviation: ||approx - exact|| / ||exact||") {
  const exec_space exec;
  const std::vector<double> exact = {3.0, 0.0, -4.0, 0.0};  // norm 5
  const std::vector<double> approx = {3.0, 0.3, -4.0, -0.4};  // difference norm 0.5
  CHECK(kompress::layer_bounds::deviation(exec, to_view(exact), to_view(approx)) == doctest::Approx(0.1));
  CHECK(kompress::layer_bounds::deviation(exec, to_view(exact), to_view(exact)) == 0.0);
  const std::vector<double> zeros(4, 0.0);
  CHECK(kompress::layer_bounds::deviation(exec, to_view(zeros), to_view(zeros)) == 0.0);
  CHECK(std::isinf(kompress::layer_bounds::deviation(exec, to_view(zeros), to_view(approx))));
  CHECK_THROWS_AS(kompress::layer_bounds::deviation(exec, to_view(exact), to_view(std::vector<double>(3))),
                  kompress::invalid_argument);
}
