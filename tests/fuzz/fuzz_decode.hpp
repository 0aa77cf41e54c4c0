#pragma once
// kompress::decompress for the fuzzer: one explicit instantiation per element
// type, each in its own source file (fuzz_decode_float.cpp, fuzz_decode_double.cpp). The
// decoder's instantiations, every block size and bit width unrolled, take most of the
// fuzzer's build time under -O1 and the sanitizers; split in two they compile in parallel.

#include <kompress/kompress.hpp>

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <cstdlib>
#include <vector>

namespace kompress_fuzz {

using bytes_view = Kokkos::View<const std::byte*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>;

/// Decompresses `stream`, which inspect says holds `count` values of T, through the allocating
/// form (the one a decompression bomb aims at: it must check the header against the stream's
/// length before it allocates); returns the extent it allocated.
template <class T>
std::uint64_t decode(const bytes_view& stream, std::uint64_t count) {
  const auto out = kompress::decompress<T>(Kokkos::DefaultHostExecutionSpace{}, stream);
  if (out.extent(0) != count) std::abort();  // the harness reports it as a crash
  return out.extent(0);
}

extern template std::uint64_t decode<float>(const bytes_view&, std::uint64_t);
extern template std::uint64_t decode<double>(const bytes_view&, std::uint64_t);

}  // namespace kompress_fuzz
