#pragma once
// kompress::stash_handle, the value a save returns, and what a stash reports about an entry.

#include <kompress/bound.hpp>
#include <kompress/format.hpp>

#include <array>
#include <cstddef>
#include <cstdint>

namespace kompress {
inline namespace v0 {

/// Names one entry of one stash. A small value type: copy it freely. It stays valid until the
/// entry is dropped (drop or restore_and_drop); after that, and for any other stash, every
/// operation given it throws kompress::invalid_handle. A default-constructed handle is empty.
struct stash_handle {
  std::uint64_t stash_id = 0;    ///< the owning stash's random identity; 0: empty
  std::uint32_t slot = 0;        ///< index in the stash's entry table
  std::uint32_t generation = 0;  ///< bumped every time the slot is released

  bool empty() const noexcept { return stash_id == 0; }
  friend bool operator==(const stash_handle&, const stash_handle&) = default;
};

/// Where the compressed bytes of an entry's segments are.
struct stash_placement {
  std::size_t pool_segments = 0;  ///< in the stash's pool (its memory space)
  std::size_t host_segments = 0;  ///< spilled to host memory
  std::size_t file_segments = 0;  ///< spilled to the spill file
};

/// One entry, as stash::info reports it.
struct stash_entry_info {
  element_type type = element_type::float32;
  int rank = 0;
  std::array<std::size_t, 8> extents{};  ///< extents[0..rank)
  std::size_t count = 0;                 ///< elements
  std::size_t raw_bytes = 0;             ///< count * element size
  std::size_t stored_bytes = 0;          ///< the segments' stream lengths and the sign bits
  std::size_t sign_bytes = 0;            ///< the sign bits' share (keep_sign): 0 without
  std::size_t zeros_in_signs = 0;        ///< values restored as +0 from the sign bits alone
                                         ///< (keep_sign of values >= 0: not in a stream)
  codec_mode codec = codec_mode::fast;   ///< the streams' codec
  bool keeps_sign = false;               ///< restored values keep the saved side of 0
  rounding_mode rounding = rounding_mode::nearest;  ///< how its values were rounded
  error_bound requested_bound{};         ///< as passed to save
  error_bound used_bound{};              ///< looser than requested only under loosen_bound
  double absolute_bound = 0.0;           ///< |x - x'| <= this for every element (0: lossless)
  /// The bound is relative to each group of 256 values' range (stash_save_options::
  /// group_relative): absolute_bound is the largest group's, used_bound.value times
  /// 2^floor(log2(range)) of the group with the widest range.
  bool group_relative = false;
  std::size_t segments = 0;
  stash_placement placement{};

  double ratio() const { return stored_bytes ? double(raw_bytes) / double(stored_bytes) : 0.0; }
};

}  // namespace v0
}  // namespace kompress
