#pragma once
// The compressed collectives (need MPI; link kompress::mpi): alltoall, alltoallv and
// allreduce on Kokkos Views, blocking and nonblocking, compressed on the wire within a bound.

#include <kompress/kompress.hpp>

#include <kompress/comm/allreduce.hpp>
#include <kompress/comm/alltoall.hpp>
#include <kompress/comm/options.hpp>
#include <kompress/comm/request.hpp>
#include <kompress/comm/measure.hpp>
