#pragma once
// The registration of storage tiers: which tiers a budget policy puts after the pool, in
// order. A new tier: its class in stash/detail/<name>_tier.hpp, an action in budget_policy
// (stash/policy.hpp), its lines here, and, if it should be reported separately, a field in
// stash_placement and stash_stats (its count() and report() fill them).

#include <kompress/stash/detail/file_tier.hpp>
#include <kompress/stash/detail/host_tier.hpp>
#include <kompress/stash/detail/tier.hpp>
#include <kompress/stash/policy.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace kompress::inline v0::detail {

/// What the tiers after the pool may need to know about their stash.
struct tier_context {
  std::uint64_t stash_id = 0;         ///< names its spill file
  std::size_t budget_bytes = 0;       ///< sizes host arenas
  std::size_t largest_stream = 0;     ///< one segment's worst case: staging buffers
};

/// The tiers a segment that does not fit the pool goes to, in order (none: the policy throws
/// or loosens the bound). Checks the policy's arguments (throws invalid_argument).
template <class ExecutionSpace>
std::vector<std::unique_ptr<storage_tier<ExecutionSpace>>> make_spill_tiers(
    const budget_policy& policy, const tier_context& context) {
  std::vector<std::unique_ptr<storage_tier<ExecutionSpace>>> tiers;
  switch (policy.what) {
    case budget_policy::action::spill_host:
      tiers.push_back(std::make_unique<host_tier<ExecutionSpace>>(context.budget_bytes));
      break;
    case budget_policy::action::spill_file:
      tiers.push_back(std::make_unique<file_tier<ExecutionSpace>>(
          policy.directory, context.stash_id, context.largest_stream));
      break;
    case budget_policy::action::throw_error:
    case budget_policy::action::loosen_bound:
      break;
  }
  return tiers;
}

inline const char* policy_name(budget_policy::action action) {
  switch (action) {
    case budget_policy::action::spill_host: return "spill_host";
    case budget_policy::action::spill_file: return "spill_file";
    case budget_policy::action::loosen_bound: return "loosen_bound";
    case budget_policy::action::throw_error: break;
  }
  return "throw_error";
}

}  // namespace kompress::inline v0::detail
