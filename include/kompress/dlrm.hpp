#pragma once
// The DLRM embedding exchange (needs MPI; link kompress::mpi).

#include <kompress/comm.hpp>
#include <kompress/dlrm/embedding_exchange.hpp>
