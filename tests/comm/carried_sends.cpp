// MPI_Isend through MPI's profiling interface: while kompress::test::kompress::test::p2p_calls.counting, it
// counts kompress's sends on the agreement tag (and their bytes) and on the collectives' data tag
// (comm/carried.hpp), then runs PMPI_Isend. Linked once into each executable that includes
// comm/carried.hpp.

#include "comm/carried.hpp"

#include <mpi.h>

extern "C" {
int MPI_Isend(const void* buffer, int count, MPI_Datatype type, int peer, int tag, MPI_Comm comm,
              MPI_Request* request) {
  if (kompress::test::p2p_calls.counting && type == MPI_BYTE) {
    if (tag == kompress::detail::agreement_tag) {
      ++kompress::test::p2p_calls.agreement_messages;
      kompress::test::p2p_calls.agreement_bytes += count;
    }
    if (tag == kompress::detail::collective_tag) ++kompress::test::p2p_calls.data_messages;
  }
  return PMPI_Isend(buffer, count, type, peer, tag, comm, request);
}
}
