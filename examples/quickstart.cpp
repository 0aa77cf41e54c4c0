// The README's example: compress a field to within 1e-3 of its value range and back.
#include <kompress/kompress.hpp>

#include <cmath>
#include <cstdio>

int main(int argc, char* argv[]) {
  Kokkos::ScopeGuard kokkos(argc, argv);
  Kokkos::View<float**> field("field", 512, 512);
  Kokkos::parallel_for(field.size(), KOKKOS_LAMBDA(int i) { field.data()[i] = std::sin(i * 1e-3f); });

  auto stream = kompress::compress(Kokkos::DefaultExecutionSpace{}, field, kompress::relative(1e-3));
  Kokkos::View<float**> back("back", 512, 512);
  kompress::decompress(Kokkos::DefaultExecutionSpace{}, stream, back);

  const auto info = kompress::inspect(stream);
  std::printf("%zu bytes -> %zu bytes (ratio %.1f), every value within %g\n", field.size() * sizeof(float),
              stream.size(), info.ratio(), info.absolute_bound);
}
