#pragma once
// What the comm suites (tests/comm/*.cpp) share beyond support/mpi_checks.hpp: the bounds the
// senders and the agreement resolve, the option sets and sizes several collectives are run
// with, the rounds of a persistent request, the pipelined calls' options, the ring collectives
// on the execution space's memory, and test data.

#include <kompress/comm.hpp>

#include "support/device_views.hpp"
#include "support/mpi_checks.hpp"

#include <doctest/doctest.h>
#include <mpi.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <string_view>
#include <utility>
#include <vector>

namespace kompress::test {

// --- bounds -------------------------------------------------------------------------------------

/// The absolute bound a sender applies: ABS as given, REL over its whole send View.
template <class T>
double sender_bound(const host_view<T>& send, const kompress::error_bound& bound) {
  if (bound.mode == kompress::bound_mode::absolute) return bound.value;
  double lo = INFINITY, hi = -INFINITY;
  for (std::size_t i = 0; i < send.size(); ++i)
    if (std::isfinite(send(i))) {
      lo = std::min(lo, double(send(i)));
      hi = std::max(hi, double(send(i)));
    }
  return lo <= hi ? bound.value * (hi - lo) : 0.0;
}

/// Every rank's sender bound, indexed by rank.
inline std::vector<double> all_bounds(double mine) {
  std::vector<double> bounds(size_of());
  MPI_Allgather(&mine, 1, MPI_DOUBLE, bounds.data(), 1, MPI_DOUBLE, MPI_COMM_WORLD);
  return bounds;
}

/// The largest of every rank's `value`.
inline double max_over_ranks(double value) {
  MPI_Allreduce(MPI_IN_PLACE, &value, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return value;
}

/// How many values of `got` lie farther than `bound` from `expected` (a NaN among them counts).
template <class T>
std::size_t values_outside(const host_view<T>& got, const host_view<T>& expected, double bound) {
  std::size_t outside = 0;
  for (std::size_t k = 0; k < got.size(); ++k) outside += !(std::fabs(double(got(k)) - double(expected(k))) <= bound);
  return outside;
}

/// Every rank's bound over its values to other ranks, blocks of `per_peer` (an alltoall's REL
/// bound resolves over those).
template <class T>
std::vector<double> bounds_over_blocks_to_others(const host_view<T>& send, std::size_t per_peer,
                                                 const kompress::error_bound& bound) {
  double mine = bound.value;
  if (bound.mode == kompress::bound_mode::relative) {
    double lo = INFINITY, hi = -INFINITY;
    for (std::size_t k = 0; k < send.size(); ++k)
      if (k / per_peer != std::size_t(rank_of())) {
        lo = std::min(lo, double(send(k)));
        hi = std::max(hi, double(send(k)));
      }
    mine = lo <= hi ? bound.value * (hi - lo) : 0.0;
  }
  std::vector<double> bounds(static_cast<std::size_t>(size_of()));
  MPI_Allgather(&mine, 1, MPI_DOUBLE, bounds.data(), 1, MPI_DOUBLE, MPI_COMM_WORLD);
  return bounds;
}

/// The absolute bound of every compression of a ring collective: ABS as given, REL over all
/// ranks' send Views together.
template <class T>
double agreed_bound(const host_view<T>& send, const kompress::error_bound& bound) {
  if (bound.mode == kompress::bound_mode::absolute) return bound.value;
  double lo = INFINITY, hi = -INFINITY;
  for (std::size_t i = 0; i < send.size(); ++i) {
    lo = std::min(lo, double(send(i)));
    hi = std::max(hi, double(send(i)));
  }
  MPI_Allreduce(MPI_IN_PLACE, &lo, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, &hi, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return lo <= hi ? bound.value * (hi - lo) : 0.0;
}

/// What the options mean for the transfer: raw (exact, MPI's own) or compressed.
inline bool may_compress(const kompress::collective_options& options) {
  return options.mode != kompress::transfer_mode::raw;
}

// --- schedules ----------------------------------------------------------------------------------

/// Whether a compressing reduce_scatter or allgather of `bytes` (the whole vector) on
/// MPI_COMM_WORLD runs recursive halving or doubling rather than the ring.
inline bool butterfly_runs(const kompress::collective_options& options, std::uint64_t bytes,
                           kompress::detail::butterfly_collective collective) {
  if (collective == kompress::detail::butterfly_collective::reduce_scatter &&
      options.reduction == kompress::reduction_method::homomorphic)
    return false;
  return kompress::detail::takes_halving_doubling(options.schedule, {options.mode, options.cost}, bytes, size_of(),
                                                  collective);
}

/// The messages this rank sends in a compressing reduce_scatter or allgather (one phase): the
/// ring's p - 1; the butterfly's log2 p' steps, one more on a core rank that folds (the unfold),
/// one in all on a folded rank (the fold).
inline std::uint64_t one_phase_messages(bool butterfly) {
  const int p = size_of(), me = rank_of();
  if (!butterfly) return std::uint64_t(p - 1);
  const int core = int(std::bit_floor(unsigned(p)));
  const bool folds = me < 2 * (p - core), folded_out = folds && me % 2 == 0;
  return folded_out ? 1 : std::uint64_t(std::countr_zero(unsigned(core))) + (folds ? 1 : 0);
}

/// The schedules the "both schedules" cases run each collective with.
inline constexpr kompress::collective_schedule all_schedules[] = {kompress::collective_schedule::ring,
                                                                  kompress::collective_schedule::halving_doubling,
                                                                  kompress::collective_schedule::automatic};

/// Counts this rank's codec calls while it lives (Kokkos Tools regions, outermost only):
/// "kompress::decompress" once per stream decoded alone or per batch decoded together,
/// "kompress::compress" (and compress_async) likewise.
class codec_call_counter {
 public:
  codec_call_counter() {
    compressions_ = decompressions_ = depth_ = 0;
    Kokkos::Tools::Experimental::set_push_region_callback([](const char* name) {
      const std::string_view region(name);
      const bool decompress = region == "kompress::decompress";
      const bool compress = region == "kompress::compress" || region == "kompress::compress_async";
      if (depth_ > 0) ++depth_;
      else if (decompress || compress) {
        depth_ = 1;
        ++(decompress ? decompressions_ : compressions_);
      }
    });
    Kokkos::Tools::Experimental::set_pop_region_callback([] {
      if (depth_ > 0) --depth_;
    });
  }
  ~codec_call_counter() {
    Kokkos::Tools::Experimental::set_push_region_callback(nullptr);
    Kokkos::Tools::Experimental::set_pop_region_callback(nullptr);
  }
  codec_call_counter(const codec_call_counter&) = delete;
  codec_call_counter& operator=(const codec_call_counter&) = delete;
  /// The decompressions, or compressions, since the last take of that kind.
  int take_decompressions() { return std::exchange(decompressions_, 0); }
  int take_compressions() { return std::exchange(compressions_, 0); }

 private:
  static inline int compressions_ = 0, decompressions_ = 0, depth_ = 0;
};

// --- options ------------------------------------------------------------------------------------

inline const kompress::collective_options raw{.mode = kompress::transfer_mode::raw};
inline const kompress::collective_options abs_options{.codec = {.bound = kompress::absolute(1e-3)}};

/// The one-shot allgather and reduce_scatter are checked with each of these.
inline const kompress::collective_options ring_option_sets[] = {
    {.codec = {.bound = kompress::relative(1e-3)}},
    {.codec = {.bound = kompress::absolute(1e-3)}},
    {.codec = {.bound = kompress::absolute(1e-2)}, .reduction_bound = kompress::allreduce_bound::total},
    {.codec = {.bound = kompress::absolute(1e-3)}, .mode = kompress::transfer_mode::raw},
    {.codec = {.bound = kompress::absolute(1e-3)}, .mode = kompress::transfer_mode::automatic},
};

// --- persistent requests ------------------------------------------------------------------------

/// Rounds of each persistent request.
inline constexpr int persistent_rounds = 3;

/// The persistent collectives are checked with each of these, at each of persistent_sizes.
inline const kompress::collective_options persistent_option_sets[] = {
    {.codec = {.bound = kompress::relative(1e-3)}},
    {.codec = {.bound = kompress::absolute(1e-3)}},
    {.codec = {.bound = kompress::absolute(1e-3)}, .mode = kompress::transfer_mode::raw},
    // automatic at the default model: raw at these sizes
    {.codec = {.bound = kompress::absolute(1e-3)}, .mode = kompress::transfer_mode::automatic},
    // automatic over a slow link: compressed
    {.codec = {.bound = kompress::relative(1e-3)},
     .mode = kompress::transfer_mode::automatic,
     .cost = {.link_bytes_per_second = 1e5, .min_message_bytes = 0}},
};
inline constexpr std::size_t persistent_sizes[] = {0, 1, 33, 5000};

/// New values in the same View for each round (the point of a persistent request).
template <class T>
void refill(const host_view<T>& view, int seed, int round) {
  const auto fresh = make_data<T>(view.size(), seed + 1000 * round, 10.0 + 5.0 * round);
  Kokkos::deep_copy(view, fresh);
}

/// One round of `request`, completed three different ways over the rounds.
inline const kompress::collective_report& run_round(kompress::persistent_request& request, int round) {
  switch (round % 3) {
    case 0:
      request.start();
      CHECK(request.active());
      return request.wait();
    case 1:
      request.start();
      while (!request.test()) {
      }
      CHECK(!request.active());
      return request.report();
    default: return request.run();
  }
}

// --- pipelined calls ----------------------------------------------------------------------------

/// The absolute bound of the pipelined calls.
inline constexpr double pipelined_abs_bound = 1e-3;

/// Compressed mode with chunks of `chunk_bytes` (0: the cost model's own chunks, made small
/// enough to cut test-sized messages).
inline kompress::collective_options chunked(std::size_t chunk_bytes) {
  kompress::collective_options o{.codec = {.bound = kompress::absolute(pipelined_abs_bound)}};
  if (chunk_bytes > 0) {
    o.cost.fixed_chunk_bytes = chunk_bytes;
  } else {
    o.cost.min_chunk_bytes = 4096;
    o.cost.chunk_seconds = 1e-6;
  }
  return o;
}

/// The report of `blocking()`, or of the request `start()` returns, polled with test() to the end.
template <class T>
kompress::collective_report finish(bool nonblocking, auto&& blocking, auto&& start) {
  if (!nonblocking) return blocking();
  kompress::request r = start();
  while (!r.test()) {
  }
  return r.wait();
}

/// Chunk sizes in bytes: one value, a chunk that is no multiple of the codec's block, one of
/// exactly 1024 values, and the cost model's own (0).
inline constexpr std::size_t chunk_sizes[] = {sizeof(double), 1000, 4096, 0};

/// The pipelined grid: every chunk size above, the counts `counts`, blocking and nonblocking;
/// `check(n, options, nonblocking)` for each, but chunks of one value only up to `max_one_value`
/// values (thousands of one-value messages: slow, and nothing new).
template <class Check>
void for_each_pipelined_case(std::initializer_list<std::size_t> counts, std::size_t max_one_value, Check&& check) {
  for (const std::size_t chunk : chunk_sizes)
    for (const std::size_t n : counts)
      for (const bool nonblocking : {false, true}) {
        CAPTURE(chunk);
        CAPTURE(n);
        CAPTURE(nonblocking);
        if (chunk == sizeof(double) && n > max_one_value) continue;
        check(n, chunked(chunk), nonblocking);
      }
}

/// The homomorphic reduction pipelined: pieces that are no multiple of a block (1000 bytes) and
/// many pieces per hop, so that the codes of one chunk's pieces are sent while the next chunk's
/// pieces arrive and are added; `check(n, options, nonblocking)` for each case.
template <class Check>
void for_each_pipelined_homomorphic_case(Check&& check) {
  for (const std::size_t chunk : {std::size_t(1000), std::size_t(4096), std::size_t(0)})
    for (const std::size_t n : {std::size_t(0), std::size_t(1), std::size_t(1023), std::size_t(60001)})
      for (const bool nonblocking : {false, true}) {
        CAPTURE(chunk);
        CAPTURE(n);
        CAPTURE(nonblocking);
        auto options = chunked(chunk);
        options.reduction = kompress::reduction_method::homomorphic;
        check(n, options, nonblocking);
      }
}

/// The ratio codec on the wire, whole and pipelined, block size options 32 and 128: its streams
/// have their own worst case (block size 32 whatever block_size says), and the staging of every
/// path must be sized for it, not for the fast codec's block; `check(n, options, nonblocking)`.
template <class Check>
void for_each_ratio_codec_case(Check&& check) {
  constexpr std::size_t whole = std::size_t(-1);
  for (const int block_size : {32, 128})
    for (const std::size_t chunk : {std::size_t(1000), whole})
      for (const std::size_t n : {std::size_t(1), std::size_t(4099)})
        for (const bool nonblocking : {false, true}) {
          CAPTURE(block_size);
          CAPTURE(chunk);
          CAPTURE(n);
          CAPTURE(nonblocking);
          auto options = chunked(chunk == whole ? 0 : chunk);
          options.cost.pipeline = chunk != whole;
          options.codec.codec = kompress::codec_mode::ratio;
          options.codec.block_size = block_size;
          check(n, options, nonblocking);
        }
}

/// A pipelined (i)alltoall against MPI_Alltoall: the block to itself exact, the others within
/// pipelined_abs_bound, one message per peer cut into the chunks the options fix.
template <class T>
void check_pipelined_alltoall(std::size_t per_peer, const kompress::collective_options& options, bool nonblocking) {
  const int p = size_of(), me = rank_of();
  auto send = make_data<T>(per_peer * std::size_t(p), me + 1);
  host_view<T> expected("expected", send.size()), got("got", send.size());
  MPI_Alltoall(send.data(), int(per_peer), mpi_type<T>(), expected.data(), int(per_peer), mpi_type<T>(),
               MPI_COMM_WORLD);
  const auto report = finish<T>(
      nonblocking, [&] { return kompress::alltoall(host{}, send, got, MPI_COMM_WORLD, options); },
      [&] { return kompress::ialltoall(host{}, send, got, MPI_COMM_WORLD, options); });
  std::size_t violations = 0;
  for (std::size_t k = 0; k < send.size(); ++k) {
    const double e = k / per_peer == std::size_t(me) ? 0.0 : pipelined_abs_bound;  // the block to itself is exact
    violations += !(std::fabs(double(got(k)) - double(expected(k))) <= e);
  }
  CHECK(violations == 0);
  CHECK(report.messages == std::uint64_t(per_peer && p > 1 ? p - 1 : 0));
  if (per_peer > 0 && p > 1) {
    const std::size_t chunk = options.cost.fixed_chunk_bytes / sizeof(T);
    if (chunk > 0) CHECK(report.chunks == std::uint64_t(p - 1) * ((per_peer + chunk - 1) / chunk));
    CHECK(report.absolute_bound <= pipelined_abs_bound);
  }
}

// --- the execution space's memory ---------------------------------------------------------------

enum class form { blocking, nonblocking, persistent };

/// Runs one ring collective (allreduce, allgather or reduce_scatter) on Views in the execution
/// space's memory in the given form; returns the result on the host.
template <class T, class Call, class ICall, class Init>
host_view<T> run_ring(form how, const device_view<T>& send, std::size_t out_size, Call&& call, ICall&& icall,
                      Init&& init) {
  device_view<T> got("got", out_size);
  switch (how) {
    case form::blocking: call(send, got); break;
    case form::nonblocking: icall(send, got).wait(); break;
    case form::persistent: {
      kompress::persistent_request rounds = init(send, got);
      for (int round = 0; round < 2; ++round) rounds.run();
    } break;
  }
  return to_host(got);
}

/// How many |got - expected| exceed `bound` plus the rounding of two summation orders (none
/// without magnitudes).
template <class T>
std::size_t count_beyond(const host_view<T>& got, const host_view<T>& expected, const host_view<T>& magnitude,
                         double bound) {
  std::size_t bad = 0;
  constexpr double eps = std::numeric_limits<T>::epsilon();
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double slack = magnitude.size() ? 2.0 * size_of() * eps * double(magnitude(i)) : 0.0;
    bad += !(std::fabs(double(got(i)) - double(expected(i))) <= bound + slack);
  }
  return bad;
}

// --- data ---------------------------------------------------------------------------------------

/// A plain sine wave of amplitude 5 (no noise), rank-dependent through the seed.
inline host_view<float> sine_values(std::size_t n, int seed) {
  host_view<float> v("data", n);
  for (std::size_t i = 0; i < n; ++i) v(i) = float(std::sin(0.01 * double(i) + seed) * 5.0);
  return v;
}

/// NaN every 97 values, alternating infinities every 211 from 13, -0.0 every 301 from 50.
template <class T>
void sprinkle_special_values(host_view<T>& v) {
  for (std::size_t i = 0; i < v.size(); i += 97) v(i) = std::numeric_limits<T>::quiet_NaN();
  for (std::size_t i = 13; i < v.size(); i += 211) v(i) = (i / 211) % 2 ? std::numeric_limits<T>::infinity()
                                                                       : -std::numeric_limits<T>::infinity();
  for (std::size_t i = 50; i < v.size(); i += 301) v(i) = T(-0.0);
}

/// A ring collective under each schedule (all_schedules): `one_shot(n, options, nonblocking)`
/// for each ring option set, blocking and nonblocking; `pipelined(n, options, nonblocking)` for
/// each pipelined case; `persistent(n, options)` at ABS 1e-3.
template <class OneShot, class Pipelined, class Persistent>
void for_each_schedule_case(OneShot&& one_shot, Pipelined&& pipelined, Persistent&& persistent) {
  for (const auto schedule : all_schedules) {
    CAPTURE(int(schedule));
    for (const std::size_t n : {std::size_t(0), std::size_t(1), std::size_t(33), std::size_t(5000)})
      for (kompress::collective_options options : ring_option_sets)
        for (const bool nonblocking : {false, true}) {
          CAPTURE(n);
          CAPTURE(int(options.mode));
          CAPTURE(nonblocking);
          options.schedule = schedule;
          one_shot(n, options, nonblocking);
        }
    for_each_pipelined_case({0, 1, 1023, 60001}, 1023, [&](std::size_t n, auto options, bool nonblocking) {
      options.schedule = schedule;
      pipelined(n, options, nonblocking);
    });
    kompress::collective_options options = abs_options;
    options.schedule = schedule;
    persistent(std::size_t(5000), options);
  }
}

}  // namespace kompress::test
