// Activations kept compressed between the forward and the backward pass, under a budget.
#include <kompress/stash.hpp>

#include <cmath>
#include <cstdio>

int main(int argc, char* argv[]) {
  Kokkos::ScopeGuard kokkos(argc, argv);
  using exec = Kokkos::DefaultExecutionSpace;
  kompress::stash<exec> stash(exec{}, {.budget_bytes = 64 << 20});

  Kokkos::View<float**> activation("activation", 1024, 1024);
  Kokkos::parallel_for(activation.size(), KOKKOS_LAMBDA(int i) {
    activation.data()[i] = std::fmax(0.0f, std::sin(i * 1e-3f));
  });

  // Forward pass: save (or save_async, which returns before the compression ends).
  const kompress::stash_handle saved = stash.save(activation, kompress::relative(1e-2));

  // Backward pass: restore within the bound, then drop to free the bytes.
  Kokkos::View<float**> restored("restored", 1024, 1024);
  stash.restore(saved, restored);
  stash.drop(saved);

  const kompress::stash_stats stats = stash.stats();
  std::printf("%zu bytes stashed as %zu (%.1fx)\n", stats.total_raw_bytes, stats.total_stored_bytes,
              stats.ratio());
}
