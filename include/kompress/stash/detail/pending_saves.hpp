#pragma once
// The save_asyncs a stash has not settled yet: for each pending entry (by slot) the execution
// space instance its compression was enqueued on. Settling one waits for that instance, reads
// the stream's length and bound from its header and gives the unused tail of its worst-case
// reservation back to the pool, moving the stream down where the pool has room below it
// (stash.hpp, settle). Not thread-safe: the stash guards the
// instances with its mutex and runs one settlement at a time under settle_mutex.

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <vector>

namespace kompress::inline v0::detail {

template <class ExecutionSpace>
struct pending_saves {
  /// One waited-for save: filled in under the stash's mutex, completed without it.
  struct job {
    std::uint32_t slot;
    std::size_t offset, reserved;
    ExecutionSpace exec;
    std::size_t length = 0;
    double abs_bound = 0.0;
  };

  pending_saves() {
    instances.reserve(64);
    jobs.reserve(64);
  }

  bool pending(std::uint32_t slot) const { return slot < instances.size() && instances[slot]; }

  void mark(std::uint32_t slot, const ExecutionSpace& exec) {
    if (instances.size() <= slot) {
      instances.resize(std::size_t(slot) + 1);
      order.resize(std::size_t(slot) + 1);
    }
    instances[slot] = exec;
    order[slot] = next_order++;
    ++count;
  }

  /// The slot of the save_async pending longest, if any.
  std::optional<std::uint32_t> oldest() const {
    std::optional<std::uint32_t> found;
    for (std::uint32_t slot = 0; slot < instances.size(); ++slot)
      if (instances[slot] && (!found || order[slot] < order[*found])) found = slot;
    return found;
  }

  void clear(std::uint32_t slot) {
    instances[slot].reset();
    --count;
  }

  /// A destroyed stash must not free a range a save may still be writing.
  void fence_all() {
    for (std::optional<ExecutionSpace>& instance : instances)
      if (instance) instance->fence("kompress::stash: destroyed with a save_async pending");
  }

  std::vector<std::optional<ExecutionSpace>> instances;  ///< by slot; set while pending
  std::vector<std::uint64_t> order;                      ///< by slot: when it was marked
  std::uint64_t next_order = 0;
  std::size_t count = 0;
  std::mutex settle_mutex;  ///< one settlement at a time (it waits on instances)
  std::vector<job> jobs;    ///< the settlement's scratch list
};

}  // namespace kompress::inline v0::detail
