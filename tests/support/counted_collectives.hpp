#pragma once
// MPI's collectives, counted through MPI's profiling interface: while
// kompress::test::collective_calls.counting, every call of MPI_(I)allreduce, MPI_(I)allgather,
// MPI_(I)reduce_scatter_block, MPI_Alltoall and MPI-4's persistent *_init forms of the first
// three adds one to collective_calls.count, then runs the PMPI function. For tests that check
// which path a kompress call took. The MPI functions are defined in counted_collectives.cpp:
// link it into the test executable (once) and include this header where the count is read.

#include <mpi.h>

namespace kompress::test {

struct collective_counter {
  bool counting = false;
  long count = 0;
};
/// The test's own state (the library holds none).
inline collective_counter collective_calls;

inline void count_collective() {
  if (collective_calls.counting) ++collective_calls.count;
}

}  // namespace kompress::test
