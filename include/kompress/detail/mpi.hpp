#pragma once
// MPI plumbing for the collectives: return-code checks that throw, byte counts that fit an
// int, an owned duplicate of a communicator. Standard MPI only, so any MPI works.

#include <kompress/error.hpp>

#include <mpi.h>

#include <climits>
#include <cstddef>
#include <string>
#include <type_traits>
#include <vector>

namespace kompress::inline v0 {

namespace detail {

inline void check_mpi(int code, const char* who, const char* call) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  MPI_Error_string(code, text, &length);
  throw mpi_error(std::string(who) + ": " + call + " failed: " + std::string(text, length), code);
}

/// Message lengths travel as MPI int counts of bytes.
inline int byte_count(std::size_t bytes, const char* who) {
  if (bytes > std::size_t(INT_MAX))
    throw invalid_argument(std::string(who) + ": a message to one peer of " + std::to_string(bytes) +
                           " bytes exceeds MPI's int count (2 GiB); split the exchange");
  return static_cast<int>(bytes);
}

/// Tag of every message a blocking kompress collective sends on the caller's communicator.
/// Nonblocking ones use a duplicate of it, so several can be in flight.
inline constexpr int collective_tag = 0x6B70;

/// An owned MPI_Comm_dup, freed on destruction.
class owned_comm {
 public:
  owned_comm() = default;
  owned_comm(MPI_Comm comm, const char* who) {
    check_mpi(MPI_Comm_dup(comm, &comm_), who, "MPI_Comm_dup");
  }
  owned_comm(const owned_comm&) = delete;
  owned_comm& operator=(const owned_comm&) = delete;
  owned_comm(owned_comm&& other) noexcept : comm_(other.comm_) { other.comm_ = MPI_COMM_NULL; }
  owned_comm& operator=(owned_comm&& other) noexcept {
    if (this != &other) {
      release();
      comm_ = other.comm_;
      other.comm_ = MPI_COMM_NULL;
    }
    return *this;
  }
  ~owned_comm() { release(); }
  MPI_Comm get() const { return comm_; }

 private:
  void release() {
    // After MPI_Finalize (a Python object collected at exit) there is nothing left to free.
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (comm_ != MPI_COMM_NULL && !finalized) MPI_Comm_free(&comm_);
    comm_ = MPI_COMM_NULL;
  }
  MPI_Comm comm_ = MPI_COMM_NULL;
};

struct comm_shape {
  int rank = 0;
  int size = 1;
};

/// Rank and size; a communicator of one rank is fine (every collective is then a local copy).
inline comm_shape shape_of(MPI_Comm comm, const char* who) {
  comm_shape shape;
  check_mpi(MPI_Comm_rank(comm, &shape.rank), who, "MPI_Comm_rank");
  check_mpi(MPI_Comm_size(comm, &shape.size), who, "MPI_Comm_size");
  return shape;
}

template <class T>
MPI_Datatype mpi_type() {
  return std::is_same_v<T, float> ? MPI_FLOAT : MPI_DOUBLE;
}

}  // namespace detail
}  // namespace kompress::inline v0
