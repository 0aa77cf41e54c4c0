#pragma once
// The compressed collectives (need MPI; link kompress::mpi): alltoall, alltoallv, allreduce,
// allgather and reduce_scatter on Kokkos Views, blocking, nonblocking and persistent,
// compressed on the wire within a bound; allreduce, reduce_scatter and allgather over node_groups,
// compressed across nodes only.
// Includes the codec they are built on, not the stash.

#include <kompress/version.hpp>
#include <kompress/error.hpp>
#include <kompress/bound.hpp>
#include <kompress/format.hpp>
#include <kompress/compress.hpp>

#include <kompress/comm/allgather.hpp>
#include <kompress/comm/allreduce.hpp>
#include <kompress/comm/alltoall.hpp>
#include <kompress/comm/hierarchical_allgather.hpp>
#include <kompress/comm/hierarchical_allreduce.hpp>
#include <kompress/comm/hierarchical_reduce_scatter.hpp>
#include <kompress/comm/hierarchical_workspace.hpp>
#include <kompress/comm/node_groups.hpp>
#include <kompress/comm/options.hpp>
#include <kompress/comm/persistent.hpp>
#include <kompress/comm/reduce_scatter.hpp>
#include <kompress/comm/request.hpp>
#include <kompress/comm/workspace.hpp>
#include <kompress/comm/measure.hpp>
