#pragma once
// The umbrella header: everything in kompress that needs no MPI (the codec and the stash).
// The compressed collectives live in kompress/comm.hpp (they need MPI).

#include <kompress/version.hpp>
#include <kompress/error.hpp>
#include <kompress/bound.hpp>
#include <kompress/format.hpp>
#include <kompress/compress.hpp>
#include <kompress/stash.hpp>
