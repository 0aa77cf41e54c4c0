// The MPI collectives support/counted_collectives.hpp counts, defined here once per test
// executable that links this file: each adds one to kompress::test::collective_calls.count while
// counting, then runs the PMPI function.

#include "support/counted_collectives.hpp"

#include <mpi.h>

extern "C" {
int MPI_Allreduce(const void* in, void* out, int count, MPI_Datatype type, MPI_Op op, MPI_Comm comm) {
  kompress::test::count_collective();
  return PMPI_Allreduce(in, out, count, type, op, comm);
}
int MPI_Iallreduce(const void* in, void* out, int count, MPI_Datatype type, MPI_Op op, MPI_Comm comm,
                   MPI_Request* request) {
  kompress::test::count_collective();
  return PMPI_Iallreduce(in, out, count, type, op, comm, request);
}
int MPI_Allgather(const void* in, int in_count, MPI_Datatype in_type, void* out, int out_count, MPI_Datatype out_type,
                  MPI_Comm comm) {
  kompress::test::count_collective();
  return PMPI_Allgather(in, in_count, in_type, out, out_count, out_type, comm);
}
int MPI_Iallgather(const void* in, int in_count, MPI_Datatype in_type, void* out, int out_count,
                   MPI_Datatype out_type, MPI_Comm comm, MPI_Request* request) {
  kompress::test::count_collective();
  return PMPI_Iallgather(in, in_count, in_type, out, out_count, out_type, comm, request);
}
int MPI_Reduce_scatter_block(const void* in, void* out, int count, MPI_Datatype type, MPI_Op op, MPI_Comm comm) {
  kompress::test::count_collective();
  return PMPI_Reduce_scatter_block(in, out, count, type, op, comm);
}
int MPI_Ireduce_scatter_block(const void* in, void* out, int count, MPI_Datatype type, MPI_Op op, MPI_Comm comm,
                              MPI_Request* request) {
  kompress::test::count_collective();
  return PMPI_Ireduce_scatter_block(in, out, count, type, op, comm, request);
}
int MPI_Alltoall(const void* in, int in_count, MPI_Datatype in_type, void* out, int out_count, MPI_Datatype out_type,
                 MPI_Comm comm) {
  kompress::test::count_collective();
  return PMPI_Alltoall(in, in_count, in_type, out, out_count, out_type, comm);
}
#if MPI_VERSION >= 4
int MPI_Allreduce_init(const void* in, void* out, int count, MPI_Datatype type, MPI_Op op, MPI_Comm comm,
                       MPI_Info info, MPI_Request* request) {
  kompress::test::count_collective();
  return PMPI_Allreduce_init(in, out, count, type, op, comm, info, request);
}
int MPI_Allgather_init(const void* in, int in_count, MPI_Datatype in_type, void* out, int out_count,
                       MPI_Datatype out_type, MPI_Comm comm, MPI_Info info, MPI_Request* request) {
  kompress::test::count_collective();
  return PMPI_Allgather_init(in, in_count, in_type, out, out_count, out_type, comm, info, request);
}
int MPI_Reduce_scatter_block_init(const void* in, void* out, int count, MPI_Datatype type, MPI_Op op, MPI_Comm comm,
                                  MPI_Info info, MPI_Request* request) {
  kompress::test::count_collective();
  return PMPI_Reduce_scatter_block_init(in, out, count, type, op, comm, info, request);
}
#endif
}
