#pragma once
// A small raw call sends its data with the agreement (docs/collectives.md, "Two ranks: the data
// rides the agreement" and "Three and four ranks"): every collective on two ranks, alltoall and
// allgather on three and four. What the suites that check it share: the element counts around
// the limits, which calls carry their data, and check_carried, which counts the MPI calls a call
// made (point-to-point sends here, counted by carried_sends.cpp; collectives by
// support/counted_collectives.hpp) to see that a carried call is one round of messages between
// pairs. An executable that includes this links carried_sends.cpp and
// support/counted_collectives.cpp.

#include <kompress/comm.hpp>

#include "support/counted_collectives.hpp"
#include "support/mpi_checks.hpp"

#include <doctest/doctest.h>

#include <cstddef>
#include <vector>

namespace kompress::test {

/// Point-to-point calls kompress made while `counting` (the test's own state: the library holds
/// none); its collectives are counted by support/counted_collectives.hpp.
struct p2p_counter {
  bool counting = false;
  long agreement_messages = 0;  ///< sends on the agreement tag
  long agreement_bytes = 0;
  long data_messages = 0;       ///< sends on the collectives' data tag (the engine, the ring)
};
inline p2p_counter p2p_calls;

/// Element counts per message around the limits: empty, one value, inside the agreement message
/// (on three and four ranks up to and at pairwise_inline_bytes, on two inline_payload_bytes),
/// just after it, at and after the limit of three and four ranks, and at and beyond
/// max_carried_bytes.
template <class T>
std::vector<std::size_t> counts_around_limits() {
  using kompress::detail::inline_payload_bytes;
  using kompress::detail::max_carried_bytes;
  using kompress::detail::max_pairwise_carried_bytes;
  using kompress::detail::pairwise_inline_bytes;
  return {0,
          1,
          1000,
          pairwise_inline_bytes / sizeof(T),
          pairwise_inline_bytes / sizeof(T) + 1,
          inline_payload_bytes / sizeof(T),
          inline_payload_bytes / sizeof(T) + 1,
          max_pairwise_carried_bytes / sizeof(T),
          max_pairwise_carried_bytes / sizeof(T) + 1,
          20000,
          max_carried_bytes / sizeof(T),
          max_carried_bytes / sizeof(T) + 1};
}

/// Which calls carry their data: every raw call of up to 1 MiB per message on two ranks, and
/// alltoall and allgather of up to 16 KiB on three and four, as docs/collectives.md promises
/// (stated here, not read from the library, so that a change of the library's limits shows).
enum class carried_on { two_ranks, up_to_pairwise_ranks };
inline constexpr int pairwise_ranks = 4;
inline constexpr std::size_t carried_up_to(int ranks) { return ranks == 2 ? std::size_t(1) << 20 : 16 * 1024; }

/// Runs `call` with MPI calls counted; checks that a payload of `payload_bytes` per message rode
/// the agreement where it may (a header and, unless inline on two ranks, one payload message to
/// each peer, and nothing else moved), and beyond that it did not.
template <class Call>
void check_carried(std::size_t payload_bytes, carried_on where, Call&& call) {
  p2p_calls = {};
  collective_calls = {};
  p2p_calls.counting = collective_calls.counting = true;
  call();
  p2p_calls.counting = collective_calls.counting = false;
  const int p = size_of();
  if (p == 1 || p > pairwise_ranks) return;
  const long peers = p - 1;
  constexpr long header_bytes = 64;
  const bool rides = payload_bytes <= carried_up_to(p) && (p == 2 || where == carried_on::up_to_pairwise_ranks);
  if (rides) {
    const bool one_message = payload_bytes <= (p == 2 ? kompress::detail::inline_payload_bytes : 4096);
    CHECK(collective_calls.count == 0);
    CHECK(p2p_calls.data_messages == 0);
    CHECK(p2p_calls.agreement_messages == peers * (one_message ? 1 : 2));
    CHECK(p2p_calls.agreement_bytes == peers * (header_bytes + long(payload_bytes)));
  } else {
    CHECK(p2p_calls.agreement_bytes == peers * header_bytes);  // the agreement alone, then the data
    if (payload_bytes > 0) CHECK(collective_calls.count + p2p_calls.data_messages > 0);
  }
}

}  // namespace kompress::test
