// The double decoder of the fuzzer (see fuzz_decode.hpp).
#include "fuzz_decode.hpp"

template void kompress_fuzz::decode<double>(const bytes_view&, std::uint64_t);
