#pragma once
// Library version. The stream format has its own version (kompress/format.hpp): a library
// release may keep the format, and the format changes only deliberately.

#define KOMPRESS_VERSION_MAJOR 0
#define KOMPRESS_VERSION_MINOR 1
#define KOMPRESS_VERSION_PATCH 0

namespace kompress {
inline namespace v0 {
struct version_info {
  int major, minor, patch;
};
inline constexpr version_info version{KOMPRESS_VERSION_MAJOR, KOMPRESS_VERSION_MINOR,
                                      KOMPRESS_VERSION_PATCH};
}  // namespace v0
}  // namespace kompress
