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
#include <tuple>
#include <utility>
#include <vector>

namespace kompress {
inline namespace v0 {

namespace detail {

/// What measure_cost_model measured of the codec on one rank: bytes per second beyond a fixed
/// cost per call, that cost (seconds), and the ratio.
struct codec_probe {
  double compress = 0.0, decompress = 0.0, ratio = 0.0;
  double compress_call = 0.0, decompress_call = 0.0;
};

/// The fastest of three compressions and decompressions of `values` at `options` on `exec`,
/// seconds each way; `length` receives the stream's length.
template <class Exec, class View, class Stream, class Back>
std::pair<double, double> time_codec(const Exec& exec, const View& values, const Stream& stream, const Back& back,
                                     const compress_options& options, std::size_t& length, const char* who) {
  using clock = std::chrono::steady_clock;
  const auto since = [](clock::time_point start) { return std::chrono::duration<double>(clock::now() - start).count(); };
  double compress_time = 1e30, decompress_time = 1e30;
  for (int repeat = 0; repeat < 3; ++repeat) {
    auto start = clock::now();
    length = compress(exec, values, stream, options);
    compress_time = std::min(compress_time, since(start));
    start = clock::now();
    decompress(exec, Kokkos::subview(stream, std::pair<std::size_t, std::size_t>(0, length)), back);
    exec.fence(who);
    decompress_time = std::min(decompress_time, since(start));
  }
  return {compress_time, decompress_time};
}

/// The line t = call + bytes / rate through a call of `small` bytes taking `t_small` seconds
/// and one of `large` bytes taking `t_large`, as {rate, call}; a negative call (the small call
/// ran faster per byte, in cache) is taken as no fixed cost at the large call's rate.
inline std::pair<double, double> affine_codec_cost(double small, double t_small, double large, double t_large) {
  const double call = (t_small * large - t_large * small) / (large - small);
  if (!(call > 0.0) || !(t_large > t_small)) return {large / t_large, 0.0};
  return {(large - small) / (t_large - t_small), call};
}

/// Values in the small probe: 16 KiB of floats, a size at which a GPU's call costs its fixed
/// cost and little more (docs/performance.md, "Codec (GPU)").
inline constexpr std::size_t call_probe_values = 4096;

/// The codec on `values` at `options`: the fastest of three calls of all of them, and of three
/// of their first call_probe_values, fitted to a fixed cost per call and a rate (a sample
/// shorter than four times that is timed whole only: no fixed cost).
template <class Exec, class View>
codec_probe probe_codec(const Exec& exec, const View& values, const compress_options& options, const char* who) {
  using T = typename View::non_const_value_type;
  using memory = typename View::memory_space;
  const std::size_t bytes = values.size() * sizeof(T);
  const Kokkos::View<std::byte*, memory> stream(Kokkos::view_alloc(Kokkos::WithoutInitializing, "kompress::probe_stream"),
                                                max_compressed_size(values, options));
  const Kokkos::View<T*, memory> back(Kokkos::view_alloc(Kokkos::WithoutInitializing, "kompress::probe_back"),
                                      values.size());
  std::size_t length = 0;
  const auto [compress_time, decompress_time] = time_codec(exec, values, stream, back, options, length, who);
  codec_probe probe{double(bytes) / compress_time, double(bytes) / decompress_time, double(bytes) / double(length)};
  if (values.size() >= 4 * call_probe_values) {
    const Kokkos::View<const T*, memory, Kokkos::MemoryUnmanaged> head(values.data(), call_probe_values);
    const auto head_back = Kokkos::subview(back, std::pair<std::size_t, std::size_t>(0, call_probe_values));
    std::size_t head_length = 0;
    const auto [c, d] = time_codec(exec, head, stream, head_back, options, head_length, who);
    const double small = double(call_probe_values * sizeof(T));
    std::tie(probe.compress, probe.compress_call) = affine_codec_cost(small, c, double(bytes), compress_time);
    std::tie(probe.decompress, probe.decompress_call) = affine_codec_cost(small, d, double(bytes), decompress_time);
  }
  return probe;
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
  // The minimum of each: the slowest rank's rates, the lowest ratio, the highest call costs.
  double rates[6] = {codec.compress, codec.decompress, probes ? double(bytes) / link_time : INFINITY, codec.ratio,
                     -codec.compress_call, -codec.decompress_call};
  check_mpi(MPI_Allreduce(MPI_IN_PLACE, rates, 6, MPI_DOUBLE, MPI_MIN, comm), who, "MPI_Allreduce");
  cost_model model;
  model.compress_bytes_per_second = rates[0];
  model.decompress_bytes_per_second = rates[1];
  model.compress_call_seconds = -rates[4];
  model.decompress_call_seconds = -rates[5];
  if (shape.size > 1) model.link_bytes_per_second = rates[2];
  if (with_ratio) model.expected_ratio = rates[3];
  return model;
}

}  // namespace detail

/// Link: ranks 0 and 1 send each other `probe_bytes` at once, as the collectives do (both
/// directions busy): a full-duplex link gives each direction's rate, a shared one (a half-duplex
/// medium, a shaped loopback) each rank's share of it. Codec: compress and decompress a smooth
/// field of `probe_bytes` at REL 1e-3 on every rank, and its first 16 KiB: the rates beyond a
/// fixed cost per call, and that cost (cost_model::compress_call_seconds and
/// decompress_call_seconds). Slowest rank wins, for all. With one rank
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

  // The field lives where `exec` computes (a device's memory for a device's codec).
  const Kokkos::View<float*, typename Exec::memory_space> field(
      Kokkos::view_alloc(Kokkos::WithoutInitializing, "kompress::probe"), count);
  const auto filled = Kokkos::create_mirror_view(Kokkos::WithoutInitializing, field);
  for (std::size_t i = 0; i < count; ++i) filled(i) = float(std::sin(1e-3 * double(i)) + 1e-3 * double(i % 17));
  Kokkos::deep_copy(exec, field, filled);
  exec.fence(who);
  const auto codec = detail::probe_codec(exec, field, compress_options{.bound = relative(1e-3)}, who);
  return detail::agree_on_measurements(comm, shape, codec, false, bytes, who);
}

/// As above, with the codec probed on `sample`, this rank's share of the data the collectives
/// will carry (a View `exec` reaches, any length, at least one value), at `codec` (the
/// bound and block size they will use; a REL bound resolves against the sample): the model's
/// rates and per-call costs are the codec's on that data (a sample of fewer than 16,384 values
/// is timed whole: no per-call cost) and its expected_ratio the lowest ratio any rank's sample
/// reached. The probe_bytes and the bound must match on every rank.
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
