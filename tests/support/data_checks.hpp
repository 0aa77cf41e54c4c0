#pragma once
// Tests on real data that need what only the full data set has: on the repository's sample
// they skip with a reason line (a doctest MESSAGE, which scripts/dev test also lists at the
// end); on the full set a missing file stays an error (support/data_sample.hpp).

#include <doctest/doctest.h>

#include "data_sample.hpp"

/// Leaves the test case, saying why, when the data folder is the repository's sample and lacks
/// `name` (a file name, or an array's stem as kompress::test::find_array takes).
#define KOMPRESS_TEST_NEEDS_DATA(name)                                                         \
  do {                                                                                         \
    if (const auto kompress_skip_reason = ::kompress::test::missing_from_sample(name)) {       \
      MESSAGE(*kompress_skip_reason);                                                          \
      return;                                                                                  \
    }                                                                                          \
  } while (false)
