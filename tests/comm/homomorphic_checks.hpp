#pragma once
// What the checks of the homomorphic reduction (collective_options::reduction =
// reduction_method::homomorphic) of allreduce and reduce_scatter share: the per-rank bound and
// its grid step, the exact integer sum of every rank's codes, the comparison with MPI's sum
// (NaN and infinities included), and the option sets and sizes both are run with.

#include <kompress/comm.hpp>

#include "support/mpi_checks.hpp"

#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

namespace kompress::test {

/// The per-rank bound e: ABS as given, REL over all ranks' values; total divides it p ways.
template <class T>
double per_rank_bound(const host_view<T>& send, const kompress::collective_options& options) {
  double e = options.codec.bound.value;
  if (options.codec.bound.mode == kompress::bound_mode::relative) {
    double lo = INFINITY, hi = -INFINITY;
    for (std::size_t i = 0; i < send.size(); ++i)
      if (std::isfinite(send(i))) {
        lo = std::min(lo, double(send(i)));
        hi = std::max(hi, double(send(i)));
      }
    MPI_Allreduce(MPI_IN_PLACE, &lo, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, &hi, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    e = lo <= hi ? e * (hi - lo) : 0.0;
  }
  return options.reduction_bound == kompress::allreduce_bound::total ? e / size_of() : e;
}

/// The grid step the documentation promises: the largest power of two <= 2e.
inline double grid_step(double e) {
  int exponent = 0;
  std::frexp(2.0 * e, &exponent);
  return std::ldexp(1.0, exponent - 1);
}

inline bool on_every_rank(bool b) {
  int v = b;
  MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);
  return v != 0;
}

/// Every rank's send View, concatenated in rank order.
template <class T>
std::vector<T> gather_all(const host_view<T>& send) {
  std::vector<T> all(send.size() * std::size_t(size_of()));
  MPI_Allgather(send.data(), int(send.size()), mpi_type<T>(), all.data(), int(send.size()), mpi_type<T>(),
                MPI_COMM_WORLD);
  return all;
}

/// The value of the exact integer sum of the ranks' codes for element i of a `count`-value
/// send View: T(sum_r round(x_r / s) * s).
template <class T>
T code_sum_value(const std::vector<T>& all, std::size_t count, std::size_t i, double step) {
  std::int64_t sum = 0;
  for (int r = 0; r < size_of(); ++r)
    sum += std::int64_t(std::nearbyint(double(all[std::size_t(r) * count + i]) / step));
  return T(double(sum) * step);
}

/// How many values of `got` are not MPI's `expected` within the bound plus floating-point
/// summation error (two summation orders, and the result's rounding to T; allreduce.cpp's
/// allowance): NaN where MPI has NaN, the same infinity where it has one.
template <class T>
std::size_t homomorphic_violations(const host_view<T>& got, const host_view<T>& expected,
                                   const host_view<T>& magnitude, double bound) {
  constexpr double eps = std::numeric_limits<T>::epsilon();
  const int p = size_of();
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(expected(i))) wrong += !std::isnan(got(i));
    else if (std::isinf(expected(i))) wrong += got(i) != expected(i);
    else
      wrong += !(std::fabs(double(got(i)) - double(expected(i))) <=
                 bound + 2.0 * p * eps * (double(magnitude(i)) + bound));
  }
  return wrong;
}

template <class T>
host_view<T> magnitudes(const host_view<T>& send) {
  host_view<T> m("magnitude", send.size());
  for (std::size_t i = 0; i < send.size(); ++i) m(i) = std::isfinite(send(i)) ? std::fabs(send(i)) : T(0);
  return m;
}

inline kompress::collective_options homomorphic(kompress::collective_options options) {
  options.reduction = kompress::reduction_method::homomorphic;
  return options;
}

/// The homomorphic collectives are checked with each of these, at each of homomorphic_sizes.
inline const kompress::collective_options homomorphic_option_sets[] = {
    homomorphic({.codec = {.bound = kompress::absolute(1e-3)}}),
    homomorphic({.codec = {.bound = kompress::relative(1e-3)}}),
    homomorphic({.codec = {.bound = kompress::absolute(1e-2), .block_size = 64},
                 .reduction_bound = kompress::allreduce_bound::total}),
    homomorphic({.codec = {.bound = kompress::absolute(3e-3), .block_size = 128}}),
    homomorphic({.codec = {.bound = kompress::absolute(1e-3)}, .mode = kompress::transfer_mode::automatic}),
    homomorphic({.codec = {.bound = kompress::absolute(1e-3)}, .mode = kompress::transfer_mode::raw}),
};

inline constexpr std::size_t homomorphic_sizes[] = {0, 1, 33, 5000, 300001};

}  // namespace kompress::test
