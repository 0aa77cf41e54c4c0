#pragma once
// kompress::decompress into a vector, for the fuzzer: one explicit instantiation per element
// type, each in its own source file (fuzz_decode_float.cpp, fuzz_decode_double.cpp). The
// decoder's instantiations, every block size and bit width unrolled, take most of the
// fuzzer's build time under -O1 and the sanitizers; split in two they compile in parallel.

#include <kompress/kompress.hpp>

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <vector>

namespace kompress_fuzz {

using bytes_view = Kokkos::View<const std::byte*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>;

/// Decompresses `stream`, which holds `count` values of T, into a vector of that length.
template <class T>
void decode(const bytes_view& stream, std::uint64_t count) {
  std::vector<T> out(count);
  const Kokkos::View<T*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged> out_view(out.data(),
                                                                             out.size());
  kompress::decompress(Kokkos::DefaultHostExecutionSpace{}, stream, out_view);
}

extern template void decode<float>(const bytes_view&, std::uint64_t);
extern template void decode<double>(const bytes_view&, std::uint64_t);

}  // namespace kompress_fuzz
