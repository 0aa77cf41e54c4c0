#pragma once
// The stash's entry table: one entry per saved View, named by a handle (slot, generation).
// Slots are reused; each release bumps the slot's generation, so a stale handle is told
// apart from the entry now in its slot. Not thread-safe: the stash guards it with its mutex.

#include <kompress/bound.hpp>
#include <kompress/error.hpp>
#include <kompress/format.hpp>
#include <kompress/stash/handle.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace kompress::inline v0::detail {

/// One stream of an entry: values [first_value, first_value + count), kept in tier `tier` of
/// the stash's list (0: the pool) at `offset`. With `signs`, not a stream but the values' sign
/// bits (a keep_sign save: stash/detail/sign_bits.hpp), right after the stream of the same
/// values. With `positives_only`, the stream holds only the stored_values positive ones of a
/// range whose other values are all +0: its sign bits say where they go, and both are in the
/// pool (no stream at all when stored_values is 0). With `scales`, not a stream but the
/// exponents of a group_relative save's groups (stash/detail/group_scales.hpp), in the pool and
/// first of its entry's segments.
struct stash_segment {
  std::size_t first_value = 0;
  std::size_t count = 0;
  std::uint8_t tier = 0;
  bool signs = false;
  bool positives_only = false;
  bool scales = false;
  bool coded_signs = false;  ///< sign bits coded by their rare value's gaps (sign_code.hpp)
  /// A stream in the pool kept without its header (piece_frame.hpp); a packed piece's is in its
  /// sign bits' range.
  bool framed = false;
  std::size_t stored_values = 0;
  std::size_t offset = 0;
  std::size_t stream_bytes = 0;
  /// Sign bits: the bytes of the framed stream that follows them in their range.
  std::size_t trailing_bytes = 0;

  /// Whether the segment has a range of its own, of range_bytes() from offset.
  bool has_range() const { return !(positives_only && (framed || stored_values == 0)); }
  std::size_t range_bytes() const { return stream_bytes + trailing_bytes; }
};

struct stash_entry {
  std::uint32_t generation = 1;
  bool live = false;  ///< published: a handle names it
  int pins = 0;       ///< restores in progress
  /// While a save_async is pending, its one segment holds a worst-case range of
  /// reserved_bytes in the pool (stream_bytes 0).
  std::size_t reserved_bytes = 0;
  element_type type = element_type::float32;
  int rank = 0;
  std::array<std::size_t, 8> extents{};
  std::array<std::size_t, 8> strides{};
  std::size_t count = 0;
  error_bound requested{};
  error_bound used{};
  double absolute_bound = 0.0;  ///< of the streams' values (a group_relative save's: scaled)
  /// A group_relative save: its values were scaled by their groups' powers of two, the
  /// largest of which is 2^max_group_exponent.
  bool group_relative = false;
  int max_group_exponent = 0;
  std::vector<stash_segment> segments;  ///< capacity kept when the slot is reused
  codec_mode codec = codec_mode::fast;
  rounding_mode rounding = rounding_mode::nearest;
  /// The save's number in its stash: its streams' rounding seeds derive from it.
  std::uint64_t save_number = 0;

  std::size_t element_size() const { return type == element_type::float32 ? 4 : 8; }
  std::size_t raw_bytes() const { return count * element_size(); }
  std::size_t stored_bytes() const {
    std::size_t total = 0;
    for (const stash_segment& s : segments) total += s.stream_bytes;
    return total;
  }
  std::size_t sign_bytes() const {
    std::size_t total = 0;
    for (const stash_segment& s : segments) total += s.signs ? s.stream_bytes : 0;
    return total;
  }
  /// Values restored as +0 from the sign bits alone.
  std::size_t zeros_in_signs() const {
    std::size_t total = 0;
    for (const stash_segment& s : segments) total += s.positives_only ? s.count - s.stored_values : 0;
    return total;
  }
  bool keeps_sign() const {
    for (const stash_segment& s : segments)
      if (s.signs) return true;
    return false;
  }
};

class entry_table {
 public:
  explicit entry_table(std::uint64_t stash_id) : id_(stash_id) {
    entries_.reserve(64);
    free_slots_.reserve(64);
  }

  std::uint64_t id() const { return id_; }
  std::size_t slots() const { return entries_.size(); }
  stash_entry& operator[](std::uint32_t slot) { return entries_[slot]; }
  const stash_entry& operator[](std::uint32_t slot) const { return entries_[slot]; }

  /// Takes a slot: ours (not live, not free) until published or released. Moves the slot's
  /// segment vector (its capacity) into `local`.
  std::uint32_t acquire(stash_entry& local) {
    std::uint32_t slot;
    if (!free_slots_.empty()) {
      slot = free_slots_.back();
      free_slots_.pop_back();
    } else {
      slot = static_cast<std::uint32_t>(entries_.size());
      entries_.emplace_back();
    }
    local.segments = std::move(entries_[slot].segments);
    local.segments.clear();
    return slot;
  }

  /// Makes the slot's entry live with `local`'s contents and returns its handle.
  stash_handle publish(std::uint32_t slot, stash_entry& local) {
    stash_entry& published = entries_[slot];
    const std::uint32_t generation = published.generation;
    published = std::move(local);
    published.generation = generation;
    published.live = true;
    published.pins = 0;
    return stash_handle{id_, slot, generation};
  }

  /// Gives a slot back (its segments already freed).
  void release(std::uint32_t slot) {
    stash_entry& entry = entries_[slot];
    entry.segments.clear();
    entry.live = false;
    ++entry.generation;
    free_slots_.push_back(slot);
  }
  /// Gives back a slot that was never published, with the segment vector acquire lent out.
  void release(std::uint32_t slot, std::vector<stash_segment>&& segments) {
    entries_[slot].segments = std::move(segments);
    release(slot);
  }

  /// The live entry `handle` names; throws invalid_handle naming why not.
  stash_entry& lookup(const stash_handle& handle, const char* who) {
    if (handle.empty())
      throw invalid_handle(std::string(who) + ": the handle is empty (default-constructed, not "
                                              "returned by save)");
    if (handle.stash_id != id_)
      throw invalid_handle(std::string(who) + ": the handle belongs to another stash");
    if (handle.slot >= entries_.size() || entries_[handle.slot].generation != handle.generation ||
        !entries_[handle.slot].live)
      throw invalid_handle(std::string(who) +
                           ": the handle's entry was dropped (a handle is valid from save until "
                           "drop or restore_and_drop)");
    return entries_[handle.slot];
  }
  const stash_entry& lookup(const stash_handle& handle, const char* who) const {
    return const_cast<entry_table*>(this)->lookup(handle, who);
  }

  bool contains(const stash_handle& handle) const {
    return handle.stash_id == id_ && !handle.empty() && handle.slot < entries_.size() &&
           entries_[handle.slot].live && entries_[handle.slot].generation == handle.generation;
  }

 private:
  std::uint64_t id_;
  std::vector<stash_entry> entries_;
  std::vector<std::uint32_t> free_slots_;
};

}  // namespace kompress::inline v0::detail
