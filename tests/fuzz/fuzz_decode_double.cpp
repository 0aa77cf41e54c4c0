// The double decoder of the fuzzer (see fuzz_decode.hpp).
#include "fuzz_decode.hpp"

template std::uint64_t kompress_fuzz::decode<double>(const bytes_view&, std::uint64_t);
