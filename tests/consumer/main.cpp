// A codec-only kompress user: the umbrella header, the version, and Kokkos through
// kompress::kompress's link interface.
#include <kompress/kompress.hpp>

#include <Kokkos_Core.hpp>

#include <cstdio>
#include <string>

int main(int argc, char** argv) {
  Kokkos::ScopeGuard kokkos(argc, argv);
  const std::string version = std::to_string(kompress::version.major) + "." +
                              std::to_string(kompress::version.minor) + "." +
                              std::to_string(kompress::version.patch);
  std::printf("consumer: kompress %s, Kokkos execution space %s\n", version.c_str(),
              Kokkos::DefaultExecutionSpace::name());
#ifdef KOMPRESS_CONSUMER_EXPECTED_VERSION
  if (version != KOMPRESS_CONSUMER_EXPECTED_VERSION) {
    std::printf("consumer: the package says version %s\n", KOMPRESS_CONSUMER_EXPECTED_VERSION);
    return 1;
  }
#endif

  const int n = 1000;
  Kokkos::View<int*> values("values", n);
  Kokkos::parallel_for("consumer::fill", n, KOKKOS_LAMBDA(int i) { values(i) = i; });
  long sum = 0;
  Kokkos::parallel_reduce(
      "consumer::sum", n, KOKKOS_LAMBDA(int i, long& partial) { partial += values(i); }, sum);
  if (sum != long{n} * (n - 1) / 2) {
    std::printf("consumer: wrong sum %ld\n", sum);
    return 1;
  }
  std::printf("consumer: ok\n");
  return 0;
}
