#pragma once
// The exceptions of the activation stash, both derived from kompress::error.

#include <kompress/error.hpp>

#include <cstddef>
#include <string>

namespace kompress {
inline namespace v0 {

/// A save did not fit in the stash's budget and the budget policy could not place it
/// (the default policy, budget_policy::throw_error, or a looser bound that still did not
/// fit under its ceiling). The stash is unchanged: nothing of the failed save is kept.
class budget_exceeded : public error {
 public:
  budget_exceeded(const std::string& message, std::size_t needed_bytes, std::size_t budget_bytes,
                  std::size_t in_use_bytes, std::size_t largest_free_bytes)
      : error(message),
        needed_bytes_(needed_bytes),
        budget_bytes_(budget_bytes),
        in_use_bytes_(in_use_bytes),
        largest_free_bytes_(largest_free_bytes) {}

  /// Bytes the piece that did not fit needed (a compressed segment, rounded up to the pool's
  /// alignment).
  std::size_t needed_bytes() const noexcept { return needed_bytes_; }
  /// The stash's budget: its pool's size.
  std::size_t budget_bytes() const noexcept { return budget_bytes_; }
  /// Pool bytes in use when the save failed (the workspace included).
  std::size_t in_use_bytes() const noexcept { return in_use_bytes_; }
  /// The largest contiguous free range of the pool then.
  std::size_t largest_free_bytes() const noexcept { return largest_free_bytes_; }

 private:
  std::size_t needed_bytes_, budget_bytes_, in_use_bytes_, largest_free_bytes_;
};

/// A stash handle that is empty, was dropped, or belongs to another stash.
class invalid_handle : public invalid_argument {
 public:
  using invalid_argument::invalid_argument;
};

}  // namespace v0
}  // namespace kompress
