#pragma once
// Every exception kompress throws. Each derives from kompress::error, itself a
// std::runtime_error, and its message names the function and what was expected and got.

#include <cstddef>
#include <stdexcept>
#include <string>

namespace kompress::inline v0 {

/// Base of every exception kompress throws.
class error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A caller's argument is out of its domain: a negative or NaN bound, a buffer too small,
/// mismatched extents. A collective throws it on every rank when any rank's arguments are bad.
class invalid_argument : public error {
 public:
  using error::error;
};

/// A compressed stream is malformed: wrong magic, unknown version, truncated, corrupted.
class format_error : public error {
 public:
  using error::error;
};

/// A call could not have the memory it needed: the values a stream decodes to exceed the
/// caller's decompress_options::max_output_bytes, or allocating an output failed.
class resource_error : public error {
 public:
  resource_error(const std::string& what, std::size_t requested_bytes)
      : error(what), requested_bytes_(requested_bytes) {}
  /// The bytes the call asked for.
  std::size_t requested_bytes() const noexcept { return requested_bytes_; }

 private:
  std::size_t requested_bytes_;
};

/// An MPI call failed; the message carries MPI's own error string.
class mpi_error : public error {
 public:
  mpi_error(const std::string& what, int code) : error(what), code_(code) {}
  /// The MPI error code the call returned.
  int code() const noexcept { return code_; }

 private:
  int code_;
};

/// Another rank failed during a collective after the agreement (a failed MPI call, a stream it
/// could not decode, an exception in its codec) and told this rank so with an abort marker in
/// place of a message (docs/collectives.md, "Failure after the agreement"). This rank completed
/// every message of the call, so nothing is left in flight and the communicator is usable; the
/// call's output is unspecified.
class peer_error : public error {
 public:
  peer_error(const std::string& what, int failed_rank) : error(what), failed_rank_(failed_rank) {}
  /// The rank (in the call's communicator) that failed, as the first abort marker to arrive
  /// named it (relayed around a ring, a marker still names the rank that failed first).
  int failed_rank() const noexcept { return failed_rank_; }

 private:
  int failed_rank_;
};

/// A stash save did not fit in the stash's budget and the budget policy could not place it
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

}  // namespace kompress::inline v0
