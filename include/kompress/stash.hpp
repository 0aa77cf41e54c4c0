#pragma once
// The compressed activation stash: save Views compressed within an error bound under a memory
// budget, restore them for the backward pass (docs/stash.md).

#include <kompress/stash/handle.hpp>
#include <kompress/stash/layer_bounds.hpp>
#include <kompress/stash/options.hpp>
#include <kompress/stash/policy.hpp>
#include <kompress/stash/pool.hpp>
#include <kompress/stash/save_options.hpp>
#include <kompress/stash/stats.hpp>
#include <kompress/stash/stash.hpp>
