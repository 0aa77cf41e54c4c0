#pragma once
// kompress::measure_cost_model: measures the numbers automatic mode decides with — the link
// between two ranks, this machine's codec and, given a sample of the data, the ratio it reaches
// there — once, and makes every rank agree on them
// (automatic mode decides on each side of a message without talking). Collective over comm,
// and, like every collective, it agrees on its argument first: a probe size that differs
// between ranks, or that one rank rejects, is an invalid_argument on every rank.

#include <kompress/comm/cost_model.hpp>
#include <kompress/comm/detail/small_calls.hpp>
#include <kompress/detail/arguments.hpp>
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

namespace detail {

/// What measure_cost_model measured of the codec on one rank: bytes per second and the ratio.
struct codec_probe {
  double compress = 0.0, decompress = 0.0, ratio = 0.0;
};

/// The fastest of three compressions and decompressions of `values` at `options` on `exec`.
template <class Exec, class View>
codec_probe probe_codec(const Exec& exec, const View& values, const compress_options& options, const char* who) {
  using clock = std::chrono::steady_clock;
  using memory = typename View::memory_space;
  const auto since = [](clock::time_point start) { return std::chrono::duration<double>(clock::now() - start).count(); };
  const std::size_t bytes = values.size() * sizeof(typename View::non_const_value_type);
  const Kokkos::View<std::byte*, memory> stream(Kokkos::view_alloc(Kokkos::WithoutInitializing, "kompress::probe_stream"),
                                                max_compressed_size(values, options));
  const Kokkos::View<typename View::non_const_value_type*, memory> back(
      Kokkos::view_alloc(Kokkos::WithoutInitializing, "kompress::probe_back"), values.size());
  double compress_time = 1e30, decompress_time = 1e30;
  std::size_t length = 0;
  for (int repeat = 0; repeat < 3; ++repeat) {
    auto start = clock::now();
    length = compress(exec, values, stream, options);
    compress_time = std::min(compress_time, since(start));
    start = clock::now();
    decompress(exec, Kokkos::subview(stream, std::pair<std::size_t, std::size_t>(0, length)), back);
    exec.fence(who);
    decompress_time = std::min(decompress_time, since(start));
  }
  return {double(bytes) / compress_time, double(bytes) / decompress_time, double(bytes) / double(length)};
}

/// The link between ranks 0 and 1 (a probe of `bytes` each way at once), then every rank's
/// agreement on the slowest rank's codec, the lowest ratio and the slower direction of the link.
inline cost_model agree_on_measurements(MPI_Comm comm, comm_shape shape, codec_probe codec, bool with_ratio,
                                        int bytes, const char* who) {
  using clock = std::chrono::steady_clock;
  std::vector<std::byte> out(static_cast<std::size_t>(bytes)), in(static_cast<std::size_t>(bytes));
  double link_time = 1e30;
  const bool probes = shape.size > 1 && shape.rank < 2;
  for (int repeat = 0; repeat < 3; ++repeat) {
    check_mpi(MPI_Barrier(comm), who, "MPI_Barrier");
    const auto start = clock::now();
    if (!probes) continue;
    const int peer = 1 - shape.rank;
    check_mpi(MPI_Sendrecv(out.data(), bytes, MPI_BYTE, peer, collective_tag, in.data(), bytes, MPI_BYTE, peer,
                           collective_tag, comm, MPI_STATUS_IGNORE),
              who, "MPI_Sendrecv");
    link_time = std::min(link_time, std::chrono::duration<double>(clock::now() - start).count());
  }
  double rates[4] = {codec.compress, codec.decompress, probes ? double(bytes) / link_time : INFINITY, codec.ratio};
  check_mpi(MPI_Allreduce(MPI_IN_PLACE, rates, 4, MPI_DOUBLE, MPI_MIN, comm), who, "MPI_Allreduce");
  cost_model model;
  model.compress_bytes_per_second = rates[0];
  model.decompress_bytes_per_second = rates[1];
  if (shape.size > 1) model.link_bytes_per_second = rates[2];
  if (with_ratio) model.expected_ratio = rates[3];
  return model;
}

}  // namespace detail

/// Link: ranks 0 and 1 send each other `probe_bytes` at once, as the collectives do (both
/// directions busy): a full-duplex link gives each direction's rate, a shared one (a half-duplex
/// medium, a shaped loopback) each rank's share of it. Codec: compress and decompress a smooth
/// field of `probe_bytes` at REL 1e-3 on every rank. Slowest rank wins, for all. With one rank
/// there is no link: the model keeps its default link rate. The ratio stays the model's
/// default; the overload below measures it on the caller's data.
template <execution_space Exec>
cost_model measure_cost_model(const Exec& exec, MPI_Comm comm, std::size_t probe_bytes = 4u << 20) {
  constexpr const char* who = "kompress::measure_cost_model";
  const detail::comm_shape shape = detail::shape_of(comm, who);
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

  Kokkos::View<float*, Kokkos::HostSpace> field("kompress::probe", count);
  for (std::size_t i = 0; i < count; ++i) field(i) = float(std::sin(1e-3 * double(i)) + 1e-3 * double(i % 17));
  const auto codec = detail::probe_codec(exec, field, compress_options{.bound = relative(1e-3)}, who);
  return detail::agree_on_measurements(comm, shape, codec, false, bytes, who);
}

/// As above, with the codec probed on `sample`, this rank's share of the data the collectives
/// will carry (a View `exec` reaches, any length, at least one value), at `codec` (the
/// bound and block size they will use; a REL bound resolves against the sample): the model's
/// rates are the codec's on that data and its expected_ratio the lowest ratio any rank's
/// sample reached. The probe_bytes and the bound must match on every rank.
template <execution_space Exec, float_view View>
cost_model measure_cost_model(const Exec& exec, MPI_Comm comm, const View& sample, const compress_options& codec,
                              std::size_t probe_bytes = 4u << 20) {
  constexpr const char* who = "kompress::measure_cost_model";
  const detail::comm_shape shape = detail::shape_of(comm, who);
  int bytes = 0;
  detail::agreement a;
  a.must_match = "probe_bytes and the codec's bound";
  a.local_failure = detail::run_local_checks([&] {
    detail::validate_options(codec, who);
    if (sample.size() == 0) throw invalid_argument(std::string(who) + ": the sample holds no values");
    detail::require_contiguous(sample, who, "the sample");
    bytes = detail::byte_count(std::max<std::size_t>(probe_bytes, 4096), who);  // one MPI message
  });
  a.fingerprint = detail::fingerprint{}
                      .add(std::uint64_t(probe_bytes))
                      .add(std::uint64_t(codec.bound.mode))
                      .add(codec.bound.value)
                      .value();
  detail::agree(a, comm, who);
  const auto probe = detail::probe_codec(exec, sample, codec, who);
  return detail::agree_on_measurements(comm, shape, probe, true, bytes, who);
}

}  // namespace v0
}  // namespace kompress
