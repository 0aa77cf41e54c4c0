#pragma once
// kompress::measure_cost_model: measures the numbers automatic mode decides with — the link
// between two ranks and this machine's codec — once, and makes every rank agree on them
// (automatic mode decides on each side of a message without talking). Collective over comm,
// and, like every collective, it agrees on its argument first: a probe size that differs
// between ranks, or that one rank rejects, is an invalid_argument on every rank.

#include <kompress/comm/cost_model.hpp>
#include <kompress/comm/detail/small_calls.hpp>
#include <kompress/compress.hpp>
#include <kompress/detail/mpi.hpp>

#include <Kokkos_Core.hpp>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <vector>

namespace kompress {
inline namespace v0 {

/// Link: ranks 0 and 1 send each other `probe_bytes` at once, as the collectives do (both
/// directions busy): a full-duplex link gives each direction's rate, a shared one (a half-duplex
/// medium, a shaped loopback) each rank's share of it. Codec: compress and decompress a smooth
/// field of `probe_bytes` at REL 1e-3 on every rank. Slowest rank wins, for all. With one rank
/// there is no link: the model keeps its default link rate.
template <execution_space Exec>
cost_model measure_cost_model(const Exec& exec, MPI_Comm comm, std::size_t probe_bytes = 4u << 20) {
  constexpr const char* who = "kompress::measure_cost_model";
  const detail::comm_shape shape = detail::shape_of(comm, who);
  using clock = std::chrono::steady_clock;
  const auto seconds = [](clock::time_point start) {
    return std::chrono::duration<double>(clock::now() - start).count();
  };
  cost_model model;

  std::size_t count = 0;
  int bytes = 0;
  detail::agreement a;
  a.must_match = "probe_bytes";
  a.local_failure = detail::run_local_checks([&] {
    count = std::max<std::size_t>(probe_bytes / sizeof(float), 1024);
    bytes = detail::byte_count(count * sizeof(float), who);  // one MPI message
  });
  a.fingerprint = detail::fingerprint{}.add(std::uint64_t(probe_bytes)).value();
  detail::agree(a, comm, who);

  Kokkos::View<float*, Kokkos::HostSpace> field("kompress::probe", count), back("kompress::probe_back", count);
  for (std::size_t i = 0; i < count; ++i) field(i) = float(std::sin(1e-3 * double(i)) + 1e-3 * double(i % 17));
  Kokkos::View<std::byte*, Kokkos::HostSpace> stream("kompress::probe_stream", max_compressed_size(field));
  double compress_time = 1e30, decompress_time = 1e30;
  for (int repeat = 0; repeat < 3; ++repeat) {
    auto start = clock::now();
    const std::size_t length = compress(exec, field, stream, relative(1e-3));
    compress_time = std::min(compress_time, seconds(start));
    start = clock::now();
    decompress(exec, Kokkos::subview(stream, std::pair<std::size_t, std::size_t>(0, length)), back);
    decompress_time = std::min(decompress_time, seconds(start));
  }

  double link_time = 1e30;
  const bool probes = shape.size > 1 && shape.rank < 2;
  for (int repeat = 0; repeat < 3; ++repeat) {
    detail::check_mpi(MPI_Barrier(comm), who, "MPI_Barrier");
    const auto start = clock::now();
    if (!probes) continue;
    const int peer = 1 - shape.rank;
    detail::check_mpi(MPI_Sendrecv(field.data(), bytes, MPI_BYTE, peer, detail::collective_tag, back.data(), bytes,
                                   MPI_BYTE, peer, detail::collective_tag, comm, MPI_STATUS_IGNORE),
                      who, "MPI_Sendrecv");
    link_time = std::min(link_time, seconds(start));
  }
  // Rates: the slowest rank's codec; the link as the slower of ranks 0 and 1 saw it.
  double rates[3] = {double(count * sizeof(float)) / compress_time, double(count * sizeof(float)) / decompress_time,
                     probes ? double(count * sizeof(float)) / link_time : INFINITY};
  detail::check_mpi(MPI_Allreduce(MPI_IN_PLACE, rates, 3, MPI_DOUBLE, MPI_MIN, comm), who, "MPI_Allreduce");
  model.compress_bytes_per_second = rates[0];
  model.decompress_bytes_per_second = rates[1];
  if (shape.size > 1) model.link_bytes_per_second = rates[2];
  return model;
}

}  // namespace v0
}  // namespace kompress
