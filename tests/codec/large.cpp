// An array past 2^31 bytes, on the build's default execution space: every size and offset in
// the streams and the kernels is 64-bit (chunk indices, chunk ends, the value range's count),
// and a 32-bit one anywhere would wrap here. Both kernels the backends choose between (a thread
// per chunk and a team per chunk, kernels/team_codec.hpp) write the same stream, and each
// decodes it within the bound. About 7 GiB of memory.

#include "support/codec_checks.hpp"

#include <kompress/compress.hpp>

#include <doctest/doctest.h>

#include <cstdint>

namespace {

using kompress::test::default_exec;
using kompress::test::default_memory;
namespace detail = kompress::detail;

/// The stream enqueue_compress_kernels writes with `tuning`, in `out`; returns its length.
std::uint64_t compress_with(const Kokkos::View<const float*, default_memory>& in,
                            const Kokkos::View<std::byte*, default_memory>& out, double bound,
                            const detail::kernel_tuning& tuning) {
  detail::stream_header header;
  header.type = kompress::element_type::float32;
  header.mode = kompress::bound_mode::absolute;
  header.count = in.size();
  header.user_bound = bound;
  Kokkos::View<std::uint64_t, default_memory> length("length");
  detail::enqueue_compress_kernels<float, 32>(default_exec{}, in.data(), out.data(), header,
                                              length.data(), tuning);
  std::uint64_t result = 0;
  Kokkos::deep_copy(default_exec{}, result, length);
  default_exec{}.fence();
  return result;
}

/// The largest |decoded - original| over the array (1e300 where a value is not finite).
/// Reduced into device memory: a Kokkos::Cuda reduction into a host scalar wrote through the
/// scalar's host address (docs/gpu.md).
double max_error(const Kokkos::View<const float*, default_memory>& in,
                 const Kokkos::View<const float*, default_memory>& decoded) {
  const Kokkos::View<double, default_memory> worst("worst");
  Kokkos::parallel_reduce(
      "max_error", Kokkos::RangePolicy<default_exec>(0, in.size()),
      KOKKOS_LAMBDA(std::uint64_t i, double& w) {
        const double e = Kokkos::fabs(double(decoded(i)) - double(in(i)));
        w = (e > w || e != e) ? (e != e ? 1e300 : e) : w;
      },
      Kokkos::Max<double, default_memory>(worst));
  double result = 0.0;
  Kokkos::deep_copy(result, worst);
  return result;
}

/// How many bytes of `a` and `b` differ in their first `bytes` (reduced in device memory too).
std::uint64_t differing_bytes(const Kokkos::View<const std::byte*, default_memory>& a,
                              const Kokkos::View<const std::byte*, default_memory>& b, std::uint64_t bytes) {
  const Kokkos::View<std::uint64_t, default_memory> differing("differing");
  Kokkos::parallel_reduce(
      "compare", Kokkos::RangePolicy<default_exec>(0, bytes),
      KOKKOS_LAMBDA(std::uint64_t i, std::uint64_t& d) { d += a(i) != b(i); },
      Kokkos::Sum<std::uint64_t, default_memory>(differing));
  std::uint64_t result = 0;
  Kokkos::deep_copy(result, differing);
  return result;
}

}  // namespace

TEST_CASE("codec: an array past 2^31 bytes, both kernels, the same stream, within the bound" *
          doctest::timeout(600)) {
  // 2^29 + 4097 floats: 2 GiB and 16 KiB, so the last chunks start past 2^31 bytes.
  const std::uint64_t count = (std::uint64_t(1) << 29) + 4097;
  Kokkos::View<float*, default_memory> in(Kokkos::view_alloc("in", Kokkos::WithoutInitializing),
                                          count);
  // Smooth, with an incompressible stretch every 2^20 values, so chunk lengths vary.
  Kokkos::parallel_for(
      "fill", Kokkos::RangePolicy<default_exec>(0, count), KOKKOS_LAMBDA(std::uint64_t i) {
        const std::uint64_t hashed = (i * 0x9E3779B97F4A7C15ull) >> 40;
        in(i) = (i >> 12) % 256 == 7 ? float(hashed % 100000) * 1e-3f
                                     : float(100.0 * Kokkos::sin(1e-5 * double(i % 4000000)));
      });
  const double bound = 1e-3;
  const std::size_t room = kompress::max_compressed_size<float>(count);
  Kokkos::View<std::byte*, default_memory> threads(
      Kokkos::view_alloc("threads", Kokkos::WithoutInitializing), room);
  Kokkos::View<std::byte*, default_memory> teams(
      Kokkos::view_alloc("teams", Kokkos::WithoutInitializing), room);
  const std::uint64_t thread_bytes = compress_with(in, threads, bound, {.team_size = 0});
  const std::uint64_t team_bytes = compress_with(in, teams, bound, {.team_size = -1});
  REQUIRE(thread_bytes == team_bytes);
  CHECK(thread_bytes < count * sizeof(float));
  CHECK(differing_bytes(threads, teams, thread_bytes) == 0);

  const auto stream =
      Kokkos::subview(threads, std::pair<std::uint64_t, std::uint64_t>(0, thread_bytes));
  const kompress::stream_info info = kompress::inspect(stream);
  CHECK(info.count == count);
  Kokkos::View<float*, default_memory> decoded(
      Kokkos::view_alloc("decoded", Kokkos::WithoutInitializing), count);
  for (const int team_size : {0, -1}) {
    CAPTURE(team_size);
    // Filled by a kernel of ours (kompress::test::filled says why not by Kokkos's fill).
    Kokkos::parallel_for(
        "unwritten", Kokkos::RangePolicy<default_exec>(0, count), KOKKOS_LAMBDA(std::uint64_t i) { decoded(i) = -1.0f; });
    const detail::stream_header header = detail::read_header(stream, "test");
    detail::value_codec<float> codec;
    codec.step = header.quant_step;
    detail::decompress_chunks<float, 32>(default_exec{}, stream.data(), header, codec,
                                         decoded.data(), "test", {.team_size = team_size});
    CHECK(max_error(in, decoded) <= bound);
  }
}
