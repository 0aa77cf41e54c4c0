#pragma once
// What the MPI tests of the collectives share: rank and size, the MPI type of an element, the
// smooth test data, and a check that a buffer holds the same bytes on every rank.

#include <Kokkos_Core.hpp>
#include <mpi.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <type_traits>
#include <vector>

namespace kompress::test {

using host = Kokkos::DefaultHostExecutionSpace;
template <class T>
using host_view = Kokkos::View<T*, Kokkos::HostSpace>;

inline int rank_of(MPI_Comm comm = MPI_COMM_WORLD) {
  int r = 0;
  MPI_Comm_rank(comm, &r);
  return r;
}
inline int size_of(MPI_Comm comm = MPI_COMM_WORLD) {
  int s = 0;
  MPI_Comm_size(comm, &s);
  return s;
}

template <class T>
MPI_Datatype mpi_type() {
  return std::is_same_v<T, float> ? MPI_FLOAT : MPI_DOUBLE;
}

/// An alltoallv layout with zero and uneven counts, in elements, blocks in rank order: rank r
/// sends (r + 2 j) % 5 * 997 values to rank j.
struct uneven_layout {
  std::vector<std::size_t> send_counts, send_displs, recv_counts, recv_displs;

  uneven_layout() {
    const int p = size_of(), me = rank_of();
    const auto count = [](int from, int to) { return std::size_t((from + 2 * to) % 5) * 997; };
    for (int j = 0; j < p; ++j) {
      send_counts.push_back(count(me, j));
      recv_counts.push_back(count(j, me));
    }
    send_displs.resize(send_counts.size());
    recv_displs.resize(recv_counts.size());
    std::exclusive_scan(send_counts.begin(), send_counts.end(), send_displs.begin(), std::size_t(0));
    std::exclusive_scan(recv_counts.begin(), recv_counts.end(), recv_displs.begin(), std::size_t(0));
  }
  std::size_t send_total() const { return send_displs.back() + send_counts.back(); }
  std::size_t recv_total() const { return recv_displs.back() + recv_counts.back(); }

  /// Plain MPI's answer: MPI_Alltoallv of `send` into `recv` with these counts.
  template <class T>
  void mpi_alltoallv(const T* send, T* recv) const {
    const auto ints = [](const std::vector<std::size_t>& v) { return std::vector<int>(v.begin(), v.end()); };
    const auto sc = ints(send_counts), sd = ints(send_displs), rc = ints(recv_counts), rd = ints(recv_displs);
    MPI_Alltoallv(send, sc.data(), sd.data(), mpi_type<T>(), recv, rc.data(), rd.data(), mpi_type<T>(),
                  MPI_COMM_WORLD);
  }
};

/// Smooth data with a rank-dependent phase (the seed) and noise.
template <class T>
host_view<T> make_data(std::size_t n, int seed, double scale = 10.0) {
  host_view<T> v("data", n);
  std::mt19937 rng(seed);
  std::normal_distribution<double> noise(0.0, 0.01);
  for (std::size_t i = 0; i < n; ++i) v(i) = T(std::sin(0.002 * double(i) + seed) * scale + noise(rng));
  return v;
}

/// Whether `bytes` bytes at `data` are the same on every rank (an FNV-1a checksum compared with
/// MPI).
inline bool identical_on_every_rank(const void* data, std::size_t bytes) {
  std::uint64_t h = 1469598103934665603ull;
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * 1099511628211ull;
  std::uint64_t lo = h, hi = h;
  MPI_Allreduce(MPI_IN_PLACE, &lo, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, &hi, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
  return lo == hi;
}
template <class T>
bool identical_on_every_rank(const host_view<T>& values) {
  return identical_on_every_rank(values.data(), values.size() * sizeof(T));
}

/// Whether two Views hold the same values bit for bit (raw transfers against plain MPI).
template <class T>
bool same_bytes(const host_view<T>& a, const host_view<T>& b) {
  return a.size() == b.size() && (a.size() == 0 || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

}  // namespace kompress::test
