#pragma once
// Every backend of the kernels. The primary template (portable.hpp) serves any execution
// space; each file below specializes it for some. A new backend: one file, one line here.

#include <kompress/kernels/backend/portable.hpp>
#include <kompress/kernels/backend/host.hpp>
#include <kompress/kernels/backend/cuda.hpp>
