#pragma once
// The exceptions kompress throws. Every one derives from kompress::error, itself a
// std::runtime_error, and its message names the function and what was expected and got.

#include <stdexcept>
#include <string>

namespace kompress {
inline namespace v0 {

/// Base of every exception kompress throws.
class error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A caller's argument is out of its domain: a negative or NaN bound, a buffer too small,
/// mismatched extents.
class invalid_argument : public error {
 public:
  using error::error;
};

/// A compressed stream is malformed: wrong magic, unknown version, truncated, corrupted.
class format_error : public error {
 public:
  using error::error;
};

}  // namespace v0
}  // namespace kompress
