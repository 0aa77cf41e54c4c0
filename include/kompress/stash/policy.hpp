#pragma once
// What a stash does when a save does not fit its budget: throw, spill to the next storage tier
// (host memory, a file), or retry with a looser bound.

#include <kompress/bound.hpp>

#include <filesystem>
#include <utility>

namespace kompress {
inline namespace v0 {

/// The action a stash takes when a compressed segment does not fit in its pool. Whatever the
/// action, data is never dropped: the save either places every byte or throws and keeps
/// nothing.
struct budget_policy {
  enum class action {
    throw_error,   ///< throw kompress::budget_exceeded (the default)
    spill_host,    ///< copy the segment's stream to a host-memory arena
    spill_file,    ///< write the segment's stream to a file in `directory`
    loosen_bound,  ///< retry the whole save with the bound times `growth`, up to `ceiling`
  };

  action what = action::throw_error;
  /// spill_file: an existing directory; the stash creates one file in it and removes it when
  /// destroyed.
  std::filesystem::path directory{};
  /// loosen_bound: the loosest bound allowed; same mode (absolute/relative) as the saves'.
  error_bound ceiling{};
  /// loosen_bound: factor applied to the bound per retry (> 1); the last retry uses the ceiling.
  double growth = 2.0;

  /// Throw kompress::budget_exceeded, with the sizes in the message (the default).
  static budget_policy throw_error() { return {}; }
  /// Keep what does not fit in host memory (meant for stashes in device memory; on a host
  /// stash it still works, as a second, growable host arena outside the budget).
  static budget_policy spill_to_host() { return {action::spill_host, {}, {}, 2.0}; }
  /// Keep what does not fit in a file in `directory`.
  static budget_policy spill_to_file(std::filesystem::path directory) {
    return {action::spill_file, std::move(directory), {}, 2.0};
  }
  /// Retry with a looser bound (times `growth` each time) up to `ceiling`, then throw
  /// kompress::budget_exceeded. The bound used is recorded per entry (stash::info).
  static budget_policy loosen_bound(error_bound ceiling, double growth = 2.0) {
    return {action::loosen_bound, {}, ceiling, growth};
  }
};

}  // namespace v0
}  // namespace kompress
